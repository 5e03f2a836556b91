//! A new backend in one file plus one registration call.
//!
//! `OneThreadPread` executes a plan with a single thread of blocking `pread`s. To ship it inside
//! tensora-io, add the file under `src/` and one line to `REGISTRY` in `src/registry.rs`:
//!
//! ```text
//! ("one-thread", || Box::new(crate::one_thread::OneThreadPread)),
//! ```
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
                let read = &job.plan.reads()[index as usize];
                let fail = |kind| ReadError {
                    file: read.file,
                    offset_bytes: read.offset_bytes,
                    len_bytes: read.len_bytes,
                    kind,
                };
                if job.cancel.load(Ordering::Acquire) {
                    return Err(fail(ReadErrorKind::Cancelled));
                }
                let fits = read
                    .arena_offset_bytes
                    .checked_add(read.len_bytes)
                    .is_some_and(|e| e <= job.dest.len_bytes());
                let Some(file) = job.files.get(read.file as usize).filter(|_| fits) else {
                    return Err(fail(ReadErrorKind::Io(std::io::Error::other("read outside the job"))));
                };
                let _permit = job.budget.acquire(read.len_bytes);
                // SAFETY: the range lies inside the destination (checked above), which the
                // `Destination` contract keeps valid and writable for the job; plan reads never
                // overlap and this backend has one read in flight, so the slice is unique.
                let buf = unsafe {
                    std::slice::from_raw_parts_mut(
                        job.dest.host_ptr().as_ptr().add(read.arena_offset_bytes as usize),
                        read.len_bytes as usize,
                    )
                };
                file.buffered
                    .read_exact_at(buf, read.offset_bytes)
                    .map_err(|e| fail(ReadErrorKind::Io(e)))?;
                job.dest
                    .on_landed(read.arena_offset_bytes, read.len_bytes)
                    .map_err(|e| fail(ReadErrorKind::Io(e)))?;
                stats.bytes_read += read.len_bytes;
                stats.reads += 1;
                stats.peak_inflight_bytes = stats.peak_inflight_bytes.max(read.len_bytes);
                sink.read_done(index).map_err(|_| fail(ReadErrorKind::Stopped))?;
            }
        }
        Ok(stats)
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args().nth(1).unwrap_or_else(|| {
        concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/fixtures/serverlessllm/tiny").to_owned()
    });
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
