//! `weights_iterator`: a background thread loads the checkpoint in chunks of consecutive tensors
//! of at most `budget` bytes each (one `tensora_io::load` per chunk) and hands each tensor, zero
//! copy, over a [`Bounded`] queue. The Python side waits with the GIL released. Where each chunk
//! lives is decided once per file by [`crate::place`], as for `load_file`: an owned hugepage
//! arena per chunk by default; with `residence="auto"`, warm local files give mapped views (each
//! chunk's pages read in before its tensors are queued).
//!
//! Memory: the chunk being loaded (at most `max(budget, largest tensor)`) plus at most `budget`
//! bytes (and [`QUEUE_TENSORS_MAX`] tensors) waiting in the queue, plus what the consumer keeps:
//! a chunk's arena (or mapping) is freed when the last tensor of it is gone. Mapped chunks hold
//! page-cache pages, which the kernel can reclaim, not anonymous memory.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use pyo3::exceptions::PyStopIteration;
use pyo3::prelude::*;
use tensora_format::Checkpoint;
use tensora_format::Selection;
use tensora_io::{BackendChoice, LoadError, LoadOptions};

use crate::owner::{Owner, Storage, TensorBytes};
use crate::queue::{Bounded, Pop};
use crate::{TensorData, format_err, load_err};

/// Default streaming budget: bytes per chunk, and bytes of tensors waiting in the queue.
pub const BUDGET_DEFAULT_BYTES: u64 = 256 << 20;
/// Bound on tensors waiting in the queue.
pub const QUEUE_TENSORS_MAX: usize = 64;

enum Msg {
    Tensor(TensorBytes),
    Failed(PyErr),
}

/// The iterator object behind `tensora.weights_iterator`: yields `(name, TensorData)`.
#[pyclass(module = "tensora._native")]
pub struct Stream {
    queue: Arc<Bounded<Msg>>,
    cancel: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream").field("queued", &self.queue.len()).finish()
    }
}

/// What the producer thread needs.
struct Job {
    paths: Vec<PathBuf>,
    selection: Selection,
    names_wanted: Option<BTreeSet<String>>,
    budget_bytes: u64,
    backend: BackendChoice,
    placement: crate::place::Placement,
}

impl Stream {
    pub fn start(
        paths: Vec<PathBuf>,
        selection: Selection,
        names_wanted: Option<BTreeSet<String>>,
        budget_bytes: u64,
        backend: BackendChoice,
        placement: crate::place::Placement,
    ) -> PyResult<Stream> {
        if budget_bytes == 0 {
            return Err(pyo3::exceptions::PyValueError::new_err("budget must be at least 1 byte"));
        }
        let queue = Arc::new(Bounded::new(QUEUE_TENSORS_MAX, budget_bytes));
        let cancel = Arc::new(AtomicBool::new(false));
        let (q, c) = (Arc::clone(&queue), Arc::clone(&cancel));
        let job = Job { paths, selection, names_wanted, budget_bytes, backend, placement };
        let thread = std::thread::Builder::new()
            .name("tensora-stream".into())
            .spawn(move || {
                if let Err(e) = produce(&job, &q, &c) {
                    let _ = q.push(Msg::Failed(e), 0);
                }
                q.close();
            })
            .map_err(|e| crate::exc::LoadError::new_err(format!("starting the stream thread: {e}")))?;
        Ok(Stream { queue, cancel, thread: Some(thread) })
    }
}

/// Split `picked` (tensor indices in file order) into runs of at most `budget_bytes` (a larger
/// tensor is a run of its own).
pub fn chunks(ckpt: &Checkpoint, picked: &[usize], budget_bytes: u64) -> Vec<Vec<usize>> {
    let mut out: Vec<Vec<usize>> = Vec::new();
    let mut cur: Vec<usize> = Vec::new();
    let mut cur_bytes = 0u64;
    for &i in picked {
        let len = ckpt.tensors()[i].len_bytes();
        if !cur.is_empty() && cur_bytes.saturating_add(len) > budget_bytes {
            out.push(std::mem::take(&mut cur));
            cur_bytes = 0;
        }
        cur.push(i);
        cur_bytes = cur_bytes.saturating_add(len);
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// Load every file in chunks; several files share one selection (exact names are checked
/// across the whole list, as one checkpoint's names are spread over its shards).
fn produce(job: &Job, queue: &Bounded<Msg>, cancel: &Arc<AtomicBool>) -> PyResult<()> {
    let multi = job.paths.len() > 1;
    let matcher = job.selection.matcher().map_err(|e| load_err(LoadError::Selection(e)))?;
    let mut seen: BTreeSet<String> = BTreeSet::new();
    for path in &job.paths {
        let ckpt = tensora_format::open(path).map_err(format_err)?;
        let names = || ckpt.tensors().iter().map(|t| t.name());
        let mut picked: Vec<usize> = if multi {
            names().enumerate().filter(|(_, n)| matcher.matches(n)).map(|(i, _)| i).collect()
        } else {
            matcher.select(names()).map_err(|e| load_err(LoadError::Selection(e)))?
        };
        picked.sort_unstable();
        picked.dedup();
        let decision =
            crate::place::decide(&crate::place::facts_for(&ckpt, &picked, &job.backend, job.placement));
        for chunk in chunks(&ckpt, &picked, job.budget_bytes) {
            if cancel.load(Ordering::Acquire) {
                return Ok(());
            }
            let names: Vec<String> = chunk.iter().map(|&i| ckpt.tensors()[i].name().to_owned()).collect();
            let opts = LoadOptions {
                backend: job.backend.clone(),
                selection: Selection::Names(names),
                budget_bytes: job.budget_bytes,
                residence: decision.residence,
                cancel: Some(Arc::clone(cancel)),
                ..LoadOptions::default()
            };
            let loaded = match crate::load_chunk(&ckpt, &opts, cancel) {
                Ok((l, _)) => l,
                Err(_) if cancel.load(Ordering::Acquire) => return Ok(()),
                Err(e) => return Err(load_err(e)),
            };
            let owner = Owner::new(Storage::Loaded(Box::new(loaded)));
            let Storage::Loaded(loaded) = owner.storage() else {
                return Err(crate::exc::LoadError::new_err("internal: load produced no owned storage"));
            };
            for m in crate::ExportMeta::all(loaded) {
                if job.names_wanted.is_some() {
                    seen.insert(m.name().to_owned());
                }
                let data = m.export(&owner, loaded)?.into_bytes();
                let len = data.len_bytes as u64;
                if queue.push(Msg::Tensor(data), len).is_err() {
                    return Ok(()); // the iterator was closed
                }
            }
        }
    }
    if let Some(wanted) = job.names_wanted.as_ref().filter(|_| multi) {
        let missing: Vec<String> = wanted.iter().filter(|n| !seen.contains(*n)).cloned().collect();
        if !missing.is_empty() {
            return Err(load_err(LoadError::Selection(tensora_format::SelectionError::UnknownNames {
                names: missing,
            })));
        }
    }
    Ok(())
}

#[pymethods]
impl Stream {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&mut self, py: Python<'_>) -> PyResult<(String, TensorData)> {
        loop {
            let queue = Arc::clone(&self.queue);
            match py.detach(move || queue.pop_timeout(crate::drive::POLL_INTERVAL)) {
                Pop::Item(Msg::Tensor(t)) => return Ok((t.name.clone(), TensorData { t })),
                Pop::Item(Msg::Failed(e)) => {
                    self.finish(py);
                    return Err(e);
                }
                Pop::Closed => {
                    self.finish(py);
                    return Err(PyStopIteration::new_err(()));
                }
                Pop::Empty => {
                    if let Err(e) = py.check_signals() {
                        self.close(py);
                        return Err(e);
                    }
                }
            }
        }
    }

    /// Stop the load and free what is queued (also done when the iterator is dropped).
    fn close(&mut self, py: Python<'_>) {
        self.cancel.store(true, Ordering::Release);
        self.queue.close_and_clear();
        self.finish(py);
    }

    /// `(tensors, bytes)` waiting in the queue now.
    fn queued(&self) -> (usize, u64) {
        self.queue.len()
    }
}

impl Stream {
    fn finish(&mut self, py: Python<'_>) {
        if let Some(t) = self.thread.take() {
            let _ = py.detach(move || t.join());
        }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // Without the GIL guarantee here, do not join: the thread sees the cancel flag or the
        // closed queue at its next tensor and exits on its own.
        self.cancel.store(true, Ordering::Release);
        self.queue.close_and_clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn fixture() -> Checkpoint {
        let p = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/real/fracast-0.int8.safetensors");
        tensora_format::open(p).expect("fixture opens")
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]
        /// Chunks keep every picked tensor once, in order, and stay under the budget unless a
        /// single tensor is larger.
        #[test]
        fn chunks_cover_in_order_under_budget(mask in proptest::collection::vec(any::<bool>(), 67), budget in 1u64..200_000) {
            let ckpt = fixture();
            let picked: Vec<usize> =
                (0..ckpt.tensors().len()).filter(|&i| mask.get(i).copied().unwrap_or(true)).collect();
            let cs = chunks(&ckpt, &picked, budget);
            prop_assert_eq!(cs.concat(), picked);
            for c in &cs {
                prop_assert!(!c.is_empty());
                let bytes: u64 = c.iter().map(|&i| ckpt.tensors()[i].len_bytes()).sum();
                prop_assert!(bytes <= budget || c.len() == 1, "{} bytes in {} tensors", bytes, c.len());
            }
        }
    }
}
