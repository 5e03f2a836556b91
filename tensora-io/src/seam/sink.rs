//! [`CompletionSink`]: where a backend reports landed reads, with the proofs only landed bytes
//! can produce ([`Landed`], [`LandedPrefix`]).

use std::marker::PhantomData;

use super::Job;

/// Ties a proof to the borrow of the one [`Job`] it was made for: invariant in `'j`, so no proof
/// can be kept past its job's run or passed to a sink as another job's.
type JobBrand<'j> = PhantomData<fn(&'j ()) -> &'j ()>;

/// Proof that every byte of one read of one job has landed. Only [`ReadTarget::land`] (and the
/// built-in backends, inside this crate) make one, at most once per read per job, so a sink that
/// receives a `Landed` knows the read's bytes are written and nobody writes them again: a backend
/// in safe code cannot report a read it did not finish, or report one twice.
///
/// The proof is branded with the lifetime of its job's borrow, so it cannot outlive the run that
/// made it: a backend cannot keep a proof from one load and report it in the next, where the bytes
/// may not have landed (a sink would then hand out bytes nobody wrote). This does not compile:
///
/// ```compile_fail,E0521
/// use std::sync::Mutex;
/// use tensora_io::{CompletionSink, Landed, StopReason};
///
/// /// Keeps the proofs it is given, to report them again later.
/// struct Thief {
///     kept: Mutex<Vec<Landed<'static>>>,
/// }
/// impl CompletionSink for Thief {
///     fn read_done(&self, landed: Landed<'_>) -> Result<(), StopReason> {
///         self.kept.lock().unwrap().push(landed); // error: the proof cannot outlive its job
///         Ok(())
///     }
/// }
/// ```
///
/// while a sink that only reads the proof does:
///
/// ```
/// use std::sync::Mutex;
/// use tensora_io::{CompletionSink, Landed, StopReason};
///
/// struct Log {
///     reads: Mutex<Vec<u32>>,
/// }
/// impl CompletionSink for Log {
///     fn read_done(&self, landed: Landed<'_>) -> Result<(), StopReason> {
///         self.reads.lock().unwrap().push(landed.read());
///         Ok(())
///     }
/// }
/// ```
///
/// [`ReadTarget::land`]: crate::ReadTarget::land
#[derive(Debug, PartialEq, Eq)]
pub struct Landed<'j> {
    read: u32,
    _job: JobBrand<'j>,
}

impl<'j> Landed<'j> {
    /// Made only where the read's bytes are known to have landed (a built-in backend's run, or
    /// [`ReadTarget::land`] consuming the read's only `&mut` hand-out), for the job borrowed as
    /// `'j`.
    ///
    /// [`ReadTarget::land`]: crate::ReadTarget::land
    pub(crate) fn new(_job: &'j Job<'_>, read: u32) -> Landed<'j> {
        Landed { read, _job: PhantomData }
    }

    /// The read's index in [`Plan::reads`](tensora_plan::Plan::reads).
    pub fn read(&self) -> u32 {
        self.read
    }
}

/// Proof that the first `len_bytes` of one read have landed and will not be written again (a
/// backend reports prefixes of a read only in order, from the one worker filling it). Only the
/// built-in backends make one, when the job asks for it ([`Job::with_landed_step`]). Branded with
/// its job like [`Landed`].
#[derive(Debug, PartialEq, Eq)]
pub struct LandedPrefix<'j> {
    read: u32,
    len_bytes: u64,
    _job: JobBrand<'j>,
}

impl<'j> LandedPrefix<'j> {
    pub(crate) fn new(_job: &'j Job<'_>, read: u32, len_bytes: u64) -> LandedPrefix<'j> {
        LandedPrefix { read, len_bytes, _job: PhantomData }
    }

    /// The read's index in [`Plan::reads`](tensora_plan::Plan::reads).
    pub fn read(&self) -> u32 {
        self.read
    }

    /// Bytes from the read's start that have landed.
    pub fn len_bytes(&self) -> u64 {
        self.len_bytes
    }
}

/// Receives each completed read, from whichever worker completed it.
pub trait CompletionSink: Sync {
    /// `landed` names a read of [`Plan::reads`] whose bytes have all landed. Returning an error
    /// stops the run: the backend drains what is in flight and returns [`ReadErrorKind::Stopped`].
    ///
    /// [`Plan::reads`]: tensora_plan::Plan::reads
    /// [`ReadErrorKind::Stopped`]: crate::ReadErrorKind::Stopped
    fn read_done(&self, landed: Landed<'_>) -> Result<(), StopReason>;

    /// The first bytes of a read have landed, while the rest is still being read (only when the
    /// job asked for it with [`Job::with_landed_step`], and only from backends that support it:
    /// `sync`). Prefixes of one read arrive in order, from the worker filling it, before its
    /// [`CompletionSink::read_done`]. Lets a sink work on bytes while they are still in that
    /// core's cache. An error stops the run like one from `read_done`.
    fn prefix_landed(&self, prefix: LandedPrefix<'_>) -> Result<(), StopReason> {
        let _ = prefix;
        Ok(())
    }
}

/// Why a [`CompletionSink`] stopped a run (e.g. a streaming callback failed). The load layer keeps
/// the real error; the backend only needs to know it must stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StopReason;
