//! [`ReadError`]: a failed read, naming file, offset and length.

use std::io;

use crate::error::BoxError;

/// A failed read: which file, where, and why. The load layer adds the tensor name.
#[derive(Debug, thiserror::Error)]
#[error("file #{file} at offset {offset_bytes} ({len_bytes} bytes): {kind}")]
pub struct ReadError {
    /// The plan file (or [`ReadError::NO_FILE`]).
    pub file: u32,
    /// The first file offset that did not land.
    pub offset_bytes: u64,
    /// Bytes of the read from there on.
    pub len_bytes: u64,
    /// Why.
    pub kind: ReadErrorKind,
}

impl ReadError {
    /// The `file` of an error that belongs to the run, not to one read (a ring that cannot be
    /// set up or entered, a worker that could not be joined): it names no file and no offset.
    pub const NO_FILE: u32 = u32::MAX;

    /// An error of the whole run (see [`ReadError::NO_FILE`]).
    pub fn run(kind: ReadErrorKind) -> ReadError {
        ReadError { file: Self::NO_FILE, offset_bytes: 0, len_bytes: 0, kind }
    }
}

/// Why a read (or a run) failed.
#[derive(Debug, thiserror::Error)]
pub enum ReadErrorKind {
    /// A permanent I/O error (EIO, EBADF, ...), or a transient one that outlived its retries.
    #[error("{0}")]
    Io(io::Error),
    /// The file ended before the planned end of the read.
    #[error("unexpected end of file after {read_bytes} of {expected_bytes} bytes")]
    UnexpectedEof {
        /// Bytes of the read that landed.
        read_bytes: u64,
        /// Bytes the read should have.
        expected_bytes: u64,
    },
    /// The run was cancelled through [`Job::cancel`](crate::Job::cancel).
    #[error("cancelled")]
    Cancelled,
    /// The completion sink asked to stop.
    #[error("stopped by the completion sink")]
    Stopped,
    /// The backend cannot run here (e.g. io_uring setup returned EPERM).
    #[error("backend unavailable: {0}")]
    Unavailable(String),
    /// The backend's own typed error (a remote fetch's cause), carried as is: whoever built the
    /// backend downcasts it to its type (`tensora_remote::RemoteError`) from the load's error.
    #[error("{0}")]
    Source(BoxError),
}
