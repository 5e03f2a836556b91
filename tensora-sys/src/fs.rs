//! Reserving a file's blocks, whether a file lives in memory, making a descriptor blocking, and
//! the two namings std has no form of: linking an unnamed (`O_TMPFILE`) file in, and a rename
//! that never replaces.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd as _;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};

/// Allocate the first `len_bytes` of `file` (`fallocate`, mode 0: the file grows to at least
/// that length, the blocks are reserved and read as zeros). `Ok` without doing anything where
/// the file system cannot preallocate (`EOPNOTSUPP`, `ENOSYS`, `EINVAL`) or for 0 bytes: the
/// writes then allocate. `ENOSPC` and every other error are returned: a disk too full for the
/// file fails here, before anything is written.
///
/// On a file system that keeps files in memory ([`in_memory_filesystem`]) this zeroes the whole length in
/// memory up front (0.3 s per GiB on the 2-core reference VM): a caller that wants no early
/// `ENOSPC` there can only grow the file instead (`File::set_len`).
///
/// ```
/// let dir = tempfile::tempdir()?;
/// let file = std::fs::File::create(dir.path().join("data"))?;
/// tensora_sys::preallocate(&file, 1 << 20)?;
/// assert_eq!(file.metadata()?.len(), 1 << 20);
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn preallocate(file: &File, len_bytes: u64) -> io::Result<()> {
    if len_bytes == 0 {
        return Ok(());
    }
    let len = libc::off_t::try_from(len_bytes)
        .map_err(|_| std::io::Error::other(format!("{len_bytes} bytes is past the largest file offset")))?;
    // SAFETY: a plain syscall on a descriptor this function borrows; no memory is passed.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len) };
    if rc == 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EOPNOTSUPP | libc::ENOSYS | libc::EINVAL) => Ok(()),
        _ => Err(e),
    }
}

/// Whether `file` lies on a file system that keeps files in memory (tmpfs, ramfs).
///
/// ```
/// let file = tempfile::tempfile()?;
/// let _on_tmpfs: bool = tensora_sys::in_memory_filesystem(&file)?;
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn in_memory_filesystem(file: &File) -> io::Result<bool> {
    let mut st = std::mem::MaybeUninit::<libc::statfs>::zeroed();
    // SAFETY: a plain syscall on a descriptor this function borrows, filling `st`, a valid
    // out-pointer of the right type.
    if unsafe { libc::fstatfs(file.as_raw_fd(), st.as_mut_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fstatfs succeeded, so it filled the struct (zeroed before).
    let st = unsafe { st.assume_init() };
    #[allow(clippy::unnecessary_cast)] // f_type's width differs across targets.
    let magic = st.f_type as i64;
    Ok(matches!(crate::probe::classify_filesystem(magic).name.as_str(), "tmpfs" | "ramfs"))
}

/// `path` as the NUL-terminated string a syscall takes (`InvalidInput` for a path with a NUL).
pub(crate) fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
}

/// The `/proc/self/fd/N` name of an open file: a path that opens (or links) that very file,
/// named or not.
pub fn fd_path(file: &File) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()))
}

/// Clear `O_NONBLOCK` on `file`'s open file description (nothing to do where it is not set).
/// For a descriptor opened non-blocking only to find out what it names (a FIFO would block a
/// plain `open`; `tensora_format::open_regular` does so where `/proc` is absent) and since found
/// to be a regular file: `read` and `pread` ignore the flag there, but io_uring honours it and
/// answers `EAGAIN` for a page not yet cached instead of waiting for the device.
pub fn clear_nonblocking(file: &File) -> io::Result<()> {
    let fd = file.as_raw_fd();
    // SAFETY: F_GETFL only reads the flags of a descriptor `file` keeps open for the call.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    if flags & libc::O_NONBLOCK == 0 {
        return Ok(());
    }
    // SAFETY: F_SETFL changes only the status flags of the same open descriptor; no memory of
    // this process is involved.
    let rc = unsafe { libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK) };
    if rc == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

/// Give the unnamed (`O_TMPFILE`) file `file` the name `dst` (`linkat` of its [`fd_path`] with
/// `AT_SYMLINK_FOLLOW`); fails with `AlreadyExists` when `dst` is taken, never replacing it.
pub fn link_unnamed(file: &File, dst: &Path) -> io::Result<()> {
    let (from, to) = (c_path(&fd_path(file))?, c_path(dst)?);
    // SAFETY: both pointers come from live NUL-terminated CStrings owned by this frame; AT_FDCWD
    // resolves them as `open` would; AT_SYMLINK_FOLLOW makes the /proc link name the open file.
    let rc = unsafe {
        libc::linkat(libc::AT_FDCWD, from.as_ptr(), libc::AT_FDCWD, to.as_ptr(), libc::AT_SYMLINK_FOLLOW)
    };
    if rc == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

/// `rename(2)` that fails with `AlreadyExists` instead of replacing an existing (empty) directory
/// or file (`renameat2` with `RENAME_NOREPLACE`). Where the filesystem lacks the flag (`EINVAL`,
/// `ENOSYS`) it checks, then renames: a narrow race between the two, which the caller accepts.
pub fn rename_noreplace(from: &Path, to: &Path) -> io::Result<()> {
    let (from_c, to_c) = (c_path(from)?, c_path(to)?);
    // SAFETY: both pointers come from live, NUL-terminated CStrings owned by this frame; AT_FDCWD
    // makes the paths relative to the current directory exactly as std::fs::rename does.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            from_c.as_ptr(),
            libc::AT_FDCWD,
            to_c.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if rc == 0 {
        return Ok(());
    }
    let err = io::Error::last_os_error();
    match err.raw_os_error() {
        Some(libc::EINVAL | libc::ENOSYS) => {
            if std::fs::symlink_metadata(to).is_ok() {
                return Err(io::Error::new(io::ErrorKind::AlreadyExists, "destination exists"));
            }
            std::fs::rename(from, to)
        }
        _ => Err(err),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preallocated_blocks_are_allocated_and_read_as_zeros() {
        let dir = tempfile::tempdir().unwrap();
        let file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.path().join("f"))
            .unwrap();
        preallocate(&file, 3 << 20).unwrap();
        let meta = file.metadata().unwrap();
        assert_eq!(meta.len(), 3 << 20);
        use std::os::unix::fs::MetadataExt as _;
        // Where the file system preallocates (ext4, xfs, tmpfs), every block is allocated.
        assert!(meta.blocks() * 512 >= 3 << 20 || meta.blocks() == 0, "blocks {}", meta.blocks());
        let mut back = vec![1u8; 4096];
        std::os::unix::fs::FileExt::read_exact_at(&file, &mut back, (3 << 20) - 4096).unwrap();
        assert!(back.iter().all(|&b| b == 0));
    }

    /// `/dev/shm` is tmpfs on Linux and the temporary directory usually a disk: the check agrees
    /// with `statfs`'s name for each, and preallocating on tmpfs commits the pages.
    #[test]
    fn in_memory_is_tmpfs_and_preallocating_there_commits_pages() {
        let dir = tempfile::tempdir().unwrap();
        for place in [std::path::Path::new("/dev/shm"), dir.path()] {
            let Ok(file) = tempfile::tempfile_in(place) else {
                assert!(!place.is_dir(), "{} exists but takes no file", place.display());
                continue;
            };
            let name = crate::probe::filesystem(place).unwrap().name;
            assert_eq!(
                in_memory_filesystem(&file).unwrap(),
                matches!(name.as_str(), "tmpfs" | "ramfs"),
                "{name}"
            );
            if name == "tmpfs" {
                preallocate(&file, 4 << 20).unwrap();
                use std::os::unix::fs::MetadataExt as _;
                assert_eq!(file.metadata().unwrap().blocks() * 512, 4 << 20, "committed up front");
            }
        }
    }

    #[test]
    fn a_rename_never_replaces_and_an_unnamed_file_is_linked_once() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::create_dir(&a).unwrap();
        std::fs::create_dir(&b).unwrap();
        assert_eq!(rename_noreplace(&a, &b).unwrap_err().kind(), io::ErrorKind::AlreadyExists);
        assert!(a.is_dir(), "the source stays where it was");
        std::fs::remove_dir(&b).unwrap();
        rename_noreplace(&a, &b).unwrap();
        assert!(b.is_dir() && !a.exists());

        use std::io::Write as _;
        use std::os::unix::fs::OpenOptionsExt as _;
        let Ok(mut unnamed) =
            File::options().read(true).write(true).custom_flags(libc::O_TMPFILE).mode(0o600).open(dir.path())
        else {
            return; // a filesystem without O_TMPFILE: the writer names its files instead.
        };
        unnamed.write_all(b"data").unwrap();
        let named = dir.path().join("named");
        link_unnamed(&unnamed, &named).unwrap();
        assert_eq!(std::fs::read(&named).unwrap(), b"data");
        assert_eq!(link_unnamed(&unnamed, &named).unwrap_err().kind(), io::ErrorKind::AlreadyExists);
        assert_eq!(c_path(Path::new("a\0b")).unwrap_err().kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn a_nonblocking_descriptor_is_made_blocking_and_a_blocking_one_left_alone() {
        use std::os::unix::fs::OpenOptionsExt as _;
        let file = tempfile::NamedTempFile::new().unwrap();
        let nonblocking = |f: &File| {
            // SAFETY: F_GETFL only reads the flags of a descriptor `f` keeps open.
            let flags = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_GETFL) };
            assert!(flags >= 0);
            flags & libc::O_NONBLOCK != 0
        };
        let opened =
            std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(file.path()).unwrap();
        assert!(nonblocking(&opened));
        clear_nonblocking(&opened).unwrap();
        assert!(!nonblocking(&opened));
        clear_nonblocking(&opened).unwrap();
        assert!(!nonblocking(&opened));
    }

    #[test]
    fn nothing_to_allocate_is_ok_and_a_read_only_descriptor_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        preallocate(&File::create(&path).unwrap(), 0).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 0);
        let read_only = File::open(&path).unwrap();
        assert_eq!(preallocate(&read_only, 4096).unwrap_err().raw_os_error(), Some(libc::EBADF));
    }
}
