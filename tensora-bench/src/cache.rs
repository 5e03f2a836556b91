//! Dropping the page cache before cold runs, and saying how it was done.
//!
//! The fixture's own pages are evicted (`posix_fadvise(DONTNEED)`), checked with a residency
//! sample; the whole machine's cache (`drop_caches`, root only) only where that does not work.
//! Evicting just the fixture leaves other processes' cache alone (on a shared machine their
//! re-reads would compete with the cold load) and needs no machine-wide `sync`; measured on the
//! reference VM, cold `auto` loads ran at 1.86 GB/s (1.73..1.92) after a per-file eviction and
//! 1.44 (1.29..1.61) after `drop_caches`, five runs each, other builds running.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

/// The kernel knob that drops clean page-cache pages (root only).
pub const DROP_CACHES_PATH: &str = "/proc/sys/vm/drop_caches";

/// How cold runs empty the page cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DropMethod {
    /// `echo 3 > /proc/sys/vm/drop_caches` (needs root): every clean page of the machine.
    ProcDropCaches,
    /// `posix_fadvise(POSIX_FADV_DONTNEED)` on each fixture file (`tensora_io::probe`).
    FadviseDontneed,
}

impl DropMethod {
    /// The name of the method, as in the JSON (and as the Python peer runner takes it).
    pub const fn as_str(self) -> &'static str {
        match self {
            DropMethod::ProcDropCaches => "proc-drop-caches",
            DropMethod::FadviseDontneed => "fadvise-dontneed",
        }
    }

    /// Human-readable description for the report.
    pub const fn describe(self) -> &'static str {
        match self {
            DropMethod::ProcDropCaches => "sync; echo 3 > /proc/sys/vm/drop_caches (root)",
            DropMethod::FadviseDontneed => "posix_fadvise(POSIX_FADV_DONTNEED) on each fixture file",
        }
    }
}

/// Drops the cache with the best method that works here.
#[derive(Debug, Clone)]
pub struct CacheDropper {
    method: DropMethod,
}

impl CacheDropper {
    /// Probe: per-file advice when it really evicts `probe_file` (read first, then advised, then
    /// sampled with `mincore`), otherwise the root knob; fail if neither works.
    pub fn probe(probe_file: &Path) -> Result<CacheDropper> {
        let advice = fadvise_evicts(probe_file);
        if advice.is_ok() {
            return Ok(CacheDropper { method: DropMethod::FadviseDontneed });
        }
        write_drop_caches().with_context(|| {
            format!("posix_fadvise(DONTNEED) does not evict here ({:#}), and", advice.unwrap_err())
        })?;
        Ok(CacheDropper { method: DropMethod::ProcDropCaches })
    }

    /// A dropper that uses `method` (a child process uses its parent's choice).
    pub fn with_method(method: DropMethod) -> CacheDropper {
        CacheDropper { method }
    }

    /// The method in use.
    pub fn method(&self) -> DropMethod {
        self.method
    }

    /// Drop `files` (and, as root, everything else) from the page cache.
    pub fn drop_files(&self, files: &[PathBuf]) -> Result<()> {
        match self.method {
            DropMethod::ProcDropCaches => write_drop_caches(),
            DropMethod::FadviseDontneed => files.iter().try_for_each(|f| evict(f)),
        }
    }
}

fn write_drop_caches() -> Result<()> {
    tensora_sys::drop_caches_global().with_context(|| format!("write {DROP_CACHES_PATH}"))
}

/// Whether advice evicts `path`: read its first [`EVICT_PROBE_BYTES`], advise, and find none of
/// its sampled pages resident.
fn fadvise_evicts(path: &Path) -> Result<()> {
    use std::io::Read;
    let mut head = Vec::new();
    let f = std::fs::File::open(path).with_context(|| format!("open {}", path.display()))?;
    f.take(EVICT_PROBE_BYTES).read_to_end(&mut head).with_context(|| format!("read {}", path.display()))?;
    evict(path)
}

/// Advise `path` out of the page cache and check that a residency sample finds none of it left
/// (a cold run that is not cold is an error, never a figure).
fn evict(path: &Path) -> Result<()> {
    fadvise_dontneed(path)?;
    let f = std::fs::File::open(path).with_context(|| format!("open {}", path.display()))?;
    let sample = tensora_sys::residency_sample(&f, f.metadata()?.len())?;
    if sample.resident_pages > 0 {
        anyhow::bail!(
            "{}: {} of {} sampled pages still in the page cache after posix_fadvise(DONTNEED)",
            path.display(),
            sample.resident_pages,
            sample.sampled_pages
        );
    }
    Ok(())
}

/// Bytes [`fadvise_evicts`] reads before evicting.
const EVICT_PROBE_BYTES: u64 = 1 << 20;

fn fadvise_dontneed(file: &Path) -> Result<()> {
    let f = std::fs::File::open(file).with_context(|| format!("open {}", file.display()))?;
    tensora_sys::evict_file_cache(&f).with_context(|| format!("posix_fadvise {}", file.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_file_dropping_works_and_reports_missing_files() {
        // Not `probe`: as root it would empty the whole machine's page cache on every test run.
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("x");
        std::fs::write(&f, vec![7u8; 1 << 16]).unwrap();
        // Dirty pages cannot be evicted: written back first, as the fixture writer does.
        std::fs::File::open(&f).unwrap().sync_all().unwrap();
        let dropper = CacheDropper { method: DropMethod::FadviseDontneed };
        dropper.drop_files(std::slice::from_ref(&f)).unwrap();
        assert_eq!(std::fs::read(&f).unwrap().len(), 1 << 16);
        assert!(dropper.drop_files(&[dir.path().join("missing")]).is_err());
        assert!(!DropMethod::FadviseDontneed.describe().is_empty());
        // Advice evicts on an ordinary filesystem; a missing file is an error.
        fadvise_evicts(&f).unwrap();
        assert!(fadvise_evicts(&dir.path().join("missing")).is_err());
        assert_eq!(DropMethod::ProcDropCaches.as_str(), "proc-drop-caches");
    }
}
