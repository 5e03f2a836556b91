//! Filling a cold file's page cache in 2 MiB folios ahead of the buffered copies that read it
//! ([`Reading::PopulateAhead`](crate::Reading::PopulateAhead)).
//!
//! Per file queue of a job, one populator thread maps the file read-only (`PROT_READ`, never
//! written: it holds no anonymous memory), advises `MADV_HUGEPAGE`, and reads each read's range in
//! with `MADV_POPULATE_READ` ([`populate_one`], the one populate call), in the queue's order, in
//! steps of at most [`FILL_STEP_BYTES`] that end on [`HUGE_FOLIO_BYTES`] boundaries, never more
//! than [`READAHEAD_LEAD_BYTES`] (shared by the queues) ahead of the workers' claims. After each
//! read it raises the queue's mark ([`FillMarks`]); a worker copies a read (`pread`) only once the
//! mark covers it, so the page cache is filled by the populators in large folios and the copies
//! find it there. A populator that fails, meets a kernel without the advice, or sees the run stop
//! or the caller cancel marks its queue done: the workers then read the bytes themselves (a failed
//! populate is not an error of the load; the `pread` reports its own). A worker waits at most
//! [`FILL_WAIT_MAX`] for a mark, then reads anyway. The mappings are unmapped when the run ends.
//!
//! Why: where free memory is not reported to a hypervisor, this fill keeps every page at 0.97x the
//! `O_DIRECT` roofline against 0.75x for 4 KiB `WILLNEED` read-ahead (docs/performance.md
//! "Restarts"); where it is reported, the first touch of each reported 2 MiB block costs more than
//! the large folios save, so `auto` keeps [`Reading::ReadAhead`](crate::Reading::ReadAhead) there.

use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use super::populate::{Span, populate_one};
use super::readahead::{READAHEAD_LEAD_BYTES, READAHEAD_WAIT};

/// Bytes one populate call covers at most (progress, stop and cancel are checked between steps).
pub const FILL_STEP_BYTES: u64 = 8 << 20;
/// The large folio a `MADV_HUGEPAGE` file mapping is filled with: steps end on its boundaries.
pub const HUGE_FOLIO_BYTES: u64 = 2 << 20;
/// Longest a worker waits for its read's range to be populated before reading it anyway.
pub const FILL_WAIT_MAX: Duration = Duration::from_secs(30);

/// A queue's mark once its populator has stopped (finished, failed, stopped or cancelled).
const MARK_DONE: usize = usize::MAX;

/// How far each file queue has been populated: the reads of the queue (in its order) wholly read
/// in, or done. Workers wait on it; populators raise it.
#[derive(Debug)]
pub(crate) struct FillMarks {
    marks: Mutex<Vec<usize>>,
    raised: Condvar,
}

/// How a worker's wait for a mark ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Waited {
    /// The read's range is populated.
    Populated,
    /// The populator stopped before it: the worker reads the bytes itself.
    PopulatorDone,
    /// [`FILL_WAIT_MAX`] passed: the worker reads the bytes itself.
    TimedOut,
}

impl FillMarks {
    pub(crate) fn new(queues: usize) -> FillMarks {
        FillMarks { marks: Mutex::new(vec![0; queues]), raised: Condvar::new() }
    }

    fn set(&self, queue: usize, mark: usize) {
        let mut marks = self.marks.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(m) = marks.get_mut(queue) {
            *m = mark;
        }
        drop(marks);
        self.raised.notify_all();
    }

    /// Reads `0..populated` of `queue` are populated.
    pub(crate) fn raise(&self, queue: usize, populated: usize) {
        self.set(queue, populated);
    }

    /// The populator of `queue` stopped: its workers wait no more.
    pub(crate) fn finish(&self, queue: usize) {
        self.set(queue, MARK_DONE);
    }

    /// Every populator stopped (the run ends).
    pub(crate) fn finish_all(&self) {
        let mut marks = self.marks.lock().unwrap_or_else(|e| e.into_inner());
        marks.iter_mut().for_each(|m| *m = MARK_DONE);
        drop(marks);
        self.raised.notify_all();
    }

    /// Waits until read `position` of `queue` is populated, its populator stopped, or
    /// [`FILL_WAIT_MAX`] passed.
    pub(crate) fn wait_for(&self, queue: usize, position: usize) -> Waited {
        let deadline = Instant::now() + FILL_WAIT_MAX;
        let mut marks = self.marks.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            match marks.get(queue).copied().unwrap_or(MARK_DONE) {
                MARK_DONE => return Waited::PopulatorDone,
                m if m > position => return Waited::Populated,
                _ => {}
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Waited::TimedOut;
            }
            marks = self.raised.wait_timeout(marks, left).unwrap_or_else(|e| e.into_inner()).0;
        }
    }
}

/// Reads a file range into the page cache: the real one populates a `MADV_HUGEPAGE` mapping;
/// tests slow it down or fail it. `Ok(false)`: the kernel lacks the advice (nothing was read).
pub(crate) trait Populator: Sync {
    /// Read `range` of queue `queue`'s file in.
    fn populate(&self, queue: usize, range: Range<u64>) -> io::Result<bool>;
}

/// One file queue, as its populator sees it.
pub(crate) struct FillQueue<'a> {
    /// The range each read of the queue is populated over, in the queue's order.
    pub(crate) ranges: Vec<Range<u64>>,
    /// How many reads of the queue the workers have claimed (they claim in order).
    pub(crate) claimed: &'a (dyn Fn() -> usize + Sync),
}

/// The run-wide signals a populator stops on.
pub(crate) struct FillStop<'a> {
    /// The workers returned.
    pub(crate) done: &'a AtomicBool,
    /// A worker failed the run.
    pub(crate) failed: &'a AtomicBool,
    /// The caller cancelled the load.
    pub(crate) cancel: &'a AtomicBool,
}

impl FillStop<'_> {
    fn now(&self) -> bool {
        [self.done, self.failed, self.cancel].iter().any(|f| f.load(Ordering::Acquire))
    }
}

/// The populator of queue `index` (see the module docs): reads its ranges in, in order, raising
/// the queue's mark after each, within `lead_bytes` of the workers' claims; marks the queue done
/// when it ends, whatever ended it.
pub(crate) fn fill_queue(
    index: usize,
    queue: &FillQueue<'_>,
    populator: &dyn Populator,
    marks: &FillMarks,
    stop: &FillStop<'_>,
    lead_bytes: u64,
) {
    // Byte position of each read's start in the queue (prefix sums), for the lead.
    let mut starts = Vec::with_capacity(queue.ranges.len() + 1);
    let mut at = 0u64;
    starts.push(0);
    for r in &queue.ranges {
        at = at.saturating_add(r.end.saturating_sub(r.start));
        starts.push(at);
    }
    'reads: for (position, range) in queue.ranges.iter().enumerate() {
        // Within the lead of the claims: wait (bounded by the run's end) while too far ahead.
        while starts[position] >= starts[(queue.claimed)().min(position)].saturating_add(lead_bytes) {
            if stop.now() {
                break 'reads;
            }
            std::thread::sleep(READAHEAD_WAIT);
        }
        let mut from = range.start;
        while from < range.end {
            if stop.now() {
                break 'reads;
            }
            let to = fill_step_end(from, range.end);
            match populator.populate(index, from..to) {
                Ok(true) => from = to,
                // No MADV_POPULATE_READ, or a failed populate: the workers read the bytes
                // themselves and report their own errors.
                Ok(false) | Err(_) => break 'reads,
            }
        }
        marks.raise(index, position + 1);
    }
    marks.finish(index);
}

/// Where a populate step from `from` ends: at most [`FILL_STEP_BYTES`] on, on a
/// [`HUGE_FOLIO_BYTES`] boundary, or at `end`.
fn fill_step_end(from: u64, end: u64) -> u64 {
    let aligned = from - from % HUGE_FOLIO_BYTES;
    aligned.saturating_add(FILL_STEP_BYTES).min(end)
}

/// The lead each of `queues` populators may run ahead of its claims ([`READAHEAD_LEAD_BYTES`]
/// shared, at least one step).
pub(crate) fn lead_bytes_per_queue(queues: usize) -> u64 {
    (READAHEAD_LEAD_BYTES / queues.max(1) as u64).max(FILL_STEP_BYTES)
}

/// The real populator: each queue's file mapped read-only with `MADV_HUGEPAGE`. A file that
/// cannot be mapped (empty, or `mmap` refused) has no mapping; its queue is read by the workers.
pub(crate) struct HugeMaps {
    maps: Vec<Option<memmap2::Mmap>>,
}

impl HugeMaps {
    /// Maps `files` (one per queue; `None`: none to map).
    pub(crate) fn new(files: &[Option<&std::fs::File>]) -> HugeMaps {
        let maps = files
            .iter()
            .map(|f| {
                let f = (*f)?;
                // SAFETY: the mapping is never read through: only `MADV_POPULATE_READ` touches
                // it, which reports a page past the end of a truncated file as `EFAULT` instead
                // of raising SIGBUS; it is read-only (`PROT_READ`): it never writes the file and
                // holds no anonymous memory.
                let map = unsafe { memmap2::MmapOptions::new().map(f) }.ok()?;
                // Advice only: a kernel without transparent hugepages fills 4 KiB folios.
                let _ = map.advise(memmap2::Advice::HugePage);
                Some(map)
            })
            .collect();
        HugeMaps { maps }
    }
}

impl Populator for HugeMaps {
    fn populate(&self, queue: usize, range: Range<u64>) -> io::Result<bool> {
        let Some(map) = self.maps.get(queue).and_then(Option::as_ref) else {
            return Ok(false);
        };
        let end = usize::try_from(range.end).unwrap_or(usize::MAX).min(map.len());
        let start = usize::try_from(range.start).unwrap_or(usize::MAX).min(end);
        let span = Span { addr: map.as_ptr() as usize + start, len_bytes: end - start };
        // SAFETY: the span lies inside `map`, which is live for the call (mappings start on a
        // page boundary, so its rounded-down start does too).
        unsafe { populate_one(span) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_end_on_huge_folio_boundaries_within_the_step() {
        assert_eq!(fill_step_end(0, 100 << 20), FILL_STEP_BYTES);
        assert_eq!(fill_step_end(4096, 100 << 20), FILL_STEP_BYTES);
        assert_eq!(fill_step_end((2 << 20) + 5, 100 << 20), (2 << 20) + FILL_STEP_BYTES);
        assert_eq!(fill_step_end(0, 5000), 5000);
    }

    #[test]
    fn a_wait_ends_when_the_mark_passes_or_the_populator_is_done() {
        let marks = FillMarks::new(2);
        marks.raise(0, 3);
        assert_eq!(marks.wait_for(0, 2), Waited::Populated);
        marks.finish(1);
        assert_eq!(marks.wait_for(1, 7), Waited::PopulatorDone);
        std::thread::scope(|s| {
            let waiter = s.spawn(|| marks.wait_for(0, 5));
            std::thread::sleep(Duration::from_millis(20));
            marks.raise(0, 6);
            assert_eq!(waiter.join().unwrap(), Waited::Populated);
        });
        marks.finish_all();
        assert_eq!(marks.wait_for(0, usize::MAX - 1), Waited::PopulatorDone);
    }

    #[test]
    fn the_real_populator_reads_a_cold_file_in_and_one_not_mapped_is_left_to_the_workers() {
        use std::io::Write;
        let len_bytes: u64 = 3 << 20;
        let mut tmp = tempfile::NamedTempFile::new().unwrap();
        tmp.write_all(&vec![7u8; len_bytes as usize]).unwrap();
        tmp.as_file().sync_all().unwrap();
        tensora_sys::evict_file_cache(tmp.as_file()).unwrap();
        let file = std::fs::File::open(tmp.path()).unwrap();
        let empty = tempfile::tempfile().unwrap();
        let maps = HugeMaps::new(&[Some(&file), None, Some(&empty)]);
        assert!(maps.populate(0, 4096..len_bytes).unwrap(), "MADV_POPULATE_READ (Linux 5.14+)");
        // Populated, not advised: every page is cached when the call returns.
        let s = crate::auto::probe::residency_sample(&file, len_bytes).unwrap();
        assert_eq!(s.resident_pages, s.sampled_pages, "{s:?}");
        assert!(!maps.populate(1, 0..4096).unwrap(), "no mapping: the workers read it");
        // An empty file's range is empty: nothing to read in.
        assert!(maps.populate(2, 0..4096).unwrap());
    }
}
