//! The per-read progress state machine shared by the `sync`, `io-uring` and `async` backends, so
//! that they agree on every rule of a positional read:
//!
//! - **Progress is not a retry.** A short read that lands bytes resubmits the remainder and is
//!   counted in [`IoStats::retries`](crate::IoStats::retries), but it does not consume the retry
//!   budget: only zero-progress events (`EINTR`, `EAGAIN`) do, at most `retries_max` per read. A
//!   FUSE filesystem returning 128 KiB per call still completes an 8 MiB read.
//! - **Every read is bounded.** The calls one read may make are capped at
//!   `ceil(len / 4 KiB) + retries_max + 2` ([`ReadProgress::calls_max`]); each call asks for at
//!   most [`PREAD_BYTES_MAX`] (Linux returns at most `0x7ffff000` bytes per call anyway).
//! - **End of file.** A read returning 0 bytes before the file's known length fails with
//!   [`ReadErrorKind::UnexpectedEof`]; a read that reaches the known length has landed (the rest
//!   is alignment padding that no extent uses).
//! - **`O_DIRECT` refused.** `EINVAL` on a direct call is [`Step::DirectRefused`]: the backend
//!   disables direct I/O for the whole *file* and reissues the remainder buffered. Not a retry.
//! - **`EAGAIN` backs off** 100 µs doubling per stall, capped at [`EAGAIN_BACKOFF_MAX`].
//! - **Errors name the byte**: [`ReadProgress::error`] reports `offset + done_bytes`.

use std::io;
use std::time::Duration;

use tensora_plan::Read;

use crate::seam::{Access, ReadError, ReadErrorKind};

/// Largest length one positional read call asks for.
pub const PREAD_BYTES_MAX: u64 = 1 << 30;
/// Longest single back-off after `EAGAIN`.
pub const EAGAIN_BACKOFF_MAX: Duration = Duration::from_millis(10);
/// Progress unit used to bound the calls of one read: every call that is not a stall lands at
/// least one byte, and a filesystem is assumed to return at least this much per successful call.
const CALL_PROGRESS_BYTES_MIN: u64 = 4096;
/// First `EAGAIN` back-off, doubled per stall.
const EAGAIN_BACKOFF_FIRST: Duration = Duration::from_micros(100);

/// What a backend does after one call of a read returned.
#[derive(Debug)]
pub enum Step {
    /// Issue the remainder ([`ReadProgress::next_call`]), after sleeping `backoff` if any.
    Again {
        /// How long to wait first (after `EAGAIN`); `None`: at once.
        backoff: Option<Duration>,
    },
    /// Every byte of the read has landed (or the read reached the file's known end).
    Landed,
    /// The `O_DIRECT` descriptor refused the call with `EINVAL`: disable direct I/O for this file
    /// and reissue the remainder buffered.
    DirectRefused,
    /// The read failed; [`ReadProgress::error`] names the byte.
    Fail(ReadErrorKind),
}

/// One call to issue: `len_bytes` from file offset `file_offset_bytes` into the read's
/// destination at `done_bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Call {
    /// Where in the file the call reads.
    pub file_offset_bytes: u64,
    /// Bytes of the read already landed: where in the read's destination the call writes.
    pub done_bytes: u64,
    /// Bytes the call asks for.
    pub len_bytes: u64,
}

/// Progress of one plan read. See the [module docs](self).
#[derive(Debug, Clone)]
pub struct ReadProgress {
    file: u32,
    offset_bytes: u64,
    len_bytes: u64,
    file_len_bytes: u64,
    done_bytes: u64,
    stalls: u32,
    stalls_max: u32,
    calls: u64,
    calls_max: u64,
    retries: u64,
}

impl ReadProgress {
    /// Progress of `read` over a file of `file_len_bytes` (known length), allowing `retries_max`
    /// zero-progress events.
    pub fn new(read: &Read, file_len_bytes: u64, retries_max: u32) -> Self {
        let calls_max = read
            .len_bytes
            .div_ceil(CALL_PROGRESS_BYTES_MIN)
            .saturating_add(u64::from(retries_max))
            .saturating_add(2);
        Self {
            file: read.file,
            offset_bytes: read.offset_bytes,
            len_bytes: read.len_bytes,
            file_len_bytes,
            done_bytes: 0,
            stalls: 0,
            stalls_max: retries_max,
            calls: 0,
            calls_max,
            retries: 0,
        }
    }

    /// Bytes of the read that have landed.
    pub fn done_bytes(&self) -> u64 {
        self.done_bytes
    }

    /// Zero-progress events so far (what `retries_max` bounds).
    #[cfg(test)]
    pub fn stalls(&self) -> u32 {
        self.stalls
    }

    /// Transient events so far (stalls and short reads): what goes to `IoStats::retries`.
    pub fn retries(&self) -> u64 {
        self.retries
    }

    /// The most calls this read may make.
    #[cfg(test)]
    pub fn calls_max(&self) -> u64 {
        self.calls_max
    }

    /// The next call: the remainder, capped at [`PREAD_BYTES_MAX`]; with `direct_align_bytes`
    /// (a power of two) a capped length is rounded down to it so the next call stays aligned.
    pub fn next_call(&self, direct_align_bytes: Option<u64>) -> Call {
        self.next_call_within(direct_align_bytes, PREAD_BYTES_MAX)
    }

    /// [`ReadProgress::next_call`], capped at `cap_bytes` (a multiple of the direct alignment, so
    /// capped calls stay aligned).
    pub fn next_call_within(&self, direct_align_bytes: Option<u64>, cap_bytes: u64) -> Call {
        let remaining = self.len_bytes - self.done_bytes;
        // A cap below the direct alignment would round a call down to nothing: round it up.
        let cap_bytes = match direct_align_bytes.filter(|a| a.is_power_of_two()) {
            Some(align) => cap_bytes.max(1).checked_next_multiple_of(align).unwrap_or(u64::MAX),
            None => cap_bytes.max(1),
        };
        let mut len_bytes = remaining.min(PREAD_BYTES_MAX).min(cap_bytes);
        if let Some(align) = direct_align_bytes.filter(|a| a.is_power_of_two() && *a <= PREAD_BYTES_MAX)
            && len_bytes < remaining
        {
            len_bytes -= len_bytes % align;
        }
        Call {
            file_offset_bytes: self.offset_bytes + self.done_bytes,
            done_bytes: self.done_bytes,
            len_bytes,
        }
    }

    /// Feeds the result of a call that asked for `asked_bytes` (`Ok(bytes)` or `Err(errno)`),
    /// issued through the `O_DIRECT` descriptor when `direct`.
    pub fn on_result(&mut self, result: Result<u64, i32>, asked_bytes: u64, access: Access) -> Step {
        self.calls += 1;
        let step = match result {
            Ok(0) if self.at_known_end() => Step::Landed,
            Ok(0) => Step::Fail(ReadErrorKind::UnexpectedEof {
                read_bytes: self.done_bytes,
                expected_bytes: self.len_bytes,
            }),
            Ok(got) => {
                self.done_bytes += got.min(asked_bytes).min(self.len_bytes - self.done_bytes);
                if self.done_bytes >= self.len_bytes || self.at_known_end() {
                    Step::Landed
                } else {
                    if got < asked_bytes {
                        self.retries += 1;
                    }
                    Step::Again { backoff: None }
                }
            }
            Err(libc::EINVAL) if access == Access::Direct => Step::DirectRefused,
            Err(errno @ (libc::EINTR | libc::EAGAIN)) => {
                self.retries += 1;
                if self.stalls >= self.stalls_max {
                    let last = io::Error::from_raw_os_error(errno);
                    return Step::Fail(ReadErrorKind::Io(io::Error::new(
                        last.kind(),
                        format!("gave up after {} retries: {last}", self.stalls),
                    )));
                }
                self.stalls += 1;
                let backoff = (errno == libc::EAGAIN).then(|| {
                    EAGAIN_BACKOFF_FIRST
                        .saturating_mul(1 << (self.stalls - 1).min(10))
                        .min(EAGAIN_BACKOFF_MAX)
                });
                Step::Again { backoff }
            }
            Err(errno) => Step::Fail(ReadErrorKind::Io(io::Error::from_raw_os_error(errno))),
        };
        if matches!(step, Step::Again { .. } | Step::DirectRefused) && self.calls >= self.calls_max {
            return Step::Fail(ReadErrorKind::Io(io::Error::other(format!(
                "gave up after {} calls for {} bytes ({} landed)",
                self.calls, self.len_bytes, self.done_bytes
            ))));
        }
        step
    }

    /// Feeds an [`io::Result`] (a `pread`-like call).
    pub fn on_io_result(&mut self, result: &io::Result<usize>, asked_bytes: u64, access: Access) -> Step {
        match result {
            Ok(n) => self.on_result(Ok(*n as u64), asked_bytes, access),
            Err(e) => match e.raw_os_error() {
                Some(errno) => self.on_result(Err(errno), asked_bytes, access),
                None if e.kind() == io::ErrorKind::Interrupted => {
                    self.on_result(Err(libc::EINTR), asked_bytes, access)
                }
                None if e.kind() == io::ErrorKind::WouldBlock => {
                    self.on_result(Err(libc::EAGAIN), asked_bytes, access)
                }
                None => {
                    self.calls += 1;
                    Step::Fail(ReadErrorKind::Io(io::Error::new(e.kind(), e.to_string())))
                }
            },
        }
    }

    /// A [`ReadError`] naming the first byte that did not land.
    pub fn error(&self, kind: ReadErrorKind) -> ReadError {
        ReadError {
            file: self.file,
            offset_bytes: self.offset_bytes + self.done_bytes,
            len_bytes: self.len_bytes - self.done_bytes,
            kind,
        }
    }

    fn at_known_end(&self) -> bool {
        self.offset_bytes.saturating_add(self.done_bytes) >= self.file_len_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn read(offset_bytes: u64, len_bytes: u64) -> Read {
        Read { file: 3, offset_bytes, len_bytes, arena_offset_bytes: 0, pieces: 0..0 }
    }

    #[test]
    fn a_cap_below_the_direct_alignment_is_rounded_up_not_to_zero() {
        let p = ReadProgress::new(&read(0, 8 << 20), 8 << 20, 8);
        let call = p.next_call_within(Some(2 << 20), 1 << 20);
        assert_eq!(call.len_bytes, 2 << 20);
        assert_eq!(p.next_call_within(None, 1 << 20).len_bytes, 1 << 20);
        assert_eq!(p.next_call_within(Some(4096), 0).len_bytes, 4096);
    }

    #[test]
    fn progressing_short_reads_do_not_consume_retries() {
        // 8 MiB at 128 KiB per call with retries_max = 8: 64 calls, no failure.
        let len = 8u64 << 20;
        let mut p = ReadProgress::new(&read(0, len), len, 8);
        let mut calls = 0;
        loop {
            let call = p.next_call(None);
            calls += 1;
            match p.on_result(Ok(call.len_bytes.min(128 << 10)), call.len_bytes, Access::Buffered) {
                Step::Again { backoff: None } => {}
                Step::Landed => break,
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(calls, 64);
        assert_eq!(p.done_bytes(), len);
        assert_eq!(p.stalls(), 0);
        assert_eq!(p.retries(), 63);
    }

    #[test]
    fn stalls_beyond_the_bound_fail_with_the_last_errno_kind() {
        let mut p = ReadProgress::new(&read(100, 1000), 10_000, 2);
        assert!(matches!(
            p.on_result(Err(libc::EINTR), 1000, Access::Buffered),
            Step::Again { backoff: None }
        ));
        assert!(matches!(
            p.on_result(Err(libc::EAGAIN), 1000, Access::Buffered),
            Step::Again { backoff: Some(_) }
        ));
        match p.on_result(Err(libc::EINTR), 1000, Access::Buffered) {
            Step::Fail(ReadErrorKind::Io(e)) => {
                assert_eq!(e.kind(), io::ErrorKind::Interrupted);
                assert!(e.to_string().contains("gave up after 2 retries"), "{e}");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(p.retries(), 3);
    }

    #[test]
    fn eof_before_the_known_end_fails_and_at_the_known_end_lands() {
        let mut p = ReadProgress::new(&read(0, 8192), 8192, 4);
        assert!(matches!(p.on_result(Ok(1000), 8192, Access::Buffered), Step::Again { .. }));
        match p.on_result(Ok(0), 7192, Access::Buffered) {
            Step::Fail(ReadErrorKind::UnexpectedEof { read_bytes: 1000, expected_bytes: 8192 }) => {}
            other => panic!("{other:?}"),
        }
        let e = p.error(ReadErrorKind::Cancelled);
        assert_eq!((e.file, e.offset_bytes, e.len_bytes), (3, 1000, 7192));
        // A read rounded past the end of a 5000-byte file lands once the file's end is reached.
        let mut p = ReadProgress::new(&read(0, 8192), 5000, 4);
        assert!(matches!(p.on_result(Ok(5000), 8192, Access::Buffered), Step::Landed));
        let mut p = ReadProgress::new(&read(4096, 4096), 5000, 4);
        assert!(matches!(p.on_result(Ok(100), 4096, Access::Buffered), Step::Again { .. }));
        assert!(matches!(p.on_result(Ok(0), 3996, Access::Buffered), Step::Fail(_)));
    }

    #[test]
    fn einval_only_refuses_direct_calls() {
        let mut p = ReadProgress::new(&read(0, 4096), 4096, 0);
        assert!(matches!(p.on_result(Err(libc::EINVAL), 4096, Access::Direct), Step::DirectRefused));
        assert!(matches!(
            p.on_result(Err(libc::EINVAL), 4096, Access::Buffered),
            Step::Fail(ReadErrorKind::Io(_))
        ));
    }

    #[test]
    fn calls_are_capped_at_a_gibibyte_and_direct_calls_stay_aligned() {
        let len = (3u64 << 30) + 512;
        let mut p = ReadProgress::new(&read(0, len), len, 0);
        assert_eq!(p.next_call(None).len_bytes, PREAD_BYTES_MAX);
        // Linux returns at most 0x7ffff000 bytes; the remainder continues at the landed byte.
        assert!(matches!(
            p.on_result(Ok(0x7fff_f000), PREAD_BYTES_MAX, Access::Buffered),
            Step::Again { .. }
        ));
        assert_eq!(p.done_bytes(), PREAD_BYTES_MAX);
        let call = p.next_call(Some(4096));
        assert_eq!(call.file_offset_bytes, PREAD_BYTES_MAX);
        assert_eq!(call.len_bytes, PREAD_BYTES_MAX);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        /// Any sequence of results ends within `calls_max` calls, never lands more than the read,
        /// and only lands when every byte (or the file's end) was reached.
        #[test]
        fn any_result_sequence_terminates_within_the_bound(
            len in 1u64..200_000,
            file_extra in 0u64..10_000,
            retries_max in 0u32..6,
            results in proptest::collection::vec((0u8..5, 0u64..70_000), 0..400),
        ) {
            let file_len = len + file_extra;
            let mut p = ReadProgress::new(&read(0, len), file_len, retries_max);
            let mut calls = 0u64;
            let mut ended = false;
            for (what, n) in results {
                let call = p.next_call(None);
                prop_assert!(call.len_bytes > 0 && call.len_bytes <= len - p.done_bytes());
                calls += 1;
                let result = match what {
                    0 => Err(libc::EINTR),
                    1 => Err(libc::EAGAIN),
                    _ => Ok(n.min(call.len_bytes).max(1)),
                };
                match p.on_result(result, call.len_bytes, Access::Buffered) {
                    Step::Again { .. } => prop_assert!(calls < p.calls_max()),
                    Step::Landed => {
                        prop_assert_eq!(p.done_bytes(), len);
                        ended = true;
                        break;
                    }
                    Step::Fail(_) => {
                        prop_assert!(p.stalls() == retries_max || calls >= p.calls_max());
                        ended = true;
                        break;
                    }
                    Step::DirectRefused => prop_assert!(false, "no direct call was made"),
                }
                prop_assert!(p.stalls() <= retries_max);
            }
            prop_assert!(ended || calls < p.calls_max());
        }
    }
}
