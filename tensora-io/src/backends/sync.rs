//! The `sync` backend: a bounded pool of scoped std threads doing positional reads (`pread`) into
//! the destination.
//!
//! Workers pull reads from the plan's per-file queues. Worker `w` starts on queue `w mod files`
//! (queue 0, the most urgent, under a priority order) and, when that queue runs dry, moves on to the
//! next queue with work, so several files stay busy at once and a single file is shared by all
//! workers (each read is positional, so there is no shared cursor). A buffered job has one more
//! thread, which reads each queue into the page cache ahead of the workers' claims
//! ([`crate::map::readahead`]): a cold file is then read with a deep queue. Before a read is issued its
//! bytes are acquired from the job's [`Budget`](crate::Budget); the permit is released
//! once the read has landed.
//!
//! Every read follows the rules of `read_progress`, shared with the `io-uring` and
//! `async` backends: short reads resubmit the remainder (counted in [`IoStats::retries`] but not
//! against the bound), zero-progress events (`EINTR`, `EAGAIN`) are retried at most
//! `job.config.retries_max` times per read, `EAGAIN` backs off for [`super::read_progress::EAGAIN_BACKOFF_MAX`] at most, and a
//! read that hits end of file before the file's known end fails with
//! `ReadErrorKind::UnexpectedEof`. With `Reading::Direct`, calls whose offset, length and destination
//! address are block-aligned go through the `O_DIRECT` descriptor; `EINVAL` there turns direct
//! I/O off for that file and the remainder is re-issued buffered (counted in
//! [`IoStats::direct_fallbacks`]). The first error stops every worker before its next read and is
//! returned, naming the first byte that did not land; nothing is in flight when
//! [`IoBackend::execute`] returns.
//!
//! All reads go through a [`ReadAt`] layer ([`Pread`] by default) so that tests can inject faults
//! (`fault::FaultySource`, with the `fault-injection` feature).

use std::fmt::Debug;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use tensora_plan::Read;

use super::read_progress::{ReadProgress, Step};
use super::runtime::{
    DestPtr, RunState, direct_align_bytes, direct_aligned, run_workers_reading_ahead, validate_job,
};
use crate::seam::{Access, CompletionSink, IoBackend, IoStats, Job, ReadError, SourceFile};

/// Upper bound on worker threads, whatever the job asks.
pub const THREADS_MAX: usize = 256;

/// A positional read source: the seam that lets tests inject faults below a backend.
pub trait ReadAt: Send + Sync + Debug {
    /// Read up to `buf.len()` bytes of `file` (index `file_index` in the job) at `offset_bytes`,
    /// through its O_DIRECT descriptor when `access` is [`Access::Direct`] and one is open. Same
    /// contract as `pread`: may return fewer bytes, 0 at end of file, or a transient error.
    fn read_at(
        &self,
        file: &SourceFile,
        file_index: u32,
        buf: &mut [u8],
        offset_bytes: u64,
        access: Access,
    ) -> io::Result<usize>;
}

/// Plain `pread(2)`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Pread;

impl ReadAt for Pread {
    fn read_at(
        &self,
        file: &SourceFile,
        _file_index: u32,
        buf: &mut [u8],
        offset_bytes: u64,
        access: Access,
    ) -> io::Result<usize> {
        let fd = match (&file.direct, access) {
            (Some(d), Access::Direct) => d,
            _ => &file.buffered,
        };
        fd.read_at(buf, offset_bytes)
    }
}

/// The `sync` backend. See the module docs.
///
/// ```
/// use tensora_io::IoBackend;
/// let backend = tensora_io::SyncBackend::default();
/// assert_eq!(backend.name(), "sync");
/// ```
#[derive(Debug, Clone)]
pub struct SyncBackend {
    reader: Arc<dyn ReadAt>,
}

impl Default for SyncBackend {
    fn default() -> Self {
        SyncBackend { reader: Arc::new(Pread) }
    }
}

impl SyncBackend {
    /// A sync backend whose reads go through `reader` (e.g. a `fault::FaultySource`).
    pub fn with_reader(reader: Arc<dyn ReadAt>) -> SyncBackend {
        SyncBackend { reader }
    }
}

/// One worker of a run: takes reads round-robin from its home queue (see
/// [`RunState::next_read`]) until every queue is drained or the run stops.
fn worker(
    job: &Job<'_>,
    sink: &dyn CompletionSink,
    reader: &dyn ReadAt,
    state: &RunState,
    w: usize,
) -> IoStats {
    let mut stats = IoStats::default();
    while let Some(index) = state.next_read(job, w) {
        let read = &job.plan.reads()[index as usize];
        // Filling in large folios: copy once the populator has read this range in (or stopped).
        state.wait_populated(index);
        let permit = job.budget.acquire(read.len_bytes);
        state.begin_inflight(permit.bytes());
        let result = fill(job, sink, reader, state, index, &mut stats);
        state.end_inflight(permit.bytes());
        drop(permit);
        match result {
            Ok(()) => {
                stats.reads += 1;
                stats.bytes_read += read.len_bytes;
                state.land(job, sink, index);
            }
            Err(Some(e)) => state.fail(e),
            // Another worker failed the run: its error is the one reported.
            Err(None) => break,
        }
    }
    stats
}

/// Reads all of read `index` into its destination range through the shared [`ReadProgress`]
/// rules, in steps of [`Job::landed_step_bytes`] (each landed prefix reported to
/// `sink.prefix_landed`) when the job asks for them. `Err(None)` means the run was stopped by
/// another worker.
fn fill(
    job: &Job<'_>,
    sink: &dyn CompletionSink,
    reader: &dyn ReadAt,
    state: &RunState,
    index: u32,
    stats: &mut IoStats,
) -> Result<(), Option<ReadError>> {
    let read: &Read = &job.plan.reads()[index as usize];
    let file = &job.files[read.file as usize];
    let base = DestPtr::new(job);
    let align = direct_align_bytes(job);
    let step_bytes = job.landed_step_bytes();
    let mut progress = ReadProgress::new(read, file.len_bytes, job.config.retries_max);
    loop {
        if state.stopped() {
            return Err(None);
        }
        let direct_ok =
            job.config.reading.is_direct() && file.direct.is_some() && state.direct_allowed(read.file);
        let call = progress.next_call_within(direct_ok.then_some(align), step_bytes.unwrap_or(u64::MAX));
        // SAFETY: `validate_job` checked that `arena_offset_bytes .. + len_bytes` lies inside the
        // destination (whose length fits usize), and `done + len <= len_bytes`; the `Destination`
        // contract makes that memory initialised, valid and writable for the job's life, and plan
        // reads never overlap. Only this call's bytes are borrowed mutably, and only until the
        // call returns: the landed prefix before them may be read by the sink meanwhile.
        let rest = unsafe {
            std::slice::from_raw_parts_mut(
                base.at(read.arena_offset_bytes + call.done_bytes),
                call.len_bytes as usize,
            )
        };
        let direct_now =
            direct_ok && direct_aligned(rest.as_ptr(), call.file_offset_bytes, call.len_bytes, align);
        let result =
            reader.read_at(file, read.file, rest, call.file_offset_bytes, Access::direct_if(direct_now));
        let retries_before = progress.retries();
        let step = progress.on_io_result(&result, call.len_bytes, Access::direct_if(direct_now));
        stats.retries += progress.retries() - retries_before;
        match step {
            Step::Landed => return Ok(()),
            Step::Again { backoff } => {
                if let Some(backoff) = backoff {
                    std::thread::sleep(backoff);
                }
                if step_bytes.is_some() && progress.done_bytes() > call.done_bytes {
                    let prefix = crate::seam::LandedPrefix::new(job, index, progress.done_bytes());
                    if sink.prefix_landed(prefix).is_err() {
                        return Err(Some(progress.error(crate::seam::ReadErrorKind::Stopped)));
                    }
                }
            }
            Step::DirectRefused => {
                stats.direct_fallbacks += 1;
                state.disable_direct(read.file);
            }
            Step::Fail(kind) => return Err(Some(progress.error(kind))),
        }
    }
}

impl IoBackend for SyncBackend {
    fn name(&self) -> &'static str {
        "sync"
    }

    fn execute(&self, job: &Job<'_>, sink: &dyn CompletionSink) -> Result<IoStats, ReadError> {
        validate_job(job)?;
        let reads_total = job.plan.reads().len();
        if reads_total == 0 {
            return Ok(IoStats::default());
        }
        let state = RunState::new(job);
        let threads = job.config.threads.clamp(1, THREADS_MAX).min(reads_total);
        let reader = &*self.reader;
        let per_worker =
            run_workers_reading_ahead(job, &state, threads, |w| worker(job, sink, reader, &state, w));
        state.finish(per_worker)
    }
}
