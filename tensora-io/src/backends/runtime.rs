//! The worker runtime every built-in backend shares: the job check that claims every read
//! ([`validate_job`]), the per-run state with one work cursor per file queue ([`RunState`]), scoped
//! worker threads ([`run_workers`]), the destination pointer handed to workers ([`DestPtr`]) and the
//! `O_DIRECT` alignment rule. No backend imports another backend; they all import this.

use std::io;
use std::ptr::NonNull;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use tensora_plan::{DeviceCost, Read};

use crate::map::fill::{
    FillMarks, FillQueue, FillStop, HugeMaps, Populator, Waited, fill_queue, lead_bytes_per_queue,
};
use crate::map::populate::POPULATE_THREADS_MAX;
use crate::map::readahead::{AheadQueue, read_ahead, willneed_file};
use crate::seam::{CompletionSink, IoStats, Job, ReadError, ReadErrorKind, Reading, StopReason};

/// Smallest alignment `O_DIRECT` is attempted with (the smallest logical block size in use).
pub(crate) const DIRECT_ALIGN_BYTES_MIN: u64 = 512;
/// Block size assumed for O_DIRECT eligibility (offset, length and address multiples of it).
pub const DIRECT_BLOCK_BYTES: u64 = 4096;

/// Checks every read of the plan against the files and the destination, so that no backend ever
/// writes outside the destination because of a plan/destination mismatch, then claims every read
/// of the job ([`Job::claim`] can no longer hand any of them out).
pub(crate) fn validate_job(job: &Job<'_>) -> Result<(), ReadError> {
    let dest_len = job.dest.len_bytes();
    for read in job.plan.reads() {
        let invalid = |why: String| {
            job_error(read, ReadErrorKind::Io(io::Error::new(io::ErrorKind::InvalidInput, why)))
        };
        if read.file as usize >= job.files.len() {
            return Err(invalid(format!(
                "plan names file #{} but the job has {}",
                read.file,
                job.files.len()
            )));
        }
        let arena_end = read.arena_offset_bytes.checked_add(read.len_bytes);
        if arena_end.is_none_or(|end| end > dest_len) {
            return Err(invalid(format!(
                "read lands at {}..+{} but the destination holds {dest_len} bytes",
                read.arena_offset_bytes, read.len_bytes
            )));
        }
        if read.offset_bytes.checked_add(read.len_bytes).is_none() {
            return Err(invalid("read end overflows u64".to_string()));
        }
    }
    if usize::try_from(dest_len).is_err() {
        let first = job.plan.reads().first();
        return Err(ReadError {
            file: first.map_or(0, |r| r.file),
            offset_bytes: first.map_or(0, |r| r.offset_bytes),
            len_bytes: dest_len,
            kind: ReadErrorKind::Io(io::Error::new(io::ErrorKind::InvalidInput, "destination exceeds usize")),
        });
    }
    // Every range checked: take them all, so no other backend (or `Job::claim`) can hand any of
    // them out while this run writes through raw pointers.
    job.claim_all()
}

/// A [`ReadError`] for a whole read.
pub(crate) fn job_error(read: &Read, kind: ReadErrorKind) -> ReadError {
    ReadError { file: read.file, offset_bytes: read.offset_bytes, len_bytes: read.len_bytes, kind }
}

/// The destination's base pointer, made shareable with worker threads.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DestPtr(NonNull<u8>);

// SAFETY: the `Destination` contract makes its memory writable from several threads at once as
// long as the ranges are disjoint, which plan reads are; the pointer itself is just an address.
unsafe impl Send for DestPtr {}
// SAFETY: as above; sharing the address does not by itself touch the memory.
unsafe impl Sync for DestPtr {}

impl DestPtr {
    pub(crate) fn new(job: &Job<'_>) -> Self {
        Self(job.dest.host_ptr())
    }

    /// A destination pointer for unit tests that drive a read without a [`Job`].
    #[cfg(test)]
    pub(crate) fn from_nonnull(ptr: NonNull<u8>) -> Self {
        Self(ptr)
    }

    /// Address of `offset_bytes` into the destination. Only pointer arithmetic: callers validated
    /// the offset against the destination length with [`validate_job`].
    pub(crate) fn at(self, offset_bytes: u64) -> *mut u8 {
        self.0.as_ptr().wrapping_add(offset_bytes as usize)
    }
}

/// State shared by the workers of one run: one work cursor per file queue, the first error, and
/// counters.
///
/// Workers claim reads round-robin across the plan's per-file queues ([`RunState::claim`] from a
/// home queue, moving on to the next queue with work), so several files are busy at once; under
/// a priority order every worker starts on queue 0, the most urgent.
#[derive(Debug)]
pub(crate) struct RunState {
    /// Each queue's read range and its next position (relative to the range's start).
    queues: Vec<(std::ops::Range<u32>, AtomicU32)>,
    priority: bool,
    stop: AtomicBool,
    first_error: Mutex<Option<ReadError>>,
    inflight_bytes: AtomicU64,
    peak_inflight_bytes: AtomicU64,
    /// Files whose `O_DIRECT` descriptor returned `EINVAL`: read buffered from then on.
    direct_disabled: Vec<AtomicBool>,
    /// How far each queue has been populated ([`Reading::PopulateAhead`] with at most
    /// [`POPULATE_THREADS_MAX`] queues, one populator each; `None` otherwise).
    fill: Option<FillMarks>,
}

impl RunState {
    pub(crate) fn new(job: &Job<'_>) -> Self {
        Self {
            queues: job.plan.queues().iter().map(|q| (q.reads.clone(), AtomicU32::new(0))).collect(),
            priority: matches!(job.plan.order(), tensora_plan::Order::Priority(_)),
            stop: AtomicBool::new(false),
            first_error: Mutex::new(None),
            inflight_bytes: AtomicU64::new(0),
            peak_inflight_bytes: AtomicU64::new(0),
            direct_disabled: job.files.iter().map(|_| AtomicBool::new(false)).collect(),
            fill: populating(job).then(|| FillMarks::new(job.plan.queues().len())),
        }
    }

    /// Waits until read `index` has been populated, where the run populates
    /// ([`Reading::PopulateAhead`]): at most [`crate::map::fill::FILL_WAIT_MAX`], and no longer
    /// than its populator runs. `None`: this run does not populate.
    pub(crate) fn wait_populated(&self, index: u32) -> Option<Waited> {
        let marks = self.fill.as_ref()?;
        let (queue, (range, _)) = self.queues.iter().enumerate().find(|(_, (r, _))| r.contains(&index))?;
        Some(marks.wait_for(queue, (index - range.start) as usize))
    }

    /// The queue worker `worker` starts on: spread over the files, or queue 0 (the most urgent)
    /// under a priority order.
    pub(crate) fn home(&self, worker: usize) -> usize {
        if self.priority || self.queues.is_empty() { 0 } else { worker % self.queues.len() }
    }

    /// The next read to issue from queue `home`, or from the next queue with work; `None` when
    /// every queue is drained.
    pub(crate) fn claim(&self, home: usize) -> Option<u32> {
        let n = self.queues.len();
        for step in 0..n {
            let (range, cursor) = &self.queues[(home + step) % n];
            let len = range.end.saturating_sub(range.start);
            if cursor.load(Ordering::Relaxed) >= len {
                continue;
            }
            let pos = cursor.fetch_add(1, Ordering::AcqRel);
            if pos < len {
                return Some(range.start + pos);
            }
        }
        None
    }

    /// How many reads of queue `queue` have been claimed (they are claimed in queue order).
    pub(crate) fn claimed_in(&self, queue: usize) -> usize {
        self.queues.get(queue).map_or(0, |(range, cursor)| {
            (cursor.load(Ordering::Relaxed) as usize).min(range.end.saturating_sub(range.start) as usize)
        })
    }

    /// Whether every read has been claimed.
    pub(crate) fn all_claimed(&self) -> bool {
        self.queues
            .iter()
            .all(|(range, cursor)| cursor.load(Ordering::Relaxed) >= range.end.saturating_sub(range.start))
    }

    pub(crate) fn stopped(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    /// Records `err` if it is the first, and tells every worker to stop issuing.
    pub(crate) fn fail(&self, err: ReadError) {
        let mut first = self.first_error.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if first.is_none() {
            *first = Some(err);
        }
        self.stop.store(true, Ordering::Release);
    }

    /// Stops the run if the caller cancelled it. Returns whether the run must stop.
    pub(crate) fn check_cancel(&self, job: &Job<'_>, read: &Read) -> bool {
        if job.cancel.load(Ordering::Acquire) {
            self.fail(job_error(read, ReadErrorKind::Cancelled));
        }
        self.stopped()
    }

    /// The next read worker `worker` issues: claimed from its home queue or the next one with
    /// work ([`RunState::claim`]); `None` once the run stopped, every queue is drained, or the
    /// caller cancelled (which stops the run: [`RunState::check_cancel`]).
    pub(crate) fn next_read(&self, job: &Job<'_>, worker: usize) -> Option<u32> {
        if self.stopped() {
            return None;
        }
        let index = self.claim(self.home(worker))?;
        if self.check_cancel(job, &job.plan.reads()[index as usize]) { None } else { Some(index) }
    }

    pub(crate) fn begin_inflight(&self, len_bytes: u64) {
        let now = self.inflight_bytes.fetch_add(len_bytes, Ordering::AcqRel) + len_bytes;
        self.peak_inflight_bytes.fetch_max(now, Ordering::AcqRel);
    }

    pub(crate) fn end_inflight(&self, len_bytes: u64) {
        self.inflight_bytes.fetch_sub(len_bytes, Ordering::AcqRel);
    }

    pub(crate) fn direct_allowed(&self, file: u32) -> bool {
        !self.direct_disabled[file as usize].load(Ordering::Relaxed)
    }

    pub(crate) fn disable_direct(&self, file: u32) {
        self.direct_disabled[file as usize].store(true, Ordering::Relaxed);
    }

    /// Announces a landed read: `dest.on_landed`, then `sink.read_done`. Failures stop the run.
    pub(crate) fn land(&self, job: &Job<'_>, sink: &dyn CompletionSink, index: u32) {
        if self.stopped() {
            return;
        }
        let read = &job.plan.reads()[index as usize];
        if let Err(e) = job.dest.on_landed(read.arena_offset_bytes, read.len_bytes) {
            self.fail(job_error(read, ReadErrorKind::Io(e)));
            return;
        }
        if let Err(StopReason) = sink.read_done(crate::seam::Landed::new(job, index)) {
            self.fail(job_error(read, ReadErrorKind::Stopped));
        }
    }

    /// Sums the workers' stats, or returns the first error.
    pub(crate) fn finish(&self, per_worker: Vec<IoStats>) -> Result<IoStats, ReadError> {
        let first = self.first_error.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take();
        if let Some(err) = first {
            return Err(err);
        }
        let mut total = IoStats::default();
        for s in per_worker {
            total.bytes_read += s.bytes_read;
            total.reads += s.reads;
            total.retries += s.retries;
            total.direct_fallbacks += s.direct_fallbacks;
            total.bytes_advised_beyond_reads += s.bytes_advised_beyond_reads;
        }
        total.peak_inflight_bytes = self.peak_inflight_bytes.load(Ordering::Acquire);
        Ok(total)
    }
}

/// Runs `workers` copies of `f` on scoped threads (inline when there is one) and collects their
/// results. A panicking worker is re-raised after every worker has returned.
pub(crate) fn run_workers<F>(workers: usize, f: F) -> Vec<IoStats>
where
    F: Fn(usize) -> IoStats + Sync,
{
    if workers <= 1 {
        return vec![f(0)];
    }
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|w| {
                scope.spawn({
                    let f = &f;
                    move || f(w)
                })
            })
            .collect();
        let mut out = Vec::with_capacity(workers);
        let mut panic = None;
        for h in handles {
            match h.join() {
                Ok(s) => out.push(s),
                Err(payload) => panic = Some(payload),
            }
        }
        if let Some(payload) = panic {
            std::panic::resume_unwind(payload);
        }
        out
    })
}

/// Runs `workers` like [`run_workers`] with, for a job reading cold data through the page cache
/// ([`Reading::ReadAhead`]), a helper thread that reads each file queue into the page cache ahead
/// of the workers' claims ([`crate::map::readahead`]): the device gets a deep queue and every byte
/// stays cached for the next process. Measured on the cold 2.2 GB bench checkpoint: see
/// docs/performance.md "Restarts". A job filling in large folios ([`Reading::PopulateAhead`], at
/// most [`POPULATE_THREADS_MAX`] file queues; more are read ahead) runs one populator per file
/// queue instead ([`crate::map::fill`]); the workers wait for it ([`RunState::wait_populated`]).
/// A warm job ([`Reading::Cached`]) or a direct one runs the workers alone.
pub(crate) fn run_workers_reading_ahead<F>(
    job: &Job<'_>,
    state: &RunState,
    workers: usize,
    f: F,
) -> Vec<IoStats>
where
    F: Fn(usize) -> IoStats + Sync,
{
    let device_cost = match job.config.reading {
        Reading::Direct | Reading::Cached => return run_workers(workers, f),
        Reading::ReadAhead { device_cost } => device_cost,
        Reading::PopulateAhead { device_cost } if state.fill.is_some() => {
            let files: Vec<Option<&std::fs::File>> = job
                .plan
                .queues()
                .iter()
                .map(|q| job.files.get(q.file as usize).map(|s| &s.buffered))
                .collect();
            // The mappings live for the run and are unmapped when it returns.
            let maps = HugeMaps::new(&files);
            return run_workers_populating(job, state, workers, &maps, device_cost, f);
        }
        Reading::PopulateAhead { device_cost } => device_cost,
    };
    let queues = file_queues(job, state, device_cost);
    let ahead: Vec<&dyn AheadQueue> = queues.iter().map(|q| q as &dyn AheadQueue).collect();
    let done = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let helper = scope.spawn(|| read_ahead(&ahead, &done));
        let mut per_worker = run_workers(workers, f);
        done.store(true, Ordering::Release);
        if let Err(payload) = helper.join() {
            std::panic::resume_unwind(payload);
        }
        per_worker.push(IoStats {
            bytes_advised_beyond_reads: queues.iter().map(FileQueue::advised_beyond_bytes).sum(),
            ..IoStats::default()
        });
        per_worker
    })
}

/// Whether a run of `job` populates its files ahead of the workers: [`Reading::PopulateAhead`]
/// over at most [`POPULATE_THREADS_MAX`] file queues (one populator thread each).
fn populating(job: &Job<'_>) -> bool {
    matches!(job.config.reading, Reading::PopulateAhead { .. })
        && job.plan.queues().len() <= POPULATE_THREADS_MAX
}

/// Runs `workers` with one thread per file queue populating it through `populator`
/// ([`fill_queue`]), each read widened over the gaps `device_cost` says the device reads along.
/// The populators stop when the workers return, a worker fails the run, or the caller cancels.
pub(crate) fn run_workers_populating<F>(
    job: &Job<'_>,
    state: &RunState,
    workers: usize,
    populator: &dyn Populator,
    device_cost: Option<DeviceCost>,
    f: F,
) -> Vec<IoStats>
where
    F: Fn(usize) -> IoStats + Sync,
{
    let Some(marks) = state.fill.as_ref() else {
        return run_workers(workers, f);
    };
    let reads = job.plan.reads();
    let claimed: Vec<_> = (0..job.plan.queues().len()).map(|i| move || state.claimed_in(i)).collect();
    let queues: Vec<FillQueue<'_>> = job
        .plan
        .queues()
        .iter()
        .zip(&claimed)
        .map(|(q, claimed)| FillQueue {
            ranges: ahead_ranges(
                device_cost,
                reads.get(q.reads.start as usize..q.reads.end as usize).unwrap_or(&[]),
            ),
            claimed,
        })
        .collect();
    let lead_bytes = lead_bytes_per_queue(queues.len());
    let done = AtomicBool::new(false);
    let stop = FillStop { done: &done, failed: &state.stop, cancel: job.cancel };
    std::thread::scope(|scope| {
        let populators: Vec<_> = queues
            .iter()
            .enumerate()
            .map(|(i, q)| {
                let stop = &stop;
                scope.spawn(move || fill_queue(i, q, populator, marks, stop, lead_bytes))
            })
            .collect();
        let per_worker = run_workers(workers, f);
        done.store(true, Ordering::Release);
        marks.finish_all();
        for h in populators {
            if let Err(payload) = h.join() {
                std::panic::resume_unwind(payload);
            }
        }
        per_worker
    })
}

/// The read-ahead helper's view of each file queue of `job`, each read's advice widened back over
/// the gaps `device_cost` says the device reads along.
fn file_queues<'a>(
    job: &'a Job<'_>,
    state: &'a RunState,
    device_cost: Option<DeviceCost>,
) -> Vec<FileQueue<'a>> {
    let reads = job.plan.reads();
    job.plan
        .queues()
        .iter()
        .enumerate()
        .filter_map(|(index, q)| {
            let reads = reads.get(q.reads.start as usize..q.reads.end as usize)?;
            let file = &job.files.get(q.file as usize)?.buffered;
            // The device reads the small gaps between reads along (a strided slice's rows): the
            // helper advises each read from where its range starts.
            let ahead = ahead_ranges(device_cost, reads);
            let lens = ahead.iter().map(|r| r.end - r.start).collect();
            let beyond =
                reads.iter().zip(&ahead).map(|(r, a)| r.offset_bytes.saturating_sub(a.start)).collect();
            Some(FileQueue {
                index,
                state,
                ahead,
                file,
                lens,
                beyond,
                advised_beyond_bytes: AtomicU64::new(0),
            })
        })
        .collect()
}

/// The file range the read-ahead helper advises for each of `reads` (one file queue's reads, in
/// the order they are read): each read's own range, widened back over the gaps that
/// `device_cost` says the device reads along (`None`: each read alone).
fn ahead_ranges(device_cost: Option<DeviceCost>, reads: &[Read]) -> Vec<std::ops::Range<u64>> {
    match device_cost {
        Some(cost) => cost.ahead_ranges(reads.iter().map(|r| (r.offset_bytes, r.len_bytes))),
        None => reads.iter().map(|r| r.offset_bytes..r.offset_bytes.saturating_add(r.len_bytes)).collect(),
    }
}

/// One file queue of a job, as the read-ahead helper sees it.
struct FileQueue<'a> {
    index: usize,
    state: &'a RunState,
    /// The file range advised for each read: its own, widened back over a gap the device reads
    /// along (`Reading::ReadAhead`'s `device_cost`).
    ahead: Vec<std::ops::Range<u64>>,
    file: &'a std::fs::File,
    lens: Vec<u64>,
    /// For each read, the bytes at the front of its `ahead` range before the read itself (the gap
    /// read along).
    beyond: Vec<u64>,
    /// Of those, the bytes the helper advised: a piece the workers claim before the helper reaches
    /// it is not advised (the helper skips to where they are), nor the rest of one it was in.
    advised_beyond_bytes: AtomicU64,
}

impl FileQueue<'_> {
    /// Bytes of the gaps between reads advised so far (`IoStats::bytes_advised_beyond_reads`).
    fn advised_beyond_bytes(&self) -> u64 {
        self.advised_beyond_bytes.load(Ordering::Relaxed)
    }
}

impl AheadQueue for FileQueue<'_> {
    fn piece_lens(&self) -> &[u64] {
        &self.lens
    }

    fn claimed(&self) -> usize {
        self.state.claimed_in(self.index)
    }

    fn advise(&self, piece: usize, offset_bytes: u64, len_bytes: u64) {
        if let Some(range) = self.ahead.get(piece) {
            willneed_file(self.file, range.start + offset_bytes, len_bytes);
            // The part of this step in front of the read itself.
            let beyond = self.beyond.get(piece).copied().unwrap_or(0);
            let gap_bytes = beyond.min(offset_bytes.saturating_add(len_bytes)).saturating_sub(offset_bytes);
            self.advised_beyond_bytes.fetch_add(gap_bytes, Ordering::Relaxed);
        }
    }
}

/// Whether a read of `len` bytes from file offset `offset` into `ptr` may use `O_DIRECT`.
pub(crate) fn direct_aligned(ptr: *const u8, offset: u64, len: u64, align: u64) -> bool {
    (ptr as usize as u64).is_multiple_of(align) && offset.is_multiple_of(align) && len.is_multiple_of(align)
}

/// The alignment `O_DIRECT` reads of this job are attempted with.
pub(crate) fn direct_align_bytes(job: &Job<'_>) -> u64 {
    let align = job.plan.config().align_bytes.max(DIRECT_ALIGN_BYTES_MIN);
    if align.is_power_of_two() { align } else { align.next_power_of_two() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::seam::{Budget, JobConfig, Reading};
    use proptest::prelude::*;

    /// Bytes of each of the four reads of [`four_reads`]' plan.
    const READ_BYTES: u64 = 64 << 10;

    /// A temp file of `len_bytes`, and the plan of `extents` of it built with `config`, which
    /// has `reads` reads.
    fn planned(
        len_bytes: u64,
        extents: &[tensora_plan::Extent],
        config: tensora_plan::PlanConfig,
        reads: usize,
    ) -> (tempfile::NamedTempFile, crate::seam::SourceFile, tensora_plan::Plan) {
        let (tmp, f) = crate::seam::temp_source(&vec![5u8; len_bytes as usize]);
        let plan = tensora_plan::Plan::build(extents, &config, &tensora_plan::Order::File).unwrap();
        assert_eq!(plan.reads().len(), reads);
        (tmp, f, plan)
    }

    /// A plan of one file read in four reads of [`READ_BYTES`], and that file.
    fn four_reads() -> (tempfile::NamedTempFile, crate::seam::SourceFile, tensora_plan::Plan) {
        let extents = [tensora_plan::Extent { file: 0, offset_bytes: 0, len_bytes: 4 * READ_BYTES, tag: 0 }];
        let config =
            tensora_plan::PlanConfig { chunk_bytes: READ_BYTES, ..tensora_plan::PlanConfig::default() };
        planned(4 * READ_BYTES, &extents, config, 4)
    }

    #[test]
    fn next_read_hands_out_each_read_once_then_stops_on_cancel_naming_the_claimed_read() {
        let (_tmp, f, plan) = four_reads();
        let arena = crate::arena::Arena::with_len(plan.arena_len_bytes()).unwrap();
        let budget = Budget::new(1 << 20);
        let config = JobConfig {
            threads: 2,
            queue_depth: 1,
            reading: Reading::ReadAhead { device_cost: None },
            retries_max: 0,
        };
        let files = [f];
        let cancel = AtomicBool::new(false);
        // SAFETY: nothing reads or writes the destination: this test issues no read.
        let job = unsafe { Job::new(&plan, &files, &arena, &budget, &cancel, config) };
        let state = RunState::new(&job);
        let taken: Vec<Option<u32>> = (0..5).map(|w| state.next_read(&job, w)).collect();
        assert_eq!(taken, [Some(0), Some(1), Some(2), Some(3), None]);
        assert!(!state.stopped(), "a drained run is not stopped");

        let state = RunState::new(&job);
        assert_eq!(state.next_read(&job, 0), Some(0));
        cancel.store(true, Ordering::Release);
        assert_eq!(state.next_read(&job, 1), None);
        assert!(state.stopped());
        let err = state.finish(Vec::new()).unwrap_err();
        assert!(matches!(err.kind, ReadErrorKind::Cancelled), "{err}");
        assert_eq!(err.offset_bytes, READ_BYTES, "the cancel names the read it claimed: {err}");
    }

    /// Bytes of the gap between the two reads of [`gapped_reads`]: no whole page inside it, so a
    /// device of [`PAGES`]' cost reads it along.
    const GAP_BYTES: u64 = 3 << 10;
    /// A device that reads whole pages and costs 8 KiB of transfer per request.
    const PAGES: DeviceCost = DeviceCost { granule_bytes: 4096, request_cost_bytes: 8192 };

    /// A plan of one 8 KiB file read in two reads, `0..1024` and `4096..5120`, and that file.
    fn gapped_reads() -> (tempfile::NamedTempFile, crate::seam::SourceFile, tensora_plan::Plan) {
        use tensora_plan::{Extent, PlanConfig};
        let extents = [
            Extent { file: 0, offset_bytes: 0, len_bytes: 1024, tag: 0 },
            Extent { file: 0, offset_bytes: 1024 + GAP_BYTES, len_bytes: 1024, tag: 1 },
        ];
        planned(8192, &extents, PlanConfig { coalesce_gap_bytes: 0, ..PlanConfig::default() }, 2)
    }

    /// The gap bytes a read-ahead run reports are those its helper advised: with the workers
    /// ahead of it (every read claimed before it starts) it advises nothing, so none.
    #[test]
    fn the_gap_bytes_count_only_what_the_helper_advised() {
        let (_tmp, f, plan) = gapped_reads();
        let arena = crate::arena::Arena::with_len(plan.arena_len_bytes()).unwrap();
        let (budget, cancel, files) = (Budget::new(1 << 20), AtomicBool::new(false), [f]);
        let reading = Reading::ReadAhead { device_cost: Some(PAGES) };
        let config = JobConfig { threads: 1, queue_depth: 1, reading, retries_max: 0 };
        // SAFETY: nothing reads or writes the destination: the workers issue no read.
        let job = unsafe { Job::new(&plan, &files, &arena, &budget, &cancel, config) };
        let state = RunState::new(&job);
        while state.next_read(&job, 0).is_some() {}
        let stats = run_workers_reading_ahead(&job, &state, 1, |_| IoStats::default());
        let advised: u64 = stats.iter().map(|s| s.bytes_advised_beyond_reads).sum();
        assert_eq!(advised, 0, "the workers claimed every read before the helper advised any");

        let advised_with = |claimed_first: usize| {
            let state = RunState::new(&job);
            for _ in 0..claimed_first {
                state.next_read(&job, 0).unwrap();
            }
            let queues = file_queues(&job, &state, Some(PAGES));
            let ahead: Vec<&dyn AheadQueue> = queues.iter().map(|q| q as &dyn AheadQueue).collect();
            read_ahead(&ahead, &AtomicBool::new(false));
            queues.iter().map(FileQueue::advised_beyond_bytes).sum::<u64>()
        };
        // The helper ahead of the workers, or past the first read only: it advises the second
        // read from the first one's end, the gap included.
        assert_eq!(advised_with(0), GAP_BYTES);
        assert_eq!(advised_with(1), GAP_BYTES);
        // The workers past both reads: nothing advised.
        assert_eq!(advised_with(2), 0);
    }

    #[test]
    fn the_helper_advises_each_read_alone_or_widened_over_what_the_device_reads_along() {
        let read = |offset_bytes, len_bytes| Read {
            file: 0,
            offset_bytes,
            len_bytes,
            arena_offset_bytes: 0,
            pieces: 0..0,
        };
        let reads = [read(0, 1024), read(4096, 1024)];
        assert_eq!(ahead_ranges(None, &reads), [0..1024, 4096..5120]);
        let pages = DeviceCost { granule_bytes: 4096, request_cost_bytes: 8192 };
        assert_eq!(ahead_ranges(Some(pages), &reads), [0..1024, 1024..5120]);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        #[test]
        fn direct_alignment_requires_all_three(
            ptr in 0usize..1 << 20,
            off in 0u64..1 << 20,
            len in 0u64..1 << 20,
        ) {
            let align = 4096;
            let ok = direct_aligned(ptr as *const u8, off, len, align);
            prop_assert_eq!(ok, ptr % 4096 == 0 && off % 4096 == 0 && len % 4096 == 0);
        }
    }
}
