//! The `async` backend (cargo feature `async`): [`AsyncBackend`] drives a plan's reads from a tokio
//! runtime: a current-thread runtime created inside `execute` issues positional reads on tokio's
//! blocking pool, at most `job.config.queue_depth` in flight, each holding a budget permit obtained with
//! [`Budget::acquire_async`](crate::seam::Budget::acquire_async). Completions are announced from
//! the runtime's thread, in completion order. `job.config.threads` is not used: the blocking pool gets
//! `job.config.queue_depth` threads (at most [`ASYNC_QUEUE_DEPTH_MAX`]). To run a whole load from async
//! code, see [`load_async`](crate::load_async).
//!
//! ```
//! use tensora_io::IoBackend;
//! use tensora_io::AsyncBackend;
//!
//! assert_eq!(AsyncBackend::default().name(), "async");
//! ```

use std::io;
use std::os::fd::{AsRawFd, RawFd};

use tensora_plan::Read;
use tokio::task::JoinSet;

use super::read_progress::{ReadProgress, Step};
use super::runtime::{DestPtr, RunState, direct_align_bytes, direct_aligned, validate_job};
use crate::seam::{Access, CompletionSink, IoBackend, IoStats, Job, Permit, ReadError, ReadErrorKind};

/// Largest number of reads in flight (and blocking-pool threads) one run uses.
pub const ASYNC_QUEUE_DEPTH_MAX: u32 = 256;

/// Drives reads from a tokio runtime; see the module docs.
#[derive(Debug, Clone, Default)]
pub struct AsyncBackend {
    /// Faults applied to every positional read (tests only).
    #[cfg(feature = "fault-injection")]
    faults: Option<std::sync::Arc<crate::fault::FaultPlan>>,
}

impl AsyncBackend {
    /// This backend with `plan`'s faults applied to every positional read (see [`crate::fault`]).
    #[cfg(feature = "fault-injection")]
    pub fn with_faults(self, plan: std::sync::Arc<crate::fault::FaultPlan>) -> Self {
        Self { faults: Some(plan) }
    }

    /// What each read task needs besides its read: the fault plan, in tests.
    fn task_faults(&self) -> TaskFaults {
        #[cfg(feature = "fault-injection")]
        return self.faults.clone();
        #[cfg(not(feature = "fault-injection"))]
        return NoFaults;
    }
}

/// The faults a read task applies (tests only).
#[cfg(feature = "fault-injection")]
type TaskFaults = Option<std::sync::Arc<crate::fault::FaultPlan>>;
/// Without the `fault-injection` feature a read task applies none.
#[cfg(not(feature = "fault-injection"))]
type TaskFaults = NoFaults;
/// No faults.
#[cfg(not(feature = "fault-injection"))]
#[derive(Debug, Clone, Copy)]
struct NoFaults;

impl IoBackend for AsyncBackend {
    fn name(&self) -> &'static str {
        "async"
    }

    fn execute(&self, job: &Job<'_>, sink: &dyn CompletionSink) -> Result<IoStats, ReadError> {
        validate_job(job)?;
        let reads = job.plan.reads();
        if reads.is_empty() {
            return Ok(IoStats::default());
        }
        if tokio::runtime::Handle::try_current().is_ok() {
            // Called from inside a runtime (e.g. a tokio worker): a runtime cannot be started on
            // this thread, so drive ours from a scoped thread of its own.
            std::thread::scope(|scope| match scope.spawn(|| run(job, sink, self.task_faults())).join() {
                Ok(result) => result,
                Err(payload) => std::panic::resume_unwind(payload),
            })
        } else {
            run(job, sink, self.task_faults())
        }
    }
}

fn run(job: &Job<'_>, sink: &dyn CompletionSink, faults: TaskFaults) -> Result<IoStats, ReadError> {
    let depth = job.config.queue_depth.clamp(1, ASYNC_QUEUE_DEPTH_MAX) as usize;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .max_blocking_threads(depth)
        .thread_name("tensora-async-io")
        .build()
        .map_err(|e| ReadError::run(ReadErrorKind::Unavailable(format!("tokio runtime: {e}"))))?;
    let state = RunState::new(job);
    // The runtime is dropped before this function returns, on every path including unwinding,
    // and dropping it waits for every blocking read that has started: no read can outlive the
    // destination or the file descriptors.
    let stats = runtime.block_on(drive(job, sink, &state, depth, faults));
    drop(runtime);
    state.finish(vec![stats])
}

/// What a blocking read task hands back.
struct Done {
    index: u32,
    retries: u64,
    direct_fallback: bool,
    /// Bytes that landed before `result` (names the failing byte on error).
    done_bytes: u64,
    result: Result<(), ReadErrorKind>,
}

async fn drive(
    job: &Job<'_>,
    sink: &dyn CompletionSink,
    state: &RunState,
    depth: usize,
    faults: TaskFaults,
) -> IoStats {
    let reads = job.plan.reads();
    let base = DestPtr::new(job);
    let align = direct_align_bytes(job);
    let mut stats = IoStats::default();
    // Each task hands its permit back with its result; this loop releases it.
    let mut tasks: JoinSet<(Done, Permit)> = JoinSet::new();
    let mut pending: Option<u32> = None;
    let mut next_home = 0usize;
    loop {
        while tasks.len() < depth && !state.stopped() {
            // One driver: rotate the home queue so that every file has reads in flight.
            let home = state.home(next_home);
            let Some(index) = pending.take().or_else(|| state.claim(home)) else { break };
            next_home = next_home.wrapping_add(1);
            let read = &reads[index as usize];
            if state.check_cancel(job, read) {
                break;
            }
            // Permits of finished reads are only released below, by this loop: wait for budget
            // only when nothing is in flight, else collect a completion first.
            let permit = if tasks.is_empty() {
                job.budget.acquire_async(read.len_bytes).await
            } else if let Some(permit) = job.budget.try_acquire(read.len_bytes) {
                permit
            } else {
                pending = Some(index);
                break;
            };
            state.begin_inflight(permit.bytes());
            let file = &job.files[read.file as usize];
            let spec = ReadSpec {
                read: read.clone(),
                buffered_fd: file.buffered.as_raw_fd(),
                direct_fd: if job.config.reading.is_direct() && state.direct_allowed(read.file) {
                    file.direct.as_ref().map(AsRawFd::as_raw_fd)
                } else {
                    None
                },
                direct_align_bytes: align,
                file_len_bytes: file.len_bytes,
                dest: base,
                retries_max: job.config.retries_max,
                #[allow(clippy::clone_on_copy)] // `NoFaults` is `Copy`, the injector's plan is not
                faults: faults.clone(),
            };
            tasks.spawn_blocking(move || (spec.execute(index), permit));
        }
        let Some(joined) = tasks.join_next().await else {
            if pending.is_some() && !state.stopped() {
                continue;
            }
            break;
        };
        let (done, permit) = match joined {
            Ok(done) => done,
            Err(e) => match e.try_into_panic() {
                Ok(payload) => std::panic::resume_unwind(payload),
                Err(e) => {
                    // A read task that was cancelled rather than run: the run's error, not a read's.
                    state.fail(ReadError::run(ReadErrorKind::Io(io::Error::other(e.to_string()))));
                    continue;
                }
            },
        };
        let read = &reads[done.index as usize];
        stats.retries += done.retries;
        if done.direct_fallback {
            stats.direct_fallbacks += 1;
            state.disable_direct(read.file);
        }
        // The bytes have landed (or the read failed): its budget is free again.
        state.end_inflight(permit.bytes());
        drop(permit);
        match done.result {
            Ok(()) => {
                stats.reads += 1;
                stats.bytes_read += read.len_bytes;
                state.land(job, sink, done.index);
            }
            Err(kind) => state.fail(ReadError {
                file: read.file,
                offset_bytes: read.offset_bytes + done.done_bytes,
                len_bytes: read.len_bytes - done.done_bytes,
                kind,
            }),
        }
    }
    stats
}

/// Everything one blocking read needs, owned so that it can move to the blocking pool.
struct ReadSpec {
    read: Read,
    buffered_fd: RawFd,
    /// The `O_DIRECT` descriptor, when this read may use it.
    direct_fd: Option<RawFd>,
    direct_align_bytes: u64,
    /// The file's known length: end of file at or past it ends the read successfully.
    file_len_bytes: u64,
    dest: DestPtr,
    retries_max: u32,
    /// Faults applied to every call (tests only).
    #[allow(dead_code)] // Read only with the `fault-injection` feature.
    faults: TaskFaults,
}

impl ReadSpec {
    /// `pread`s the whole read into the destination: retries `EINTR`/`EAGAIN`/short reads up to
    /// `retries_max` times, falls back from `O_DIRECT` to buffered on `EINVAL`.
    fn execute(&self, index: u32) -> Done {
        self.execute_with(index, |fd, buf, len, offset| {
            // SAFETY: `buf..buf + len` lies inside this read's destination range (validated by
            // `validate_job`), which no other read targets; the destination and the descriptor
            // outlive this task because the runtime running it is dropped (waiting for it) before
            // `execute` returns.
            let got = unsafe { libc::pread(fd, buf.cast(), len, offset) };
            let real = usize::try_from(got).map_err(|_| io::Error::last_os_error());
            #[cfg(feature = "fault-injection")]
            if let Some(plan) = &self.faults {
                // SAFETY: as above; the call returned, so nothing else writes `buf..buf + len`.
                let landed = unsafe { std::slice::from_raw_parts_mut(buf, len) };
                let access = Access::direct_if(fd != self.buffered_fd);
                return plan.rewrite(self.read.file, offset as u64, access, landed, real);
            }
            real
        })
    }

    /// [`ReadSpec::execute`] with the positional read passed in (tests inject faults here).
    fn execute_with(
        &self,
        index: u32,
        mut pread: impl FnMut(RawFd, *mut u8, usize, libc::off_t) -> io::Result<usize>,
    ) -> Done {
        let mut done = Done { index, retries: 0, direct_fallback: false, done_bytes: 0, result: Ok(()) };
        let read = &self.read;
        let mut progress = ReadProgress::new(read, self.file_len_bytes, self.retries_max);
        let mut direct_fd = self.direct_fd;
        loop {
            let call = progress.next_call(direct_fd.map(|_| self.direct_align_bytes));
            let ptr = self.dest.at(read.arena_offset_bytes + call.done_bytes);
            let fd = match direct_fd {
                Some(fd)
                    if direct_aligned(
                        ptr,
                        call.file_offset_bytes,
                        call.len_bytes,
                        self.direct_align_bytes,
                    ) =>
                {
                    fd
                }
                _ => self.buffered_fd,
            };
            let direct = fd != self.buffered_fd;
            let Ok(file_offset) = libc::off_t::try_from(call.file_offset_bytes) else {
                done.done_bytes = progress.done_bytes();
                done.result = Err(ReadErrorKind::Io(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "offset exceeds off_t",
                )));
                return done;
            };
            // `next_call` caps the length at 1 GiB, so it fits usize.
            let result = pread(fd, ptr, call.len_bytes as usize, file_offset);
            let step = progress.on_io_result(&result, call.len_bytes, Access::direct_if(direct));
            done.retries = progress.retries();
            done.done_bytes = progress.done_bytes();
            match step {
                Step::Landed => return done,
                Step::Again { backoff } => {
                    if let Some(backoff) = backoff {
                        std::thread::sleep(backoff);
                    }
                }
                Step::DirectRefused => {
                    direct_fd = None;
                    done.direct_fallback = true;
                }
                Step::Fail(kind) => {
                    done.result = Err(kind);
                    return done;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::ptr::NonNull;

    struct Fixture {
        _tmp: tempfile::NamedTempFile,
        file: std::fs::File,
        data: Vec<u8>,
        dest: Vec<u8>,
    }

    fn fixture(len: usize) -> Fixture {
        let data: Vec<u8> = (0..len).map(|i| (i * 13 % 251) as u8).collect();
        let mut tmp = tempfile::NamedTempFile::new().unwrap();
        tmp.write_all(&data).unwrap();
        let file = std::fs::File::open(tmp.path()).unwrap();
        Fixture { _tmp: tmp, file, data, dest: vec![0; len] }
    }

    fn spec(f: &mut Fixture, file_len_bytes: u64, retries_max: u32, direct_fd: Option<RawFd>) -> ReadSpec {
        let len = f.dest.len() as u64;
        ReadSpec {
            read: Read { file: 0, offset_bytes: 0, len_bytes: len, arena_offset_bytes: 0, pieces: 0..0 },
            buffered_fd: f.file.as_raw_fd(),
            direct_fd,
            direct_align_bytes: 512,
            file_len_bytes,
            dest: DestPtr::from_nonnull(NonNull::new(f.dest.as_mut_ptr()).unwrap()),
            retries_max,
            faults: AsyncBackend::default().task_faults(),
        }
    }

    /// A real `pread`, at most `cap` bytes at a time.
    fn real_pread(fd: RawFd, buf: *mut u8, len: usize, offset: libc::off_t, cap: usize) -> io::Result<usize> {
        // SAFETY: `buf` points into the fixture's `dest` vector and `len` never exceeds what is
        // left of it (the caller, `execute_with`, passes the remainder of the read).
        let got = unsafe { libc::pread(fd, buf.cast(), len.min(cap), offset) };
        usize::try_from(got).map_err(|_| io::Error::last_os_error())
    }

    #[test]
    fn eintr_and_eagain_are_retried_within_the_bound() {
        let mut f = fixture(10_000);
        let mut calls = 0;
        let done = spec(&mut f, 10_000, 2, None).execute_with(0, |fd, buf, len, off| {
            calls += 1;
            match calls {
                1 => Err(io::Error::from_raw_os_error(libc::EINTR)),
                2 => Err(io::Error::from_raw_os_error(libc::EAGAIN)),
                _ => real_pread(fd, buf, len, off, usize::MAX),
            }
        });
        assert!(done.result.is_ok());
        assert_eq!(done.retries, 2);
        assert_eq!(f.dest, f.data);

        let mut f = fixture(10_000);
        let done = spec(&mut f, 10_000, 2, None)
            .execute_with(0, |_, _, _, _| Err(io::Error::from_raw_os_error(libc::EINTR)));
        assert!(matches!(done.result, Err(ReadErrorKind::Io(ref e))
            if e.kind() == io::ErrorKind::Interrupted && e.to_string().contains("gave up after 2 retries")));
        assert_eq!(done.retries, 3);
    }

    #[test]
    fn short_reads_continue_with_the_remainder() {
        let mut f = fixture(10_000);
        let mut offsets = Vec::new();
        let done = spec(&mut f, 10_000, 16, None).execute_with(0, |fd, buf, len, off| {
            offsets.push(off);
            real_pread(fd, buf, len, off, 3000)
        });
        assert!(done.result.is_ok());
        assert_eq!(offsets, [0, 3000, 6000, 9000]);
        assert_eq!(done.retries, 3);
        assert_eq!(f.dest, f.data);

        // Short reads that make progress do not consume the retry bound (a FUSE filesystem
        // returning 3000 bytes per call), even with retries_max = 0.
        let mut f = fixture(10_000);
        let done = spec(&mut f, 10_000, 0, None)
            .execute_with(0, |fd, buf, len, off| real_pread(fd, buf, len, off, 3000));
        assert!(done.result.is_ok());
        assert_eq!(done.retries, 3);
        assert_eq!(f.dest, f.data);

        // A source that always returns 1 byte hits the bound on calls per read.
        let mut f = fixture(100_000);
        let mut calls = 0u64;
        let done = spec(&mut f, 100_000, 1, None).execute_with(0, |fd, buf, len, off| {
            calls += 1;
            real_pread(fd, buf, len, off, 1)
        });
        assert!(matches!(done.result, Err(ReadErrorKind::Io(ref e)) if e.to_string().contains("calls")));
        assert_eq!(calls, 100_000u64.div_ceil(4096) + 1 + 2);
        assert_eq!(done.done_bytes, calls);
    }

    #[test]
    fn eof_before_the_known_end_fails_and_padding_past_it_succeeds() {
        let mut f = fixture(10_000);
        let done = spec(&mut f, 20_000, 4, None).execute_with(0, |fd, buf, len, off| {
            if off >= 4000 { Ok(0) } else { real_pread(fd, buf, len, off, 4000) }
        });
        assert!(matches!(
            done.result,
            Err(ReadErrorKind::UnexpectedEof { read_bytes: 4000, expected_bytes: 10_000 })
        ));
        // The file's known length is 4000: the rest of the read is alignment padding.
        let mut f = fixture(10_000);
        let done = spec(&mut f, 4000, 4, None).execute_with(0, |fd, buf, len, off| {
            if off >= 4000 { Ok(0) } else { real_pread(fd, buf, len, off, 4000) }
        });
        assert!(done.result.is_ok());
        assert_eq!(f.dest[..4000], f.data[..4000]);
    }

    #[test]
    fn permanent_errors_are_not_retried() {
        let mut f = fixture(4096);
        let mut calls = 0;
        let done = spec(&mut f, 4096, 8, None).execute_with(0, |_, _, _, _| {
            calls += 1;
            Err(io::Error::from_raw_os_error(libc::EIO))
        });
        assert!(matches!(done.result, Err(ReadErrorKind::Io(ref e)) if e.raw_os_error() == Some(libc::EIO)));
        assert_eq!(calls, 1);
        assert_eq!(done.retries, 0);
    }

    #[test]
    fn einval_on_direct_falls_back_to_buffered() {
        let mut f = fixture(8192);
        // Stand-in descriptor number for the O_DIRECT file: the fake read refuses it.
        let direct_fd = -7;
        let mut used = Vec::new();
        let mut direct = spec(&mut f, 8192, 0, Some(direct_fd));
        // A Vec is not block-aligned; alignment is not what this test is about.
        direct.direct_align_bytes = 1;
        let done = direct.execute_with(0, |fd, buf, len, off| {
            used.push(fd);
            if fd == direct_fd {
                Err(io::Error::from_raw_os_error(libc::EINVAL))
            } else {
                real_pread(fd, buf, len, off, usize::MAX)
            }
        });
        assert!(done.result.is_ok());
        assert!(done.direct_fallback);
        assert_eq!(done.retries, 0);
        assert_eq!(used, [direct_fd, f.file.as_raw_fd()]);
        assert_eq!(f.dest, f.data);
    }
}
