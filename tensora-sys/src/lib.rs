//! The operating system as Tensora sees it: the one home for OS facts and the syscalls std has no
//! safe form of, so that the crates above (tensora-io, tensora-convert, tensora-remote, the bench)
//! share one implementation and keep their `unsafe` to what is theirs.
//!
//! Facts only: each function measures or asks, and returns what it found; what to do with it
//! (`auto`'s rules, a save's write mode, the cache's reservation) stays with the caller.
//!
//! - Files: [`preallocate`], [`in_memory_filesystem`], [`open_direct`],
//!   [`direct_io_supported`] and [`clear_nonblocking`]; naming without replacing: [`link_unnamed`], [`rename_noreplace`].
//! - The filesystem and the page cache: [`filesystem`] (`statfs`), [`residency_sample`]
//!   (`mincore`, bounded), [`evict_file_cache`] and [`drop_caches_global`] (benchmarks).
//! - The machine: [`memory_room`] (`MemAvailable` and the cgroup's limit), [`cpu_count`],
//!   [`kernel_version`].
//! - This process: [`Faults`] and [`peak_rss_bytes`]; [`idle_priority`] for the calling thread.
//!
//! ```
//! let file = tempfile::tempfile()?;
//! tensora_sys::preallocate(&file, 1 << 20)?;
//! assert_eq!(file.metadata()?.len(), 1 << 20);
//! let fs = tensora_sys::filesystem(&std::env::temp_dir())?;
//! assert!(!fs.name.is_empty());
//! # Ok::<(), std::io::Error>(())
//! ```
#![warn(missing_docs)]

mod fs;
mod memory;
mod page_cache;
mod probe;
mod reporting;
mod sched;
mod usage;

pub use fs::{clear_nonblocking, fd_path, in_memory_filesystem, link_unnamed, preallocate, rename_noreplace};
pub use memory::{CGROUP_FILES_MAX, MemoryRoom, memory_room};
pub use page_cache::{drop_caches_global, evict_file_cache};
pub use probe::{
    Filesystem, RESIDENCY_SAMPLE_WINDOWS_MAX, RESIDENCY_WINDOW_PAGES, ResidencySample, classify_filesystem,
    cpu_count, direct_io_supported, filesystem, kernel_version, open_direct, parse_kernel_release,
    residency_sample, residency_sample_ranges,
};
pub use reporting::{FreeReporting, free_reporting, read_free_reporting};
pub use sched::idle_priority;
pub use usage::{Faults, peak_rss_bytes};
