//! The native side of `tensora.distributed`: one rank's share of a collective load
//! (`tensora_io::load_share`), its regions handed to Python as writable byte buffers for the
//! `torch.distributed` exchange, then its tensors exported like `load_file`'s. The exchange itself
//! is Python (`python/tensora/distributed.py`): the transport is the caller's process group.

use std::collections::{BTreeSet, HashMap};
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use pyo3::exceptions::PyStopIteration;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use tensora_format::{Dtype, Selection};
use tensora_io::{BackendChoice, LoadError, LoadOptions, ShareOf};
use tensora_remote::{RemoteOptions, open_remote};

use crate::drive::Producer;
use crate::export::ExportMeta;
use crate::owner::{Owner, Storage, TensorBytes};
use crate::queue::Bounded;
use crate::{TensorData, exc, format_err, load_err};

/// The note added to an exception raised by a signal handler while a collective load waited.
const SHARE_CLOSED_NOTE: &str =
    "tensora: a signal handler raised this while a collective load waited; its reads were stopped";

/// One fact every rank must hold the same before a byte is exchanged: a file's identity or a
/// tensor's place in the plan. `key` is what is compared; `what` names the item in an error.
#[derive(Debug, Clone)]
struct PlanItem {
    /// `"file"` or `"tensor"`.
    kind: &'static str,
    /// The file's path or URL, or the tensor's name.
    what: String,
    /// A file: size, then mtime and inode (local) or version (ETag, else last-modified; remote).
    /// A tensor: name, dtype, shape, file index and arena offset.
    key: String,
}

/// The identity of every file of a local checkpoint: size, mtime and inode at parse time (the
/// stamp every read is checked against). The device id is left out: the same file on a shared
/// filesystem has another one on each node.
fn local_files(ckpt: &tensora_format::Checkpoint) -> Vec<PlanItem> {
    ckpt.files()
        .iter()
        .map(|f| {
            let s = f.stamp();
            let modified = s
                .modified
                .and_then(|m| m.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or_else(|| "unknown".to_owned(), |d| format!("{}.{:09}", d.as_secs(), d.subsec_nanos()));
            PlanItem {
                kind: "file",
                what: f.path().display().to_string(),
                key: format!("{} bytes, modified {modified}, inode {}", s.len_bytes, s.inode),
            }
        })
        .collect()
}

/// The identity of every object of a remote checkpoint: size and version (ETag, else
/// last-modified), as seen at open.
fn remote_files(ckpt: &tensora_remote::RemoteCheckpoint) -> Vec<PlanItem> {
    ckpt.objects()
        .iter()
        .map(|o| PlanItem {
            kind: "file",
            what: o.url.clone(),
            key: format!("{} bytes, version {}", o.len_bytes(), o.version()),
        })
        .collect()
}

/// `(kind, what, key)` of every file of a local checkpoint, as [`Shared::plan`] gives them.
pub(crate) fn plan_files_local(ckpt: &tensora_format::Checkpoint) -> Vec<PlanTuple> {
    local_files(ckpt).into_iter().map(PlanItem::into_tuple).collect()
}

/// `(kind, what, key)` of every object of a remote checkpoint, as [`Shared::plan`] gives them.
pub(crate) fn plan_files_remote(
    ckpt: &tensora_remote::RemoteCheckpoint,
) -> Vec<(&'static str, String, String)> {
    remote_files(ckpt).into_iter().map(PlanItem::into_tuple).collect()
}

/// A [`PlanItem`] as Python gets it: `(kind, what, key)`.
pub(crate) type PlanTuple = (&'static str, String, String);

impl PlanItem {
    fn into_tuple(self) -> PlanTuple {
        (self.kind, self.what, self.key)
    }
}

/// One rank's share, loaded: every region's place in the arena, the arena's owner, and the
/// tensors to export once the regions are exchanged.
#[pyclass(module = "tensora._native")]
#[derive(Debug)]
pub struct Shared {
    owner: Arc<Owner>,
    /// `(arena offset, length)` of each rank's region, by rank.
    regions: Vec<(u64, u64)>,
    metas: Mutex<Option<Vec<ExportMeta>>>,
    /// `{name: arena offset}`, taken before any region was handed to Python as a writable buffer
    /// (`Loaded::tensors` forms a `&[u8]` of each tensor, which must not be alive while Python
    /// writes into the arena).
    offsets: HashMap<String, u64>,
    /// The checkpoint's files, then this window's tensors in arena order.
    plan: Vec<PlanItem>,
    report: String,
}

impl Shared {
    /// `share` of a checkpoint whose files are `files`, with `report` (its JSON) as this rank's
    /// report.
    fn new(share: tensora_io::ShareLoad, files: &[PlanItem], report: String) -> PyResult<Shared> {
        let regions = share.regions().iter().map(|r| (r.start, r.end - r.start)).collect();
        // The regions are filled through the arena's own pointers (`arena_ptr_mut`) while the
        // tensors wait: nothing reads them before `tensors`. Everything taken from `tensors()`
        // is taken here, before `region` hands out the first writable buffer.
        let loaded = share.finish();
        let metas = ExportMeta::all(&loaded);
        let mut offsets = HashMap::with_capacity(metas.len());
        let mut plan = files.to_vec();
        for t in loaded.tensors() {
            let offset = loaded.arena_offset(t.name());
            plan.push(PlanItem {
                kind: "tensor",
                what: t.name().to_owned(),
                key: format!(
                    "{} {} {:?} from file {} at arena offset {}",
                    t.name(),
                    t.dtype(),
                    t.shape(),
                    t.info().file().index(),
                    offset.map_or_else(|| "none".to_owned(), |o| o.to_string())
                ),
            });
            if let Some(o) = offset {
                offsets.insert(t.name().to_owned(), o);
            }
        }
        let owner = Owner::new(Storage::Loaded(Box::new(loaded)));
        Ok(Shared { owner, regions, metas: Mutex::new(Some(metas)), offsets, plan, report })
    }

    fn loaded(&self) -> PyResult<&tensora_io::Loaded> {
        match self.owner.storage() {
            Storage::Loaded(l) => Ok(l),
            _ => Err(exc::LoadError::new_err("internal: a share without an owned arena")),
        }
    }
}

#[pymethods]
impl Shared {
    /// `(offset, len_bytes)` of every rank's region, by rank.
    fn regions(&self) -> Vec<(u64, u64)> {
        self.regions.clone()
    }

    /// Rank `rank`'s region as a writable `uint8` buffer (its own region holds what this rank
    /// read; fill every other one from its rank before calling `tensors`).
    fn region(&self, rank: usize) -> PyResult<TensorData> {
        let &(start, len) = self
            .regions
            .get(rank)
            .ok_or_else(|| pyo3::exceptions::PyIndexError::new_err(format!("no rank {rank}")))?;
        let (addr, len_bytes) = match self.loaded()?.arena_ptr_mut(start..start + len) {
            Some((ptr, n)) => (ptr.as_ptr() as usize, n),
            None => (std::ptr::NonNull::<u64>::dangling().as_ptr() as usize, 0),
        };
        // Bytes (U8) are aligned anywhere: this is always the zero-copy view of the region.
        TensorData::export(TensorBytes {
            owner: Arc::clone(&self.owner),
            addr,
            len_bytes,
            name: format!("region of rank {rank}"),
            dtype: Dtype::U8,
            shape: vec![len_bytes as u64],
            strides: None,
        })
    }

    /// Every tensor of the selection, `{name: TensorData}` (call once, after the exchange). With
    /// `dtype` (as `load_file(dtype=)`), floating-point tensors come converted into one buffer of
    /// the window's own at the target dtype (`tensora_io::convert`, bit-exact with torch's
    /// `.to()`); the others stay views of the arena.
    #[pyo3(signature = (dtype=None))]
    fn tensors<'py>(&self, py: Python<'py>, dtype: Option<&str>) -> PyResult<Bound<'py, PyDict>> {
        let target = crate::dtype_target(dtype)?;
        let metas = self.metas.lock().unwrap_or_else(|e| e.into_inner()).take();
        let metas = metas.ok_or_else(|| exc::TensoraError::new_err("the tensors were taken already"))?;
        let loaded = self.loaded()?;
        let d = PyDict::new(py);
        let mut casts = Vec::new();
        for m in metas {
            let to = target
                .cast_of(m.dtype())
                .map_err(|source| load_err(LoadError::Cast { tensor: m.name().to_owned(), source }))?;
            match to {
                Some(to) => casts.push((m, to)),
                None => {
                    let name = m.name().to_owned();
                    d.set_item(name, m.export(&self.owner, loaded)?)?;
                }
            }
        }
        if !casts.is_empty() {
            let (words, at) = py.detach(|| cast_window(loaded, &casts))?;
            let base = words.as_ptr() as usize;
            let owner = Owner::new(Storage::Heap(words));
            for ((m, to), (start, len)) in casts.into_iter().zip(at) {
                let data = TensorData::export(TensorBytes {
                    owner: Arc::clone(&owner),
                    addr: base + start,
                    len_bytes: len,
                    name: m.name().to_owned(),
                    dtype: to,
                    shape: m.shape().to_vec(),
                    strides: m.strides().map(<[u64]>::to_vec),
                })?;
                d.set_item(m.name(), data)?;
            }
        }
        Ok(d)
    }

    /// `{name: arena offset}` of every tensor: where a buffer of the arena's layout (the NCCL
    /// path's device buffer) holds it. Taken when the share was loaded (no slice of the arena
    /// is formed once its regions may be written from Python).
    fn offsets(&self) -> HashMap<String, u64> {
        self.offsets.clone()
    }

    /// What the ranks must agree on before the exchange, as `(kind, what, key)`: each file's
    /// identity (`"file"`, its path or URL, size and mtime and inode, or size and version), then
    /// each tensor of the window (`"tensor"`, its name, name and dtype and shape and file and
    /// arena offset). Ranks agree when every `(kind, key)` is equal, in order.
    fn plan(&self) -> Vec<(&'static str, String, String)> {
        self.plan.iter().map(|p| (p.kind, p.what.clone(), p.key.clone())).collect()
    }

    /// This rank's load report (JSON): `bytes_read` is what it read from storage.
    fn report(&self) -> String {
        self.report.clone()
    }
}

/// A window's converted tensors: the words, and each tensor's `(offset, len_bytes)` in them.
type CastWindow = (Box<[u64]>, Vec<(usize, usize)>);

/// The tensors of `casts` (each with its target dtype) converted from `loaded`'s arena into one
/// buffer of 8-byte words, each tensor at a multiple of 8 bytes; returns the words and each
/// tensor's `(offset, len_bytes)` in them. The sizes are the parsed checkpoint's (checked at
/// open), bounded by the window.
fn cast_window(loaded: &tensora_io::Loaded, casts: &[(ExportMeta, Dtype)]) -> PyResult<CastWindow> {
    let too_large = || exc::LoadError::new_err("a cast window larger than the address space");
    let mut at = Vec::with_capacity(casts.len());
    let mut words_len = 0usize;
    for (m, to) in casts {
        let elems: u64 = m.shape().iter().product();
        let len = elems.checked_mul(to.size_bytes().unwrap_or(0)).and_then(|n| usize::try_from(n).ok());
        let len = len.ok_or_else(too_large)?;
        at.push((words_len.checked_mul(8).ok_or_else(too_large)?, len));
        words_len = words_len.checked_add(len.div_ceil(8)).ok_or_else(too_large)?;
    }
    let mut words = vec![0u64; words_len].into_boxed_slice();
    // SAFETY: the words are `8 * words_len` initialised bytes, any pattern is a valid u64, and no
    // other reference to them exists while this slice lives.
    let bytes = unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<u8>(), words_len * 8) };
    let sources: HashMap<&str, &[u8]> = loaded.tensors().map(|t| (t.name(), t.bytes())).collect();
    for ((m, to), &(start, len)) in casts.iter().zip(&at) {
        let src = sources.get(m.name()).copied().unwrap_or(&[]);
        tensora_io::convert(m.dtype(), *to, src, &mut bytes[start..start + len])
            .map_err(|source| load_err(LoadError::Cast { tensor: m.name().to_owned(), source }))?;
    }
    Ok((words, at))
}

/// What a collective load of one checkpoint needs.
struct Request {
    selection: Selection,
    backend: BackendChoice,
    budget_bytes: u64,
    share: ShareOf,
    /// How to reach the store of URL paths.
    remote: RemoteOptions,
}

impl Request {
    fn options(&self, selection: Selection) -> LoadOptions {
        LoadOptions {
            backend: self.backend.clone(),
            selection,
            budget_bytes: self.budget_bytes,
            ..LoadOptions::default()
        }
    }
}

/// A share of a checkpoint whose files are `files`, with its load report.
fn local_share(share: tensora_io::ShareLoad, files: &[PlanItem]) -> PyResult<Shared> {
    let report = serde_json::to_string(share.report()).map_err(|e| exc::LoadError::new_err(e.to_string()))?;
    Shared::new(share, files, report)
}

fn share_of(rank: usize, world_size: usize) -> PyResult<ShareOf> {
    ShareOf::new(rank, world_size).map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))
}

/// A collective `weights_iterator`: a thread loads this rank's share of each window of each file
/// and hands it to Python, one window at a time; it loads the next window while the consumer
/// works on the one it took, and waits until that one is taken before it loads another: two
/// windows at most, the consumer's and the next.
#[pyclass(module = "tensora._native")]
pub struct ShareStream {
    producer: Producer<PyResult<Shared>>,
}

impl std::fmt::Debug for ShareStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShareStream").field("queued", &self.producer.queued()).finish()
    }
}

/// Stream rank `rank`'s shares of `paths` (local, or URLs of a store reached with `remote`, a
/// dict of `tensora.RemoteOptions`' fields without a cache) window by window; see
/// [`ShareStream`].
#[pyfunction]
#[pyo3(signature = (paths, rank, world_size, budget_bytes, select=None, backend="auto", remote=None))]
#[allow(clippy::too_many_arguments)] // the keyword arguments of `tensora.distributed`'s functions
pub(crate) fn open_share_stream(
    paths: Vec<PathBuf>,
    rank: usize,
    world_size: usize,
    budget_bytes: u64,
    select: Option<&Bound<'_, PyAny>>,
    backend: &str,
    remote: Option<&Bound<'_, PyDict>>,
) -> PyResult<ShareStream> {
    if budget_bytes == 0 {
        return Err(pyo3::exceptions::PyValueError::new_err("budget must be at least 1 byte"));
    }
    let req = Request {
        selection: crate::selection(select)?,
        backend: crate::backend(backend)?,
        budget_bytes,
        share: share_of(rank, world_size)?,
        // The window is the budget the caller gave, for URLs too.
        remote: RemoteOptions { streamed_bytes_max: budget_bytes, ..crate::remote::options(remote)? },
    };
    let queue = Arc::new(Bounded::new(1, u64::MAX));
    let cancel = Arc::new(AtomicBool::new(false));
    let (q, c) = (Arc::clone(&queue), Arc::clone(&cancel));
    let thread = std::thread::Builder::new()
        .name("tensora-share".into())
        .spawn(move || {
            if let Err(e) = produce(&paths, &req, &q, &c) {
                let _ = q.push(Err(e), 0);
            }
            q.close();
        })
        .map_err(|e| exc::LoadError::new_err(format!("starting the share thread: {e}")))?;
    Ok(ShareStream { producer: Producer::new(queue, cancel, thread) })
}

/// One path of a collective load, opened.
enum Opened {
    Local(tensora_format::Checkpoint),
    Remote(Box<tensora_remote::RemoteCheckpoint>),
}

/// Every window of every file, this rank's share of each, in the order every rank uses. Several
/// files share one selection: exact names are checked across the whole list.
fn produce(
    paths: &[PathBuf],
    req: &Request,
    queue: &Bounded<PyResult<Shared>>,
    cancel: &AtomicBool,
) -> PyResult<()> {
    let matcher = Arc::new(req.selection.matcher().map_err(|e| load_err(LoadError::Selection(e)))?);
    let wanted: Option<BTreeSet<String>> = match &req.selection {
        Selection::Names(n) if paths.len() > 1 => Some(n.iter().cloned().collect()),
        _ => None,
    };
    let mut seen = BTreeSet::new();
    for path in paths {
        let selection = if paths.len() > 1 {
            let m = Arc::clone(&matcher);
            Selection::Predicate(Arc::new(move |n: &str| m.matches(n)))
        } else {
            req.selection.clone()
        };
        let opts = req.options(selection);
        let ckpt = match crate::remote::location(path)? {
            Some(l) => {
                Opened::Remote(Box::new(open_remote(&l, &req.remote).map_err(crate::remote::remote_err)?))
            }
            None => Opened::Local(tensora_format::open(path).map_err(format_err)?),
        };
        let files = match &ckpt {
            Opened::Remote(r) => remote_files(r),
            Opened::Local(l) => local_files(l),
        };
        // Each window's share goes to the queue; `Break` when the iterator was closed or cancelled.
        let mut deliver = |share: tensora_io::ShareLoad| -> ControlFlow<()> {
            if cancel.load(Ordering::Acquire) {
                return ControlFlow::Break(());
            }
            if wanted.is_some() {
                seen.extend(share_names(&share));
            }
            // The other ranks' regions are faulted in here, while the consumer exchanges the
            // previous window, not during this window's exchange.
            share.populate_regions();
            // A window that could not be handed over is the last one: the consumer raises it.
            let shared = local_share(share, &files);
            let failed = shared.is_err();
            match queue.hand_off(shared, 1) {
                Ok(()) if !failed => ControlFlow::Continue(()),
                _ => ControlFlow::Break(()),
            }
        };
        match &ckpt {
            Opened::Remote(ckpt) => {
                ckpt.load_share_runs(&opts, req.share, deliver).map_err(crate::remote::remote_err)?;
            }
            Opened::Local(ckpt) => {
                for share in tensora_io::load_share_runs(ckpt, &opts, req.share).map_err(load_err)? {
                    if deliver(share.map_err(load_err)?).is_break() {
                        return Ok(());
                    }
                }
            }
        }
        if cancel.load(Ordering::Acquire) {
            return Ok(());
        }
    }
    if let Some(wanted) = wanted {
        let missing: Vec<String> = wanted.into_iter().filter(|n| !seen.contains(n)).collect();
        if !missing.is_empty() {
            return Err(load_err(LoadError::Selection(tensora_format::SelectionError::UnknownNames {
                names: missing,
            })));
        }
    }
    Ok(())
}

/// The names of the tensors a share carries (all of its window's).
fn share_names(share: &tensora_io::ShareLoad) -> Vec<String> {
    share.tensor_names().map(str::to_owned).collect()
}

#[pymethods]
impl ShareStream {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&mut self, py: Python<'_>) -> PyResult<Shared> {
        match self.producer.next(py, SHARE_CLOSED_NOTE)? {
            Some(Ok(shared)) => Ok(shared),
            Some(Err(e)) => {
                // The error is the last item: stop the producer (whatever it does next) and join.
                self.producer.close(py);
                Err(e)
            }
            None => Err(PyStopIteration::new_err(())),
        }
    }

    /// Stop loading and drop what is queued (also done when the iterator is dropped).
    fn close(&mut self, py: Python<'_>) {
        self.producer.close(py);
    }
}
