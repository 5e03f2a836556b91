//! `load_file`'s native side: one `tensora_io::load` (or a `tensora_remote` load for a URL; GIL
//! released), and each tensor of the result handed to Python as a [`TensorData`] sharing one owner.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use pyo3::prelude::*;
use pyo3::types::PyDict;
use tensora_io::LoadOptions;

use crate::owner::{Owner, Storage, TensorBytes};
use crate::tensor::CopyTally;
use crate::{TensorData, drive, exc, finish, selection};

/// What Python gets for one tensor of a `Loaded` held by `owner`. Writable pointers come from
/// `Loaded::tensor_mut_ptr` (derived from the storage's own mutable base, never from a shared
/// slice); an empty tensor gets a dangling, never-dereferenced address.
#[derive(Debug)]
pub(crate) struct ExportMeta {
    name: String,
    len_bytes: u64,
    dtype: tensora_format::Dtype,
    shape: Vec<u64>,
    strides: Option<Vec<u64>>,
}

impl ExportMeta {
    /// Metadata of every tensor of `loaded`, taken before any buffer is handed out: the `&[u8]`
    /// that `Loaded::tensors` forms must not be alive while Python writes (tied tensors share
    /// bytes).
    pub(crate) fn all(loaded: &tensora_io::Loaded) -> Vec<ExportMeta> {
        loaded
            .tensors()
            .map(|t| ExportMeta {
                name: t.name().to_owned(),
                len_bytes: t.info().len_bytes(),
                dtype: t.dtype(),
                shape: t.shape().to_vec(),
                strides: t.info().strides().map(<[u64]>::to_vec),
            })
            .collect()
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn dtype(&self) -> tensora_format::Dtype {
        self.dtype
    }

    pub(crate) fn shape(&self) -> &[u64] {
        &self.shape
    }

    pub(crate) fn strides(&self) -> Option<&[u64]> {
        self.strides.as_deref()
    }

    /// The buffer for this tensor of `loaded` (which `owner` holds): zero copy, or an aligned
    /// copy when its address does not suit its dtype ([`TensorData::export`]).
    pub(crate) fn export(self, owner: &Arc<Owner>, loaded: &tensora_io::Loaded) -> PyResult<TensorData> {
        let (addr, len_bytes) = match loaded.tensor_mut_ptr(&self.name) {
            Some((ptr, len)) => (ptr.as_ptr() as usize, len),
            // Empty: nothing can be read or written through the address.
            None if self.len_bytes == 0 => (std::ptr::NonNull::<u64>::dangling().as_ptr() as usize, 0),
            None => {
                return Err(exc::LoadError::new_err(format!(
                    "internal: the load gave no writable pointer for tensor {:?}",
                    self.name
                )));
            }
        };
        TensorData::export(TensorBytes {
            owner: Arc::clone(owner),
            addr,
            len_bytes,
            name: self.name,
            dtype: self.dtype,
            shape: self.shape,
            strides: self.strides,
        })
    }
}

/// Load every selected tensor (GIL released) and return `({name: TensorData}, report_json)`,
/// the dict sorted by name. The report is the load's, plus `aligned_copies` (`{"tensors",
/// "bytes"}`: tensors whose file offset was not a multiple of their element size, handed out as
/// aligned copies). `residence`: `"owned"` (the default: an owned arena, a snapshot),
/// `"auto"` (zero-copy mapped views when the files are local and warm and `backend` is `"auto"`,
/// owned otherwise; decided by `tensora_io::auto`) or `"mapped"`.
///
/// `path` may be a URL of a store (`tensora_remote::schemes()`): then `remote` (a
/// dict of `tensora.RemoteOptions`' fields) says how to reach it, the load is owned, and the
/// report is `tensora_remote`'s (requests, retries, cache, concurrency).
///
/// `manifest`: a manifest's path; every tensor's digest is checked against it as its bytes land
/// (`tensora_verify::verified`), and the first that does not match raises `VerifyError` before
/// anything is returned.
///
/// `tp=(rank, world)` loads only this rank's tensor-parallel share, each slice contiguous in an
/// owned arena (`residence` does not apply); `rules` maps names to splits (see [`crate::tp`]).
/// `dtype` (`"bf16"`, `"f16"`, `"f32"`, their torch/numpy names, or `None`): floating-point
/// tensors delivered in that dtype, each read converted as it lands into an owned buffer at the
/// target dtype (`tensora_io::cast`); the report's `cast` names the converted tensors.
#[pyfunction]
#[pyo3(signature = (path, select=None, backend="auto", progress=None, residence="owned", manifest=None, remote=None, tp=None, rules=None, dtype=None, cache_pages=true))]
#[allow(clippy::too_many_arguments)] // the Python keyword arguments of `load_file`
pub(crate) fn load<'py>(
    py: Python<'py>,
    path: PathBuf,
    select: Option<&Bound<'py, PyAny>>,
    backend: &str,
    progress: Option<Py<PyAny>>,
    residence: &str,
    manifest: Option<PathBuf>,
    remote: Option<&Bound<'py, PyDict>>,
    tp: Option<(u32, u32)>,
    rules: Option<&Bound<'py, PyAny>>,
    dtype: Option<&str>,
    cache_pages: bool,
) -> PyResult<(Bound<'py, PyDict>, String)> {
    let cancel = Arc::new(AtomicBool::new(false));
    let shard = crate::tp::shard(tp, rules)?;
    if shard.is_some() && manifest.is_some() {
        return Err(pyo3::exceptions::PyValueError::new_err(
            "manifest= checks whole tensors; it does not apply with tp=",
        ));
    }
    let opts = LoadOptions {
        shard,
        dtype: crate::dtype_target(dtype)?,
        backend: crate::backend(backend)?,
        // `cache_pages=False`: a cold load reads around the page cache (O_DIRECT), as `--direct`.
        io_mode: if cache_pages { tensora_io::IoMode::Auto } else { tensora_io::IoMode::Direct },
        residence: crate::residence(residence)?,
        selection: selection(select)?,
        cancel: Some(Arc::clone(&cancel)),
        ..LoadOptions::default()
    };
    let manifest = manifest.map(|m| py.detach(|| crate::read_manifest(&m))).transpose()?;
    let source = Source::open(py, &path, remote)?;
    source.load(py, opts, progress.as_ref(), &cancel, manifest.as_ref(), ParsePhase::ThisLoad)
}

/// A checkpoint opened for loads from Python, its headers parsed once (`load_file`, and every part
/// of a `tensora.distributed.load_tp`): local, with the seconds the parse took, or a store's, with
/// the options it was opened with.
pub(crate) enum Source {
    Local { ckpt: tensora_format::Checkpoint, parse_seconds: f64 },
    Remote { ckpt: Box<tensora_remote::RemoteCheckpoint>, opts: Box<tensora_remote::RemoteOptions> },
}

/// Whether a load's report counts the parse of its [`Source`] (its first load) or not (a later
/// load from the same open checkpoint).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ParsePhase {
    ThisLoad,
    Earlier,
}

impl Source {
    /// Opens `path` (GIL released): a URL with the options of `remote`, else a local checkpoint
    /// (then `remote` is a `ValueError`).
    pub(crate) fn open(py: Python<'_>, path: &Path, remote: Option<&Bound<'_, PyDict>>) -> PyResult<Source> {
        if let Some(location) = crate::remote::location(path)? {
            let opts = crate::remote::options(remote)?;
            let ckpt = crate::remote::open(py, &location, &opts)?;
            return Ok(Source::Remote { ckpt: Box::new(ckpt), opts: Box::new(opts) });
        }
        if remote.is_some() {
            return Err(pyo3::exceptions::PyValueError::new_err(
                "remote= applies to URLs only, not to a local path",
            ));
        }
        let started = Instant::now();
        let ckpt = py.detach(|| tensora_format::open(path)).map_err(crate::format_err)?;
        Ok(Source::Local { ckpt, parse_seconds: started.elapsed().as_secs_f64() })
    }

    /// The parsed checkpoint.
    pub(crate) fn checkpoint(&self) -> &tensora_format::Checkpoint {
        match self {
            Source::Local { ckpt, .. } => ckpt,
            Source::Remote { ckpt, .. } => ckpt.checkpoint(),
        }
    }

    /// Loads from the checkpoint as `opts` say (GIL released, `progress` called and `cancel`
    /// honoured as [`drive::run`] does), each tensor checked against `manifest` when given, and
    /// returns what [`export_all`] does.
    pub(crate) fn load<'py>(
        &self,
        py: Python<'py>,
        mut opts: LoadOptions,
        progress: Option<&Py<PyAny>>,
        cancel: &Arc<AtomicBool>,
        manifest: Option<&tensora_verify::Manifest>,
        parse: ParsePhase,
    ) -> PyResult<(Bound<'py, PyDict>, String)> {
        if let Some(m) = manifest {
            crate::manifest_check(self.checkpoint(), m)?.install(&mut opts);
        }
        let (ckpt, ropts) = match self {
            Source::Remote { ckpt, opts: ropts } => (ckpt, ropts),
            Source::Local { ckpt, parse_seconds } => {
                let out = drive::run(py, progress, cancel, |hook| {
                    tensora_io::load(ckpt, &LoadOptions { progress: hook, ..opts })
                });
                let loaded = finish(out)?;
                let mut report = loaded.report().clone();
                report.phases.parse = if parse == ParsePhase::ThisLoad { *parse_seconds } else { 0.0 };
                report.finalize();
                let report =
                    serde_json::to_value(&report).map_err(|e| exc::LoadError::new_err(e.to_string()))?;
                return export_all(py, loaded, report);
            }
        };
        let out = drive::run(py, progress, cancel, |hook| ckpt.load(&LoadOptions { progress: hook, ..opts }));
        let mut loaded = crate::finish_with(out, crate::remote::remote_err)?;
        let behind = ropts.cache.as_ref().is_some_and(|c| c.writes == tensora_remote::CacheWrites::Behind);
        if behind {
            // The tensors go to the caller at once; the copies are written and promoted behind
            // them (`tensora.wait_cache()`, or at interpreter exit, waits for them).
            // Taking it seals the pieces not written yet (their CRC, before the arrays exist).
            if let Some(sync) = py.detach(|| loaded.take_cache_sync()) {
                crate::remote::behind(sync);
            }
        } else {
            // Every range is on disk: the fsyncs and renames are done before the tensors are
            // handed over, so the report is final.
            py.detach(|| {
                loaded.wait_cache();
            });
        }
        let report =
            serde_json::to_value(loaded.report()).map_err(|e| exc::LoadError::new_err(e.to_string()))?;
        export_all(py, loaded.into_loaded(), report)
    }
}

/// Every tensor of `loaded` as a [`TensorData`] sharing one owner, sorted by name, and `report`
/// with `aligned_copies` added, as JSON.
pub(crate) fn export_all<'py>(
    py: Python<'py>,
    loaded: tensora_io::Loaded,
    mut report: serde_json::Value,
) -> PyResult<(Bound<'py, PyDict>, String)> {
    let mut metas = ExportMeta::all(&loaded);
    let owner = Owner::new(Storage::Loaded(Box::new(loaded)));
    let Storage::Loaded(loaded) = owner.storage() else {
        return Err(exc::LoadError::new_err("internal: load produced no owned storage"));
    };
    metas.sort_unstable_by(|a, b| a.name.cmp(&b.name));
    let d = PyDict::new(py);
    let copies = CopyTally::default();
    for m in metas {
        let name = m.name.clone();
        let data = m.export(&owner, loaded)?;
        copies.note(&data);
        d.set_item(name, data)?;
    }
    if let serde_json::Value::Object(fields) = &mut report {
        fields.insert("aligned_copies".into(), copies.to_json());
    }
    Ok((d, report.to_string()))
}
