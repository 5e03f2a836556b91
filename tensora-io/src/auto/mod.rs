//! `--backend auto`: choose a backend and an I/O mode from measured facts.
//!
//! [`gather`] reads the facts (cheap, bounded: one `statfs` per distinct directory, a `mincore`
//! sample of at most [`crate::auto::probe::RESIDENCY_SAMPLE_WINDOWS_MAX`] windows per file for at most
//! [`RESIDENCY_FILES_MAX`] files, the cached io_uring probe, and an O_DIRECT probe only when the
//! data is cold); [`choose`] is a pure rule table over them, so it is unit-tested directly.
//!
//! The rule table (first match wins), justified by measurements on the 2-core reference machine
//! (see ARCHITECTURE.md, "Answers to the design questions"):
//!
//! | facts | choice | why |
//! |---|---|---|
//! | `Residence::Mapped` | mmap, mapped | the caller asked for zero-copy views; on a network/FUSE filesystem every selected range is prewarmed (`MADV_POPULATE_READ`) before the views are handed out, so a lazy page fault never waits on the network (and a failing read is a typed error, not a `SIGBUS` later) |
//! | network/FUSE filesystem | sync, buffered | never lazy mmap there; O_DIRECT semantics vary |
//! | warm (≥ [`WARM_FRACTION`] of sampled pages cached) | sync, buffered | one copy from the page cache into the hugepage arena is the roofline. Copying from a mapping (the mmap backend) measured within noise of it here (paired runs: medians 7.4 vs 7.0 GB/s, with deeper dips), and it can fault if a file is truncated mid-copy, so `auto` keeps `pread` |
//! | cold, O_DIRECT works, io_uring available, ≥ [`DIRECT_MIN_BYTES`] selected | io-uring, direct | deep queue of large aligned reads, no page-cache copy |
//! | cold otherwise | sync, buffered | kernel readahead with several threads |

use std::path::Path;

use tensora_format::Checkpoint;

pub mod probe;

use probe::{Filesystem, ResidencySample};

/// At or above this fraction of sampled pages resident, the selection counts as warm.
pub const WARM_FRACTION: f64 = 0.5;
/// Below this many selected bytes a cold load stays buffered (O_DIRECT setup is not worth it).
pub const DIRECT_MIN_BYTES: u64 = 256 << 20;
/// Files whose residency is sampled (the first ones the selection touches).
pub const RESIDENCY_FILES_MAX: usize = 16;

/// What `auto` looked at.
#[derive(Debug, Clone, PartialEq)]
pub struct Facts {
    pub bytes_selected: u64,
    /// Sum of the sizes of the files the selection touches.
    pub bytes_files: u64,
    pub files: usize,
    /// Largest file touched.
    pub file_len_max_bytes: u64,
    pub residency: ResidencySample,
    /// Filesystem of the first file; `None` if `statfs` failed.
    pub filesystem: Option<Filesystem>,
    /// Whether io_uring works here (probed), with the reason when not.
    pub uring: Result<(), String>,
    /// Whether O_DIRECT reads work on the first file; `None` when not probed (warm data).
    pub direct: Option<Result<(), String>>,
    pub cpus: usize,
    pub streaming: bool,
    pub mapped: bool,
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
}

/// What `auto` chose.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    pub backend: &'static str,
    pub direct: bool,
    /// One line naming the deciding facts.
    pub reason: String,
}

/// Read the facts for a selection (`selected` indexes [`Checkpoint::tensors`]). Residency is
/// sampled over the selected tensors' byte ranges of the first [`RESIDENCY_FILES_MAX`] files.
pub fn gather(ckpt: &Checkpoint, selected: &[usize], streaming: bool, mapped: bool) -> Facts {
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
    let direct = match first {
        Some(p) if !warm && !mapped => Some(probe::direct_io_supported(p)),
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
        streaming,
        mapped,
    }
}

/// The rule table (see the module docs).
pub fn choose(f: &Facts) -> Choice {
    let fs_name = f.filesystem.as_ref().map_or("unknown fs", |fs| fs.name.as_str());
    let remote = f.filesystem.as_ref().is_some_and(|fs| fs.remote);
    let facts = format!(
        "{} file(s), {:.2} GB selected ({:.0}% of files), {:.0}% of sampled pages cached, {fs_name}, {} CPU(s){}",
        f.files,
        f.bytes_selected as f64 / 1e9,
        f.density() * 100.0,
        f.residency.fraction() * 100.0,
        f.cpus,
        if f.streaming { ", streaming" } else { "" },
    );
    if f.mapped {
        let reason = if remote {
            format!(
                "mapped views requested (warning: {fs_name} is a network/FUSE filesystem: every \
                 selected range is prewarmed, never faulted in lazily); {facts}"
            )
        } else {
            format!("mapped views requested; {facts}")
        };
        return Choice { backend: "mmap", direct: false, reason };
    }
    if remote {
        return Choice {
            backend: "sync",
            direct: false,
            reason: format!(
                "{fs_name} is a network/FUSE filesystem: buffered pread, never lazy mmap; {facts}"
            ),
        };
    }
    if f.warm() {
        return Choice {
            backend: "sync",
            direct: false,
            reason: format!("warm: one pread copy from the page cache into the hugepage arena; {facts}"),
        };
    }
    let direct_ok = matches!(f.direct, Some(Ok(())));
    if direct_ok && f.uring.is_ok() && f.bytes_selected >= DIRECT_MIN_BYTES {
        return Choice {
            backend: "io-uring",
            direct: true,
            reason: format!("cold, O_DIRECT and io_uring available: deep direct queue; {facts}"),
        };
    }
    let why = match (&f.direct, &f.uring) {
        (Some(Err(e)), _) => format!("no O_DIRECT ({e})"),
        (_, Err(e)) => format!("no io_uring ({e})"),
        _ if f.bytes_selected < DIRECT_MIN_BYTES => "small selection".to_owned(),
        _ => "O_DIRECT not probed".to_owned(),
    };
    Choice {
        backend: "sync",
        direct: false,
        reason: format!("cold, {why}: buffered pread with readahead; {facts}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts() -> Facts {
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
            streaming: false,
            mapped: false,
        }
    }

    #[test]
    fn warm_picks_sync_buffered_and_names_the_facts() {
        let c = choose(&facts());
        assert_eq!((c.backend, c.direct), ("sync", false));
        assert!(
            c.reason.contains("warm") && c.reason.contains("100% of sampled pages cached"),
            "{}",
            c.reason
        );
        assert!(c.reason.contains("ext4") && c.reason.contains("2 file(s)"), "{}", c.reason);
        assert!(!c.reason.contains('\n'));
    }

    #[test]
    fn cold_large_with_direct_and_uring_picks_uring_direct() {
        let mut f = facts();
        f.residency.resident_pages = 0;
        f.direct = Some(Ok(()));
        let c = choose(&f);
        assert_eq!((c.backend, c.direct), ("io-uring", true));
        f.uring = Err("EPERM".into());
        let c = choose(&f);
        assert_eq!((c.backend, c.direct), ("sync", false));
        assert!(c.reason.contains("no io_uring (EPERM)"), "{}", c.reason);
        f.uring = Ok(());
        f.bytes_selected = 1 << 20;
        assert_eq!(choose(&f).backend, "sync");
        f.bytes_selected = 2 << 30;
        f.direct = Some(Err("EINVAL".into()));
        assert!(choose(&f).reason.contains("no O_DIRECT"));
    }

    #[test]
    fn remote_filesystems_never_get_mmap_or_direct() {
        let mut f = facts();
        f.filesystem = Some(probe::classify_filesystem(0x6969));
        f.residency.resident_pages = 0;
        f.direct = Some(Ok(()));
        let c = choose(&f);
        assert_eq!((c.backend, c.direct), ("sync", false));
        assert!(c.reason.contains("nfs"));
        f.mapped = true;
        assert!(choose(&f).reason.contains("warning"));
        assert!(choose(&f).reason.contains("prewarmed"));
    }

    #[test]
    fn mapped_residence_picks_mmap_and_density_is_sane() {
        let mut f = facts();
        f.mapped = true;
        assert_eq!(choose(&f).backend, "mmap");
        f.bytes_selected = 1 << 30;
        assert!((f.density() - 0.5).abs() < 1e-9);
        f.bytes_files = 0;
        assert_eq!(f.density(), 1.0);
        f.residency = ResidencySample::default();
        assert!(!f.warm());
    }
}
