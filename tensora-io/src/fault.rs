//! Test support (cargo feature `fault-injection`): faults injected below every reading backend
//! (`sync`, `io-uring`, `async`). It is public so that every crate's tests (tensora-verify's included) can
//! exercise error paths without special hardware.
//!
//! A [`FaultySource`] wraps any [`ReadAt`] (normally [`Pread`]) and applies a list of [`Fault`]s:
//! - [`Fault::Eio`]: every read touching a byte of a file fails with `EIO` (permanent);
//! - [`Fault::Interrupted`], [`Fault::WouldBlock`]: the first `times` reads fail with `EINTR` /
//!   `EAGAIN` (transient: retried);
//! - [`Fault::Short`]: the first `times` reads return only part of what was asked (transient);
//! - [`Fault::Eof`]: the file appears to end at an offset (a truncation);
//! - [`Fault::DirectRefused`]: `O_DIRECT` reads of a file fail with `EINVAL` (the backend falls
//!   back to buffered reads for that file);
//! - [`Fault::BitFlip`]: one bit of one byte is flipped silently (what digests must catch).
//!
//! # Example
//!
//! ```
//! use tensora_io::{Fault, FaultySource};
//! use tensora_io::{BackendChoice, LoadError, LoadOptions, load};
//!
//! let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/serverlessllm/tiny");
//! let ckpt = tensora_format::open(dir)?;
//! // Transient faults are retried: the load succeeds with the right bytes.
//! let source = FaultySource::new(vec![Fault::Interrupted { times: 3 }, Fault::Short { times: 2 }]);
//! let opts = LoadOptions { backend: BackendChoice::Custom(source.into_backend()), ..LoadOptions::default() };
//! assert_eq!(load(&ckpt, &opts)?.report().retries, 5);
//! // A permanent one fails the load, naming file, offset and tensor.
//! let source = FaultySource::new(vec![Fault::Eio { file: 0, offset_bytes: 100 }]);
//! let opts = LoadOptions { backend: BackendChoice::Custom(source.into_backend()), ..LoadOptions::default() };
//! assert!(matches!(load(&ckpt, &opts), Err(LoadError::Read { .. })));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::backends::sync::{Pread, ReadAt, SyncBackend};
use crate::seam::{Access, IoBackend, SourceFile};

/// One fault to inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Reads of `file` whose range contains `offset_bytes` fail with `EIO`, every time.
    Eio {
        /// The plan file.
        file: u32,
        /// A byte whose reads fail.
        offset_bytes: u64,
    },
    /// The first `times` reads (of any file) fail with `EINTR`.
    Interrupted {
        /// How many reads fail.
        times: u32,
    },
    /// The first `times` reads fail with `EAGAIN`.
    WouldBlock {
        /// How many reads fail.
        times: u32,
    },
    /// The first `times` reads longer than one byte return about half of what was asked.
    Short {
        /// How many reads come back short.
        times: u32,
    },
    /// `file` reads as if it ended at `len_bytes` (reads at or past it return 0 bytes).
    Eof {
        /// The plan file.
        file: u32,
        /// Where it appears to end.
        len_bytes: u64,
    },
    /// Every `O_DIRECT` read of `file` fails with `EINVAL`, as on a filesystem that refuses direct
    /// I/O for some requests (the backend then reads that file buffered).
    DirectRefused {
        /// The plan file.
        file: u32,
    },
    /// Bit `bit` (0-7) of the byte at `offset_bytes` of `file` reads flipped.
    BitFlip {
        /// The plan file.
        file: u32,
        /// The byte.
        offset_bytes: u64,
        /// The bit (0-7).
        bit: u8,
    },
}

/// A list of [`Fault`]s and their counters: what a faulty read layer makes of each call. It is
/// applied after the real read of a call (so bit flips see real bytes), and the same plan drives
/// every backend: [`FaultPlan::sync`], [`FaultPlan::uring`], [`FaultPlan::asynchronous`].
/// Counters are atomic, so one plan serves every worker thread.
#[derive(Debug)]
pub struct FaultPlan {
    faults: Vec<Fault>,
    /// Remaining count for each counted fault (same index as `faults`).
    remaining: Vec<AtomicU32>,
    injected: AtomicU64,
}

impl FaultPlan {
    /// A plan injecting `faults`.
    pub fn new(faults: Vec<Fault>) -> FaultPlan {
        let remaining = faults
            .iter()
            .map(|f| match *f {
                Fault::Interrupted { times } | Fault::WouldBlock { times } | Fault::Short { times } => times,
                _ => 0,
            })
            .map(AtomicU32::new)
            .collect();
        FaultPlan { faults, remaining, injected: AtomicU64::new(0) }
    }

    /// How many faults fired so far (bit flips and EOFs count once per call they affect).
    pub fn injected(&self) -> u64 {
        self.injected.load(Ordering::Relaxed)
    }

    /// The `sync` backend with this plan below its reads.
    pub fn sync(self: &Arc<Self>) -> Arc<dyn IoBackend> {
        Arc::new(SyncBackend::with_reader(Arc::new(FaultySource { inner: Pread, plan: Arc::clone(self) })))
    }

    /// The `io-uring` backend with this plan applied to every completion.
    pub fn uring(self: &Arc<Self>) -> Arc<dyn IoBackend> {
        Arc::new(crate::backends::uring::UringBackend::default().with_faults(Arc::clone(self)))
    }

    /// The `async` backend with this plan applied to every positional read.
    #[cfg(feature = "async")]
    pub fn asynchronous(self: &Arc<Self>) -> Arc<dyn IoBackend> {
        Arc::new(crate::backends::async_tokio::AsyncBackend::default().with_faults(Arc::clone(self)))
    }

    /// What the plan makes of one call that asked for `buf.len()` bytes of `file` at
    /// `offset_bytes` through `access` and really returned `real` (its bytes already in `buf`).
    pub(crate) fn rewrite(
        &self,
        file: u32,
        offset_bytes: u64,
        access: Access,
        buf: &mut [u8],
        real: io::Result<usize>,
    ) -> io::Result<usize> {
        let end = offset_bytes.saturating_add(buf.len() as u64);
        let mut n = real?;
        for (i, fault) in self.faults.iter().enumerate() {
            match *fault {
                Fault::DirectRefused { file: f } if f == file && access == Access::Direct => {
                    self.fired();
                    return Err(io::Error::from_raw_os_error(libc::EINVAL));
                }
                Fault::Eio { file: f, offset_bytes: at }
                    if f == file && (offset_bytes..end).contains(&at) =>
                {
                    self.fired();
                    return Err(io::Error::from_raw_os_error(libc::EIO));
                }
                Fault::Interrupted { .. } if self.take(i) => {
                    self.fired();
                    return Err(io::Error::from_raw_os_error(libc::EINTR));
                }
                Fault::WouldBlock { .. } if self.take(i) => {
                    self.fired();
                    return Err(io::Error::from_raw_os_error(libc::EAGAIN));
                }
                Fault::Short { .. } if buf.len() > 1 && self.take(i) => {
                    self.fired();
                    n = n.min(buf.len() / 2);
                }
                Fault::Eof { file: f, len_bytes } if f == file => {
                    let room = usize::try_from(len_bytes.saturating_sub(offset_bytes)).unwrap_or(usize::MAX);
                    if room < n {
                        self.fired();
                        n = room;
                    }
                }
                _ => {}
            }
        }
        let got_end = offset_bytes + n as u64;
        for fault in &self.faults {
            if let Fault::BitFlip { file: f, offset_bytes: at, bit } = *fault
                && f == file
                && (offset_bytes..got_end).contains(&at)
            {
                self.fired();
                buf[(at - offset_bytes) as usize] ^= 1u8 << (bit & 7);
            }
        }
        Ok(n)
    }

    /// Take one from a counted fault's budget; true when it fires.
    fn take(&self, index: usize) -> bool {
        self.remaining[index].fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1)).is_ok()
    }

    fn fired(&self) {
        self.injected.fetch_add(1, Ordering::Relaxed);
    }
}

/// A [`ReadAt`] that injects a [`FaultPlan`]'s faults into the reads of an inner layer.
#[derive(Debug)]
pub struct FaultySource<R: ReadAt = Pread> {
    inner: R,
    plan: Arc<FaultPlan>,
}

impl FaultySource<Pread> {
    /// Inject `faults` into plain `pread`s.
    pub fn new(faults: Vec<Fault>) -> FaultySource<Pread> {
        FaultySource::wrap(Pread, faults)
    }
}

impl<R: ReadAt + 'static> FaultySource<R> {
    /// Inject `faults` into the reads of `inner`.
    pub fn wrap(inner: R, faults: Vec<Fault>) -> FaultySource<R> {
        FaultySource { inner, plan: Arc::new(FaultPlan::new(faults)) }
    }

    /// How many faults fired so far (bit flips and EOFs count once per read they affect).
    pub fn injected(&self) -> u64 {
        self.plan.injected()
    }

    /// A [`SyncBackend`] whose reads go through this source, ready for
    /// [`BackendChoice::Custom`](crate::BackendChoice::Custom).
    pub fn into_backend(self) -> Arc<dyn IoBackend> {
        Arc::new(SyncBackend::with_reader(Arc::new(self)))
    }
}

impl<R: ReadAt + 'static> ReadAt for FaultySource<R> {
    fn read_at(
        &self,
        file: &SourceFile,
        file_index: u32,
        buf: &mut [u8],
        offset_bytes: u64,
        access: Access,
    ) -> io::Result<usize> {
        let real = self.inner.read_at(file, file_index, buf, offset_bytes, access);
        self.plan.rewrite(file_index, offset_bytes, access, buf, real)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn source_file(bytes: &[u8]) -> (tempfile::NamedTempFile, SourceFile) {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(bytes).unwrap();
        let sf = SourceFile {
            path: f.path().to_owned(),
            len_bytes: bytes.len() as u64,
            buffered: f.reopen().unwrap(),
            direct: None,
        };
        (f, sf)
    }

    #[test]
    fn counted_faults_fire_exactly_times_then_pass_through() {
        let data: Vec<u8> = (0..=255u8).collect();
        let (_f, sf) = source_file(&data);
        let src = FaultySource::new(vec![Fault::Interrupted { times: 2 }, Fault::WouldBlock { times: 1 }]);
        let mut buf = [0u8; 16];
        let kinds: Vec<_> =
            (0..3).map(|_| src.read_at(&sf, 0, &mut buf, 0, Access::Buffered).unwrap_err().kind()).collect();
        assert_eq!(
            kinds,
            [io::ErrorKind::Interrupted, io::ErrorKind::Interrupted, io::ErrorKind::WouldBlock]
        );
        assert_eq!(src.read_at(&sf, 0, &mut buf, 16, Access::Buffered).unwrap(), 16);
        assert_eq!(&buf[..], &data[16..32]);
        assert_eq!(src.injected(), 3);
    }

    #[test]
    fn short_eof_eio_and_bitflip() {
        let data = vec![0u8; 100];
        let (_f, sf) = source_file(&data);
        let src = FaultySource::new(vec![
            Fault::Short { times: 1 },
            Fault::Eof { file: 0, len_bytes: 90 },
            Fault::Eio { file: 0, offset_bytes: 50 },
            Fault::BitFlip { file: 0, offset_bytes: 5, bit: 3 },
        ]);
        let mut buf = [0u8; 40];
        assert_eq!(src.read_at(&sf, 0, &mut buf, 0, Access::Buffered).unwrap(), 20);
        assert_eq!(buf[5], 8);
        assert_eq!(src.read_at(&sf, 0, &mut buf, 0, Access::Buffered).unwrap(), 40);
        assert_eq!(
            src.read_at(&sf, 0, &mut buf, 40, Access::Buffered).unwrap_err().raw_os_error(),
            Some(libc::EIO)
        );
        assert_eq!(src.read_at(&sf, 0, &mut buf, 60, Access::Buffered).unwrap(), 30);
        assert_eq!(src.read_at(&sf, 0, &mut buf, 95, Access::Buffered).unwrap(), 0);
        // Faults on another file index do not fire.
        assert_eq!(src.read_at(&sf, 1, &mut buf, 40, Access::Buffered).unwrap(), 40);
    }
}
