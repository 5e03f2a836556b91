//! Which bytes a held piece's copy may record ([`Seals`]).
//!
//! An owned load's pieces are written behind it from the load's own memory (see
//! [`super::lane`]). Until that memory can change, what a writer reads back from the disk is what
//! arrived, and its CRC-32C is the piece's: no checksum is taken while the bytes arrive, so the
//! load's threads spend no time on it. The memory can change only once the caller can write to
//! it: `RemoteLoaded::into_loaded` waits for the copies first, and the ways to reach the tensors
//! for writing while the copies are still being written (`RemoteLoaded::take_cache_sync`, and
//! `RemoteLoaded::loaded`, whose `Loaded` hands out writable pointers) first seal every piece not
//! written yet ([`Seals::seal`]): they take the CRC-32C of those bytes, still as they arrived. A writer that finishes a sealed piece records it only if the disk holds
//! bytes with that CRC; otherwise the caller changed them first and the piece is left out.
//!
//! Each piece's state changes under its own lock, so a writer that reads back a piece either
//! finds it unsealed (nobody could have changed it before the read-back ended) or sealed (and
//! compares).

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::crc::crc32c;

/// The state of one held piece.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Neither written nor sealed: its memory has not changed since it arrived.
    Unsealed,
    /// Written, read back and accepted before any seal.
    Written,
    /// Sealed with the CRC-32C of its bytes as they arrived.
    Sealed(u32),
    /// Sealed without a CRC (its bytes could not be found): never recorded.
    Unknown,
}

/// One held piece's seal: where it lies in the load's memory, and its state.
#[derive(Debug)]
pub(crate) struct Seal {
    /// The piece's bytes in the load's arena (`tensora_io::HeldPiece::offset_bytes` on).
    arena_range: Range<u64>,
    state: Mutex<State>,
}

impl Seal {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A writer has written the piece and read back bytes with `crc_on_disk`: whether they may be
    /// recorded (with that CRC). Called after the read-back, never before: a seal taken while the
    /// write ran is then seen.
    pub fn accept(&self, crc_on_disk: u32) -> bool {
        let mut state = self.state();
        match *state {
            State::Unsealed => {
                *state = State::Written;
                true
            }
            State::Sealed(crc) => crc == crc_on_disk,
            State::Written | State::Unknown => false,
        }
    }
}

/// The seals of one session's held pieces: at most one per [`super::PIECE_BYTES`] of the load's
/// arena.
#[derive(Debug, Default)]
pub(crate) struct Seals {
    /// The pieces not sealed yet (written or not).
    pieces: Mutex<Vec<Arc<Seal>>>,
    /// Bytes sealed before they were written, over every [`Seals::seal`].
    sealed_bytes: AtomicU64,
}

/// What [`Seals::seal`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Sealed {
    /// Pieces not written yet, sealed with their CRC.
    pub pieces: u64,
    /// Their bytes.
    pub bytes: u64,
}

impl Seals {
    /// A seal for a piece at `arena_range` of the load's memory, unsealed.
    pub fn add(&self, arena_range: Range<u64>) -> Arc<Seal> {
        let seal = Arc::new(Seal { arena_range, state: Mutex::new(State::Unsealed) });
        self.pieces.lock().unwrap_or_else(|p| p.into_inner()).push(Arc::clone(&seal));
        seal
    }

    /// Seal every piece not written yet with the CRC-32C of its bytes (`bytes_of` its arena range;
    /// `None` seals it as unknown: never recorded). Call it before the load's memory can change.
    pub fn seal<'m>(&self, bytes_of: impl Fn(Range<u64>) -> Option<&'m [u8]>) -> Sealed {
        let pieces = std::mem::take(&mut *self.pieces.lock().unwrap_or_else(|p| p.into_inner()));
        let mut sealed = Sealed::default();
        for seal in pieces {
            let mut state = seal.state();
            if *state != State::Unsealed {
                continue;
            }
            *state = match bytes_of(seal.arena_range.clone()) {
                Some(bytes) => State::Sealed(crc32c(bytes)),
                None => State::Unknown,
            };
            sealed.pieces += 1;
            sealed.bytes += seal.arena_range.end - seal.arena_range.start;
        }
        self.sealed_bytes.fetch_add(sealed.bytes, Ordering::Relaxed);
        sealed
    }

    /// Bytes sealed before they were written, in all.
    pub fn sealed_bytes(&self) -> u64 {
        self.sealed_bytes.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn a_piece_written_before_the_seal_is_recorded_and_then_left_alone() {
        let seals = Seals::default();
        let memory = [5u8; 64];
        let seal = seals.add(0..64);
        assert!(seal.accept(1234), "unsealed: the read-back is what arrived");
        let sealed = seals.seal(|r| memory.get(r.start as usize..r.end as usize));
        assert_eq!(sealed, Sealed::default(), "a written piece needs no seal");
        assert!(!seal.accept(1234), "a piece is recorded once");
    }

    #[test]
    fn a_sealed_piece_is_recorded_only_if_the_disk_holds_what_arrived() {
        let seals = Seals::default();
        let mut memory = [7u8; 128];
        let (a, b, lost) = (seals.add(0..64), seals.add(64..128), seals.add(128..192));
        let sealed = seals.seal(|r| memory.get(r.start as usize..r.end as usize));
        assert_eq!(sealed, Sealed { pieces: 3, bytes: 192 });
        // The caller changes the second piece after the seal, before its write.
        memory[70] = 8;
        assert!(a.accept(crc32c(&memory[..64])));
        assert!(!b.accept(crc32c(&memory[64..128])), "changed after the seal");
        assert!(!lost.accept(crc32c(&[])), "no bytes to seal with: never recorded");
        // Sealing again finds nothing left.
        assert_eq!(seals.seal(|_| None), Sealed::default());
        assert_eq!(seals.sealed_bytes(), 192);
    }

    proptest! {
        /// Whatever the order of writes and the seal, a piece is accepted at most once, and after
        /// a seal only with the CRC of the bytes it was sealed with.
        #[test]
        fn accepted_at_most_once_and_only_as_sealed(
            written_before in proptest::collection::vec(any::<bool>(), 1..12),
            changed in proptest::collection::vec(any::<bool>(), 1..12),
        ) {
            let n = written_before.len();
            let memory: Vec<u8> = (0..n * 16).map(|i| i as u8).collect();
            let seals = Seals::default();
            let pieces: Vec<Arc<Seal>> = (0..n as u64).map(|k| seals.add(k * 16..k * 16 + 16)).collect();
            let crc = |k: usize, change: bool| {
                let mut bytes = memory[k * 16..k * 16 + 16].to_vec();
                bytes[0] ^= u8::from(change);
                crc32c(&bytes)
            };
            for (k, &before) in written_before.iter().enumerate() {
                if before {
                    prop_assert!(pieces[k].accept(crc(k, false)));
                }
            }
            let sealed = seals.seal(|r| memory.get(r.start as usize..r.end as usize));
            prop_assert_eq!(sealed.pieces as usize, written_before.iter().filter(|&&b| !b).count());
            for (k, &before) in written_before.iter().enumerate() {
                let change = changed.get(k).copied().unwrap_or(false);
                prop_assert_eq!(pieces[k].accept(crc(k, change)), !before && !change);
            }
        }
    }
}
