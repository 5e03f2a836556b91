//! Cancelling a load in the middle: the run stops with `Cancelled`, every budget byte is returned,
//! no `Loaded` comes back and no thread is left running.

mod harness;
mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use harness::{check_cancel_flag_stops_the_run, check_sink_stop_returns_stopped};
use support::*;
use tensora_format::Dtype;
use tensora_io::SyncBackend;
use tensora_io::{BackendChoice, LoadError, LoadOptions, load, load_streaming};

/// The tests of this binary run one at a time: one of them counts the process's threads.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn the_sync_backend_stops_on_cancel_and_on_a_sink_stop_with_the_budget_returned() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    check_cancel_flag_stops_the_run(&SyncBackend::default(), 1);
    check_sink_stop_returns_stopped(&SyncBackend::default(), 1);
}

/// Threads of this process now (`/proc/self/task`).
fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

#[test]
fn a_load_cancelled_midway_returns_cancelled_and_leaves_no_thread_behind() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let g = generate(3, &[(0..16).map(|_| (Dtype::U8, vec![256 << 10])).collect()]);
    let ckpt = g.open();
    for name in runnable_backends() {
        for streaming in [false, true] {
            let cancel = Arc::new(AtomicBool::new(false));
            let c = Arc::clone(&cancel);
            let opts = LoadOptions {
                backend: BackendChoice::Named(name.into()),
                chunk_bytes: 64 << 10,
                budget_bytes: 1 << 20,
                threads: 2,
                cancel: Some(Arc::clone(&cancel)),
                // Cancel as soon as the first tensor is complete: most of the load is still to come.
                on_tensor: Some(Arc::new(move |_| {
                    c.store(true, Ordering::SeqCst);
                    Ok(())
                })),
                ..LoadOptions::default()
            };
            let before = threads();
            let err = if streaming {
                load_streaming(&ckpt, &opts, |_| Ok(())).map(|_| ()).unwrap_err()
            } else {
                load(&ckpt, &opts).map(|_| ()).unwrap_err()
            };
            assert!(matches!(err, LoadError::Cancelled), "{name} streaming={streaming}: {err}");
            assert!(cancel.load(Ordering::SeqCst));
            assert_eq!(threads(), before, "{name} streaming={streaming}: every worker joined");
        }
    }
}
