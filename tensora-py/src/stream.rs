//! `weights_iterator`: a background thread loads the checkpoint as owned runs of consecutive
//! tensors of at most a third of the `budget` each (`tensora_io::load_runs`, which also decides
//! where each run lives, and faults the next run's memory in while one loads) and hands each
//! tensor, zero copy, over a [`Bounded`] queue. The Python side waits with the GIL released.
//! Mapped runs of cold files are at most `tensora_io::COLD_MAPPED_RUN_BYTES_MAX` (32 MiB), read
//! ahead up to `tensora_io::STREAM_LOOKAHEAD_BYTES` past the run being read in: each tensor is
//! handed over soon after its own pages land, while the ones after it are read.
//!
//! Memory: the thread loads a run while the consumer works through the one before, and starts on
//! the next only once the consumer has taken the first tensor of the run it queued (so it has
//! taken every tensor before it): the run being loaded, the next run's memory being faulted in
//! meanwhile, the run being consumed (each at most `max(budget / 3, largest tensor)` plus
//! alignment slack) and the run a tensor the caller still holds belongs to, so about
//! `1.33 x budget` besides what the consumer keeps otherwise. The
//! queue holds at most `budget` bytes and [`QUEUE_TENSORS_MAX`] tensors. A run's arena (or
//! mapping) is freed when the last tensor of it is gone. Mapped runs hold page-cache pages,
//! which the kernel can reclaim, not anonymous memory.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use pyo3::exceptions::PyStopIteration;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};
use tensora_format::Selection;
use tensora_io::{BackendChoice, LoadError, LoadOptions, Residence};

use crate::drive::Producer;
use crate::export::ExportMeta;
use crate::owner::{Owner, Storage};
use crate::queue::Bounded;
use crate::tensor::CopyTally;
use crate::{TensorData, format_err, load_err};

/// Default streaming budget: bytes per chunk, and bytes of tensors waiting in the queue.
pub const BUDGET_DEFAULT_BYTES: u64 = 256 << 20;
/// Bound on tensors waiting in the queue.
pub const QUEUE_TENSORS_MAX: usize = 64;
/// The note added to an exception raised by a signal handler while the iterator waited.
const STREAM_CLOSED_NOTE: &str =
    "tensora: a signal handler raised this while weights_iterator waited; the stream was closed";

enum Msg {
    Tensor(TensorData),
    Failed(PyErr),
}

/// The iterator object behind `tensora.weights_iterator`: yields `(name, TensorData)`.
#[pyclass(module = "tensora._native")]
pub struct Stream {
    producer: Producer<Msg>,
    copies: Arc<CopyTally>,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream").field("queued", &self.producer.queued()).finish()
    }
}

/// What the producer thread needs.
struct Job {
    paths: Vec<PathBuf>,
    selection: Selection,
    names_wanted: Option<BTreeSet<String>>,
    budget_bytes: u64,
    backend: BackendChoice,
    residence: Residence,
    /// Every tensor is checked against it as it lands (`manifest=`).
    manifest: Option<tensora_verify::Manifest>,
    /// `dtype=`: each run a cast load.
    dtype: tensora_io::DtypeTarget,
}

impl Stream {
    fn start(job: Job) -> PyResult<Stream> {
        if job.budget_bytes == 0 {
            return Err(pyo3::exceptions::PyValueError::new_err("budget must be at least 1 byte"));
        }
        let queue = Arc::new(Bounded::new(QUEUE_TENSORS_MAX, job.budget_bytes));
        let cancel = Arc::new(AtomicBool::new(false));
        let copies = Arc::new(CopyTally::default());
        let (q, c, tally) = (Arc::clone(&queue), Arc::clone(&cancel), Arc::clone(&copies));
        let thread = std::thread::Builder::new()
            .name("tensora-stream".into())
            .spawn(move || {
                if let Err(e) = produce(&job, &q, &c, &tally) {
                    let _ = q.push(Msg::Failed(e), 0);
                }
                q.close();
            })
            .map_err(|e| crate::exc::LoadError::new_err(format!("starting the stream thread: {e}")))?;
        Ok(Stream { producer: Producer::new(queue, cancel, thread), copies })
    }
}

/// Stream tensors from one path or a list of files; see [`Stream`].
#[pyfunction]
#[pyo3(signature = (paths, select=None, budget_bytes=None, backend="auto", residence="owned", manifest=None, dtype=None))]
#[allow(clippy::too_many_arguments)] // the Python keyword arguments of `weights_iterator`
pub(crate) fn open_stream(
    py: Python<'_>,
    paths: &Bound<'_, PyAny>,
    select: Option<&Bound<'_, PyAny>>,
    budget_bytes: Option<u64>,
    backend: &str,
    residence: &str,
    manifest: Option<PathBuf>,
    dtype: Option<&str>,
) -> PyResult<Stream> {
    let residence = crate::residence(residence)?;
    let dtype = crate::dtype_target(dtype)?;
    let manifest = match manifest {
        Some(m) => Some(py.detach(|| crate::read_manifest(&m))?),
        None => None,
    };
    let paths: Vec<PathBuf> = if let Ok(p) = paths.extract::<PathBuf>() {
        vec![p]
    } else if paths.is_instance_of::<PyList>() || paths.is_instance_of::<PyTuple>() {
        paths.extract()?
    } else {
        paths.try_iter()?.map(|p| p?.extract::<PathBuf>()).collect::<PyResult<_>>()?
    };
    crate::remote::refuse_urls(&paths)?;
    let selection = crate::selection(select)?;
    let names_wanted: Option<BTreeSet<String>> = match &selection {
        Selection::Names(n) => Some(n.iter().cloned().collect()),
        _ => None,
    };
    Stream::start(Job {
        paths,
        selection,
        names_wanted,
        budget_bytes: budget_bytes.unwrap_or(BUDGET_DEFAULT_BYTES),
        backend: crate::backend(backend)?,
        residence,
        manifest,
        dtype,
    })
}

/// Load every file as runs and queue their tensors. Several files share one selection: exact
/// names are checked across the whole list, as one checkpoint's names are spread over its shards.
fn produce(job: &Job, queue: &Bounded<Msg>, cancel: &Arc<AtomicBool>, copies: &CopyTally) -> PyResult<()> {
    let multi = job.paths.len() > 1;
    let matcher = Arc::new(job.selection.matcher().map_err(|e| load_err(LoadError::Selection(e)))?);
    let mut seen: BTreeSet<String> = BTreeSet::new();
    for path in &job.paths {
        let ckpt = tensora_format::open(path).map_err(format_err)?;
        let selection = if multi {
            // Names missing from this file may be in another: match without requiring them here.
            let m = Arc::clone(&matcher);
            Selection::Predicate(Arc::new(move |n: &str| m.matches(n)))
        } else {
            job.selection.clone()
        };
        let mut opts = LoadOptions {
            backend: job.backend.clone(),
            selection,
            budget_bytes: run_bytes(job.budget_bytes),
            residence: job.residence,
            dtype: job.dtype,
            cancel: Some(Arc::clone(cancel)),
            ..LoadOptions::default()
        };
        if let Some(m) = &job.manifest {
            // Each file against the whole model's manifest; a tensor is queued only once checked.
            crate::manifest_check(&ckpt, m)?.install(&mut opts);
        }
        let runs = match tensora_io::load_runs(&ckpt, &opts) {
            Ok(runs) => runs,
            Err(_) if cancel.load(Ordering::Acquire) => return Ok(()),
            Err(e) => return Err(load_err(e)),
        };
        for run in runs {
            let loaded = match run {
                Ok(l) => l,
                Err(_) if cancel.load(Ordering::Acquire) => return Ok(()),
                Err(e) => return Err(load_err(e)),
            };
            let seen = job.names_wanted.as_ref().filter(|_| multi).map(|_| &mut seen);
            if !queue_run(loaded, seen, queue, copies)? {
                return Ok(()); // the iterator was closed
            }
        }
    }
    if let Some(wanted) = job.names_wanted.as_ref().filter(|_| multi) {
        let missing: Vec<String> = wanted.iter().filter(|n| !seen.contains(*n)).cloned().collect();
        if !missing.is_empty() {
            let e = tensora_format::SelectionError::UnknownNames { names: missing };
            return Err(load_err(LoadError::Selection(e)));
        }
    }
    Ok(())
}

/// The most bytes of one run: a third of the budget, so the run the consumer is on, the one
/// queued, the next one's memory faulted in meanwhile and the run a tensor the caller still holds
/// pins fit it with room to spare.
fn run_bytes(budget_bytes: u64) -> u64 {
    (budget_bytes / 3).max(1)
}

/// The most bytes of one window of `tensora.distributed.weights_iterator` given `budget_bytes`:
/// half of it (two windows and the one a tensor the caller holds pins; its windows are not
/// faulted in ahead as [`run_bytes`]' runs are).
#[pyfunction]
pub(crate) fn iterator_window_bytes(budget_bytes: u64) -> u64 {
    (budget_bytes / 2).max(1)
}

/// Queue every tensor of one run (recording its name in `seen`, counting aligned copies in
/// `copies`), then wait until the consumer has taken its first tensor (it has then taken every
/// tensor of the runs before): the next run is loaded while the consumer works through this one,
/// never while it is still on the one before. `false` when the iterator was closed meanwhile.
fn queue_run(
    loaded: tensora_io::Loaded,
    mut seen: Option<&mut BTreeSet<String>>,
    queue: &Bounded<Msg>,
    copies: &CopyTally,
) -> PyResult<bool> {
    let owner = Owner::new(Storage::Loaded(Box::new(loaded)));
    let Storage::Loaded(loaded) = owner.storage() else {
        return Err(crate::exc::LoadError::new_err("internal: load produced no owned storage"));
    };
    let mut first = None;
    for m in ExportMeta::all(loaded) {
        if let Some(seen) = seen.as_deref_mut() {
            seen.insert(m.name().to_owned());
        }
        let data = m.export(&owner, loaded)?;
        copies.note(&data);
        let len = data.t.len_bytes as u64;
        match queue.push_ticket(Msg::Tensor(data), len) {
            Ok(ticket) => first = first.or(Some(ticket)),
            Err(_) => return Ok(false),
        }
    }
    Ok(first.is_none_or(|ticket| queue.wait_taken(ticket).is_ok()))
}

#[pymethods]
impl Stream {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&mut self, py: Python<'_>) -> PyResult<(String, TensorData)> {
        match self.producer.next(py, STREAM_CLOSED_NOTE)? {
            Some(Msg::Tensor(t)) => Ok((t.t.name.clone(), t)),
            Some(Msg::Failed(e)) => {
                // The error is the last item: stop the producer (whatever it does next) and join.
                self.producer.close(py);
                Err(e)
            }
            None => Err(PyStopIteration::new_err(())),
        }
    }

    /// Stop the load and free what is queued (also done when the iterator is dropped).
    fn close(&mut self, py: Python<'_>) {
        self.producer.close(py);
    }

    /// `(tensors, bytes)` waiting in the queue now.
    fn queued(&self) -> (usize, u64) {
        self.producer.queued()
    }

    /// `(tensors, bytes)` handed out so far as aligned copies (their file offset was not a
    /// multiple of their element size).
    fn aligned_copies(&self) -> (u64, u64) {
        self.copies.get()
    }
}
