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
}
