//! Which bytes a held piece's copy may record ([`Seals`]).
//!
//! An owned load's pieces are written behind it from the load's own memory (see
//! [`super::lane`]). Until that memory can change, its bytes are what arrived: a writer takes a
//! piece's CRC-32C from the memory itself ([`Seal::checksum`]; no checksum is taken while the
//! bytes arrive, so the load's threads spend no time on it), writes the piece, and records it
//! with that CRC. The memory can change only once the caller can write to it:
//! `RemoteLoaded::into_loaded` waits for the copies first, and the ways to reach the tensors for
//! writing while the copies are still being written (`RemoteLoaded::take_cache_sync`, and
//! `RemoteLoaded::loaded`, whose `Loaded` hands out writable pointers) first seal every piece not
//! written yet ([`Seals::seal`]): they take the CRC-32C of those bytes, still as they arrived (or
//! keep the one a writer took). A piece sealed before its write ended may have been changed
//! before the kernel copied it, so its writer reads it back from the disk and records it only if
//! the disk holds bytes with the sealed CRC; otherwise the piece is left out.
//!
//! Each piece's state changes under its own lock, which the writer holds while it reads the
//! memory and the seal takes before the caller can write: a writer that finishes a piece either
//! finds it unsealed since its checksum (nobody could have changed it before the write ended) or
//! sealed (and compares what the disk holds).

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tensora_io::HeldPiece;

use crate::crc::crc32c;

/// The state of one held piece.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Neither checksummed nor sealed: its memory has not changed since it arrived.
    Unsealed,
    /// A writer took the CRC-32C of its memory, unchanged since it arrived, and is writing it.
    Checksummed(u32),
    /// Written and accepted before any seal.
    Written,
    /// Sealed with the CRC-32C of its bytes as they arrived.
    Sealed(u32),
    /// Sealed without a CRC (its bytes could not be found): never recorded.
    Unknown,
}

/// What a writer does with a piece it has written ([`Seal::after_write`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AfterWrite {
    /// Record it with this CRC-32C: its memory could not change before the write ended.
    Record(u32),
    /// Read it back and record it only if the disk holds bytes with this CRC-32C: it was sealed
    /// while (or before) it was written, and the caller may have changed it first.
    Compare(u32),
    /// Leave it out: recorded already, or sealed without a CRC.
    Drop,
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

    /// Before a writer writes `piece` (the piece this seal is for): take its CRC-32C from the
    /// memory while it is still as it arrived. Does nothing once the piece is sealed (or taken):
    /// what to do after the write then comes from the seal.
    pub fn checksum(&self, piece: &HeldPiece) {
        debug_assert_eq!(piece.offset_bytes() as u64, self.arena_range.start, "the seal's own piece");
        debug_assert_eq!(piece.len_bytes() as u64, self.arena_range.end - self.arena_range.start);
        let mut state = self.state();
        if *state != State::Unsealed {
            return;
        }
        // SAFETY: the piece's bytes are written by no one while the lock is held in `Unsealed`:
        // the backend handed the piece out filled and never writes it again (`ReadTarget` keeps
        // handed-out bytes out of its buffers), the held arena is never parked for a later load,
        // and the load's caller gets writable access to the memory only through
        // `RemoteLoaded::loaded` or `take_cache_sync`, which seal every piece (under this lock)
        // first, or through `into_loaded`, which waits until the writers are done.
        #[allow(unsafe_code)]
        let crc = unsafe { piece.read_unchanged(crc32c) };
        *state = State::Checksummed(crc);
    }

    /// A writer has written the piece: what it does next. Called after the write has ended, never
    /// before: a seal taken while the write ran is then seen.
    pub fn after_write(&self) -> AfterWrite {
        let mut state = self.state();
        match *state {
            State::Checksummed(crc) => {
                *state = State::Written;
                AfterWrite::Record(crc)
            }
            State::Sealed(crc) => AfterWrite::Compare(crc),
            // `checksum` was not called (a writer's contract): nothing vouches for the bytes.
            State::Unsealed | State::Written | State::Unknown => AfterWrite::Drop,
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

    /// Seal every piece not written yet with the CRC-32C of its bytes (`bytes_of` its arena range,
    /// or the one its writer took already; `None` seals it as unknown: never recorded). Call it
    /// before the load's memory can change.
    pub fn seal<'m>(&self, bytes_of: impl Fn(Range<u64>) -> Option<&'m [u8]>) -> Sealed {
        let pieces = std::mem::take(&mut *self.pieces.lock().unwrap_or_else(|p| p.into_inner()));
        let mut sealed = Sealed::default();
        for seal in pieces {
            let mut state = seal.state();
            *state = match *state {
                State::Checksummed(crc) => State::Sealed(crc),
                State::Unsealed => match bytes_of(seal.arena_range.clone()) {
                    Some(bytes) => State::Sealed(crc32c(bytes)),
                    None => State::Unknown,
                },
                State::Written | State::Sealed(_) | State::Unknown => continue,
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
    use tensora_io::Arena;

    use super::*;

    /// An arena holding `bytes`.
    fn arena_of(bytes: &[u8]) -> Arena {
        let mut arena = Arena::with_len(bytes.len() as u64).unwrap();
        arena.as_mut_slice()[..bytes.len()].copy_from_slice(bytes);
        arena
    }

    /// The bytes at `r` of `memory` (the arena's, copied when the seal is taken).
    fn range_of(memory: &[u8], r: Range<u64>) -> Option<&[u8]> {
        memory.get(r.start as usize..r.end as usize)
    }

    #[test]
    fn a_piece_written_before_the_seal_is_recorded_with_its_memory_crc_then_left_alone() {
        let seals = Seals::default();
        let mut arena = arena_of(&[5u8; 64]);
        let piece = arena.keep_mapped().piece(0, 64).unwrap();
        let seal = seals.add(0..64);
        seal.checksum(&piece);
        assert_eq!(seal.after_write(), AfterWrite::Record(crc32c(&[5u8; 64])), "no read-back");
        let memory = arena.as_slice().to_vec();
        let sealed = seals.seal(|r| range_of(&memory, r));
        assert_eq!(sealed, Sealed::default(), "a written piece needs no seal");
        seal.checksum(&piece);
        assert_eq!(seal.after_write(), AfterWrite::Drop, "a piece is recorded once");
    }

    #[test]
    fn a_piece_sealed_before_its_write_ended_is_compared_with_what_arrived() {
        let seals = Seals::default();
        let arrived = [7u8; 192];
        let mut arena = arena_of(&arrived);
        let keep = arena.keep_mapped();
        let (a, b, lost) = (seals.add(0..64), seals.add(64..128), seals.add(128..192));
        // `a` is being written when the seal comes; `b` and `lost` are still queued.
        a.checksum(&keep.piece(0, 64).unwrap());
        let memory = arena.as_slice().to_vec();
        let sealed = seals.seal(|r| if r.start == 128 { None } else { range_of(&memory, r) });
        assert_eq!(sealed, Sealed { pieces: 3, bytes: 192 });
        // The caller changes both pieces after the seal: the writers' checksums see nothing.
        arena.as_mut_slice()[10] = 8;
        arena.as_mut_slice()[70] = 8;
        b.checksum(&keep.piece(64, 64).unwrap());
        lost.checksum(&keep.piece(128, 64).unwrap());
        let crc = crc32c(&arrived[..64]);
        assert_eq!(a.after_write(), AfterWrite::Compare(crc));
        assert_eq!(b.after_write(), AfterWrite::Compare(crc));
        assert_eq!(lost.after_write(), AfterWrite::Drop, "no bytes to seal with: never recorded");
        // Sealing again finds nothing left.
        assert_eq!(seals.seal(|_| None), Sealed::default());
        assert_eq!(seals.sealed_bytes(), 192);
    }

    /// How far a piece's writer has got when the seal comes.
    #[derive(Debug, Clone, Copy)]
    enum Stage {
        Queued,
        Checksummed,
        Written,
    }

    fn stage() -> impl Strategy<Value = Stage> {
        prop_oneof![Just(Stage::Queued), Just(Stage::Checksummed), Just(Stage::Written)]
    }

    proptest! {
        /// Whatever the order of writes, the seal and the caller's changes, a piece is recorded
        /// without a read-back at most once, and only if its write ended before the seal; every
        /// CRC a writer is given is the CRC of the bytes as they arrived.
        #[test]
        fn recorded_once_and_only_with_the_bytes_that_arrived(
            stages in proptest::collection::vec(stage(), 1..12),
            changed in proptest::collection::vec(any::<bool>(), 1..12),
        ) {
            let n = stages.len();
            let arrived: Vec<u8> = (0..n * 16).map(|i| i as u8).collect();
            let mut arena = arena_of(&arrived);
            let keep = arena.keep_mapped();
            let seals = Seals::default();
            let pieces: Vec<Arc<Seal>> = (0..n as u64).map(|k| seals.add(k * 16..k * 16 + 16)).collect();
            let held = |k: usize| keep.piece(k * 16, 16).unwrap();
            let crc = |k: usize| crc32c(&arrived[k * 16..k * 16 + 16]);
            for (k, stage) in stages.iter().enumerate() {
                match stage {
                    Stage::Queued => {}
                    Stage::Checksummed => pieces[k].checksum(&held(k)),
                    Stage::Written => {
                        pieces[k].checksum(&held(k));
                        prop_assert_eq!(pieces[k].after_write(), AfterWrite::Record(crc(k)));
                    }
                }
            }
            let memory = arena.as_slice().to_vec();
            let sealed = seals.seal(|r| range_of(&memory, r));
            let unwritten = stages.iter().filter(|s| !matches!(s, Stage::Written)).count();
            prop_assert_eq!(sealed.pieces as usize, unwritten);
            for (k, _) in changed.iter().enumerate().filter(|(k, c)| **c && *k < n) {
                arena.as_mut_slice()[k * 16] ^= 0xff;
            }
            for (k, stage) in stages.iter().enumerate() {
                pieces[k].checksum(&held(k));
                let expected = match stage {
                    Stage::Written => AfterWrite::Drop,
                    Stage::Queued | Stage::Checksummed => AfterWrite::Compare(crc(k)),
                };
                prop_assert_eq!(pieces[k].after_write(), expected);
            }
        }
    }
}
