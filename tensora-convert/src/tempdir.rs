//! The temporary output directory beside the destination: fsynced and moved into place with
//! `RENAME_NOREPLACE`, removed on drop unless committed.

use std::ffi::{CString, OsString};
use std::fs::{self, File};
use std::io::{self};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::{ConvertError, io_err};

/// How many temporary names are tried before giving up.
pub(crate) const TEMP_NAME_ATTEMPTS_MAX: u32 = 64;

pub(crate) static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A directory beside the destination that is removed on drop unless committed.
#[derive(Debug)]
pub(crate) struct TempDir {
    path: PathBuf,
    committed: bool,
}

pub(crate) fn parent_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// A fresh temporary name beside `dst`: `.NAME.tmp-PID-N` (hidden, and naming the process that
/// made it).
pub(crate) fn temp_name(dst: &Path) -> Result<PathBuf, ConvertError> {
    let name = dst.file_name().ok_or_else(|| ConvertError::Config {
        reason: format!("destination {} has no file name", dst.display()),
    })?;
    let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut temp_name = OsString::from(".");
    temp_name.push(name);
    temp_name.push(format!(".tmp-{}-{n}", std::process::id()));
    Ok(parent_of(dst).join(temp_name))
}

impl TempDir {
    pub(crate) fn create_beside(dst: &Path) -> Result<TempDir, ConvertError> {
        for _ in 0..TEMP_NAME_ATTEMPTS_MAX {
            let path = temp_name(dst)?;
            match fs::create_dir(&path) {
                Ok(()) => return Ok(TempDir { path, committed: false }),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => {
                    return Err(crate::save::output::write_err(&path, "creating temporary directory", e));
                }
            }
        }
        Err(ConvertError::Io {
            path: parent_of(dst).to_path_buf(),
            op: "creating temporary directory",
            source: io::Error::new(io::ErrorKind::AlreadyExists, "no free temporary name"),
        })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// fsync the directory, rename it to `dst` (refusing to replace anything), fsync the parent.
    pub(crate) fn commit(mut self, dst: &Path) -> Result<(), ConvertError> {
        File::open(&self.path).and_then(|d| d.sync_all()).map_err(io_err(&self.path, "fsync of output"))?;
        match rename_noreplace(&self.path, dst) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                return Err(ConvertError::DestinationExists { path: dst.to_path_buf() });
            }
            Err(e) => return Err(io_err(dst, "renaming output into place")(e)),
        }
        self.committed = true;
        let parent = parent_of(dst);
        File::open(parent).and_then(|d| d.sync_all()).map_err(io_err(parent, "fsync of parent directory"))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if !self.committed {
            let _ = fs::remove_dir_all(&self.path);
        }
    }
}

/// `rename(2)` that fails with `AlreadyExists` instead of replacing an existing (empty) directory.
#[allow(unsafe_code)]
pub(crate) fn rename_noreplace(from: &Path, to: &Path) -> io::Result<()> {
    let c = |p: &Path| {
        CString::new(p.as_os_str().as_bytes()).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
    };
    let (from_c, to_c) = (c(from)?, c(to)?);
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
        // Filesystems without RENAME_NOREPLACE: check, then rename (a narrow race, documented).
        Some(libc::EINVAL) | Some(libc::ENOSYS) => {
            if fs::symlink_metadata(to).is_ok() {
                return Err(io::Error::new(io::ErrorKind::AlreadyExists, "destination exists"));
            }
            fs::rename(from, to)
        }
        _ => Err(err),
    }
}
