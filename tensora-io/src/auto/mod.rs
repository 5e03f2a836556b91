//! `auto`: choose where the bytes live (owned or mapped), the backend and the I/O mode from
//! measured facts.
//!
//! [`gather`] reads the facts (cheap, bounded: one `statfs`, a `mincore` sample of at most
//! [`probe::RESIDENCY_SAMPLE_WINDOWS_MAX`] windows per file for at most [`RESIDENCY_FILES_MAX`]
//! files, the cached io_uring probe, `/proc/meminfo` and the cgroup's memory files
//! ([`memory::memory_room`]), and an O_DIRECT probe only when the data is cold and would be owned);
//! [`choose`] is a pure rule table over them, so it is unit-tested directly. The [`Choice`]'s
//! one-line `reason` names the deciding facts and goes into the load report.
//!
//! **The page cache is the node's shared cache.** A cold load that reads around it (`O_DIRECT`)
//! is the fastest way to read a checkpoint once, and leaves every later process on the node (a
//! restart, a second replica, the other tensor-parallel workers) as cold as the first. So a cold
//! load whose tensors may be views ([`Residence::Auto`]) on a local filesystem reads *through* the
//! page cache whenever the pages fit ([`page_cache`]), as mapped views (the pages are read in by
//! parallel `MADV_POPULATE_READ`, as fast as the direct queue here, and no arena is faulted): the bytes not yet cached, plus the load's own destination (an owned arena;
//! nothing for mapped views; a budget-sized window when streaming), plus a margin
//! ([`PAGE_CACHE_MARGIN_MIN_BYTES`], or 1/[`PAGE_CACHE_MARGIN_DIVISOR`] of the machine's memory or
//! of the cgroup's limit, whichever is larger) must fit in the memory the machine (or the cgroup) has available. When
//! they do not fit, when that memory cannot be read, or when the caller asks for `O_DIRECT`
//! ([`IoMode::Direct`]), a cold load reads around the cache as before, which leaves other
//! processes' cached pages where they are. An owned copy ([`Residence::Owned`]) of cold data
//! keeps its pages by the same rule, its arena counted as its destination: it reads buffered,
//! with a helper thread reading each file into the page cache ahead of the copies
//! ([`crate::map::readahead`]), so the device sees a deep queue as with `O_DIRECT` (measured in
//! docs/performance.md "Restarts"); when pages and arena do not both fit it reads around the
//! cache with the direct queue. Its reason also names whether the machine reports free memory to
//! a hypervisor (`tensora_sys::free_reporting`), which picks the fill: 2 MiB folios populated ahead
//! of the copies where it is not ([`Reading::PopulateAhead`]), 4 KiB read-ahead where it is (a 2 MiB
//! fill first-touches memory the host took back; docs/performance.md "Restarts").
//!
//! Residence, when the caller asks for [`Residence::Auto`] (first match wins):
//!
//! | facts | residence | why |
//! |---|---|---|
//! | network/FUSE filesystem | owned | a snapshot nothing outside can change; never lazy views over the network |
//! | warm (≥ [`WARM_FRACTION`] of sampled pages cached) | mapped | a load is a page-table fill: no fresh memory to fault and zero, no copy |
//! | cold, the pages fit in the page cache | mapped | the pages are read in once (in parallel) and stay for the next process; no arena, no copy |
//! | cold, or nothing sampled | owned | the disk is the bound; an owned copy is a snapshot |
//!
//! Backend, for an owned load (first match wins), justified by measurements on the 2-core
//! reference machine (see `docs/design.md`):
//!
//! | facts | choice | why |
//! |---|---|---|
//! | network/FUSE filesystem | sync, buffered | never lazy mmap there; O_DIRECT semantics vary |
//! | warm | sync, buffered | one copy from the page cache into the hugepage arena is the roofline; copying from a mapping measured within noise of it, with deeper dips and a truncation fault window |
//! | cold, pages and arena fit in the page cache ([`page_cache`]) | sync, buffered, read ahead | the next process finds the pages cached; the read-ahead helper keeps the device's queue deep |
//! | cold, O_DIRECT works, io_uring available, ≥ [`DIRECT_MIN_BYTES`] selected | io-uring, direct | deep queue of large aligned reads, no page-cache copy |
//! | cold otherwise | sync, buffered | the same read-ahead helper, several threads |
//!
//! Mapped views never run a backend (the report names `mmap`); every selected page is read in
//! before the load returns ([`crate::map::populate`]).

use std::path::Path;

use tensora_format::Checkpoint;
use tensora_plan::DeviceCost;

use crate::load::{FilesUnchanged, IoMode, Residence};
use crate::seam::Reading;

// The facts live in tensora-sys; `auto` reads them through these names.
pub(crate) use tensora_sys as memory;
pub(crate) use tensora_sys as probe;

use memory::MemoryRoom;
use probe::{Filesystem, ResidencySample};

/// At or above this fraction of sampled pages resident, the selection counts as warm.
pub const WARM_FRACTION: f64 = 0.5;
/// Below this many selected bytes a cold load stays buffered (O_DIRECT setup is not worth it).
pub const DIRECT_MIN_BYTES: u64 = 256 << 20;
/// Files whose residency is sampled (the first ones the selection touches).
pub const RESIDENCY_FILES_MAX: usize = 16;
/// The least memory a cold load leaves to everything else when it keeps its pages cached.
pub const PAGE_CACHE_MARGIN_MIN_BYTES: u64 = 1 << 30;
/// ... or this fraction (1/N) of the machine's memory, when that is more.
pub const PAGE_CACHE_MARGIN_DIVISOR: u64 = 8;

/// What `auto` looked at.
#[derive(Debug, Clone, PartialEq)]
pub struct Facts {
    /// Distinct bytes of the selected tensors (tied bytes once).
    pub bytes_selected: u64,
    /// Sum of the sizes of the files the selection touches.
    pub bytes_files: u64,
    /// Files the selection touches.
    pub files: usize,
    /// Largest file touched.
    pub file_len_max_bytes: u64,
    /// Page-cache residency of the selected ranges (a `mincore` sample).
    pub residency: ResidencySample,
    /// Filesystem of the first file; `None` if `statfs` failed.
    pub filesystem: Option<Filesystem>,
    /// Whether io_uring works here (probed), with the reason when not.
    pub uring: Result<(), String>,
    /// Whether O_DIRECT reads work on the first file; `None` when not probed (warm data).
    pub direct: Option<Result<(), String>>,
    /// CPUs available to this process.
    pub cpus: usize,
    /// How the load hands tensors over.
    pub delivery: Delivery,
    /// The residence the caller asked for.
    pub residence: Residence,
    /// The I/O mode the caller asked for ([`IoMode::Direct`]: read around the page cache).
    pub io_mode: IoMode,
    /// Bytes of the load's own memory besides the page cache when it owns its bytes: the whole
    /// selection, or one budget-sized window when streaming.
    pub owned_destination_bytes: u64,
    /// Memory the page cache can be given (`None`: could not be read).
    pub memory: Option<MemoryRoom>,
    /// Whether free memory is reported to a hypervisor (`tensora_sys::free_reporting`).
    pub free_reporting: memory::FreeReporting,
    /// Whether the load reads whole tensors or slices of them.
    pub pieces: Pieces,
}

/// What `gather` is told about the load besides the checkpoint and the selection.
#[derive(Debug, Clone, Copy)]
pub struct Asked {
    /// How the load hands tensors over.
    pub delivery: Delivery,
    /// The residence the caller asked for.
    pub residence: Residence,
    /// The I/O mode the caller asked for.
    pub io_mode: IoMode,
    /// The in-flight budget (a streamed load's window).
    pub budget_bytes: u64,
    /// Whether the load reads whole tensors or slices of them.
    pub pieces: Pieces,
}

/// What a load reads of each selected tensor (a fact `auto` reads).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pieces {
    /// Every byte of each selected tensor.
    WholeTensors,
    /// A slice of some tensors (a tensor-parallel share): the reads leave gaps that other ranks
    /// read, which a fill in 2 MiB folios would read too.
    Slices,
}

/// How a load hands its tensors over (a fact `auto` reads, and reports).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// Every tensor at once, in a [`Loaded`](crate::Loaded).
    Owned,
    /// Tensor by tensor, or run by run, under the budget.
    Streaming,
}

impl Facts {
    /// `bytes_selected / bytes_files` (1 when nothing is selected).
    pub fn density(&self) -> f64 {
        if self.bytes_files == 0 { 1.0 } else { self.bytes_selected as f64 / self.bytes_files as f64 }
    }
    /// Whether the sampled pages say the data is in the page cache.
    pub fn warm(&self) -> bool {
        self.residency.sampled_pages > 0 && self.residency.fraction() >= WARM_FRACTION
    }
    /// Whether the files are known to be on a network or FUSE filesystem.
    pub fn on_remote_fs(&self) -> bool {
        self.filesystem.as_ref().is_some_and(|fs| fs.remote)
    }
}

/// What `auto` chose.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    /// Where the bytes live: [`Residence::Owned`] or [`Residence::Mapped`], never `Auto`.
    pub residence: Residence,
    /// The backend that runs the load (`"mmap"` for mapped views, which run none).
    pub backend: &'static str,
    /// How the reads meet the page cache: `O_DIRECT`, or through it cold (read ahead of the
    /// copies) or warm (the copies only). For mapped views, whether their pages are read ahead of
    /// the populating threads.
    pub reading: Reading,
    /// One line naming the deciding facts.
    pub reason: String,
}

/// Read the facts for a selection (`selected` indexes [`Checkpoint::tensors`]). Residency is
/// sampled over the selected tensors' byte ranges of the first [`RESIDENCY_FILES_MAX`] files.
pub fn gather(ckpt: &Checkpoint, selected: &[usize], asked: Asked) -> Facts {
    let Asked { delivery, residence, io_mode, budget_bytes, pieces } = asked;
    let mut by_file: Vec<(u32, Vec<std::ops::Range<u64>>)> = Vec::new();
    let bytes_selected = ckpt.distinct_bytes(selected);
    // Position of each checkpoint file in `by_file` (files in order of first use), by file id.
    let mut position: Vec<Option<usize>> = vec![None; ckpt.files().len()];
    for &i in selected {
        let t = &ckpt.tensors()[i];
        let f = t.file().0;
        match position[f as usize] {
            Some(p) => by_file[p].1.push(t.range()),
            None => {
                position[f as usize] = Some(by_file.len());
                by_file.push((f, vec![t.range()]));
            }
        }
    }
    let entries: Vec<_> = by_file.iter().map(|(f, _)| ckpt.file(tensora_format::FileId(*f))).collect();
    let bytes_files = entries.iter().map(|e| e.len_bytes()).sum();
    let file_len_max_bytes = entries.iter().map(|e| e.len_bytes()).max().unwrap_or(0);
    let mut residency = ResidencySample::default();
    for (e, (_, ranges)) in entries.iter().zip(&by_file).take(RESIDENCY_FILES_MAX) {
        if let Ok(file) = std::fs::File::open(e.path())
            && let Ok(s) = probe::residency_sample_ranges(&file, e.len_bytes(), ranges)
        {
            residency = residency.merge(s);
        }
    }
    let first: Option<&Path> = entries.first().map(|e| e.path());
    let filesystem = first.and_then(|p| probe::filesystem(p).ok());
    let warm = residency.sampled_pages > 0 && residency.fraction() >= WARM_FRACTION;
    // Only a cold owned load can use O_DIRECT; `Auto` resolves to owned when cold.
    let direct = match first {
        Some(p) if !warm && !residence.is_mapped() => Some(probe::direct_io_supported(p)),
        _ => None,
    };
    Facts {
        bytes_selected,
        bytes_files,
        files: entries.len(),
        file_len_max_bytes,
        residency,
        filesystem,
        uring: crate::backends::uring::probe(),
        direct,
        cpus: probe::cpu_count(),
        delivery,
        residence,
        io_mode,
        owned_destination_bytes: match delivery {
            Delivery::Owned => bytes_selected,
            Delivery::Streaming => bytes_selected.min(budget_bytes),
        },
        memory: memory::memory_room(),
        free_reporting: memory::free_reporting(),
        pieces,
    }
}

/// Whether a cold load keeps its pages in the page cache for the next process, and why (see the
/// module docs). `destination_bytes` is the load's own memory besides the cache (0 for views).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PageCache {
    /// Read through the page cache: the pages stay for the next process.
    Keep(String),
    /// Read around it (`O_DIRECT` where it works): the node's other cached pages stay.
    Around(String),
}

/// The page-cache rule (see the module docs), for a load whose own memory is `destination_bytes`.
pub fn page_cache(f: &Facts, destination_bytes: u64) -> PageCache {
    if f.io_mode == IoMode::Direct {
        return PageCache::Around("O_DIRECT asked".to_owned());
    }
    let uncached_bytes = (f.bytes_selected as f64 * (1.0 - f.residency.fraction())) as u64;
    pages_fit(uncached_bytes, destination_bytes, f.memory)
}

/// The page-cache rule's sum (see the module docs) for `uncached_bytes` that would enter the
/// page cache beside `destination_bytes` of the load's own memory, under `memory`: also the rule
/// of a writer whose copies may stay cached for the next load (the remote cache's copies).
pub fn pages_fit(uncached_bytes: u64, destination_bytes: u64, memory: Option<MemoryRoom>) -> PageCache {
    let Some(room) = memory else {
        return PageCache::Around("available memory unknown".to_owned());
    };
    // The memory this process can use at most: the machine's, or its cgroup's limit.
    let usable_bytes = room.cgroup_limit_bytes.map_or(room.total_bytes, |l| l.min(room.total_bytes));
    let margin_bytes = PAGE_CACHE_MARGIN_MIN_BYTES.max(usable_bytes / PAGE_CACHE_MARGIN_DIVISOR);
    let need_bytes = uncached_bytes.saturating_add(destination_bytes).saturating_add(margin_bytes);
    let gb = |b: u64| b as f64 / 1e9;
    let limit = if room.cgroup_limit_bytes.is_some() { " (cgroup limit)" } else { "" };
    let sums = format!(
        "{:.2} GB to cache + {:.2} GB destination + {:.2} GB margin {} {:.2} GB available{limit}",
        gb(uncached_bytes),
        gb(destination_bytes),
        gb(margin_bytes),
        if need_bytes <= room.available_bytes { "<=" } else { ">" },
        gb(room.available_bytes),
    );
    if need_bytes <= room.available_bytes { PageCache::Keep(sums) } else { PageCache::Around(sums) }
}

/// Whether a checkpoint opened for views read on demand (HF's `safe_open`, whose callers fault
/// each tensor's pages in as they use them) should be read into the page cache at open, ahead of
/// them ([`crate::map::readahead::Prefetch`]): when it is cold, on a local filesystem, and its
/// pages fit by the page-cache rule (no destination: views). `Ok` with the reason to read ahead,
/// `Err` with the reason not to.
pub fn read_ahead_at_open(f: &Facts) -> Result<String, String> {
    match &f.filesystem {
        None => return Err("filesystem unknown".to_owned()),
        Some(fs) if fs.remote => return Err(format!("{} is a network/FUSE filesystem", fs.name)),
        Some(_) => {}
    }
    if f.residency.sampled_pages == 0 {
        return Err("nothing sampled".to_owned());
    }
    if f.warm() {
        return Err(format!("warm ({:.0}% of sampled pages cached)", f.residency.fraction() * 100.0));
    }
    match page_cache(f, 0) {
        PageCache::Keep(why) => Ok(format!("cold, pages fit ({why})")),
        PageCache::Around(why) => Err(format!("cold, pages do not fit ({why})")),
    }
}

/// Whether a cast load under [`Residence::Auto`] converts straight from views of the files
/// (`crate::load::cast`): when the selection is warm on a local filesystem, where converting from
/// the page cache skips the staging copy; cold or remote data goes through the staging window.
pub fn cast_from_views(f: &Facts) -> Option<&'static str> {
    let local = f.filesystem.is_some() && !f.on_remote_fs();
    (local && f.warm()).then_some("auto: warm, on a local filesystem")
}

/// The rule tables (see the module docs): residence first, then the backend of an owned load.
pub fn choose(f: &Facts) -> Choice {
    let fs_name = f.filesystem.as_ref().map_or("unknown fs", |fs| fs.name.as_str());
    let remote = f.on_remote_fs();
    let facts = format!(
        "{} file(s), {:.2} GB selected ({:.0}% of files), {:.0}% of sampled pages cached, {fs_name}, {} CPU(s){}",
        f.files,
        f.bytes_selected as f64 / 1e9,
        f.density() * 100.0,
        f.residency.fraction() * 100.0,
        f.cpus,
        if f.delivery == Delivery::Streaming { ", streaming" } else { "" },
    );
    let owned_because = match f.residence {
        Residence::Mapped(promise) if remote => {
            return mapped(
                f,
                promise,
                format!(
                    "mapped: residence \"mapped\" (note: {fs_name} is a network/FUSE filesystem: \
                 every selected page is read in at load, over the network); {facts}"
                ),
            );
        }
        Residence::Mapped(promise) => {
            return mapped(f, promise, format!("mapped: residence \"mapped\"; {facts}"));
        }
        Residence::Owned => Some("owned: residence \"owned\"".to_owned()),
        Residence::Auto(_) if remote => {
            Some(format!("owned: {fs_name} is a network/FUSE filesystem (a snapshot, never lazy views)"))
        }
        Residence::Auto(promise) if f.warm() => {
            return mapped(
                f,
                promise,
                format!(
                    "mapped: warm, on local {fs_name}: zero-copy copy-on-write views, pages read in at load; {facts}"
                ),
            );
        }
        Residence::Auto(_) if f.residency.sampled_pages == 0 => {
            Some("owned: no page-cache sample (nothing selected to sample)".to_owned())
        }
        // Cold views are read in from the disk: only where the filesystem is known to be local.
        Residence::Auto(_) if f.filesystem.is_none() => Some(
            "owned: cold, on a filesystem statfs could not name (never views of cold data there)".to_owned(),
        ),
        Residence::Auto(promise) => match page_cache(f, 0) {
            PageCache::Keep(why) => {
                return mapped(
                    f,
                    promise,
                    format!(
                        "mapped: cold, on local {fs_name}, pages kept cached for the next load ({why}): \
                         read in at load, no arena, no copy; {facts}"
                    ),
                );
            }
            PageCache::Around(why) => Some(format!("owned: cold, around the page cache ({why})")),
        },
    };
    let mut choice = choose_owned(f, remote, fs_name, &facts);
    if let Some(why) = owned_because {
        choice.reason = format!("{why}; {}", choice.reason);
    }
    choice
}

fn mapped(f: &Facts, promise: FilesUnchanged, reason: String) -> Choice {
    Choice { residence: Residence::Mapped(promise), backend: "mmap", reading: buffered(f), reason }
}

/// What a cold local file's device costs read through the page cache: whole pages, and about
/// 8 KiB of transfer per request (measured 4.9 to 6.9 µs a request, what it transfers in 5.8 to
/// 8.1 KB: `examples/slice_cost.rs` with `TENSORA_SLICE_COST_COLD=1`, docs/tensor-parallel.md). So
/// the read-ahead helper reads such gaps along; the copies still take only the rows.
pub(crate) const COLD_DEVICE_COST: DeviceCost =
    DeviceCost { granule_bytes: 4096, request_cost_bytes: 8 << 10 };
/// Cold data read through the page cache: ahead of the copies, gaps read along ([`COLD_DEVICE_COST`]).
pub(crate) const READ_AHEAD_COLD: Reading = Reading::ReadAhead { device_cost: Some(COLD_DEVICE_COST) };
/// [`READ_AHEAD_COLD`] filled in 2 MiB folios (`map/fill.rs`): where free memory is not reported.
pub(crate) const POPULATE_AHEAD_COLD: Reading =
    Reading::PopulateAhead { device_cost: Some(COLD_DEVICE_COST) };

/// How a read through the page cache goes: warm data is copied (or mapped) as it is; anything
/// else is read ahead of the copies ([`READ_AHEAD_COLD`]), so the device sees a deep queue.
pub fn buffered(f: &Facts) -> Reading {
    if f.warm() { Reading::Cached } else { READ_AHEAD_COLD }
}

/// The backend of an owned load.
fn choose_owned(f: &Facts, remote: bool, fs_name: &str, facts: &str) -> Choice {
    let owned =
        |backend, reading: Reading, reason| Choice { residence: Residence::Owned, backend, reading, reason };
    if remote {
        return owned(
            "sync",
            buffered(f),
            format!("{fs_name} is a network/FUSE filesystem: buffered pread, never lazy mmap; {facts}"),
        );
    }
    if f.warm() {
        return owned(
            "sync",
            Reading::Cached,
            format!("warm: one pread copy from the page cache into the hugepage arena; {facts}"),
        );
    }
    if let PageCache::Keep(why) = page_cache(f, f.owned_destination_bytes) {
        // The pages and the arena fit: read through the page cache ahead of the copies, so the
        // next process finds them cached, in 2 MiB folios unless the host is paid for their first
        // touch (see the module docs).
        // A slice's reads leave gaps: 2 MiB folios around each would read other ranks' rows too.
        let (reading, fill) = match (&f.free_reporting, f.pieces) {
            (memory::FreeReporting::Off(_), Pieces::WholeTensors) => {
                (POPULATE_AHEAD_COLD, "populated ahead of the copies in 2 MiB folios")
            }
            (_, Pieces::Slices) => (READ_AHEAD_COLD, "read ahead of the copies in 4 KiB folios, slices"),
            (memory::FreeReporting::On { .. }, Pieces::WholeTensors) => {
                (READ_AHEAD_COLD, "read ahead of the copies in 4 KiB folios")
            }
        };
        return owned(
            "sync",
            reading,
            format!(
                "cold, pages kept cached for the next load ({why}): buffered pread, the files {fill} \
                 ({}); {facts}",
                f.free_reporting.describe()
            ),
        );
    }
    let direct_ok = matches!(f.direct, Some(Ok(())));
    if direct_ok && f.uring.is_ok() && f.bytes_selected >= DIRECT_MIN_BYTES {
        return owned(
            "io-uring",
            Reading::Direct,
            format!(
                "cold, around the page cache, O_DIRECT and io_uring available: deep direct queue; {facts}"
            ),
        );
    }
    let why = match (&f.direct, &f.uring) {
        (Some(Err(e)), _) => format!("no O_DIRECT ({e})"),
        (_, Err(e)) => format!("no io_uring ({e})"),
        _ if f.bytes_selected < DIRECT_MIN_BYTES => "small selection".to_owned(),
        _ => "O_DIRECT not probed".to_owned(),
    };
    owned("sync", READ_AHEAD_COLD, format!("cold, {why}: buffered pread with readahead; {facts}"))
}

#[cfg(test)]
mod reporting_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The promise, for pure rule tests that map nothing.
    fn p() -> FilesUnchanged {
        // SAFETY: `choose` maps nothing; no view is ever made from these facts.
        unsafe { FilesUnchanged::promise() }
    }

    pub(super) fn facts() -> Facts {
        Facts {
            bytes_selected: 2 << 30,
            bytes_files: 2 << 30,
            files: 2,
            file_len_max_bytes: 1 << 30,
            residency: ResidencySample { sampled_pages: 100, resident_pages: 100 },
            filesystem: Some(probe::classify_filesystem(0xEF53)),
            uring: Ok(()),
            direct: None,
            cpus: 2,
            delivery: Delivery::Owned,
            residence: Residence::Owned,
            io_mode: IoMode::Auto,
            owned_destination_bytes: 2 << 30,
            memory: Some(MemoryRoom {
                total_bytes: 24 << 30,
                available_bytes: 20 << 30,
                cgroup_limit_bytes: None,
            }),
            free_reporting: memory::FreeReporting::On { order: 9, after_ms: 0 },
            pieces: Pieces::WholeTensors,
        }
    }

    /// Facts of a cold load that does not fit in the page cache (so it reads around it).
    pub(super) fn cold_around() -> Facts {
        let mut f = facts();
        f.residency.resident_pages = 0;
        f.memory =
            Some(MemoryRoom { total_bytes: 24 << 30, available_bytes: 4 << 30, cgroup_limit_bytes: None });
        f
    }

    #[test]
    fn warm_picks_sync_buffered_and_names_the_facts() {
        let c = choose(&facts());
        assert_eq!((c.residence, c.backend, c.reading.is_direct()), (Residence::Owned, "sync", false));
        assert!(
            c.reason.contains("warm") && c.reason.contains("100% of sampled pages cached"),
            "{}",
            c.reason
        );
        assert!(c.reason.contains("ext4") && c.reason.contains("2 file(s)"), "{}", c.reason);
        assert!(!c.reason.contains('\n'));
    }

    /// Only a load of cold data through the page cache reads ahead of its copies: a warm one
    /// copies (or maps) what is cached, either side of `WARM_FRACTION`, owned and mapped.
    #[test]
    fn only_cold_reads_through_the_cache_read_ahead() {
        let warm_pages = (WARM_FRACTION * 100.0) as u64;
        for residence in [Residence::Owned, Residence::Auto(p()), Residence::Mapped(p())] {
            let mut f = Facts { residence, ..facts() };
            f.residency.resident_pages = warm_pages;
            let c = choose(&f);
            assert_eq!(c.reading, Reading::Cached, "{}", c.reason);
            f.residency.resident_pages = warm_pages - 1;
            let c = choose(&f);
            assert_eq!(c.reading, READ_AHEAD_COLD, "{}", c.reason);
            assert!(c.reason.contains("cold") || c.reason.contains("mapped"), "{}", c.reason);
        }
        // Cold and around the page cache: the direct queue, no read-ahead.
        let mut f = cold_around();
        f.direct = Some(Ok(()));
        assert_eq!(choose(&f).reading, Reading::Direct);
        // A network filesystem reads buffered: ahead when cold, not when warm.
        f.filesystem = Some(probe::classify_filesystem(0x6969));
        assert_eq!(choose(&f).reading, READ_AHEAD_COLD);
        f.residency.resident_pages = 100;
        assert_eq!(choose(&f).reading, Reading::Cached);
    }

    #[test]
    fn a_cast_converts_from_views_only_when_warm_on_a_local_filesystem() {
        let warm_pages = (WARM_FRACTION * 100.0) as u64;
        let mut f = facts();
        f.residency.resident_pages = warm_pages;
        assert!(cast_from_views(&f).is_some());
        f.residency.resident_pages = warm_pages - 1;
        assert_eq!(cast_from_views(&f), None);
        f.residency.resident_pages = warm_pages;
        f.filesystem = Some(probe::classify_filesystem(0x6969));
        assert_eq!(cast_from_views(&f), None, "NFS");
        f.filesystem = None;
        assert_eq!(cast_from_views(&f), None, "filesystem unknown");
    }

    #[test]
    fn cold_large_with_direct_and_uring_picks_uring_direct() {
        let mut f = cold_around();
        f.direct = Some(Ok(()));
        let c = choose(&f);
        assert_eq!((c.backend, c.reading.is_direct()), ("io-uring", true));
        assert!(c.reason.contains("cold, around the page cache"), "{}", c.reason);
        f.uring = Err("EPERM".into());
        let c = choose(&f);
        assert_eq!((c.backend, c.reading.is_direct()), ("sync", false));
        assert!(c.reason.contains("no io_uring (EPERM)"), "{}", c.reason);
        f.uring = Ok(());
        f.bytes_selected = 1 << 20;
        assert_eq!(choose(&f).backend, "sync");
        f.bytes_selected = 2 << 30;
        f.direct = Some(Err("EINVAL".into()));
        assert!(choose(&f).reason.contains("no O_DIRECT"));
    }

    #[test]
    fn remote_filesystems_never_get_lazy_views_or_direct() {
        let mut f = facts();
        f.filesystem = Some(probe::classify_filesystem(0x6969));
        f.residency.resident_pages = 0;
        f.direct = Some(Ok(()));
        let c = choose(&f);
        assert_eq!((c.backend, c.reading.is_direct()), ("sync", false));
        assert!(c.reason.contains("nfs"));
        f.residence = Residence::Auto(p());
        f.residency.resident_pages = 100;
        let c = choose(&f);
        assert_eq!((c.residence, c.backend), (Residence::Owned, "sync"));
        assert!(c.reason.starts_with("owned: nfs is a network/FUSE filesystem"), "{}", c.reason);
        f.residence = Residence::Mapped(p());
        let c = choose(&f);
        assert_eq!(c.residence, Residence::Mapped(p()));
        assert!(c.reason.contains("note: nfs") && c.reason.contains("read in at load"), "{}", c.reason);
        assert!(c.reason.starts_with("mapped: residence \"mapped\""), "{}", c.reason);
    }

    #[test]
    fn auto_residence_maps_warm_local_data_and_owns_cold_data() {
        let mut f = Facts { residence: Residence::Auto(p()), ..facts() };
        let c = choose(&f);
        assert_eq!((c.residence, c.backend, c.reading.is_direct()), (Residence::Mapped(p()), "mmap", false));
        assert!(c.reason.starts_with("mapped: warm, on local ext4"), "{}", c.reason);
        f.memory = cold_around().memory;
        f.residency.resident_pages = 49;
        f.direct = Some(Ok(()));
        let c = choose(&f);
        assert_eq!((c.residence, c.backend, c.reading.is_direct()), (Residence::Owned, "io-uring", true));
        assert!(c.reason.starts_with("owned: cold, around the page cache ("), "{}", c.reason);
        assert!(c.reason.contains("; cold, around the page cache, O_DIRECT"), "{}", c.reason);
        f.residency = ResidencySample::default();
        assert!(choose(&f).reason.starts_with("owned: no page-cache sample"));
    }

    #[test]
    fn mapped_residence_picks_mmap_and_density_is_sane() {
        let mut f = facts();
        f.residence = Residence::Mapped(p());
        assert_eq!(choose(&f).backend, "mmap");
        f.bytes_selected = 1 << 30;
        assert!((f.density() - 0.5).abs() < 1e-9);
        f.bytes_files = 0;
        assert_eq!(f.density(), 1.0);
        f.residency = ResidencySample::default();
        assert!(!f.warm());
    }

    #[test]
    fn a_cold_load_that_fits_keeps_its_pages_when_views_are_allowed_and_says_so() {
        let mut f = Facts { residence: Residence::Auto(p()), ..facts() };
        f.residency.resident_pages = 0;
        f.direct = Some(Ok(()));
        // 2 GiB to cache + 3 GiB margin (24 GiB / 8) <= 20 GiB: mapped, pages kept.
        let c = choose(&f);
        assert_eq!((c.residence, c.backend, c.reading.is_direct()), (Residence::Mapped(p()), "mmap", false));
        assert!(c.reason.contains("pages kept cached for the next load (2.15 GB to cache"), "{}", c.reason);
        assert!(c.reason.contains("<= 21.47 GB available"), "{}", c.reason);
        // Asked for O_DIRECT: around the cache, whatever the room.
        f.io_mode = IoMode::Direct;
        let c = choose(&f);
        assert_eq!((c.residence, c.backend, c.reading.is_direct()), (Residence::Owned, "io-uring", true));
        assert!(c.reason.starts_with("owned: cold, around the page cache (O_DIRECT asked)"), "{}", c.reason);
        // Filesystem unknown: never cold views.
        f.io_mode = IoMode::Auto;
        f.filesystem = None;
        let c = choose(&f);
        assert_eq!(c.residence, Residence::Owned, "{}", c.reason);
        assert!(c.reason.starts_with("owned: cold, on a filesystem statfs could not name"), "{}", c.reason);
        f.filesystem = facts().filesystem;
        // Room unknown: around the cache.
        f.memory = None;
        assert!(page_cache(&f, 0) == PageCache::Around("available memory unknown".to_owned()));
        assert_eq!(choose(&f).backend, "io-uring");
        // An owned copy whose pages and arena fit keeps the pages too: buffered, read ahead.
        f.memory = facts().memory;
        f.residence = Residence::Owned;
        let c = choose(&f);
        assert_eq!((c.residence, c.backend, c.reading.is_direct()), (Residence::Owned, "sync", false));
        assert!(
            c.reason.starts_with(
                "owned: residence \"owned\"; cold, pages kept cached for the next load (2.15 GB to cache + \
                 2.15 GB destination"
            ),
            "{}",
            c.reason
        );
        assert!(c.reason.contains("buffered pread, the files read ahead of the copies"), "{}", c.reason);
    }

    #[test]
    fn an_owned_cold_copy_keeps_its_pages_exactly_when_pages_and_arena_fit() {
        let mut f = cold_around();
        f.direct = Some(Ok(()));
        // 2 GiB of pages + 2 GiB of arena + 3 GiB of margin (24 GiB / 8): 7 GiB needed.
        let need_bytes = 7u64 << 30;
        f.memory =
            Some(MemoryRoom { total_bytes: 24 << 30, available_bytes: need_bytes, cgroup_limit_bytes: None });
        let c = choose(&f);
        assert_eq!((c.backend, c.reading.is_direct()), ("sync", false), "{}", c.reason);
        assert!(c.reason.contains("<= 7.52 GB available"), "{}", c.reason);
        f.memory = Some(MemoryRoom {
            total_bytes: 24 << 30,
            available_bytes: need_bytes - 1,
            cgroup_limit_bytes: None,
        });
        let c = choose(&f);
        assert_eq!((c.backend, c.reading.is_direct()), ("io-uring", true), "{}", c.reason);
        assert!(
            c.reason.starts_with("owned: residence \"owned\"; cold, around the page cache, O_DIRECT"),
            "{}",
            c.reason
        );
        // --direct / cache_pages=False: around the cache however much room there is.
        f.memory = facts().memory;
        f.io_mode = IoMode::Direct;
        assert_eq!(choose(&f).backend, "io-uring");
        // Without O_DIRECT or io_uring a cold copy that fits still says it keeps its pages.
        f.io_mode = IoMode::Auto;
        f.direct = Some(Err("EINVAL".into()));
        assert!(choose(&f).reason.contains("cold, pages kept cached"));
    }

    #[test]
    fn auto_residence_maps_a_cold_load_whose_pages_fit_but_not_its_arena() {
        // 2 GiB to cache + 3 GiB margin fits in 6 GiB; with the 2 GiB arena it would not.
        let mut f = Facts { residence: Residence::Auto(p()), ..facts() };
        f.residency.resident_pages = 0;
        f.direct = Some(Ok(()));
        f.memory =
            Some(MemoryRoom { total_bytes: 24 << 30, available_bytes: 6 << 30, cgroup_limit_bytes: None });
        let c = choose(&f);
        assert_eq!((c.residence, c.backend), (Residence::Mapped(p()), "mmap"));
        assert!(c.reason.starts_with("mapped: cold, on local ext4, pages kept cached"), "{}", c.reason);
        f.residence = Residence::Owned;
        let c = choose(&f);
        assert_eq!((c.backend, c.reading.is_direct()), ("io-uring", true), "{}", c.reason);
        // A streamed load's destination is one window: it fits again.
        f.delivery = Delivery::Streaming;
        f.owned_destination_bytes = 256 << 20;
        assert!(matches!(page_cache(&f, f.owned_destination_bytes), PageCache::Keep(_)));
        // A cgroup's limit is named when it is what binds.
        f.memory = Some(MemoryRoom {
            total_bytes: 24 << 30,
            available_bytes: 1 << 30,
            cgroup_limit_bytes: Some(2 << 30),
        });
        let PageCache::Around(why) = page_cache(&f, 0) else { panic!("1 GiB of room cannot hold 2 GiB") };
        assert!(why.ends_with("1.07 GB available (cgroup limit)"), "{why}");
    }

    #[test]
    fn a_view_opened_cold_is_read_ahead_exactly_when_local_and_its_pages_fit() {
        let mut f = cold_around();
        // 2 GiB of pages + 3 GiB of margin: 5 GiB needed, no destination for views.
        f.memory =
            Some(MemoryRoom { total_bytes: 24 << 30, available_bytes: 5 << 30, cgroup_limit_bytes: None });
        let why = read_ahead_at_open(&f).unwrap();
        assert!(why.starts_with("cold, pages fit (2.15 GB to cache + 0.00 GB destination"), "{why}");
        f.memory = Some(MemoryRoom {
            total_bytes: 24 << 30,
            available_bytes: (5 << 30) - 1,
            cgroup_limit_bytes: None,
        });
        assert!(read_ahead_at_open(&f).unwrap_err().starts_with("cold, pages do not fit"));
        f.memory = facts().memory;
        f.io_mode = IoMode::Direct;
        assert!(read_ahead_at_open(&f).is_err(), "O_DIRECT asked: nothing kept");
        f.io_mode = IoMode::Auto;
        f.residency.resident_pages = 50;
        assert_eq!(read_ahead_at_open(&f).unwrap_err(), "warm (50% of sampled pages cached)");
        f.residency.resident_pages = 0;
        f.filesystem = Some(probe::classify_filesystem(0x6969));
        assert!(read_ahead_at_open(&f).unwrap_err().contains("network/FUSE"));
        f.filesystem = None;
        assert!(read_ahead_at_open(&f).is_err());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]
        /// The page-cache rule is exactly the stated sum, on both sides of the threshold, and a
        /// load kept in the cache never reads with O_DIRECT.
        #[test]
        fn pages_are_kept_exactly_when_the_sum_fits(
            selected_mib in 1u64..40_000,
            available_mib in 0u64..30_000,
            resident in 0u64..=100,
            destination_mib in 0u64..40_000,
        ) {
            let mut f = facts();
            f.bytes_selected = selected_mib << 20;
            f.residency.resident_pages = resident;
            f.memory = Some(MemoryRoom { total_bytes: 24 << 30, available_bytes: available_mib << 20, cgroup_limit_bytes: None });
            let uncached = (f.bytes_selected as f64 * (1.0 - resident as f64 / 100.0)) as u64;
            let margin = PAGE_CACHE_MARGIN_MIN_BYTES.max((24u64 << 30) / PAGE_CACHE_MARGIN_DIVISOR);
            let fits = uncached + (destination_mib << 20) + margin <= available_mib << 20;
            let kept = matches!(page_cache(&f, destination_mib << 20), PageCache::Keep(_));
            prop_assert_eq!(kept, fits);
            f.residence = Residence::Auto(p());
            f.direct = Some(Ok(()));
            let c = choose(&f);
            // Views need no destination: they keep the pages when the pages alone fit.
            let views_fit = matches!(page_cache(&f, 0), PageCache::Keep(_));
            prop_assert_eq!(c.residence == Residence::Mapped(p()), views_fit || resident >= 50, "{}", c.reason);
            prop_assert!(!(views_fit && c.reading.is_direct()), "{}", c.reason);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]
        /// Mapped exactly when asked for, or when asked to decide on local data that is warm or
        /// whose pages fit in the page cache; the reason starts with the residence whenever `auto`
        /// decided it.
        #[test]
        fn mapped_only_when_asked_or_local_and_warm_or_fitting(
            resident in proptest::option::of(0u64..=100),
            remote in any::<bool>(),
            residence in prop_oneof![Just(Residence::Auto(p())), Just(Residence::Owned), Just(Residence::Mapped(p()))],
            available_gib in 0u64..24,
        ) {
            let f = Facts {
                residency: resident.map_or(ResidencySample::default(), |r| ResidencySample {
                    sampled_pages: 100,
                    resident_pages: r,
                }),
                filesystem: Some(probe::classify_filesystem(if remote { 0x6969 } else { 0xEF53 })),
                residence,
                memory: Some(MemoryRoom { total_bytes: 24 << 30, available_bytes: available_gib << 30, cgroup_limit_bytes: None }),
                ..facts()
            };
            let c = choose(&f);
            let warm = resident.is_some_and(|r| r as f64 / 100.0 >= WARM_FRACTION);
            // 2 GiB selected, the part not resident to cache, a 3 GiB margin (24 GiB / 8).
            let fits = resident.is_some_and(|r| {
                ((2u64 << 30) as f64 * (1.0 - r as f64 / 100.0)) as u64 + (3 << 30) <= available_gib << 30
            });
            let want_mapped = match residence {
                Residence::Mapped(_) => true,
                Residence::Owned => false,
                Residence::Auto(_) => !remote && (warm || fits),
            };
            prop_assert_eq!(c.residence == Residence::Mapped(p()), want_mapped);
            prop_assert_eq!(c.backend == "mmap", want_mapped);
            prop_assert!(!(want_mapped && c.reading.is_direct()));
            let prefix = if want_mapped { "mapped:" } else { "owned:" };
            prop_assert!(c.reason.starts_with(prefix), "{}", c.reason);
        }
    }
}
