//! The cache's copying writers, for the ranges an open fetches (headers, indexes) and a load's
//! ranges when no lane thread could start (a load's ranges take the lane, `lane.rs`, which needs
//! no copy): a range is copied into a buffer of a bounded pool and written into its object's copy
//! by one of [`WRITER_THREADS`] threads, so that the threads driving the connections never wait
//! for the disk. At most [`WRITE_BEHIND_BYTES`] of copies are queued or being written at once; a
//! range that would pass that waits (asynchronously) for room, so a disk slower than the network
//! slows the fetches rather than growing memory. The threads keep draining after the operation
//! has returned ([`super::CacheSync`] joins them, then promotes).

use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::Entry;
use super::entry::DIRECT_ALIGN_BYTES;

/// Threads writing ranges into the cache.
pub const WRITER_THREADS: usize = 2;
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
    /// One line per range that could not be written (the copy then stays partial).
    pub failed: Vec<String>,
}

/// Lines of [`Tally::failed`] kept, at most (a failing disk fails every range).
const FAILED_LINES_MAX: usize = 16;

/// One copied range on its way to the disk; its permit returns its room to the budget once
/// written.
struct Job {
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
    jobs: Sender<Job>,
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

impl Job {
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

fn writer_loop(jobs: &Mutex<Receiver<Job>>, tally: &Mutex<Tally>, spare: &Mutex<Vec<Vec<u8>>>) {
    loop {
        let job = jobs.lock().unwrap_or_else(|p| p.into_inner()).recv();
        match job {
            Ok(job) => job.run(tally, spare),
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
        let job = Job {
            entry,
            url: url.to_owned(),
            offset_bytes,
            crc32c,
            buf: copy,
            start,
            len: bytes.len(),
            _permit: permit,
        };
        let refused = {
            let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
            if running.is_none() {
                *running = self.start();
            }
            match running.as_ref() {
                Some(r) => r.jobs.send(job).err().map(|e| e.0),
                None => Some(job),
            }
        };
        // No thread could be started (or they are gone): write on this one.
        if let Some(job) = refused {
            job.run(&self.tally, &self.spare);
        }
    }

    /// The threads and their channel; `None` if not even one thread starts.
    fn start(&self) -> Option<Running> {
        let (jobs, receiver) = std::sync::mpsc::channel::<Job>();
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
        Closed { threads, tally: Arc::clone(&self.tally) }
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
}

impl Closed {
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
