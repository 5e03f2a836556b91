//! `safe_open`'s native side ([`Mapped`]): each file mapped once, copy-on-write, and every
//! `get_tensor` a zero-copy view of it with its pages read in.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use pyo3::prelude::*;
use pyo3::types::PyDict;
use tensora_format::Checkpoint;
use tensora_io::LoadError;
use tensora_io::{PopulateConfig, PopulateError, ReadAhead, Span, populate};

use crate::exc::{CancelledError, SelectionError};
use crate::owner::{self, Owner, Storage, TensorBytes};
use crate::tensor::CopyTally;
use crate::{TensorData, exc, format_err, load_err};
use tensora_verify::ManifestCheck;

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
    /// Tensors handed out as aligned copies (file offset not a multiple of the element size).
    copies: CopyTally,
    /// `manifest=`: every fetch is checked against it before it is returned.
    check: Option<Arc<ManifestCheck>>,
    /// How `get_tensor` reads the bytes.
    read: Read,
    /// The files being read into the page cache since open, when they were cold and fit
    /// (`tensora_io::Prefetch::if_cold`); stopped and joined when this is dropped.
    prefetch: Option<tensora_io::Prefetch>,
}

/// How a [`Mapped`] serves tensors (`backend=` of `safe_open`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Read {
    /// Views of each file's private copy-on-write mapping (`"mmap"`, `"auto"`).
    Map,
    /// Every tensor `pread` into heap memory of its own (`"pread"`, HF 0.8's other backend):
    /// nothing stays mapped, so later changes to the file cannot fault the tensors.
    Pread,
}

impl Read {
    /// `safe_open`'s `backend=`: `"auto"` and `"mmap"` map, `"pread"` reads; the load backends
    /// (`tensora.backends()`) do not apply to `safe_open` and are refused naming the ones that do.
    fn parse(name: &str) -> PyResult<Read> {
        match name {
            "auto" | "mmap" => Ok(Read::Map),
            "pread" => Ok(Read::Pread),
            other => Err(exc::LoadError::new_err(format!(
                "safe_open backend {other:?} is invalid (expected one of: \"auto\", \"mmap\", \"pread\"; the load \
                 backends apply to load_file and weights_iterator)"
            ))),
        }
    }
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
    /// Open `path`; with `manifest`, every `tensor` / `tensor_lazy` fetch is checked against it
    /// (the whole tensor, even for a slice) before it is returned.
    /// `backend`: `"auto"` or `"mmap"` (views of a private mapping) or `"pread"` (copies read
    /// into memory of their own). `read_ahead`: read the files into the page cache from open, in
    /// a thread of their own, when `auto`'s rule says so (cold, local, the pages fit: see
    /// [`prefetch_if_cold`]); for callers that read every tensor (HF's `safe_open` users), not
    /// for those that read slices of a few.
    #[new]
    #[pyo3(signature = (path, manifest=None, backend="auto", read_ahead=false))]
    fn new(
        py: Python<'_>,
        path: PathBuf,
        manifest: Option<PathBuf>,
        backend: &str,
        read_ahead: bool,
    ) -> PyResult<Mapped> {
        let read = Read::parse(backend)?;
        py.detach(|| {
            let mut m = open_checkpoint_files(&path)?;
            m.read = read;
            if read_ahead && read == Read::Map {
                m.prefetch = tensora_io::Prefetch::if_cold(&m.ckpt, &m.files);
            }
            if let Some(manifest) = manifest {
                m.check = Some(crate::manifest_check(&m.ckpt, &crate::read_manifest(&manifest)?)?);
            }
            Ok(m)
        })
    }

    /// Tensor names, sorted (as HF `safe_open.keys()`).
    fn keys(&self) -> Vec<String> {
        let mut k: Vec<String> = self.ckpt.tensors().iter().map(|t| t.name().to_owned()).collect();
        k.sort_unstable();
        k
    }

    /// Tensor names in the order of their bytes (file, then offset: HF `offset_keys()`).
    fn offset_keys(&self) -> Vec<String> {
        let mut t: Vec<&tensora_format::TensorInfo> = self.ckpt.tensors().iter().collect();
        t.sort_by_key(|t| (t.file().index(), t.offset_bytes()));
        t.into_iter().map(|t| t.name().to_owned()).collect()
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

    /// `get_slice(name)[..]` of one dimension (`narrow(dim, start, len)`): only the slice's bytes
    /// read (its rows, or a covering range when the gaps cost less than requests: the
    /// planner's choice), into memory of its own, contiguous, with the load's report as JSON.
    /// `None` with `manifest=` (the manifest covers whole tensors: the caller takes the lazy view).
    fn slice<'py>(
        &self,
        py: Python<'py>,
        name: &str,
        dim: usize,
        start: u64,
        len: u64,
    ) -> PyResult<Option<(Bound<'py, PyAny>, String)>> {
        if self.check.is_some() {
            return Ok(None);
        }
        let slice = tensora_format::Slice { dim, start, len };
        let opts = tensora_io::LoadOptions {
            selection: tensora_format::Selection::Names(vec![name.to_owned()]),
            shard: Some(tensora_format::Shard::Slices(vec![(name.to_owned(), slice)])),
            ..tensora_io::LoadOptions::default()
        };
        let loaded = py.detach(|| tensora_io::load(&self.ckpt, &opts)).map_err(load_err)?;
        let report =
            serde_json::to_value(loaded.report()).map_err(|e| exc::LoadError::new_err(e.to_string()))?;
        let (datas, report) = crate::export::export_all(py, loaded, report)?;
        let data = datas.get_item(name)?.ok_or_else(|| missing(name))?;
        let held: PyRef<'_, TensorData> = data.extract()?;
        self.copies.note(&held);
        drop(held);
        Ok(Some((data, report)))
    }

    /// `(tensors, bytes)` handed out so far as aligned copies (their file offset was not a
    /// multiple of their element size).
    fn aligned_copies(&self) -> (u64, u64) {
        self.copies.get()
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
        let data = TensorData::export(TensorBytes {
            owner,
            addr,
            len_bytes,
            name: name.to_owned(),
            dtype: info.dtype(),
            shape: info.shape().to_vec(),
            strides: info.strides().map(<[u64]>::to_vec),
        })?;
        self.copies.note(&data);
        Ok(data)
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
            // SAFETY: nothing is read for an empty tensor.
            unsafe { self.check(info, 0, 0) }?;
            let words = vec![0u64; 1].into_boxed_slice();
            let addr = words.as_ptr() as usize;
            return Ok((Owner::new(Storage::Heap(words)), addr));
        }
        let entry = self.ckpt.file(info.file());
        let file_id = info.file().index();
        let file =
            self.files.get(file_id).ok_or_else(|| file_err(entry.path(), "internal: no descriptor"))?;
        check_stamp(entry, file)?;
        if self.read == Read::Pread {
            let (owner, addr) = heap_copy(entry, file, info, len_bytes)?;
            // SAFETY: `addr .. addr + len_bytes` is the memory `owner` (alive here) just made.
            unsafe { self.check(info, addr, len_bytes) }?;
            return Ok((owner, addr));
        }
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
            let (owner, addr) = own_copy(entry, file, info, len_bytes, how)?;
            // SAFETY: `addr .. addr + len_bytes` is the memory `owner` (alive here) just made.
            unsafe { self.check(info, addr, len_bytes) }?;
            return Ok((owner, addr));
        };
        let offset =
            usize::try_from(info.offset_bytes()).map_err(|_| file_err(entry.path(), "offset too large"))?;
        let addr = base + offset;
        // SAFETY: the tensor's range lies inside the file (the parser's guarantee), and the
        // mapping covers the whole file at the size the stamp check just confirmed; `owner` keeps
        // it mapped for the call.
        if let Err(e) = unsafe { self.ready(entry, info, addr, len_bytes, how) } {
            // Nobody got the view: the bytes are not handed out.
            self.state.lock().unwrap_or_else(|e| e.into_inner()).handed_out.remove(&key);
            return Err(e);
        }
        Ok((owner, addr))
    }
}

impl Mapped {
    /// Make a view of the shared mapping ready to hand out: its pages read in (`get_tensor`),
    /// and its bytes checked against the manifest (`manifest=`, any fetch).
    ///
    /// # Safety
    /// `addr .. addr + len_bytes` lies inside a live mapping that starts on a page boundary.
    unsafe fn ready(
        &self,
        entry: &tensora_format::FileEntry,
        info: &tensora_format::TensorInfo,
        addr: usize,
        len_bytes: usize,
        how: Fetch,
    ) -> PyResult<()> {
        if how == Fetch::Tensor {
            // SAFETY: per the contract.
            unsafe { populate_tensor(entry, info, addr, len_bytes) }?;
        }
        // SAFETY: per the contract.
        unsafe { self.check(info, addr, len_bytes) }
    }

    /// With `manifest=`: the tensor's bytes at `addr` against the manifest; a mismatch is a
    /// `VerifyError` naming the tensor, its file and its offset. A slice (`tensor_lazy`) reads the
    /// whole tensor for this.
    ///
    /// # Safety
    /// `addr .. addr + len_bytes` is readable memory that nothing writes while this runs (a view
    /// not handed out yet).
    unsafe fn check(&self, info: &tensora_format::TensorInfo, addr: usize, len_bytes: usize) -> PyResult<()> {
        let Some(check) = &self.check else { return Ok(()) };
        let index = self.ckpt.tensor_index(info.name()).ok_or_else(|| missing(info.name()))?;
        let bytes = if len_bytes == 0 {
            &[][..] // never its address
        } else {
            // SAFETY: per the contract.
            unsafe { std::slice::from_raw_parts(addr as *const u8, len_bytes) }
        };
        check.check_bytes(index, bytes).map_err(|e| crate::exc::VerifyError::new_err(e.to_string()))
    }
}

fn missing(name: &str) -> PyErr {
    SelectionError::new_err(format!("no tensor named {name:?}"))
}

/// An error naming the file.
fn file_err(path: &Path, what: impl std::fmt::Display) -> PyErr {
    exc::LoadError::new_err(format!("{}: {what}", path.display()))
}

/// Whether the descriptor's file is still the one parsed (size, mtime, inode).
fn check_stamp(entry: &tensora_format::FileEntry, file: &std::fs::File) -> PyResult<()> {
    let meta = file.metadata().map_err(|e| file_err(entry.path(), e))?;
    entry.check_unchanged(&meta).map_err(|change| file_err(entry.path(), change))
}

/// Each file of `ckpt`, opened as the parser opens it (a name replaced by a FIFO since the
/// parse is refused, not waited on for a writer) and checked to be the file parsed.
fn open_files(ckpt: &tensora_format::Checkpoint) -> PyResult<Vec<std::fs::File>> {
    let open = |f: &tensora_format::FileEntry| {
        let (file, _) =
            tensora_format::open_regular(f.path()).map_err(|e| file_err(f.path(), e.into_kind()))?;
        check_stamp(f, &file)?;
        Ok(file)
    };
    ckpt.files().iter().map(open).collect()
}

fn open_checkpoint_files(path: &Path) -> PyResult<Mapped> {
    let ckpt = tensora_format::open(path).map_err(format_err)?;
    let files = open_files(&ckpt)?;
    let state = MapState { shared: vec![None; files.len()], handed_out: HashSet::new() };
    Ok(Mapped {
        ckpt,
        files,
        state: Mutex::new(state),
        copies: CopyTally::default(),
        check: None,
        read: Read::Map,
        prefetch: None,
    })
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
    let cfg = PopulateConfig { threads: 1, cancel: &never, progress: None, ahead: ReadAhead::Ahead };
    // SAFETY: per the contract.
    unsafe { populate(&[Span { addr, len_bytes }], &cfg) }.map(|_| ()).map_err(|e| match e {
        PopulateError::Io { piece_addr, piece_len_bytes, source, .. } => load_err(LoadError::Read {
            path: entry.path().to_path_buf(),
            offset_bytes: info.offset_bytes() + (piece_addr - addr) as u64,
            len_bytes: piece_len_bytes as u64,
            tensor: info.name().to_owned(),
            kind: tensora_io::ReadErrorKind::Io(source),
        }),
        PopulateError::Cancelled => CancelledError::new_err("cancelled"),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture_path() -> &'static str {
        concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/real/fracast-0.int8.safetensors")
    }

    /// A file replaced by a FIFO after the parse is refused, not waited on for a writer.
    #[test]
    fn a_file_replaced_by_a_fifo_is_refused_without_waiting() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.safetensors");
        std::fs::copy(fixture_path(), &path).unwrap();
        let ckpt = tensora_format::open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert!(std::process::Command::new("mkfifo").arg(&path).status().unwrap().success());
        let (done, result) = std::sync::mpsc::channel();
        // Detached: were the open to block, the test fails at the timeout below, not hangs.
        std::thread::spawn(move || done.send(open_files(&ckpt).is_err()));
        assert_eq!(result.recv_timeout(std::time::Duration::from_secs(10)), Ok(true), "waited on a FIFO");
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
}
