//! Digests of tensors whose bytes pass by in pieces, on the thread that handles each piece: what a
//! save computes while it writes (`tensora_convert`'s writer), so a manifest costs no second pass.
//!
//! - crc32c: each piece is digested where it is, in any order and on any thread, and the pieces'
//!   CRCs are combined ([`crate::digest::crc32c_combine`]), as fused loads do
//!   ([`crate::fused::DigestCollector`]; the same run bookkeeping).
//! - xxh3 and sha256 cannot be combined, so each tensor's pieces are fed to one streaming
//!   [`Hasher`] in offset order: a piece that arrives before the bytes in front of it waits for
//!   them (at most [`ORDER_WAIT_MAX`], or until [`PieceDigests::abort`]). A writer that hands
//!   pieces out in file order never deadlocks: the piece in front was handed out earlier.
//!
//! Only a tensor's first `nbytes` bytes count (a ServerlessLLM record's padding and a strided
//! tensor's storage past them are ignored), as for every digest here.
//!
//! ```
//! use tensora_verify::{Algo, PieceDigests};
//!
//! let data = b"123456789";
//! for algo in Algo::ALL {
//!     let d = PieceDigests::new(algo, [("t".to_owned(), data.len() as u64)]);
//!     if d.needs_order() {
//!         d.add(0, 0, &data[..4])?;
//!         d.add(0, 4, &data[4..])?;
//!     } else {
//!         d.add(0, 4, &data[4..])?; // any order
//!         d.add(0, 0, &data[..4])?;
//!     }
//!     assert_eq!(d.finish()?, vec![algo.digest(data)]);
//! }
//! # Ok::<(), tensora_io::BoxError>(())
//! ```

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tensora_io::BoxError;

use crate::digest::{Algo, Digest, Hasher};
use crate::fused::{CrcRun, Runs};
use crate::hash::HashError;

/// Longest a piece waits for the bytes in front of it (xxh3, sha256). A writer's pieces in front
/// are being copied and digested by other threads; this bound only ends a wait on one that died.
pub const ORDER_WAIT_MAX: Duration = Duration::from_secs(600);

/// One digest per tensor, fed piece by piece from any thread (see the module docs).
#[derive(Debug)]
pub struct PieceDigests {
    algo: Algo,
    slots: Vec<Slot>,
    aborted: AtomicBool,
}

#[derive(Debug)]
struct Slot {
    name: String,
    nbytes: u64,
    state: Mutex<State>,
    /// Signalled when an ordered tensor's next offset moves (or on abort).
    turn: Condvar,
}

#[derive(Debug)]
enum State {
    /// crc32c: the runs digested so far.
    Crc(Runs),
    /// xxh3, sha256: the hasher, fed up to `next_offset`.
    Ordered { next_offset: u64, hasher: Hasher },
    /// Every byte seen.
    Done(Digest),
}

impl PieceDigests {
    /// Digests for `tensors` (name, digested bytes `nbytes`), indexed in the order given.
    pub fn new(algo: Algo, tensors: impl IntoIterator<Item = (String, u64)>) -> PieceDigests {
        let slots = tensors
            .into_iter()
            .map(|(name, nbytes)| {
                let state = match (nbytes, algo) {
                    (0, _) => State::Done(algo.digest(&[])),
                    (_, Algo::Crc32c) => State::Crc(Runs::default()),
                    (_, Algo::Xxh3 | Algo::Sha256) => {
                        State::Ordered { next_offset: 0, hasher: algo.hasher() }
                    }
                };
                Slot { name, nbytes, state: Mutex::new(state), turn: Condvar::new() }
            })
            .collect();
        PieceDigests { algo, slots, aborted: AtomicBool::new(false) }
    }

    /// The algorithm of every digest.
    pub fn algo(&self) -> Algo {
        self.algo
    }

    /// Whether each tensor's pieces must arrive in offset order (xxh3, sha256): [`add`] then
    /// waits for the bytes in front of a piece.
    ///
    /// [`add`]: PieceDigests::add
    pub fn needs_order(&self) -> bool {
        self.algo != Algo::Crc32c
    }

    /// Digest `bytes`, tensor `tensor`'s bytes from `offset_bytes` (only its first `nbytes` count).
    /// For xxh3 and sha256 this waits until the bytes in front have been added. Errors, naming the
    /// tensor, on an unknown index, bytes delivered twice, an abort, or a wait past
    /// `ORDER_WAIT_MAX`.
    pub fn add(&self, tensor: usize, offset_bytes: u64, bytes: &[u8]) -> Result<(), BoxError> {
        let slot =
            self.slots.get(tensor).ok_or_else(|| format!("tensor index {tensor} is not being digested"))?;
        if offset_bytes >= slot.nbytes || bytes.is_empty() {
            return Ok(()); // past the digested bytes (padding, strided storage)
        }
        let take = usize::try_from((slot.nbytes - offset_bytes).min(bytes.len() as u64))
            .map_err(|_| "piece larger than the address space")?;
        let bytes = &bytes[..take];
        let mut state = self.lock(slot);
        match &mut *state {
            State::Crc(runs) => {
                let end = offset_bytes + take as u64;
                if runs
                    .runs
                    .iter()
                    .any(|r| r.offset_bytes < end && offset_bytes < r.offset_bytes + r.len_bytes)
                {
                    return Err(twice(&slot.name, offset_bytes));
                }
                let run = CrcRun { offset_bytes, len_bytes: take as u64, crc: crc32c::crc32c(bytes) };
                runs.push(run, slot.nbytes, &slot.name)?;
                if runs.covered_bytes == slot.nbytes {
                    let crc = combine_contiguous(&mut runs.runs, &slot.name)?;
                    *state = State::Done(Digest::from_crc32c(crc));
                }
                Ok(())
            }
            State::Ordered { .. } => {
                state = self.wait_turn(slot, state, offset_bytes)?;
                let State::Ordered { next_offset, hasher } = &mut *state else {
                    return Err(twice(&slot.name, offset_bytes));
                };
                hasher.update(bytes);
                *next_offset += take as u64;
                if *next_offset == slot.nbytes {
                    let done = std::mem::replace(&mut *state, State::Done(self.algo.digest(&[])));
                    if let State::Ordered { hasher, .. } = done {
                        *state = State::Done(hasher.finish());
                    }
                }
                drop(state);
                slot.turn.notify_all();
                Ok(())
            }
            State::Done(_) => Err(twice(&slot.name, offset_bytes)),
        }
    }

    /// Wait until an ordered tensor has been fed up to `offset_bytes`.
    fn wait_turn<'s>(
        &self,
        slot: &'s Slot,
        mut state: MutexGuard<'s, State>,
        offset_bytes: u64,
    ) -> Result<MutexGuard<'s, State>, BoxError> {
        let deadline = Instant::now() + ORDER_WAIT_MAX;
        loop {
            if self.aborted.load(Ordering::Acquire) {
                return Err(format!("tensor {:?}: digest aborted", slot.name).into());
            }
            let next = match &*state {
                State::Ordered { next_offset, .. } => *next_offset,
                _ => return Err(twice(&slot.name, offset_bytes)),
            };
            if next == offset_bytes {
                return Ok(state);
            }
            if next > offset_bytes {
                return Err(twice(&slot.name, offset_bytes));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(format!(
                    "tensor {:?}: the bytes before offset {offset_bytes} did not arrive within {} s",
                    slot.name,
                    ORDER_WAIT_MAX.as_secs()
                )
                .into());
            }
            state = slot.turn.wait_timeout(state, left).unwrap_or_else(|p| p.into_inner()).0;
        }
    }

    fn lock<'s>(&self, slot: &'s Slot) -> MutexGuard<'s, State> {
        slot.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stop: every waiting and later [`PieceDigests::add`] of an ordered tensor fails (a writer
    /// calls this when a piece failed, so nobody waits for bytes that will never come).
    pub fn abort(&self) {
        self.aborted.store(true, Ordering::Release);
        for slot in &self.slots {
            // Take the lock so a waiter between its check and its wait cannot miss the signal.
            drop(self.lock(slot));
            slot.turn.notify_all();
        }
    }

    /// Every digest, in the order the tensors were given, or the first tensor not wholly seen.
    pub fn finish(&self) -> Result<Vec<Digest>, HashError> {
        self.slots
            .iter()
            .map(|slot| match &*self.lock(slot) {
                State::Done(d) => Ok(*d),
                State::Crc(runs) => Err(incomplete(slot, runs.covered_bytes)),
                State::Ordered { next_offset, .. } => Err(incomplete(slot, *next_offset)),
            })
            .collect()
    }
}

fn twice(name: &str, offset_bytes: u64) -> BoxError {
    format!("tensor {name:?}: bytes at offset {offset_bytes} delivered twice").into()
}

fn incomplete(slot: &Slot, seen_bytes: u64) -> HashError {
    HashError::Incomplete {
        tensor: slot.name.clone(),
        reason: format!("{seen_bytes} of its {} bytes were digested", slot.nbytes),
    }
}

/// The CRC of runs that tile `0..covered` (sorted here), combined in offset order.
fn combine_contiguous(runs: &mut [CrcRun], name: &str) -> Result<u32, BoxError> {
    runs.sort_unstable_by_key(|r| r.offset_bytes);
    let mut crc = 0u32;
    let mut cursor = 0u64;
    for run in runs.iter() {
        if run.offset_bytes != cursor {
            return Err(format!("tensor {name:?}: pieces overlap or leave a gap at offset {cursor}").into());
        }
        crc = crate::digest::crc32c_combine(crc, run.crc, run.len_bytes);
        cursor += run.len_bytes;
    }
    Ok(crc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::sync::Arc;

    fn data(len: usize, seed: u8) -> Vec<u8> {
        (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
    }

    #[test]
    fn bytes_past_nbytes_are_ignored_and_empty_tensors_are_done() {
        for algo in Algo::ALL {
            let d = PieceDigests::new(algo, [("a".to_owned(), 3), ("empty".to_owned(), 0)]);
            d.add(0, 0, b"abcXYZ").unwrap(); // 3 bytes count, the rest is padding
            d.add(0, 5, b"pad").unwrap();
            d.add(1, 0, b"pad").unwrap();
            assert_eq!(d.finish().unwrap(), vec![algo.digest(b"abc"), algo.digest(b"")]);
        }
    }

    #[test]
    fn twice_unknown_and_missing_bytes_are_errors_naming_the_tensor() {
        for algo in Algo::ALL {
            let d = PieceDigests::new(algo, [("w".to_owned(), 8)]);
            d.add(0, 0, b"1234").unwrap();
            assert!(d.add(0, 0, b"1234").unwrap_err().to_string().contains("\"w\""), "{algo}");
            assert!(d.add(7, 0, b"1").is_err());
            let err = d.finish().unwrap_err();
            assert!(matches!(&err, HashError::Incomplete { tensor, .. } if tensor == "w"), "{err}");
            d.add(0, 4, b"5678").unwrap();
            assert!(d.add(0, 4, b"5678").is_err(), "{algo}: a finished tensor");
            assert_eq!(d.finish().unwrap(), vec![algo.digest(b"12345678")]);
        }
    }

    #[test]
    fn abort_wakes_a_piece_waiting_for_the_bytes_in_front() {
        let d = Arc::new(PieceDigests::new(Algo::Sha256, [("t".to_owned(), 8)]));
        let waiter = {
            let d = Arc::clone(&d);
            std::thread::spawn(move || d.add(0, 4, b"5678"))
        };
        // The waiter is either parked or about to check the flag; either way it sees the abort.
        d.abort();
        let err = waiter.join().unwrap().unwrap_err();
        assert!(err.to_string().contains("aborted"), "{err}");
        assert!(d.add(0, 0, b"1234").is_err());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// Pieces cut anywhere, added from several threads at once (in any order for crc32c, in
        /// offset order per tensor for the others, each thread waiting its turn): the digests are
        /// the one-shot digests.
        #[test]
        fn pieces_from_many_threads_give_the_one_shot_digests(
            lens in proptest::collection::vec(0usize..3000, 1..6),
            cuts in proptest::collection::vec(any::<usize>(), 0..10),
            threads in 1usize..4,
        ) {
            let tensors: Vec<Vec<u8>> = lens.iter().enumerate().map(|(i, &n)| data(n, i as u8)).collect();
            // Every piece of every tensor, in tensor and offset order (what a writer hands out).
            let mut pieces = Vec::new();
            for (i, t) in tensors.iter().enumerate() {
                let mut points: Vec<usize> = cuts.iter().map(|c| c % (t.len() + 1)).collect();
                points.extend([0, t.len()]);
                points.sort_unstable();
                points.dedup();
                pieces.extend(points.windows(2).map(|w| (i, w[0], w[1])));
            }
            for algo in Algo::ALL {
                let names = tensors.iter().enumerate().map(|(i, t)| (format!("t{i}"), t.len() as u64));
                let d = PieceDigests::new(algo, names);
                let next = std::sync::atomic::AtomicUsize::new(0);
                std::thread::scope(|s| {
                    for _ in 0..threads {
                        s.spawn(|| loop {
                            let k = next.fetch_add(1, Ordering::Relaxed);
                            let Some(&(i, a, b)) = pieces.get(k) else { break };
                            d.add(i, a as u64, &tensors[i][a..b]).unwrap();
                        });
                    }
                });
                let want: Vec<Digest> = tensors.iter().map(|t| algo.digest(t)).collect();
                prop_assert_eq!(d.finish().unwrap(), want);
            }
        }
    }
}
