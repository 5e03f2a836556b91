//! Dropping the page cache before cold runs, and saying how it was done.

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
    /// Probe: try the root knob once, fall back to per-file advice; fail if neither works on
    /// `probe_file`.
    pub fn probe(probe_file: &Path) -> Result<CacheDropper> {
        if write_drop_caches().is_ok() {
            return Ok(CacheDropper { method: DropMethod::ProcDropCaches });
        }
        fadvise_dontneed(probe_file).context("neither drop_caches nor posix_fadvise(DONTNEED) works here")?;
        Ok(CacheDropper { method: DropMethod::FadviseDontneed })
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
            DropMethod::FadviseDontneed => files.iter().try_for_each(|f| fadvise_dontneed(f)),
        }
    }
}

fn write_drop_caches() -> Result<()> {
    tensora_testkit::cache::drop_caches_global().with_context(|| format!("write {DROP_CACHES_PATH}"))
}

fn fadvise_dontneed(file: &Path) -> Result<()> {
    let f = std::fs::File::open(file).with_context(|| format!("open {}", file.display()))?;
    tensora_testkit::cache::evict_file_cache(&f).with_context(|| format!("posix_fadvise {}", file.display()))
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
        let dropper = CacheDropper { method: DropMethod::FadviseDontneed };
        dropper.drop_files(std::slice::from_ref(&f)).unwrap();
        assert_eq!(std::fs::read(&f).unwrap().len(), 1 << 16);
        assert!(dropper.drop_files(&[dir.path().join("missing")]).is_err());
        assert!(!DropMethod::FadviseDontneed.describe().is_empty());
    }
}
