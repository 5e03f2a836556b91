//! The tools beside loading: `inspect`, `hash`, `verify`, `convert`, and test-support counters.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::exc::{ConvertError, VerifyError};
use crate::{cancelled_by_callback, drive, format_err, load_err, owner};

/// The checkpoint's structure as JSON: `tensora_format::Inspection`, the schema `tensora inspect
/// --json` prints too.
#[pyfunction]
pub(crate) fn inspect_json(py: Python<'_>, path: PathBuf) -> PyResult<String> {
    let ckpt = py.detach(|| tensora_format::open(&path)).map_err(format_err)?;
    let mut out = Vec::new();
    tensora_format::Inspection::write_json(&ckpt, &mut out)
        .map_err(|e| crate::exc::TensoraError::new_err(e.to_string()))?;
    String::from_utf8(out).map_err(|e| crate::exc::TensoraError::new_err(e.to_string()))
}

/// One digest (hex) per tensor, computed inside a load (GIL released); with `write_manifest`,
/// also the manifest (digests, file sizes, format) written there atomically, for `manifest=`.
#[pyfunction]
#[pyo3(signature = (path, algo="crc32c", backend="auto", progress=None, write_manifest=None))]
pub(crate) fn hash<'py>(
    py: Python<'py>,
    path: PathBuf,
    algo: &str,
    backend: &str,
    progress: Option<Py<PyAny>>,
    write_manifest: Option<PathBuf>,
) -> PyResult<Bound<'py, PyDict>> {
    let algo: tensora_verify::Algo =
        algo.parse().map_err(|e: tensora_verify::UnknownAlgo| VerifyError::new_err(e.to_string()))?;
    let ckpt = py.detach(|| tensora_format::open(&path)).map_err(format_err)?;
    let cancel = Arc::new(AtomicBool::new(false));
    let backend = crate::backend(backend)?;
    let out = drive::run(py, progress.as_ref(), &cancel, |hook| {
        let opts = tensora_verify::HashOptions { algo, backend, progress: hook };
        tensora_verify::hash_checkpoint(&ckpt, &opts)
    });
    if let Some(e) = out.py_err {
        return Err(e);
    }
    if out.cancelled_by_callback {
        return Err(cancelled_by_callback());
    }
    let digests = out.result.map_err(|e| match e {
        tensora_verify::HashError::Load(l) => load_err(l),
        other => VerifyError::new_err(other.to_string()),
    })?;
    if let Some(out) = write_manifest {
        py.detach(|| {
            let manifest = tensora_verify::Manifest::from_checkpoint(&ckpt, algo, &digests)
                .map_err(|e| VerifyError::new_err(e.to_string()))?;
            manifest.write_atomic(&out).map_err(|e| VerifyError::new_err(format!("{}: {e}", out.display())))
        })?;
    }
    let d = PyDict::new(py);
    for (t, dg) in ckpt.tensors().iter().zip(digests) {
        d.set_item(t.name(), dg.to_hex())?;
    }
    Ok(d)
}

/// Verify a checkpoint, local or at a URL (optionally against a manifest); the report as JSON.
#[pyfunction]
#[pyo3(signature = (path, manifest=None, remote=None))]
pub(crate) fn verify_json(
    py: Python<'_>,
    path: PathBuf,
    manifest: Option<PathBuf>,
    remote: Option<Bound<'_, PyDict>>,
) -> PyResult<String> {
    if let Some(json) = crate::remote::verify_json(py, &path, manifest.as_deref(), remote.as_ref())? {
        return Ok(json);
    }
    py.detach(|| {
        let manifest = manifest.map(|m| crate::read_manifest(&m)).transpose()?;
        let opts = tensora_verify::VerifyOptions { manifest: manifest.as_ref(), ..Default::default() };
        let report = tensora_verify::verify_path(&path, &opts);
        Ok(report.to_json().to_string())
    })
}

/// Convert `src` to `to` (`"safetensors"` or `"serverlessllm"`) at `dst`; the report as JSON.
#[pyfunction]
#[pyo3(signature = (src, dst, to, shard_bytes_max=None))]
pub(crate) fn convert_json(
    py: Python<'_>,
    src: PathBuf,
    dst: PathBuf,
    to: &str,
    shard_bytes_max: Option<u64>,
) -> PyResult<String> {
    use tensora_convert::{ConvertConfig, TargetFormat};
    let to = match to {
        "safetensors" => TargetFormat::Safetensors,
        "serverlessllm" | "sllm" => TargetFormat::ServerlessLlm,
        other => {
            return Err(ConvertError::new_err(format!(
                "unknown target format {other:?} (known: safetensors, serverlessllm)"
            )));
        }
    };
    py.detach(|| {
        let ckpt = tensora_format::open(&src).map_err(format_err)?;
        let cfg = ConvertConfig { to, shard_bytes_max, ..ConvertConfig::default() };
        let report =
            tensora_convert::convert(&ckpt, &dst, &cfg).map_err(|e| ConvertError::new_err(e.to_string()))?;
        serde_json::to_string(&report).map_err(|e| ConvertError::new_err(e.to_string()))
    })
}

/// How many per-call `safe_open` mappings are alive (at most `CALL_MAPPINGS_MAX`): test support.
#[pyfunction]
pub(crate) fn call_mappings_live() -> usize {
    owner::call_mappings_live()
}

/// How many memory owners (loads, mappings, streamed runs) are alive: test support.
#[pyfunction]
pub(crate) fn owners_live() -> usize {
    owner::owners_live()
}

/// The registered backend names.
#[pyfunction]
pub(crate) fn backends() -> Vec<&'static str> {
    tensora_io::registry::names().to_vec()
}
