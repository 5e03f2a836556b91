//! Memory-mapped checkpoint files: private read-only mappings with access advice, prewarm,
//! `mlock` of a hot set and a page-cache residency report, plus [`MmapBackend`], which copies plan
//! reads out of the mappings into a destination with worker threads (the owned mode). The
//! zero-copy mode keeps a [`MappedFiles`] alive and hands out views into it.
//!
//! # SIGBUS on truncation
//!
//! A mapping cannot report an I/O error the way `read` does. If a mapped file is truncated (or its
//! storage fails) while mapped, touching a page past the new end raises `SIGBUS` and kills the
//! process. [`MappedFiles::map`] checks each file's size before mapping, so a file that is already
//! short is a typed error, but nothing can prevent another process from truncating it afterwards.
//! Do not map files that other writers may rewrite in place; writers should replace files by
//! rename (as `tensora_format::write` does), which leaves existing mappings intact.
//!
//! # Writes by others show through
//!
//! Mappings are `MAP_PRIVATE` and read-only, so this process never copies a page (copy-on-write
//! happens only on a write through the mapping, which a read-only mapping cannot do): every page
//! is the page cache's page. Another process writing the file in place is therefore seen through
//! the mapping, possibly in the middle of a read, and a views-based [`Residence::Mapped`] load
//! hands out live views, not a snapshot. [`MappedFiles::map`] stays a safe function because
//! `tensora-bench` calls it (a signature change there is a lead's decision); its contract is the
//! one an `unsafe fn` would state: the caller guarantees that the files are neither modified nor
//! truncated while mapped. The backends in this crate only map files they opened and stamped, and
//! the load path re-checks every stamp after the I/O.
//!
//! [`Residence::Mapped`]: crate::Residence::Mapped
//!
//! # Example
//!
//! ```
//! use std::io::Write;
//! use tensora_io::SourceFile;
//! use tensora_io::mmap::{FileRange, MappedFiles};
//!
//! let mut tmp = tempfile::NamedTempFile::new()?;
//! tmp.write_all(&[7u8; 10_000])?;
//! let file = SourceFile {
//!     path: tmp.path().to_path_buf(),
//!     len_bytes: 10_000,
//!     buffered: std::fs::File::open(tmp.path())?,
//!     direct: None,
//! };
//! let maps = MappedFiles::map(std::slice::from_ref(&file))?;
//! let hot = [FileRange { file: 0, offset_bytes: 0, len_bytes: 4096 }];
//! maps.advise_willneed(&hot)?;
//! maps.prewarm(&hot, 2)?;
//! assert_eq!(maps.bytes(0, 100..104), &[7, 7, 7, 7]);
//! assert!(maps.residency(&hot)?.fraction() > 0.0);
//! # Ok::<(), std::io::Error>(())
//! ```

use std::io;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

use memmap2::{Advice, Mmap, MmapMut, MmapOptions};
use tensora_plan::{Extent, Read};

use crate::backend::{CompletionSink, IoBackend, IoStats, Job, ReadError, ReadErrorKind, SourceFile};
use crate::uring::{DestPtr, RunState, job_error, run_workers, validate_job};

/// Largest piece of a range one prewarm task handles; pieces are spread over the threads.
const PREWARM_PIECE_BYTES_MAX: u64 = 8 << 20;
/// Largest number of prewarm threads.
pub const PREWARM_THREADS_MAX: usize = 64;
/// Pages per `mincore` call (bounds the residency vector at 64 KiB).
const RESIDENCY_WINDOW_PAGES: u64 = 1 << 16;
/// Default read-ahead distance of the mmap backend, in plan reads (see [`MmapConfig`]).
pub const WILLNEED_LOOKAHEAD_DEFAULT_READS: u32 = 4;
/// Largest number of copy threads the mmap backend uses.
pub const MMAP_THREADS_MAX: usize = 256;

/// A byte range of one mapped file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileRange {
    pub file: u32,
    pub offset_bytes: u64,
    pub len_bytes: u64,
}

impl From<&Extent> for FileRange {
    fn from(e: &Extent) -> Self {
        Self { file: e.file, offset_bytes: e.offset_bytes, len_bytes: e.len_bytes }
    }
}

impl From<&Read> for FileRange {
    fn from(r: &Read) -> Self {
        Self { file: r.file, offset_bytes: r.offset_bytes, len_bytes: r.len_bytes }
    }
}

/// How much of some ranges sits in the page cache, in pages.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Residency {
    pub pages_total: u64,
    pub pages_resident: u64,
}

impl Residency {
    /// Fraction of pages resident, in `[0, 1]`. An empty set of ranges counts as fully resident
    /// (there is nothing to fetch).
    pub fn fraction(&self) -> f64 {
        if self.pages_total == 0 { 1.0 } else { self.pages_resident as f64 / self.pages_total as f64 }
    }

    fn add(&mut self, other: Residency) {
        self.pages_total += other.pages_total;
        self.pages_resident += other.pages_resident;
    }
}

/// The system page size in bytes.
pub fn page_size_bytes() -> u64 {
    static PAGE: OnceLock<u64> = OnceLock::new();
    *PAGE.get_or_init(|| {
        // SAFETY: sysconf has no preconditions.
        let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        u64::try_from(size).ok().filter(|s| s.is_power_of_two()).unwrap_or(4096)
    })
}

/// Private mappings of a set of files, indexed like the plan's file ids. `Send + Sync`: share it
/// with `Arc`.
#[derive(Debug)]
pub struct MappedFiles {
    maps: Vec<Mapping>,
    paths: Vec<PathBuf>,
}

/// How [`MappedFiles`] maps its files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MapMode {
    /// `MAP_PRIVATE`, `PROT_READ`: the bytes can only be read.
    #[default]
    ReadOnly,
    /// `MAP_PRIVATE | MAP_NORESERVE`, `PROT_READ | PROT_WRITE`: writes (through
    /// [`MappedFiles::ptr_mut`]) copy the page and never reach the file. `MAP_NORESERVE` keeps the
    /// mapping out of the commit charge, so a file larger than RAM + swap maps as it does
    /// read-only (only pages actually written are charged, when written).
    CopyOnWrite,
}

/// One mapped file: the mapping, its base address and its length. The base is taken once at map
/// time (`as_mut_ptr` for a writable one) and every view is built over just the bytes asked for,
/// so no `&[u8]` over the whole file exists while a writer uses [`MappedFiles::ptr_mut`].
#[derive(Debug)]
struct Mapping {
    _map: MapKind,
    base: usize,
    len: usize,
}

/// Keeps the mapping alive (unmapped on drop); never dereferenced after mapping.
#[derive(Debug)]
enum MapKind {
    ReadOnly(Mmap),
    CopyOnWrite(MmapMut),
}

impl Mapping {
    fn writable(&self) -> bool {
        matches!(self._map, MapKind::CopyOnWrite(_))
    }

    /// `start..end` of the mapping, or `None` out of bounds.
    fn bytes(&self, start: usize, end: usize) -> Option<&[u8]> {
        if start > end || end > self.len {
            return None;
        }
        // SAFETY: `base..base + len` is this live mapping (valid for reads while `self` lives) and
        // `start..end` lies inside it. The slice covers only the requested bytes; writers through
        // `ptr_mut` must not touch them while it lives (their documented contract).
        Some(unsafe { std::slice::from_raw_parts((self.base as *const u8).add(start), end - start) })
    }

    fn advise_range(&self, advice: Advice, start: usize, len: usize) -> io::Result<()> {
        match &self._map {
            MapKind::ReadOnly(m) => m.advise_range(advice, start, len),
            MapKind::CopyOnWrite(m) => m.advise_range(advice, start, len),
        }
    }
}

impl MappedFiles {
    /// Maps each file `MAP_PRIVATE`, read-only, over its expected `len_bytes`. Each file's size is
    /// checked with `fstat` first: a file shorter than expected is an `InvalidData` error naming
    /// it (mapping it would turn the missing tail into `SIGBUS`).
    ///
    /// # Contract
    ///
    /// The caller must ensure the files are neither modified nor truncated while mapped: in-place
    /// writes by others show through the returned bytes (they are live views, not a snapshot),
    /// and a truncation turns later accesses into `SIGBUS`. See the module docs.
    pub fn map(files: &[SourceFile]) -> io::Result<MappedFiles> {
        MappedFiles::map_with(files, MapMode::ReadOnly)
    }

    /// [`MappedFiles::map`] with a choice of [`MapMode`]; same contract.
    pub fn map_with(files: &[SourceFile], mode: MapMode) -> io::Result<MappedFiles> {
        let mut maps = Vec::with_capacity(files.len());
        for f in files {
            maps.push(map_one(f, mode)?);
        }
        Ok(MappedFiles { maps, paths: files.iter().map(|f| f.path.clone()).collect() })
    }

    /// A pointer to `range` of `file` that may be written through, for a
    /// [`MapMode::CopyOnWrite`] mapping (`None` for a read-only one, or out of bounds). Writes
    /// copy the touched pages privately; the file never changes. Writing is sound only while no
    /// `&[u8]` over the same bytes (from [`MappedFiles::get`] or [`MappedFiles::bytes`]) is alive.
    pub fn ptr_mut(&self, file: u32, range: Range<u64>) -> Option<NonNull<u8>> {
        let map = self.maps.get(file as usize).filter(|m| m.writable())?;
        let start = usize::try_from(range.start).ok()?;
        let end = usize::try_from(range.end).ok()?;
        if start > end || end > map.len {
            return None;
        }
        NonNull::new((map.base as *mut u8).wrapping_add(start))
    }

    /// Number of mapped files.
    pub fn file_count(&self) -> usize {
        self.maps.len()
    }

    /// Mapped length of `file`, or `None` if there is no such file.
    pub fn len_bytes(&self, file: u32) -> Option<u64> {
        self.maps.get(file as usize).map(|m| m.len as u64)
    }

    /// Path `file` was mapped from.
    pub fn path(&self, file: u32) -> Option<&Path> {
        self.paths.get(file as usize).map(PathBuf::as_path)
    }

    /// The bytes of `range` in `file`, or `None` if the file or the range is out of bounds.
    pub fn get(&self, file: u32, range: Range<u64>) -> Option<&[u8]> {
        let map = self.maps.get(file as usize)?;
        let start = usize::try_from(range.start).ok()?;
        let end = usize::try_from(range.end).ok()?;
        map.bytes(start, end)
    }

    /// The bytes of `range` in `file`.
    ///
    /// # Panics
    ///
    /// If `file` or `range` is out of bounds (a caller bug: ranges come from a validated
    /// checkpoint). Use [`MappedFiles::get`] for a checked lookup.
    pub fn bytes(&self, file: u32, range: Range<u64>) -> &[u8] {
        let (start, end) = (range.start, range.end);
        self.get(file, range)
            .unwrap_or_else(|| panic!("range {start}..{end} out of bounds of mapped file #{file}"))
    }

    /// `madvise(MADV_SEQUENTIAL)` on each range: aggressive readahead, early reclaim behind.
    pub fn advise_sequential(&self, ranges: &[FileRange]) -> io::Result<()> {
        self.advise(ranges, Advice::Sequential)
    }

    /// `madvise(MADV_WILLNEED)` on each range: start reading it into the page cache now.
    pub fn advise_willneed(&self, ranges: &[FileRange]) -> io::Result<()> {
        self.advise(ranges, Advice::WillNeed)
    }

    fn advise(&self, ranges: &[FileRange], advice: Advice) -> io::Result<()> {
        for r in ranges {
            let (map, start, len) = self.span(r)?;
            if len > 0 {
                map.advise_range(advice, start, len)?;
            }
        }
        Ok(())
    }

    /// Faults the pages of `ranges` into this mapping (reading them from disk if needed) with up to
    /// `threads` threads, so that later accesses do not fault. Uses `MADV_POPULATE_READ` (one call
    /// per 8 MiB piece) and falls back to touching one byte per page on kernels before 5.14.
    /// Returns the number of bytes prewarmed.
    pub fn prewarm(&self, ranges: &[FileRange], threads: usize) -> io::Result<u64> {
        let mut pieces = Vec::new();
        for r in ranges {
            let (_, start, len) = self.span(r)?;
            let (start, len) = (start as u64, len as u64);
            let mut at = 0;
            while at < len {
                let piece = PREWARM_PIECE_BYTES_MAX.min(len - at);
                pieces.push(FileRange { file: r.file, offset_bytes: start + at, len_bytes: piece });
                at += piece;
            }
        }
        let total: u64 = pieces.iter().map(|p| p.len_bytes).sum();
        let next = AtomicUsize::new(0);
        let worker = || -> io::Result<()> {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(piece) = pieces.get(i) else { return Ok(()) };
                self.prewarm_piece(piece)?;
            }
        };
        let threads = threads.clamp(1, PREWARM_THREADS_MAX).min(pieces.len().max(1));
        if threads == 1 {
            worker()?;
        } else {
            std::thread::scope(|scope| {
                let handles: Vec<_> = (0..threads).map(|_| scope.spawn(worker)).collect();
                let mut result = Ok(());
                for h in handles {
                    match h.join() {
                        Ok(r) => result = result.and(r),
                        Err(payload) => std::panic::resume_unwind(payload),
                    }
                }
                result
            })?;
        }
        Ok(total)
    }

    fn prewarm_piece(&self, piece: &FileRange) -> io::Result<()> {
        let (map, start, len) = self.span(piece)?;
        match map.advise_range(Advice::PopulateRead, start, len) {
            Ok(()) => Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                let page = page_size_bytes() as usize;
                let bytes = map.bytes(start, start + len).unwrap_or(&[]);
                let mut sum = 0u8;
                for i in (0..bytes.len()).step_by(page) {
                    sum = sum.wrapping_add(bytes[i]);
                }
                std::hint::black_box(sum);
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// `mlock`s the pages of `ranges` (reading them in first): they stay resident until
    /// [`MappedFiles::unlock`] or until the mapping is dropped. Needs `CAP_IPC_LOCK` or enough
    /// `RLIMIT_MEMLOCK`; the error says so.
    pub fn lock(&self, ranges: &[FileRange]) -> io::Result<()> {
        self.lock_op(ranges, true)
    }

    /// `munlock`s the pages of `ranges`.
    pub fn unlock(&self, ranges: &[FileRange]) -> io::Result<()> {
        self.lock_op(ranges, false)
    }

    fn lock_op(&self, ranges: &[FileRange], lock: bool) -> io::Result<()> {
        for r in ranges {
            let Some((addr, len)) = self.page_span(r)? else { continue };
            // SAFETY: [addr, addr + len) is page-aligned and lies inside this live mapping
            // (checked by `page_span`); mlock/munlock do not change its contents.
            let rc = unsafe {
                if lock {
                    libc::mlock(addr as *const libc::c_void, len)
                } else {
                    libc::munlock(addr as *const libc::c_void, len)
                }
            };
            if rc != 0 {
                let e = io::Error::last_os_error();
                return Err(io::Error::new(
                    e.kind(),
                    format!("mlock of hot set failed: {e} (needs CAP_IPC_LOCK or RLIMIT_MEMLOCK)"),
                ));
            }
        }
        Ok(())
    }

    /// How much of `ranges` is in the page cache, counted in whole pages with `mincore` (a page
    /// partly covered by a range counts). Cost: one syscall per 256 MiB of range.
    pub fn residency(&self, ranges: &[FileRange]) -> io::Result<Residency> {
        let mut total = Residency::default();
        for r in ranges {
            if let Some((addr, len)) = self.page_span(r)? {
                total.add(mincore_span(addr, len as u64, 1)?);
            }
        }
        Ok(total)
    }

    /// Like [`MappedFiles::residency`], but looks at no more than about `pages_max` evenly spaced
    /// pages per range (one `mincore` call per sampled page), so it stays cheap on huge files.
    pub fn residency_sampled(&self, ranges: &[FileRange], pages_max: u64) -> io::Result<Residency> {
        let page = page_size_bytes();
        let mut total = Residency::default();
        for r in ranges {
            if let Some((addr, len)) = self.page_span(r)? {
                let pages = (len as u64).div_ceil(page);
                let stride = pages.div_ceil(pages_max.max(1)).max(1);
                total.add(mincore_span(addr, len as u64, stride)?);
            }
        }
        Ok(total)
    }

    /// Bounds-checks `r` and returns (mapping, start, len) in mapping coordinates.
    fn span(&self, r: &FileRange) -> io::Result<(&Mapping, usize, usize)> {
        let map = self.maps.get(r.file as usize).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("no mapped file #{} (have {})", r.file, self.maps.len()),
            )
        })?;
        let out_of_bounds = || {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "range {}..+{} out of bounds of mapped file #{} ({} bytes)",
                    r.offset_bytes, r.len_bytes, r.file, map.len
                ),
            )
        };
        let end = r.offset_bytes.checked_add(r.len_bytes).ok_or_else(out_of_bounds)?;
        if end > map.len as u64 {
            return Err(out_of_bounds());
        }
        Ok((map, r.offset_bytes as usize, r.len_bytes as usize))
    }

    /// The page-aligned address span covering `r`, or `None` for an empty range.
    fn page_span(&self, r: &FileRange) -> io::Result<Option<(usize, usize)>> {
        let (map, start, len) = self.span(r)?;
        if len == 0 {
            return Ok(None);
        }
        let page = page_size_bytes() as usize;
        let addr = map.base + start;
        let aligned = addr & !(page - 1);
        Ok(Some((aligned, len + (addr - aligned))))
    }
}

/// `mincore` over `[addr, addr + len)` (page-aligned `addr`), looking at every `stride`-th page.
fn mincore_span(addr: usize, len: u64, stride: u64) -> io::Result<Residency> {
    let page = page_size_bytes();
    let pages = len.div_ceil(page);
    let mut out = Residency::default();
    if stride > 1 {
        let mut vec = [0u8; 1];
        let mut p = 0;
        while p < pages {
            // SAFETY: the page at addr + p*page lies inside a live mapping (callers pass a span
            // from `page_span`), and `vec` has room for one page's entry.
            let rc = unsafe {
                libc::mincore(
                    (addr + (p * page) as usize) as *mut libc::c_void,
                    page as usize,
                    vec.as_mut_ptr(),
                )
            };
            if rc != 0 {
                return Err(io::Error::last_os_error());
            }
            out.pages_total += 1;
            out.pages_resident += u64::from(vec[0] & 1);
            p += stride;
        }
        return Ok(out);
    }
    let mut vec = vec![0u8; RESIDENCY_WINDOW_PAGES.min(pages) as usize];
    let mut p = 0;
    while p < pages {
        let window = RESIDENCY_WINDOW_PAGES.min(pages - p);
        // SAFETY: the window lies inside a live mapping (see above) and `vec` holds at least
        // `window` entries, one per page.
        let rc = unsafe {
            libc::mincore(
                (addr + (p * page) as usize) as *mut libc::c_void,
                (window * page) as usize,
                vec.as_mut_ptr(),
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        out.pages_total += window;
        out.pages_resident += vec[..window as usize].iter().filter(|&&v| v & 1 == 1).count() as u64;
        p += window;
    }
    Ok(out)
}

fn map_one(f: &SourceFile, mode: MapMode) -> io::Result<Mapping> {
    let named = |e: io::Error| io::Error::new(e.kind(), format!("{}: {e}", f.path.display()));
    let on_disk = f.buffered.metadata().map_err(named)?.len();
    if on_disk < f.len_bytes {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{}: {on_disk} bytes on disk, {} expected; refusing to map (SIGBUS risk)",
                f.path.display(),
                f.len_bytes
            ),
        ));
    }
    let len = usize::try_from(f.len_bytes).map_err(|_| {
        io::Error::new(io::ErrorKind::InvalidInput, format!("{}: too large to map", f.path.display()))
    })?;
    match mode {
        MapMode::ReadOnly => {
            // SAFETY: a private read-only mapping of a file whose size was just checked. The
            // remaining risk, truncation by another process while mapped (SIGBUS), is documented in
            // the module docs.
            let m = unsafe { MmapOptions::new().len(len).map_copy_read_only(&f.buffered) }.map_err(named)?;
            Ok(Mapping { base: m.as_ptr() as usize, len, _map: MapKind::ReadOnly(m) })
        }
        MapMode::CopyOnWrite => {
            // SAFETY: as above; `MAP_PRIVATE` means writes copy pages and never reach the file, and
            // `MAP_NORESERVE` only leaves the commit charge to pages actually written.
            let mut m = unsafe { MmapOptions::new().len(len).no_reserve_swap().map_copy(&f.buffered) }
                .map_err(named)?;
            let base = m.as_mut_ptr() as usize;
            Ok(Mapping { base, len, _map: MapKind::CopyOnWrite(m) })
        }
    }
}

/// Knobs of the mmap backend's owned mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MmapConfig {
    /// `MADV_POPULATE_READ` each read's source range before copying it (one fault-in syscall per
    /// read instead of one page fault per 64 KiB of fault-around).
    pub populate_source: bool,
    /// When a worker takes read `i`, `MADV_WILLNEED` read `i + willneed_lookahead_reads` so the
    /// kernel reads ahead while this one is copied (cold files). 0 turns it off.
    pub willneed_lookahead_reads: u32,
}

impl Default for MmapConfig {
    fn default() -> Self {
        Self { populate_source: true, willneed_lookahead_reads: WILLNEED_LOOKAHEAD_DEFAULT_READS }
    }
}

/// The mmap backend, owned mode: maps the files and copies each plan read from the mapping into
/// the destination with `job.threads` threads, holding a budget permit per read.
///
/// ```
/// use tensora_io::IoBackend;
/// use tensora_io::mmap::MmapBackend;
///
/// assert_eq!(MmapBackend::default().name(), "mmap");
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct MmapBackend {
    config: MmapConfig,
}

impl MmapBackend {
    /// A backend with the given configuration.
    pub fn new(config: MmapConfig) -> Self {
        Self { config }
    }

    /// The configuration this backend runs with.
    pub fn config(&self) -> MmapConfig {
        self.config
    }
}

impl IoBackend for MmapBackend {
    fn name(&self) -> &'static str {
        "mmap"
    }

    fn execute(&self, job: &Job<'_>, sink: &dyn CompletionSink) -> Result<IoStats, ReadError> {
        validate_job(job)?;
        let reads = job.plan.reads();
        if reads.is_empty() {
            return Ok(IoStats::default());
        }
        let mut maps = Vec::with_capacity(job.files.len());
        for (i, f) in job.files.iter().enumerate() {
            match map_one(f, MapMode::ReadOnly) {
                Ok(m) => maps.push(m),
                Err(e) => {
                    return Err(ReadError {
                        file: i as u32,
                        offset_bytes: 0,
                        len_bytes: f.len_bytes,
                        kind: ReadErrorKind::Io(e),
                    });
                }
            }
        }
        let maps = MappedFiles { maps, paths: job.files.iter().map(|f| f.path.clone()).collect() };
        // Sequential advice over each file queue's span. Advice is only a hint: failures are ignored.
        for q in job.plan.queues() {
            let queue_reads = reads.get(q.reads.start as usize..q.reads.end as usize).unwrap_or(&[]);
            let start = queue_reads.iter().map(|r| r.offset_bytes).min();
            let end = queue_reads.iter().map(|r| r.offset_bytes + r.len_bytes).max();
            if let (Some(start), Some(end)) = (start, end) {
                let len = end.min(maps.len_bytes(q.file).unwrap_or(0)).saturating_sub(start);
                let _ = maps.advise_sequential(&[FileRange {
                    file: q.file,
                    offset_bytes: start,
                    len_bytes: len,
                }]);
            }
        }
        let state = RunState::new(job);
        let base = DestPtr::new(job);
        let workers = job.threads.clamp(1, MMAP_THREADS_MAX).min(reads.len());
        let config = self.config;
        let per_worker = run_workers(workers, |w| copy_worker(job, sink, &state, &maps, base, config, w));
        state.finish(per_worker)
    }
}

fn copy_worker(
    job: &Job<'_>,
    sink: &dyn CompletionSink,
    state: &RunState,
    maps: &MappedFiles,
    base: DestPtr,
    config: MmapConfig,
    worker: usize,
) -> IoStats {
    let mut stats = IoStats::default();
    let reads = job.plan.reads();
    let home = state.home(worker);
    while !state.stopped() {
        let Some(index) = state.claim(home) else { break };
        let read = &reads[index as usize];
        if state.check_cancel(job, read) {
            break;
        }
        if config.willneed_lookahead_reads > 0 {
            let ahead = reads.get(index as usize + config.willneed_lookahead_reads as usize);
            if let Some(ahead) = ahead.filter(|a| a.file == read.file) {
                let mapped_len = maps.len_bytes(ahead.file).unwrap_or(0);
                let len_bytes = ahead.len_bytes.min(mapped_len.saturating_sub(ahead.offset_bytes));
                // A hint: failures only cost read-ahead.
                let _ = maps.advise_willneed(&[FileRange {
                    file: ahead.file,
                    offset_bytes: ahead.offset_bytes,
                    len_bytes,
                }]);
            }
        }
        // Bytes past the mapped (known) file length are alignment padding that no extent uses.
        let mapped_len = maps.len_bytes(read.file).unwrap_or(0);
        let copy_len = read.len_bytes.min(mapped_len.saturating_sub(read.offset_bytes));
        let permit = job.budget.acquire(read.len_bytes);
        state.begin_inflight(permit.bytes());
        let range = FileRange { file: read.file, offset_bytes: read.offset_bytes, len_bytes: copy_len };
        if copy_len > 0 {
            if config.populate_source
                && let Err(e) = maps.prewarm_piece(&range)
            {
                // Populating failed (EFAULT: the pages are gone, e.g. the file was truncated; EIO:
                // the storage failed). Copying would raise SIGBUS: fail the read instead.
                state.end_inflight(permit.bytes());
                drop(permit);
                state.fail(populate_error(job, read, e));
                break;
            }
            let src = maps.bytes(read.file, read.offset_bytes..read.offset_bytes + copy_len);
            // SAFETY: `validate_job` checked that [arena_offset, arena_offset + len) lies inside
            // the destination and `copy_len <= len`; plan reads never overlap, so no other thread
            // writes this range; `src` is a separate (file) mapping, so the ranges do not overlap.
            unsafe {
                std::ptr::copy_nonoverlapping(src.as_ptr(), base.at(read.arena_offset_bytes), src.len())
            };
        }
        state.end_inflight(permit.bytes());
        drop(permit);
        stats.reads += 1;
        stats.bytes_read += read.len_bytes;
        state.land(job, sink, index);
    }
    stats
}

/// The error for a read whose source pages could not be populated. `EFAULT` means the pages
/// past the file's end are gone: the file was truncated after mapping, so this is an unexpected
/// end of file at the file's current length (found with `fstat`).
fn populate_error(job: &Job<'_>, read: &Read, e: io::Error) -> ReadError {
    if e.raw_os_error() != Some(libc::EFAULT) {
        return job_error(read, ReadErrorKind::Io(e));
    }
    let file = &job.files[read.file as usize];
    let now_len = file.buffered.metadata().map_or(read.offset_bytes, |m| m.len());
    let read_bytes = now_len.saturating_sub(read.offset_bytes).min(read.len_bytes);
    ReadError {
        file: read.file,
        offset_bytes: read.offset_bytes + read_bytes,
        len_bytes: read.len_bytes - read_bytes,
        kind: ReadErrorKind::UnexpectedEof { read_bytes, expected_bytes: read.len_bytes },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::JobConfig;
    use proptest::prelude::*;
    use std::io::Write;

    /// Truncates the file after the first read has landed.
    struct TruncateAfterFirst {
        path: std::path::PathBuf,
        done: std::sync::atomic::AtomicU32,
    }

    impl crate::backend::CompletionSink for TruncateAfterFirst {
        fn read_done(&self, _landed: crate::backend::Landed) -> Result<(), crate::backend::StopReason> {
            if self.done.fetch_add(1, Ordering::AcqRel) == 0 {
                std::fs::OpenOptions::new().write(true).open(&self.path).unwrap().set_len(0).unwrap();
            }
            Ok(())
        }
    }

    #[test]
    fn a_file_truncated_after_mapping_is_an_error_not_sigbus() {
        const LEN: usize = 256 << 10;
        let (tmp, f) = source(&vec![5u8; LEN]);
        let extents = [Extent { file: 0, offset_bytes: 0, len_bytes: LEN as u64, tag: 0 }];
        let config =
            tensora_plan::PlanConfig { chunk_bytes: 64 << 10, ..tensora_plan::PlanConfig::default() };
        let plan = tensora_plan::Plan::build(&extents, &config, &tensora_plan::Order::File).unwrap();
        assert_eq!(plan.reads().len(), 4);
        let arena = crate::arena::Arena::with_len(plan.arena_len_bytes()).unwrap();
        let budget = tensora_plan::Budget::new(1 << 20);
        let cancel = std::sync::atomic::AtomicBool::new(false);
        let files = [f];
        // SAFETY: nothing else reads or writes the destination while this job runs.
        let job = unsafe {
            Job::new(
                &plan,
                &files,
                &arena,
                &budget,
                &cancel,
                JobConfig { threads: 1, queue_depth: 1, direct: false, retries_max: 0 },
            )
        };
        let sink = TruncateAfterFirst { path: tmp.path().to_path_buf(), done: Default::default() };
        let backend = MmapBackend::new(MmapConfig { populate_source: true, willneed_lookahead_reads: 0 });
        let err = backend.execute(&job, &sink).unwrap_err();
        assert!(
            matches!(err.kind, ReadErrorKind::UnexpectedEof { read_bytes: 0, .. } | ReadErrorKind::Io(_)),
            "{err}"
        );
        assert_eq!(err.offset_bytes, 64 << 10, "{err}");
        assert_eq!(sink.done.load(Ordering::Acquire), 1);
    }

    fn source(bytes: &[u8]) -> (tempfile::NamedTempFile, SourceFile) {
        let mut tmp = tempfile::NamedTempFile::new().unwrap();
        tmp.write_all(bytes).unwrap();
        tmp.flush().unwrap();
        let f = SourceFile {
            path: tmp.path().to_path_buf(),
            len_bytes: bytes.len() as u64,
            buffered: std::fs::File::open(tmp.path()).unwrap(),
            direct: None,
        };
        (tmp, f)
    }

    #[test]
    fn short_file_is_refused_before_mapping() {
        let (_tmp, mut f) = source(&[1u8; 100]);
        f.len_bytes = 200;
        let err = MappedFiles::map(std::slice::from_ref(&f)).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert!(err.to_string().contains("SIGBUS"), "{err}");
    }

    #[test]
    fn empty_file_maps_to_empty_bytes() {
        let (_tmp, f) = source(&[]);
        let maps = MappedFiles::map(std::slice::from_ref(&f)).unwrap();
        assert_eq!(maps.len_bytes(0), Some(0));
        assert_eq!(maps.bytes(0, 0..0), &[] as &[u8]);
        assert_eq!(
            maps.residency(&[FileRange { file: 0, offset_bytes: 0, len_bytes: 0 }]).unwrap().fraction(),
            1.0
        );
    }

    #[test]
    fn out_of_bounds_ranges_are_errors_not_panics() {
        let (_tmp, f) = source(&[3u8; 5000]);
        let maps = MappedFiles::map(std::slice::from_ref(&f)).unwrap();
        let past = [FileRange { file: 0, offset_bytes: 4000, len_bytes: 2000 }];
        assert_eq!(maps.residency(&past).unwrap_err().kind(), io::ErrorKind::InvalidInput);
        assert_eq!(maps.prewarm(&past, 2).unwrap_err().kind(), io::ErrorKind::InvalidInput);
        assert_eq!(maps.advise_willneed(&past).unwrap_err().kind(), io::ErrorKind::InvalidInput);
        let overflow = [FileRange { file: 0, offset_bytes: u64::MAX, len_bytes: 2 }];
        assert!(maps.lock(&overflow).is_err());
        assert!(maps.lock(&[FileRange { file: 1, offset_bytes: 0, len_bytes: 1 }]).is_err());
        assert!(maps.get(0, 4000..6000).is_none());
        assert!(maps.get(9, 0..1).is_none());
    }

    #[test]
    fn lock_prewarm_and_residency_of_hot_set() {
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let (_tmp, f) = source(&data);
        let maps = MappedFiles::map(std::slice::from_ref(&f)).unwrap();
        let hot = [FileRange { file: 0, offset_bytes: 10, len_bytes: 50_000 }];
        assert_eq!(maps.prewarm(&hot, 3).unwrap(), 50_000);
        maps.lock(&hot).unwrap();
        let r = maps.residency(&hot).unwrap();
        assert_eq!(r.pages_resident, r.pages_total);
        assert_eq!(r.pages_total, (10 + 50_000u64).div_ceil(page_size_bytes()));
        let sampled = maps.residency_sampled(&hot, 4).unwrap();
        assert!(sampled.pages_total <= 5 && sampled.pages_total >= 1, "{sampled:?}");
        assert_eq!(sampled.fraction(), 1.0);
        maps.unlock(&hot).unwrap();
        assert_eq!(maps.bytes(0, 1000..1010), &data[1000..1010]);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn get_matches_file_contents(len in 0usize..20_000, a in 0u64..25_000, b in 0u64..25_000) {
            let data: Vec<u8> = (0..len).map(|i| (i * 7 % 256) as u8).collect();
            let (_tmp, f) = source(&data);
            let maps = MappedFiles::map(std::slice::from_ref(&f)).unwrap();
            let (lo, hi) = (a.min(b), a.max(b));
            let got = maps.get(0, lo..hi);
            if hi as usize <= len {
                prop_assert_eq!(got, Some(&data[lo as usize..hi as usize]));
            } else {
                prop_assert!(got.is_none());
            }
        }
    }
}
