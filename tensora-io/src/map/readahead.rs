//! Reading a cold file into the page cache ahead of the threads that consume it, so that buffered
//! reads and `MADV_POPULATE_READ` find their pages cached or in flight and the device sees a deep
//! queue, while every byte still goes through the page cache (kept for the next process).
//!
//! One helper thread walks each consumer queue's pieces in the order they are claimed and asks the
//! kernel to read them (`POSIX_FADV_WILLNEED` on a descriptor, `MADV_WILLNEED` on a mapping) in
//! steps of [`READAHEAD_STEP_BYTES`], never more than [`READAHEAD_LEAD_BYTES`] (shared by the
//! queues) ahead of what the consumers have claimed. The advice starts the reads and returns
//! without waiting for them. Linux reads at most `max(read_ahead_kb, max_sectors_kb)` per call
//! (`force_page_cache_ra`): one call over a whole file reads only its first few MiB, hence the
//! steps. Advice is a hint: a failed call only costs read-ahead, the consumers read the bytes
//! themselves.
//!
//! Measured on the cold 2.2 GB bench checkpoint (2 files, the 2-core machine shared with five
//! builds, load average 14), two runs each: two threads of sequential 8 MiB `pread` 11.7 and
//! 19.6 s, the same with `WILLNEED` in 8 MiB steps ahead of them 2.7 and 1.4 s, and with one
//! `WILLNEED` per 64 MiB (capped by the kernel to its first 8 MiB) 6.6 and 4.8 s; two threads of
//! `MADV_POPULATE_READ` 1.9 and 1.9 s. Loads: docs/performance.md "Restarts".

use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Bytes one advice call asks for. At most the smallest per-call cap Linux applies on common
/// devices (`max_sectors_kb`, 512 KiB and more on NVMe and virtio disks; `read_ahead_kb` 128 KiB
/// by default), so every call is read whole where that cap is 2 MiB or more.
pub const READAHEAD_STEP_BYTES: u64 = 2 << 20;
/// How far ahead of the consumers' claims the helper reads at most, over all queues together
/// (each queue gets an equal share, at least one step).
pub const READAHEAD_LEAD_BYTES: u64 = 512 << 20;
/// How long the helper sleeps when every queue is as far ahead as it may be.
pub const READAHEAD_WAIT: Duration = Duration::from_millis(1);

/// One consumer queue, as the read-ahead helper sees it.
pub(crate) trait AheadQueue: Sync {
    /// The queue's pieces, in the order consumers claim them: their lengths in bytes.
    fn piece_lens(&self) -> &[u64];
    /// How many pieces consumers have claimed so far (they claim in order).
    fn claimed(&self) -> usize;
    /// Ask the kernel to read `len_bytes` of piece `piece` from `offset_bytes` into it.
    fn advise(&self, piece: usize, offset_bytes: u64, len_bytes: u64);
}

/// The helper's position in one queue.
struct Cursor {
    /// Byte position of each piece's start in the queue (prefix sums), and the total at the end.
    starts: Vec<u64>,
    piece: usize,
    offset_bytes: u64,
}

impl Cursor {
    fn new(lens: &[u64]) -> Cursor {
        let mut starts = Vec::with_capacity(lens.len() + 1);
        let mut at = 0u64;
        starts.push(0);
        for &l in lens {
            at = at.saturating_add(l);
            starts.push(at);
        }
        Cursor { starts, piece: 0, offset_bytes: 0 }
    }

    fn done(&self) -> bool {
        self.piece + 1 >= self.starts.len()
    }
}

/// Read ahead of the consumers of `queues` (see the module docs) until every piece has been
/// advised or `stop` is set. Each pass either advises one step of a queue or, when none may
/// advance, sleeps [`READAHEAD_WAIT`]; so it ends at most one wait after `stop` is set.
pub(crate) fn read_ahead(queues: &[&dyn AheadQueue], stop: &AtomicBool) {
    let lead_bytes = (READAHEAD_LEAD_BYTES / queues.len().max(1) as u64).max(READAHEAD_STEP_BYTES);
    let mut cursors: Vec<Cursor> = queues.iter().map(|q| Cursor::new(q.piece_lens())).collect();
    while !stop.load(Ordering::Acquire) {
        let mut advanced = false;
        for (q, c) in queues.iter().zip(&mut cursors) {
            if c.done() {
                continue;
            }
            let claimed = q.claimed().min(c.starts.len() - 1);
            if c.piece < claimed {
                // The consumers are past this point: read from where they are.
                (c.piece, c.offset_bytes) = (claimed, 0);
                if c.done() {
                    continue;
                }
            }
            let at = c.starts[c.piece] + c.offset_bytes;
            if at >= c.starts[claimed].saturating_add(lead_bytes) {
                continue;
            }
            let piece_len = c.starts[c.piece + 1] - c.starts[c.piece];
            let len = READAHEAD_STEP_BYTES.min(piece_len - c.offset_bytes);
            if len > 0 {
                q.advise(c.piece, c.offset_bytes, len);
            }
            c.offset_bytes += len;
            if c.offset_bytes >= piece_len {
                (c.piece, c.offset_bytes) = (c.piece + 1, 0);
            }
            advanced = true;
        }
        if cursors.iter().all(Cursor::done) {
            return;
        }
        if !advanced {
            std::thread::sleep(READAHEAD_WAIT);
        }
    }
}

/// Files being read into the page cache by a thread of their own, start to end in steps of
/// `READAHEAD_STEP_BYTES` (2 MiB) (for callers that fault pages in on demand, such as HF's `safe_open`:
/// their faults then find the pages cached or in flight). Bounded by the files' lengths; the
/// device's request queue paces the thread. Dropping it stops the thread after its current step
/// and joins it. Start it only when the pages fit (`Prefetch::if_cold` asks `auto`).
#[derive(Debug)]
pub struct Prefetch {
    stop: std::sync::Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Prefetch {
    /// Start reading `files` (each with its length in bytes) into the page cache, in order.
    pub fn start(files: Vec<(std::fs::File, u64)>) -> std::io::Result<Prefetch> {
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let flag = std::sync::Arc::clone(&stop);
        let thread = std::thread::Builder::new().name("tensora-prefetch".to_owned()).spawn(move || {
            for (file, len_bytes) in &files {
                let mut at = 0;
                while at < *len_bytes {
                    if flag.load(Ordering::Acquire) {
                        return;
                    }
                    let len = READAHEAD_STEP_BYTES.min(len_bytes - at);
                    willneed_file(file, at, len);
                    at += len;
                }
            }
        })?;
        Ok(Prefetch { stop, thread: Some(thread) })
    }

    /// Start reading `ckpt`'s files (open as `files`, in the checkpoint's order) into the page
    /// cache when `auto`'s rule says so (`auto::read_ahead_at_open`: cold, local, the
    /// pages fit), for a caller that maps the files and faults their pages in on demand. `None`
    /// otherwise, or when a descriptor or the thread cannot be had (read-ahead is only a hint).
    pub fn if_cold(ckpt: &tensora_format::Checkpoint, files: &[std::fs::File]) -> Option<Prefetch> {
        use crate::auto::{Asked, Delivery, gather, read_ahead_at_open};
        let all: Vec<usize> = (0..ckpt.tensors().len()).collect();
        // SAFETY: only `gather` sees this promise (the facts of a mapped load of everything),
        // and gathering maps nothing; the caller's own views rest on the caller's promise.
        let promise = unsafe { crate::FilesUnchanged::promise() };
        let asked = Asked {
            delivery: Delivery::Owned,
            residence: crate::Residence::Mapped(promise),
            io_mode: crate::IoMode::Auto,
            budget_bytes: 0,
            pieces: crate::auto::Pieces::WholeTensors,
        };
        read_ahead_at_open(&gather(ckpt, &all, asked)).ok()?;
        let mut own = Vec::with_capacity(files.len());
        for (f, entry) in files.iter().zip(ckpt.files()) {
            own.push((f.try_clone().ok()?, entry.len_bytes()));
        }
        Prefetch::start(own).ok()
    }

    /// Whether the thread has advised every step (or stopped).
    pub fn finished(&self) -> bool {
        self.thread.as_ref().is_none_or(std::thread::JoinHandle::is_finished)
    }
}

impl Drop for Prefetch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            // A panic in the helper cost only read-ahead; nothing to hand on.
            let _ = t.join();
        }
    }
}

/// `posix_fadvise(POSIX_FADV_WILLNEED)` over `len_bytes` of `file` at `offset_bytes`: start
/// reading them into the page cache. A hint: errors are ignored.
pub(crate) fn willneed_file(file: &std::fs::File, offset_bytes: u64, len_bytes: u64) {
    let (Ok(offset), Ok(len)) = (libc::off_t::try_from(offset_bytes), libc::off_t::try_from(len_bytes))
    else {
        return;
    };
    // SAFETY: posix_fadvise only reads the descriptor's file into the page cache; it touches no
    // memory of this process, and `file` keeps the descriptor open for the call.
    let _ = unsafe { libc::posix_fadvise(file.as_raw_fd(), offset, len, libc::POSIX_FADV_WILLNEED) };
}

/// `madvise(MADV_WILLNEED)` over `len_bytes` of mapped memory at `addr` (its start rounded down to
/// a page): start reading the file pages behind it. A hint: errors are ignored.
///
/// # Safety
/// The range, from its rounded-down start, lies inside one live file mapping of this process.
pub(crate) unsafe fn willneed_mapped(addr: usize, len_bytes: usize) {
    let page = super::page_size_bytes() as usize;
    let start = addr & !(page - 1);
    // SAFETY: the caller guarantees the range is mapped; MADV_WILLNEED only schedules reads of
    // the file behind it and changes no memory.
    let _ =
        unsafe { libc::madvise(start as *mut libc::c_void, len_bytes + (addr - start), libc::MADV_WILLNEED) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use std::sync::atomic::AtomicUsize;

    /// A queue whose consumers claim what the test says, recording every advice.
    struct Fake {
        lens: Vec<u64>,
        claimed: AtomicUsize,
        advised: Mutex<Vec<(usize, u64, u64)>>,
        /// How many times the helper asked how far the consumers are (once per pass).
        polls: AtomicUsize,
    }

    impl AheadQueue for Fake {
        fn piece_lens(&self) -> &[u64] {
            &self.lens
        }
        fn claimed(&self) -> usize {
            self.polls.fetch_add(1, Ordering::Relaxed);
            self.claimed.load(Ordering::Relaxed)
        }
        fn advise(&self, piece: usize, offset_bytes: u64, len_bytes: u64) {
            self.advised.lock().unwrap().push((piece, offset_bytes, len_bytes));
        }
    }

    fn fake(lens: &[u64], claimed: usize) -> Fake {
        Fake {
            lens: lens.to_vec(),
            claimed: AtomicUsize::new(claimed),
            advised: Mutex::new(Vec::new()),
            polls: AtomicUsize::new(0),
        }
    }

    #[test]
    fn every_byte_is_advised_once_in_steps_when_the_lead_allows() {
        let step = READAHEAD_STEP_BYTES;
        let q = fake(&[step * 2 + 5, 0, step - 1], 0);
        let stop = AtomicBool::new(false);
        read_ahead(&[&q], &stop);
        let advised = q.advised.lock().unwrap().clone();
        assert_eq!(advised, vec![(0, 0, step), (0, step, step), (0, 2 * step, 5), (2, 0, step - 1)]);
    }

    #[test]
    fn the_helper_skips_what_consumers_claimed_and_stays_within_its_lead() {
        let step = READAHEAD_STEP_BYTES;
        let pieces = (READAHEAD_LEAD_BYTES / step) as usize * 2;
        let q = fake(&vec![step; pieces], 3);
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            let h = s.spawn(|| read_ahead(&[&q], &stop));
            // The helper stops at the lead: pieces 3 .. 3 + lead/step, then waits.
            let want = (READAHEAD_LEAD_BYTES / step) as usize;
            // One pass per step of the lead, then at least two that found it may not advance.
            let waiting = poll_until(|| q.polls.load(Ordering::Relaxed) >= want + 2);
            let first: Vec<usize> = q.advised.lock().unwrap().iter().map(|a| a.0).collect();
            // Consumers move on: the helper follows to the end (released before any assert, so
            // a failure ends the scope instead of hanging it).
            q.claimed.store(pieces, Ordering::Relaxed);
            assert!(waiting, "the helper did not reach its lead in {TEST_WAIT_MAX:?}");
            assert_eq!(first, (3..3 + want).collect::<Vec<_>>());
            h.join().unwrap();
        });
        let n = q.advised.lock().unwrap().len();
        assert_eq!(n as u64, READAHEAD_LEAD_BYTES / step, "nothing the consumers claimed is advised");
    }

    /// How long a test waits for the helper to reach a state before it fails: far beyond what an
    /// idle machine needs (well under a millisecond), so only a broken helper runs into it.
    const TEST_WAIT_MAX: Duration = Duration::from_secs(10);

    /// Poll `done` every millisecond until it holds or [`TEST_WAIT_MAX`] has passed; whether it held.
    fn poll_until(done: impl Fn() -> bool) -> bool {
        let deadline = std::time::Instant::now() + TEST_WAIT_MAX;
        while !done() {
            if std::time::Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        true
    }

    #[test]
    fn stop_ends_a_waiting_helper() {
        use std::sync::Arc;
        let lead_steps = (READAHEAD_LEAD_BYTES / READAHEAD_STEP_BYTES) as usize;
        let q = Arc::new(fake(&vec![READAHEAD_STEP_BYTES; lead_steps + 8], 0));
        let stop = Arc::new(AtomicBool::new(false));
        // Not a scoped thread: a helper that never stops fails the test instead of hanging it.
        let h = std::thread::spawn({
            let (q, stop) = (Arc::clone(&q), Arc::clone(&stop));
            move || read_ahead(&[&*q as &dyn AheadQueue], &stop)
        });
        // The helper looks at the claims once per pass: one pass per step of the lead, then at
        // least two that found it may not advance (it is waiting, not on its way).
        let waiting = poll_until(|| q.polls.load(Ordering::Relaxed) >= lead_steps + 2);
        stop.store(true, Ordering::Release);
        assert!(waiting, "the helper did not reach its lead in {TEST_WAIT_MAX:?}");
        assert!(poll_until(|| h.is_finished()), "the helper did not stop in {TEST_WAIT_MAX:?}");
        h.join().unwrap();
        let n = q.advised.lock().unwrap().len();
        assert_eq!(n, lead_steps, "exactly the lead, then a stop");
    }

    #[test]
    fn prefetch_reads_whole_files_into_the_page_cache_and_stops_when_dropped() {
        use std::io::Write;
        let mut tmp = tempfile::NamedTempFile::new().unwrap();
        let len_bytes = 3 * READAHEAD_STEP_BYTES + 4096;
        tmp.write_all(&vec![5u8; len_bytes as usize]).unwrap();
        tmp.as_file().sync_all().unwrap();
        tensora_sys::evict_file_cache(tmp.as_file()).unwrap();
        let p = Prefetch::start(vec![(std::fs::File::open(tmp.path()).unwrap(), len_bytes)]).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !p.finished() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
        assert!(p.finished());
        drop(p);
        let file = std::fs::File::open(tmp.path()).unwrap();
        loop {
            let s = crate::auto::probe::residency_sample(&file, len_bytes).unwrap();
            if s.resident_pages == s.sampled_pages || std::time::Instant::now() > deadline {
                assert_eq!(s.resident_pages, s.sampled_pages, "{s:?}");
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        // Dropped at once, a prefetch of a long file stops early and joins.
        let p = Prefetch::start(vec![(std::fs::File::open(tmp.path()).unwrap(), u64::MAX / 2)]).unwrap();
        drop(p);
    }

    #[test]
    fn willneed_reads_a_file_into_the_page_cache() {
        use std::io::Write;
        let mut tmp = tempfile::NamedTempFile::new().unwrap();
        tmp.write_all(&vec![3u8; 4 << 20]).unwrap();
        tmp.as_file().sync_all().unwrap();
        tensora_sys::evict_file_cache(tmp.as_file()).unwrap();
        let file = std::fs::File::open(tmp.path()).unwrap();
        willneed_file(&file, 0, 4 << 20);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let s = crate::auto::probe::residency_sample(&file, 4 << 20).unwrap();
            if s.resident_pages == s.sampled_pages || std::time::Instant::now() > deadline {
                assert_eq!(s.resident_pages, s.sampled_pages, "{s:?}");
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}
