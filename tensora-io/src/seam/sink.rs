//! [`CompletionSink`]: where a backend reports landed reads, with the proofs only landed bytes
//! can produce ([`Landed`], [`LandedPrefix`]).

/// Proof that every byte of one read has landed. Only [`ReadTarget::land`] (and the built-in
/// backends, inside this crate) make one, at most once per read per job, so a sink that receives
/// a `Landed` knows the read's bytes are written and nobody writes them again: a backend in safe
/// code cannot report a read it did not finish, or report one twice.
#[derive(Debug, PartialEq, Eq)]
pub struct Landed {
    read: u32,
}

impl Landed {
    /// Made only where the read's bytes are known to have landed (a built-in backend's run, or
    /// [`ReadTarget::land`] consuming the read's only `&mut` hand-out).
    pub(crate) fn new(read: u32) -> Landed {
        Landed { read }
    }

    /// The read's index in [`Plan::reads`].
    pub fn read(&self) -> u32 {
        self.read
    }
}

/// Proof that the first `len_bytes` of one read have landed and will not be written again (a
/// backend reports prefixes of a read only in order, from the one worker filling it). Only the
/// built-in backends make one, when the job asks for it ([`Job::with_landed_step`]).
#[derive(Debug, PartialEq, Eq)]
pub struct LandedPrefix {
    read: u32,
    len_bytes: u64,
}

impl LandedPrefix {
    pub(crate) fn new(read: u32, len_bytes: u64) -> LandedPrefix {
        LandedPrefix { read, len_bytes }
    }

    /// The read's index in [`Plan::reads`].
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
    fn read_done(&self, landed: Landed) -> Result<(), StopReason>;

    /// The first bytes of a read have landed, while the rest is still being read (only when the
    /// job asked for it with [`Job::with_landed_step`], and only from backends that support it:
    /// `sync`). Prefixes of one read arrive in order, from the worker filling it, before its
    /// [`CompletionSink::read_done`]. Lets a sink work on bytes while they are still in that
    /// core's cache. An error stops the run like one from `read_done`.
    fn prefix_landed(&self, prefix: LandedPrefix) -> Result<(), StopReason> {
        let _ = prefix;
        Ok(())
    }
}

/// Why a [`CompletionSink`] stopped a run (e.g. a streaming callback failed). The load layer keeps
/// the real error; the backend only needs to know it must stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StopReason;
