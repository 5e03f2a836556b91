//! Measured facts about files and the machine: page-cache residency (sampled with `mincore`),
//! filesystem type (`statfs`), O_DIRECT support, CPU count, kernel version.
//!
//! Every probe here is cheap by construction: a residency sample looks at a bounded number of
//! pages ([`RESIDENCY_SAMPLE_WINDOWS_MAX`] windows of [`RESIDENCY_WINDOW_PAGES`] pages per file), so it
//! stays far below 1 ms whatever the file size.
//!
//! # Example
//!
//! ```
//! use std::io::Write;
//! let mut f = tempfile::NamedTempFile::new()?;
//! f.write_all(&[1u8; 8192])?;
//! let fs = tensora_sys::filesystem(f.path())?;
//! assert!(!fs.name.is_empty());
//! let resident = tensora_sys::residency_sample(f.as_file(), 8192)?;
//! assert!(resident.sampled_pages > 0);
//! # Ok::<(), std::io::Error>(())
//! ```

use std::fs::{File, OpenOptions};
use std::io;
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Windows sampled per file by [`residency_sample`].
pub const RESIDENCY_SAMPLE_WINDOWS_MAX: u64 = 32;
/// Pages per sampled window.
pub const RESIDENCY_WINDOW_PAGES: u64 = 16;
const PAGE_BYTES: u64 = 4096;

/// Open `path` read-only with `O_DIRECT`. Errors with `EINVAL` where the filesystem refuses it
/// (tmpfs, some overlay setups).
pub fn open_direct(path: &Path) -> io::Result<File> {
    OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(path)
}

/// Whether O_DIRECT reads work on `path`: opens it with `O_DIRECT` and reads its first block into
/// an aligned buffer. Returns the reason when they do not.
pub fn direct_io_supported(path: &Path) -> Result<(), String> {
    let file = open_direct(path).map_err(|e| format!("O_DIRECT open: {e}"))?;
    // Two pages hold one page-aligned page, which O_DIRECT needs (no `unsafe` allocation).
    let mut two_pages = vec![0u8; 2 * PAGE_BYTES as usize];
    let aligned_at = two_pages.as_ptr().align_offset(PAGE_BYTES as usize);
    let buf = &mut two_pages[aligned_at..aligned_at + PAGE_BYTES as usize];
    use std::os::unix::fs::FileExt;
    match file.read_at(buf, 0) {
        Ok(_) => Ok(()),
        Err(e) => Err(format!("O_DIRECT read: {e}")),
    }
}

/// A filesystem as `statfs` names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Filesystem {
    /// `f_type` magic.
    pub magic: i64,
    /// A short name: "ext4", "xfs", "btrfs", "tmpfs", "ramfs", "overlay", "nfs", "fuse", "cifs",
    /// ... or "unknown(0x...)".
    pub name: String,
    /// Network or userspace filesystems where lazy mmap faults are slow and SIGBUS-prone.
    pub remote: bool,
}

/// `statfs(path)` and classify the filesystem.
pub fn filesystem(path: &Path) -> io::Result<Filesystem> {
    let c_path = crate::fs::c_path(path)?;
    let mut st = std::mem::MaybeUninit::<libc::statfs>::zeroed();
    // SAFETY: `c_path` is NUL-terminated and `st` is a valid out-pointer of the right type.
    let rc = unsafe { libc::statfs(c_path.as_ptr(), st.as_mut_ptr()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: statfs succeeded, so it filled the struct (and it was zeroed before).
    let st = unsafe { st.assume_init() };
    #[allow(clippy::unnecessary_cast)] // f_type's width differs across targets.
    let magic = st.f_type as i64;
    Ok(classify_filesystem(magic))
}

/// Name a `statfs` magic number.
pub fn classify_filesystem(magic: i64) -> Filesystem {
    let (name, remote) = match magic {
        0xEF53 => ("ext4", false),
        0x5846_5342 => ("xfs", false),
        0x9123_683E => ("btrfs", false),
        0x0102_1994 => ("tmpfs", false),
        0x8584_58F6 => ("ramfs", false),
        0x794C_7630 => ("overlay", false),
        0x2FC1_2FC1 => ("zfs", false),
        0xF2F5_2010 => ("f2fs", false),
        0x6969 => ("nfs", true),
        0x6573_5546 => ("fuse", true),
        0xFF53_4D42 => ("cifs", true),
        0xFE53_4D42 => ("smb2", true),
        0x0102_1997 => ("9p", true),
        0x00C3_6400 => ("ceph", true),
        0x0BD0_0BD0 => ("lustre", true),
        _ => ("", false),
    };
    let name = if name.is_empty() { format!("unknown(0x{magic:x})") } else { name.to_owned() };
    Filesystem { magic, name, remote }
}

/// Result of a `mincore` sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ResidencySample {
    /// Pages looked at.
    pub sampled_pages: u64,
    /// Of those, pages in the page cache.
    pub resident_pages: u64,
}

impl ResidencySample {
    /// Fraction of sampled pages in the page cache (0 when nothing was sampled).
    pub fn fraction(&self) -> f64 {
        if self.sampled_pages == 0 { 0.0 } else { self.resident_pages as f64 / self.sampled_pages as f64 }
    }
    /// Sum two samples.
    pub fn merge(self, other: ResidencySample) -> ResidencySample {
        ResidencySample {
            sampled_pages: self.sampled_pages + other.sampled_pages,
            resident_pages: self.resident_pages + other.resident_pages,
        }
    }
}

/// Sample page-cache residency of the first `len_bytes` of `file` with `mincore`, looking at
/// [`RESIDENCY_SAMPLE_WINDOWS_MAX`] evenly spaced windows of [`RESIDENCY_WINDOW_PAGES`] pages.
/// Maps the file (no page is touched), so the cost is independent of the file size.
pub fn residency_sample(file: &File, len_bytes: u64) -> io::Result<ResidencySample> {
    residency_sample_ranges(file, len_bytes, std::slice::from_ref(&(0..len_bytes)))
}

/// Like [`residency_sample`], but the windows are spread evenly over `ranges` (e.g. the selected
/// tensors of a file of `file_len_bytes`); parts of ranges past the end of the file are ignored.
pub fn residency_sample_ranges(
    file: &File,
    file_len_bytes: u64,
    ranges: &[Range<u64>],
) -> io::Result<ResidencySample> {
    let clamped: Vec<Range<u64>> = ranges
        .iter()
        .map(|r| r.start.min(file_len_bytes)..r.end.min(file_len_bytes))
        .filter(|r| r.start < r.end)
        .collect();
    let total_bytes: u64 = clamped.iter().map(|r| r.end - r.start).sum();
    if total_bytes == 0 {
        return Ok(ResidencySample::default());
    }
    let map_len = usize::try_from(file_len_bytes)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "file larger than address space"))?;
    // SAFETY: a read-only shared mapping of a descriptor we borrow; the mapping is never read
    // (mincore only queries page-table state), so a concurrent truncation cannot fault us.
    let addr = unsafe {
        libc::mmap(std::ptr::null_mut(), map_len, libc::PROT_READ, libc::MAP_SHARED, file.as_raw_fd(), 0)
    };
    if addr == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let pages_file = file_len_bytes.div_ceil(PAGE_BYTES);
    let windows =
        RESIDENCY_SAMPLE_WINDOWS_MAX.min(total_bytes.div_ceil(PAGE_BYTES * RESIDENCY_WINDOW_PAGES)).max(1);
    let mut vec = [0u8; RESIDENCY_WINDOW_PAGES as usize];
    let mut sample = ResidencySample::default();
    let mut result = Ok(());
    let mut last_page_end = 0u64;
    for w in 0..windows {
        // The byte `total * w / windows` of the concatenated ranges, located in its range.
        let mut target = (u128::from(total_bytes) * u128::from(w) / u128::from(windows)) as u64;
        let Some(range) = clamped.iter().find(|r| {
            let len = r.end - r.start;
            if target < len {
                true
            } else {
                target -= len;
                false
            }
        }) else {
            break;
        };
        let first_page = ((range.start + target) / PAGE_BYTES).max(last_page_end);
        let range_end_page = range.end.div_ceil(PAGE_BYTES).min(pages_file);
        if first_page >= range_end_page {
            continue;
        }
        let pages = RESIDENCY_WINDOW_PAGES.min(range_end_page - first_page);
        last_page_end = first_page + pages;
        // SAFETY: `first_page + pages <= pages_file`, so the queried range lies inside our mapping
        // (mincore accepts a final partial page); `vec` has room for `pages` entries.
        let rc = unsafe {
            libc::mincore(
                addr.cast::<u8>().add((first_page * PAGE_BYTES) as usize).cast(),
                (pages * PAGE_BYTES) as usize,
                vec.as_mut_ptr(),
            )
        };
        if rc != 0 {
            result = Err(io::Error::last_os_error());
            break;
        }
        sample.sampled_pages += pages;
        sample.resident_pages += vec[..pages as usize].iter().filter(|&&b| b & 1 == 1).count() as u64;
    }
    // SAFETY: unmapping exactly the mapping made above; nothing borrows it.
    unsafe { libc::munmap(addr, map_len) };
    result.map(|()| sample)
}

/// The running kernel's `(major, minor)` version, from `uname`; `None` if it cannot be read.
pub fn kernel_version() -> Option<(u32, u32)> {
    let mut uts = std::mem::MaybeUninit::<libc::utsname>::zeroed();
    // SAFETY: `uts` is a valid out-pointer of the right type.
    if unsafe { libc::uname(uts.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: uname succeeded, so it filled the (zeroed) struct; `release` is NUL-terminated.
    let release = unsafe { std::ffi::CStr::from_ptr(uts.assume_init_ref().release.as_ptr()) };
    parse_kernel_release(release.to_str().ok()?)
}

/// `(major, minor)` of a kernel release string such as `5.15.0-91-generic` or `6.18.44-fc`.
pub fn parse_kernel_release(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// Online CPUs available to this process.
pub fn cpu_count() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn residency_sees_written_pages_and_eviction_is_accepted() {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(&vec![3u8; 1 << 20]).unwrap();
        f.as_file().sync_all().unwrap();
        // Just written: every sampled page is cached. A global `drop_caches` by a benchmark running
        // beside the tests can empty the cache first, so read the file back a bounded number of times.
        const ATTEMPTS_MAX: usize = 5;
        let mut s = ResidencySample::default();
        for _ in 0..ATTEMPTS_MAX {
            std::fs::read(f.path()).unwrap();
            s = residency_sample(f.as_file(), 1 << 20).unwrap();
            if s.resident_pages == s.sampled_pages {
                break;
            }
        }
        assert!(
            s.sampled_pages > 0 && s.sampled_pages <= RESIDENCY_SAMPLE_WINDOWS_MAX * RESIDENCY_WINDOW_PAGES
        );
        assert_eq!(s.fraction(), 1.0, "{s:?}");
        crate::evict_file_cache(f.as_file()).unwrap();
        let after = residency_sample(f.as_file(), 1 << 20).unwrap();
        if filesystem(f.path()).unwrap().name == "tmpfs" {
            // tmpfs pages are the file itself: nothing to evict.
            assert_eq!(after, s);
        } else {
            assert_eq!(after.resident_pages, 0, "clean pages are dropped on POSIX_FADV_DONTNEED: {after:?}");
        }
    }

    #[test]
    fn range_samples_see_only_the_ranges() {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(&vec![3u8; 4 << 20]).unwrap();
        f.as_file().sync_all().unwrap();
        crate::evict_file_cache(f.as_file()).unwrap();
        // Read the first MiB back, then sample it: 16 windows of 16 pages cover it exactly. A
        // concurrent global `drop_caches` (benchmarks run as root) can empty the cache between the
        // read and the sample, so try a bounded number of times.
        const ATTEMPTS_MAX: usize = 5;
        let hot_range = std::slice::from_ref(&(0..(1 << 20)));
        let mut buf = vec![0u8; 1 << 20];
        let mut hot = ResidencySample::default();
        for _ in 0..ATTEMPTS_MAX {
            std::os::unix::fs::FileExt::read_exact_at(f.as_file(), &mut buf, 0).unwrap();
            hot = residency_sample_ranges(f.as_file(), 4 << 20, hot_range).unwrap();
            if hot.resident_pages == hot.sampled_pages {
                break;
            }
        }
        assert_eq!(hot.sampled_pages, 256);
        assert_eq!(hot.resident_pages, hot.sampled_pages, "just read: resident");
        // Ranges past EOF are clamped, empty ranges sample nothing.
        let none = residency_sample_ranges(f.as_file(), 4 << 20, &[(8 << 20)..(9 << 20), 5..5]).unwrap();
        assert_eq!(none, ResidencySample::default());
        let many: Vec<Range<u64>> = (0..100).map(|i| i * 40_000..i * 40_000 + 100).collect();
        let s = residency_sample_ranges(f.as_file(), 4 << 20, &many).unwrap();
        assert!(
            s.sampled_pages >= 1 && s.sampled_pages <= RESIDENCY_SAMPLE_WINDOWS_MAX * RESIDENCY_WINDOW_PAGES
        );
    }

    #[test]
    fn empty_file_samples_nothing() {
        let f = tempfile::NamedTempFile::new().unwrap();
        assert_eq!(residency_sample(f.as_file(), 0).unwrap(), ResidencySample::default());
    }

    #[test]
    fn classifies_known_and_unknown_filesystems() {
        assert_eq!(classify_filesystem(0xEF53).name, "ext4");
        assert!(classify_filesystem(0x6969).remote);
        assert!(classify_filesystem(0x6573_5546).remote);
        assert!(!classify_filesystem(0x0102_1994).remote);
        assert!(classify_filesystem(0x1234).name.starts_with("unknown("));
    }

    #[test]
    fn filesystem_of_a_temp_dir_and_missing_path() {
        let d = tempfile::tempdir().unwrap();
        assert!(filesystem(d.path()).is_ok());
        assert!(filesystem(&d.path().join("missing")).is_err());
        assert!(cpu_count() >= 1);
    }
}
