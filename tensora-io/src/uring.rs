//! The io_uring backend: one ring per worker thread, positional reads straight into the
//! destination, `O_DIRECT` where the plan is aligned, registered files (and optionally registered
//! buffers).
//!
//! # Memory safety of in-flight reads
//!
//! The kernel writes into the destination asynchronously, so the destination must outlive every
//! submitted read. Each ring lives in a guard (a private `Ring`) whose `Drop` waits for every
//! outstanding completion before the ring is torn down. The guard is dropped on every exit path of
//! a worker: normal completion, a read error, a stop from the completion sink, cancellation and
//! unwinding from a panic. Because [`IoBackend::execute`] only returns after every worker has returned (the
//! workers are scoped threads), no read can still target the destination once `execute` returns.
//! If the kernel ever refused to hand back completions (it does not in practice), the guard aborts
//! the process rather than let memory be freed under a live read.
//!
//! # Retries
//!
//! `EINTR` and `EAGAIN` completions and short reads resubmit only the remainder of *that* read
//! (the slot is free again once its completion has arrived, so nothing in flight is ever
//! resubmitted). The rules are those of [`crate::read_progress`], shared with the `sync` and
//! `async` backends: only zero-progress completions count against [`Job::retries_max`], a read
//! returning 0 before the file's known end is [`ReadErrorKind::UnexpectedEof`], and `EINVAL` on an
//! `O_DIRECT` read marks that file as buffered-only and resubmits the remainder buffered. Errors
//! name the first byte that did not land. A ring that cannot be created leaves its share of the
//! work to the other rings; the run fails only when no ring could be created.
//!
//! # Example
//!
//! ```
//! use tensora_io::IoBackend;
//! use tensora_io::uring::{self, UringBackend};
//!
//! let backend = UringBackend::default();
//! assert_eq!(backend.name(), "io-uring");
//! // The availability check is probed (ring creation), not guessed.
//! assert_eq!(backend.available().is_ok(), uring::probe().is_ok());
//! ```

use std::io;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;
use std::sync::Mutex;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};

use io_uring::{IoUring, opcode, types};
use tensora_plan::{Permit, Read};

use crate::backend::{
    CompletionSink, IoBackend, IoStats, Job, ReadError, ReadErrorKind, SourceFile, StopReason,
};
use crate::read_progress::{ReadProgress, Step};

/// Largest queue depth (ring entries) a ring is created with; larger requests are clamped.
pub const QUEUE_DEPTH_MAX: u32 = 4096;
/// Largest number of rings (worker threads) one run uses; larger requests are clamped.
pub const RINGS_MAX: usize = 256;
/// The kernel refuses registered buffers larger than 1 GiB, so the destination is registered as
/// consecutive buffers of at most this size.
const REGISTERED_BUFFER_BYTES_MAX: u64 = 1 << 30;
/// The kernel's limit on the number of registered buffers per ring.
const REGISTERED_BUFFERS_MAX: u64 = 1 << 14;
/// Smallest alignment `O_DIRECT` is attempted with (the smallest logical block size in use).
pub(crate) const DIRECT_ALIGN_BYTES_MIN: u64 = 512;
/// Bound on consecutive failed `io_uring_enter` calls while waiting for completions.
const ENTER_FAILURES_MAX: u32 = 10_000;

/// Knobs of the io_uring backend. The queue depth and ring count come from the [`Job`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UringConfig {
    /// Register every file descriptor with each ring (saves an fd lookup per SQE). Falls back to
    /// plain descriptors if registration fails (e.g. `RLIMIT_NOFILE` smaller than the file count).
    pub register_files: bool,
    /// Register the destination as fixed buffers (pins it; saves page pinning per read). Falls back
    /// to plain reads if registration fails.
    pub register_buffers: bool,
}

impl Default for UringConfig {
    fn default() -> Self {
        Self { register_files: true, register_buffers: false }
    }
}

/// Executes a plan with io_uring. See the [module docs](self).
///
/// ```
/// use std::io::Write;
/// use std::sync::atomic::AtomicBool;
/// use tensora_io::arena::Arena;
/// use tensora_io::uring::{self, UringBackend};
/// use tensora_io::{CompletionSink, IoBackend, Job, JobConfig, SourceFile, StopReason};
/// use tensora_plan::{Budget, Extent, Order, Plan, PlanConfig};
///
/// struct Count(std::sync::atomic::AtomicU32);
/// impl CompletionSink for Count {
///     fn read_done(&self, _landed: tensora_io::Landed) -> Result<(), StopReason> {
///         self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
///         Ok(())
///     }
/// }
///
/// let mut tmp = tempfile::NamedTempFile::new()?;
/// tmp.write_all(&(0..100_000u32).map(|i| i as u8).collect::<Vec<u8>>())?;
/// let file = SourceFile {
///     path: tmp.path().to_path_buf(),
///     len_bytes: 100_000,
///     buffered: std::fs::File::open(tmp.path())?,
///     direct: None,
/// };
/// let extents = [Extent { file: 0, offset_bytes: 1000, len_bytes: 50_000, tag: 0 }];
/// let config = PlanConfig { chunk_bytes: 16 << 10, ..PlanConfig::default() };
/// let plan = Plan::build(&extents, &config, &Order::File)?;
/// let mut arena = Arena::with_len(plan.arena_len_bytes())?;
/// let budget = Budget::new(64 << 10);
/// let cancel = AtomicBool::new(false);
/// let sink = Count(Default::default());
/// if uring::probe().is_ok() {
///     // SAFETY: nothing else reads or writes the arena while this job runs.
///     let job = unsafe {
///         Job::new(
///             &plan,
///             std::slice::from_ref(&file),
///             &arena,
///             &budget,
///             &cancel,
///             JobConfig { threads: 2, queue_depth: 8, direct: false, retries_max: 4 },
///         )
///     };
///     let stats = UringBackend::default().execute(&job, &sink)?;
///     assert_eq!(stats.reads as usize, plan.reads().len());
///     let at = plan.location(0).unwrap().arena_offset_bytes as usize;
///     assert_eq!(arena.as_slice()[at], (1000u32 % 256) as u8);
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct UringBackend {
    config: UringConfig,
}

impl UringBackend {
    /// A backend with the given configuration.
    pub fn new(config: UringConfig) -> Self {
        Self { config }
    }

    /// The configuration this backend runs with.
    pub fn config(&self) -> UringConfig {
        self.config
    }
}

/// Whether io_uring works here: creates (and drops) a small ring and checks that the kernel
/// supports `IORING_OP_READ`. The result is computed once per process.
///
/// A failure carries the reason: `EPERM` (seccomp, `kernel.io_uring_disabled`: common in
/// containers), `ENOSYS` (kernel built without io_uring), or a missing opcode (kernel < 5.6).
pub fn probe() -> Result<(), String> {
    static PROBED: OnceLock<Result<(), String>> = OnceLock::new();
    PROBED.get_or_init(probe_uncached).clone()
}

fn probe_uncached() -> Result<(), String> {
    let ring = IoUring::new(2).map_err(|e| describe_setup_error(&e))?;
    let mut kernel_probe = io_uring::Probe::new();
    ring.submitter()
        .register_probe(&mut kernel_probe)
        .map_err(|e| format!("io_uring opcode probe failed: {e}"))?;
    for (code, name) in
        [(opcode::Read::CODE, "IORING_OP_READ"), (opcode::ReadFixed::CODE, "IORING_OP_READ_FIXED")]
    {
        if !kernel_probe.is_supported(code) {
            return Err(format!("io_uring lacks {name} (kernel too old)"));
        }
    }
    Ok(())
}

fn describe_setup_error(e: &io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::EPERM) => {
            format!(
                "io_uring_setup: {e} (blocked by seccomp or kernel.io_uring_disabled, common in containers)"
            )
        }
        Some(libc::ENOSYS) => format!("io_uring_setup: {e} (kernel built without io_uring)"),
        Some(libc::ENOMEM) => format!("io_uring_setup: {e} (RLIMIT_MEMLOCK too low for the ring)"),
        _ => format!("io_uring_setup: {e}"),
    }
}

impl IoBackend for UringBackend {
    fn name(&self) -> &'static str {
        "io-uring"
    }

    fn available(&self) -> Result<(), String> {
        probe()
    }

    fn execute(&self, job: &Job<'_>, sink: &dyn CompletionSink) -> Result<IoStats, ReadError> {
        let reads = job.plan.reads();
        validate_job(job)?;
        if reads.is_empty() {
            return Ok(IoStats::default());
        }
        if let Err(reason) = probe() {
            return Err(ReadError::run(ReadErrorKind::Unavailable(reason)));
        }
        let state = RunState::new(job);
        let rings = job.threads.clamp(1, RINGS_MAX).min(reads.len());
        let config = self.config;
        let rings_failed = AtomicUsize::new(0);
        let per_ring = run_workers(rings, |w| run_ring(job, sink, &state, config, w, rings, &rings_failed));
        state.finish(per_ring)
    }
}

// ---------------------------------------------------------------------------------------------
// Pieces shared by the io_uring, mmap and async backends.
// ---------------------------------------------------------------------------------------------

/// Checks every read of the plan against the files and the destination, so that no backend ever
/// writes outside the destination because of a plan/destination mismatch, then claims every read
/// of the job ([`Job::claim`] can no longer hand any of them out).
pub(crate) fn validate_job(job: &Job<'_>) -> Result<(), ReadError> {
    let dest_len = job.dest.len_bytes();
    for read in job.plan.reads() {
        let invalid = |why: String| {
            job_error(read, ReadErrorKind::Io(io::Error::new(io::ErrorKind::InvalidInput, why)))
        };
        if read.file as usize >= job.files.len() {
            return Err(invalid(format!(
                "plan names file #{} but the job has {}",
                read.file,
                job.files.len()
            )));
        }
        let arena_end = read.arena_offset_bytes.checked_add(read.len_bytes);
        if arena_end.is_none_or(|end| end > dest_len) {
            return Err(invalid(format!(
                "read lands at {}..+{} but the destination holds {dest_len} bytes",
                read.arena_offset_bytes, read.len_bytes
            )));
        }
        if read.offset_bytes.checked_add(read.len_bytes).is_none() {
            return Err(invalid("read end overflows u64".to_string()));
        }
    }
    if usize::try_from(dest_len).is_err() {
        let first = job.plan.reads().first();
        return Err(ReadError {
            file: first.map_or(0, |r| r.file),
            offset_bytes: first.map_or(0, |r| r.offset_bytes),
            len_bytes: dest_len,
            kind: ReadErrorKind::Io(io::Error::new(io::ErrorKind::InvalidInput, "destination exceeds usize")),
        });
    }
    // Every range checked: take them all, so no other backend (or `Job::claim`) can hand any of
    // them out while this run writes through raw pointers.
    job.claim_all()
}

/// A [`ReadError`] for a whole read.
pub(crate) fn job_error(read: &Read, kind: ReadErrorKind) -> ReadError {
    ReadError { file: read.file, offset_bytes: read.offset_bytes, len_bytes: read.len_bytes, kind }
}

/// The destination's base pointer, made shareable with worker threads.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DestPtr(NonNull<u8>);

// SAFETY: the `Destination` contract makes its memory writable from several threads at once as
// long as the ranges are disjoint, which plan reads are; the pointer itself is just an address.
unsafe impl Send for DestPtr {}
// SAFETY: as above; sharing the address does not by itself touch the memory.
unsafe impl Sync for DestPtr {}

impl DestPtr {
    pub(crate) fn new(job: &Job<'_>) -> Self {
        Self(job.dest.host_ptr())
    }

    /// A destination pointer for unit tests that drive a read without a [`Job`].
    #[cfg(test)]
    pub(crate) fn from_nonnull(ptr: NonNull<u8>) -> Self {
        Self(ptr)
    }

    /// Address of `offset_bytes` into the destination. Only pointer arithmetic: callers validated
    /// the offset against the destination length with [`validate_job`].
    pub(crate) fn at(self, offset_bytes: u64) -> *mut u8 {
        self.0.as_ptr().wrapping_add(offset_bytes as usize)
    }
}

/// State shared by the workers of one run: one work cursor per file queue, the first error, and
/// counters.
///
/// Workers claim reads round-robin across the plan's per-file queues ([`RunState::claim`] from a
/// home queue, moving on to the next queue with work), so several files are busy at once; under
/// a priority order every worker starts on queue 0, the most urgent.
#[derive(Debug)]
pub(crate) struct RunState {
    /// Each queue's read range and its next position (relative to the range's start).
    queues: Vec<(std::ops::Range<u32>, AtomicU32)>,
    priority: bool,
    stop: AtomicBool,
    first_error: Mutex<Option<ReadError>>,
    inflight_bytes: AtomicU64,
    peak_inflight_bytes: AtomicU64,
    /// Files whose `O_DIRECT` descriptor returned `EINVAL`: read buffered from then on.
    direct_disabled: Vec<AtomicBool>,
}

impl RunState {
    pub(crate) fn new(job: &Job<'_>) -> Self {
        Self {
            queues: job.plan.queues().iter().map(|q| (q.reads.clone(), AtomicU32::new(0))).collect(),
            priority: matches!(job.plan.order(), tensora_plan::Order::Priority(_)),
            stop: AtomicBool::new(false),
            first_error: Mutex::new(None),
            inflight_bytes: AtomicU64::new(0),
            peak_inflight_bytes: AtomicU64::new(0),
            direct_disabled: job.files.iter().map(|_| AtomicBool::new(false)).collect(),
        }
    }

    /// The queue worker `worker` starts on: spread over the files, or queue 0 (the most urgent)
    /// under a priority order.
    pub(crate) fn home(&self, worker: usize) -> usize {
        if self.priority || self.queues.is_empty() { 0 } else { worker % self.queues.len() }
    }

    /// The next read to issue from queue `home`, or from the next queue with work; `None` when
    /// every queue is drained.
    pub(crate) fn claim(&self, home: usize) -> Option<u32> {
        let n = self.queues.len();
        for step in 0..n {
            let (range, cursor) = &self.queues[(home + step) % n];
            let len = range.end.saturating_sub(range.start);
            if cursor.load(Ordering::Relaxed) >= len {
                continue;
            }
            let pos = cursor.fetch_add(1, Ordering::AcqRel);
            if pos < len {
                return Some(range.start + pos);
            }
        }
        None
    }

    /// Whether every read has been claimed.
    pub(crate) fn all_claimed(&self) -> bool {
        self.queues
            .iter()
            .all(|(range, cursor)| cursor.load(Ordering::Relaxed) >= range.end.saturating_sub(range.start))
    }

    pub(crate) fn stopped(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    /// Records `err` if it is the first, and tells every worker to stop issuing.
    pub(crate) fn fail(&self, err: ReadError) {
        let mut first = self.first_error.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if first.is_none() {
            *first = Some(err);
        }
        self.stop.store(true, Ordering::Release);
    }

    /// Stops the run if the caller cancelled it. Returns whether the run must stop.
    pub(crate) fn check_cancel(&self, job: &Job<'_>, read: &Read) -> bool {
        if job.cancel.load(Ordering::Acquire) {
            self.fail(job_error(read, ReadErrorKind::Cancelled));
        }
        self.stopped()
    }

    pub(crate) fn begin_inflight(&self, len_bytes: u64) {
        let now = self.inflight_bytes.fetch_add(len_bytes, Ordering::AcqRel) + len_bytes;
        self.peak_inflight_bytes.fetch_max(now, Ordering::AcqRel);
    }

    pub(crate) fn end_inflight(&self, len_bytes: u64) {
        self.inflight_bytes.fetch_sub(len_bytes, Ordering::AcqRel);
    }

    pub(crate) fn direct_allowed(&self, file: u32) -> bool {
        !self.direct_disabled[file as usize].load(Ordering::Relaxed)
    }

    pub(crate) fn disable_direct(&self, file: u32) {
        self.direct_disabled[file as usize].store(true, Ordering::Relaxed);
    }

    /// Announces a landed read: `dest.on_landed`, then `sink.read_done`. Failures stop the run.
    pub(crate) fn land(&self, job: &Job<'_>, sink: &dyn CompletionSink, index: u32) {
        if self.stopped() {
            return;
        }
        let read = &job.plan.reads()[index as usize];
        if let Err(e) = job.dest.on_landed(read.arena_offset_bytes, read.len_bytes) {
            self.fail(job_error(read, ReadErrorKind::Io(e)));
            return;
        }
        if let Err(StopReason) = sink.read_done(crate::backend::Landed::new(index)) {
            self.fail(job_error(read, ReadErrorKind::Stopped));
        }
    }

    /// Sums the workers' stats, or returns the first error.
    pub(crate) fn finish(&self, per_worker: Vec<IoStats>) -> Result<IoStats, ReadError> {
        let first = self.first_error.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take();
        if let Some(err) = first {
            return Err(err);
        }
        let mut total = IoStats::default();
        for s in per_worker {
            total.bytes_read += s.bytes_read;
            total.reads += s.reads;
            total.retries += s.retries;
            total.direct_fallbacks += s.direct_fallbacks;
        }
        total.peak_inflight_bytes = self.peak_inflight_bytes.load(Ordering::Acquire);
        Ok(total)
    }
}

/// Runs `workers` copies of `f` on scoped threads (inline when there is one) and collects their
/// results. A panicking worker is re-raised after every worker has returned.
pub(crate) fn run_workers<F>(workers: usize, f: F) -> Vec<IoStats>
where
    F: Fn(usize) -> IoStats + Sync,
{
    if workers <= 1 {
        return vec![f(0)];
    }
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|w| {
                scope.spawn({
                    let f = &f;
                    move || f(w)
                })
            })
            .collect();
        let mut out = Vec::with_capacity(workers);
        let mut panic = None;
        for h in handles {
            match h.join() {
                Ok(s) => out.push(s),
                Err(payload) => panic = Some(payload),
            }
        }
        if let Some(payload) = panic {
            std::panic::resume_unwind(payload);
        }
        out
    })
}

/// Whether a read of `len` bytes from file offset `offset` into `ptr` may use `O_DIRECT`.
pub(crate) fn direct_aligned(ptr: *const u8, offset: u64, len: u64, align: u64) -> bool {
    (ptr as usize as u64).is_multiple_of(align) && offset.is_multiple_of(align) && len.is_multiple_of(align)
}

/// The alignment `O_DIRECT` reads of this job are attempted with.
pub(crate) fn direct_align_bytes(job: &Job<'_>) -> u64 {
    let align = job.plan.config().align_bytes.max(DIRECT_ALIGN_BYTES_MIN);
    if align.is_power_of_two() { align } else { align.next_power_of_two() }
}

// ---------------------------------------------------------------------------------------------
// The ring worker.
// ---------------------------------------------------------------------------------------------

/// One plan read being worked on by a ring.
#[derive(Debug)]
struct Slot {
    read: u32,
    /// Bytes landed, retries and the end-of-file rule of this read.
    progress: ReadProgress,
    /// Length of the SQE in flight for this slot.
    submitted_bytes: u64,
    /// Whether the SQE in flight uses the `O_DIRECT` descriptor.
    direct: bool,
    /// Budget held while the read is in flight; released when it lands.
    permit: Permit,
}

/// A ring plus the slots its SQEs point into. `Drop` waits for every in-flight completion, so the
/// destination is never released under a live read. See the module docs.
struct Ring {
    ring: IoUring,
    slots: Vec<Option<Slot>>,
    free_slots: Vec<usize>,
    /// SQEs pushed (submitted or still in the SQ) whose CQE has not been reaped.
    in_flight: usize,
    registered_files: bool,
    /// Registered buffer spans (base address, length), in destination order.
    registered_buffers: Vec<(usize, u64)>,
    /// Reaped completions (user data, result), reused between waits.
    reaped: Vec<(u64, i32)>,
}

impl std::fmt::Debug for Ring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring")
            .field("depth", &self.slots.len())
            .field("in_flight", &self.in_flight)
            .field("registered_files", &self.registered_files)
            .field("registered_buffers", &self.registered_buffers.len())
            .finish()
    }
}

impl Ring {
    fn new(depth: u32) -> io::Result<Self> {
        let ring = IoUring::new(depth)?;
        let depth = depth as usize;
        Ok(Self {
            ring,
            slots: (0..depth).map(|_| None).collect(),
            free_slots: (0..depth).rev().collect(),
            in_flight: 0,
            registered_files: false,
            registered_buffers: Vec::new(),
            reaped: Vec::with_capacity(depth),
        })
    }

    /// Registers `2 * files` descriptors: buffered at `2f`, `O_DIRECT` (or a sparse -1) at `2f + 1`.
    fn register_files(&mut self, files: &[SourceFile]) {
        let fds: Vec<i32> = files
            .iter()
            .flat_map(|f| [f.buffered.as_raw_fd(), f.direct.as_ref().map_or(-1, |d| d.as_raw_fd())])
            .collect();
        self.registered_files = self.ring.submitter().register_files(&fds).is_ok();
    }

    /// Registers the destination as fixed buffers of at most [`REGISTERED_BUFFER_BYTES_MAX`].
    fn register_buffers(&mut self, base: DestPtr, len_bytes: u64) {
        let count = len_bytes.div_ceil(REGISTERED_BUFFER_BYTES_MAX);
        if len_bytes == 0 || count > REGISTERED_BUFFERS_MAX {
            return;
        }
        let spans: Vec<(usize, u64)> = (0..count)
            .map(|i| {
                let start = i * REGISTERED_BUFFER_BYTES_MAX;
                (base.at(start) as usize, REGISTERED_BUFFER_BYTES_MAX.min(len_bytes - start))
            })
            .collect();
        let iovecs: Vec<libc::iovec> = spans
            .iter()
            .map(|&(addr, len)| libc::iovec { iov_base: addr as *mut _, iov_len: len as usize })
            .collect();
        // SAFETY: the spans lie inside the destination, which outlives this ring: the ring is
        // dropped (and its buffers unregistered) before `execute` returns.
        if unsafe { self.ring.submitter().register_buffers(&iovecs) }.is_ok() {
            self.registered_buffers = spans;
        }
    }

    fn has_free_slot(&self) -> bool {
        !self.free_slots.is_empty()
    }

    /// The registered buffer index wholly containing `[ptr, ptr + len)`, if any.
    fn fixed_buffer(&self, ptr: *mut u8, len: u64) -> Option<u16> {
        let addr = ptr as usize;
        let i = self.registered_buffers.partition_point(|&(base, _)| base <= addr).checked_sub(1)?;
        let (base, span) = self.registered_buffers[i];
        let end = (addr - base) as u64 + len;
        if end <= span { u16::try_from(i).ok() } else { None }
    }

    /// Pushes the SQE for the remainder of the read in `slot`.
    fn push(&mut self, job: &Job<'_>, state: &RunState, base: DestPtr, slot_index: usize) -> io::Result<()> {
        let align = direct_align_bytes(job);
        let Some(slot) = self.slots[slot_index].as_mut() else {
            return Err(io::Error::other("io_uring slot vanished"));
        };
        let read = &job.plan.reads()[slot.read as usize];
        let call = slot.progress.next_call(Some(align));
        let (file_offset, len) = (call.file_offset_bytes, call.len_bytes);
        let ptr = base.at(read.arena_offset_bytes + call.done_bytes);
        let source = &job.files[read.file as usize];
        let direct = job.direct
            && source.direct.is_some()
            && state.direct_allowed(read.file)
            && direct_aligned(ptr, file_offset, len, align);
        slot.submitted_bytes = len;
        slot.direct = direct;
        let len32 = u32::try_from(len).map_err(|_| io::Error::other("SQE length exceeds u32"))?;
        let fixed_buf = self.fixed_buffer(ptr, len);
        let entry = match (self.registered_files, fixed_buf) {
            (true, Some(buf)) => {
                opcode::ReadFixed::new(types::Fixed(read.file * 2 + u32::from(direct)), ptr, len32, buf)
                    .offset(file_offset)
                    .build()
            }
            (true, None) => opcode::Read::new(types::Fixed(read.file * 2 + u32::from(direct)), ptr, len32)
                .offset(file_offset)
                .build(),
            (false, fixed) => {
                let fd = match (&source.direct, direct) {
                    (Some(d), true) => d.as_raw_fd(),
                    _ => source.buffered.as_raw_fd(),
                };
                match fixed {
                    Some(buf) => {
                        opcode::ReadFixed::new(types::Fd(fd), ptr, len32, buf).offset(file_offset).build()
                    }
                    None => opcode::Read::new(types::Fd(fd), ptr, len32).offset(file_offset).build(),
                }
            }
        }
        .user_data(slot_index as u64);
        // SAFETY: the SQE writes `len` bytes at `ptr`, which lies inside this read's destination
        // range (validated by `validate_job`); no other read targets that range, the destination
        // outlives the ring (see `Drop for Ring`), and the descriptors outlive the job.
        let pushed = unsafe { self.ring.submission().push(&entry) };
        if pushed.is_err() {
            // Cannot happen: slots never exceed the SQ size. Submit and retry once.
            self.ring.submit()?;
            // SAFETY: as above.
            unsafe { self.ring.submission().push(&entry) }
                .map_err(|_| io::Error::other("io_uring SQ full"))?;
        }
        self.in_flight += 1;
        Ok(())
    }

    /// Submits pushed SQEs and waits for at least `want` completions, then moves the CQEs into
    /// `self.reaped`. `EINTR`/`EBUSY` from the enter call are retried, bounded by
    /// [`ENTER_FAILURES_MAX`].
    fn wait(&mut self, want: usize) -> io::Result<()> {
        let mut failures = 0u32;
        loop {
            match self.ring.submit_and_wait(want) {
                Ok(_) => break,
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR | libc::EBUSY | libc::EAGAIN)) => {
                    failures += 1;
                    if !self.ring.completion().is_empty() {
                        break;
                    }
                    if failures > ENTER_FAILURES_MAX {
                        return Err(e);
                    }
                }
                Err(e) => return Err(e),
            }
        }
        self.reaped.clear();
        for cqe in self.ring.completion() {
            self.reaped.push((cqe.user_data(), cqe.result()));
        }
        self.in_flight -= self.reaped.len();
        Ok(())
    }

    /// Waits until no SQE is in flight, releasing every slot. Aborts the process if the kernel
    /// keeps refusing to return completions: continuing would free memory under a live read.
    fn drain(&mut self) {
        let mut failures = 0u32;
        while self.in_flight > 0 {
            match self.wait(self.in_flight) {
                Ok(()) => {
                    for i in 0..self.reaped.len() {
                        let slot_index = self.reaped[i].0 as usize;
                        if let Some(slot) = self.slots.get_mut(slot_index) {
                            *slot = None;
                            self.free_slots.push(slot_index);
                        }
                    }
                }
                Err(e) => {
                    failures += 1;
                    if failures > ENTER_FAILURES_MAX {
                        eprintln!(
                            "tensora-io: io_uring completions cannot be drained ({e}); \
                             aborting to protect memory"
                        );
                        std::process::abort();
                    }
                }
            }
        }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        self.drain();
    }
}

/// What happened to one completion.
enum Outcome {
    /// The whole read has landed.
    Landed,
    /// The remainder was resubmitted (or the read failed and the run is stopping).
    Pending,
}

/// Runs one ring as worker `worker`. A ring that cannot be created gives up quietly while
/// another ring of the run works (`rings_failed` counts them); only when every ring of the run
/// (`rings`) failed is the run failed, as [`ReadErrorKind::Unavailable`].
fn run_ring(
    job: &Job<'_>,
    sink: &dyn CompletionSink,
    state: &RunState,
    config: UringConfig,
    worker: usize,
    rings: usize,
    rings_failed: &AtomicUsize,
) -> IoStats {
    let mut stats = IoStats::default();
    let reads = job.plan.reads();
    let depth = job.queue_depth.clamp(1, QUEUE_DEPTH_MAX);
    let mut ring = match Ring::new(depth) {
        Ok(ring) => ring,
        Err(e) => {
            if rings_failed.fetch_add(1, Ordering::AcqRel) + 1 >= rings {
                state.fail(ReadError::run(ReadErrorKind::Unavailable(describe_setup_error(&e))));
            }
            return stats;
        }
    };
    if config.register_files {
        ring.register_files(job.files);
    }
    let base = DestPtr::new(job);
    if config.register_buffers {
        ring.register_buffers(base, job.dest.len_bytes());
    }
    let home = state.home(worker);
    let mut pending: Option<u32> = None;
    loop {
        // Fill free slots with new reads while the budget allows.
        while ring.has_free_slot() && !state.stopped() {
            let Some(index) = pending.take().or_else(|| state.claim(home)) else { break };
            let read = &reads[index as usize];
            if state.check_cancel(job, read) {
                break;
            }
            let permit = if ring.in_flight == 0 {
                job.budget.acquire(read.len_bytes)
            } else {
                match job.budget.try_acquire(read.len_bytes) {
                    Some(p) => p,
                    None => {
                        pending = Some(index);
                        break;
                    }
                }
            };
            let Some(slot_index) = ring.free_slots.pop() else {
                pending = Some(index);
                break;
            };
            state.begin_inflight(permit.bytes());
            let file_len_bytes = job.files[read.file as usize].len_bytes;
            ring.slots[slot_index] = Some(Slot {
                read: index,
                progress: ReadProgress::new(read, file_len_bytes, job.retries_max),
                submitted_bytes: 0,
                direct: false,
                permit,
            });
            if let Err(e) = ring.push(job, state, base, slot_index) {
                release(&mut ring, state, slot_index);
                state.fail(job_error(read, ReadErrorKind::Io(e)));
            }
        }
        if ring.in_flight == 0 {
            if state.stopped() || (pending.is_none() && state.all_claimed()) {
                break;
            }
            continue;
        }
        if let Err(e) = ring.wait(1) {
            // The ring itself failed: the error belongs to the run, not to one read.
            state.fail(ReadError::run(ReadErrorKind::Io(e)));
            break;
        }
        for i in 0..ring.reaped.len() {
            let (user_data, result) = ring.reaped[i];
            let slot_index = user_data as usize;
            match complete(&mut ring, job, state, base, slot_index, result, &mut stats) {
                Outcome::Landed => {
                    let index = ring.slots[slot_index].as_ref().map(|s| s.read);
                    release(&mut ring, state, slot_index);
                    if let Some(index) = index {
                        stats.reads += 1;
                        stats.bytes_read += reads[index as usize].len_bytes;
                        state.land(job, sink, index);
                    }
                }
                Outcome::Pending => {}
            }
        }
    }
    // `ring` drops here, draining anything still in flight (only after an error or a stop).
    drop(ring);
    stats
}

/// Frees a slot and its budget.
fn release(ring: &mut Ring, state: &RunState, slot_index: usize) {
    if let Some(slot) = ring.slots[slot_index].take() {
        state.end_inflight(slot.permit.bytes());
        ring.free_slots.push(slot_index);
    }
}

/// Handles one CQE for `slot_index` through the shared [`ReadProgress`] rules.
fn complete(
    ring: &mut Ring,
    job: &Job<'_>,
    state: &RunState,
    base: DestPtr,
    slot_index: usize,
    result: i32,
    stats: &mut IoStats,
) -> Outcome {
    let reads = job.plan.reads();
    let Some(slot) = ring.slots.get_mut(slot_index).and_then(Option::as_mut) else {
        return Outcome::Pending;
    };
    let read = &reads[slot.read as usize];
    let retries_before = slot.progress.retries();
    let outcome = if result < 0 { Err(-result) } else { Ok(result as u64) };
    let step = slot.progress.on_result(outcome, slot.submitted_bytes, slot.direct);
    stats.retries += slot.progress.retries() - retries_before;
    match step {
        Step::Landed => return Outcome::Landed,
        Step::Again { backoff } => {
            if let Some(backoff) = backoff {
                std::thread::sleep(backoff);
            }
        }
        Step::DirectRefused => {
            // The filesystem or device refused O_DIRECT: read this file buffered from now on.
            state.disable_direct(read.file);
            stats.direct_fallbacks += 1;
        }
        Step::Fail(kind) => {
            let err = slot.progress.error(kind);
            release(ring, state, slot_index);
            state.fail(err);
            return Outcome::Pending;
        }
    }
    if state.stopped() {
        release(ring, state, slot_index);
        return Outcome::Pending;
    }
    if let Err(e) = ring.push(job, state, base, slot_index) {
        let err = ring.slots[slot_index].as_ref().map(|s| s.progress.error(ReadErrorKind::Io(e)));
        release(ring, state, slot_index);
        if let Some(err) = err {
            state.fail(err);
        }
    }
    Outcome::Pending
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::JobConfig;
    use proptest::prelude::*;

    #[test]
    fn probe_is_stable_and_matches_available() {
        assert_eq!(probe(), probe());
        assert_eq!(UringBackend::default().available(), probe());
    }

    #[test]
    fn setup_errors_name_the_cause() {
        let eperm = describe_setup_error(&io::Error::from_raw_os_error(libc::EPERM));
        assert!(eperm.contains("container"), "{eperm}");
        let enosys = describe_setup_error(&io::Error::from_raw_os_error(libc::ENOSYS));
        assert!(enosys.contains("without io_uring"), "{enosys}");
    }

    #[test]
    fn default_config_registers_files_only() {
        let config = UringBackend::default().config();
        assert!(config.register_files);
        assert!(!config.register_buffers);
    }

    /// A real ring, a 64 KiB file and a one-read plan, driven CQE by CQE so that tests can
    /// replace a real completion's result with an injected one.
    struct Harness {
        _tmp: tempfile::NamedTempFile,
        files: Vec<SourceFile>,
        plan: tensora_plan::Plan,
        arena: crate::arena::Arena,
        budget: tensora_plan::Budget,
        cancel: AtomicBool,
        data: Vec<u8>,
    }

    const LEN: usize = 64 << 10;

    fn harness(claimed_len_bytes: u64) -> Harness {
        use std::io::Write;
        let data: Vec<u8> = (0..LEN).map(|i| (i * 31 % 253) as u8).collect();
        let mut tmp = tempfile::NamedTempFile::new().unwrap();
        tmp.write_all(&data).unwrap();
        let files = vec![SourceFile {
            path: tmp.path().to_path_buf(),
            len_bytes: claimed_len_bytes,
            buffered: std::fs::File::open(tmp.path()).unwrap(),
            direct: None,
        }];
        let extents = [tensora_plan::Extent { file: 0, offset_bytes: 0, len_bytes: LEN as u64, tag: 0 }];
        let config = tensora_plan::PlanConfig { chunk_bytes: 1 << 20, ..tensora_plan::PlanConfig::default() };
        let plan = tensora_plan::Plan::build(&extents, &config, &tensora_plan::Order::File).unwrap();
        assert_eq!(plan.reads().len(), 1);
        let arena = crate::arena::Arena::with_len(plan.arena_len_bytes()).unwrap();
        let budget = tensora_plan::Budget::new(1 << 20);
        Harness { _tmp: tmp, files, plan, arena, budget, cancel: AtomicBool::new(false), data }
    }

    impl Harness {
        fn job(&self, retries_max: u32) -> Job<'_> {
            // SAFETY: nothing else reads or writes the destination while this job runs.
            unsafe {
                Job::new(
                    &self.plan,
                    &self.files,
                    &self.arena,
                    &self.budget,
                    &self.cancel,
                    JobConfig { threads: 1, queue_depth: 4, direct: false, retries_max },
                )
            }
        }
    }

    /// Starts read 0 in slot 0.
    fn start(ring: &mut Ring, job: &Job<'_>, state: &RunState) {
        let slot_index = ring.free_slots.pop().unwrap();
        assert_eq!(slot_index, 0);
        let permit = job.budget.acquire(LEN as u64);
        state.begin_inflight(permit.bytes());
        let progress = ReadProgress::new(&job.plan.reads()[0], job.files[0].len_bytes, job.retries_max);
        ring.slots[0] = Some(Slot { read: 0, progress, submitted_bytes: 0, direct: false, permit });
        ring.push(job, state, DestPtr::new(job), 0).unwrap();
    }

    /// Waits for the real CQE of slot 0 and returns its result.
    fn next_result(ring: &mut Ring) -> i32 {
        ring.wait(1).unwrap();
        assert_eq!(ring.reaped.len(), 1);
        assert_eq!(ring.reaped[0].0, 0);
        ring.reaped[0].1
    }

    fn slot(ring: &Ring) -> &Slot {
        ring.slots[0].as_ref().unwrap()
    }

    #[test]
    fn eintr_and_eagain_resubmit_until_the_retry_bound() {
        let h = harness(LEN as u64);
        let job = h.job(2);
        let state = RunState::new(&job);
        let base = DestPtr::new(&job);
        let mut ring = Ring::new(4).unwrap();
        let mut stats = IoStats::default();
        start(&mut ring, &job, &state);
        for (injected, retries) in [(-libc::EINTR, 1), (-libc::EAGAIN, 2)] {
            next_result(&mut ring);
            let outcome = complete(&mut ring, &job, &state, base, 0, injected, &mut stats);
            assert!(matches!(outcome, Outcome::Pending));
            assert_eq!(ring.in_flight, 1, "the same read is in flight again");
            assert_eq!(slot(&ring).progress.stalls(), retries);
            assert_eq!(slot(&ring).progress.done_bytes(), 0);
        }
        next_result(&mut ring);
        let outcome = complete(&mut ring, &job, &state, base, 0, -libc::EINTR, &mut stats);
        assert!(matches!(outcome, Outcome::Pending));
        assert!(ring.slots[0].is_none(), "retries ran out: the slot is released");
        assert_eq!(job.budget.in_use_bytes(), 0);
        assert_eq!(stats.retries, 3);
        let err = state.finish(vec![stats]).unwrap_err();
        // The same kind and message as every backend (`read_progress`): the last errno's kind.
        assert!(matches!(err.kind, ReadErrorKind::Io(ref e) if e.kind() == io::ErrorKind::Interrupted
            && e.to_string().contains("gave up after 2 retries")));
    }

    #[test]
    fn a_short_read_resubmits_only_its_remainder() {
        let mut h = harness(LEN as u64);
        {
            let job = h.job(4);
            let state = RunState::new(&job);
            let base = DestPtr::new(&job);
            let mut ring = Ring::new(4).unwrap();
            let mut stats = IoStats::default();
            start(&mut ring, &job, &state);
            assert_eq!(next_result(&mut ring), LEN as i32);
            // SAFETY: the read's CQE was reaped, so nothing writes the arena; the range lies inside
            // it. Zeroing shows below which bytes the resubmission wrote.
            unsafe { std::ptr::write_bytes(base.at(h.plan.reads()[0].arena_offset_bytes), 0, LEN) };
            // Pretend only 1000 bytes arrived.
            let outcome = complete(&mut ring, &job, &state, base, 0, 1000, &mut stats);
            assert!(matches!(outcome, Outcome::Pending));
            assert_eq!(slot(&ring).progress.done_bytes(), 1000);
            assert_eq!(slot(&ring).submitted_bytes, LEN as u64 - 1000);
            let result = next_result(&mut ring);
            assert_eq!(result, LEN as i32 - 1000);
            let outcome = complete(&mut ring, &job, &state, base, 0, result, &mut stats);
            assert!(matches!(outcome, Outcome::Landed));
            assert_eq!(stats.retries, 1);
            release(&mut ring, &state, 0);
        }
        let at = h.plan.reads()[0].arena_offset_bytes as usize;
        let data = h.data.clone();
        let arena = h.arena.as_slice();
        assert!(arena[at..at + 1000].iter().all(|&b| b == 0), "the landed head was not read again");
        assert_eq!(&arena[at + 1000..at + LEN], &data[1000..]);
    }

    #[test]
    fn eof_before_the_planned_end_is_unexpected_eof() {
        // The file claims twice what it holds.
        let h = harness(2 * LEN as u64);
        let job = h.job(4);
        let state = RunState::new(&job);
        let base = DestPtr::new(&job);
        let mut ring = Ring::new(4).unwrap();
        let mut stats = IoStats::default();
        start(&mut ring, &job, &state);
        next_result(&mut ring);
        let outcome = complete(&mut ring, &job, &state, base, 0, 0, &mut stats);
        assert!(matches!(outcome, Outcome::Pending));
        assert!(ring.slots[0].is_none());
        let err = state.finish(vec![stats]).unwrap_err();
        assert!(matches!(err.kind, ReadErrorKind::UnexpectedEof { read_bytes: 0, expected_bytes }
                if expected_bytes == LEN as u64));
    }

    #[test]
    fn einval_on_a_direct_read_falls_back_to_buffered() {
        let h = harness(LEN as u64);
        let job = h.job(0);
        let state = RunState::new(&job);
        let base = DestPtr::new(&job);
        let mut ring = Ring::new(4).unwrap();
        let mut stats = IoStats::default();
        start(&mut ring, &job, &state);
        next_result(&mut ring);
        ring.slots[0].as_mut().unwrap().direct = true;
        let outcome = complete(&mut ring, &job, &state, base, 0, -libc::EINVAL, &mut stats);
        assert!(matches!(outcome, Outcome::Pending));
        assert_eq!(stats.direct_fallbacks, 1);
        assert_eq!(stats.retries, 0);
        assert!(!state.direct_allowed(0));
        assert!(!slot(&ring).direct);
        let result = next_result(&mut ring);
        assert!(matches!(complete(&mut ring, &job, &state, base, 0, result, &mut stats), Outcome::Landed));
        release(&mut ring, &state, 0);
        assert!(state.finish(vec![stats]).is_ok());
    }

    #[test]
    fn workers_claim_round_robin_across_file_queues() {
        let h = harness(LEN as u64);
        let files = [h.files[0].buffered.try_clone().unwrap(), h.files[0].buffered.try_clone().unwrap()].map(
            |buffered| SourceFile {
                path: h.files[0].path.clone(),
                len_bytes: LEN as u64,
                buffered,
                direct: None,
            },
        );
        // Two files, four 16 KiB reads each.
        let extents: Vec<tensora_plan::Extent> = (0..2)
            .map(|f| tensora_plan::Extent { file: f, offset_bytes: 0, len_bytes: LEN as u64, tag: f })
            .collect();
        let config =
            tensora_plan::PlanConfig { chunk_bytes: 16 << 10, ..tensora_plan::PlanConfig::default() };
        for (order, homes) in [
            (tensora_plan::Order::File, [0u32, 1, 0, 1]),
            (tensora_plan::Order::Priority(vec![1, 0]), [1, 1, 1, 1]),
        ] {
            let plan = tensora_plan::Plan::build(&extents, &config, &order).unwrap();
            assert_eq!(plan.reads().len(), 8);
            // SAFETY: the job only feeds `RunState`; nothing runs it.
            let job = unsafe {
                Job::new(
                    &plan,
                    &files,
                    &h.arena,
                    &h.budget,
                    &h.cancel,
                    JobConfig { threads: 2, queue_depth: 1, direct: false, retries_max: 0 },
                )
            };
            let state = RunState::new(&job);
            // Workers 0 and 1 claim in turn: under a file order both files are busy at once;
            // under a priority order both start on the most urgent queue (file 1's tensor).
            let claimed: Vec<u32> =
                (0..4).map(|i| plan.reads()[state.claim(state.home(i % 2)).unwrap() as usize].file).collect();
            assert_eq!(claimed, homes, "{order:?}");
            let mut rest = 0;
            while state.claim(0).is_some() {
                rest += 1;
            }
            assert_eq!(rest, 4);
            assert!(state.all_claimed());
        }
    }

    #[test]
    fn dropping_a_ring_waits_for_reads_in_flight() {
        let h = harness(LEN as u64);
        let job = h.job(0);
        let state = RunState::new(&job);
        let mut ring = Ring::new(4).unwrap();
        start(&mut ring, &job, &state);
        assert_eq!(ring.in_flight, 1);
        assert_eq!(job.budget.in_use_bytes(), LEN as u64);
        drop(ring);
        // The guard reaped the CQE and released the slot (and its permit).
        assert_eq!(job.budget.in_use_bytes(), 0);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        #[test]
        fn direct_alignment_requires_all_three(
            ptr in 0usize..1 << 20,
            off in 0u64..1 << 20,
            len in 0u64..1 << 20,
        ) {
            let align = 4096;
            let ok = direct_aligned(ptr as *const u8, off, len, align);
            prop_assert_eq!(ok, ptr % 4096 == 0 && off % 4096 == 0 && len % 4096 == 0);
        }
    }
}
