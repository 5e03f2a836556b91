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
//! resubmitted). The rules are those of `read_progress`, shared with the `sync` and `async`
//! backends: only zero-progress completions count against [`JobConfig::retries_max`], a read
//! returning 0 before the file's known end is [`ReadErrorKind::UnexpectedEof`], and `EINVAL` on an
//! `O_DIRECT` read marks that file as buffered-only and resubmits the remainder buffered. Errors
//! name the first byte that did not land. A ring that cannot be created leaves its share of the
//! work to the other rings; the run fails only when no ring could be created.
//!
//! # Example
//!
//! ```
//! use tensora_io::IoBackend;
//! use tensora_io::{UringBackend};
//!
//! let backend = UringBackend::default();
//! assert_eq!(backend.name(), "io-uring");
//! // The availability check is probed (ring creation), not guessed.
//! assert_eq!(backend.available().is_ok(), tensora_io::uring_probe().is_ok());
//! ```
//!
//! [`JobConfig::retries_max`]: crate::JobConfig::retries_max

use std::io;
use std::os::fd::AsRawFd;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

use io_uring::{IoUring, opcode, types};

use super::read_progress::{ReadProgress, Step};
use super::runtime::{
    DestPtr, RunState, direct_align_bytes, direct_aligned, job_error, run_workers, validate_job,
};
use crate::seam::{
    Access, CompletionSink, IoBackend, IoStats, Job, Permit, ReadError, ReadErrorKind, SourceFile,
};

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

/// Executes a plan with io_uring. See the module docs.
///
/// ```
/// use std::io::Write;
/// use std::sync::atomic::AtomicBool;
/// use tensora_io::Arena;
/// use tensora_io::{UringBackend};
/// use tensora_io::{CompletionSink, IoBackend, Job, JobConfig, Reading, SourceFile, StopReason};
/// use tensora_io::Budget;
/// use tensora_plan::{Extent, Order, Plan, PlanConfig};
///
/// struct Count(std::sync::atomic::AtomicU32);
/// impl CompletionSink for Count {
///     fn read_done(&self, _landed: tensora_io::Landed<'_>) -> Result<(), StopReason> {
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
/// if tensora_io::uring_probe().is_ok() {
///     // SAFETY: nothing else reads or writes the arena while this job runs.
///     let job = unsafe {
///         Job::new(
///             &plan,
///             std::slice::from_ref(&file),
///             &arena,
///             &budget,
///             &cancel,
///             JobConfig { threads: 2, queue_depth: 8, reading: Reading::ReadAhead { device_cost: None }, retries_max: 4 },
///         )
///     };
///     let stats = UringBackend::default().execute(&job, &sink)?;
///     assert_eq!(stats.reads as usize, plan.reads().len());
///     let at = plan.location(0).unwrap().arena_offset_bytes as usize;
///     assert_eq!(arena.as_slice()[at], (1000u32 % 256) as u8);
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct UringBackend {
    config: UringConfig,
    /// Faults applied to every completion (tests only).
    #[cfg(feature = "fault-injection")]
    faults: Option<std::sync::Arc<crate::fault::FaultPlan>>,
}

impl UringBackend {
    /// A backend with the given configuration.
    #[allow(clippy::needless_update)] // the fault-injection feature adds a field
    pub fn new(config: UringConfig) -> Self {
        Self { config, ..Self::default() }
    }

    /// This backend with `plan`'s faults applied to every completion (see [`crate::fault`]).
    #[cfg(feature = "fault-injection")]
    pub fn with_faults(self, plan: std::sync::Arc<crate::fault::FaultPlan>) -> Self {
        Self { faults: Some(plan), ..self }
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
        let rings = job.config.threads.clamp(1, RINGS_MAX).min(reads.len());
        let rings_failed = AtomicUsize::new(0);
        let per_ring = run_workers(rings, |w| run_ring(job, sink, &state, self, w, rings, &rings_failed));
        state.finish(per_ring)
    }
}

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
    /// Faults applied to every completion (tests only).
    #[cfg(feature = "fault-injection")]
    faults: Option<std::sync::Arc<crate::fault::FaultPlan>>,
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
            #[cfg(feature = "fault-injection")]
            faults: None,
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
        let direct = job.config.reading.is_direct()
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
    backend: &UringBackend,
    worker: usize,
    rings: usize,
    rings_failed: &AtomicUsize,
) -> IoStats {
    let mut stats = IoStats::default();
    let reads = job.plan.reads();
    let depth = job.config.queue_depth.clamp(1, QUEUE_DEPTH_MAX);
    let mut ring = match Ring::new(depth) {
        Ok(ring) => ring,
        Err(e) => {
            if rings_failed.fetch_add(1, Ordering::AcqRel) + 1 >= rings {
                state.fail(ReadError::run(ReadErrorKind::Unavailable(describe_setup_error(&e))));
            }
            return stats;
        }
    };
    #[cfg(feature = "fault-injection")]
    {
        ring.faults = backend.faults.clone();
    }
    let config = backend.config;
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
                progress: ReadProgress::new(read, file_len_bytes, job.config.retries_max),
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

/// What `plan` makes of the completion `result` of the call in `slot` (tests only).
#[cfg(feature = "fault-injection")]
fn fault_result(
    plan: &crate::fault::FaultPlan,
    read: &tensora_plan::Read,
    slot: &Slot,
    base: DestPtr,
    result: i32,
) -> i32 {
    let done = slot.progress.done_bytes();
    let len = slot.submitted_bytes as usize;
    // SAFETY: the call's CQE was reaped, so the kernel no longer writes this range; it lies inside
    // this read's destination range (checked by `validate_job`), which only this slot touches.
    let buf = unsafe { std::slice::from_raw_parts_mut(base.at(read.arena_offset_bytes + done), len) };
    let real = if result < 0 { Err(io::Error::from_raw_os_error(-result)) } else { Ok(result as usize) };
    match plan.rewrite(read.file, read.offset_bytes + done, Access::direct_if(slot.direct), buf, real) {
        Ok(n) => i32::try_from(n).unwrap_or(i32::MAX),
        Err(e) => -e.raw_os_error().unwrap_or(libc::EIO),
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
    #[cfg(feature = "fault-injection")]
    let result = match &ring.faults {
        Some(plan) => fault_result(plan, read, slot, base, result),
        None => result,
    };
    let outcome = if result < 0 { Err(-result) } else { Ok(result as u64) };
    let step = slot.progress.on_result(outcome, slot.submitted_bytes, Access::direct_if(slot.direct));
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
mod tests;
