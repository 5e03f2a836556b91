//! The seam between the control plane (a [`Plan`]) and the data plane (an [`IoBackend`]).
//!
//! A backend drains a plan's per-file read queues into a [`Destination`], holding at most
//! `budget` bytes in flight, and reports every completed read to a [`CompletionSink`]. It knows
//! nothing of tensors or formats: the load layer maps reads back to tensors.
//!
//! Adding a backend is one file that implements [`IoBackend`] plus one line in
//! [`crate::registry`]. The [`Budget`] bounds the bytes in flight across every backend worker..
//!
//! [`Plan`]: tensora_plan::Plan

mod budget;
mod dest;
mod error;
mod held;
mod job;
mod sink;
mod source;

pub use budget::{Budget, Permit};
pub use dest::{CallerBuffer, Destination};
pub use error::{ReadError, ReadErrorKind};
pub use held::{HeldPiece, KeepMapped};
pub use job::{Filled, Job, JobConfig, ReadTarget, Reading};
pub use sink::{CompletionSink, Landed, LandedPrefix, StopReason};
#[cfg(test)]
pub(crate) use source::temp_source;
pub use source::{Access, SourceFile};

/// What one backend run did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IoStats {
    /// Bytes the reads fetched.
    pub bytes_read: u64,
    /// Reads completed.
    pub reads: u64,
    /// Transient errors retried (EINTR, EAGAIN, short reads).
    pub retries: u64,
    /// Highest bytes in flight at once.
    pub peak_inflight_bytes: u64,
    /// Reads that fell back from O_DIRECT to buffered.
    pub direct_fallbacks: u64,
    /// Bytes between reads that a read-ahead helper asked the device to read along with them
    /// (the gaps [`Reading::ReadAhead`]'s `device_cost` says the device reads along, of the reads
    /// it advised before the workers reached them; 0 where no helper runs).
    pub bytes_advised_beyond_reads: u64,
}

/// A way to execute a plan: one file implementing this trait plus one line in
/// [`crate::registry`] is a new backend.
pub trait IoBackend: Send + Sync {
    /// Stable name, as used by `--backend`.
    fn name(&self) -> &'static str;
    /// Whether this backend can run here, and if not, why (probed, not guessed).
    fn available(&self) -> Result<(), String> {
        Ok(())
    }
    /// Whether the load layer opens the checkpoint's files as local files for this backend
    /// (the default). A backend that reads from elsewhere (an object store) returns false: the
    /// load layer then opens, `fstat`s and stamp-checks nothing, [`Job::files`] is empty, and the
    /// backend maps plan files to checkpoint files with [`Job::checkpoint_file`]. Such a backend
    /// fills reads through [`Job::claim`]; `Residence::Mapped` is refused for it.
    fn reads_local_files(&self) -> bool {
        true
    }
    /// The alignment this backend asks of every read's file offset, length (but at a file's
    /// end) and destination offset: 1 (the default) for none. A backend that passes the bytes it
    /// read on to a disk with `O_DIRECT` (the remote cache's copies) asks for the block size, so
    /// that they go from where they landed. A power of two; honoured when the budget and chunk
    /// are at least as large (as for direct reads), ignored otherwise.
    fn read_align_bytes(&self) -> u64 {
        1
    }
    /// Execute every read of `job.plan` into `job.dest`, calling `sink.read_done` once per read
    /// after its bytes have landed and `dest.on_landed` was called. On error, nothing is in
    /// flight when this returns.
    fn execute(&self, job: &Job<'_>, sink: &dyn CompletionSink) -> Result<IoStats, ReadError>;
}
