//! The cache's writers: [`WRITER_THREADS`] threads, at idle priority, that write into the
//! copies what the threads driving the connections hand them, so that those never wait for the
//! disk. Two kinds of work:
//!
//! - a copied range: the ranges an open fetches (headers, indexes), and a load's ranges when
//!   neither of the other ways applies, are copied into a buffer of a bounded pool: at most
//!   [`WRITE_BEHIND_BYTES`] of copies are queued or being written at once, and a range that
//!   would pass that waits (asynchronously) for room, so a disk slower than the network slows the
//!   fetches rather than growing memory;
//! - a held piece ([`tensora_io::HeldPiece`]): a piece of an owned load's arena, which the load
//!   landed at once and which is written after (or while) the load returns, and recorded with
//!   the CRC-32C the writer took from the memory just before, while the load's caller could not
//!   change it; a piece sealed before its write ended is read back instead, and recorded only if
//!   the disk holds what arrived (the caller may change the bytes once it owns them, see
//!   [`super::seal`]). No copy and no budget: the queue holds at most one item per
//!   [`super::PIECE_BYTES`] of the load's arena, which the pieces keep mapped until written.
//!
//! The threads run at `SCHED_IDLE` (where the system allows it): while the load's threads or the
//! caller's keep the cores busy, the writes wait. They keep draining after the operation has
//! returned ([`super::CacheSync`] joins them, then promotes).

use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use tensora_io::HeldPiece;

use super::Entry;
use super::entry::{Checked, DIRECT_ALIGN_BYTES};
use super::seal::{Seal, Seals};

/// Threads writing ranges into the cache (each with one write, or read-back of a sealed piece,
/// on the disk at a time).
pub const WRITER_THREADS: usize = 4;
/// Bytes of copied ranges queued or being written at once, at most.
pub const WRITE_BEHIND_BYTES: usize = 128 << 20;
/// The budget's unit: a range holds its length rounded up to this (a range longer than the whole
/// budget holds all of it).
const UNIT_BYTES: usize = 64 << 10;
/// The budget in units.
const BUDGET_UNITS: usize = WRITE_BEHIND_BYTES / UNIT_BYTES;

/// What the writers did.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    pub written_bytes: u64,
    /// Bytes of sealed held pieces that the disk did not hold as sealed once written (the load's
    /// caller changed them first): left out of the copy.
    pub changed_bytes: u64,
    /// One line per range that could not be written (the copy then stays partial).
    pub failed: Vec<String>,
}

/// Lines of [`Tally::failed`] kept, at most (a failing disk fails every range).
const FAILED_LINES_MAX: usize = 16;

/// What a writer thread is given.
enum Work {
    Copied(Copied),
    Held(Held),
}

/// A held piece on its way to the disk.
struct Held {
    entry: Arc<Entry>,
    offset_bytes: u64,
    /// Whether the piece may be recorded as checksummed, or only after a read-back.
    seal: Arc<Seal>,
    piece: HeldPiece,
}

impl Held {
    /// Checksum the piece in memory, write it, and record it (if sealed meanwhile: only if the
    /// disk holds what arrived); `scratch` is the thread's read-back buffer.
    fn run(self, tally: &Mutex<Tally>, scratch: &mut Vec<u8>) {
        let len = self.piece.len_bytes();
        let url = &self.entry.description.url;
        self.seal.checksum(&self.piece);
        match self.entry.write_held(self.offset_bytes, &self.piece, scratch, || self.seal.after_write()) {
            Ok(Checked::Recorded) => count(tally, url, len, Ok(())),
            Ok(Checked::Changed) => {
                tally.lock().unwrap_or_else(|p| p.into_inner()).changed_bytes += len as u64;
            }
            Err(e) => count(tally, url, len, Err(e)),
        }
    }
}

/// One copied range on its way to the disk; its permit returns its room to the budget once
/// written.
struct Copied {
    entry: Arc<Entry>,
    url: String,
    offset_bytes: u64,
    /// The range's CRC-32C, computed as it was fetched.
    crc32c: u32,
    /// The range is `buf[start..start + len]`, placed so that its address has the same offset
    /// within a page as `offset_bytes` (see [`place`]).
    buf: Vec<u8>,
    start: usize,
    len: usize,
    _permit: OwnedSemaphorePermit,
}

/// Copy `bytes` (going to `offset_bytes` of a file) into `buf`, and return where in it the copy
/// starts: at an address with the same offset within a 4 KiB page as `offset_bytes`, so that the
/// whole pages in its middle can be written to the disk directly (`Entry::write`). Only the
/// padding before it (under a page) is filled besides the copy; a reused buffer keeps its
/// capacity (its memory is already faulted in).
fn place(buf: &mut Vec<u8>, offset_bytes: u64, bytes: &[u8]) -> usize {
    let page = DIRECT_ALIGN_BYTES;
    buf.clear();
    // Room for the padding and the copy: neither push below moves the buffer.
    buf.reserve(bytes.len() + page);
    let want = (offset_bytes % page as u64) as usize;
    let start = (want + page - buf.as_ptr() as usize % page) % page;
    buf.resize(start, 0);
    buf.extend_from_slice(bytes);
    start
}

/// The writer threads and their channel, once started.
struct Running {
    jobs: Sender<Work>,
    threads: Vec<JoinHandle<()>>,
}

/// A cache session's writers, started on its first write.
#[derive(Debug)]
pub(crate) struct Writers {
    running: Mutex<Option<Running>>,
    budget: Arc<Semaphore>,
    /// Written buffers kept for reuse (their memory is already faulted in), at most
    /// [`WRITE_BEHIND_BYTES`] of them.
    spare: Arc<Mutex<Vec<Vec<u8>>>>,
    tally: Arc<Mutex<Tally>>,
    /// The seals of the held pieces queued.
    seals: Arc<Seals>,
}

impl std::fmt::Debug for Running {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Running").field("threads", &self.threads.len()).finish()
    }
}

impl Default for Writers {
    fn default() -> Writers {
        Writers {
            running: Mutex::new(None),
            budget: Arc::new(Semaphore::new(BUDGET_UNITS)),
            spare: Arc::new(Mutex::new(Vec::new())),
            tally: Arc::new(Mutex::new(Tally::default())),
            seals: Arc::new(Seals::default()),
        }
    }
}

/// Count one range's write in `tally`.
fn count(tally: &Mutex<Tally>, url: &str, len: usize, written: std::io::Result<()>) {
    let mut tally = tally.lock().unwrap_or_else(|p| p.into_inner());
    match written {
        Ok(()) => tally.written_bytes += len as u64,
        Err(e) if tally.failed.len() < FAILED_LINES_MAX => {
            tally.failed.push(format!("{url}: writing the cache failed: {e}"));
        }
        Err(_) => {}
    }
}

impl Copied {
    fn run(self, tally: &Mutex<Tally>, spare: &Mutex<Vec<Vec<u8>>>) {
        let bytes = &self.buf[self.start..self.start + self.len];
        let written = self.entry.write(self.offset_bytes, bytes, self.crc32c);
        count(tally, &self.url, self.len, written);
        let mut spare = spare.lock().unwrap_or_else(|p| p.into_inner());
        let kept_bytes: usize = spare.iter().map(Vec::capacity).sum();
        if kept_bytes + self.buf.capacity() <= WRITE_BEHIND_BYTES {
            spare.push(self.buf);
        }
    }
}

impl Work {
    fn run(self, tally: &Mutex<Tally>, spare: &Mutex<Vec<Vec<u8>>>, scratch: &mut Vec<u8>) {
        match self {
            Work::Copied(c) => c.run(tally, spare),
            Work::Held(h) => h.run(tally, scratch),
        }
    }
}

fn writer_loop(jobs: &Mutex<Receiver<Work>>, tally: &Mutex<Tally>, spare: &Mutex<Vec<Vec<u8>>>) {
    // Refused (by a sandbox, say): the thread writes at normal priority.
    let _ = tensora_sys::idle_priority();
    // The read-back buffer of sealed held pieces, reused (a piece and two pages, at most).
    let mut scratch = Vec::new();
    loop {
        let job = jobs.lock().unwrap_or_else(|p| p.into_inner()).recv();
        match job {
            Ok(work) => work.run(tally, spare, &mut scratch),
            // Every sender is gone: the session closed, and the queue is drained.
            Err(_) => return,
        }
    }
}

impl Writers {
    /// Copy `bytes` (the range of `entry`'s object at `offset_bytes`) and queue it for a writer,
    /// waiting for room in the budget first. Once the session is closed the range is not
    /// written.
    pub async fn queue(&self, entry: Arc<Entry>, url: &str, offset_bytes: u64, bytes: &[u8], crc32c: u32) {
        let units = bytes.len().div_ceil(UNIT_BYTES).clamp(1, BUDGET_UNITS) as u32;
        let Ok(permit) = Arc::clone(&self.budget).acquire_many_owned(units).await else { return };
        let mut copy = self.spare.lock().unwrap_or_else(|p| p.into_inner()).pop().unwrap_or_default();
        let start = place(&mut copy, offset_bytes, bytes);
        let job = Copied {
            entry,
            url: url.to_owned(),
            offset_bytes,
            crc32c,
            buf: copy,
            start,
            len: bytes.len(),
            _permit: permit,
        };
        self.send(Work::Copied(job));
    }

    /// Queue a held piece of `entry`'s object at `offset_bytes` for a writer, with its seal (see
    /// [`Closed::seals`]). Once the session is closed the piece is not written.
    pub fn queue_held(&self, entry: Arc<Entry>, offset_bytes: u64, piece: HeldPiece) {
        let at = piece.offset_bytes() as u64;
        let seal = self.seals.add(at..at + piece.len_bytes() as u64);
        self.send(Work::Held(Held { entry, offset_bytes, seal, piece }));
    }

    /// Hand `work` to the threads, starting them first if needed; when none can start, do it on
    /// this thread. After [`Writers::close`], `work` is dropped: the threads it could go to are
    /// being joined, and the session's locks go with them.
    fn send(&self, work: Work) {
        let refused = {
            let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
            // `close` closes the budget before it takes the threads under this lock.
            if self.budget.is_closed() {
                return;
            }
            if running.is_none() {
                *running = self.start();
            }
            match running.as_ref() {
                Some(r) => r.jobs.send(work).err().map(|e| e.0),
                None => Some(work),
            }
        };
        // No thread could be started (or they are gone): write on this one.
        if let Some(work) = refused {
            work.run(&self.tally, &self.spare, &mut Vec::new());
        }
    }

    /// The threads and their channel; `None` if not even one thread starts.
    fn start(&self) -> Option<Running> {
        let (jobs, receiver) = std::sync::mpsc::channel::<Work>();
        let receiver = Arc::new(Mutex::new(receiver));
        let threads: Vec<JoinHandle<()>> = (0..WRITER_THREADS)
            .filter_map(|k| {
                let (receiver, tally, spare) =
                    (Arc::clone(&receiver), Arc::clone(&self.tally), Arc::clone(&self.spare));
                std::thread::Builder::new()
                    .name(format!("tensora-cache-write-{k}"))
                    .spawn(move || writer_loop(&receiver, &tally, &spare))
                    .ok()
            })
            .collect();
        (!threads.is_empty()).then_some(Running { jobs, threads })
    }

    /// Stop taking ranges: the threads finish what is queued and exit. What the caller joins.
    pub fn close(&self) -> Closed {
        self.budget.close();
        let running = self.running.lock().unwrap_or_else(|p| p.into_inner()).take();
        // Dropping the sender ends each thread's loop once the queue is empty.
        let threads = running.map(|r| r.threads).unwrap_or_default();
        Closed { threads, tally: Arc::clone(&self.tally), seals: Arc::clone(&self.seals) }
    }

    /// Count a range written elsewhere (the in-place lane) in what these writers report.
    pub fn record(&self, url: &str, len: usize, written: std::io::Result<()>) {
        count(&self.tally, url, len, written);
    }

    /// Bytes written so far.
    pub fn written_bytes(&self) -> u64 {
        self.tally.lock().unwrap_or_else(|p| p.into_inner()).written_bytes
    }
}

/// Closed writers, still draining.
pub(crate) struct Closed {
    threads: Vec<JoinHandle<()>>,
    tally: Arc<Mutex<Tally>>,
    seals: Arc<Seals>,
}

impl Closed {
    /// The seals of the held pieces: taken before the load's memory can change.
    pub fn seals(&self) -> Arc<Seals> {
        Arc::clone(&self.seals)
    }

    /// Whether nothing is left to wait for.
    pub fn is_idle(&self) -> bool {
        self.threads.is_empty()
    }

    /// Wait until every queued range is written; what the writers did in all.
    pub fn join(self) -> Tally {
        for thread in self.threads {
            thread.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        }
        std::mem::take(&mut *self.tally.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The copy is the bytes, at an address congruent to the file offset modulo a page,
        /// whatever buffer it reuses.
        #[test]
        fn a_copy_sits_where_direct_writes_need_it(
            offset in 0u64..1 << 40, len in 0usize..20_000, reused in 0usize..30_000,
        ) {
            let bytes: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let mut buf = vec![7u8; reused];
            let start = place(&mut buf, offset, &bytes);
            prop_assert_eq!(&buf[start..], &bytes[..]);
            prop_assert_eq!(buf[start..].as_ptr() as u64 % DIRECT_ALIGN_BYTES as u64, offset % DIRECT_ALIGN_BYTES as u64);
            prop_assert!(start < DIRECT_ALIGN_BYTES);
        }
    }
}
