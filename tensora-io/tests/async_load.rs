//! The async backend against random plans (buffered and O_DIRECT), EOF, cancellation and sink
//! stops, and `load_async` keeping the caller's runtime responsive.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use proptest::prelude::*;
use sha2::{Digest, Sha256};
use tensora_io::{BackendChoice, LoadOptions, TensorHook};
use tensora_io::{ReadErrorKind, SourceFile};
use tensora_plan::{Order, Plan};
use {tensora_io::AsyncBackend, tensora_io::load_async};

mod harness;

use harness::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    #[test]
    fn random_plans_land_the_right_bytes(
        (lens, picked) in extents_strategy(),
        direct in any::<bool>(),
        queue_depth in 1u32..9,
        chunk_kib in 4u64..64,
        seed in any::<u64>(),
        budget_kib in 4u64..256,
    ) {
        let (files, extents) = random_files_and_extents(&lens, &picked, seed, direct);
        let config = random_plan_config(direct, chunk_kib);
        let file_lens: Vec<u64> = lens.iter().map(|&l| l as u64).collect();
        let plan = Plan::build_with_file_lens(&extents, &config, &Order::File, &file_lens).unwrap();
        let sources: Vec<SourceFile> = files.iter().map(|f| clone_source(&f.source)).collect();
        let knobs = Knobs { threads: 1, queue_depth, direct, budget_bytes: budget_kib << 10 };
        let mut run = run(&AsyncBackend::default(), &plan, &sources, knobs);
        check_bytes(&mut run, &plan, &extents, &files);
        prop_assert_eq!(run.result.unwrap().direct_fallbacks, 0);
    }
}

#[test]
fn read_past_a_truncated_file_is_unexpected_eof() {
    let file = test_file(pattern(10_000, 1), 100 << 10, false);
    let (_, plan) = whole_file_plan(100 << 10, 1, 16 << 10);
    let knobs = Knobs { threads: 2, queue_depth: 4, direct: false, budget_bytes: 1 << 20 };
    let run = run(&AsyncBackend::default(), &plan, std::slice::from_ref(&file.source), knobs);
    let err = run.result.unwrap_err();
    assert!(matches!(err.kind, ReadErrorKind::UnexpectedEof { .. }), "{err}");
    assert_eq!(run.budget.in_use_bytes(), 0);
}

#[test]
fn cancel_flag_stops_the_run() {
    check_cancel_flag_stops_the_run(&AsyncBackend::default(), 4);
}

#[test]
fn sink_stop_returns_stopped() {
    check_sink_stop_returns_stopped(&AsyncBackend::default(), 4);
}

#[test]
fn execute_from_inside_a_runtime_does_not_panic() {
    let file = test_file(pattern(200_000, 11), 200_000, false);
    let (extents, plan) = whole_file_plan(200_000, 1, 16 << 10);
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let mut run = runtime.block_on(async {
        let knobs = Knobs { threads: 1, queue_depth: 4, direct: false, budget_bytes: 1 << 20 };
        run(&AsyncBackend::default(), &plan, std::slice::from_ref(&file.source), knobs)
    });
    check_bytes(&mut run, &plan, &extents, std::slice::from_ref(&file));
}

// ---------------------------------------------------------------------------------------------
// load_async
// ---------------------------------------------------------------------------------------------

const REAL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/real/fracast-0.safetensors");
const REAL_EXPECTED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/real/fracast-0.expected.json");

fn current_thread_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().build().unwrap()
}

#[test]
fn the_callers_runtime_keeps_running_tasks_during_a_load() {
    // The first completed tensor's hook waits until a task on the caller's (single-threaded)
    // runtime has made progress. If the load blocked that thread, the task could never run, the
    // hook would time out and the load would fail.
    const TICKS: u32 = 50;
    let (tx, rx) = std::sync::mpsc::channel::<u32>();
    let rx = Mutex::new(rx);
    let waited = AtomicBool::new(false);
    let hook: TensorHook = Arc::new(move |_t| {
        if waited.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        let ticks = rx.lock().unwrap().recv_timeout(Duration::from_secs(5))?;
        if ticks < TICKS {
            return Err(format!("only {ticks} ticks").into());
        }
        Ok(())
    });
    let ckpt = Arc::new(tensora_format::open(REAL).unwrap());
    let runtime = current_thread_runtime();
    let loaded = runtime.block_on(async {
        let ticker = tokio::spawn(async move {
            for _ in 0..TICKS {
                tokio::task::yield_now().await;
            }
            tx.send(TICKS).unwrap();
        });
        let opts = LoadOptions { on_tensor: Some(hook), ..LoadOptions::default() };
        let loaded = load_async(Arc::clone(&ckpt), opts).await;
        ticker.await.unwrap();
        loaded
    });
    let loaded = loaded.unwrap();
    assert_eq!(loaded.len(), ckpt.tensors().len());
}

fn expected_sha256() -> Vec<(String, String)> {
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(REAL_EXPECTED).unwrap()).unwrap();
    json["tensors"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(name, t)| (name.clone(), t["sha256"].as_str().unwrap().to_owned()))
        .collect()
}

#[test]
fn every_backend_yields_the_expected_bytes_through_load_async() {
    let expected = expected_sha256();
    assert!(!expected.is_empty());
    let ckpt = Arc::new(tensora_format::open(REAL).unwrap());
    let runtime = current_thread_runtime();
    for backend in ["async", "io-uring", "mmap", "sync"] {
        for chunk_bytes in [4096, 8 << 20] {
            let opts = LoadOptions {
                backend: BackendChoice::Named(backend.to_owned()),
                chunk_bytes,
                budget_bytes: 64 << 10,
                ..LoadOptions::default()
            };
            let loaded = runtime.block_on(load_async(Arc::clone(&ckpt), opts)).unwrap();
            assert_eq!(loaded.report().backend, backend);
            for (name, sha) in &expected {
                let t = loaded.tensor(name).unwrap();
                assert_eq!(&hex::encode(Sha256::digest(t.bytes())), sha, "{backend}: {name}");
            }
        }
    }
}

#[test]
fn load_async_errors_are_returned_not_panicked() {
    let ckpt = Arc::new(tensora_format::open(REAL).unwrap());
    let opts =
        LoadOptions { backend: BackendChoice::Named("no-such-backend".into()), ..LoadOptions::default() };
    let err = current_thread_runtime().block_on(load_async(ckpt, opts)).unwrap_err();
    assert!(err.to_string().contains("no-such-backend"), "{err}");
}

/// A minimal executor that is not tokio: polls on this thread, parks between wake-ups.
fn block_on_without_tokio<F: std::future::Future>(future: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = std::task::Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = std::task::Context::from_waker(&waker);
    let mut future = std::pin::pin!(future);
    // Bounded: the load of a 344 KB fixture finishes long before this many wake-ups.
    for _ in 0..100_000 {
        if let std::task::Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
        std::thread::park_timeout(Duration::from_millis(100));
    }
    panic!("future never completed");
}

#[test]
fn load_async_works_under_a_non_tokio_executor() {
    let ckpt = Arc::new(tensora_format::open(REAL).unwrap());
    assert!(tokio::runtime::Handle::try_current().is_err());
    let loaded = block_on_without_tokio(load_async(Arc::clone(&ckpt), LoadOptions::default())).unwrap();
    let expected = expected_sha256();
    for (name, sha) in &expected {
        assert_eq!(&hex::encode(Sha256::digest(loaded.tensor(name).unwrap().bytes())), sha, "{name}");
    }
}
