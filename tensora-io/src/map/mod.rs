//! Memory-mapped checkpoint files: private read-only mappings with access advice, prewarm,
//! `mlock` of a hot set and a page-cache residency report, plus
//! [`MmapBackend`](crate::backends::mmap::MmapBackend), which copies plan reads out of the
//! mappings into a destination with worker threads (the owned mode). The
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
//! use tensora_io::{FileRange, MappedFiles};
//!
//! let mut tmp = tempfile::NamedTempFile::new()?;
//! tmp.write_all(&[7u8; 10_000])?;
//! let file = SourceFile {
//!     path: tmp.path().to_path_buf(),
//!     len_bytes: 10_000,
//!     buffered: std::fs::File::open(tmp.path())?,
//!     direct: None,
//! };
//! // SAFETY: a temporary file nothing else modifies or truncates while it is mapped.
//! let maps = unsafe { MappedFiles::map(std::slice::from_ref(&file)) }?;
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
use std::sync::atomic::AtomicBool;

use memmap2::{Advice, Mmap, MmapMut, MmapOptions};

pub mod fill;
pub mod populate;
pub mod readahead;

use populate::{PopulateConfig, PopulateError, ReadAhead, Span};
use tensora_plan::{Extent, Read};

use crate::seam::SourceFile;

/// Pages per `mincore` call (bounds the residency vector at 64 KiB).
const RESIDENCY_WINDOW_PAGES: u64 = 1 << 16;
/// `mlock` or `munlock`.
#[derive(Debug, Clone, Copy)]
enum LockOp {
    Lock,
    Unlock,
}

/// A byte range of one mapped file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileRange {
    /// Index of the file in the [`MappedFiles`].
    pub file: u32,
    /// First byte (file offset).
    pub offset_bytes: u64,
    /// Length in bytes.
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
    /// Pages the ranges cover.
    pub pages_total: u64,
    /// Of those, pages in the page cache.
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
    /// # Safety
    ///
    /// As for `memmap2`'s maps: the files must be neither modified nor truncated while mapped.
    /// In-place writes by others show through the returned bytes (live views, not a snapshot: a
    /// `&[u8]` changing under its holder), and a truncation turns later accesses into `SIGBUS`.
    /// See the module docs.
    pub unsafe fn map(files: &[SourceFile]) -> io::Result<MappedFiles> {
        // SAFETY: the caller's contract.
        unsafe { MappedFiles::map_with(files, MapMode::ReadOnly) }
    }

    /// [`MappedFiles::map`] with a choice of [`MapMode`].
    ///
    /// # Safety
    ///
    /// As for [`MappedFiles::map`].
    pub unsafe fn map_with(files: &[SourceFile], mode: MapMode) -> io::Result<MappedFiles> {
        // SAFETY: the caller's contract.
        unsafe { MappedFiles::map_indexed(files, mode) }.map_err(|(_, e)| e)
    }

    /// [`MappedFiles::map_with`], naming the index of the file that failed.
    ///
    /// # Safety
    ///
    /// As for [`MappedFiles::map`].
    pub(crate) unsafe fn map_indexed(
        files: &[SourceFile],
        mode: MapMode,
    ) -> Result<MappedFiles, (u32, io::Error)> {
        let mut maps = Vec::with_capacity(files.len());
        for (i, f) in files.iter().enumerate() {
            maps.push(map_one(f, mode).map_err(|e| (i as u32, e))?);
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

    /// Reads the pages of `ranges` into this mapping (from disk if needed) with up to `threads`
    /// threads, so that later accesses do not fault: [`populate::populate`], one
    /// `MADV_POPULATE_READ` per 8 MiB piece. On kernels without it (before 5.14) the pages are left
    /// to first touch; nothing is touched here. Returns the number of bytes covered.
    pub fn prewarm(&self, ranges: &[FileRange], threads: usize) -> io::Result<u64> {
        let spans = ranges.iter().map(|r| self.span_of(r)).collect::<io::Result<Vec<Span>>>()?;
        let never = AtomicBool::new(false);
        let cfg = PopulateConfig { threads, cancel: &never, progress: None, ahead: ReadAhead::Ahead };
        // SAFETY: every span lies inside one of this object's mappings (checked by `span_of`),
        // which start on page boundaries and stay mapped while `self` is borrowed.
        match unsafe { populate::populate(&spans, &cfg) } {
            Ok(done) => Ok(done.bytes),
            Err(PopulateError::Io { source, .. }) => Err(source),
            Err(PopulateError::Cancelled) => Err(io::Error::other("prewarm cancelled")),
        }
    }

    /// Reads in one range's pages (see [`populate`]); `EFAULT` (the file was truncated after it
    /// was mapped) comes back as [`io::ErrorKind::UnexpectedEof`].
    pub(crate) fn prewarm_piece(&self, piece: &FileRange) -> io::Result<()> {
        let span = self.span_of(piece)?;
        // SAFETY: the span lies inside one of this object's live, page-aligned mappings.
        unsafe { populate::populate_one(span) }.map(|_| ())
    }

    /// The memory of `r` in its mapping.
    pub(crate) fn span_of(&self, r: &FileRange) -> io::Result<Span> {
        let (map, start, len) = self.span(r)?;
        Ok(Span { addr: map.base + start, len_bytes: len })
    }

    /// `mlock`s the pages of `ranges` (reading them in first): they stay resident until
    /// [`MappedFiles::unlock`] or until the mapping is dropped. Needs `CAP_IPC_LOCK` or enough
    /// `RLIMIT_MEMLOCK`; the error says so.
    pub fn lock(&self, ranges: &[FileRange]) -> io::Result<()> {
        self.lock_op(ranges, LockOp::Lock)
    }

    /// `munlock`s the pages of `ranges`.
    pub fn unlock(&self, ranges: &[FileRange]) -> io::Result<()> {
        self.lock_op(ranges, LockOp::Unlock)
    }

    fn lock_op(&self, ranges: &[FileRange], op: LockOp) -> io::Result<()> {
        for r in ranges {
            let Some((addr, len)) = self.page_span(r)? else { continue };
            // SAFETY: [addr, addr + len) is page-aligned and lies inside this live mapping
            // (checked by `page_span`); mlock/munlock do not change its contents.
            let rc = unsafe {
                match op {
                    LockOp::Lock => libc::mlock(addr as *const libc::c_void, len),
                    LockOp::Unlock => libc::munlock(addr as *const libc::c_void, len),
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
#[cfg(test)]
mod tests {
    use super::*;
    use crate::seam::temp_source as source;

    /// Maps test files read-only.
    fn map_read_only(files: &[SourceFile]) -> io::Result<MappedFiles> {
        // SAFETY: temporary files that nothing else modifies or truncates while they are mapped.
        unsafe { MappedFiles::map(files) }
    }

    use proptest::prelude::*;

    #[test]
    fn short_file_is_refused_before_mapping() {
        let (_tmp, mut f) = source(&[1u8; 100]);
        f.len_bytes = 200;
        let err = map_read_only(std::slice::from_ref(&f)).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert!(err.to_string().contains("SIGBUS"), "{err}");
    }

    #[test]
    fn empty_file_maps_to_empty_bytes() {
        let (_tmp, f) = source(&[]);
        let maps = map_read_only(std::slice::from_ref(&f)).unwrap();
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
        let maps = map_read_only(std::slice::from_ref(&f)).unwrap();
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
        let maps = map_read_only(std::slice::from_ref(&f)).unwrap();
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
            let maps = map_read_only(std::slice::from_ref(&f)).unwrap();
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
