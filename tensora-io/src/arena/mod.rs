//! The owned destination: an anonymous mapping, 2 MiB aligned, advised for transparent huge pages.
//!
//! On a machine whose THP mode is `madvise`, memory only gets 2 MiB pages when it is advised with
//! `MADV_HUGEPAGE` *before* it is first touched. Faulting a multi-GB destination in 4 KiB pages costs
//! 3-6x the copy throughput, so the arena is the warm-path optimisation, not a detail.
//!
//! How the pages get faulted in is an explicit [`Prefault`] choice:
//! - [`Prefault::None`]: the backend's writes fault the pages in (in parallel, on the I/O workers).
//! - [`Prefault::MapPopulate`]: `MAP_POPULATE` at map time. The kernel populates before the mapping
//!   can be advised, so under THP `madvise` mode these are 4 KiB pages (measured, see
//!   `examples/arena_prefault.rs`); kept for comparison and for THP `always` machines.
//! - [`Prefault::PopulateWrite`]: `MADV_POPULATE_WRITE` after `MADV_HUGEPAGE` (Linux 5.14+): the
//!   kernel populates huge pages in one call. Falls back to a one-thread touch on older kernels.
//! - [`Prefault::ParallelTouch`]: `threads` threads each write one byte per 4 KiB page of their
//!   share, after `MADV_HUGEPAGE`.
//!
//! # Huge pages only where they come cheap
//!
//! On a virtual machine that hands free memory back to its hypervisor (virtio-balloon free page
//! reporting, as on the 2-core reference VM), free 2 MiB blocks that stayed free for a few seconds
//! are given back, and a huge page is always such a block: faulting it in makes the host fault
//! 512 pages, and runs at 0.3-0.7 GB/s per thread against 7-9 GB/s for a block freed a moment ago.
//! Base pages come from smaller free fragments, which are never handed back, and fault in at
//! 2-4 GB/s. So a fresh arena ([`Prefault::None`], what loads use) of at least
//! [`FRESH_PROBE_MIN_BYTES`] advises huge pages, faults its first [`FRESH_PROBE_BYTES`] in, one
//! huge page at a time, and times each in the thread's CPU time (the host's fault handling counts
//! there, another process's time slice does not): when two in a row ran below
//! [`HUGE_FAULT_BYTES_PER_SECOND_MIN`] the rest of the arena gets base pages
//! ([`Arena::use_base_pages`]). [`Arena::populate_write_adaptive`] makes the same check as
//! it goes (the direct-I/O populate helper of an owned load uses it), since a burst of recently
//! freed blocks can run out in the middle of an arena. Huge pages still matter where they are
//! cheap: direct reads into them reach the device as 2 MiB requests, into base pages as about
//! 1 MiB ones (docs/design.md has the measurements).
//!
//! # Recycling
//!
//! Fresh anonymous memory must be zeroed by the kernel on first touch, which costs about as much as
//! the copy itself. [`Arena::recycle`] therefore parks one released arena (at most
//! [`parking::RECYCLE_BYTES_MAX`]) after `MADV_FREE`: the kernel may reclaim its pages under memory pressure
//! (they are then zero again on reuse), and if it does not, the next [`Arena::recycled`] request
//! that fits reuses them without a single page fault. The load API recycles the arenas of dropped
//! `Loaded` values and finished streams; [`drop_recycled`] unmaps the parked one at once.
//! A recycled arena's bytes are unspecified (old contents or zeros) until written.
//!
//! # Example
//!
//! ```
//! use tensora_io::{Arena, ArenaConfig, Prefault};
//!
//! let mut arena = Arena::new(&ArenaConfig { len_bytes: 3 << 20, prefault: Prefault::ParallelTouch { threads: 2 } })?;
//! assert_eq!(arena.len_bytes(), 3 << 20);
//! assert_eq!(arena.as_ptr() as usize % Arena::ALIGN_BYTES as usize, 0);
//! arena.as_mut_slice()[0] = 7;
//! assert_eq!(arena.as_slice()[0], 7);
//! # Ok::<(), std::io::Error>(())
//! ```

use std::io;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use crate::seam::{Destination, KeepMapped};

mod parking;
use parking::RECYCLED;
pub use parking::{drop_recycled, drop_recycled_larger_than};

/// How an [`Arena`]'s pages are faulted in before use. See the module docs for measurements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Prefault {
    /// Leave it to the first writer.
    #[default]
    None,
    /// `MAP_POPULATE` at map time (4 KiB pages unless THP is `always`).
    MapPopulate,
    /// `MADV_POPULATE_WRITE` after `MADV_HUGEPAGE`.
    PopulateWrite,
    /// Touch every page from `threads` threads (at least 1) after `MADV_HUGEPAGE`.
    ParallelTouch {
        /// Touching threads (at least 1, at most 64).
        threads: usize,
    },
}

/// What to allocate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArenaConfig {
    /// Usable length. The mapping is rounded up to a multiple of [`Arena::ALIGN_BYTES`].
    pub len_bytes: u64,
    /// How the pages are faulted in before use.
    pub prefault: Prefault,
}

/// Fresh arenas at least this large time their first huge pages before keeping them (smaller
/// ones are advised huge pages and left alone: the probe would cost more than it saves).
pub const FRESH_PROBE_MIN_BYTES: u64 = 64 << 20;
/// Bytes a fresh arena faults in to time its huge pages (two of them).
pub const FRESH_PROBE_BYTES: u64 = 4 << 20;
/// The slowest fault-in rate, in bytes per CPU second of the faulting thread, at which an arena
/// keeps asking for huge pages. Huge pages the host still backs fault in at 7-9 GB/s, ones the
/// hypervisor took back at 0.3-0.7 GB/s, and base pages at 2-4 GB/s (see the module docs).
pub const HUGE_FAULT_BYTES_PER_SECOND_MIN: f64 = 1.5e9;
/// A range is timed only when it is at least one huge page long (a shorter one says little).
const ADAPT_MIN_BYTES: u64 = 2 << 20;
/// Slow samples in a row before an arena gives up huge pages: one slow sample is often a fault
/// that waited on something else (compaction, a neighbour's burst), and giving up huge pages for
/// the rest of a multi-GB arena on it cost warm loads up to half their speed in paired runs.
const SLOW_SAMPLES_TO_SWITCH: u32 = 2;

/// The pages an arena's memory that is not faulted in yet will get.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pages {
    /// 2 MiB transparent huge pages (`MADV_HUGEPAGE` accepted).
    Huge,
    /// 4 KiB base pages (no huge-page advice, or `MADV_NOHUGEPAGE` after a slow probe).
    Base,
}

/// CPU seconds the calling thread has run (`CLOCK_THREAD_CPUTIME_ID`); the time a hypervisor
/// spends on this thread's page faults counts, time slices of other threads do not. `None` if the
/// clock is unavailable.
fn thread_cpu_seconds() -> Option<f64> {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    (rc == 0).then_some(ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9)
}

/// Whether huge pages are worth keeping after `bytes` of them faulted in in `cpu_seconds` of the
/// faulting thread: yes unless at least [`ADAPT_MIN_BYTES`] were timed and ran slower than
/// [`HUGE_FAULT_BYTES_PER_SECOND_MIN`] (an unknown or zero time keeps them).
fn huge_pages_pay(bytes: u64, cpu_seconds: Option<f64>) -> bool {
    match cpu_seconds {
        Some(s) if s > 0.0 && bytes >= ADAPT_MIN_BYTES => bytes as f64 / s >= HUGE_FAULT_BYTES_PER_SECOND_MIN,
        _ => true,
    }
}

/// The slow samples in a row after one more sample (`pays`: it ran fast enough), and whether the
/// arena should now give up huge pages.
fn slow_streak(streak: u32, pays: bool) -> (u32, bool) {
    if pays {
        return (0, false);
    }
    let streak = streak.saturating_add(1);
    (streak, streak >= SLOW_SAMPLES_TO_SWITCH)
}

/// Page size used for touching.
const TOUCH_STRIDE_BYTES: usize = 4096;
/// Upper bound on prefault threads, whatever the caller asks.
const TOUCH_THREADS_MAX: usize = 64;

/// The mapping of an arena, unmapped when its last owner goes: the arena, or a
/// [`KeepMapped`] that a load handed out with the arena's pieces (so that they can be written
/// elsewhere after the load returned, see [`crate::seam::HeldPiece`]).
#[derive(Debug)]
struct Mapping {
    ptr: NonNull<u8>,
    /// 0 for an empty arena (nothing to unmap).
    map_len_bytes: usize,
}

// SAFETY: the mapping is an address range this value alone unmaps; moving or sharing it shares
// only the address.
unsafe impl Send for Mapping {}
// SAFETY: as above; `&Mapping` exposes nothing.
unsafe impl Sync for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        if self.map_len_bytes > 0 {
            // SAFETY: unmapping exactly the mapping this value owns, once its last owner (the
            // arena or a keep-alive) is gone: no borrow of it and no held piece outlives them.
            unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.map_len_bytes) };
        }
    }
}

/// An owned, zero-initialised, 2 MiB aligned anonymous mapping advised with `MADV_HUGEPAGE`.
/// Freed with `munmap` on drop (or, when a [`KeepMapped`] from [`Arena::keep_mapped`] still
/// lives, once the last one goes).
///
/// `Arena` implements [`Destination`]: while a backend runs, it writes through
/// [`Destination::host_ptr`] from several threads. Safe reads therefore take `&mut self`
/// ([`Arena::as_slice`]), which proves no backend is writing at the same time.
#[derive(Debug)]
pub struct Arena {
    ptr: NonNull<u8>,
    len_bytes: usize,
    /// Length of the mapping (a multiple of `ALIGN_BYTES`); 0 for an empty arena (no mapping).
    map_len_bytes: usize,
    /// Whether pages not yet faulted in get huge pages (`MADV_HUGEPAGE` accepted and not turned
    /// off by [`Arena::use_base_pages`]).
    huge_advised: AtomicBool,
    /// Slow huge-page samples in a row ([`Arena::populate_write_adaptive`]).
    slow_samples: AtomicU32,
    /// Unmaps the memory when the arena and every keep-alive are gone.
    mapping: Arc<Mapping>,
}

// SAFETY: the arena owns its mapping exclusively; the raw pointer is only an address. Concurrent
// writes go through `Destination::host_ptr` under the `Destination` contract (disjoint ranges).
unsafe impl Send for Arena {}
// SAFETY: as above; `&Arena` only exposes the pointer and lengths, and reads that could race with
// backend writes require `&mut self` or go through `slice_unchecked`, whose callers guarantee no
// concurrent writer for the range.
unsafe impl Sync for Arena {}

impl Arena {
    /// Alignment of every arena's base address: one x86-64 huge page.
    pub const ALIGN_BYTES: u64 = 2 << 20;

    /// Map, align, advise and prefault an arena.
    ///
    /// Errors: `len_bytes` does not fit the address space, or `mmap` failed (e.g. `ENOMEM`).
    pub fn new(config: &ArenaConfig) -> io::Result<Arena> {
        let align = Self::ALIGN_BYTES as usize;
        let len_bytes = usize::try_from(config.len_bytes)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "arena length exceeds address space"))?;
        if len_bytes == 0 {
            // No mapping; a well-aligned dangling pointer is valid for zero-length slices.
            return Ok(Arena::empty());
        }
        let map_len_bytes = len_bytes
            .checked_next_multiple_of(align)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "arena length overflows"))?;
        let reserve_len_bytes = map_len_bytes
            .checked_add(align)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "arena length overflows"))?;
        let populate = config.prefault == Prefault::MapPopulate;
        // Reserve `align` extra bytes so an aligned start exists inside, then trim head and tail.
        // With MAP_POPULATE the reservation is PROT_NONE and the aligned part is re-mapped with
        // MAP_FIXED | MAP_POPULATE so the slack is never populated.
        let reserve_prot = if populate { libc::PROT_NONE } else { libc::PROT_READ | libc::PROT_WRITE };
        // SAFETY: a fresh anonymous private mapping at a kernel-chosen address; no existing memory
        // is affected. The result is checked against MAP_FAILED.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                reserve_len_bytes,
                reserve_prot,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let raw_addr = raw as usize;
        let start_addr = raw_addr.next_multiple_of(align);
        let head_bytes = start_addr - raw_addr;
        let tail_bytes = reserve_len_bytes - head_bytes - map_len_bytes;
        // SAFETY: `start` lies inside the reservation we just made (head_bytes < align).
        let start = unsafe { raw.cast::<u8>().add(head_bytes) };
        if head_bytes > 0 {
            // SAFETY: unmapping the unaligned head of our own reservation, which nothing references.
            unsafe { libc::munmap(raw, head_bytes) };
        }
        if tail_bytes > 0 {
            // SAFETY: unmapping the slack after the aligned part of our own reservation.
            unsafe { libc::munmap(start.add(map_len_bytes).cast(), tail_bytes) };
        }
        let ptr = NonNull::new(start).ok_or_else(|| io::Error::other("mmap returned null"))?;
        let mut arena = Arena {
            ptr,
            len_bytes,
            map_len_bytes,
            huge_advised: AtomicBool::new(false),
            slow_samples: AtomicU32::new(0),
            mapping: Arc::new(Mapping { ptr, map_len_bytes }),
        };
        if populate {
            // SAFETY: MAP_FIXED over exactly the aligned range that this arena owns (our own
            // PROT_NONE reservation), so no other mapping is replaced.
            let fixed = unsafe {
                libc::mmap(
                    start.cast(),
                    map_len_bytes,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED | libc::MAP_POPULATE,
                    -1,
                    0,
                )
            };
            if fixed == libc::MAP_FAILED {
                return Err(io::Error::last_os_error()); // `arena` drops and unmaps the reservation.
            }
        }
        // SAFETY: advising our own mapping; MADV_HUGEPAGE changes no contents.
        let advised = unsafe { libc::madvise(start.cast(), map_len_bytes, libc::MADV_HUGEPAGE) };
        arena.huge_advised = AtomicBool::new(advised == 0);
        match config.prefault {
            Prefault::None if map_len_bytes as u64 >= FRESH_PROBE_MIN_BYTES => {
                // Huge pages only where they come cheap (module docs). A hint: a kernel without
                // MADV_POPULATE_WRITE keeps the huge-page advice.
                for k in 0..FRESH_PROBE_BYTES / ADAPT_MIN_BYTES {
                    let _ = arena.populate_write_adaptive(k * ADAPT_MIN_BYTES, ADAPT_MIN_BYTES);
                }
            }
            Prefault::None | Prefault::MapPopulate => {}
            Prefault::PopulateWrite => {
                // SAFETY: populating our own writable mapping; contents stay zero.
                let rc = unsafe { libc::madvise(start.cast(), map_len_bytes, libc::MADV_POPULATE_WRITE) };
                if rc != 0 {
                    arena.touch(1);
                }
            }
            Prefault::ParallelTouch { threads } => arena.touch(threads),
        }
        Ok(arena)
    }

    /// An arena of `len_bytes` whose contents are unspecified: the parked arena (see the module
    /// docs) when it fits, otherwise a fresh one with no prefault.
    pub fn recycled(len_bytes: u64) -> io::Result<Arena> {
        match Arena::take_recycled(len_bytes) {
            Some(a) => Ok(a),
            None => Arena::with_len(len_bytes),
        }
    }

    /// The parked arena (see the module docs) if it fits `len_bytes`, its pages faulted in by the
    /// load that parked it; `None` otherwise.
    pub(crate) fn take_recycled(len_bytes: u64) -> Option<Arena> {
        RECYCLED.take_fitting(len_bytes)
    }

    /// Release this arena for reuse: `MADV_FREE` its pages and park it, replacing (and unmapping)
    /// any arena parked before. Arenas over `parking::RECYCLE_BYTES_MAX` are unmapped instead.
    pub fn recycle(self) {
        RECYCLED.park(self);
    }

    /// An arena with no memory (no mapping).
    pub fn empty() -> Arena {
        let ptr = NonNull::new(std::ptr::without_provenance_mut::<u8>(Self::ALIGN_BYTES as usize))
            .unwrap_or(NonNull::dangling());
        Arena {
            ptr,
            len_bytes: 0,
            map_len_bytes: 0,
            huge_advised: AtomicBool::new(false),
            slow_samples: AtomicU32::new(0),
            mapping: Arc::new(Mapping { ptr, map_len_bytes: 0 }),
        }
    }

    /// Keep this arena's memory mapped for as long as the returned value (or a piece handed out
    /// under it) lives, even after the arena is dropped; an arena with a keep-alive out is never
    /// parked for reuse ([`Arena::recycle`] unmaps it once the last one goes). What a load gives a
    /// backend that writes its pieces elsewhere after the load returned
    /// ([`crate::Job::with_kept_mapping`]).
    ///
    /// ```
    /// use tensora_io::Arena;
    ///
    /// let arena = Arena::with_len(4096)?;
    /// let keep = arena.keep_mapped();
    /// drop(arena); // still mapped: `keep` holds it
    /// drop(keep); // unmapped now
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn keep_mapped(&self) -> KeepMapped {
        let owner: Arc<dyn Send + Sync> = Arc::clone(&self.mapping) as Arc<dyn Send + Sync>;
        // SAFETY: `ptr..ptr + len_bytes` lies inside the mapping, which `Mapping` unmaps only
        // when its last `Arc` (the one in `owner` among them) is dropped.
        unsafe { KeepMapped::new(owner, self.ptr, self.len_bytes) }
    }

    /// Whether a keep-alive from [`Arena::keep_mapped`] still holds this arena's memory.
    pub fn is_kept_mapped(&self) -> bool {
        Arc::strong_count(&self.mapping) > 1
    }

    /// A zero-length-or-larger arena with no prefault. Shorthand for [`Arena::new`].
    pub fn with_len(len_bytes: u64) -> io::Result<Arena> {
        Arena::new(&ArenaConfig { len_bytes, prefault: Prefault::None })
    }

    /// Write one byte per 4 KiB page from `threads` scoped threads.
    fn touch(&mut self, threads: usize) {
        let threads = threads.clamp(1, TOUCH_THREADS_MAX);
        let len = self.map_len_bytes;
        if len == 0 {
            return;
        }
        let pages = len.div_ceil(TOUCH_STRIDE_BYTES);
        let pages_per_thread = pages.div_ceil(threads);
        let base = self.ptr.as_ptr() as usize;
        std::thread::scope(|s| {
            let mut touchers = Vec::with_capacity(threads);
            for t in 0..threads {
                let first_page = t * pages_per_thread;
                let end_page = ((t + 1) * pages_per_thread).min(pages);
                if first_page >= end_page {
                    break;
                }
                touchers.push(s.spawn(move || {
                    for page in first_page..end_page {
                        let p = (base + page * TOUCH_STRIDE_BYTES) as *mut u8;
                        // SAFETY: `p` lies inside this arena's writable mapping (page < pages and
                        // the mapping is a whole number of pages); `&mut self` guarantees nobody else
                        // reads or writes it, and threads touch disjoint pages. Writing 0 over the
                        // zero-filled page keeps the contents unchanged.
                        unsafe { std::ptr::write_volatile(p, 0) };
                    }
                }));
            }
            // Joined, not left to the scope, so no thread outlives the call.
            for h in touchers {
                if let Err(payload) = h.join() {
                    std::panic::resume_unwind(payload);
                }
            }
        });
    }

    /// Usable length in bytes.
    pub fn len_bytes(&self) -> u64 {
        self.len_bytes as u64
    }

    /// Whether the arena has no usable bytes.
    pub fn is_empty(&self) -> bool {
        self.len_bytes == 0
    }

    /// Whether pages not faulted in yet get huge pages: `MADV_HUGEPAGE` was accepted (false on
    /// kernels without THP) and no probe turned it off (see the module docs).
    pub fn huge_pages_advised(&self) -> bool {
        self.huge_advised.load(Ordering::Relaxed)
    }

    /// The pages memory not faulted in yet will get.
    pub fn pages(&self) -> Pages {
        if self.huge_pages_advised() { Pages::Huge } else { Pages::Base }
    }

    /// From now on, fault the arena in with base pages (`MADV_NOHUGEPAGE` over the whole
    /// mapping). Pages already present keep their size and contents, so this is safe while
    /// backends write into the arena or DMA lands in it.
    pub fn use_base_pages(&self) -> io::Result<()> {
        if self.map_len_bytes == 0 {
            return Ok(());
        }
        // SAFETY: advising this arena's own mapping; MADV_NOHUGEPAGE only changes which pages
        // later faults allocate, never a present page or a byte of memory.
        let rc =
            unsafe { libc::madvise(self.ptr.as_ptr().cast(), self.map_len_bytes, libc::MADV_NOHUGEPAGE) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        self.huge_advised.store(false, Ordering::Relaxed);
        Ok(())
    }

    /// [`Arena::populate_write`], timed in the calling thread's CPU time while the arena asks for
    /// huge pages: when `SLOW_SAMPLES_TO_SWITCH` timed ranges in a row (each at least a huge
    /// page) faulted in slower than `HUGE_FAULT_BYTES_PER_SECOND_MIN`, the rest of the arena
    /// gets base pages
    /// ([`Arena::use_base_pages`]). Returns the pages memory not faulted in yet will get. Errors
    /// are those of `populate_write` (a hint: kernels before 5.14).
    pub fn populate_write_adaptive(&self, offset_bytes: u64, len_bytes: u64) -> io::Result<Pages> {
        if !self.huge_pages_advised() {
            self.populate_write(offset_bytes, len_bytes)?;
            return Ok(Pages::Base);
        }
        let before = thread_cpu_seconds();
        self.populate_write(offset_bytes, len_bytes)?;
        let spent = before.zip(thread_cpu_seconds()).map(|(a, b)| b - a);
        let bytes = len_bytes.min((self.len_bytes as u64).saturating_sub(offset_bytes));
        let (streak, give_up) =
            slow_streak(self.slow_samples.load(Ordering::Relaxed), huge_pages_pay(bytes, spent));
        self.slow_samples.store(streak, Ordering::Relaxed);
        if give_up {
            self.use_base_pages()?;
        }
        Ok(self.pages())
    }

    /// Base address.
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// The whole arena as bytes. Takes `&mut self` so that no backend can be writing into it.
    pub fn as_slice(&mut self) -> &[u8] {
        // SAFETY: `ptr` is valid for `len_bytes` initialised (zero-filled or written) bytes for the
        // arena's life; the exclusive borrow rules out concurrent writers.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len_bytes) }
    }

    /// The whole arena as a writable byte buffer (e.g. for a `pread` roofline).
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`; the exclusive borrow makes the mutable slice unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len_bytes) }
    }

    /// Faults in `offset_bytes .. + len_bytes` (widened to whole pages, clipped to the arena)
    /// with `MADV_POPULATE_WRITE`, without reading or writing any byte: pages already present keep
    /// their contents, missing ones arrive zero-filled, exactly as a first write would find them.
    /// So it is safe while backends write into the arena, or DMA lands in it, concurrently. A
    /// hint: errors (kernels before 5.14) are returned for the caller to ignore.
    pub fn populate_write(&self, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
        let page_bytes = crate::map::page_size_bytes();
        let end = offset_bytes.saturating_add(len_bytes).min(self.len_bytes as u64);
        let start = (offset_bytes / page_bytes) * page_bytes;
        if start >= end {
            return Ok(());
        }
        let len = (end.next_multiple_of(page_bytes) - start).min(self.map_len_bytes as u64 - start);
        // SAFETY: the range is page-aligned and lies inside this arena's own writable mapping
        // (`start < len_bytes <= map_len_bytes`, `len` clipped to the mapping); MADV_POPULATE_WRITE
        // only populates page tables and changes no byte of memory that is already present.
        let rc = unsafe {
            libc::madvise(
                self.ptr.as_ptr().add(start as usize).cast(),
                len as usize,
                libc::MADV_POPULATE_WRITE,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Bytes of `offset_bytes .. offset_bytes + len_bytes`, without an exclusive borrow.
    ///
    /// # Safety
    ///
    /// No thread may write to this range while the returned slice lives (for example: every plan
    /// read covering the range has completed and no later run targets it).
    ///
    /// # Panics
    ///
    /// Never on a range inside the arena; the range is checked and an out-of-range request yields
    /// an empty slice.
    pub(crate) unsafe fn slice_unchecked(&self, offset_bytes: u64, len_bytes: u64) -> &[u8] {
        let in_range = offset_bytes.checked_add(len_bytes).is_some_and(|end| end <= self.len_bytes as u64);
        if !in_range {
            return &[];
        }
        // SAFETY: the range lies inside the mapping (checked above); the caller guarantees no
        // concurrent writer.
        unsafe {
            std::slice::from_raw_parts(self.ptr.as_ptr().add(offset_bytes as usize), len_bytes as usize)
        }
    }
}

// SAFETY: `ptr` is valid for `len_bytes` writable bytes for the arena's whole life and never moves;
// writes to disjoint ranges from several threads touch disjoint memory.
unsafe impl Destination for Arena {
    fn len_bytes(&self) -> u64 {
        self.len_bytes as u64
    }
    fn host_ptr(&self) -> NonNull<u8> {
        self.ptr
    }
    fn align_bytes(&self) -> u64 {
        Self::ALIGN_BYTES
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn all_prefaults() -> [Prefault; 4] {
        [
            Prefault::None,
            Prefault::MapPopulate,
            Prefault::PopulateWrite,
            Prefault::ParallelTouch { threads: 3 },
        ]
    }

    #[test]
    fn populate_write_keeps_contents_and_clips_to_the_arena() {
        let mut a = Arena::with_len((4 << 20) + 100).unwrap();
        a.as_mut_slice()[5000] = 9;
        // Kernels before 5.14 have no MADV_POPULATE_WRITE (EINVAL): a hint, so that is allowed,
        // but only if even a plain page-aligned call fails; otherwise every call must succeed.
        let supported = match a.populate_write(0, 4096) {
            Ok(()) => true,
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{e}");
                false
            }
        };
        // Inside and unaligned, straddling the end, past the end, empty: never out of bounds.
        for (offset, len) in [(4000u64, 3 << 20), (4 << 20, 1 << 30), (64 << 20, 4096), (17, 0)] {
            let r = a.populate_write(offset, len);
            assert!(r.is_ok() || !supported, "{offset}+{len}: {r:?}");
        }
        let bytes = a.as_slice();
        assert_eq!(bytes[5000], 9, "present pages keep their contents");
        assert_eq!(bytes.iter().map(|&b| u64::from(b)).sum::<u64>(), 9, "everything else is still zero");
    }

    #[test]
    fn huge_pages_are_kept_unless_a_huge_page_or_more_faulted_in_slowly() {
        let mib = 1u64 << 20;
        // 8 MiB in 1 ms is 8.4 GB/s (host-backed), in 20 ms 0.42 GB/s (handed back).
        assert!(huge_pages_pay(8 * mib, Some(0.001)));
        assert!(!huge_pages_pay(8 * mib, Some(0.020)));
        // At the threshold: kept.
        assert!(huge_pages_pay(3_000_000_000, Some(2.0)));
        // Too little timed, or no usable clock: kept.
        assert!(huge_pages_pay(mib, Some(10.0)));
        assert!(huge_pages_pay(8 * mib, None));
        assert!(huge_pages_pay(8 * mib, Some(0.0)));
    }

    #[test]
    fn base_pages_keep_contents_and_adaptive_populate_keeps_them_too() {
        let mut a = Arena::with_len(8 << 20).unwrap();
        a.as_mut_slice()[3 << 20] = 5;
        let before = a.pages();
        assert_eq!(before == Pages::Huge, a.huge_pages_advised());
        // Whatever the machine decides, populating never changes a byte.
        match a.populate_write_adaptive(0, 8 << 20) {
            Ok(pages) => assert_eq!(pages, a.pages()),
            Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{e}"),
        }
        a.use_base_pages().unwrap();
        assert_eq!(a.pages(), Pages::Base);
        assert!(!a.huge_pages_advised());
        // Base pages stay base pages: nothing to time.
        assert!(matches!(a.populate_write_adaptive(4 << 20, 4 << 20), Ok(Pages::Base) | Err(_)));
        let bytes = a.as_slice();
        assert_eq!(bytes[3 << 20], 5);
        assert_eq!(bytes.iter().map(|&b| u64::from(b)).sum::<u64>(), 5);
        Arena::empty().use_base_pages().unwrap();
        // A fresh arena large enough to be probed is zeroed and writable whatever it chose.
        let mut big = Arena::with_len(FRESH_PROBE_MIN_BYTES).unwrap();
        assert!(big.as_slice()[..FRESH_PROBE_BYTES as usize + 4096].iter().all(|&b| b == 0));
        big.as_mut_slice()[0] = 1;
        assert_eq!(big.as_slice()[0], 1);
    }

    #[test]
    fn every_prefault_gives_zeroed_aligned_writable_memory() {
        for prefault in all_prefaults() {
            let mut a = Arena::new(&ArenaConfig { len_bytes: (4 << 20) + 123, prefault }).unwrap();
            assert_eq!(a.as_ptr() as usize % Arena::ALIGN_BYTES as usize, 0, "{prefault:?}");
            assert_eq!(a.len_bytes(), (4 << 20) + 123);
            assert!(a.as_slice().iter().all(|&b| b == 0), "{prefault:?}");
            let n = a.as_mut_slice().len();
            a.as_mut_slice()[n - 1] = 0xAB;
            assert_eq!(a.as_slice()[n - 1], 0xAB);
            assert_eq!(Destination::align_bytes(&a), Arena::ALIGN_BYTES);
        }
    }

    #[test]
    fn one_slow_sample_keeps_huge_pages_two_in_a_row_give_them_up() {
        assert_eq!(slow_streak(0, true), (0, false));
        assert_eq!(slow_streak(0, false), (1, false));
        assert_eq!(slow_streak(1, true), (0, false), "a fast sample ends the streak");
        assert_eq!(slow_streak(1, false), (2, true));
        assert_eq!(slow_streak(u32::MAX, false), (u32::MAX, true));
    }

    #[test]
    fn empty_arena_is_valid() {
        let mut a = Arena::with_len(0).unwrap();
        assert!(a.is_empty());
        assert!(a.as_slice().is_empty());
        assert!(a.as_mut_slice().is_empty());
    }

    #[test]
    fn absurd_length_is_an_error_not_a_panic() {
        let e = Arena::with_len(u64::MAX).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(Arena::with_len(1 << 60).is_err());
    }

    #[test]
    fn slice_unchecked_rejects_out_of_range() {
        let a = Arena::with_len(4096).unwrap();
        // SAFETY: no writers exist.
        unsafe {
            assert_eq!(a.slice_unchecked(0, 4096).len(), 4096);
            assert!(a.slice_unchecked(1, 4096).is_empty());
            assert!(a.slice_unchecked(u64::MAX, 2).is_empty());
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn any_length_is_aligned_zeroed_and_touch_keeps_zero(len in 0u64..(5 << 20), threads in 1usize..5) {
            let mut a = Arena::new(&ArenaConfig { len_bytes: len, prefault: Prefault::ParallelTouch { threads } }).unwrap();
            prop_assert_eq!(a.len_bytes(), len);
            prop_assert_eq!(a.as_ptr() as usize % Arena::ALIGN_BYTES as usize, 0);
            prop_assert!(a.as_slice().iter().all(|&b| b == 0));
        }
    }
}
