//! Page-cache control for benchmarks and tests: evict one file, or drop every clean page on the
//! machine.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

/// Drop `file`'s pages from the page cache (`posix_fadvise(POSIX_FADV_DONTNEED)` over the whole file).
/// Dirty pages are not dropped; call `sync_all` first on a file you just wrote.
pub fn evict_file_cache(file: &File) -> io::Result<()> {
    // SAFETY: plain syscall on a descriptor we borrow; no memory is passed.
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(())
}

/// `sync`, then write `3` to `/proc/sys/vm/drop_caches` (needs root). Drops every clean page-cache
/// page and slab object on the machine: use only in benchmarks.
pub fn drop_caches_global() -> io::Result<()> {
    // SAFETY: `sync` takes no arguments and cannot fail.
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", b"3\n")
}
