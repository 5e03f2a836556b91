//! One output file of a save, written under no name or a temporary one and given its final name
//! only when complete and synced.
//!
//! Beside the destination, the file is created with `O_TMPFILE` where the filesystem has it: it
//! has no name while it is written, so a process killed at any point (`kill -9` included) leaves
//! nothing behind, and the kernel frees it. Committing links it into the directory
//! (`linkat` through `/proc/self/fd`): straight under the final name when that is free (refusing
//! to replace, for conversions), or under a temporary name then `rename`d over the old file (a
//! save replaces). Without `O_TMPFILE` (or `/proc`) a named temporary file `.NAME.tmp-PID-N` is
//! used, removed on drop. Inside a temporary directory (a sharded or ServerlessLLM output built
//! beside its destination) files are created under their final names, the directory being the
//! unit that is renamed.
//!
//! The space is reserved up front (`fallocate`), so a full disk is a typed
//! [`ConvertError::NoSpace`] before any data is written, and the temporary file goes with the
//! error; an `ENOSPC` during the writes is the same error.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use super::Durability;
use crate::tempdir::{TEMP_NAME_ATTEMPTS_MAX, parent_of, temp_name};
use crate::{ConvertError, io_err};

/// Where an output's final name comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Placement {
    /// Inside a temporary directory: created under its final name; the directory is committed.
    InTempDir,
    /// Replace whatever the path holds (a save).
    Replace,
    /// Refuse if the path exists (a conversion never overwrites).
    NoReplace,
}

/// Whether the space of an output is reserved before it is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Preallocate {
    /// `fallocate` the whole file first (ignored where the filesystem cannot): a full disk fails
    /// at once, before any write, and the file's blocks are allocated in one piece.
    #[default]
    Yes,
    /// Let the writes allocate (a full disk then fails part-way; the file is removed the same).
    No,
}

#[derive(Debug)]
enum Temp {
    /// `O_TMPFILE`: no name until committed.
    Unnamed,
    /// A named temporary file beside the destination, removed unless committed.
    Named(PathBuf),
    /// Created under its final name inside a temporary directory.
    InPlace,
}

/// One file being written.
#[derive(Debug)]
pub(crate) struct Output {
    pub(crate) final_path: PathBuf,
    pub(crate) len_bytes: u64,
    /// The descriptor buffered writes, `fsync` and the commit use.
    pub(crate) file: File,
    /// The same file opened with `O_DIRECT`, in direct mode when the filesystem allows it.
    pub(crate) direct: Option<File>,
    /// Set when a direct write was refused (`EINVAL`): the rest of the file is written buffered.
    pub(crate) direct_refused: AtomicBool,
    temp: Temp,
    placement: Placement,
    committed: bool,
}

/// `e` as our error: a full disk or quota is [`ConvertError::NoSpace`], anything else
/// [`ConvertError::Io`].
pub(crate) fn write_err(path: &Path, op: &'static str, e: io::Error) -> ConvertError {
    match e.raw_os_error() {
        Some(libc::ENOSPC | libc::EDQUOT) => {
            ConvertError::NoSpace { path: path.to_path_buf(), op, source: e }
        }
        _ => ConvertError::Io { path: path.to_path_buf(), op, source: e },
    }
}

impl Output {
    /// Create the file that will become `final_path`, `len_bytes` long, with an `O_DIRECT`
    /// descriptor when `direct` asks for one. Returns the output and, when direct was asked for
    /// and refused, why.
    pub(crate) fn create(
        final_path: &Path,
        len_bytes: u64,
        placement: Placement,
        direct: bool,
        preallocate: Preallocate,
    ) -> Result<(Output, Option<String>), ConvertError> {
        let (file, temp) = match placement {
            Placement::InTempDir => {
                let file = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create_new(true)
                    .open(final_path)
                    .map_err(|e| write_err(final_path, "creating output", e))?;
                (file, Temp::InPlace)
            }
            Placement::Replace | Placement::NoReplace => create_beside(final_path)?,
        };
        if placement == Placement::Replace
            && let Ok(meta) = fs::metadata(final_path)
            && meta.is_file()
        {
            // The new file keeps the permissions of the one it replaces, as a rewrite in place would.
            file.set_permissions(meta.permissions())
                .map_err(|e| write_err(final_path, "copying permissions", e))?;
        }
        let mut out = Output {
            final_path: final_path.to_path_buf(),
            len_bytes,
            file,
            direct: None,
            direct_refused: AtomicBool::new(false),
            temp,
            placement,
            committed: false,
        };
        if preallocate == Preallocate::Yes && len_bytes > 0 {
            out.preallocate()?;
        }
        let mut refused = None;
        if direct {
            match OpenOptions::new().write(true).custom_flags(libc::O_DIRECT).open(out.reopen_path()) {
                Ok(f) => out.direct = Some(f),
                Err(e) => refused = Some(format!("O_DIRECT open refused: {e}")),
            }
        }
        Ok((out, refused))
    }

    /// A path that opens this very file again: the temporary name, or the descriptor in `/proc`.
    fn reopen_path(&self) -> PathBuf {
        match &self.temp {
            Temp::Named(p) => p.clone(),
            Temp::InPlace => self.final_path.clone(),
            Temp::Unnamed => tensora_sys::fd_path(&self.file),
        }
    }

    /// The name the file has now (for errors).
    pub(crate) fn path_now(&self) -> &Path {
        match &self.temp {
            Temp::Named(p) => p,
            Temp::InPlace | Temp::Unnamed => &self.final_path,
        }
    }

    fn preallocate(&self) -> Result<(), ConvertError> {
        tensora_sys::preallocate(&self.file, self.len_bytes)
            .map_err(|e| write_err(self.path_now(), "reserving space", e))
    }

    /// Cut the file to its length (direct writes round the last piece up) and, with
    /// [`Durability::Synced`], make it durable.
    pub(crate) fn finish(&self, durability: Durability) -> Result<(), ConvertError> {
        if self.direct.is_some() {
            self.file
                .set_len(self.len_bytes)
                .map_err(|e| write_err(self.path_now(), "setting the length", e))?;
        }
        match durability {
            Durability::Synced => self.file.sync_all().map_err(|e| write_err(self.path_now(), "fsync", e)),
            Durability::ProcessCrashSafe => Ok(()),
        }
    }

    /// Give the file its final name (see the module docs). The directory is synced by the caller.
    pub(crate) fn commit(&mut self) -> Result<(), ConvertError> {
        let dst = self.final_path.clone();
        match (&self.temp, self.placement) {
            (Temp::InPlace, _) => {}
            (Temp::Unnamed, placement) => match tensora_sys::link_unnamed(&self.file, &dst) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists && placement == Placement::NoReplace => {
                    return Err(ConvertError::DestinationExists { path: dst });
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    let temp = link_under_temp_name(&self.file, &dst)?;
                    self.temp = Temp::Named(temp.clone());
                    fs::rename(&temp, &dst).map_err(|e| write_err(&dst, "renaming output into place", e))?;
                }
                Err(e) => return Err(write_err(&dst, "linking output into place", e)),
            },
            (Temp::Named(temp), Placement::NoReplace) => match tensora_sys::rename_noreplace(temp, &dst) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    return Err(ConvertError::DestinationExists { path: dst });
                }
                Err(e) => return Err(write_err(&dst, "renaming output into place", e)),
            },
            (Temp::Named(temp), _) => {
                fs::rename(temp, &dst).map_err(|e| write_err(&dst, "renaming output into place", e))?;
            }
        }
        self.committed = true;
        Ok(())
    }
}

impl Drop for Output {
    fn drop(&mut self) {
        if let (Temp::Named(p), false) = (&self.temp, self.committed) {
            let _ = fs::remove_file(p);
        }
    }
}

/// `O_TMPFILE` in the destination's directory, or a named temporary file there.
fn create_beside(dst: &Path) -> Result<(File, Temp), ConvertError> {
    let dir = parent_of(dst);
    if Path::new("/proc/self/fd").is_dir() {
        let unnamed =
            OpenOptions::new().read(true).write(true).mode(0o666).custom_flags(libc::O_TMPFILE).open(dir);
        match unnamed {
            Ok(file) => return Ok((file, Temp::Unnamed)),
            Err(e) if matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::EISDIR | libc::EINVAL)) => {}
            Err(e) => return Err(write_err(dir, "creating a temporary file", e)),
        }
    }
    for _ in 0..TEMP_NAME_ATTEMPTS_MAX {
        let path = temp_name(dst)?;
        match OpenOptions::new().read(true).write(true).create_new(true).open(&path) {
            Ok(file) => return Ok((file, Temp::Named(path))),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(write_err(&path, "creating a temporary file", e)),
        }
    }
    Err(io_err(dir, "creating a temporary file")(io::Error::new(
        io::ErrorKind::AlreadyExists,
        "no free temporary name",
    )))
}

/// Link the unnamed file under a free temporary name beside `dst`; returns that name.
fn link_under_temp_name(file: &File, dst: &Path) -> Result<PathBuf, ConvertError> {
    for _ in 0..TEMP_NAME_ATTEMPTS_MAX {
        let temp = temp_name(dst)?;
        match tensora_sys::link_unnamed(file, &temp) {
            Ok(()) => return Ok(temp),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(write_err(&temp, "linking output", e)),
        }
    }
    Err(io_err(dst, "linking output")(io::Error::new(io::ErrorKind::AlreadyExists, "no free temporary name")))
}

/// `fsync` each distinct directory once: makes the renames and links durable.
pub(crate) fn sync_dirs<'p>(dirs: impl IntoIterator<Item = &'p Path>) -> Result<(), ConvertError> {
    let mut seen: Vec<&Path> = Vec::new();
    for d in dirs {
        if seen.contains(&d) {
            continue;
        }
        seen.push(d);
        File::open(d).and_then(|f| f.sync_all()).map_err(|e| write_err(d, "fsync of directory", e))?;
    }
    Ok(())
}

/// Whether a direct write's error means the filesystem refuses this `O_DIRECT` write (so the
/// file goes on buffered), as opposed to a real I/O error.
pub(crate) fn direct_refused(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::EINVAL)
}

impl Output {
    /// Record that direct writes are refused for this file.
    pub(crate) fn refuse_direct(&self) -> bool {
        !self.direct_refused.swap(true, Ordering::AcqRel)
    }

    /// The descriptor for direct writes, unless there is none or it was refused.
    pub(crate) fn direct_file(&self) -> Option<&File> {
        self.direct.as_ref().filter(|_| !self.direct_refused.load(Ordering::Acquire))
    }
}
