//! Memory that Python arrays point into, and the counter that proves it is freed.
//!
//! Every buffer handed to Python is a `TensorData` holding an `Arc<Owner>`. An [`Owner`] is a
//! load (`tensora_io::Loaded`: an arena or mapped views), private copy-on-write file mappings,
//! or one heap copy. The
//! memory lives exactly as long as the last `TensorData` (and so the last numpy array, torch
//! tensor or DLPack capsule) that refers to it.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tensora_format::Dtype;

/// Owners alive in this process (test support: proves the last array frees the memory).
static OWNERS_LIVE: AtomicUsize = AtomicUsize::new(0);

/// How many [`Owner`]s are alive now.
pub fn owners_live() -> usize {
    OWNERS_LIVE.load(Ordering::SeqCst)
}

/// Most per-call mappings (a repeated `safe_open` `get_tensor`) alive at once in this process;
/// beyond it a repeated `get_tensor` copies to the heap. Far below `vm.max_map_count` (65,530 by
/// default), which the process shares with everything else it maps.
pub const CALL_MAPPINGS_MAX: usize = 1024;

/// Per-call mappings alive in this process (the slots taken).
static CALL_MAPPINGS_LIVE: AtomicUsize = AtomicUsize::new(0);

/// How many per-call mappings are alive now (at most [`CALL_MAPPINGS_MAX`]).
pub fn call_mappings_live() -> usize {
    CALL_MAPPINGS_LIVE.load(Ordering::SeqCst)
}

/// One of the [`CALL_MAPPINGS_MAX`] per-call mapping slots, given back when dropped.
#[derive(Debug)]
pub struct CallSlot(());

impl CallSlot {
    /// A slot, or `None` when [`CALL_MAPPINGS_MAX`] are taken.
    pub fn try_take() -> Option<CallSlot> {
        CALL_MAPPINGS_LIVE
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| (n < CALL_MAPPINGS_MAX).then_some(n + 1))
            .ok()
            .map(|_| CallSlot(()))
    }
}

impl Drop for CallSlot {
    fn drop(&mut self) {
        CALL_MAPPINGS_LIVE.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Where the bytes of a set of tensors live.
#[derive(Debug)]
pub enum Storage {
    /// A `tensora_io::load`: its hugepage arena, or (`Residence::Mapped`) its private
    /// copy-on-write mappings of the files. Exported addresses come from
    /// `Loaded::tensor_mut_ptr`.
    Loaded(Box<tensora_io::Loaded>),
    /// `MAP_PRIVATE` writable (copy-on-write) mappings (`safe_open`: one of each whole file,
    /// shared by the first `get_tensor` of every tensor): writes never reach the file.
    Mapped(Vec<memmap2::MmapMut>),
    /// One tensor's own copy-on-write mapping (`safe_open`: a repeated `get_tensor` of a name),
    /// holding one of the [`CALL_MAPPINGS_MAX`] slots.
    CallMapped(memmap2::MmapMut, CallSlot),
    /// Bytes in 8-byte words (aligned for every element type), e.g. built by a caller in Rust.
    Heap(Box<[u64]>),
}

/// Keeps a [`Storage`] alive and counts itself in [`owners_live`].
#[derive(Debug)]
pub struct Owner {
    storage: Storage,
}

impl Owner {
    /// An owner of `storage`, counted in [`owners_live`] until dropped.
    pub fn new(storage: Storage) -> Arc<Owner> {
        OWNERS_LIVE.fetch_add(1, Ordering::SeqCst);
        Arc::new(Owner { storage })
    }

    /// What is kept alive.
    pub fn storage(&self) -> &Storage {
        &self.storage
    }
}

impl Drop for Owner {
    fn drop(&mut self) {
        OWNERS_LIVE.fetch_sub(1, Ordering::SeqCst);
    }
}

/// One tensor as Python sees it: an address inside an [`Owner`], its length and layout.
///
/// The address stays valid while `owner` lives: every [`Storage`] variant keeps its memory at a
/// fixed address until dropped (an arena or mapping is never moved or remapped, a boxed slice is
/// never reallocated).
#[derive(Debug, Clone)]
pub struct TensorBytes {
    /// What keeps the bytes alive.
    pub owner: Arc<Owner>,
    /// Address of the first byte (kept as an integer so the type is `Send + Sync`).
    pub addr: usize,
    /// Length in bytes.
    pub len_bytes: usize,
    /// The tensor's name.
    pub name: String,
    /// Its dtype.
    pub dtype: Dtype,
    /// Its shape.
    pub shape: Vec<u64>,
    /// Strides in elements when the format records them; `None` is row-major.
    pub strides: Option<Vec<u64>>,
}

/// Where an exported tensor's bytes are (see [`TensorBytes::into_aligned`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// In its owner's memory, zero copy.
    InPlace,
    /// Copied into 8-byte-aligned memory of its own, because its address was not a multiple of
    /// its dtype's alignment.
    AlignedCopy,
}

/// Memory for an aligned copy could not be had.
#[derive(Debug, thiserror::Error)]
#[error("tensor {tensor:?}: no memory for an aligned copy of its {len_bytes} bytes")]
pub struct AlignCopyError {
    /// The tensor.
    pub tensor: String,
    /// Its length.
    pub len_bytes: usize,
}

impl TensorBytes {
    /// `self` when its address is a multiple of its dtype's alignment
    /// ([`Dtype::align_bytes`]), else a copy of its bytes in 8-byte-aligned memory of its own.
    ///
    /// Safetensors allows a tensor at any file offset, and every storage here keeps the file's
    /// offset modulo the page size (the arena, the mappings), so a tensor whose offset is not a
    /// multiple of its element size would reach Python misaligned; torch and numpy's fast paths
    /// assume aligned elements. Files written by HF `safetensors` are always aligned (it pads the
    /// header to 8 bytes), so this copy is the exception; callers report it.
    ///
    /// ```
    /// use tensora::owner::{Owner, Placement, Storage, TensorBytes};
    ///
    /// let mut words = vec![0u64; 2].into_boxed_slice();
    /// let base = words.as_mut_ptr() as usize;
    /// let at = |addr: usize| TensorBytes {
    ///     owner: Owner::new(Storage::Heap(words.clone())), addr, len_bytes: 4, name: "x".into(),
    ///     dtype: tensora_format::Dtype::F32, shape: vec![1], strides: None,
    /// };
    /// let (t, how) = at(base + 4).into_aligned()?;
    /// assert_eq!((t.addr, how), (base + 4, Placement::InPlace));
    /// let (t, how) = at(base + 1).into_aligned()?;
    /// assert_eq!((t.addr % 4, how), (0, Placement::AlignedCopy));
    /// # Ok::<(), tensora::owner::AlignCopyError>(())
    /// ```
    pub fn into_aligned(self) -> Result<(TensorBytes, Placement), AlignCopyError> {
        let align = usize::try_from(self.dtype.align_bytes()).unwrap_or(8).max(1);
        if self.len_bytes == 0 || self.addr.is_multiple_of(align) {
            return Ok((self, Placement::InPlace));
        }
        let oom = || AlignCopyError { tensor: self.name.clone(), len_bytes: self.len_bytes };
        let words_len = self.len_bytes.div_ceil(8);
        let mut words: Vec<u64> = Vec::new();
        words.try_reserve_exact(words_len).map_err(|_| oom())?;
        words.resize(words_len, 0);
        let mut words = words.into_boxed_slice();
        // SAFETY: the source `addr .. addr + len_bytes` lies in memory that `self.owner` (alive
        // for the call) keeps mapped; no Rust reference to it exists, and Python has not been
        // given this tensor yet. The destination holds `8 * words_len >= len_bytes` bytes of
        // its own, so the ranges do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.addr as *const u8,
                words.as_mut_ptr().cast::<u8>(),
                self.len_bytes,
            );
        }
        let addr = words.as_mut_ptr() as usize;
        let copy = TensorBytes { owner: Owner::new(Storage::Heap(words)), addr, ..self };
        Ok((copy, Placement::AlignedCopy))
    }
}

#[cfg(test)]
pub(crate) static TEST_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counter_follows_the_last_clone() {
        let _serial = TEST_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let before = owners_live();
        let a = Owner::new(Storage::Heap(vec![1u64, 2].into_boxed_slice()));
        let b = Arc::clone(&a);
        assert_eq!(owners_live(), before + 1);
        drop(a);
        assert_eq!(owners_live(), before + 1, "a clone is still alive");
        drop(b);
        assert_eq!(owners_live(), before);
    }

    #[test]
    fn call_slots_stop_at_the_bound_and_come_back() {
        let _serial = TEST_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let before = call_mappings_live();
        let mut slots = Vec::new();
        while let Some(s) = CallSlot::try_take() {
            slots.push(s);
            assert!(slots.len() <= CALL_MAPPINGS_MAX, "more slots than the bound");
        }
        assert_eq!(call_mappings_live(), CALL_MAPPINGS_MAX);
        assert_eq!(slots.len(), CALL_MAPPINGS_MAX - before);
        slots.pop();
        assert!(CallSlot::try_take().is_some(), "a returned slot can be taken again");
        drop(slots);
        assert_eq!(call_mappings_live(), before);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]
        /// Whatever the dtype and the offset, the exported address is aligned for the dtype, the
        /// bytes are unchanged, and a copy is made exactly when the source was misaligned.
        #[test]
        fn exports_are_aligned_and_keep_their_bytes(
            dtype_i in 0usize..Dtype::ALL.len(),
            offset in 0usize..16,
            len_bytes in 0usize..64,
            seed in proptest::prelude::any::<u8>(),
        ) {
            let _serial = TEST_LOCK.lock().unwrap_or_else(|e| e.into_inner());
            let dtype = Dtype::ALL[dtype_i];
            let mut words = vec![0u64; 11].into_boxed_slice();
            // SAFETY: the words are 88 initialised bytes, any pattern is a valid u64, and no
            // other reference exists while this slice lives.
            let bytes = unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<u8>(), 88) };
            for (i, b) in bytes.iter_mut().enumerate() {
                *b = seed.wrapping_add(i as u8);
            }
            let want = bytes[offset..offset + len_bytes].to_vec();
            let addr = words.as_mut_ptr() as usize + offset;
            let owner = Owner::new(Storage::Heap(words));
            let t = TensorBytes { owner, addr, len_bytes, name: "t".into(), dtype, shape: vec![], strides: None };
            let (out, how) = t.into_aligned().unwrap();
            let align = dtype.align_bytes() as usize;
            let misaligned = len_bytes > 0 && !addr.is_multiple_of(align);
            proptest::prop_assert_eq!(how == Placement::AlignedCopy, misaligned);
            proptest::prop_assert!(out.len_bytes == 0 || out.addr.is_multiple_of(align));
            // SAFETY: `out.addr .. + len_bytes` lies in memory `out.owner` keeps alive.
            let got = unsafe { std::slice::from_raw_parts(out.addr as *const u8, out.len_bytes) };
            proptest::prop_assert_eq!(got, &want[..]);
        }
    }
}
