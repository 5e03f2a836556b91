//! The `sync` backend: a bounded pool of scoped std threads doing positional reads (`pread`) into
//! the destination.
//!
//! Workers pull reads from the plan's per-file queues. Worker `w` starts on queue `w mod files`
//! (queue 0, the most urgent, under a priority order) and, when that queue runs dry, moves on to the
//! next queue with work, so several files stay busy at once and a single file is shared by all
//! workers (each read is positional, so there is no shared
//! cursor). Before a read is issued its bytes are acquired from the job's [`Budget`]; the permit is
//! released once the read has landed.
//!
//! Transient errors (`EINTR`, `EAGAIN`, short reads) are retried, at most `job.retries_max` times
//! per read; `EAGAIN` backs off for [`EAGAIN_BACKOFF_MAX`] at most. A read that hits end of file
//! before its planned end fails with [`ReadErrorKind::UnexpectedEof`]. With `job.direct`, reads
//! whose offset, length and destination address are block-aligned go through the `O_DIRECT`
//! descriptor; one that fails with `EINVAL` is re-issued buffered (counted in
//! [`IoStats::direct_fallbacks`]). The first error stops every worker before its next read and is
//! returned; nothing is in flight when [`IoBackend::execute`] returns.
//!
//! All reads go through a [`ReadAt`] layer ([`Pread`] by default) so that tests can inject faults
//! ([`crate::fault::FaultySource`]).

use std::fmt::Debug;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::backend::{CompletionSink, IoBackend, IoStats, Job, ReadError, ReadErrorKind, SourceFile};

/// Upper bound on worker threads, whatever the job asks.
pub const THREADS_MAX: usize = 256;
/// Longest single back-off after `EAGAIN`.
pub const EAGAIN_BACKOFF_MAX: Duration = Duration::from_millis(10);
/// Block size assumed for O_DIRECT eligibility (offset, length and address multiples of it).
pub const DIRECT_BLOCK_BYTES: u64 = 4096;

/// A positional read source: the seam that lets tests inject faults below a backend.
pub trait ReadAt: Send + Sync + Debug {
    /// Read up to `buf.len()` bytes of `file` (index `file_index` in the job) at `offset_bytes`,
    /// through its O_DIRECT descriptor when `direct` is true and one is open. Same contract as
    /// `pread`: may return fewer bytes, 0 at end of file, or a transient error.
    fn read_at(
        &self,
        file: &SourceFile,
        file_index: u32,
        buf: &mut [u8],
        offset_bytes: u64,
        direct: bool,
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
        direct: bool,
    ) -> io::Result<usize> {
        let fd = match (&file.direct, direct) {
            (Some(d), true) => d,
            _ => &file.buffered,
        };
        fd.read_at(buf, offset_bytes)
    }
}

/// The `sync` backend. See the module docs.
///
/// ```
/// use tensora_io::IoBackend;
/// let backend = tensora_io::sync::SyncBackend::default();
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
    /// A sync backend whose reads go through `reader` (e.g. a [`crate::fault::FaultySource`]).
    pub fn with_reader(reader: Arc<dyn ReadAt>) -> SyncBackend {
        SyncBackend { reader }
    }
}

/// State shared by the workers of one run.
struct Shared<'a> {
    job: &'a Job<'a>,
    sink: &'a dyn CompletionSink,
    reader: &'a dyn ReadAt,
    /// Next position inside each queue (relative to the queue's start).
    cursors: Vec<AtomicU32>,
    stop: AtomicBool,
    first_error: Mutex<Option<ReadError>>,
    bytes_read: AtomicU64,
    reads: AtomicU64,
    retries: AtomicU64,
    inflight_bytes: AtomicU64,
    peak_inflight_bytes: AtomicU64,
    direct_fallbacks: AtomicU64,
}

impl Shared<'_> {
    fn fail(&self, error: ReadError) {
        self.stop.store(true, Ordering::Release);
        let mut slot = self.first_error.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            *slot = Some(error);
        }
    }

    /// Claim the next read index, starting at queue `home`; None when every queue is drained.
    fn claim(&self, home: usize) -> Option<u32> {
        let queues = self.job.plan.queues();
        let n = queues.len();
        for step in 0..n {
            let q = (home + step) % n;
            let range = &queues[q].reads;
            let len = range.end - range.start;
            let cursor = &self.cursors[q];
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

    fn worker(&self, worker_index: usize) {
        // File order: spread workers over files. Priority order: everyone starts on the most
        // urgent queue and moves on only when it runs dry.
        let queue_count = self.job.plan.queues().len().max(1);
        let home = match self.job.plan.order() {
            tensora_plan::Order::File => worker_index % queue_count,
            tensora_plan::Order::Priority(_) => 0,
        };
        loop {
            if self.stop.load(Ordering::Acquire) {
                return;
            }
            if self.job.cancel.load(Ordering::Acquire) {
                self.fail(ReadError {
                    file: 0,
                    offset_bytes: 0,
                    len_bytes: 0,
                    kind: ReadErrorKind::Cancelled,
                });
                return;
            }
            let Some(read_index) = self.claim(home) else { return };
            if let Err(e) = self.one_read(read_index) {
                self.fail(e);
                return;
            }
        }
    }

    fn one_read(&self, read_index: u32) -> Result<(), ReadError> {
        let read = &self.job.plan.reads()[read_index as usize];
        let error = |kind| ReadError {
            file: read.file,
            offset_bytes: read.offset_bytes,
            len_bytes: read.len_bytes,
            kind,
        };
        let dest = self.job.dest;
        let in_dest =
            read.arena_offset_bytes.checked_add(read.len_bytes).is_some_and(|end| end <= dest.len_bytes());
        let file = self.job.files.get(read.file as usize);
        let (Some(file), true) = (file, in_dest) else {
            return Err(error(ReadErrorKind::Io(io::Error::new(
                io::ErrorKind::InvalidInput,
                "read outside the destination or the job's files",
            ))));
        };
        let _permit = self.job.budget.acquire(read.len_bytes);
        let now = self.inflight_bytes.fetch_add(read.len_bytes, Ordering::AcqRel) + read.len_bytes;
        self.peak_inflight_bytes.fetch_max(now, Ordering::AcqRel);
        // SAFETY: the range `arena_offset_bytes .. + len_bytes` lies inside the destination (checked
        // above); the `Destination` contract makes its memory valid and writable for the job's life,
        // and plan reads never overlap, so this slice is the only one touching these bytes.
        let buf = unsafe {
            std::slice::from_raw_parts_mut(
                dest.host_ptr().as_ptr().add(read.arena_offset_bytes as usize),
                read.len_bytes as usize,
            )
        };
        let result = self.fill(file, read.file, buf, read.offset_bytes);
        self.inflight_bytes.fetch_sub(read.len_bytes, Ordering::AcqRel);
        // Name the byte where the read failed, so the load layer can name the tensor holding it.
        result.map_err(|(kind, done_bytes)| ReadError {
            file: read.file,
            offset_bytes: read.offset_bytes + done_bytes,
            len_bytes: read.len_bytes - done_bytes,
            kind,
        })?;
        dest.on_landed(read.arena_offset_bytes, read.len_bytes).map_err(|e| error(ReadErrorKind::Io(e)))?;
        self.bytes_read.fetch_add(read.len_bytes, Ordering::Relaxed);
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.sink.read_done(read_index).map_err(|_| error(ReadErrorKind::Stopped))
    }

    /// Fill `buf` from `offset_bytes`, retrying transient errors within the job's bound. On error,
    /// also returns how many bytes had landed.
    fn fill(
        &self,
        file: &SourceFile,
        file_index: u32,
        buf: &mut [u8],
        offset_bytes: u64,
    ) -> Result<(), (ReadErrorKind, u64)> {
        let mut done_bytes = 0;
        self.fill_loop(file, file_index, buf, offset_bytes, &mut done_bytes)
            .map_err(|kind| (kind, done_bytes))
    }

    fn fill_loop(
        &self,
        file: &SourceFile,
        file_index: u32,
        buf: &mut [u8],
        offset_bytes: u64,
        done_out: &mut u64,
    ) -> Result<(), ReadErrorKind> {
        let expected_bytes = buf.len() as u64;
        let mut done: usize = 0;
        let mut retries: u32 = 0;
        let mut use_direct = self.job.direct && file.direct.is_some();
        while done < buf.len() {
            if self.stop.load(Ordering::Acquire) {
                return Err(ReadErrorKind::Stopped);
            }
            let pos = offset_bytes + done as u64;
            let rest = &mut buf[done..];
            let aligned = pos.is_multiple_of(DIRECT_BLOCK_BYTES)
                && (rest.len() as u64).is_multiple_of(DIRECT_BLOCK_BYTES)
                && (rest.as_ptr() as usize as u64).is_multiple_of(DIRECT_BLOCK_BYTES);
            let direct_now = use_direct && aligned;
            match self.reader.read_at(file, file_index, rest, pos, direct_now) {
                Ok(0) => {
                    return Err(ReadErrorKind::UnexpectedEof { read_bytes: done as u64, expected_bytes });
                }
                Ok(n) => {
                    done += n.min(rest.len());
                    *done_out = done as u64;
                    if done < buf.len() {
                        retries = self.retry(retries, io::Error::other("short read"))?;
                    }
                }
                Err(e) if direct_now && e.raw_os_error() == Some(libc::EINVAL) => {
                    self.direct_fallbacks.fetch_add(1, Ordering::Relaxed);
                    use_direct = false;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {
                    retries = self.retry(retries, e)?;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    retries = self.retry(retries, e)?;
                    let backoff = Duration::from_micros(100u64 << retries.min(7)).min(EAGAIN_BACKOFF_MAX);
                    std::thread::sleep(backoff);
                }
                Err(e) => return Err(ReadErrorKind::Io(e)),
            }
        }
        Ok(())
    }

    /// Count one retry; fail once the bound is exceeded, keeping the last error as the cause.
    fn retry(&self, retries: u32, last: io::Error) -> Result<u32, ReadErrorKind> {
        if retries >= self.job.retries_max {
            return Err(ReadErrorKind::Io(io::Error::new(
                last.kind(),
                format!("gave up after {retries} retries: {last}"),
            )));
        }
        self.retries.fetch_add(1, Ordering::Relaxed);
        Ok(retries + 1)
    }
}

impl IoBackend for SyncBackend {
    fn name(&self) -> &'static str {
        "sync"
    }

    fn execute(&self, job: &Job<'_>, sink: &dyn CompletionSink) -> Result<IoStats, ReadError> {
        let queues = job.plan.queues();
        let shared = Shared {
            job,
            sink,
            reader: &*self.reader,
            cursors: queues.iter().map(|_| AtomicU32::new(0)).collect(),
            stop: AtomicBool::new(false),
            first_error: Mutex::new(None),
            bytes_read: AtomicU64::new(0),
            reads: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            inflight_bytes: AtomicU64::new(0),
            peak_inflight_bytes: AtomicU64::new(0),
            direct_fallbacks: AtomicU64::new(0),
        };
        let reads_total = job.plan.reads().len();
        let threads = job.threads.clamp(1, THREADS_MAX).min(reads_total.max(1));
        if reads_total > 0 {
            std::thread::scope(|s| {
                for w in 1..threads {
                    let shared = &shared;
                    s.spawn(move || shared.worker(w));
                }
                shared.worker(0);
            });
        }
        if let Some(e) = shared.first_error.into_inner().unwrap_or_else(|p| p.into_inner()) {
            return Err(e);
        }
        Ok(IoStats {
            bytes_read: shared.bytes_read.into_inner(),
            reads: shared.reads.into_inner(),
            retries: shared.retries.into_inner(),
            peak_inflight_bytes: shared.peak_inflight_bytes.into_inner(),
            direct_fallbacks: shared.direct_fallbacks.into_inner(),
        })
    }
}
