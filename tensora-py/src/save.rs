//! The native side of `tensora.save_file`, `tensora.save`, `tensora.save_sharded` and
//! `tensora.load` (the Python side is `python/tensora/_save.py`): tensors handed over by the
//! Python layer as objects exporting their memory (the buffer protocol), written by
//! `tensora_convert::save` with the GIL released.
//!
//! A spec is `(name, dtype, shape, data, start_bytes, strides_bytes)`: `data` is an object whose
//! C-contiguous buffer holds the tensor's elements (`None` for a tensor without elements),
//! row-major from the start when `start_bytes` is `None`, else element `i` at
//! `start_bytes + Σ i[d] × strides[d]`. Every buffer is acquired (`PyObject_GetBuffer`) before
//! the GIL is released and released after the write: while exported, numpy refuses to resize or
//! free the array, and the Python layer hands torch tensors over as numpy views, which makes their
//! storage non-resizable. No address crosses the boundary: lengths come from the buffers
//! themselves, and every spec is checked (elements inside its buffer) before anything is written.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use pyo3::buffer::PyUntypedBuffer;
use pyo3::create_exception;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use tensora_convert::ConvertError;
use tensora_convert::{Durability, MemoryTensors, SaveOptions, SourceTensor, StorageLayout};
use tensora_format::Dtype;

use crate::{cancelled_by_callback, drive, exc};

create_exception!(
    tensora,
    NoSpaceError,
    exc::ConvertError,
    "The disk (or quota) filled up; nothing was left behind."
);

/// One tensor as the Python layer describes it (see the module docs).
type Spec<'py> = (String, String, Vec<u64>, Option<Bound<'py, PyAny>>, Option<u64>, Option<Vec<i64>>);

/// A save error as its Python exception: a full disk is `NoSpaceError`, a cancel
/// `CancelledError`, a bad tensor `ValueError`, anything else `ConvertError`.
fn save_err(e: ConvertError) -> PyErr {
    let msg = e.to_string();
    match e {
        ConvertError::NoSpace { .. } => NoSpaceError::new_err(msg),
        ConvertError::Cancelled => exc::CancelledError::new_err(msg),
        ConvertError::InvalidTensor { .. } => PyValueError::new_err(msg),
        _ => exc::ConvertError::new_err(msg),
    }
}

/// The buffers of the specs' objects, acquired now and held until dropped (after the write):
/// one per spec, `None` for a tensor without elements.
fn exports(specs: &[Spec<'_>]) -> PyResult<Vec<Option<PyUntypedBuffer>>> {
    specs
        .iter()
        .map(|(name, _, _, data, _, _)| {
            let Some(obj) = data.as_ref().filter(|o| !o.is_none()) else { return Ok(None) };
            let buf = PyUntypedBuffer::get(obj)?;
            if !buf.is_c_contiguous() {
                return Err(PyValueError::new_err(format!("tensor {name:?}: its buffer is not contiguous")));
            }
            Ok(Some(buf))
        })
        .collect()
}

/// The specs as a save source over the memory of their exported buffers.
fn tensors<'b>(specs: &[Spec<'_>], buffers: &'b [Option<PyUntypedBuffer>]) -> PyResult<MemoryTensors<'b>> {
    let mut out = MemoryTensors::new();
    for ((name, dtype, shape, _, start, strides), buffer) in specs.iter().zip(buffers) {
        let dtype = Dtype::from_safetensors(dtype)
            .ok_or_else(|| exc::DtypeError::new_err(format!("tensor {name:?}: unknown dtype {dtype:?}")))?;
        let layout = match (start, strides) {
            (None, None) => StorageLayout::Contiguous,
            (Some(start_bytes), Some(strides_bytes)) => {
                StorageLayout::Strided { start_bytes: *start_bytes, strides_bytes: strides_bytes.clone() }
            }
            _ => {
                return Err(PyValueError::new_err(format!("tensor {name:?}: start and strides go together")));
            }
        };
        let storage: &[u8] = match buffer {
            None => &[],
            Some(buf) if buf.len_bytes() == 0 => &[],
            // SAFETY: `buf` is an acquired, C-contiguous buffer export: its exporter keeps the
            // `len_bytes()` bytes at `buf_ptr()` allocated (and, for numpy arrays and torch
            // tensors viewed by numpy, unresized) until it is released, which happens when
            // `buffers` (borrowed for the source's lifetime) is dropped after the write. The slice
            // is only read, and `MemoryTensors::push` checks every element lies inside it. The
            // export stops resizing and freeing, not writes: as HF's savers, `save_file`'s
            // contract (its docstring) is that no other thread writes the tensors during the save;
            // one that does races the writer's reads and may put a mix of old and new bytes in the
            // file, which the digests taken while writing then describe.
            Some(buf) => unsafe { std::slice::from_raw_parts(buf.buf_ptr() as *const u8, buf.len_bytes()) },
        };
        let tensor = SourceTensor {
            name: name.clone(),
            dtype,
            shape: shape.clone(),
            layout,
            storage_len_bytes: storage.len() as u64,
        };
        out.push(tensor, storage).map_err(save_err)?;
    }
    Ok(out)
}

/// Run `work` with the GIL released, Python's progress callback and Ctrl-C driving it.
fn drive_save(
    py: Python<'_>,
    progress: Option<&Py<PyAny>>,
    opts: SaveOptions,
    work: impl FnOnce(&SaveOptions) -> Result<tensora_convert::SaveReport, ConvertError> + Send,
) -> PyResult<String> {
    let cancel = Arc::new(AtomicBool::new(false));
    let out = drive::run(py, progress, &cancel, |hook| {
        let opts = SaveOptions { progress: hook, cancel: Some(Arc::clone(&cancel)), ..opts };
        work(&opts)
    });
    if let Some(e) = out.py_err {
        return Err(e);
    }
    if out.cancelled_by_callback {
        return Err(cancelled_by_callback());
    }
    let report = out.result.map_err(save_err)?;
    serde_json::to_string(&report).map_err(|e| exc::ConvertError::new_err(e.to_string()))
}

fn options(mode: &str, threads: usize, durability: &str) -> PyResult<SaveOptions> {
    let mode = mode.parse().map_err(PyValueError::new_err)?;
    let durability: Durability = durability.parse().map_err(PyValueError::new_err)?;
    Ok(SaveOptions { mode, threads, durability, ..SaveOptions::default() })
}

/// Save one safetensors file; the report as JSON. `durability`: `"synced"` (file and directory
/// `fsync`ed) or `"process-crash-safe"` (written and renamed, not synced: HF's semantics).
#[pyfunction]
#[pyo3(signature = (specs, path, metadata=None, progress=None, mode="auto", threads=0, durability="synced"))]
#[allow(clippy::too_many_arguments)] // the Python signature
fn save_file(
    py: Python<'_>,
    specs: Vec<Spec<'_>>,
    path: PathBuf,
    metadata: Option<BTreeMap<String, String>>,
    progress: Option<Py<PyAny>>,
    mode: &str,
    threads: usize,
    durability: &str,
) -> PyResult<String> {
    let opts = options(mode, threads, durability)?;
    let buffers = exports(&specs)?;
    let tensors = tensors(&specs, &buffers)?;
    let metadata = metadata.unwrap_or_default();
    let report = drive_save(py, progress.as_ref(), opts, |opts| {
        tensora_convert::save_safetensors(&path, &tensors, &metadata, opts)
    });
    drop(tensors);
    drop(buffers); // released here, with the GIL held, after the write
    report
}

/// Save HF-style shards of at most `shard_bytes_max` bytes each into `directory`; the report as
/// JSON.
#[pyfunction]
#[pyo3(signature = (specs, directory, shard_bytes_max, metadata=None, progress=None, mode="auto", threads=0))]
#[allow(clippy::too_many_arguments)] // the Python signature
fn save_sharded(
    py: Python<'_>,
    specs: Vec<Spec<'_>>,
    directory: PathBuf,
    shard_bytes_max: u64,
    metadata: Option<BTreeMap<String, String>>,
    progress: Option<Py<PyAny>>,
    mode: &str,
    threads: usize,
) -> PyResult<String> {
    let opts = options(mode, threads, Durability::Synced.as_str())?;
    let buffers = exports(&specs)?;
    let tensors = tensors(&specs, &buffers)?;
    let metadata = metadata.unwrap_or_default();
    let report = drive_save(py, progress.as_ref(), opts, |opts| {
        tensora_convert::save_sharded(&directory, &tensors, &metadata, shard_bytes_max, opts)
    });
    drop(tensors);
    drop(buffers); // released here, with the GIL held, after the write
    report
}

/// The whole safetensors file as `bytes` (filled with the GIL released).
#[pyfunction]
#[pyo3(signature = (specs, metadata=None))]
fn save_bytes<'py>(
    py: Python<'py>,
    specs: Vec<Spec<'py>>,
    metadata: Option<BTreeMap<String, String>>,
) -> PyResult<Bound<'py, PyBytes>> {
    let buffers = exports(&specs)?;
    let tensors = tensors(&specs, &buffers)?;
    let layout =
        tensora_convert::safetensors_layout(&tensors, &metadata.unwrap_or_default()).map_err(save_err)?;
    let len = usize::try_from(layout.file_len_bytes())
        .map_err(|_| PyValueError::new_err("the file is larger than memory"))?;
    let bytes = PyBytes::new_with(py, len, |buf| {
        py.detach(|| tensora_convert::serialize_into(&layout, &tensors, buf)).map_err(save_err)
    });
    drop(tensors);
    drop(buffers); // released here, with the GIL held, after the copy
    bytes
}

/// One tensor of a parsed file: name, dtype, shape, and its bytes' start and end in the data.
type Parsed = (String, String, Vec<u64>, u64, u64);

/// Parse the header of a safetensors file held in `data`: `(tensors, metadata, data_start)` with
/// one `(name, dtype, shape, start, end)` per tensor, offsets into `data`, in file order.
#[pyfunction]
fn parse_bytes<'py>(py: Python<'py>, data: &[u8]) -> PyResult<(Vec<Parsed>, Bound<'py, PyDict>, u64)> {
    let header =
        tensora_format::safetensors::parse_header(data, data.len() as u64).map_err(crate::format_err)?;
    let start = header.data_start_bytes();
    let mut tensors: Vec<Parsed> = header
        .tensors()
        .map(|t| {
            let (a, b) = t.data_offsets();
            (t.name().to_owned(), t.dtype().as_str().to_owned(), t.shape().to_vec(), start + a, start + b)
        })
        .collect();
    tensors.sort_by_key(|t| t.3);
    let metadata = PyDict::new(py);
    for (k, v) in header.metadata().into_iter().flatten() {
        metadata.set_item(k, v)?;
    }
    Ok((tensors, metadata, start))
}

/// Register the save functions and `NoSpaceError` on the native module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("NoSpaceError", m.py().get_type::<NoSpaceError>())?;
    m.add_function(wrap_pyfunction!(save_file, m)?)?;
    m.add_function(wrap_pyfunction!(save_sharded, m)?)?;
    m.add_function(wrap_pyfunction!(save_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(parse_bytes, m)?)?;
    Ok(())
}
