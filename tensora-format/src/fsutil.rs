//! The one regular-file open of the workspace's readers: every file opened by path to read a
//! header, an index, a manifest or a partition's stamp goes through [`open_regular`] (and
//! [`read_capped`] on top of it for whole small files).
//!
//! A FIFO would block the open until a writer appears, a terminal would block the first read, and
//! `/dev/zero` would stream until a cap is reached; a directory is simply not a checkpoint file.
//! Each is refused with [`ErrorKind::NotRegularFile`] naming the path, before anything is read.
//!
//! The path is resolved exactly once, race-free: on Linux it is opened with `O_PATH` (which never
//! blocks, needs no read permission and never runs a device driver's open), that descriptor is
//! checked with `fstat`, and only a regular file is then opened for reading through
//! `/proc/self/fd/N`, which names the very inode already checked (a path swapped in between is not
//! looked at again). Without `/proc`, and on other Unix systems, the path is opened with
//! `O_NONBLOCK | O_NOCTTY` (a FIFO or terminal opens at once and acquires nothing), checked with
//! `fstat`, and refused unless regular (and, after an `O_PATH` check, the same inode); the handle
//! then keeps `O_NONBLOCK`, which `read` and `pread` of a regular file ignore (io_uring does not:
//! tensora-io clears it with `tensora_sys::clear_nonblocking`).

use std::fs::{File, Metadata};
use std::io::Read;
use std::path::Path;

use crate::{Error, ErrorKind, Result};

/// What a path refused by [`open_regular`] turned out to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NonRegular {
    /// A directory.
    Directory,
    /// A named pipe (its open would block until a writer appears).
    Fifo,
    /// A character device: a terminal, `/dev/zero`, `/dev/null`, …
    CharDevice,
    /// A block device.
    BlockDevice,
    /// A Unix-domain socket.
    Socket,
    /// Anything else that is not a regular file.
    Other,
}

impl NonRegular {
    /// Classify a file type that is not a regular file.
    fn of(file_type: std::fs::FileType) -> NonRegular {
        #[cfg(unix)]
        {
            use std::os::unix::fs::FileTypeExt;
            if file_type.is_fifo() {
                return NonRegular::Fifo;
            }
            if file_type.is_char_device() {
                return NonRegular::CharDevice;
            }
            if file_type.is_block_device() {
                return NonRegular::BlockDevice;
            }
            if file_type.is_socket() {
                return NonRegular::Socket;
            }
        }
        if file_type.is_dir() { NonRegular::Directory } else { NonRegular::Other }
    }
}

impl std::fmt::Display for NonRegular {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            NonRegular::Directory => "a directory",
            NonRegular::Fifo => "a FIFO",
            NonRegular::CharDevice => "a character device",
            NonRegular::BlockDevice => "a block device",
            NonRegular::Socket => "a socket",
            NonRegular::Other => "not a file",
        })
    }
}

/// Open `path` for reading only if it is a regular file, resolving the path once (see the module
/// docs): never blocks on a FIFO or terminal, never reads from a device. Returns the handle and its
/// `fstat` metadata; anything but a regular file is [`ErrorKind::NotRegularFile`] naming `path`.
///
/// ```
/// let dir = tempfile::tempdir().unwrap();
/// let err = tensora_format::open_regular(dir.path()).unwrap_err();
/// assert!(matches!(
///     err.kind(),
///     tensora_format::ErrorKind::NotRegularFile { found: tensora_format::NonRegular::Directory }
/// ));
/// ```
pub fn open_regular(path: &Path) -> Result<(File, Metadata)> {
    open_with(path, Reopen::Auto)
}

/// How the checked path is opened for reading (a parameter so tests can run the fallback).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reopen {
    /// `O_PATH` + `/proc/self/fd`, falling back to [`Reopen::NonBlocking`] without `/proc`.
    Auto,
    /// `O_NONBLOCK | O_NOCTTY` + `fstat` (after an `O_PATH` check where there is one).
    #[cfg_attr(not(test), allow(dead_code, reason = "only tests force the fallback"))]
    NonBlocking,
}

fn open_with(path: &Path, how: Reopen) -> Result<(File, Metadata)> {
    #[cfg(target_os = "linux")]
    {
        let checked = linux::Checked::open(path)?;
        checked.open_for_reading(path, how)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = how;
        let io = |e| Error::new(path, ErrorKind::Io(e));
        let file = nonblocking(path).map_err(io)?;
        let meta = file.metadata().map_err(io)?;
        if !meta.is_file() {
            return Err(not_regular(path, &meta));
        }
        Ok((file, meta))
    }
}

fn not_regular(path: &Path, meta: &Metadata) -> Error {
    Error::new(path, ErrorKind::NotRegularFile { found: NonRegular::of(meta.file_type()) })
}

/// Open for reading without blocking on a FIFO and without acquiring a terminal.
fn nonblocking(path: &Path) -> std::io::Result<File> {
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY);
    }
    options.open(path)
}

#[cfg(target_os = "linux")]
mod linux {
    use std::fs::{File, Metadata};
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    use std::path::Path;

    use super::{Reopen, nonblocking, not_regular};
    use crate::{Error, ErrorKind, Result};

    /// A path resolved once into an `O_PATH` descriptor whose `fstat` says: a regular file.
    #[derive(Debug)]
    pub(super) struct Checked {
        handle: File,
        meta: Metadata,
    }

    impl Checked {
        /// Resolve `path` with `O_PATH` (never blocks, never calls into a device driver; the
        /// descriptor cannot be read) and refuse anything but a regular file.
        pub(super) fn open(path: &Path) -> Result<Checked> {
            let io = |e| Error::new(path, ErrorKind::Io(e));
            let handle =
                std::fs::OpenOptions::new().read(true).custom_flags(libc::O_PATH).open(path).map_err(io)?;
            let meta = handle.metadata().map_err(io)?;
            if !meta.is_file() {
                return Err(not_regular(path, &meta));
            }
            Ok(Checked { handle, meta })
        }

        /// Open the checked inode for reading: through its `/proc/self/fd` link (which names that
        /// inode, not the path it was found by), or without `/proc` (or when asked) by a
        /// non-blocking open of the path that must find the same inode.
        pub(super) fn open_for_reading(self, path: &Path, how: Reopen) -> Result<(File, Metadata)> {
            let io = |e| Error::new(path, ErrorKind::Io(e));
            let link = format!("/proc/self/fd/{}", self.handle.as_raw_fd());
            let by_link = || std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOCTTY).open(&link);
            let file = match how {
                Reopen::Auto => match by_link() {
                    Ok(file) => file,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => nonblocking(path).map_err(io)?,
                    Err(e) => return Err(io(e)),
                },
                Reopen::NonBlocking => nonblocking(path).map_err(io)?,
            };
            let meta = file.metadata().map_err(io)?;
            if !meta.is_file() {
                return Err(not_regular(path, &meta));
            }
            if (meta.dev(), meta.ino()) != (self.meta.dev(), self.meta.ino()) {
                return Err(io(std::io::Error::other("the file was replaced while it was being opened")));
            }
            Ok((file, meta))
        }
    }
}

/// Read the whole regular file at `path` (opened with [`open_regular`]), refusing it with
/// [`ErrorKind::IndexTooLarge`] if it is (or grows to be) larger than `limit_bytes`. Never
/// allocates more than `limit_bytes + 1`.
///
/// ```
/// let dir = tempfile::tempdir().unwrap();
/// let path = dir.path().join("index.json");
/// std::fs::write(&path, b"{}").unwrap();
/// assert_eq!(tensora_format::read_capped(&path, 16).unwrap(), b"{}");
/// let err = tensora_format::read_capped(&path, 1).unwrap_err();
/// assert!(matches!(err.kind(), tensora_format::ErrorKind::IndexTooLarge { .. }));
/// ```
pub fn read_capped(path: &Path, limit_bytes: u64) -> Result<Vec<u8>> {
    let io = |e| Error::new(path, ErrorKind::Io(e));
    let too_large = |len_bytes| Error::new(path, ErrorKind::IndexTooLarge { len_bytes, limit_bytes });
    let (file, meta) = open_regular(path)?;
    if meta.len() > limit_bytes {
        return Err(too_large(meta.len()));
    }
    // `meta.len() <= limit_bytes` here, so the reservation is bounded by the cap.
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    file.take(limit_bytes.saturating_add(1)).read_to_end(&mut bytes).map_err(io)?;
    if bytes.len() as u64 > limit_bytes {
        return Err(too_large(bytes.len() as u64));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests;
