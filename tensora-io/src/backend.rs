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
/// writable, **initialised** memory that stays valid and does not move for as long as the
/// destination lives, and that writing to disjoint ranges of it from several threads at once is
/// sound. Initialised matters: backends make `&mut [u8]` over a read's range (the `sync` backend
/// hands it to [`ReadAt`](crate::sync::ReadAt)), which is undefined behaviour over uninitialised
/// bytes. An [`Arena`](crate::arena::Arena) is zero-filled anonymous memory and a
/// [`CallerBuffer`](crate::dest::CallerBuffer) comes from a `&mut [u8]`, so both qualify; a
/// staging buffer from a device allocator must be zeroed (or otherwise written) once before use.
/// Backends write only inside the ranges the plan gives them, and a plan's reads never overlap.
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

/// The knobs of one run, for [`Job::new`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobConfig {
    /// Worker threads (sync, mmap-owned) or rings (io_uring). At least 1.
    pub threads: usize,
    /// Submission queue depth per ring (io_uring) or reads kept in flight per worker.
    pub queue_depth: u32,
    /// Use the `O_DIRECT` descriptor where one is open. Backends fall back to buffered on `EINVAL`.
    pub direct: bool,
    /// Bound on zero-progress retries (`EINTR`, `EAGAIN`) of one read (see
    /// [`crate::read_progress`]).
    pub retries_max: u32,
}

/// Everything a backend needs for one run. Plan file ids index into `files`.
///
/// The fields are public for reading; a `Job` can only be built through the `unsafe`
/// [`Job::new`], and it is neither `Clone` nor `Copy`, so safe code holding a `&Job` cannot make a
/// second job aimed at the same destination ranges.
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
    /// Bound on zero-progress retries (`EINTR`, `EAGAIN`) of one read; short reads that make
    /// progress do not count (see [`crate::read_progress`]).
    pub retries_max: u32,
    /// Private: only [`Job::new`] builds a job.
    _sealed: Sealed,
}

/// Keeps [`Job`] from being built with a struct literal.
#[derive(Debug)]
struct Sealed;

impl<'a> Job<'a> {
    /// A job that writes the reads of `plan` into `dest`.
    ///
    /// # Safety
    ///
    /// Backends write into `dest` through raw pointers, from several threads, while the job runs
    /// (any [`IoBackend::execute`] call with it). The caller guarantees that for that whole time
    /// the destination ranges of the plan's reads (`arena_offset_bytes .. + len_bytes` of every
    /// [`Plan::reads`] entry) are written by nobody else, and none of them is referenced (`&` or
    /// `&mut`) before its read has been reported to the [`CompletionSink`]: in particular no
    /// other job over an overlapping range of the same destination runs at the same time. Ranges
    /// outside the destination are refused by the backends, so the plan need not be checked
    /// against it.
    ///
    /// ```
    /// use std::sync::atomic::AtomicBool;
    /// use tensora_io::{Job, JobConfig};
    /// use tensora_io::arena::Arena;
    /// use tensora_plan::{Budget, Order, Plan, PlanConfig};
    ///
    /// let plan = Plan::build(&[], &PlanConfig::default(), &Order::File)?;
    /// let arena = Arena::with_len(4096)?;
    /// let (budget, cancel) = (Budget::new(1 << 20), AtomicBool::new(false));
    /// let config = JobConfig { threads: 1, queue_depth: 1, direct: false, retries_max: 8 };
    /// // SAFETY: nothing else touches `arena` while the job runs.
    /// let job = unsafe { Job::new(&plan, &[], &arena, &budget, &cancel, config) };
    /// assert_eq!(job.threads, 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub unsafe fn new(
        plan: &'a Plan,
        files: &'a [SourceFile],
        dest: &'a dyn Destination,
        budget: &'a Budget,
        cancel: &'a AtomicBool,
        config: JobConfig,
    ) -> Job<'a> {
        Job {
            plan,
            files,
            dest,
            budget,
            threads: config.threads,
            queue_depth: config.queue_depth,
            direct: config.direct,
            cancel,
            retries_max: config.retries_max,
            _sealed: Sealed,
        }
    }
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

impl ReadError {
    /// The `file` of an error that belongs to the run, not to one read (a ring that cannot be
    /// set up or entered, a worker that could not be joined): it names no file and no offset.
    pub const NO_FILE: u32 = u32::MAX;

    /// An error of the whole run (see [`ReadError::NO_FILE`]).
    pub fn run(kind: ReadErrorKind) -> ReadError {
        ReadError { file: Self::NO_FILE, offset_bytes: 0, len_bytes: 0, kind }
    }
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
