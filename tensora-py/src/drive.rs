//! Runs a load on a worker thread with the GIL released, while the calling thread polls: it calls
//! the Python `progress(bytes_done, bytes_total)` callback (on the caller's thread, with the GIL)
//! and checks for signals (Ctrl-C). A callback returning `False` or raising, or a signal, sets the
//! load's cancel flag; the exception is handed back unchanged.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::PyBool;
use tensora_io::ProgressHook;

use crate::queue::{Bounded, Pop};

/// How often the caller wakes to report progress and check signals.
pub const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// The note added to an exception raised by a signal handler that cancelled a load.
pub const CANCELLED_NOTE: &str = "tensora: a signal handler raised this during a load; the load was cancelled and nothing it read was returned";

/// `e` (raised by a signal handler that this crate's polling ran) with `note` added
/// (`BaseException.add_note`, Python 3.11+; older Pythons get `e` unchanged). The exception stays
/// the handler's own object, so `KeyboardInterrupt` stays `KeyboardInterrupt`; the note says that
/// tensora observed it and stopped.
pub fn noted_signal(py: Python<'_>, e: PyErr, note: &str) -> PyErr {
    let value = e.value(py);
    if value.hasattr("add_note").unwrap_or(false) {
        // A failure to add a note must not hide the exception itself.
        let _ = value.call_method1("add_note", (note,));
    }
    e
}

/// The consumer's side of a background thread that feeds a Python iterator through a bounded
/// queue (`weights_iterator`, the collective share stream): the queue, the producer's cancel flag
/// and its thread. Dropping it cancels the producer and drops what is queued, without joining
/// (`Drop` has no GIL guarantee): the thread sees the flag or the closed queue and exits.
pub struct Producer<T> {
    queue: Arc<Bounded<T>>,
    cancel: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl<T: Send> Producer<T> {
    /// The consumer's side of `thread`, which pushes into `queue`, watches `cancel`, and closes
    /// `queue` when it is done.
    pub fn new(queue: Arc<Bounded<T>>, cancel: Arc<AtomicBool>, thread: JoinHandle<()>) -> Producer<T> {
        Producer { queue, cancel, thread: Some(thread) }
    }

    /// The next item: waits with the GIL released, in steps of [`POLL_INTERVAL`], running signal
    /// handlers between steps (so Ctrl-C ends the wait). `None` once the producer closed its queue
    /// and it is drained (its thread is then joined). A signal handler's exception stops the
    /// producer ([`Producer::close`]) and is returned with `note` added.
    pub fn next(&mut self, py: Python<'_>, note: &str) -> PyResult<Option<T>> {
        loop {
            let queue = &self.queue;
            match py.detach(|| queue.pop_timeout(POLL_INTERVAL)) {
                Pop::Item(item) => return Ok(Some(item)),
                Pop::Closed => {
                    self.finish(py);
                    return Ok(None);
                }
                Pop::Empty => {
                    if let Err(e) = py.check_signals() {
                        self.close(py);
                        return Err(noted_signal(py, e, note));
                    }
                }
            }
        }
    }

    /// Join the producer's thread (with the GIL released), if it has not been joined.
    pub fn finish(&mut self, py: Python<'_>) {
        if let Some(t) = self.thread.take() {
            let _ = py.detach(move || t.join());
        }
    }

    /// Cancel the producer, drop what is queued, and join its thread.
    pub fn close(&mut self, py: Python<'_>) {
        self.stop();
        self.finish(py);
    }
}

impl<T> Producer<T> {
    /// `(items, bytes)` waiting in the queue now.
    pub fn queued(&self) -> (usize, u64) {
        self.queue.len()
    }

    fn stop(&self) {
        self.cancel.store(true, Ordering::Release);
        self.queue.close_and_clear();
    }
}

impl<T> std::fmt::Debug for Producer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Producer").field("queued", &self.queued()).finish()
    }
}

impl<T> Drop for Producer<T> {
    fn drop(&mut self) {
        self.stop();
    }
}

#[derive(Debug, Default)]
struct Shared {
    done_bytes: AtomicU64,
    total_bytes: AtomicU64,
    finished: Mutex<bool>,
    changed: Condvar,
}

impl Shared {
    /// Wait until the work finishes or the poll interval passes; true when finished.
    fn wait(&self) -> bool {
        let g = self.finished.lock().unwrap_or_else(|e| e.into_inner());
        if *g {
            return true;
        }
        *self.changed.wait_timeout(g, POLL_INTERVAL).unwrap_or_else(|e| e.into_inner()).0
    }

    fn finish(&self) {
        *self.finished.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.changed.notify_all();
    }
}

/// What came back: the work's result, and the Python exception that cancelled it, if any.
#[derive(Debug)]
pub struct Outcome<T> {
    /// What the work returned.
    pub result: T,
    /// Raised by the callback or by a signal handler; takes precedence over `result`'s error.
    pub py_err: Option<PyErr>,
    /// The callback returned `False` (at any call, even the last: the result is then discarded).
    pub cancelled_by_callback: bool,
}

/// Run `work` (given the progress hook to install) on a scoped thread with the GIL released.
pub fn run<T: Send>(
    py: Python<'_>,
    callback: Option<&Py<PyAny>>,
    cancel: &Arc<AtomicBool>,
    work: impl FnOnce(Option<ProgressHook>) -> T + Send,
) -> Outcome<T> {
    let shared = Arc::new(Shared::default());
    let callback = callback.map(|c| c.clone_ref(py));
    let hook: Option<ProgressHook> = callback.as_ref().map(|_| {
        let s = Arc::clone(&shared);
        Arc::new(move |done: u64, total: u64| {
            s.done_bytes.store(done, Ordering::Relaxed);
            s.total_bytes.store(total, Ordering::Relaxed);
            // Wake the caller now; a lost wake-up costs at most one poll interval.
            s.changed.notify_one();
        }) as ProgressHook
    });
    py.detach(|| {
        std::thread::scope(|scope| {
            let worker_shared = Arc::clone(&shared);
            let worker = scope.spawn(move || {
                let r = work(hook);
                worker_shared.finish();
                r
            });
            let mut py_err: Option<PyErr> = None;
            let mut cancelled_by_callback = false;
            let mut reported = (u64::MAX, u64::MAX);
            loop {
                let finished = shared.wait();
                if py_err.is_none() && !cancelled_by_callback {
                    let now = (
                        shared.done_bytes.load(Ordering::Relaxed),
                        shared.total_bytes.load(Ordering::Relaxed),
                    );
                    let step = Python::attach(|py| -> PyResult<bool> {
                        py.check_signals().map_err(|e| noted_signal(py, e, CANCELLED_NOTE))?;
                        let Some(cb) = &callback else { return Ok(true) };
                        if now == reported || now.1 == 0 {
                            return Ok(true);
                        }
                        reported = now;
                        let ret = cb.call1(py, now)?;
                        let ret = ret.bind(py);
                        // Only a literal `False` cancels; `None` (no return) continues.
                        Ok(!ret.is_instance_of::<PyBool>() || ret.is_truthy()?)
                    });
                    match step {
                        Ok(true) => {}
                        Ok(false) => {
                            cancelled_by_callback = true;
                            cancel.store(true, Ordering::Release);
                        }
                        Err(e) => {
                            py_err = Some(e);
                            cancel.store(true, Ordering::Release);
                        }
                    }
                }
                if finished {
                    break;
                }
            }
            let result = match worker.join() {
                Ok(r) => r,
                Err(panic) => std::panic::resume_unwind(panic),
            };
            Outcome { result, py_err, cancelled_by_callback }
        })
    })
}
