//! [`load_async`]: a whole [`load`](crate::load) on tokio's blocking pool, so the caller's
//! runtime workers keep running other tasks while the bytes move (cargo feature `async`).
//!
//! ```
//! use std::sync::Arc;
//! use tensora_io::{BackendChoice, LoadOptions, load_async};
//!
//! let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/real/fracast-0.safetensors");
//! let ckpt = Arc::new(tensora_format::open(path)?);
//! let opts = LoadOptions { backend: BackendChoice::Named("async".into()), ..LoadOptions::default() };
//! let runtime = tokio::runtime::Builder::new_current_thread().build()?;
//! let loaded = runtime.block_on(load_async(Arc::clone(&ckpt), opts))?;
//! assert_eq!(loaded.len(), ckpt.tensors().len());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tensora_format::Checkpoint;

use super::{LoadOptions, Loaded};
use crate::error::LoadError;

/// Loads `ckpt` like [`load`](crate::load::load), without blocking the caller's runtime.
///
/// Inside a tokio runtime, the load runs on that runtime's blocking pool (`spawn_blocking`);
/// under any other executor it runs on a thread of its own. Either way the calling task only
/// awaits the result.
///
/// Dropping the returned future before it completes cancels the load (through
/// [`LoadOptions::cancel`], installed here when the caller set none); the blocking work stops
/// at its next read boundary. A caller-provided cancel flag is left to the caller.
///
/// A panic inside the load (for example from an `on_tensor` hook) is resumed in the caller.
pub async fn load_async(ckpt: Arc<Checkpoint>, mut opts: LoadOptions) -> Result<Loaded, LoadError> {
    let own_cancel = if opts.cancel.is_none() {
        let flag = Arc::new(AtomicBool::new(false));
        opts.cancel = Some(Arc::clone(&flag));
        Some(flag)
    } else {
        None
    };
    let mut guard = CancelOnDrop(own_cancel);
    let work = move || crate::load::load(&ckpt, &opts);
    let result = if tokio::runtime::Handle::try_current().is_ok() {
        match tokio::task::spawn_blocking(work).await {
            Ok(result) => result,
            Err(e) => match e.try_into_panic() {
                Ok(payload) => std::panic::resume_unwind(payload),
                // The runtime is shutting down and dropped the task before it ran.
                Err(_) => Err(LoadError::Cancelled),
            },
        }
    } else {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let spawned = std::thread::Builder::new().name("tensora-load".into()).spawn(move || {
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work));
            // The receiver is gone only if the caller dropped the future: nothing to report to.
            let _ = tx.send(outcome);
        });
        if let Err(e) = spawned {
            return Err(LoadError::Open { path: std::path::PathBuf::from("<load thread>"), source: e });
        }
        match rx.await {
            Ok(Ok(result)) => result,
            Ok(Err(payload)) => std::panic::resume_unwind(payload),
            Err(_) => Err(LoadError::Cancelled),
        }
    };
    guard.0 = None;
    result
}

/// Sets the load's own cancel flag if the `load_async` future is dropped before completion.
#[derive(Debug)]
struct CancelOnDrop(Option<Arc<AtomicBool>>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(flag) = &self.0 {
            flag.store(true, Ordering::Release);
        }
    }
}
