//! Python bindings for Tensora (the `tensora` package; this is its native module
//! `tensora._native`). The Python layer in `python/tensora/__init__.py` turns the buffers made
//! here into numpy arrays (buffer protocol) or torch tensors (DLPack), zero copy.
//!
//! Every buffer handed to Python holds an `Arc` of its [`owner::Owner`]: a load (an owned arena,
//! or zero-copy views of private copy-on-write mappings, see [`place`]), a `safe_open` tensor's
//! own copy-on-write mapping, or one heap copy. Memory is freed when the last array goes.
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

pub mod dlpack;
pub mod drive;
pub mod owner;
pub mod place;
pub mod queue;
mod stream;

use std::collections::BTreeSet;
use std::ffi::{c_int, c_void};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use pyo3::exceptions::PyValueError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};
use tensora_format::Checkpoint;
use tensora_io::{BackendChoice, LoadError, LoadOptions, Residence};
use tensora_plan::Selection;

use crate::owner::{Owner, Storage, TensorBytes};

/// The Python exception classes (`tensora.TensoraError` and its subclasses).
pub mod exc {
    use pyo3::create_exception;
    use pyo3::exceptions::PyException;

    create_exception!(tensora, TensoraError, PyException, "Base class of every Tensora error.");
    create_exception!(tensora, FormatError, TensoraError, "The checkpoint's files or indexes are invalid.");
    create_exception!(tensora, LoadError, TensoraError, "Reading the tensors failed.");
    create_exception!(tensora, SelectionError, TensoraError, "The selection names missing tensors.");
    create_exception!(tensora, CancelledError, TensoraError, "The load was cancelled.");
    create_exception!(tensora, DtypeError, TensoraError, "The dtype has no equivalent in the framework.");
    create_exception!(tensora, VerifyError, TensoraError, "Hashing or verification could not run.");
    create_exception!(tensora, ConvertError, TensoraError, "Conversion failed.");
}

use exc::{CancelledError, ConvertError, DtypeError, FormatError, SelectionError, TensoraError, VerifyError};

/// Map a load error to its Python exception, with the CLI's message.
pub(crate) fn load_err(e: LoadError) -> PyErr {
    let msg = e.to_string();
    match e {
        LoadError::Cancelled => CancelledError::new_err(msg),
        LoadError::Selection(_) => SelectionError::new_err(msg),
        LoadError::Format(_) => FormatError::new_err(msg),
        _ => exc::LoadError::new_err(msg),
    }
}

fn format_err(e: tensora_format::Error) -> PyErr {
    FormatError::new_err(e.to_string())
}

/// The outcome of a driven load as a Python result: a Python exception raised by the callback
/// or a signal wins, then a cancel by the callback, then the load's own result.
fn finish<T>(out: drive::Outcome<Result<T, LoadError>>) -> PyResult<T> {
    if let Some(e) = out.py_err {
        return Err(e);
    }
    if out.cancelled_by_callback {
        return Err(cancelled_by_callback());
    }
    out.result.map_err(load_err)
}

fn cancelled_by_callback() -> PyErr {
    CancelledError::new_err("cancelled: the progress callback returned False")
}

/// `None` → all, a string → one glob, a list of strings → exact names.
fn selection(select: Option<&Bound<'_, PyAny>>) -> PyResult<Selection> {
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

fn backend(name: &str) -> BackendChoice {
    if name == "auto" { BackendChoice::Auto } else { BackendChoice::Named(name.to_owned()) }
}

/// One tensor's memory, exported to Python through the buffer protocol (writable) and DLPack.
#[pyclass(module = "tensora._native", frozen)]
#[derive(Debug)]
pub struct TensorData {
    t: TensorBytes,
}

impl TensorData {
    /// The exported bytes.
    pub fn into_bytes(self) -> TensorBytes {
        self.t
    }
}

#[pymethods]
impl TensorData {
    #[getter]
    fn name(&self) -> &str {
        &self.t.name
    }
    /// The safetensors dtype name (`"F16"`, `"BF16"`, `"F8_E4M3"`, ...).
    #[getter]
    fn dtype(&self) -> &'static str {
        self.t.dtype.as_str()
    }
    #[getter]
    fn shape(&self) -> Vec<u64> {
        self.t.shape.clone()
    }
    /// Strides in elements when the format records them (ServerlessLLM), else `None`.
    #[getter]
    fn strides(&self) -> Option<Vec<u64>> {
        self.t.strides.clone()
    }
    #[getter]
    fn nbytes(&self) -> usize {
        self.t.len_bytes
    }

    /// # Safety
    /// Called by Python with a valid `view`.
    unsafe fn __getbuffer__(slf: Bound<'_, Self>, view: *mut ffi::Py_buffer, flags: c_int) -> PyResult<()> {
        let t = &slf.get().t;
        let len = isize::try_from(t.len_bytes).map_err(|_| PyValueError::new_err("tensor too large"))?;
        // SAFETY: `view` is valid (the caller's contract). The range `addr .. addr + len` lies in
        // memory kept alive by `t.owner`, which `view.obj` (a new reference to `slf`, set by
        // `PyBuffer_FillInfo`) keeps alive until the buffer is released. The memory is writable
        // and the address was derived from a mutable pointer (`Loaded::tensor_mut_ptr`, a
        // copy-on-write `MmapMut`, or a heap box): an anonymous arena or a MAP_PRIVATE mapping,
        // which Rust never reads through a live reference while Python holds the buffer.
        let rc = unsafe { ffi::PyBuffer_FillInfo(view, slf.as_ptr(), t.addr as *mut c_void, len, 0, flags) };
        if rc != 0 { Err(PyErr::fetch(slf.py())) } else { Ok(()) }
    }

    /// DLPack export (legacy, unversioned capsule: accepted by every consumer). CPU only.
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<Bound<'py, PyAny>>,
        max_version: Option<Bound<'py, PyAny>>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let _ = (stream, max_version);
        if dl_device.is_some_and(|d| d.0 != dlpack::DEVICE_CPU) {
            return Err(pyo3::exceptions::PyBufferError::new_err("tensora tensors live on the CPU"));
        }
        if copy == Some(true) {
            return Err(pyo3::exceptions::PyBufferError::new_err(
                "copy=True is not supported; copy after import",
            ));
        }
        let managed = dlpack::ManagedTensor::new(&self.t).map_err(|e| DtypeError::new_err(e.to_string()))?;
        let raw = managed.into_raw();
        // SAFETY: `raw` is a live managed tensor; on success the capsule owns it and its destructor
        // deletes it unless a consumer renamed the capsule (took ownership).
        let capsule = unsafe {
            ffi::PyCapsule_New(
                raw.cast::<c_void>(),
                dlpack::CAPSULE_NAME.as_ptr(),
                Some(dlpack::capsule_destructor),
            )
        };
        if capsule.is_null() {
            // SAFETY: the capsule was not created, so `raw` is still ours to delete, once.
            unsafe { drop_managed(raw) };
            return Err(PyErr::fetch(py));
        }
        // SAFETY: `capsule` is a new, non-null reference.
        Ok(unsafe { Bound::from_owned_ptr(py, capsule) })
    }

    fn __dlpack_device__(&self) -> (i32, i32) {
        (dlpack::DEVICE_CPU, 0)
    }

    fn __repr__(&self) -> String {
        format!("TensorData(name={:?}, dtype={}, shape={:?})", self.t.name, self.t.dtype, self.t.shape)
    }
}

/// Delete a managed tensor that was never handed to a capsule.
///
/// # Safety
/// `raw` must come from `ManagedTensor::into_raw` and not have been deleted.
unsafe fn drop_managed(raw: *mut dlpack::DLManagedTensor) {
    // SAFETY: per the contract.
    unsafe {
        if let Some(d) = (*raw).deleter {
            d(raw);
        }
    }
}

/// A checkpoint opened for `safe_open`: its files stay open, and each `tensor` call maps that
/// tensor's bytes privately and writable (copy-on-write) on its own, so two calls for the same
/// name return independent memory (as HF's `get_tensor`, which copies), still without a copy.
#[pyclass(module = "tensora._native", frozen)]
#[derive(Debug)]
pub struct Mapped {
    ckpt: Checkpoint,
    /// One descriptor per checkpoint file (indexed by file id), stamp-checked when opened.
    files: Vec<std::fs::File>,
}

#[pymethods]
impl Mapped {
    #[new]
    fn new(py: Python<'_>, path: PathBuf) -> PyResult<Mapped> {
        py.detach(|| open_checkpoint_files(&path))
    }

    /// Tensor names, sorted (as HF `safe_open.keys()`).
    fn keys(&self) -> Vec<String> {
        let mut k: Vec<String> = self.ckpt.tensors().iter().map(|t| t.name().to_owned()).collect();
        k.sort_unstable();
        k
    }

    /// The `__metadata__` map, or `None` when empty.
    fn metadata<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        if self.ckpt.metadata().is_empty() {
            return Ok(None);
        }
        let d = PyDict::new(py);
        for (k, v) in self.ckpt.metadata() {
            d.set_item(k, v)?;
        }
        Ok(Some(d))
    }

    /// `(dtype, shape)` of a tensor.
    fn info(&self, name: &str) -> PyResult<(&'static str, Vec<u64>)> {
        let t = self.ckpt.tensor(name).ok_or_else(|| missing(name))?;
        Ok((t.dtype().as_str(), t.shape().to_vec()))
    }

    /// The tensor's bytes in a private copy-on-write mapping of its own (zero copy; writes stay
    /// in this mapping). The pages are read in now (GIL released), so a failing or truncated
    /// file is an exception here, not a `SIGBUS` later.
    fn tensor(&self, py: Python<'_>, name: &str) -> PyResult<TensorData> {
        let info = self.ckpt.tensor(name).ok_or_else(|| missing(name))?;
        let entry = self.ckpt.file(info.file());
        let file = self.files.get(info.file().index()).ok_or_else(|| missing(name))?;
        let (owner, addr) = py.detach(|| map_tensor(entry, file, info))?;
        Ok(TensorData {
            t: TensorBytes {
                owner,
                addr,
                len_bytes: usize::try_from(info.len_bytes()).map_err(|_| missing(name))?,
                name: name.to_owned(),
                dtype: info.dtype(),
                shape: info.shape().to_vec(),
                strides: info.strides().map(<[u64]>::to_vec),
            },
        })
    }
}

fn missing(name: &str) -> PyErr {
    SelectionError::new_err(format!("no tensor named {name:?}"))
}

/// An error naming the file.
fn file_err(path: &Path, what: impl std::fmt::Display) -> PyErr {
    exc::LoadError::new_err(format!("{}: {what}", path.display()))
}

/// Whether the descriptor's file still has the size, mtime and inode seen at parse time.
fn check_stamp(entry: &tensora_format::FileEntry, file: &std::fs::File) -> PyResult<()> {
    let meta = file.metadata().map_err(|e| file_err(entry.path(), e))?;
    if tensora_format::FileStamp::from_metadata(&meta) != entry.stamp() {
        return Err(file_err(entry.path(), "file changed since it was parsed (size, mtime or inode)"));
    }
    Ok(())
}

fn open_checkpoint_files(path: &Path) -> PyResult<Mapped> {
    let ckpt = tensora_format::open(path).map_err(format_err)?;
    let mut files = Vec::with_capacity(ckpt.files().len());
    for f in ckpt.files() {
        let file = std::fs::File::open(f.path()).map_err(|e| file_err(f.path(), e))?;
        check_stamp(f, &file)?;
        files.push(file);
    }
    Ok(Mapped { ckpt, files })
}

/// Map one tensor's byte range of `file` privately and writable, read its pages in, and return
/// the owner and the address of its first byte.
fn map_tensor(
    entry: &tensora_format::FileEntry,
    file: &std::fs::File,
    info: &tensora_format::TensorInfo,
) -> PyResult<(Arc<Owner>, usize)> {
    if info.len_bytes() == 0 {
        let words = vec![0u64; 1].into_boxed_slice();
        let addr = words.as_ptr() as usize;
        return Ok((Owner::new(Storage::Heap(words)), addr));
    }
    check_stamp(entry, file)?;
    let len = usize::try_from(info.len_bytes()).map_err(|_| file_err(entry.path(), "tensor too large"))?;
    // SAFETY: MAP_PRIVATE + PROT_WRITE (copy-on-write): writes through the mapping never reach
    // the file. The descriptor's stamp matched the parsed one just above, and the parser checked
    // that the tensor's range lies inside a file of that size. Truncation by another process
    // while mapped raises SIGBUS on access to a page not yet read in (documented in the Python
    // API); the pages are read in just below. No Rust reference into the mapping outlives this
    // call: Python reaches it only through the raw address.
    let mut map = unsafe { memmap2::MmapOptions::new().offset(info.offset_bytes()).len(len).map_copy(file) }
        .map_err(|e| file_err(entry.path(), e))?;
    let addr = map.as_mut_ptr() as usize;
    let never = AtomicBool::new(false);
    let cfg = place::PopulateConfig { threads: 1, cancel: &never, progress: None };
    // SAFETY: the span is exactly the live mapping `map`, which outlives the call.
    unsafe { place::populate(&[(addr, len)], &cfg) }.map_err(|e| match e {
        place::PopulateError::Io { source, .. } => file_err(entry.path(), source),
        place::PopulateError::Cancelled => CancelledError::new_err("cancelled"),
    })?;
    Ok((Owner::new(Storage::Mapped(vec![map])), addr))
}

/// What Python gets for one tensor of a `Loaded` held by `owner`. Writable pointers come from
/// `Loaded::tensor_mut_ptr` (derived from the storage's own mutable base, never from a shared
/// slice); an empty tensor gets a dangling, never-dereferenced address.
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

    /// The buffer for this tensor of `loaded` (which `owner` holds).
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
        Ok(TensorData {
            t: TensorBytes {
                owner: Arc::clone(owner),
                addr,
                len_bytes,
                name: self.name,
                dtype: self.dtype,
                shape: self.shape,
                strides: self.strides,
            },
        })
    }
}

/// `tensora_io::load`, and for mapped views read every selected page in before returning (so
/// an I/O error or a truncated file is an error now, never a `SIGBUS` later). Also returns the
/// seconds spent reading pages in (0 for an owned load).
pub(crate) fn load_chunk(
    ckpt: &Checkpoint,
    opts: &LoadOptions,
    cancel: &AtomicBool,
) -> Result<(tensora_io::Loaded, f64), LoadError> {
    let loaded = tensora_io::load(ckpt, opts)?;
    if opts.residence != Residence::Mapped {
        return Ok((loaded, 0.0));
    }
    let t = std::time::Instant::now();
    let names: Vec<String> = loaded.tensors().map(|t| t.name().to_owned()).collect();
    let spans: Vec<(&str, place::Span)> = names
        .iter()
        .filter_map(|n| loaded.tensor_mut_ptr(n).map(|(p, len)| (n.as_str(), (p.as_ptr() as usize, len))))
        .collect();
    let ranges: Vec<place::Span> = spans.iter().map(|s| s.1).collect();
    let cfg = place::PopulateConfig { threads: opts.threads, cancel, progress: opts.progress.as_ref() };
    // SAFETY: every span is a tensor's range inside `loaded`'s mappings, alive for the call.
    unsafe { place::populate(&ranges, &cfg) }.map_err(|e| match e {
        place::PopulateError::Cancelled => LoadError::Cancelled,
        place::PopulateError::Io { span, source } => {
            let name = spans.get(span).map_or("?", |s| s.0);
            LoadError::Map(std::io::Error::new(source.kind(), format!("tensor {name:?}: {source}")))
        }
    })?;
    Ok((loaded, t.elapsed().as_secs_f64()))
}

/// The tensors of one load, as Python receives them.
struct Exported {
    owner: Arc<Owner>,
    metas: Vec<ExportMeta>,
    report: tensora_io::LoadReport,
}

/// Open, decide where the tensors live (see [`place`]), load, and for mapped views read every
/// selected page in before returning. Runs with the GIL released.
fn load_placed(
    path: &Path,
    opts: LoadOptions,
    placement: place::Placement,
    cancel: &AtomicBool,
) -> Result<Exported, LoadError> {
    let t = std::time::Instant::now();
    let ckpt = tensora_format::open(path)?;
    let parse = t.elapsed().as_secs_f64();
    let t = std::time::Instant::now();
    let decision = place::decide(&place::facts(&ckpt, &opts.selection, &opts.backend, placement)?);
    let decide_seconds = t.elapsed().as_secs_f64();
    let opts = LoadOptions { residence: decision.residence, ..opts };
    let (loaded, populate_seconds) = load_chunk(&ckpt, &opts, cancel)?;
    let mut report = loaded.report().clone();
    report.phases.parse = parse;
    report.phases.open += decide_seconds;
    // The report's phases end before the pages are read in: bill that to `io`.
    report.phases.io += populate_seconds;
    let metas = ExportMeta::all(&loaded);
    report.reason = format!("{}; {}", decision.reason, report.reason);
    report.finalize();
    let owner = Owner::new(Storage::Loaded(Box::new(loaded)));
    Ok(Exported { owner, metas, report })
}

/// Load every selected tensor (GIL released) and return `({name: TensorData}, report_json)`,
/// the dict sorted by name. `residence`: `"auto"` (zero-copy mapped views when the files are
/// local and warm and `backend` is `"auto"`, an owned arena otherwise), `"owned"` or `"mapped"`.
#[pyfunction]
#[pyo3(signature = (path, select=None, backend="auto", progress=None, residence="auto"))]
fn load<'py>(
    py: Python<'py>,
    path: PathBuf,
    select: Option<&Bound<'py, PyAny>>,
    backend: &str,
    progress: Option<Py<PyAny>>,
    residence: &str,
) -> PyResult<(Bound<'py, PyDict>, String)> {
    let placement = place::Placement::parse(residence).map_err(PyValueError::new_err)?;
    let cancel = Arc::new(AtomicBool::new(false));
    let opts = LoadOptions {
        backend: self::backend(backend),
        selection: selection(select)?,
        cancel: Some(Arc::clone(&cancel)),
        ..LoadOptions::default()
    };
    let out = drive::run(py, progress.as_ref(), &cancel, |hook| {
        load_placed(&path, LoadOptions { progress: hook, ..opts }, placement, &cancel)
    });
    let Exported { owner, mut metas, report } = finish(out)?;
    let Storage::Loaded(loaded) = owner.storage() else {
        return Err(exc::LoadError::new_err("internal: load produced no owned storage"));
    };
    metas.sort_unstable_by(|a, b| a.name.cmp(&b.name));
    let d = PyDict::new(py);
    for m in metas {
        let name = m.name.clone();
        d.set_item(name, m.export(&owner, loaded)?)?;
    }
    let report = serde_json::to_string(&report).map_err(|e| exc::LoadError::new_err(e.to_string()))?;
    Ok((d, report))
}

/// The checkpoint's structure as JSON (format, files, metadata, tensors, warnings).
#[pyfunction]
fn inspect_json(py: Python<'_>, path: PathBuf) -> PyResult<String> {
    let ckpt = py.detach(|| tensora_format::open(&path)).map_err(format_err)?;
    let files: Vec<_> = ckpt
        .files()
        .iter()
        .map(|f| serde_json::json!({"path": f.path().display().to_string(), "len_bytes": f.len_bytes()}))
        .collect();
    let tensors: Vec<_> = ckpt
        .tensors()
        .iter()
        .map(|t| {
            serde_json::json!({
                "name": t.name(), "dtype": t.dtype().as_str(), "shape": t.shape(),
                "file": t.file().0, "offset_bytes": t.offset_bytes(), "len_bytes": t.len_bytes(),
                "strides": t.strides(),
            })
        })
        .collect();
    let warnings: Vec<String> =
        ckpt.warnings().iter().map(|w| format!("{}: {}", w.path.display(), w.message)).collect();
    let doc = serde_json::json!({
        "path": path.display().to_string(),
        "format": ckpt.format().as_str(),
        "files": files,
        "metadata": ckpt.metadata(),
        "tensors": tensors,
        "tensor_bytes": ckpt.total_tensor_bytes(),
        "warnings": warnings,
    });
    Ok(doc.to_string())
}

/// One digest (hex) per tensor, computed inside a load (GIL released).
#[pyfunction]
#[pyo3(signature = (path, algo="crc32c", backend="auto", progress=None))]
fn hash<'py>(
    py: Python<'py>,
    path: PathBuf,
    algo: &str,
    backend: &str,
    progress: Option<Py<PyAny>>,
) -> PyResult<Bound<'py, PyDict>> {
    let algo: tensora_verify::Algo =
        algo.parse().map_err(|e: tensora_verify::UnknownAlgo| VerifyError::new_err(e.to_string()))?;
    let ckpt = py.detach(|| tensora_format::open(&path)).map_err(format_err)?;
    let cancel = Arc::new(AtomicBool::new(false));
    let backend = (backend != "auto").then(|| backend.to_owned());
    let out = drive::run(py, progress.as_ref(), &cancel, |hook| {
        let opts = tensora_verify::hash::HashOptions { algo, backend, progress: hook };
        tensora_verify::hash::hash_checkpoint(&ckpt, &opts)
    });
    if let Some(e) = out.py_err {
        return Err(e);
    }
    if out.cancelled_by_callback {
        return Err(cancelled_by_callback());
    }
    let digests = out.result.map_err(|e| match e {
        tensora_verify::hash::HashError::Load(l) => load_err(l),
        other => VerifyError::new_err(other.to_string()),
    })?;
    let d = PyDict::new(py);
    for (t, dg) in ckpt.tensors().iter().zip(digests) {
        d.set_item(t.name(), dg.to_hex())?;
    }
    Ok(d)
}

/// Verify a checkpoint (optionally against a manifest); the report as JSON.
#[pyfunction]
#[pyo3(signature = (path, manifest=None))]
fn verify_json(py: Python<'_>, path: PathBuf, manifest: Option<PathBuf>) -> PyResult<String> {
    py.detach(|| {
        let manifest = match manifest {
            Some(m) => {
                Some(tensora_verify::Manifest::read(&m).map_err(|e| VerifyError::new_err(e.to_string()))?)
            }
            None => None,
        };
        let opts = tensora_verify::check::VerifyOptions { manifest: manifest.as_ref(), ..Default::default() };
        let report = tensora_verify::check::verify_path(&path, &opts);
        Ok(report.to_json().to_string())
    })
}

/// Convert `src` to `to` (`"safetensors"` or `"serverlessllm"`) at `dst`; the report as JSON.
#[pyfunction]
#[pyo3(signature = (src, dst, to, shard_bytes_max=None))]
fn convert_json(
    py: Python<'_>,
    src: PathBuf,
    dst: PathBuf,
    to: &str,
    shard_bytes_max: Option<u64>,
) -> PyResult<String> {
    use tensora_io::convert::{ConvertConfig, TargetFormat};
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
        let report = tensora_io::convert::convert(&ckpt, &dst, &cfg)
            .map_err(|e| ConvertError::new_err(e.to_string()))?;
        serde_json::to_string(&report).map_err(|e| ConvertError::new_err(e.to_string()))
    })
}

/// Stream tensors from one path or a list of files; see `stream::Stream`.
#[pyfunction]
#[pyo3(signature = (paths, select=None, budget_bytes=None, backend="auto", residence="auto"))]
fn open_stream(
    paths: &Bound<'_, PyAny>,
    select: Option<&Bound<'_, PyAny>>,
    budget_bytes: Option<u64>,
    backend: &str,
    residence: &str,
) -> PyResult<stream::Stream> {
    let placement = place::Placement::parse(residence).map_err(PyValueError::new_err)?;
    let paths: Vec<PathBuf> = if let Ok(p) = paths.extract::<PathBuf>() {
        vec![p]
    } else if paths.is_instance_of::<PyList>() || paths.is_instance_of::<PyTuple>() {
        paths.extract()?
    } else {
        paths.try_iter()?.map(|p| p?.extract::<PathBuf>()).collect::<PyResult<_>>()?
    };
    let names_wanted: Option<BTreeSet<String>> = match selection(select)? {
        Selection::Names(n) => Some(n.into_iter().collect()),
        _ => None,
    };
    stream::Stream::start(
        paths,
        selection(select)?,
        names_wanted,
        budget_bytes.unwrap_or(stream::BUDGET_DEFAULT_BYTES),
        self::backend(backend),
        placement,
    )
}

/// How many memory owners (loads, mappings, streamed runs) are alive: test support.
#[pyfunction]
fn owners_live() -> usize {
    owner::owners_live()
}

/// The registered backend names.
#[pyfunction]
fn backends() -> Vec<&'static str> {
    tensora_io::registry::names().to_vec()
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("TensoraError", py.get_type::<TensoraError>())?;
    m.add("FormatError", py.get_type::<FormatError>())?;
    m.add("LoadError", py.get_type::<exc::LoadError>())?;
    m.add("SelectionError", py.get_type::<SelectionError>())?;
    m.add("CancelledError", py.get_type::<CancelledError>())?;
    m.add("DtypeError", py.get_type::<DtypeError>())?;
    m.add("VerifyError", py.get_type::<VerifyError>())?;
    m.add("ConvertError", py.get_type::<ConvertError>())?;
    m.add_class::<TensorData>()?;
    m.add_class::<Mapped>()?;
    m.add_class::<stream::Stream>()?;
    m.add_function(wrap_pyfunction!(load, m)?)?;
    m.add_function(wrap_pyfunction!(open_stream, m)?)?;
    m.add_function(wrap_pyfunction!(inspect_json, m)?)?;
    m.add_function(wrap_pyfunction!(hash, m)?)?;
    m.add_function(wrap_pyfunction!(verify_json, m)?)?;
    m.add_function(wrap_pyfunction!(convert_json, m)?)?;
    m.add_function(wrap_pyfunction!(owners_live, m)?)?;
    m.add_function(wrap_pyfunction!(backends, m)?)?;
    Ok(())
}
