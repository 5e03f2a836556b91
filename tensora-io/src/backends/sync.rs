//! The `sync` backend: a bounded pool of scoped std threads doing positional reads (`pread`) into
//! the destination.
//!
//! Workers pull reads from the plan's per-file queues. Worker `w` starts on queue `w mod files`
//! (queue 0, the most urgent, under a priority order) and, when that queue runs dry, moves on to the
//! next queue with work, so several files stay busy at once and a single file is shared by all
//! workers (each read is positional, so there is no shared cursor). A buffered job has one more
//! thread, which reads each queue into the page cache ahead of the workers' claims
//! ([`crate::map::readahead`]): a cold file is then read with a deep queue. A job filling in large
//! folios ([`Reading::PopulateAhead`](crate::Reading::PopulateAhead)) has one populator per file
//! queue instead ([`crate::map::fill`]), and a worker copies a read only once its range has been
//! populated or the populator stopped. Before a read is issued its
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

#[cfg(test)]
mod tests {
    use std::ops::Range;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;
    use crate::map::fill::Populator;
    use crate::seam::{Budget, JobConfig, Landed, Reading, StopReason};

    /// Bytes of each read of the test plan.
    const READ_BYTES: u64 = 64 << 10;
    /// Reads of the test plan (one file).
    const READS: u64 = 12;
    /// How long the slow populator takes per step.
    const STEP_DELAY: Duration = Duration::from_millis(15);

    /// How the test populator ends.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Ends {
        /// It reads every range in.
        Never,
        /// Its call number `n` fails with an I/O error.
        FailsAt(usize),
        /// Its call number `n` finds no `MADV_POPULATE_READ`.
        UnsupportedAt(usize),
        /// Its call number `n` cancels the load.
        CancelsAt(usize),
    }

    /// A slow populator that records the ranges it read in.
    #[derive(Debug)]
    struct Slow<'a> {
        ends: Ends,
        calls: AtomicUsize,
        populated: &'a Mutex<Vec<Range<u64>>>,
        cancel: &'a AtomicBool,
    }

    impl Populator for Slow<'_> {
        fn populate(&self, _queue: usize, range: Range<u64>) -> io::Result<bool> {
            let call = self.calls.fetch_add(1, Ordering::Relaxed);
            std::thread::sleep(STEP_DELAY);
            match self.ends {
                Ends::FailsAt(n) if n == call => return Err(io::Error::other("injected populate failure")),
                Ends::UnsupportedAt(n) if n == call => return Ok(false),
                Ends::CancelsAt(n) if n == call => self.cancel.store(true, Ordering::Release),
                _ => {}
            }
            self.populated.lock().unwrap().push(range);
            Ok(true)
        }
    }

    /// `pread`, counting the reads that began before their range was populated.
    #[derive(Debug)]
    struct Checked<'a> {
        populated: &'a Mutex<Vec<Range<u64>>>,
        early: AtomicUsize,
    }

    impl ReadAt for Checked<'_> {
        fn read_at(
            &self,
            file: &SourceFile,
            file_index: u32,
            buf: &mut [u8],
            offset_bytes: u64,
            access: Access,
        ) -> io::Result<usize> {
            let end = offset_bytes + buf.len() as u64;
            let covered =
                self.populated.lock().unwrap().iter().any(|p| p.start <= offset_bytes && end <= p.end);
            if !covered {
                self.early.fetch_add(1, Ordering::Relaxed);
            }
            Pread.read_at(file, file_index, buf, offset_bytes, access)
        }
    }

    struct NoSink;

    impl CompletionSink for NoSink {
        fn read_done(&self, _landed: Landed<'_>) -> Result<(), StopReason> {
            Ok(())
        }
    }

    /// What a populating run of the sync workers over a file of [`READS`] reads did: its result,
    /// whether the destination holds the file's bytes, and the reads that began unpopulated.
    fn run_populating(ends: Ends) -> (Result<IoStats, ReadError>, bool, usize) {
        let bytes: Vec<u8> = (0..READS * READ_BYTES).map(|i| (i % 251) as u8).collect();
        let (_tmp, f) = crate::seam::temp_source(&bytes);
        let extents =
            [tensora_plan::Extent { file: 0, offset_bytes: 0, len_bytes: READS * READ_BYTES, tag: 0 }];
        let config =
            tensora_plan::PlanConfig { chunk_bytes: READ_BYTES, ..tensora_plan::PlanConfig::default() };
        let plan = tensora_plan::Plan::build(&extents, &config, &tensora_plan::Order::File).unwrap();
        assert_eq!(plan.reads().len() as u64, READS);
        let mut arena = crate::arena::Arena::with_len(plan.arena_len_bytes()).unwrap();
        let (budget, cancel, files) = (Budget::new(1 << 20), AtomicBool::new(false), [f]);
        let reading = Reading::PopulateAhead { device_cost: None };
        let config = JobConfig { threads: 2, queue_depth: 1, reading, retries_max: 0 };
        let populated = Mutex::new(Vec::new());
        let populator = Slow { ends, calls: AtomicUsize::new(0), populated: &populated, cancel: &cancel };
        let reader = Checked { populated: &populated, early: AtomicUsize::new(0) };
        let result = {
            // SAFETY: nothing else touches `arena` while the job lives.
            let job = unsafe { Job::new(&plan, &files, &arena, &budget, &cancel, config) };
            validate_job(&job).unwrap();
            let state = RunState::new(&job);
            let per_worker =
                super::super::runtime::run_workers_populating(&job, &state, 2, &populator, None, |w| {
                    worker(&job, &NoSink, &reader, &state, w)
                });
            state.finish(per_worker)
        };
        let same = arena.as_slice()[..bytes.len()] == bytes[..];
        (result, same, reader.early.load(Ordering::Relaxed))
    }

    #[test]
    fn the_workers_never_read_a_range_before_its_populate_mark() {
        let (result, same, early) = run_populating(Ends::Never);
        assert_eq!(result.unwrap().bytes_read, READS * READ_BYTES);
        assert!(same, "the destination holds the file's bytes");
        assert_eq!(early, 0, "reads issued before the populator reached their range");
    }

    #[test]
    fn a_failed_or_unsupported_populate_still_completes_the_load_with_the_files_bytes() {
        for ends in [Ends::FailsAt(2), Ends::UnsupportedAt(0), Ends::FailsAt(0)] {
            let (result, same, early) = run_populating(ends);
            assert_eq!(result.unwrap().bytes_read, READS * READ_BYTES, "{ends:?}");
            assert!(same, "{ends:?}: the destination holds the file's bytes");
            // The workers read what the populator never reached themselves.
            assert!(early > 0, "{ends:?}");
        }
    }

    #[test]
    fn a_load_cancelled_while_populating_stops_with_cancelled() {
        let (result, _, _) = run_populating(Ends::CancelsAt(3));
        let err = result.unwrap_err();
        assert!(matches!(err.kind, crate::seam::ReadErrorKind::Cancelled), "{err}");
    }
}
