//! File-system calls the other crates need without `unsafe` of their own.

use std::fs::File;
use std::os::fd::AsRawFd as _;

/// Allocate the first `len_bytes` of `file` (`fallocate`, mode 0: the file grows to at least
/// that length, the blocks are reserved and read as zeros). `Ok` without doing anything where
/// the file system cannot preallocate (`EOPNOTSUPP`, `ENOSYS`, `EINVAL`) or for 0 bytes: the
/// writes then allocate. `ENOSPC` and every other error are returned: a disk too full for the
/// file fails here, before anything is written.
///
/// ```
/// let dir = tempfile::tempdir()?;
/// let file = std::fs::File::create(dir.path().join("data"))?;
/// tensora_io::fs::preallocate(&file, 1 << 20)?;
/// assert_eq!(file.metadata()?.len(), 1 << 20);
/// # Ok::<(), std::io::Error>(())
/// ```
#[allow(unsafe_code)]
pub fn preallocate(file: &File, len_bytes: u64) -> std::io::Result<()> {
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
