//! Python bindings for Tensora (the `tensora` package; this is its native module
//! `tensora._native`). The Python layer in `python/tensora/__init__.py` turns the buffers made
//! here into numpy arrays (buffer protocol) or torch tensors (DLPack), zero copy.
//!
//! Every buffer handed to Python holds an `Arc` of its [`owner::Owner`]: a load (an owned arena
//! by default, or zero-copy views of private copy-on-write mappings, see [`place`]), a
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
pub mod owner;
pub mod place;
pub mod queue;
mod stream;

use std::collections::{BTreeSet, HashSet};
use std::ffi::{c_int, c_void};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use pyo3::exceptions::PyValueError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};
use tensora_format::Checkpoint;
use tensora_format::Selection;
use tensora_io::{BackendChoice, LoadError, LoadOptions, Residence};

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

/// A checkpoint opened for `safe_open`: its files stay open. Each file is mapped once, whole,
/// privately and writable (copy-on-write, `MAP_NORESERVE`), at the first call that needs it. The
/// first `tensor` call for each tensor returns a view into that mapping with the tensor's pages
/// read in, so any number of tensors costs one mapping per file (`vm.max_map_count` is 65,530 by
/// default). A repeated call for a tensor already handed out returns independent memory, as HF's
/// `get_tensor` (which copies): a mapping of its own while fewer than
/// [`owner::CALL_MAPPINGS_MAX`] are alive in the process, else a heap copy read from the file.
#[pyclass(module = "tensora._native", frozen)]
#[derive(Debug)]
pub struct Mapped {
    ckpt: Checkpoint,
    /// One descriptor per checkpoint file (indexed by file id), stamp-checked when opened.
    files: Vec<std::fs::File>,
    state: Mutex<MapState>,
}

/// What `Mapped` has mapped and handed out.
#[derive(Debug)]
struct MapState {
    /// Per file (indexed by file id): its whole-file mapping and that mapping's base address
    /// (taken from its mutable pointer), once created.
    shared: Vec<Option<(Arc<Owner>, usize)>>,
    /// `(file id, offset)` of every tensor handed out from a shared mapping. A checkpoint's ranges
    /// are disjoint or exact ties, so the start names the bytes (tied tensors share them). At most
    /// one entry per tensor of the checkpoint.
    handed_out: HashSet<(usize, u64)>,
}

/// What a `Mapped` fetch is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fetch {
    /// `get_tensor`: the tensor's pages are read in before returning, and the bytes count as
    /// handed out (a later fetch of them gets its own memory).
    Tensor,
    /// `get_slice`: nothing is read in and nothing is handed out; the caller copies the part it
    /// indexes out at once, so only those pages are faulted in.
    Lazy,
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

    /// The tensor's bytes, zero copy and copy-on-write (writes never reach the file), its pages
    /// read in now (GIL released) so an I/O error or an already truncated file is an exception
    /// here. The views stay backed by the file: truncating it in place later raises `SIGBUS`.
    fn tensor(&self, py: Python<'_>, name: &str) -> PyResult<TensorData> {
        self.fetch(py, name, Fetch::Tensor)
    }

    /// The tensor's bytes for `get_slice`, nothing read in: copy the part needed out at once
    /// and drop this (it may be the view a later `tensor` call hands out).
    fn tensor_lazy(&self, py: Python<'_>, name: &str) -> PyResult<TensorData> {
        self.fetch(py, name, Fetch::Lazy)
    }

    /// How many whole-file mappings this object has created (test support).
    fn file_mappings(&self) -> usize {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).shared.iter().flatten().count()
    }
}

impl Mapped {
    fn fetch(&self, py: Python<'_>, name: &str, how: Fetch) -> PyResult<TensorData> {
        let info = self.ckpt.tensor(name).ok_or_else(|| missing(name))?;
        let entry = self.ckpt.file(info.file());
        let len_bytes =
            usize::try_from(info.len_bytes()).map_err(|_| file_err(entry.path(), "tensor too large"))?;
        let (owner, addr) = py.detach(|| self.place(info, len_bytes, how))?;
        Ok(TensorData {
            t: TensorBytes {
                owner,
                addr,
                len_bytes,
                name: name.to_owned(),
                dtype: info.dtype(),
                shape: info.shape().to_vec(),
                strides: info.strides().map(<[u64]>::to_vec),
            },
        })
    }

    /// Where the bytes of `info` are handed out from: the file's shared mapping when they are
    /// not handed out yet, else memory of their own.
    fn place(
        &self,
        info: &tensora_format::TensorInfo,
        len_bytes: usize,
        how: Fetch,
    ) -> PyResult<(Arc<Owner>, usize)> {
        if len_bytes == 0 {
            let words = vec![0u64; 1].into_boxed_slice();
            let addr = words.as_ptr() as usize;
            return Ok((Owner::new(Storage::Heap(words)), addr));
        }
        let entry = self.ckpt.file(info.file());
        let file_id = info.file().index();
        let file =
            self.files.get(file_id).ok_or_else(|| file_err(entry.path(), "internal: no descriptor"))?;
        check_stamp(entry, file)?;
        let key = (file_id, info.offset_bytes());
        let shared = {
            let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
            if st.handed_out.contains(&key) {
                None
            } else {
                let slot =
                    st.shared.get_mut(file_id).ok_or_else(|| file_err(entry.path(), "internal: no slot"))?;
                let (owner, base) = match slot {
                    Some((o, base)) => (Arc::clone(o), *base),
                    None => {
                        let made = map_file(entry, file)?;
                        *slot = Some((Arc::clone(&made.0), made.1));
                        made
                    }
                };
                // Lazy (`get_slice`) views count too: a later `get_tensor` of these bytes, which may
                // be written, must not share the view a slice is still copying from.
                st.handed_out.insert(key);
                Some((owner, base))
            }
        };
        let Some((owner, base)) = shared else {
            return own_copy(entry, file, info, len_bytes, how);
        };
        let offset =
            usize::try_from(info.offset_bytes()).map_err(|_| file_err(entry.path(), "offset too large"))?;
        let addr = base + offset;
        if how == Fetch::Tensor {
            // SAFETY: the tensor's range lies inside the file (the parser's guarantee), and the
            // mapping covers the whole file at the size the stamp check just confirmed; `owner`
            // keeps it mapped for the call.
            if let Err(e) = unsafe { populate_tensor(entry, info, addr, len_bytes) } {
                // Nobody got the view: the bytes are not handed out.
                self.state.lock().unwrap_or_else(|e| e.into_inner()).handed_out.remove(&key);
                return Err(e);
            }
        }
        Ok((owner, addr))
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
    let state = MapState { shared: vec![None; files.len()], handed_out: HashSet::new() };
    Ok(Mapped { ckpt, files, state: Mutex::new(state) })
}

/// Map all of `file` (whose stamp was just checked) privately and writable, nothing read in;
/// the owner and the mapping's base address.
fn map_file(entry: &tensora_format::FileEntry, file: &std::fs::File) -> PyResult<(Arc<Owner>, usize)> {
    let len = usize::try_from(entry.len_bytes()).map_err(|_| file_err(entry.path(), "file too large"))?;
    // SAFETY: MAP_PRIVATE + PROT_WRITE (copy-on-write): writes through the mapping never reach
    // the file; MAP_NORESERVE charges only pages actually written, so a file larger than RAM +
    // swap maps under overcommit mode 0. The caller checked the descriptor's stamp against the
    // parsed one, so the file has the parsed length. Truncation by another process while mapped
    // raises SIGBUS on access to a page not yet copied (documented in the Python API); pages
    // handed out by `get_tensor` are read in first. No Rust reference into the mapping outlives
    // this call: Python reaches it only through raw addresses.
    let mut map = unsafe { memmap2::MmapOptions::new().len(len).no_reserve_swap().map_copy(file) }
        .map_err(|e| file_err(entry.path(), e))?;
    let base = map.as_mut_ptr() as usize;
    Ok((Owner::new(Storage::Mapped(vec![map])), base))
}

/// Read in the pages of one tensor at `addr`; an error names the file, the offset and the tensor.
///
/// # Safety
/// `addr .. addr + len_bytes` lies inside a live mapping that starts on a page boundary.
unsafe fn populate_tensor(
    entry: &tensora_format::FileEntry,
    info: &tensora_format::TensorInfo,
    addr: usize,
    len_bytes: usize,
) -> PyResult<()> {
    let never = AtomicBool::new(false);
    let cfg = place::PopulateConfig { threads: 1, cancel: &never, progress: None };
    // SAFETY: per the contract.
    unsafe { place::populate(&[(addr, len_bytes)], &cfg) }.map(|_| ()).map_err(|e| match e {
        place::PopulateError::Io { piece_addr, piece_len_bytes, source, .. } => load_err(LoadError::Read {
            path: entry.path().to_path_buf(),
            offset_bytes: info.offset_bytes() + (piece_addr - addr) as u64,
            len_bytes: piece_len_bytes as u64,
            tensor: info.name().to_owned(),
            kind: tensora_io::ReadErrorKind::Io(source),
        }),
        place::PopulateError::Cancelled => CancelledError::new_err("cancelled"),
    })
}

/// Memory of its own for one tensor of `file` (a repeated `get_tensor`): a mapping of its own
/// while a [`owner::CallSlot`] is free, else a heap copy read from the file.
fn own_copy(
    entry: &tensora_format::FileEntry,
    file: &std::fs::File,
    info: &tensora_format::TensorInfo,
    len_bytes: usize,
    how: Fetch,
) -> PyResult<(Arc<Owner>, usize)> {
    let Some(slot) = owner::CallSlot::try_take() else {
        return heap_copy(entry, file, info, len_bytes);
    };
    // SAFETY: as in `map_file`, for the tensor's own range (inside the file, whose stamp the
    // caller just checked); `offset` need not be page-aligned (memmap2 aligns the mapping and
    // returns a pointer to the offset).
    let mut map = unsafe {
        memmap2::MmapOptions::new()
            .offset(info.offset_bytes())
            .len(len_bytes)
            .no_reserve_swap()
            .map_copy(file)
    }
    .map_err(|e| file_err(entry.path(), e))?;
    let addr = map.as_mut_ptr() as usize;
    if how == Fetch::Tensor {
        // SAFETY: the span is exactly the live mapping `map`, whose start rounds down to its
        // page-aligned base; it outlives the call.
        unsafe { populate_tensor(entry, info, addr, len_bytes) }?;
    }
    Ok((Owner::new(Storage::CallMapped(map, slot)), addr))
}

/// The tensor's bytes read from the file into 8-byte words (aligned for every dtype).
fn heap_copy(
    entry: &tensora_format::FileEntry,
    file: &std::fs::File,
    info: &tensora_format::TensorInfo,
    len_bytes: usize,
) -> PyResult<(Arc<Owner>, usize)> {
    use std::os::unix::fs::FileExt;
    // The length is the parsed tensor's, inside the file (checked by the parser and the stamp).
    let mut words = vec![0u64; len_bytes.div_ceil(8)].into_boxed_slice();
    // SAFETY: the words own `8 * words.len() >= len_bytes` initialised bytes, any byte pattern is
    // a valid `u64`, and no other reference to them exists while this slice lives.
    let bytes = unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<u8>(), len_bytes) };
    file.read_exact_at(bytes, info.offset_bytes()).map_err(|e| {
        file_err(
            entry.path(),
            format_args!("reading tensor {:?} at offset {}: {e}", info.name(), info.offset_bytes()),
        )
    })?;
    let addr = words.as_mut_ptr() as usize;
    Ok((Owner::new(Storage::Heap(words)), addr))
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
/// an I/O error or a file already truncated fails the load; see [`populate_loaded`]). Also
/// returns the seconds spent reading pages in (0 for an owned load).
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
    let cfg = place::PopulateConfig { threads: opts.threads, cancel, progress: opts.progress.as_ref() };
    populate_loaded(ckpt, &loaded, &cfg)?;
    Ok((loaded, t.elapsed().as_secs_f64()))
}

/// Read in the pages of every tensor of a mapped load of `ckpt`. A failure is a
/// [`LoadError::Read`] naming the file, the file offset of the failing piece and the tensor.
pub(crate) fn populate_loaded(
    ckpt: &Checkpoint,
    loaded: &tensora_io::Loaded,
    cfg: &place::PopulateConfig<'_>,
) -> Result<(), LoadError> {
    let names: Vec<String> = loaded.tensors().map(|t| t.name().to_owned()).collect();
    let spans: Vec<(&str, place::Span)> = names
        .iter()
        .filter_map(|n| loaded.tensor_mut_ptr(n).map(|(p, len)| (n.as_str(), (p.as_ptr() as usize, len))))
        .collect();
    let ranges: Vec<place::Span> = spans.iter().map(|s| s.1).collect();
    // SAFETY: every span is a tensor's range inside `loaded`'s mappings, alive for the call.
    unsafe { place::populate(&ranges, cfg) }.map(|_| ()).map_err(|e| match e {
        place::PopulateError::Cancelled => LoadError::Cancelled,
        place::PopulateError::Io { span, piece_addr, piece_len_bytes, source } => {
            let found = spans.get(span).and_then(|&(name, (span_addr, _))| {
                let info = ckpt.tensor(name)?;
                Some((name, info, piece_addr.checked_sub(span_addr)?))
            });
            match found {
                Some((name, info, into_bytes)) => LoadError::Read {
                    path: ckpt.file(info.file()).path().to_path_buf(),
                    offset_bytes: info.offset_bytes() + into_bytes as u64,
                    len_bytes: piece_len_bytes as u64,
                    tensor: name.to_owned(),
                    kind: tensora_io::ReadErrorKind::Io(source),
                },
                None => LoadError::Map(source),
            }
        }
    })
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
/// the dict sorted by name. `residence`: `"owned"` (the default: an owned arena, a snapshot),
/// `"auto"` (zero-copy mapped views when the files are local and warm and `backend` is `"auto"`,
/// owned otherwise) or `"mapped"`.
#[pyfunction]
#[pyo3(signature = (path, select=None, backend="auto", progress=None, residence="owned"))]
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

/// Stream tensors from one path or a list of files; see `stream::Stream`.
#[pyfunction]
#[pyo3(signature = (paths, select=None, budget_bytes=None, backend="auto", residence="owned"))]
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

/// How many per-call `safe_open` mappings are alive (at most `CALL_MAPPINGS_MAX`): test support.
#[pyfunction]
fn call_mappings_live() -> usize {
    owner::call_mappings_live()
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
    m.add_function(wrap_pyfunction!(call_mappings_live, m)?)?;
    m.add("CALL_MAPPINGS_MAX", owner::CALL_MAPPINGS_MAX)?;
    m.add_function(wrap_pyfunction!(backends, m)?)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    const BIG_BYTES: usize = 12 << 20;

    /// A safetensors file with a 16-byte tensor `small` then a 12 MiB tensor `big` (U8); the
    /// file's path and the absolute offset of `big`.
    fn two_tensors(dir: &Path) -> (PathBuf, u64) {
        let header = format!(
            r#"{{"small":{{"dtype":"U8","shape":[16],"data_offsets":[0,16]}},"big":{{"dtype":"U8","shape":[{BIG_BYTES}],"data_offsets":[16,{}]}}}}"#,
            16 + BIG_BYTES
        );
        let mut header = header.into_bytes();
        while header.len() % 8 != 0 {
            header.push(b' ');
        }
        let path = dir.join("two.safetensors");
        let mut f = std::fs::File::create(&path).unwrap();
        f.write_all(&(header.len() as u64).to_le_bytes()).unwrap();
        f.write_all(&header).unwrap();
        f.write_all(&[7u8; 16]).unwrap();
        f.write_all(&vec![9u8; BIG_BYTES]).unwrap();
        (path, 8 + header.len() as u64 + 16)
    }

    #[test]
    fn a_populate_failure_names_the_file_the_offset_and_the_tensor() {
        let dir = tempfile::tempdir().unwrap();
        let (path, big_offset) = two_tensors(dir.path());
        let ckpt = tensora_format::open(&path).unwrap();
        let opts = LoadOptions { residence: Residence::Mapped, ..LoadOptions::default() };
        let loaded = tensora_io::load(&ckpt, &opts).unwrap();
        // Cut the file 1 MiB past the end of the first populate piece of `big`: that piece reads
        // in, the next one runs past the end of the file.
        let cut = big_offset + place::POPULATE_PIECE_BYTES_MAX as u64 + (1 << 20);
        std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(cut).unwrap();
        let never = AtomicBool::new(false);
        let cfg = place::PopulateConfig { threads: 1, cancel: &never, progress: None };
        let e = populate_loaded(&ckpt, &loaded, &cfg).expect_err("the cut piece cannot be read in");
        let msg = e.to_string();
        let LoadError::Read { path: p, offset_bytes, len_bytes, tensor, kind } = e else {
            panic!("expected a Read error, got {msg}");
        };
        assert_eq!(p, path);
        assert_eq!(tensor, "big");
        assert_eq!(offset_bytes, big_offset + place::POPULATE_PIECE_BYTES_MAX as u64);
        assert_eq!(len_bytes, (BIG_BYTES - place::POPULATE_PIECE_BYTES_MAX) as u64);
        assert!(
            matches!(&kind, tensora_io::ReadErrorKind::Io(io) if io.kind() == std::io::ErrorKind::UnexpectedEof),
            "{kind:?}"
        );
        assert!(msg.contains(&path.display().to_string()) && msg.contains("\"big\""), "{msg}");
        assert!(msg.contains(&format!("offset {offset_bytes}")), "{msg}");
    }

    fn fixture_path() -> &'static str {
        concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/real/fracast-0.int8.safetensors")
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]
        /// Whatever the order of `get_tensor` / `get_slice` fetches, every fetch shows the file's
        /// bytes (earlier writes into handed-out tensors never show through), a repeated
        /// `get_tensor` of a name gets memory of its own, and one mapping per file is made.
        #[test]
        fn fetches_show_the_file_and_repeats_are_independent(
            ops in proptest::collection::vec((0usize..67, proptest::bool::ANY), 1..40),
        ) {
            let _serial = owner::TEST_LOCK.lock().unwrap_or_else(|e| e.into_inner());
            let file_bytes = std::fs::read(fixture_path()).unwrap();
            let m = open_checkpoint_files(Path::new(fixture_path())).unwrap();
            let mut kept: Vec<(Arc<Owner>, usize)> = Vec::new();
            let mut handed: HashSet<String> = HashSet::new();
            for (i, tensor) in ops {
                let info = &m.ckpt.tensors()[i % m.ckpt.tensors().len()];
                let len = usize::try_from(info.len_bytes()).unwrap();
                let how = if tensor { Fetch::Tensor } else { Fetch::Lazy };
                let (owner, addr) = m.place(info, len, how).unwrap();
                let off = usize::try_from(info.offset_bytes()).unwrap();
                // SAFETY: `addr .. addr + len` lies in memory `owner` keeps alive; no write
                // through another pointer happens while this slice lives.
                let got = unsafe { std::slice::from_raw_parts(addr as *const u8, len) };
                proptest::prop_assert_eq!(got, &file_bytes[off..off + len], "{}", info.name());
                let repeat = tensor && handed.contains(info.name());
                if repeat {
                    proptest::prop_assert!(
                        kept.iter().all(|&(_, a)| a != addr) || len == 0,
                        "a repeated get_tensor reused memory"
                    );
                }
                if tensor {
                    handed.insert(info.name().to_owned());
                    // SAFETY: as above; this fetch was handed out to us alone (copy-on-write).
                    unsafe { std::ptr::write_bytes(addr as *mut u8, 0xA5, len) };
                    kept.push((owner, addr));
                }
            }
            proptest::prop_assert!(m.file_mappings() <= 1);
            proptest::prop_assert_eq!(owner::call_mappings_live(), kept.iter().filter(|(o, _)| matches!(o.storage(), Storage::CallMapped(..))).count());
        }
    }

    #[test]
    fn an_intact_mapped_load_populates() {
        let dir = tempfile::tempdir().unwrap();
        let (path, _) = two_tensors(dir.path());
        let ckpt = tensora_format::open(&path).unwrap();
        let opts = LoadOptions { residence: Residence::Mapped, ..LoadOptions::default() };
        let never = AtomicBool::new(false);
        let (loaded, _) = load_chunk(&ckpt, &opts, &never).unwrap();
        let big = loaded.tensors().find(|t| t.name() == "big").unwrap();
        assert!(big.bytes().iter().all(|&b| b == 9));
    }
}
