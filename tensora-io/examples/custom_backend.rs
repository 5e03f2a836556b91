//! A new backend in one file plus one registration call.
//!
//! `OneThreadPread` executes a plan with a single thread of blocking `pread`s. To ship it inside
//! tensora-io, add the file under `src/backends/` and one line to `REGISTRY` in
//! `src/backends/registry.rs`:
//!
//! ```text
//! ("one-thread", || Box::new(crate::one_thread::OneThreadPread)),
//! ```
//!
//! It is safe code only: `Job::claim` hands out each read's destination slice once per job.
//!
//! Out of tree, pass it as `BackendChoice::Custom` (the one call below). Run with
//! `cargo run -p tensora-io --example custom_backend [CHECKPOINT]`.

use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use tensora_io::{
    BackendChoice, CompletionSink, IoBackend, IoStats, Job, LoadOptions, ReadError, ReadErrorKind, load,
};

/// One thread, one read at a time, in queue order. No retries beyond what `read_exact_at` does.
#[derive(Debug, Default)]
struct OneThreadPread;

impl IoBackend for OneThreadPread {
    fn name(&self) -> &'static str {
        "one-thread"
    }

    fn execute(&self, job: &Job<'_>, sink: &dyn CompletionSink) -> Result<IoStats, ReadError> {
        let mut stats = IoStats::default();
        for queue in job.plan.queues() {
            for index in queue.reads.clone() {
                // The read's destination slice, handed out once per job: no `unsafe` needed.
                let mut target = job.claim(index)?;
                let read = target.read().clone();
                let fail = |kind| ReadError {
                    file: read.file,
                    offset_bytes: read.offset_bytes,
                    len_bytes: read.len_bytes,
                    kind,
                };
                if job.cancel.load(Ordering::Acquire) {
                    return Err(fail(ReadErrorKind::Cancelled));
                }
                let Some(file) = job.files.get(read.file as usize) else {
                    return Err(fail(ReadErrorKind::Io(std::io::Error::other("read names no file"))));
                };
                let _permit = job.budget.acquire(read.len_bytes);
                file.buffered
                    .read_exact_at(target.buf(), read.offset_bytes)
                    .map_err(|e| fail(ReadErrorKind::Io(e)))?;
                stats.bytes_read += read.len_bytes;
                stats.reads += 1;
                stats.peak_inflight_bytes = stats.peak_inflight_bytes.max(read.len_bytes);
                // `on_landed` on the destination, then `read_done` on the sink.
                target.land(sink)?;
            }
        }
        Ok(stats)
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/serverlessllm/tiny").to_owned());
    let ckpt = tensora_format::open(&path)?;
    // The one registration call:
    let opts =
        LoadOptions { backend: BackendChoice::Custom(Arc::new(OneThreadPread)), ..LoadOptions::default() };
    let mine = load(&ckpt, &opts)?;
    let reference = load(&ckpt, &LoadOptions { backend: BackendChoice::Named("sync".into()), ..opts })?;
    for t in mine.tensors() {
        let want = reference.tensor(t.name()).ok_or("tensor missing from the reference load")?;
        if t.bytes() != want.bytes() {
            return Err(format!("{}: bytes differ", t.name()).into());
        }
    }
    let r = mine.report();
    println!("{} tensors via {}: identical to sync; {:.3} GB/s", mine.len(), r.backend, r.gbps);
    Ok(())
}
