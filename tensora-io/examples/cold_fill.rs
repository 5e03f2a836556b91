//! How a cold checkpoint gets into memory *and* the page cache, and what that costs: wall time,
//! the process's CPU (user + sys, `getrusage`), the machine's interrupt time and direct-compaction
//! stalls (`/proc/stat`, `/proc/vmstat`: not the process's alone), and the folio sizes the page
//! cache ended with.
//!
//! ```text
//! cargo build --release -p tensora-io --example cold_fill
//! target/release/examples/cold_fill DIR [--runs N] [--threads T] [--only a,b,c1,...]
//!     [--recycle-mib M] [--settle-ms S] [--warm-after]
//! ```
//!
//! Every variant starts cold: the files' pages are dropped (`POSIX_FADV_DONTNEED`, retried, then
//! `drop_caches`) and `mincore` checks that none stayed; a run that starts with pages cached (an
//! other process reading the same files) is marked `starts with N pages cached`. The variants run alternately (the order rotates each run), each
//! copying the whole files into one destination faulted in before the timers start (except `b`,
//! which is the library's own load and allocates its arena as a load does):
//!
//! - `a`   `O_DIRECT` `pread` of 8 MiB into the destination: the device roofline, keeps nothing.
//! - `b`   `tensora_io::load` with the default options (`auto`, owned).
//! - `c1`, `c2` buffered `pread` of 8 MiB after `POSIX_FADV_SEQUENTIAL`, 1 or 2 threads, each
//!   thread reading one contiguous span: the kernel's own readahead fills the cache.
//! - `d`   as `c2`, with one helper thread advising `POSIX_FADV_WILLNEED` in 2 MiB steps up to
//!   512 MiB ahead of the readers (what the sync backend's read-ahead helper does).
//! - `e1`  a read-only mapping with `MADV_HUGEPAGE | MADV_SEQUENTIAL`, copied by 2 threads (the
//!   page faults read the file in).
//! - `e2`  the same mapping populated 8 MiB at a time with `MADV_POPULATE_READ`, then copied.
//! - `f`   `e2` without the copy: the page-cache fill alone (the destination is left as it was).
//! - `g`   `d`'s advice, the readers populating a plain mapping instead of copying: the
//!   `WILLNEED` (order-0 folio) fill alone, to set against `f`.
//! - `h`   as `d`, the helper populating `MADV_HUGEPAGE` mappings (`MADV_POPULATE_READ`, large
//!   folios) instead of advising: the readers `pread` from a cache of large folios.
//! - `i`   `f`'s populators (one per span) with one copier per span following each behind, out of
//!   the `MADV_HUGEPAGE` mapping into the destination.
//! - `j`   as `i`, the copiers `pread` from the descriptors (the page cache) instead; `j0` the
//!   same without `MADV_HUGEPAGE` (a plain mapping populated).
//! - `f0`  `f` without `MADV_HUGEPAGE` (a plain mapping, as the mapped views are populated today).
//! - `c4`  as `c2` with 4 threads; `d8` as `d` with 8 MiB advice steps.
//! - `t`   no file at all: a fresh anonymous mapping of the files' size, `MADV_HUGEPAGE`, faulted
//!   in with `MADV_POPULATE_WRITE` and unmapped (the first touch of an owned load's destination
//!   arena); `t4` the same without `MADV_HUGEPAGE` (4 KiB pages).
//!
//! Each run's line gives the MiB of free memory reported to the host during the variant
//! (`page_reporting`'s `reported_kib`; the knobs are printed at start).
//!
//! `--warm-after` times, after each variant that cached every page, a 2-thread `pread` copy of
//! the files out of what it left in the page cache (the copy alone, by folio size).
//!
//! `--recycle-mib M` faults in and frees M MiB of anonymous memory right before each variant's
//! timer, so the page cache's folios come from memory freed a moment before (a VM that reports
//! free 2 MiB blocks to its host, `page_reporting_order` 9, reports them only after a delay).
//!
//! `--settle-ms S` sleeps S ms before each variant's timer (after any recycling): time for the
//! reporting passes (about 2 s apart here) to report what was freed.
//!
//! The folio census after each buffered variant (outside the timer): the file is mapped and
//! populated (its pages are all cached by then, so this reads nothing and moves no folio), each
//! page's frame is read from `/proc/self/pagemap` and its flags from `/proc/kpageflags`
//! (`KPF_COMPOUND_HEAD` 15, `KPF_COMPOUND_TAIL` 16): a folio is a head and the tails after it, or
//! one order-0 page. Needs root (frame numbers). A sampled compare (64 blocks of 4 KiB per file
//! against `pread`) checks that the bytes landed.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

// What the probe reads outside its variants' work: the page cache and the machine's counters.
#[path = "cold_fill/probes.rs"]
mod probes;

use probes::{
    ORDER_MAX, compact_stalls, cpu_seconds, evict, folio_census, irq_seconds, reporting, resident_pages,
};

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// Bytes one reader call asks for.
const CHUNK_BYTES: usize = 8 << 20;
/// Bytes one `WILLNEED` call asks for (variant `d`).
const ADVICE_STEP_BYTES: u64 = 2 << 20;
/// How far the `WILLNEED` helper runs ahead of the readers, all spans together (variant `d`).
const ADVICE_LEAD_BYTES: u64 = 512 << 20;
/// Polls of 200 us a copier waits for its populator's next chunk (variant `i`): 60 s.
const FOLLOW_WAITS_MAX: u32 = 300_000;
/// Alignment of `O_DIRECT` reads and of the destination.
const ALIGN_BYTES: usize = 2 << 20;
/// Blocks compared per file after a variant.
const CHECK_BLOCKS: u64 = 64;
const PAGE_BYTES: u64 = 4096;

struct Src {
    path: PathBuf,
    len_bytes: u64,
    /// Where the file's bytes go in the destination.
    dest_offset_bytes: u64,
}

/// A contiguous stretch of one file that one thread reads in order.
#[derive(Clone, Copy)]
struct Span {
    file: usize,
    start_bytes: u64,
    end_bytes: u64,
}

/// Page-aligned, huge-page-advised anonymous memory, faulted in before any timer.
struct Dest {
    ptr: *mut u8,
    len_bytes: usize,
}

// SAFETY: the mapping is owned by `Dest`; threads write disjoint ranges through `at`.
unsafe impl Sync for Dest {}

/// The pages a fresh anonymous mapping faults in: 2 MiB (`MADV_HUGEPAGE` first) or 4 KiB.
#[derive(Clone, Copy)]
enum Pages {
    Huge,
    Base,
}

impl Dest {
    fn new(len_bytes: usize) -> Res<Dest> {
        Dest::with_pages(len_bytes, Pages::Huge)
    }

    /// A fresh mapping of `len_bytes`, faulted in with `MADV_POPULATE_WRITE` in `pages`.
    fn with_pages(len_bytes: usize, pages: Pages) -> Res<Dest> {
        let len_bytes = len_bytes.div_ceil(ALIGN_BYTES) * ALIGN_BYTES;
        // SAFETY: a fresh private anonymous mapping; no existing memory is touched.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len_bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error().into());
        }
        // SAFETY: `ptr .. + len_bytes` is the mapping just made; advice and populate touch only it.
        unsafe {
            if matches!(pages, Pages::Huge) {
                libc::madvise(ptr, len_bytes, libc::MADV_HUGEPAGE);
            }
            libc::madvise(ptr, len_bytes, libc::MADV_POPULATE_WRITE);
        }
        Ok(Dest { ptr: ptr.cast(), len_bytes })
    }

    /// `len` bytes at `offset`. Callers use disjoint ranges at a time.
    #[allow(clippy::mut_from_ref)]
    fn at(&self, offset: u64, len: usize) -> &mut [u8] {
        assert!(offset as usize + len <= self.len_bytes);
        // SAFETY: in bounds (asserted); threads write disjoint ranges (their spans).
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(offset as usize), len) }
    }
}

impl Drop for Dest {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once.
        unsafe { libc::munmap(self.ptr.cast(), self.len_bytes) };
    }
}

/// A read-only shared mapping of a whole file.
struct Mapping {
    ptr: *mut u8,
    len_bytes: usize,
}

// SAFETY: read-only mapping; threads only read through it.
unsafe impl Sync for Mapping {}

impl Mapping {
    fn new(file: &File, len_bytes: u64) -> Res<Mapping> {
        let len_bytes = len_bytes as usize;
        // SAFETY: a fresh read-only shared mapping of a file we hold open.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len_bytes,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error().into());
        }
        Ok(Mapping { ptr: ptr.cast(), len_bytes })
    }

    fn advise(&self, offset: u64, len: u64, advice: libc::c_int) -> io::Result<()> {
        let start = offset & !(PAGE_BYTES - 1);
        let len = (offset + len).min(self.len_bytes as u64) - start;
        // SAFETY: the range lies in this mapping (clamped to its length, start page-aligned).
        let rc = unsafe { libc::madvise(self.ptr.add(start as usize).cast(), len as usize, advice) };
        if rc != 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
    }

    fn bytes(&self, offset: u64, len: usize) -> &[u8] {
        assert!(offset as usize + len <= self.len_bytes);
        // SAFETY: in bounds (asserted); the file is not truncated while the probe runs.
        unsafe { std::slice::from_raw_parts(self.ptr.add(offset as usize), len) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once.
        unsafe { libc::munmap(self.ptr.cast(), self.len_bytes) };
    }
}

fn sources(dir: &Path) -> Res<Vec<Src>> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    paths.sort();
    let mut at = 0;
    let mut out = Vec::new();
    for path in paths {
        let len_bytes = std::fs::metadata(&path)?.len();
        out.push(Src { path, len_bytes, dest_offset_bytes: at });
        at += len_bytes.div_ceil(ALIGN_BYTES as u64) * ALIGN_BYTES as u64;
    }
    if out.is_empty() {
        return Err(format!("no .safetensors files in {}", dir.display()).into());
    }
    Ok(out)
}

/// The files cut into `threads` contiguous spans of about equal length.
fn spans(srcs: &[Src], threads: usize) -> Vec<Vec<Span>> {
    let total: u64 = srcs.iter().map(|s| s.len_bytes).sum();
    let share = total.div_ceil(threads as u64).div_ceil(ALIGN_BYTES as u64) * ALIGN_BYTES as u64;
    let mut out = vec![Vec::new(); threads];
    // Cuts inside a file fall on ALIGN_BYTES (O_DIRECT); the last thread takes what is left.
    let room_of = |t: usize| if t + 1 < threads { share } else { u64::MAX };
    let (mut t, mut room) = (0, room_of(0));
    for (file, s) in srcs.iter().enumerate() {
        let mut at = 0;
        while at < s.len_bytes {
            let rest = s.len_bytes - at;
            let n = if room >= rest { rest } else { room / ALIGN_BYTES as u64 * ALIGN_BYTES as u64 };
            if n > 0 {
                out[t].push(Span { file, start_bytes: at, end_bytes: at + n });
            }
            at += n;
            room -= n;
            if room < ALIGN_BYTES as u64 {
                t += 1;
                room = room_of(t);
            }
        }
    }
    out
}

fn open_all(srcs: &[Src], direct: bool) -> Res<Vec<File>> {
    let mut files = Vec::new();
    for s in srcs {
        let mut o = std::fs::OpenOptions::new();
        o.read(true);
        if direct {
            o.custom_flags(libc::O_DIRECT);
        }
        files.push(o.open(&s.path)?);
    }
    Ok(files)
}

fn fadvise(file: &File, offset: u64, len: u64, advice: libc::c_int) {
    // SAFETY: advice on a descriptor we hold; no memory of this process is passed.
    let _ = unsafe { libc::posix_fadvise(file.as_raw_fd(), offset as i64, len as i64, advice) };
}

/// Reads `buf` whole, or (`O_DIRECT`, `buf` rounded up to a block) until end of file past `need`.
fn pread_all(file: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
    pread_at_least(file, buf, offset, buf.len())
}

fn pread_at_least(file: &File, buf: &mut [u8], offset: u64, need: usize) -> io::Result<()> {
    let mut done = 0;
    while done < need {
        let n = file.read_at(&mut buf[done..], offset + done as u64)?;
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "file shorter than its length"));
        }
        done += n;
    }
    Ok(())
}

/// Runs one thread per entry of `spans`; each calls `chunk(thread, span, offset, len)` for its
/// spans in order, `CHUNK_BYTES` at a time. The first error is returned.
fn walk_spans<F>(spans: &[Vec<Span>], chunk: F) -> Res<()>
where
    F: Fn(usize, Span, u64, u64) -> Result<(), String> + Sync,
{
    std::thread::scope(|scope| {
        let chunk = &chunk;
        let handles: Vec<_> = spans
            .iter()
            .enumerate()
            .map(|(t, mine)| {
                scope.spawn(move || -> Result<(), String> {
                    for &sp in mine {
                        let mut at = sp.start_bytes;
                        while at < sp.end_bytes {
                            let n = (sp.end_bytes - at).min(CHUNK_BYTES as u64);
                            chunk(t, sp, at, n)?;
                            at += n;
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        for h in handles {
            h.join().map_err(|_| "a worker panicked")??;
        }
        Ok(())
    })
}

/// Reads each thread's spans with `pread`, publishing progress per thread.
fn read_spans(files: &[File], srcs: &[Src], dest: &Dest, spans: &[Vec<Span>], done: &[AtomicU64]) -> Res<()> {
    walk_spans(spans, |t, sp, at, n| {
        // O_DIRECT: the file's unaligned tail is read as a whole block (the destination is
        // padded to ALIGN_BYTES after each file).
        let len = (n as usize).div_ceil(PAGE_BYTES as usize) * PAGE_BYTES as usize;
        let buf = dest.at(srcs[sp.file].dest_offset_bytes + at, len);
        pread_at_least(&files[sp.file], buf, at, n as usize).map_err(|e| e.to_string())?;
        done[t].fetch_add(n, Ordering::Release);
        Ok(())
    })
}

/// Variant `g`'s readers (and `i`/`j`'s populators): `MADV_POPULATE_READ`, no copy.
fn populate_spans(maps: &[Mapping], spans: &[Vec<Span>], done: &[AtomicU64]) -> Res<()> {
    walk_spans(spans, |t, sp, at, n| {
        maps[sp.file].advise(at, n, libc::MADV_POPULATE_READ).map_err(|e| e.to_string())?;
        done[t].fetch_add(n, Ordering::Release);
        Ok(())
    })
}

/// Where variant `i`/`j`'s copiers take the bytes from.
#[derive(Clone, Copy)]
enum CopyFrom<'a> {
    Mapping(&'a [Mapping]),
    Pread(&'a [File]),
}

/// Variant `i`/`j`'s copiers: each copies its spans behind its populator (`done`).
fn copy_following(
    from: CopyFrom<'_>,
    srcs: &[Src],
    dest: &Dest,
    spans: &[Vec<Span>],
    done: &[AtomicU64],
) -> Res<()> {
    let copied: Vec<AtomicU64> = spans.iter().map(|_| AtomicU64::new(0)).collect();
    walk_spans(spans, |t, sp, at, n| {
        let want = copied[t].load(Ordering::Relaxed) + n;
        let mut waits = 0u32;
        while done[t].load(Ordering::Acquire) < want {
            waits += 1;
            if waits > FOLLOW_WAITS_MAX {
                return Err("populator stalled".into());
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        let to = dest.at(srcs[sp.file].dest_offset_bytes + at, n as usize);
        match from {
            CopyFrom::Mapping(maps) => to.copy_from_slice(maps[sp.file].bytes(at, n as usize)),
            CopyFrom::Pread(files) => pread_all(&files[sp.file], to, at).map_err(|e| e.to_string())?,
        }
        copied[t].store(want, Ordering::Relaxed);
        Ok(())
    })
}

/// How the helper reads ahead of the readers.
#[derive(Clone, Copy)]
enum Ahead<'a> {
    /// `POSIX_FADV_WILLNEED` on the descriptors (`d`, `g`): order-0 folios.
    WillNeed(&'a [File]),
    /// `MADV_POPULATE_READ` of `MADV_HUGEPAGE` mappings (`h`): large folios, waits for each step.
    PopulateHuge(&'a [Mapping]),
}

/// Variant `d`'s helper: `WILLNEED` in steps, at most its share of the lead ahead of each reader.
fn advise_ahead(
    ahead: Ahead<'_>,
    spans: &[Vec<Span>],
    done: &[AtomicU64],
    finished: &AtomicUsize,
    step: u64,
) {
    let lead = ADVICE_LEAD_BYTES / spans.len() as u64;
    let mut cursor: Vec<(usize, u64, u64)> = vec![(0, 0, 0); spans.len()]; // (span, offset, advised)
    while finished.load(Ordering::Acquire) == 0 {
        let mut moved = false;
        for (t, mine) in spans.iter().enumerate() {
            let (ref mut si, ref mut off, ref mut advised) = cursor[t];
            while *si < mine.len() && *advised < done[t].load(Ordering::Acquire) + lead {
                let sp = mine[*si];
                let at = sp.start_bytes + *off;
                let n = (sp.end_bytes - at).min(step);
                match ahead {
                    Ahead::WillNeed(files) => fadvise(&files[sp.file], at, n, libc::POSIX_FADV_WILLNEED),
                    // A failed populate only costs read-ahead: the readers read the bytes themselves.
                    Ahead::PopulateHuge(maps) => drop(maps[sp.file].advise(at, n, libc::MADV_POPULATE_READ)),
                }
                *off += n;
                *advised += n;
                moved = true;
                if sp.start_bytes + *off >= sp.end_bytes {
                    *si += 1;
                    *off = 0;
                }
            }
        }
        if !moved {
            if cursor.iter().zip(spans).all(|(c, s)| c.0 >= s.len()) {
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// How a mapped variant gets the file's pages in and out.
#[derive(Clone, Copy, PartialEq)]
enum MappedFill {
    /// Copy: the page faults read the file in.
    Faults,
    /// `MADV_POPULATE_READ` each chunk, then copy it.
    PopulateThenCopy,
    /// `MADV_POPULATE_READ` only: the page-cache fill alone, no copy.
    PopulateOnly,
}

fn copy_mapped(
    maps: &[Mapping],
    srcs: &[Src],
    dest: &Dest,
    spans: &[Vec<Span>],
    fill: MappedFill,
) -> Res<()> {
    walk_spans(spans, |_, sp, at, n| {
        let map = &maps[sp.file];
        if fill != MappedFill::Faults {
            map.advise(at, n, libc::MADV_POPULATE_READ).map_err(|e| e.to_string())?;
        }
        if fill != MappedFill::PopulateOnly {
            dest.at(srcs[sp.file].dest_offset_bytes + at, n as usize)
                .copy_from_slice(map.bytes(at, n as usize));
        }
        Ok(())
    })
}

/// One progress counter per thread.
fn zero(threads: usize) -> Vec<AtomicU64> {
    (0..threads).map(|_| AtomicU64::new(0)).collect()
}

fn run_variant(v: &str, dir: &Path, srcs: &[Src], dest: &Dest, threads: usize) -> Res<()> {
    let zero = || zero(threads);
    match v {
        "a" => {
            let files = open_all(srcs, true)?;
            read_spans(&files, srcs, dest, &spans(srcs, threads), &zero())
        }
        "t" | "t4" => {
            // The first touch of fresh anonymous memory of the checkpoint's size (the owned
            // load's destination arena): mapped, faulted in, unmapped, all timed.
            let pages = if v == "t" { Pages::Huge } else { Pages::Base };
            drop(Dest::with_pages(dest.len_bytes, pages)?);
            Ok(())
        }
        "b" => {
            let ckpt = tensora_format::open(dir)?;
            let loaded = tensora_io::load(&ckpt, &tensora_io::LoadOptions::default())?;
            let r = loaded.report();
            eprintln!("    b: {} ({}): {}", r.backend, r.io_mode, r.reason);
            Ok(())
        }
        "c1" | "c2" | "c4" => {
            let files = open_all(srcs, false)?;
            for f in &files {
                fadvise(f, 0, 0, libc::POSIX_FADV_SEQUENTIAL);
            }
            let n: usize = v[1..].parse()?;
            read_spans(
                &files,
                srcs,
                dest,
                &spans(srcs, n),
                &(0..n).map(|_| AtomicU64::new(0)).collect::<Vec<_>>(),
            )
        }
        "d" | "d8" | "g" | "h" => {
            let step = if v == "d8" { 4 * ADVICE_STEP_BYTES } else { ADVICE_STEP_BYTES };
            let files = open_all(srcs, false)?;
            let sp = spans(srcs, threads);
            let done = zero();
            let finished = AtomicUsize::new(0);
            let maps =
                files.iter().zip(srcs).map(|(f, s)| Mapping::new(f, s.len_bytes)).collect::<Res<Vec<_>>>()?;
            let ahead = if v == "h" {
                for m in &maps {
                    m.advise(0, m.len_bytes as u64, libc::MADV_HUGEPAGE)?;
                }
                Ahead::PopulateHuge(&maps)
            } else {
                Ahead::WillNeed(&files)
            };
            std::thread::scope(|scope| {
                let helper = scope.spawn(|| advise_ahead(ahead, &sp, &done, &finished, step));
                let r = if v == "g" {
                    populate_spans(&maps, &sp, &done)
                } else {
                    read_spans(&files, srcs, dest, &sp, &done)
                };
                finished.store(1, Ordering::Release);
                helper.join().map_err(|_| "helper panicked")?;
                r
            })
        }
        "i" | "j" | "j0" => {
            let files = open_all(srcs, false)?;
            let maps =
                files.iter().zip(srcs).map(|(f, s)| Mapping::new(f, s.len_bytes)).collect::<Res<Vec<_>>>()?;
            for m in maps.iter().filter(|_| v != "j0") {
                m.advise(0, m.len_bytes as u64, libc::MADV_HUGEPAGE)?;
            }
            let sp = spans(srcs, threads);
            let done = zero();
            std::thread::scope(|scope| {
                let fill = scope.spawn(|| populate_spans(&maps, &sp, &done));
                let from = if v == "i" { CopyFrom::Mapping(&maps) } else { CopyFrom::Pread(&files) };
                let r = copy_following(from, srcs, dest, &sp, &done);
                fill.join().map_err(|_| "populators panicked")??;
                r
            })
        }
        "e1" | "e2" | "f" | "f0" => {
            let files = open_all(srcs, false)?;
            let maps =
                files.iter().zip(srcs).map(|(f, s)| Mapping::new(f, s.len_bytes)).collect::<Res<Vec<_>>>()?;
            for m in &maps {
                if v != "f0" {
                    m.advise(0, m.len_bytes as u64, libc::MADV_HUGEPAGE)?;
                    m.advise(0, m.len_bytes as u64, libc::MADV_SEQUENTIAL)?;
                }
            }
            let fill = match v {
                "e1" => MappedFill::Faults,
                "e2" => MappedFill::PopulateThenCopy,
                _ => MappedFill::PopulateOnly,
            };
            copy_mapped(&maps, srcs, dest, &spans(srcs, threads), fill)
        }
        _ => Err(format!("unknown variant {v}").into()),
    }
}

/// Compares `CHECK_BLOCKS` blocks per file of the destination with `pread`.
fn check(srcs: &[Src], dest: &Dest) -> Res<()> {
    for s in srcs {
        let f = File::open(&s.path)?;
        let mut want = vec![0u8; PAGE_BYTES as usize];
        for k in 0..CHECK_BLOCKS {
            let at = (s.len_bytes - PAGE_BYTES) / CHECK_BLOCKS * k;
            pread_all(&f, &mut want, at)?;
            if dest.at(s.dest_offset_bytes + at, want.len()) != want.as_slice() {
                return Err(format!("{}: bytes at {at} differ", s.path.display()).into());
            }
        }
    }
    Ok(())
}

fn median(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().collect();
    let dir = PathBuf::from(args.get(1).ok_or(
        "usage: cold_fill DIR [--runs N] [--threads T] [--only a,b,...] [--recycle-mib M] [--settle-ms S] [--warm-after]",
    )?);
    let flag = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let runs: usize = flag("--runs").map_or(Ok(3), |s| s.parse())?;
    let warm_after = args.iter().any(|a| a == "--warm-after");
    let recycle_bytes: usize = flag("--recycle-mib").map_or(Ok(0), |s| s.parse::<usize>())? << 20;
    let settle = Duration::from_millis(flag("--settle-ms").map_or(Ok(0), |s| s.parse())?);
    let threads: usize = flag("--threads").map_or(Ok(2), |s| s.parse())?;
    let only = flag("--only").unwrap_or_else(|| "a,b,c1,c2,d,e1,e2".into());
    let variants: Vec<&str> = only.split(',').collect();
    let srcs = sources(&dir)?;
    let total: u64 = srcs.iter().map(|s| s.len_bytes).sum();
    let last = srcs.last().ok_or("no files")?;
    let dest = Dest::new((last.dest_offset_bytes + last.len_bytes) as usize)?;
    let knobs = ["page_reporting_order", "min_free_ms", "max_waiting_mib", "reported_kib"];
    println!("page reporting: {:?}", knobs.map(|k| (k, reporting(k))));
    type Stat = (Vec<f64>, Vec<f64>, [u64; ORDER_MAX + 1], Vec<f64>);
    let mut stats: Vec<Stat> =
        variants.iter().map(|_| (Vec::new(), Vec::new(), [0; ORDER_MAX + 1], Vec::new())).collect();
    for run in 0..runs {
        for k in 0..variants.len() {
            let i = (k + run) % variants.len();
            let v = variants[i];
            let left = evict(&srcs)?;
            if left != 0 {
                println!("run {run} {v:<3} starts with {left} pages cached (another reader?)");
            }
            if recycle_bytes > 0 {
                // Memory just freed is in the buddy lists before the host is told of it.
                drop(Dest::new(recycle_bytes)?);
            }
            std::thread::sleep(settle);
            let (cpu0, irq0, stalls0, rep0, t0) =
                (cpu_seconds(), irq_seconds()?, compact_stalls()?, reporting("reported_kib"), Instant::now());
            run_variant(v, &dir, &srcs, &dest, threads)?;
            let (wall, cpu, irq) = (t0.elapsed().as_secs_f64(), cpu_seconds() - cpu0, irq_seconds()? - irq0);
            let reported_mib =
                reporting("reported_kib").unwrap_or(0).saturating_sub(rep0.unwrap_or(0)) / 1024;
            let stalls = compact_stalls()? - stalls0;
            if !matches!(v, "b" | "f" | "f0" | "g" | "t" | "t4") {
                check(&srcs, &dest)?;
            }
            let kept: u64 =
                srcs.iter().map(|s| resident_pages(&File::open(&s.path)?, s.len_bytes)).sum::<Res<u64>>()?;
            let census = if kept * 100 >= total.div_ceil(PAGE_BYTES) * 99 {
                folio_census(&srcs)?
            } else {
                [0; ORDER_MAX + 1]
            };
            let folios: u64 = census.iter().sum();
            if warm_after && kept == total.div_ceil(PAGE_BYTES) {
                let (cpu0, t0) = (cpu_seconds(), Instant::now());
                let files = open_all(&srcs, false)?;
                read_spans(&files, &srcs, &dest, &spans(&srcs, threads), &zero(threads))?;
                let (w, c) = (t0.elapsed().as_secs_f64(), cpu_seconds() - cpu0);
                println!(
                    "run {run} {v:<3} then warm pread copy of what it cached: wall {w:6.3} s  cpu {c:6.3} s"
                );
            }
            println!(
                "run {run} {v:<3} wall {wall:6.3} s  {:5.2} GB/s  cpu {cpu:6.3} s  irq {irq:5.3} s  compaction stalls {stalls:5}  reported {reported_mib:5} MiB  pages kept {:5.1}%  folios {folios} (mean {:.0} KiB) by order {census:?}",
                total as f64 / wall / 1e9,
                kept as f64 * PAGE_BYTES as f64 * 100.0 / total as f64,
                if folios > 0 { kept as f64 * 4.0 / folios as f64 } else { 0.0 },
            );
            stats[i].0.push(wall);
            stats[i].1.push(cpu);
            stats[i].3.push(irq);
            stats[i].2 = census;
        }
    }
    println!("\n{} bytes, {} files, {runs} runs, median (min..max):", total, srcs.len());
    for (v, (walls, cpus, census, irqs)) in variants.iter().zip(stats) {
        let (w, w0, w1) = median(walls);
        let (c, c0, c1) = median(cpus);
        let (q, q0, q1) = median(irqs);
        println!(
            "{v:<3} wall {w:.3} ({w0:.3}..{w1:.3}) s  {:.2} GB/s  cpu {c:.3} ({c0:.3}..{c1:.3}) s = {:.3} s/GB  irq+softirq {q:.3} ({q0:.3}..{q1:.3}) s  last census {census:?}",
            total as f64 / w / 1e9,
            c / (total as f64 / 1e9)
        );
    }
    Ok(())
}
