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
    // Opened as the load opens them (a path that names no regular file by now is not sampled,
    // never opened plainly: a FIFO would block); the first one is kept for the O_DIRECT probe.
    let mut first_file = None;
    for (k, (e, (_, ranges))) in entries.iter().zip(&by_file).take(RESIDENCY_FILES_MAX).enumerate() {
        let Ok((file, _)) = crate::load::open_regular_file(e.path()) else { continue };
        if let Ok(s) = probe::residency_sample_ranges(&file, e.len_bytes(), ranges) {
            residency = residency.merge(s);
        }
        if k == 0 {
            first_file = Some(file);
        }
    }
    let first: Option<&Path> = entries.first().map(|e| e.path());
    let filesystem = first.and_then(|p| probe::filesystem(p).ok());
    let warm = residency.sampled_pages > 0 && residency.fraction() >= WARM_FRACTION;
    // Only a cold owned load can use O_DIRECT; `Auto` resolves to owned when cold. The probe
    // reopens the checked first file through its `/proc/self/fd` link, never the path again.
    let direct = match (first, &first_file) {
        (Some(_), Some(f)) if !warm && !residence.is_mapped() => {
            Some(probe::direct_io_supported(&probe::fd_path(f)))
        }
        (Some(p), None) if !warm && !residence.is_mapped() => {
            Some(Err(format!("{} is not an openable regular file", p.display())))
        }
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
mod tests;
