//! The temporary output directory beside the destination: fsynced and moved into place with
//! `RENAME_NOREPLACE`, removed on drop unless committed.

use std::ffi::OsString;
use std::fs::{self, File};
use std::io::{self};
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
        match tensora_sys::rename_noreplace(&self.path, dst) {
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
