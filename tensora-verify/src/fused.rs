//! Digests fused into a load, computed by the `tensora_io` workers while the bytes are hot in
//! cache, in parallel across tensors, with no second pass over memory.
//!
//! Two hooks feed a [`DigestCollector`]:
//!
//! - the read hook ([`LoadOptions::on_read`], [`DigestCollector::read_hook`]) runs on the worker
//!   that fills a read, once per piece (one tensor's bytes inside that read) as soon as its bytes
//!   have landed; the `sync` backend hands pieces over in 1 MiB steps while the rest of the read is
//!   still arriving. For crc32c it digests the piece there, while it is still in that core's
//!   cache, and keeps `(offset, crc, len)`; pieces of one tensor may arrive in any order and on any
//!   thread.
//! - the tensor hook ([`LoadOptions::on_tensor`], [`DigestCollector::hook`]) runs once the
//!   tensor is whole. For crc32c it combines the pieces' CRCs in offset order
//!   ([`crate::digest::crc32c_combine`], about 1 µs each) and digests any bytes no piece
//!   covered from the finished tensor (all of them when only this hook is installed). XXH3 and
//!   SHA-256 cannot be combined from pieces, so they digest the whole tensor here.
//!
//! [`DigestCollector::install`] sets both hooks on a [`LoadOptions`]. Per tensor the collector
//! holds one small `Mutex` (taken for a push or a merge, never while digesting) and one
//! write-once result slot ([`OnceLock`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use tensora_format::Checkpoint;
use tensora_io::{
    BackendChoice, BoxError, LoadOptions, LoadReport, PieceRef, ReadHook, TensorHook, TensorRef,
};

use crate::check::BackendDigests;
use crate::digest::{Algo, Digest, crc32c_combine};
use crate::hash::HashError;

/// The CRC-32C of a run of a tensor's bytes, `offset_bytes .. offset_bytes + len_bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CrcRun {
    pub(crate) offset_bytes: u64,
    pub(crate) len_bytes: u64,
    pub(crate) crc: u32,
}

/// The runs of one tensor digested so far. Runs never overlap (checked on arrival), so their
/// count is bounded by the tensor's `nbytes`; a run that continues the last one is merged into
/// it, so pieces arriving in order keep one run.
#[derive(Debug, Default)]
pub(crate) struct Runs {
    pub(crate) runs: Vec<CrcRun>,
    pub(crate) covered_bytes: u64,
}

impl Runs {
    /// Add `run` of a tensor of `nbytes` digested bytes, merging it into the last run when it
    /// continues it. Errors (naming `name`) when the covered bytes would pass `nbytes`, which
    /// only bytes delivered twice can cause.
    pub(crate) fn push(&mut self, run: CrcRun, nbytes: u64, name: &str) -> Result<(), BoxError> {
        if self.covered_bytes + run.len_bytes > nbytes {
            return Err(
                format!("tensor {name:?}: bytes at offset {} delivered twice", run.offset_bytes).into()
            );
        }
        self.covered_bytes += run.len_bytes;
        match self.runs.last_mut() {
            Some(last) if last.offset_bytes + last.len_bytes == run.offset_bytes => {
                last.crc = crc32c_combine(last.crc, run.crc, run.len_bytes);
                last.len_bytes += run.len_bytes;
            }
            _ => self.runs.push(run),
        }
        Ok(())
    }
}

/// How many bytes each hook digested (see [`DigestCollector::stats`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DigestStats {
    /// Digested by the read hook, right after their read landed.
    pub bytes_on_arrival: u64,
    /// Digested by the tensor hook from the completed tensor (a second pass over those bytes).
    pub bytes_at_completion: u64,
}

/// Collects one digest per tensor from load workers.
#[derive(Debug)]
pub struct DigestCollector {
    algo: Algo,
    index: HashMap<String, usize>,
    /// Tensor names, in [`Checkpoint::tensors`] order.
    names: Vec<String>,
    /// `nbytes` of each tensor (the digested length), in [`Checkpoint::tensors`] order.
    nbytes: Vec<u64>,
    /// One per tensor for crc32c; empty for the other algorithms.
    runs: Vec<Mutex<Runs>>,
    slots: Vec<OnceLock<Digest>>,
    bytes_on_arrival: AtomicU64,
    bytes_at_completion: AtomicU64,
}

impl DigestCollector {
    /// A collector for every tensor of `ckpt`.
    ///
    /// ```
    /// use tensora_io::LoadOptions;
    /// use tensora_verify::{Algo, DigestCollector};
    ///
    /// let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/real/fracast-0.safetensors");
    /// let ckpt = tensora_format::open(path)?;
    /// let collector = DigestCollector::new(&ckpt, Algo::Crc32c);
    /// let mut opts = LoadOptions::default();
    /// collector.install(&mut opts);
    /// let loaded = tensora_io::load(&ckpt, &opts)?;
    /// let digests = collector.finish(&ckpt)?;
    /// for (t, d) in ckpt.tensors().iter().zip(&digests) {
    ///     assert_eq!(*d, Algo::Crc32c.digest(&loaded.tensor(t.name()).unwrap().bytes()[..t.nbytes() as usize]));
    /// }
    /// // Every byte was digested as its read landed; none needed a second pass.
    /// assert_eq!(collector.stats().bytes_at_completion, 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new(ckpt: &Checkpoint, algo: Algo) -> Arc<DigestCollector> {
        let tensors = ckpt.tensors();
        let index = tensors.iter().enumerate().map(|(i, t)| (t.name().to_owned(), i)).collect();
        let names = tensors.iter().map(|t| t.name().to_owned()).collect();
        let nbytes = tensors.iter().map(|t| t.nbytes()).collect();
        let runs = match algo {
            Algo::Crc32c => tensors.iter().map(|_| Mutex::new(Runs::default())).collect(),
            Algo::Xxh3 | Algo::Sha256 => Vec::new(),
        };
        let slots = tensors.iter().map(|_| OnceLock::new()).collect();
        Arc::new(DigestCollector {
            algo,
            index,
            names,
            nbytes,
            runs,
            slots,
            bytes_on_arrival: AtomicU64::new(0),
            bytes_at_completion: AtomicU64::new(0),
        })
    }

    /// A collector for the same checkpoint and algorithm with nothing recorded yet (for another
    /// load: pieces of a load that failed stay in the collector that saw them).
    pub fn fresh(&self) -> Arc<DigestCollector> {
        Arc::new(DigestCollector {
            algo: self.algo,
            index: self.index.clone(),
            names: self.names.clone(),
            nbytes: self.nbytes.clone(),
            runs: self.runs.iter().map(|_| Mutex::new(Runs::default())).collect(),
            slots: self.slots.iter().map(|_| OnceLock::new()).collect(),
            bytes_on_arrival: AtomicU64::new(0),
            bytes_at_completion: AtomicU64::new(0),
        })
    }

    /// The index in [`Checkpoint::tensors`] of the tensor called `name`.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.index.get(name).copied()
    }

    /// The name of tensor `i` (of [`Checkpoint::tensors`]).
    pub fn name_of(&self, i: usize) -> Option<&str> {
        self.names.get(i).map(String::as_str)
    }

    /// The digested length (`nbytes`) of tensor `i` (of [`Checkpoint::tensors`]).
    pub fn nbytes(&self, i: usize) -> Option<u64> {
        self.nbytes.get(i).copied()
    }

    /// The algorithm this collector digests with.
    pub fn algo(&self) -> Algo {
        self.algo
    }

    /// Whether this algorithm digests pieces as they land (crc32c); the others digest whole
    /// tensors in [`DigestCollector::record`].
    pub fn digests_pieces(&self) -> bool {
        !self.runs.is_empty()
    }

    /// Digest one piece of a tensor as its read lands (crc32c; a no-op for the other algorithms,
    /// which digest whole tensors in [`DigestCollector::record`]). Only the tensor's first `nbytes`
    /// bytes count. Errors if the tensor is unknown or bytes of it arrive twice.
    pub fn record_piece(&self, piece: &PieceRef<'_>) -> Result<(), BoxError> {
        let name = piece.info.name();
        if self
            .runs
            .get(piece.tensor_index)
            .is_some_and(|_| self.index.get(name) != Some(&piece.tensor_index))
        {
            return Err(
                format!("tensor {name:?} is not tensor {} of the checkpoint", piece.tensor_index).into()
            );
        }
        self.record_piece_at(piece.tensor_index, name, piece.offset_in_tensor_bytes, piece.bytes)
    }

    /// Digest one piece of tensor `tensor_index` (its bytes `offset_bytes ..` of storage), clipped
    /// to the tensor's first `nbytes` bytes. A no-op for algorithms that do not combine pieces.
    /// Errors if the tensor is unknown or bytes of it arrive twice.
    fn record_piece_at(
        &self,
        tensor_index: usize,
        name: &str,
        offset_bytes: u64,
        bytes: &[u8],
    ) -> Result<(), BoxError> {
        let Some(runs) = self.runs.get(tensor_index) else {
            if self.runs.is_empty() {
                return Ok(());
            }
            return Err(format!("tensor {name:?}: index {tensor_index} is not in the checkpoint").into());
        };
        let nbytes = self.nbytes[tensor_index];
        if offset_bytes >= nbytes {
            return Ok(()); // storage past the digested bytes (ServerlessLLM padding)
        }
        let take = usize::try_from((nbytes - offset_bytes).min(bytes.len() as u64))
            .map_err(|_| "piece larger than the address space")?;
        if take == 0 {
            return Ok(());
        }
        let run = CrcRun { offset_bytes, len_bytes: take as u64, crc: crc32c::crc32c(&bytes[..take]) };
        runs.lock().unwrap_or_else(|p| p.into_inner()).push(run, nbytes, name)?;
        self.bytes_on_arrival.fetch_add(run.len_bytes, Ordering::Relaxed);
        Ok(())
    }

    /// Digest one completed tensor: its first `nbytes` bytes (a ServerlessLLM tensor's storage may
    /// be longer). For crc32c, the CRCs of the pieces the read hook saw are combined and only the
    /// bytes no piece covered are read again. With strides that are not row-major some elements
    /// lie past those bytes; the digest keeps this definition and `verify` warns about such
    /// tensors ([`crate::check::FindingKind::Strided`]). Errors if the tensor is unknown, if its
    /// pieces overlap, or if it arrives twice with a different digest.
    pub fn record(&self, t: &TensorRef<'_>) -> Result<(), BoxError> {
        self.record_digest(t).map(|_| ())
    }

    /// [`DigestCollector::record`], returning the tensor's digest.
    pub fn record_digest(&self, t: &TensorRef<'_>) -> Result<Digest, BoxError> {
        let i = *self
            .index
            .get(t.name())
            .ok_or_else(|| format!("tensor {:?} is not in the checkpoint", t.name()))?;
        let nbytes = usize::try_from(self.nbytes[i]).map_err(|_| "tensor larger than the address space")?;
        let bytes = t.bytes();
        let data = bytes.get(..nbytes).ok_or_else(|| {
            format!("tensor {:?}: {} bytes delivered, {nbytes} needed", t.name(), bytes.len())
        })?;
        let d = match self.runs.get(i) {
            None => {
                self.bytes_at_completion.fetch_add(data.len() as u64, Ordering::Relaxed);
                self.algo.digest(data)
            }
            Some(runs) => {
                let mut runs = std::mem::take(&mut *runs.lock().unwrap_or_else(|p| p.into_inner())).runs;
                runs.sort_unstable_by_key(|r| r.offset_bytes);
                Digest::from_crc32c(self.combine_runs(t.name(), data, &runs)?)
            }
        };
        match self.slots[i].set(d) {
            Ok(()) => Ok(d),
            Err(_) if self.slots[i].get() == Some(&d) => Ok(d),
            Err(_) => Err(format!("tensor {:?} delivered twice with different bytes", t.name()).into()),
        }
    }

    /// The CRC-32C of `data` from `runs` (sorted by offset, inside `data`), digesting the gaps
    /// between them from `data`.
    fn combine_runs(&self, name: &str, data: &[u8], runs: &[CrcRun]) -> Result<u32, BoxError> {
        let mut crc = 0u32; // the CRC of nothing
        let mut cursor = 0usize;
        let mut gap_bytes = 0u64;
        let mut add_gap = |crc: u32, gap: &[u8]| {
            gap_bytes += gap.len() as u64;
            crc32c_combine(crc, crc32c::crc32c(gap), gap.len() as u64)
        };
        for run in runs {
            let start = usize::try_from(run.offset_bytes).map_err(|_| "offset past the address space")?;
            let len = usize::try_from(run.len_bytes).map_err(|_| "piece larger than the address space")?;
            if start < cursor {
                return Err(format!("tensor {name:?}: pieces overlap at offset {start}").into());
            }
            let gap =
                data.get(cursor..start).ok_or_else(|| format!("tensor {name:?}: piece past its end"))?;
            crc = add_gap(crc, gap);
            crc = crc32c_combine(crc, run.crc, run.len_bytes);
            cursor = start + len;
        }
        let tail = data.get(cursor..).ok_or_else(|| format!("tensor {name:?}: piece past its end"))?;
        crc = add_gap(crc, tail);
        self.bytes_at_completion.fetch_add(gap_bytes, Ordering::Relaxed);
        Ok(crc)
    }

    /// A hook for [`LoadOptions::on_tensor`] that calls [`DigestCollector::record`]. On its own it
    /// digests each whole tensor once it completes; with [`DigestCollector::read_hook`] also
    /// installed (see [`DigestCollector::install`]) crc32c digests come from the pieces.
    pub fn hook(self: &Arc<Self>) -> TensorHook {
        let me = Arc::clone(self);
        Arc::new(move |t: &TensorRef<'_>| me.record(t))
    }

    /// A hook for [`LoadOptions::on_read`] that calls [`DigestCollector::record_piece`], or `None`
    /// when the algorithm cannot combine pieces (XXH3, SHA-256): then [`DigestCollector::hook`]
    /// alone digests whole tensors.
    pub fn read_hook(self: &Arc<Self>) -> Option<ReadHook> {
        if !self.digests_pieces() {
            return None;
        }
        let me = Arc::clone(self);
        Some(Arc::new(move |p: &PieceRef<'_>| me.record_piece(p)))
    }

    /// Install the collector's hooks on `opts`: [`DigestCollector::hook`] as `on_tensor` and, for
    /// crc32c, [`DigestCollector::read_hook`] as `on_read`, each run before a hook already there.
    pub fn install(self: &Arc<Self>, opts: &mut LoadOptions) {
        let digest_hook = self.hook();
        opts.on_tensor = Some(match opts.on_tensor.take() {
            None => digest_hook,
            Some(user) => Arc::new(move |t: &TensorRef<'_>| {
                digest_hook(t)?;
                user(t)
            }),
        });
        if let Some(digest_hook) = self.read_hook() {
            opts.on_read = Some(match opts.on_read.take() {
                None => digest_hook,
                Some(user) => Arc::new(move |p: &PieceRef<'_>| {
                    digest_hook(p)?;
                    user(p)
                }),
            });
        }
    }

    /// How many bytes were digested as they landed and how many from completed tensors.
    pub fn stats(&self) -> DigestStats {
        DigestStats {
            bytes_on_arrival: self.bytes_on_arrival.load(Ordering::Relaxed),
            bytes_at_completion: self.bytes_at_completion.load(Ordering::Relaxed),
        }
    }

    /// The digests so far, in [`Checkpoint::tensors`] order (`None` for tensors not yet seen).
    pub fn digests(&self) -> Vec<Option<Digest>> {
        self.slots.iter().map(|s| s.get().copied()).collect()
    }

    /// Every digest, or the first tensor that has none.
    pub fn finish(&self, ckpt: &Checkpoint) -> Result<Vec<Digest>, HashError> {
        ckpt.tensors()
            .iter()
            .zip(&self.slots)
            .map(|(t, s)| {
                s.get().copied().ok_or_else(|| HashError::Incomplete {
                    tensor: t.name().to_owned(),
                    reason: "the load never delivered it".into(),
                })
            })
            .collect()
    }
}

/// Load `ckpt` with `opts` (the collector's hooks installed by [`DigestCollector::install`],
/// chained before any hooks already there) through [`tensora_io::load_streaming`], so arena space
/// is recycled and memory stays within the load's budget. Returns one digest per tensor and the
/// load report.
///
/// ```
/// use tensora_io::LoadOptions;
/// use tensora_verify::{Algo, hash_with_load};
///
/// let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/real/fracast-0.safetensors");
/// let ckpt = tensora_format::open(path)?;
/// let (digests, report) = hash_with_load(&ckpt, Algo::Crc32c, &LoadOptions::default())?;
/// assert_eq!(digests.len(), ckpt.tensors().len());
/// assert_eq!(report.tensors, ckpt.tensors().len());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn hash_with_load(
    ckpt: &Checkpoint,
    algo: Algo,
    opts: &LoadOptions,
) -> Result<(Vec<Digest>, LoadReport), HashError> {
    let collector = DigestCollector::new(ckpt, algo);
    let mut opts = opts.clone();
    collector.install(&mut opts);
    let report = tensora_io::load_streaming(ckpt, &opts, |_| Ok(()))?;
    Ok((collector.finish(ckpt)?, report))
}

/// Load `ckpt` once with every backend of [`tensora_io::registry`] and collect each one's digests
/// (for [`crate::check::VerifyOptions::cross_check`]). A backend that cannot run here is marked
/// unavailable, with its probe's reason.
pub fn cross_check(ckpt: &Checkpoint, algo: Algo) -> Vec<BackendDigests> {
    tensora_io::registry::backends()
        .into_iter()
        .map(|backend| {
            let name = backend.name().to_owned();
            if let Err(reason) = backend.available() {
                return BackendDigests { backend: name, result: Err(reason), unavailable: true };
            }
            let opts = LoadOptions { backend: BackendChoice::Named(name.clone()), ..LoadOptions::default() };
            let result = hash_with_load(ckpt, algo, &opts).map(|(d, _)| d).map_err(|e| e.to_string());
            BackendDigests { backend: name, result, unavailable: false }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const TINY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/serverlessllm/tiny");
    const REAL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/real/fracast-0.safetensors");

    /// The ServerlessLLM fixture (tied tensors, storage longer than `nbytes`, an empty tensor) and
    /// a safetensors fixture, each loaded once.
    fn loaded() -> &'static [(Checkpoint, tensora_io::Loaded)] {
        static LOADED: OnceLock<Vec<(Checkpoint, tensora_io::Loaded)>> = OnceLock::new();
        LOADED.get_or_init(|| {
            [TINY, REAL]
                .into_iter()
                .map(|p| {
                    let ckpt = tensora_format::open(p).unwrap();
                    let loaded = tensora_io::load(&ckpt, &LoadOptions::default()).unwrap();
                    (ckpt, loaded)
                })
                .collect()
        })
    }

    /// Cut `len` bytes into pieces at `cuts` (positions taken modulo `len + 1`).
    fn pieces(len: usize, cuts: &[usize]) -> Vec<(usize, usize)> {
        let mut points: Vec<usize> = cuts.iter().map(|c| c % (len + 1)).collect();
        points.extend([0, len]);
        points.sort_unstable();
        points.dedup();
        points.windows(2).map(|w| (w[0], w[1])).collect()
    }

    #[test]
    fn the_tensor_hook_alone_digests_whole_tensors() {
        for (ckpt, loaded) in loaded() {
            for algo in Algo::ALL {
                let c = DigestCollector::new(ckpt, algo);
                assert_eq!(c.digests_pieces(), algo == Algo::Crc32c);
                for t in loaded.tensors() {
                    c.record(&t).unwrap();
                }
                let digests = c.finish(ckpt).unwrap();
                for (t, d) in ckpt.tensors().iter().zip(&digests) {
                    let bytes = loaded.tensor(t.name()).unwrap().bytes();
                    assert_eq!(*d, algo.digest(&bytes[..t.nbytes() as usize]), "{}", t.name());
                }
                let stats = c.stats();
                assert_eq!(stats.bytes_on_arrival, 0);
                assert_eq!(stats.bytes_at_completion, ckpt.tensors().iter().map(|t| t.nbytes()).sum::<u64>());
            }
        }
    }

    #[test]
    fn bytes_delivered_twice_are_an_error_naming_the_tensor() {
        let (ckpt, loaded) = &loaded()[1];
        let (i, t) = ckpt.tensors().iter().enumerate().find(|(_, t)| t.nbytes() >= 64).unwrap();
        let bytes = loaded.tensor(t.name()).unwrap().bytes();
        let n = t.nbytes() as usize;

        // Overlapping pieces that together exceed the tensor: refused on arrival.
        let c = DigestCollector::new(ckpt, Algo::Crc32c);
        c.record_piece_at(i, t.name(), 0, &bytes[..n]).unwrap();
        let err = c.record_piece_at(i, t.name(), 8, &bytes[8..16]).unwrap_err();
        assert!(err.to_string().contains(t.name()), "{err}");

        // Overlapping pieces that leave a gap elsewhere: refused when the tensor completes.
        let c = DigestCollector::new(ckpt, Algo::Crc32c);
        c.record_piece_at(i, t.name(), 0, &bytes[..32]).unwrap();
        c.record_piece_at(i, t.name(), 16, &bytes[16..32]).unwrap();
        let err = c.record(&loaded.tensor(t.name()).unwrap()).unwrap_err();
        assert!(err.to_string().contains("overlap"), "{err}");
        assert_eq!(c.digests()[i], None);

        // An index outside the checkpoint.
        let err = c.record_piece_at(ckpt.tensors().len(), "x", 0, &bytes[..1]).unwrap_err();
        assert!(err.to_string().contains("not in the checkpoint"), "{err}");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Pieces cut anywhere, arriving in any order, some never arriving: the combined digest
        /// equals the one-shot digest, and only the missing bytes are digested at completion.
        #[test]
        fn pieces_in_any_split_and_order_combine_to_the_one_shot_digest(
            fixture in 0usize..2,
            cuts in proptest::collection::vec(any::<usize>(), 0..12),
            order_seed in any::<u64>(),
            dropped in any::<u64>(),
            past_end_bytes in 0usize..64,
        ) {
            let (ckpt, loaded) = &loaded()[fixture];
            let c = DigestCollector::new(ckpt, Algo::Crc32c);
            let mut arrived_bytes = 0u64;
            for (i, t) in ckpt.tensors().iter().enumerate() {
                let storage = loaded.tensor(t.name()).unwrap().bytes();
                let n = t.nbytes() as usize;
                let mut ps = pieces(storage.len(), &cuts);
                // A deterministic shuffle from the seed.
                let mut state = order_seed ^ i as u64;
                for k in (1..ps.len()).rev() {
                    state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    ps.swap(k, (state >> 33) as usize % (k + 1));
                }
                for (k, &(start, end)) in ps.iter().enumerate() {
                    if dropped >> (k % 64) & 1 == 1 {
                        continue;
                    }
                    c.record_piece_at(i, t.name(), start as u64, &storage[start..end]).unwrap();
                    arrived_bytes += (end.min(n).saturating_sub(start)) as u64;
                }
                // A piece wholly past the digested bytes changes nothing.
                if past_end_bytes > 0 {
                    c.record_piece_at(i, t.name(), n as u64 + 1, &[0; 64][..past_end_bytes]).unwrap();
                }
            }
            for t in loaded.tensors() {
                c.record(&t).unwrap();
            }
            let digests = c.finish(ckpt).unwrap();
            for (t, d) in ckpt.tensors().iter().zip(&digests) {
                let bytes = loaded.tensor(t.name()).unwrap().bytes();
                prop_assert_eq!(*d, Algo::Crc32c.digest(&bytes[..t.nbytes() as usize]), "{}", t.name());
            }
            let total: u64 = ckpt.tensors().iter().map(|t| t.nbytes()).sum();
            prop_assert_eq!(c.stats(), DigestStats { bytes_on_arrival: arrived_bytes, bytes_at_completion: total - arrived_bytes });
        }
    }
}
