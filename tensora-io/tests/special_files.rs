//! A shard that is a FIFO, named by a sharded index or swapped in after the parse, fails the load
//! with a typed error (`LoadError::Format`, `NotRegularFile`, naming the shard) and never blocks
//! it: every way a load opens a checkpoint file by path (its sources, the `auto` probes, the
//! streaming look-ahead) goes through `tensora_format::open_regular`. Each load runs on a thread
//! of its own behind a generous hang guard, which only turns a hang (the bug) into a failure.
#![cfg(unix)]

mod support;

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use support::*;
use tensora_format::{Dtype, ErrorKind, NonRegular};
use tensora_io::{BackendChoice, IoMode, LoadError, LoadOptions, Residence, load, load_path, load_streaming};

/// How long a load may take before the test calls it a hang. Far above a load of these few KiB.
const HANG_GUARD: Duration = Duration::from_secs(60);

/// Run `work` on a detached thread; fail the test if it has not returned within [`HANG_GUARD`]
/// (a thread blocked in `open` on a FIFO is left behind, and ends with the test process).
fn returns<T: Send + 'static>(what: &str, work: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(work());
    });
    rx.recv_timeout(HANG_GUARD).unwrap_or_else(|_| panic!("{what}: the load blocked (a FIFO was opened)"))
}

/// `path` replaced by a FIFO nobody writes to.
fn make_fifo(path: &Path) {
    std::fs::remove_file(path).unwrap();
    let status = std::process::Command::new("mkfifo").arg(path).status().unwrap();
    assert!(status.success(), "mkfifo {}", path.display());
}

/// The error of a load that found `fifo` where a shard was: typed, naming it.
fn assert_fifo_refused(what: &str, result: Result<usize, LoadError>, fifo: &Path) {
    match result {
        Err(LoadError::Format(e)) => {
            assert_eq!(e.path(), fifo, "{what}: {e}");
            assert!(matches!(e.kind(), ErrorKind::NotRegularFile { found: NonRegular::Fifo }), "{what}: {e}");
        }
        other => panic!("{what}: expected a NotRegularFile error, got {other:?}"),
    }
}

/// Three shards and an index naming them.
fn sharded() -> (Generated, Vec<PathBuf>) {
    let g = generate(
        11,
        &[vec![(Dtype::F32, vec![64, 33])], vec![(Dtype::U8, vec![5000])], vec![(Dtype::F16, vec![7])]],
    );
    let shards: Vec<PathBuf> = (0..3).map(|s| g.path().join(format!("shard-{s:02}.safetensors"))).collect();
    let weight_map: serde_json::Map<String, serde_json::Value> =
        (0..3).map(|s| (format!("s{s}.t0"), format!("shard-{s:02}.safetensors").into())).collect();
    let index = serde_json::json!({ "metadata": {}, "weight_map": weight_map });
    std::fs::write(g.path().join("model.safetensors.index.json"), index.to_string()).unwrap();
    (g, shards)
}

#[test]
fn an_index_naming_a_fifo_as_a_shard_is_a_typed_error() {
    let (g, shards) = sharded();
    assert_eq!(g.open().tensors().len(), 3, "the index is read");
    make_fifo(&shards[1]);
    let dir = g.path().to_owned();
    let result = returns("load_path", move || load_path(&dir, &LoadOptions::default()).map(|l| l.len()));
    assert_fifo_refused("load_path", result, &shards[1]);
}

/// The ways a load opens its files: `auto`, each runnable backend buffered and direct, mapped
/// views, and a streaming load (with its look-ahead).
fn loads() -> Vec<(String, LoadOptions)> {
    let mut out = vec![("auto".to_owned(), LoadOptions::default())];
    for name in runnable_backends() {
        for io_mode in [IoMode::Buffered, IoMode::Direct] {
            let opts = LoadOptions {
                backend: BackendChoice::Named(name.to_owned()),
                io_mode,
                ..LoadOptions::default()
            };
            out.push((format!("{name} {io_mode:?}"), opts));
        }
    }
    let mapped = LoadOptions { residence: Residence::Mapped(files_unchanged()), ..LoadOptions::default() };
    out.push(("mapped".to_owned(), mapped));
    out
}

#[test]
fn a_shard_swapped_for_a_fifo_after_the_parse_is_a_typed_error_for_every_load() {
    // The first shard (which `auto` probes) and a later one (opened mid-load).
    for victim in [0, 2] {
        let (g, shards) = sharded();
        let ckpt = std::sync::Arc::new(g.open());
        make_fifo(&shards[victim]);
        for (what, opts) in loads() {
            let what = format!("shard {victim}, {what}");
            let c = std::sync::Arc::clone(&ckpt);
            let owned = opts.clone();
            let result = returns(&what, move || load(&c, &owned).map(|l| l.len()));
            assert_fifo_refused(&what, result, &shards[victim]);
            let c = std::sync::Arc::clone(&ckpt);
            let streaming = LoadOptions { budget_bytes: 16 << 10, ..opts };
            let result =
                returns(&what, move || load_streaming(&c, &streaming, |_| Ok(())).map(|r| r.tensors));
            assert_fifo_refused(&format!("{what}, streaming"), result, &shards[victim]);
        }
    }
}
