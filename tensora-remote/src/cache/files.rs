//! How the cache opens and creates what it keeps: directories `0700`, files `0600`, every file
//! opened with `O_NOFOLLOW` (a symlink planted in place of a cache file is refused, never
//! followed) and checked to be a regular file before anything is read or written (a FIFO opens
//! at once under `O_NONBLOCK` and is then refused: never a hang). A cache directory owned by
//! another user, or one that others may write to, is refused with an error that says which.
//!
//! Why not `tensora_format::open_regular`, the readers' one regular-file open: it opens for
//! reading only, and it follows a symlink in the last component (a checkpoint path may well be
//! one). The cache needs read-write, `O_DIRECT` and creating opens that never follow one.

use std::fs::File;
use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// Permission bits of the cache's directories.
pub const DIR_MODE: u32 = 0o700;
/// Permission bits of the cache's files.
pub const FILE_MODE: u32 = 0o600;

/// How a cache file is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Open {
    /// Read an existing file.
    Read,
    /// Read and write an existing file.
    ReadWrite,
    /// Read and write an existing file with `O_DIRECT`.
    Direct,
    /// Read and write, created (`0600`) if missing.
    Create,
}

/// `what` (a path) refused, with why.
fn refused(path: &Path, why: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{}: {why}", path.display()))
}

/// Open the cache file at `path` as `how` says: never following a symlink in its last
/// component, never blocking on a FIFO, and only if it is a regular file.
pub fn open(path: &Path, how: Open) -> std::io::Result<File> {
    let mut options = File::options();
    options.read(true).mode(FILE_MODE);
    let mut flags = libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC;
    match how {
        Open::Read => {}
        Open::ReadWrite => {
            options.write(true);
        }
        Open::Direct => {
            options.write(true);
            flags |= libc::O_DIRECT;
        }
        Open::Create => {
            options.write(true).create(true);
        }
    }
    let file = options.custom_flags(flags).open(path).map_err(|e| {
        if e.raw_os_error() == Some(libc::ELOOP) {
            refused(path, "a symlink where the cache keeps a file (not followed)")
        } else {
            e
        }
    })?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(refused(path, "not a regular file where the cache keeps one"));
    }
    Ok(file)
}

/// Read the whole cache file at `path` ([`open`]), refusing one longer than `len_max_bytes`.
pub fn read_capped(path: &Path, len_max_bytes: u64) -> std::io::Result<Vec<u8>> {
    let file = open(path, Open::Read)?;
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut std::io::Read::take(file, len_max_bytes + 1), &mut bytes)?;
    if bytes.len() as u64 > len_max_bytes {
        return Err(refused(path, "larger than any the cache writes"));
    }
    Ok(bytes)
}

/// Temporary names given by this process, so that two threads never share one.
static TEMPORARIES: AtomicU64 = AtomicU64::new(0);

/// Whether [`replace`] makes the new file durable before it is named.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durable {
    /// `fsync` the file before the rename.
    Synced,
    /// Leave it to the page cache.
    Buffered,
}

/// Write `bytes` as the file `path` atomically: into a new file (`O_EXCL`, so never through a
/// planted symlink) beside it, then one rename over it.
pub fn replace(path: &Path, bytes: &[u8], durable: Durable) -> std::io::Result<()> {
    let n = TEMPORARIES.fetch_add(1, Ordering::Relaxed);
    let tmp = path.with_extension(format!("tmp.{}.{n}", std::process::id()));
    let mut file = File::options()
        .write(true)
        .create_new(true)
        .mode(FILE_MODE)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)?;
    let written = file.write_all(bytes).and_then(|()| match durable {
        Durable::Synced => file.sync_all(),
        Durable::Buffered => Ok(()),
    });
    if let Err(e) = written.and_then(|()| std::fs::rename(&tmp, path)) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(())
}

/// The effective user of this process.
#[allow(unsafe_code)]
fn effective_uid() -> u32 {
    // SAFETY: `geteuid` takes no arguments, touches no memory of ours and cannot fail.
    unsafe { libc::geteuid() }
}

/// Check that `dir` is a directory (not a symlink to one when `symlink` says so) that this
/// user owns and nobody else may write to.
fn check_dir(dir: &Path, symlink: Symlink) -> std::io::Result<()> {
    let meta = match symlink {
        Symlink::Refused => std::fs::symlink_metadata(dir)?,
        Symlink::Followed => std::fs::metadata(dir)?,
    };
    if meta.file_type().is_symlink() {
        return Err(refused(dir, "a symlink where the cache keeps a directory (not followed)"));
    }
    if !meta.is_dir() {
        return Err(refused(dir, "not a directory"));
    }
    if meta.uid() != effective_uid() {
        return Err(refused(
            dir,
            &format!(
                "owned by user {}, not by this user ({}): refused as a cache",
                meta.uid(),
                effective_uid()
            ),
        ));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(refused(
            dir,
            &format!("writable by other users (mode {:o}): refused as a cache", meta.mode() & 0o7777),
        ));
    }
    Ok(())
}

/// Whether a directory's last component may be a symlink.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Symlink {
    /// The cache's own folders: a symlink there was planted.
    Refused,
    /// The cache directory the user named.
    Followed,
}

/// Create `dir` (and missing parents) `0700` if missing, then check it ([`check_dir`]); one of
/// the cache's own folders is also made `0700` if an older version left it readable by others.
pub fn private_dir(dir: &Path, symlink: Symlink) -> std::io::Result<()> {
    match std::fs::DirBuilder::new().recursive(true).mode(DIR_MODE).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    check_dir(dir, symlink)?;
    if symlink == Symlink::Refused {
        let mode = std::fs::symlink_metadata(dir)?.mode() & 0o7777;
        if mode != DIR_MODE {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(DIR_MODE))?;
        }
    }
    Ok(())
}

/// Remove the directory `dir` and all it holds, if it is there (a symlink or file planted in
/// its place is removed itself, never what a symlink points to).
pub fn remove_dir(dir: &Path) -> std::io::Result<()> {
    match std::fs::symlink_metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
        Ok(meta) if meta.is_dir() => std::fs::remove_dir_all(dir),
        Ok(_) => std::fs::remove_file(dir),
    }
}

/// Whether `dir` is a real directory (not a symlink to one): what an entry's folder must be.
pub fn is_real_dir(dir: &Path) -> bool {
    std::fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Finding 3 (issue 39): a FIFO or a symlink in place of a cache file is refused at once,
    /// never followed or waited on; files are created 0600.
    #[test]
    fn finding_3_a_fifo_or_symlink_in_place_of_a_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        let fifo = dir.path().join("fifo");
        let status = std::process::Command::new("mkfifo").arg(&fifo).status().unwrap();
        assert!(status.success());
        for how in [Open::Read, Open::ReadWrite, Open::Direct, Open::Create] {
            let err = open(&link, how).unwrap_err();
            assert!(err.to_string().contains("symlink"), "{err}");
            let err = open(&fifo, how).unwrap_err();
            // A FIFO refuses `O_DIRECT` itself (EINVAL), before the check.
            assert!(how == Open::Direct || err.to_string().contains("not a regular file"), "{err}");
        }
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        let made = dir.path().join("made");
        drop(open(&made, Open::Create).unwrap());
        assert_eq!(std::fs::metadata(&made).unwrap().mode() & 0o777, FILE_MODE);
        // Replacing never writes through a symlink planted at a temporary name either.
        replace(&link, b"new", Durable::Buffered).unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        assert_eq!(std::fs::read(&link).unwrap(), b"new");
    }

    /// Finding 3 (issue 39): the cache's folders are 0700; a directory others may write to is
    /// refused with why; a symlinked folder of the cache is refused.
    #[test]
    fn finding_3_folders_are_private_and_open_ones_refused() {
        let dir = tempfile::tempdir().unwrap();
        let own = dir.path().join("cache").join("objects");
        private_dir(&own, Symlink::Refused).unwrap();
        assert_eq!(std::fs::metadata(&own).unwrap().mode() & 0o777, DIR_MODE);
        std::fs::set_permissions(&own, std::fs::Permissions::from_mode(0o755)).unwrap();
        private_dir(&own, Symlink::Refused).unwrap();
        assert_eq!(std::fs::metadata(&own).unwrap().mode() & 0o777, DIR_MODE, "tightened");
        let open_to_all = dir.path().join("open");
        std::fs::create_dir(&open_to_all).unwrap();
        std::fs::set_permissions(&open_to_all, std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = private_dir(&open_to_all, Symlink::Followed).unwrap_err();
        assert!(err.to_string().contains("writable by other users"), "{err}");
        let link = dir.path().join("linked");
        std::os::unix::fs::symlink(&own, &link).unwrap();
        let err = private_dir(&link, Symlink::Refused).unwrap_err();
        assert!(err.to_string().contains("symlink"), "{err}");
        private_dir(&link, Symlink::Followed).unwrap();
        // Another user's directory is refused, saying whose it is.
        let theirs = dir.path().join("theirs");
        std::fs::create_dir(&theirs).unwrap();
        if std::os::unix::fs::chown(&theirs, Some(effective_uid() + 4242), None).is_ok() {
            let err = private_dir(&theirs, Symlink::Followed).unwrap_err();
            assert!(err.to_string().contains("owned by user"), "{err}");
        }
    }
}
