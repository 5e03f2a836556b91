//! The seam between the control plane (a [`Plan`]) and the data plane (an [`IoBackend`]).
//!
//! A backend drains a plan's per-file read queues into a [`Destination`], holding at most
//! `budget` bytes in flight, and reports every completed read to a [`CompletionSink`]. It knows
//! nothing of tensors or formats: the load layer maps reads back to tensors.
//!
//! Adding a backend is one file that implements [`IoBackend`] plus one line in
//! [`crate::registry`].

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::AtomicBool;

use tensora_plan::{Budget, Plan};

/// Where bytes land.
///
/// # Safety
///
/// Implementors guarantee that [`Destination::host_ptr`] points to `len_bytes()` bytes of
/// writable memory that stays valid and does not move for as long as the destination lives, and
/// that writing to disjoint ranges of it from several threads at once is sound. Backends write
/// only inside the ranges the plan gives them, and a plan's reads never overlap.
///
/// A pinned-memory or GPU staging sink implements this by exposing a host staging buffer and
/// doing its device copy in [`Destination::on_landed`]; neither the planner nor the backends change.
pub unsafe trait Destination: Send + Sync {
    /// Usable length in bytes.
    fn len_bytes(&self) -> u64;
    /// Base of the host-writable memory.
    fn host_ptr(&self) -> NonNull<u8>;
    /// Alignment of `host_ptr` in bytes (a power of two). O_DIRECT needs at least the block size.
    fn align_bytes(&self) -> u64;
    /// Called by the backend after `len_bytes` have landed at `offset_bytes` (a whole plan read).
    /// A device sink starts its copy here. It may be called from any worker thread.
    fn on_landed(&self, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
        let _ = (offset_bytes, len_bytes);
        Ok(())
    }
}

/// One checkpoint file, opened once and shared by every worker (positional reads only, so no
/// shared cursor). `direct` is a second descriptor opened with `O_DIRECT`, when asked for and
/// supported by the filesystem.
#[derive(Debug)]
pub struct SourceFile {
    pub path: PathBuf,
    pub len_bytes: u64,
    pub buffered: File,
    pub direct: Option<File>,
}

impl SourceFile {
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Everything a backend needs for one run. Plan file ids index into `files`.
#[derive(Clone, Copy)]
pub struct Job<'a> {
    pub plan: &'a Plan,
    pub files: &'a [SourceFile],
    pub dest: &'a dyn Destination,
    /// In-flight byte budget shared by all workers of this job.
    pub budget: &'a Budget,
    /// Worker threads (sync, mmap-owned) or rings (io_uring). At least 1.
    pub threads: usize,
    /// Submission queue depth per ring (io_uring) or reads kept in flight per worker.
    pub queue_depth: u32,
    /// Use the `O_DIRECT` descriptor where one is open. Backends fall back to buffered on `EINVAL`.
    pub direct: bool,
    /// Set by the caller to stop the run early; the backend drains what is in flight and returns
    /// [`ReadErrorKind::Cancelled`].
    pub cancel: &'a AtomicBool,
    /// Bound on retries of transient errors (`EINTR`, `EAGAIN`, short reads) for one read.
    pub retries_max: u32,
}

impl std::fmt::Debug for Job<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("reads", &self.plan.reads().len())
            .field("files", &self.files.len())
            .field("dest_len_bytes", &self.dest.len_bytes())
            .field("threads", &self.threads)
            .field("queue_depth", &self.queue_depth)
            .field("direct", &self.direct)
            .finish()
    }
}

/// Receives each completed read, from whichever worker completed it.
pub trait CompletionSink: Sync {
    /// `read` indexes [`Plan::reads`]. Returning an error stops the run: the backend drains
    /// what is in flight and returns [`ReadErrorKind::Stopped`].
    fn read_done(&self, read: u32) -> Result<(), StopReason>;
}

/// Why a [`CompletionSink`] stopped a run (e.g. a streaming callback failed). The load layer keeps
/// the real error; the backend only needs to know it must stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StopReason;

/// What one backend run did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IoStats {
    pub bytes_read: u64,
    pub reads: u64,
    /// Transient errors retried (EINTR, EAGAIN, short reads).
    pub retries: u64,
    /// Highest bytes in flight at once.
    pub peak_inflight_bytes: u64,
    /// Reads that fell back from O_DIRECT to buffered.
    pub direct_fallbacks: u64,
}

/// A failed read: which file, where, and why. The load layer adds the tensor name.
#[derive(Debug, thiserror::Error)]
#[error("file #{file} at offset {offset_bytes} ({len_bytes} bytes): {kind}")]
pub struct ReadError {
    pub file: u32,
    pub offset_bytes: u64,
    pub len_bytes: u64,
    pub kind: ReadErrorKind,
}

#[derive(Debug, thiserror::Error)]
pub enum ReadErrorKind {
    /// A permanent I/O error (EIO, EBADF, ...), or a transient one that outlived its retries.
    #[error("{0}")]
    Io(io::Error),
    /// The file ended before the planned end of the read.
    #[error("unexpected end of file after {read_bytes} of {expected_bytes} bytes")]
    UnexpectedEof { read_bytes: u64, expected_bytes: u64 },
    /// The run was cancelled through [`Job::cancel`].
    #[error("cancelled")]
    Cancelled,
    /// The completion sink asked to stop.
    #[error("stopped by the completion sink")]
    Stopped,
    /// The backend cannot run here (e.g. io_uring setup returned EPERM).
    #[error("backend unavailable: {0}")]
    Unavailable(String),
}

/// A way to execute a plan.
pub trait IoBackend: Send + Sync {
    /// Stable name, as used by `--backend`.
    fn name(&self) -> &'static str;
    /// Whether this backend can run here, and if not, why (probed, not guessed).
    fn available(&self) -> Result<(), String> {
        Ok(())
    }
    /// Execute every read of `job.plan` into `job.dest`, calling `sink.read_done` once per read
    /// after its bytes have landed and `dest.on_landed` was called. On error, nothing is in
    /// flight when this returns.
    fn execute(&self, job: &Job<'_>, sink: &dyn CompletionSink) -> Result<IoStats, ReadError>;
}
