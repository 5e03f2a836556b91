//! The one routine that reads mapped pages in: `MADV_POPULATE_READ` over byte spans of live
//! mappings, split into pieces spread over a bounded number of threads, with progress and
//! cancellation between pieces.
//!
//! Reading pages in before handing views out turns an I/O error or an already truncated file into
//! a typed error now, instead of a stall or a `SIGBUS` on first touch. A kernel without
//! `MADV_POPULATE_READ` (before 5.14: `EINVAL`) leaves the pages to first touch: the fallback
//! never touches a page itself (a touch past the end of a truncated file would raise `SIGBUS`).
//! Mapped loads ([`Residence::Mapped`](crate::Residence::Mapped)), the `mmap` backend (one piece
//! per read, before its copy), [`MappedFiles::prewarm`](super::MappedFiles::prewarm) and the
//! Python bindings' `safe_open` all come here.
//!
//! ```
//! use std::sync::atomic::AtomicBool;
//! use tensora_io::{PopulateConfig, ReadAhead, Span, populate};
//!
//! let mut map = memmap2::MmapMut::map_anon(1 << 20)?;
//! let base = map.as_mut_ptr() as usize;
//! let never = AtomicBool::new(false);
//! let cfg = PopulateConfig { threads: 2, cancel: &never, progress: None, ahead: ReadAhead::Ahead };
//! // SAFETY: the span is the first half of `map`, which lives across the call.
//! let done = unsafe { populate(&[Span { addr: base, len_bytes: 512 << 10 }], &cfg) }?;
//! assert_eq!(done.bytes, 512 << 10);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::io;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use super::readahead::{AheadQueue, read_ahead, willneed_mapped};
use crate::load::ProgressHook;

/// Largest piece one populate call covers (progress and cancel are checked between pieces).
pub const POPULATE_PIECE_BYTES_MAX: usize = 8 << 20;
/// Populate threads at most, whatever the caller asks.
pub const POPULATE_THREADS_MAX: usize = 64;
/// Retries of a populate call interrupted (`EINTR`) or refused for now (`EAGAIN`), per piece.
pub const POPULATE_RETRIES_MAX: u32 = 8;

/// A byte range of mapped memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    /// First byte.
    pub addr: usize,
    /// Length in bytes.
    pub len_bytes: usize,
}

/// What [`populate`] is given besides the spans.
pub struct PopulateConfig<'a> {
    /// Worker threads (at least 1, at most `POPULATE_THREADS_MAX`, at most one per piece).
    pub threads: usize,
    /// Set to stop between pieces ([`PopulateError::Cancelled`]).
    pub cancel: &'a AtomicBool,
    /// Called with `(bytes_done, bytes_total)`, in increasing order, after each piece.
    pub progress: Option<&'a ProgressHook>,
    /// Whether a helper thread reads the pieces into the page cache ahead of the workers.
    pub ahead: ReadAhead,
}

/// Whether [`populate`] reads ahead of its workers (`map/readahead.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadAhead {
    /// Only the workers' `MADV_POPULATE_READ`: each waits for its own piece (two 8 MiB pieces in
    /// flight with two workers). For pages that are likely cached already.
    Off,
    /// A helper thread `MADV_WILLNEED`s the pieces ahead of the workers (at most
    /// `READAHEAD_LEAD_BYTES`), so a cold file is read with a deep queue.
    Ahead,
}

impl std::fmt::Debug for PopulateConfig<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PopulateConfig")
            .field("threads", &self.threads)
            .field("cancel", &self.cancel)
            .field("progress", &self.progress.is_some())
            .field("ahead", &self.ahead)
            .finish()
    }
}

/// What [`populate`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Populated {
    /// Bytes of the spans (all of them, whether read in or left to first touch).
    pub bytes: u64,
    /// Whether the kernel read the pages in; `false` when it lacks `MADV_POPULATE_READ`.
    pub read_in: bool,
}

/// Why [`populate`] stopped.
#[derive(Debug, thiserror::Error)]
pub enum PopulateError {
    /// The cancel flag was set.
    #[error("cancelled")]
    Cancelled,
    /// Reading in one piece failed. `EFAULT` (pages past the end of a file truncated after it was
    /// mapped) comes back as [`io::ErrorKind::UnexpectedEof`].
    #[error("reading in mapped pages failed: {source}")]
    Io {
        /// Index of the span holding the failing piece.
        span: usize,
        /// Address of the failing piece (inside that span).
        piece_addr: usize,
        /// Length of the failing piece in bytes.
        piece_len_bytes: usize,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

/// Read in every span (pieces of at most [`POPULATE_PIECE_BYTES_MAX`] spread over
/// `cfg.threads` workers), reporting `(bytes_done, bytes_total)` to `cfg.progress` in increasing
/// order and stopping between pieces when `cfg.cancel` is set.
///
/// # Safety
///
/// Every span must lie inside one live mapping of this process that stays mapped for the call,
/// and that mapping must start on a page boundary (every `mmap` does).
pub unsafe fn populate(spans: &[Span], cfg: &PopulateConfig<'_>) -> Result<Populated, PopulateError> {
    let mut pieces: Vec<(usize, Span)> = Vec::new();
    for (i, s) in spans.iter().enumerate() {
        let mut off = 0;
        while off < s.len_bytes {
            let n = POPULATE_PIECE_BYTES_MAX.min(s.len_bytes - off);
            pieces.push((i, Span { addr: s.addr + off, len_bytes: n }));
            off += n;
        }
    }
    let total: u64 = spans.iter().map(|s| s.len_bytes as u64).sum();
    let run = Run {
        pieces: &pieces,
        cfg,
        total,
        next: AtomicUsize::new(0),
        done: Mutex::new(0),
        failed: Mutex::new(None),
        unsupported: AtomicBool::new(false),
    };
    let threads = cfg.threads.clamp(1, POPULATE_THREADS_MAX).min(pieces.len().max(1));
    let lens: Vec<u64> = pieces.iter().map(|(_, p)| p.len_bytes as u64).collect();
    let ahead_done = AtomicBool::new(false);
    std::thread::scope(|s| {
        let reader = (cfg.ahead == ReadAhead::Ahead && pieces.len() > 1).then(|| {
            let queue = PieceQueue { run: &run, lens: &lens };
            let done = &ahead_done;
            s.spawn(move || read_ahead(&[&queue], done))
        });
        let helpers: Vec<_> = (1..threads)
            .map(|_| {
                // SAFETY: every piece lies inside a live mapping (this function's contract).
                s.spawn(|| unsafe { run.work() })
            })
            .collect();
        // SAFETY: as above.
        unsafe { run.work() };
        // Joined, not left to the scope, so no helper thread outlives the call.
        for h in helpers {
            if let Err(payload) = h.join() {
                std::panic::resume_unwind(payload);
            }
        }
        ahead_done.store(true, Ordering::Release);
        if let Some(h) = reader
            && let Err(payload) = h.join()
        {
            std::panic::resume_unwind(payload);
        }
    });
    if let Some(e) = run.failed.into_inner().unwrap_or_else(|e| e.into_inner()) {
        return Err(e);
    }
    if cfg.cancel.load(Ordering::Acquire) {
        return Err(PopulateError::Cancelled);
    }
    let read_in = !run.unsupported.load(Ordering::Relaxed);
    if !read_in && let Some(p) = cfg.progress {
        p(total, total);
    }
    Ok(Populated { bytes: total, read_in })
}

/// The pieces of one [`populate`] call as the read-ahead helper sees them.
struct PieceQueue<'a> {
    run: &'a Run<'a>,
    lens: &'a [u64],
}

impl AheadQueue for PieceQueue<'_> {
    fn piece_lens(&self) -> &[u64] {
        self.lens
    }

    fn claimed(&self) -> usize {
        self.run.next.load(Ordering::Relaxed)
    }

    fn advise(&self, piece: usize, offset_bytes: u64, len_bytes: u64) {
        let (_, span) = self.run.pieces[piece];
        // SAFETY: the range lies inside the piece, which lies inside a live mapping for the whole
        // call (`populate`'s contract); the helper is joined before `populate` returns.
        unsafe { willneed_mapped(span.addr + offset_bytes as usize, len_bytes as usize) };
    }
}

/// The shared state of one [`populate`] call.
struct Run<'a> {
    pieces: &'a [(usize, Span)],
    cfg: &'a PopulateConfig<'a>,
    total: u64,
    next: AtomicUsize,
    done: Mutex<u64>,
    failed: Mutex<Option<PopulateError>>,
    unsupported: AtomicBool,
}

impl Run<'_> {
    /// One worker: takes pieces until none are left, one fails, the kernel lacks the advice, or
    /// the caller cancels.
    ///
    /// # Safety
    /// Every piece lies inside a live, page-aligned mapping.
    unsafe fn work(&self) {
        loop {
            if self.cfg.cancel.load(Ordering::Acquire) || self.unsupported.load(Ordering::Relaxed) {
                return;
            }
            if self.failed.lock().unwrap_or_else(|e| e.into_inner()).is_some() {
                return;
            }
            let Some(&(span, piece)) = self.pieces.get(self.next.fetch_add(1, Ordering::Relaxed)) else {
                return;
            };
            // SAFETY: the piece lies inside a live mapping (the caller's contract), and so does its
            // rounded-down start: mappings start on a page boundary.
            match unsafe { populate_one(piece) } {
                Ok(true) => {}
                Ok(false) => {
                    self.unsupported.store(true, Ordering::Relaxed);
                    return;
                }
                Err(source) => {
                    let mut slot = self.failed.lock().unwrap_or_else(|e| e.into_inner());
                    slot.get_or_insert(PopulateError::Io {
                        span,
                        piece_addr: piece.addr,
                        piece_len_bytes: piece.len_bytes,
                        source,
                    });
                    return;
                }
            }
            let mut d = self.done.lock().unwrap_or_else(|e| e.into_inner());
            *d += piece.len_bytes as u64;
            if let Some(p) = self.cfg.progress {
                p(*d, self.total);
            }
        }
    }
}

/// One `madvise(MADV_POPULATE_READ)` over `span` (its start rounded down to a page). `Ok(false)`
/// when the kernel does not know the advice (`EINVAL`); nothing is touched then. `EFAULT`
/// becomes [`io::ErrorKind::UnexpectedEof`].
///
/// # Safety
/// The span, from its rounded-down start, lies inside one live mapping of this process.
pub(crate) unsafe fn populate_one(span: Span) -> io::Result<bool> {
    let page = super::page_size_bytes() as usize;
    let start = span.addr & !(page - 1);
    let len = span.len_bytes + (span.addr - start);
    if len == 0 {
        return Ok(true);
    }
    let mut retries = 0;
    loop {
        // SAFETY: the caller guarantees the range is mapped; MADV_POPULATE_READ only faults pages
        // in for reading and changes no contents.
        let rc = unsafe { libc::madvise(start as *mut libc::c_void, len, libc::MADV_POPULATE_READ) };
        if rc == 0 {
            return Ok(true);
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINVAL) => return Ok(false),
            Some(libc::EINTR | libc::EAGAIN) if retries < POPULATE_RETRIES_MAX => retries += 1,
            Some(libc::EFAULT) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the file is shorter than when it was parsed (truncated while mapped)",
                ));
            }
            _ => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Populating any sub-ranges of a live mapping succeeds, reports progress up to the
        /// total in increasing order, and leaves the bytes unchanged.
        #[test]
        fn populate_reports_progress_and_keeps_bytes(
            spans in proptest::collection::vec((0usize..(768 << 10), 0usize..(256 << 10)), 0..6),
            threads in 1usize..4,
        ) {
            let len = 1 << 20;
            let mut map = memmap2::MmapMut::map_anon(len).unwrap();
            for (i, b) in map.iter_mut().enumerate() {
                *b = (i % 251) as u8;
            }
            let base = map.as_mut_ptr() as usize;
            let spans: Vec<Span> =
                spans.iter().map(|&(o, l)| Span { addr: base + o, len_bytes: l }).collect();
            let seen = std::sync::Arc::new(Mutex::new(Vec::new()));
            let s2 = std::sync::Arc::clone(&seen);
            let hook: ProgressHook = std::sync::Arc::new(move |d, t| s2.lock().unwrap().push((d, t)));
            let cancel = AtomicBool::new(false);
            let ahead = if threads % 2 == 0 { ReadAhead::Ahead } else { ReadAhead::Off };
            let cfg = PopulateConfig { threads, cancel: &cancel, progress: Some(&hook), ahead };
            // SAFETY: every span lies inside `map` (offset < 768 KiB, len < 256 KiB, map 1 MiB).
            let done = unsafe { populate(&spans, &cfg) }.unwrap();
            let total = spans.iter().map(|s| s.len_bytes as u64).sum::<u64>();
            prop_assert_eq!(done.bytes, total);
            let seen = seen.lock().unwrap();
            prop_assert!(seen.windows(2).all(|w| w[0].0 <= w[1].0));
            if total > 0 {
                prop_assert_eq!(seen.last().copied(), Some((total, total)));
            }
            prop_assert!(map.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
        }
    }

    #[test]
    fn cancel_stops_before_the_first_piece() {
        let mut map = memmap2::MmapMut::map_anon(1 << 20).unwrap();
        let base = map.as_mut_ptr() as usize;
        let cancel = AtomicBool::new(true);
        let cfg = PopulateConfig { threads: 2, cancel: &cancel, progress: None, ahead: ReadAhead::Ahead };
        // SAFETY: the span is the whole live mapping.
        let r = unsafe { populate(&[Span { addr: base, len_bytes: 1 << 20 }], &cfg) };
        assert!(matches!(r, Err(PopulateError::Cancelled)), "{r:?}");
    }

    #[test]
    fn populating_past_the_end_of_a_truncated_file_is_an_error() {
        use std::io::Write;
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&vec![1u8; 64 << 10]).unwrap();
        // SAFETY: private mapping of a file only this test touches; truncated below on purpose,
        // and the truncated pages are never accessed, only populated (which reports EFAULT).
        let mut map = unsafe { memmap2::MmapOptions::new().len(64 << 10).map_copy(&f) }.unwrap();
        f.set_len(4096).unwrap();
        let base = map.as_mut_ptr() as usize;
        let cancel = AtomicBool::new(false);
        let cfg = PopulateConfig { threads: 1, cancel: &cancel, progress: None, ahead: ReadAhead::Ahead };
        // SAFETY: the span is the whole live mapping.
        let r = unsafe { populate(&[Span { addr: base, len_bytes: 64 << 10 }], &cfg) };
        let Err(PopulateError::Io { span: 0, piece_addr, source, .. }) = r else {
            panic!("expected an UnexpectedEof error, got {r:?}");
        };
        assert_eq!(piece_addr, base);
        assert_eq!(source.kind(), io::ErrorKind::UnexpectedEof);
    }
}
