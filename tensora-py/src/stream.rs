//! `weights_iterator`: a background thread drives `tensora_io::load_streaming` over each file in
//! turn, copies every tensor out of the recycled streaming window into its own heap buffer, and
//! hands it over a [`Bounded`] queue. The Python side waits with the GIL released.
//!
//! Memory: the streaming arena (at most `max(budget, largest tensor)`) plus at most
//! `budget` bytes (and [`QUEUE_TENSORS_MAX`] tensors) of copies waiting in the queue, plus
//! whatever the consumer keeps.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use pyo3::exceptions::PyStopIteration;
use pyo3::prelude::*;
use tensora_io::{BackendChoice, LoadError, LoadOptions};
use tensora_plan::Selection;

use crate::owner::TensorBytes;
use crate::queue::{Bounded, Pop};
use crate::{SelectionError, TensorData, format_err, load_err};

/// Default streaming budget: arena bytes, and bytes of copies waiting in the queue.
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

impl Stream {
    pub fn start(
        paths: Vec<PathBuf>,
        selection: Selection,
        names_wanted: Option<BTreeSet<String>>,
        budget_bytes: u64,
        backend: BackendChoice,
    ) -> PyResult<Stream> {
        let queue = Arc::new(Bounded::new(QUEUE_TENSORS_MAX, budget_bytes));
        let cancel = Arc::new(AtomicBool::new(false));
        let (q, c) = (Arc::clone(&queue), Arc::clone(&cancel));
        let thread = std::thread::Builder::new()
            .name("tensora-stream".into())
            .spawn(move || {
                if let Err(e) = produce(&paths, selection, names_wanted, budget_bytes, backend, &q, &c) {
                    let _ = q.push(Msg::Failed(e), 0);
                }
                q.close();
            })
            .map_err(|e| crate::LoadError_::new_err(format!("starting the stream thread: {e}")))?;
        Ok(Stream { queue, cancel, thread: Some(thread) })
    }
}

/// Stream every file; several files share one selection (names are checked across all of them).
fn produce(
    paths: &[PathBuf],
    selection: Selection,
    names_wanted: Option<BTreeSet<String>>,
    budget_bytes: u64,
    backend: BackendChoice,
    queue: &Bounded<Msg>,
    cancel: &Arc<AtomicBool>,
) -> PyResult<()> {
    let per_file = if paths.len() > 1 {
        // One checkpoint's names are not all in each file: select by predicate per file, then
        // check exact names over the whole list.
        let m = selection.matcher().map_err(|e| SelectionError::new_err(format!("selection: {e}")))?;
        Selection::Predicate(Arc::new(move |n: &str| m.matches(n)))
    } else {
        selection
    };
    let mut seen: BTreeSet<String> = BTreeSet::new();
    for path in paths {
        let ckpt = tensora_format::open(path).map_err(format_err)?;
        let opts = LoadOptions {
            backend: backend.clone(),
            selection: per_file.clone(),
            budget_bytes,
            cancel: Some(Arc::clone(cancel)),
            ..LoadOptions::default()
        };
        let r = tensora_io::load_streaming(&ckpt, &opts, |t| {
            if names_wanted.is_some() {
                seen.insert(t.name().to_owned());
            }
            let copy = TensorBytes::copied(t);
            let len = copy.len_bytes as u64;
            queue.push(Msg::Tensor(copy), len).map_err(|_| "the iterator was closed".into())
        });
        match r {
            Ok(_) => {}
            Err(_) if cancel.load(Ordering::Acquire) => return Ok(()),
            Err(e) => return Err(load_err(e)),
        }
    }
    if let Some(wanted) = names_wanted.filter(|_| paths.len() > 1) {
        let missing: Vec<&String> = wanted.iter().filter(|n| !seen.contains(*n)).collect();
        if !missing.is_empty() {
            return Err(load_err(LoadError::Selection(tensora_plan::PlanError::UnknownNames {
                names: missing.into_iter().cloned().collect(),
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
