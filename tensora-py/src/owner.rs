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

/// Where the bytes of a set of tensors live.
#[derive(Debug)]
pub enum Storage {
    /// A `tensora_io::load`: its hugepage arena, or (`Residence::Mapped`) its private
    /// copy-on-write mappings of the files. Exported addresses come from
    /// `Loaded::tensor_mut_ptr`.
    Loaded(Box<tensora_io::Loaded>),
    /// `MAP_PRIVATE` writable (copy-on-write) mappings (`safe_open`: one per `get_tensor`):
    /// writes never reach the file.
    Mapped(Vec<memmap2::MmapMut>),
    /// Bytes in 8-byte words (aligned for every element type), e.g. built by a caller in Rust.
    Heap(Box<[u64]>),
}

/// Keeps a [`Storage`] alive and counts itself in [`owners_live`].
#[derive(Debug)]
pub struct Owner {
    storage: Storage,
}

impl Owner {
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
    pub owner: Arc<Owner>,
    /// Address of the first byte (kept as an integer so the type is `Send + Sync`).
    pub addr: usize,
    pub len_bytes: usize,
    pub name: String,
    pub dtype: Dtype,
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
}
