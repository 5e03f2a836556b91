//! Python bindings for Tensora (the `tensora` package; this is its native module
//! `tensora._native`). The Python layer in `python/tensora/__init__.py` turns the buffers made
//! here into numpy arrays (buffer protocol) or torch tensors (DLPack), zero copy.
//!
//! Every buffer handed to Python holds an `Arc` of its [`owner::Owner`]: a load (an owned arena
//! by default, or zero-copy views of private copy-on-write mappings, see `residence`), a
//! `safe_open` file's shared copy-on-write mapping, a repeated `get_tensor`'s own mapping, or one
//! heap copy. Memory is freed when the last array goes.
//!
//! ```
//! use tensora::owner::{Owner, Storage, TensorBytes, owners_live};
//! use tensora::dlpack::{ManagedTensor, code};
//!
//! let mut words = vec![0u64; 1].into_boxed_slice();
//! let addr = words.as_mut_ptr() as usize;
//! let t = TensorBytes {
//!     owner: Owner::new(Storage::Heap(words)), addr, len_bytes: 8, name: "w".into(),
//!     dtype: tensora_format::Dtype::BF16, shape: vec![2, 2], strides: None,
//! };
//! let m = ManagedTensor::new(&t)?;
//! assert_eq!(m.view().dtype.code, code::BFLOAT);
//! assert_eq!(m.view().shape, vec![2, 2]);
//! drop(t);
//! assert!(owners_live() >= 1); // the managed tensor still holds the memory
//! drop(m);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![warn(missing_docs)]

pub mod dlpack;
pub mod drive;
mod export;
pub mod owner;
pub mod queue;
mod remote;
mod safe_open;
mod save;
mod share;
mod stream;
mod tensor;
mod tools;
mod tp;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use tensora_format::Selection;
use tensora_io::{BackendChoice, LoadError, Residence};

pub use tensor::TensorData;

/// The Python exception classes (`tensora.TensoraError` and its subclasses).
pub mod exc {
    use pyo3::create_exception;
    use pyo3::exceptions::PyException;

    create_exception!(
        tensora,
        SafetensorError,
        PyException,
        "HF safetensors' error class (`safetensors.SafetensorError`): the base of every Tensora error."
    );
    create_exception!(tensora, TensoraError, SafetensorError, "Base class of every Tensora error.");
    create_exception!(tensora, FormatError, TensoraError, "The checkpoint's files or indexes are invalid.");
    create_exception!(tensora, LoadError, TensoraError, "Reading the tensors failed.");
    create_exception!(tensora, SelectionError, TensoraError, "The selection names missing tensors.");
    create_exception!(tensora, CancelledError, TensoraError, "The load was cancelled.");
    create_exception!(tensora, DtypeError, TensoraError, "The dtype has no equivalent in the framework.");
    create_exception!(
        tensora,
        VerifyError,
        TensoraError,
        "A tensor did not match its manifest (a verified load), or hashing or verification could not run."
    );
    create_exception!(tensora, ConvertError, TensoraError, "Conversion failed.");
}

use exc::{
    CancelledError, ConvertError, DtypeError, FormatError, SafetensorError, SelectionError, TensoraError,
    VerifyError,
};

/// Map a load error to its Python exception, with the CLI's message; a tensor that did not match
/// its manifest (a verified load) is a `VerifyError` naming the tensor, its file and its offset.
pub(crate) fn load_err(e: LoadError) -> PyErr {
    if let Some(m) = tensora_verify::mismatch_of(&e) {
        return VerifyError::new_err(m.to_string());
    }
    let msg = e.to_string();
    match e {
        LoadError::Cancelled => CancelledError::new_err(msg),
        LoadError::Selection(_) => SelectionError::new_err(msg),
        LoadError::Format(_) => FormatError::new_err(msg),
        _ => exc::LoadError::new_err(msg),
    }
}

pub(crate) fn format_err(e: tensora_format::Error) -> PyErr {
    FormatError::new_err(e.to_string())
}

/// The check of `ckpt` against the manifest at `path` (`manifest=`); a manifest that cannot be
/// read or does not describe the checkpoint is a `VerifyError`.
pub(crate) fn manifest_check(
    ckpt: &tensora_format::Checkpoint,
    manifest: &tensora_verify::Manifest,
) -> PyResult<std::sync::Arc<tensora_verify::ManifestCheck>> {
    tensora_verify::ManifestCheck::new(ckpt, manifest).map_err(|e| VerifyError::new_err(e.to_string()))
}

/// Read the manifest at `path` (`manifest=`); failures are `VerifyError`s.
pub(crate) fn read_manifest(path: &std::path::Path) -> PyResult<tensora_verify::Manifest> {
    tensora_verify::Manifest::read(path).map_err(|e| VerifyError::new_err(e.to_string()))
}

/// The outcome of a driven load as a Python result: a Python exception raised by the callback
/// or a signal wins, then a cancel by the callback, then the load's own result.
pub(crate) fn finish<T>(out: drive::Outcome<Result<T, LoadError>>) -> PyResult<T> {
    finish_with(out, load_err)
}

/// [`finish`] for work whose errors `err` maps (a remote load's, for example).
pub(crate) fn finish_with<T, E>(
    out: drive::Outcome<Result<T, E>>,
    err: impl FnOnce(E) -> PyErr,
) -> PyResult<T> {
    if let Some(e) = out.py_err {
        return Err(e);
    }
    if out.cancelled_by_callback {
        return Err(cancelled_by_callback());
    }
    out.result.map_err(err)
}

pub(crate) fn cancelled_by_callback() -> PyErr {
    CancelledError::new_err("cancelled: the progress callback returned False")
}

/// `None` → all, a string → one glob, a list of strings → exact names.
pub(crate) fn selection(select: Option<&Bound<'_, PyAny>>) -> PyResult<Selection> {
    let Some(s) = select else { return Ok(Selection::All) };
    if s.is_none() {
        return Ok(Selection::All);
    }
    if let Ok(glob) = s.extract::<String>() {
        return Ok(Selection::Glob(vec![glob]));
    }
    match s.extract::<Vec<String>>() {
        Ok(names) => Ok(Selection::Names(names)),
        Err(_) => Err(PyValueError::new_err("select must be None, a glob string or a list of tensor names")),
    }
}

/// `backend=`: `"auto"` or a registered name ([`BackendChoice`]'s one parser); an unknown name
/// is a `tensora.LoadError` naming the known ones.
pub(crate) fn backend(name: &str) -> PyResult<BackendChoice> {
    name.parse().map_err(|e: tensora_io::UnknownBackend| exc::LoadError::new_err(e.to_string()))
}

/// `residence=`: `"owned"`, `"mapped"` or `"auto"` (tensora-io's one parser); anything else is a
/// `ValueError`.
/// `dtype=` (`None`: as stored), through `tensora_io`'s one parser.
pub(crate) fn dtype_target(name: Option<&str>) -> PyResult<tensora_io::DtypeTarget> {
    name.map_or(Ok(tensora_io::DtypeTarget::Stored), |n| n.parse().map_err(PyValueError::new_err))
}

pub(crate) fn residence(name: &str) -> PyResult<Residence> {
    // SAFETY: `"mapped"` and `"auto"` are an explicit opt-in of the Python caller, whose documented
    // contract (the docstrings of `load_file` and `weights_iterator`) is this promise: the files
    // are not truncated or rewritten in place while the arrays live (`SIGBUS` otherwise, and other
    // processes' in-place writes show through). `"owned"` maps nothing.
    let promise = unsafe { tensora_io::FilesUnchanged::promise() };
    Residence::from_name(name, promise).map_err(PyValueError::new_err)
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("SafetensorError", py.get_type::<SafetensorError>())?;
    m.add("TensoraError", py.get_type::<TensoraError>())?;
    m.add("FormatError", py.get_type::<FormatError>())?;
    m.add("LoadError", py.get_type::<exc::LoadError>())?;
    m.add("SelectionError", py.get_type::<SelectionError>())?;
    m.add("CancelledError", py.get_type::<CancelledError>())?;
    m.add("DtypeError", py.get_type::<DtypeError>())?;
    m.add("VerifyError", py.get_type::<VerifyError>())?;
    m.add("ConvertError", py.get_type::<ConvertError>())?;
    m.add_class::<TensorData>()?;
    m.add_class::<safe_open::Mapped>()?;
    m.add_class::<stream::Stream>()?;
    m.add_class::<share::Shared>()?;
    m.add_class::<share::ShareStream>()?;
    m.add_function(wrap_pyfunction!(share::open_share_stream, m)?)?;
    m.add_function(wrap_pyfunction!(export::load, m)?)?;
    m.add_class::<tp::TpSource>()?;
    m.add_function(wrap_pyfunction!(remote::wait_cache_writes, m)?)?;
    m.add_function(wrap_pyfunction!(remote::schemes, m)?)?;
    m.add_function(wrap_pyfunction!(stream::open_stream, m)?)?;
    m.add_function(wrap_pyfunction!(stream::iterator_window_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(tools::inspect_json, m)?)?;
    m.add_function(wrap_pyfunction!(tools::hash, m)?)?;
    m.add_function(wrap_pyfunction!(tools::verify_json, m)?)?;
    m.add_function(wrap_pyfunction!(tools::convert_json, m)?)?;
    m.add_function(wrap_pyfunction!(tools::owners_live, m)?)?;
    m.add_function(wrap_pyfunction!(tools::call_mappings_live, m)?)?;
    m.add("CALL_MAPPINGS_MAX", owner::CALL_MAPPINGS_MAX)?;
    m.add_function(wrap_pyfunction!(tools::backends, m)?)?;
    save::register(m)?;
    Ok(())
}
