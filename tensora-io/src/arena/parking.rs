//! The one parked arena of [`Arena::recycle`] (see the module docs of [`crate::arena`]).

use super::Arena;

/// Largest arena [`Arena::recycle`] parks; larger ones are unmapped.
pub const RECYCLE_BYTES_MAX: u64 = 64 << 30;
/// A parked arena is reused only for requests of at least `1 / RECYCLE_FIT_RATIO` of its length, so
/// a huge parked arena is not pinned by a small load.
const RECYCLE_FIT_RATIO: u64 = 4;

/// A slot holding at most one released arena (see the module docs).
#[derive(Debug)]
pub(super) struct Parking(std::sync::Mutex<Option<Arena>>);

impl Parking {
    const fn new() -> Parking {
        Parking(std::sync::Mutex::new(None))
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Option<Arena>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The parked arena, resized to `len_bytes`, if its mapping fits the request.
    pub(super) fn take_fitting(&self, len_bytes: u64) -> Option<Arena> {
        let mut slot = self.slot();
        let cap = slot.as_ref()?.map_len_bytes as u64;
        if len_bytes == 0 || len_bytes > cap || len_bytes.saturating_mul(RECYCLE_FIT_RATIO) < cap {
            return None;
        }
        let mut a = slot.take()?;
        a.len_bytes = len_bytes as usize;
        Some(a)
    }

    /// Unmap the parked arena if its mapping is larger than `len_bytes`.
    fn drop_larger_than(&self, len_bytes: u64) {
        let mut slot = self.slot();
        if slot.as_ref().is_some_and(|a| a.map_len_bytes as u64 > len_bytes) {
            let parked = slot.take();
            drop(slot);
            drop(parked);
        }
    }

    /// `MADV_FREE` and park `arena`, unmapping the one parked before. Arenas that are empty, over
    /// [`RECYCLE_BYTES_MAX`], or whose advice fails are unmapped instead.
    pub(super) fn park(&self, arena: Arena) {
        // A held arena's memory may still be read after the hold's load: parked, it would be
        // handed to the next load, which writes into it.
        if arena.map_len_bytes == 0
            || arena.map_len_bytes as u64 > RECYCLE_BYTES_MAX
            || arena.is_kept_mapped()
        {
            return;
        }
        // SAFETY: advising the arena's own private anonymous mapping, which nothing else references
        // (`arena` is owned); MADV_FREE only lets the kernel drop the contents.
        let rc = unsafe { libc::madvise(arena.ptr.as_ptr().cast(), arena.map_len_bytes, libc::MADV_FREE) };
        if rc != 0 {
            return; // Unsupported (kernel < 4.5): just unmap.
        }
        let previous = self.slot().replace(arena);
        drop(previous);
    }
}

/// The process-wide parking slot.
pub(super) static RECYCLED: Parking = Parking::new();

/// Unmap the parked arena, if any, returning its memory to the system now.
pub fn drop_recycled() {
    let parked = RECYCLED.slot().take();
    drop(parked);
}

/// Unmap the parked arena if its mapping is larger than `len_bytes` (a streaming load calls this
/// with its budget, so lazily freed pages of an earlier owned load do not linger in its RSS).
pub fn drop_recycled_larger_than(len_bytes: u64) {
    RECYCLED.drop_larger_than(len_bytes);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parked_arenas_are_reused_only_when_they_fit() {
        let parking = Parking::new(); // private slot: no other test can race with it
        let mut a = Arena::with_len(4 << 20).unwrap();
        a.as_mut_slice().fill(7);
        let addr = a.as_ptr() as usize;
        parking.park(a);
        assert!(parking.take_fitting(4096).is_none(), "a small request does not pin a big arena");
        assert!(parking.take_fitting(5 << 20).is_none(), "too big");
        assert!(parking.take_fitting(0).is_none());
        let mut b = parking.take_fitting(3 << 20).unwrap();
        assert_eq!(b.as_ptr() as usize, addr);
        assert_eq!(b.len_bytes(), 3 << 20);
        assert!(b.as_slice().iter().all(|&x| x == 7 || x == 0), "old contents or zeros");
        assert!(parking.take_fitting(3 << 20).is_none(), "taken");
        parking.park(b);
        parking.park(Arena::with_len(1 << 20).unwrap()); // replaces (unmaps) the first
        assert!(parking.take_fitting(3 << 20).is_none());
        assert!(parking.take_fitting(1 << 20).is_some());
        parking.park(Arena::empty());
        assert!(parking.slot().is_none(), "empty arenas are not parked");
        // The global slot works the same way through the public API.
        Arena::with_len(2 << 20).unwrap().recycle();
        assert_eq!(Arena::recycled(2 << 20).unwrap().len_bytes(), 2 << 20);
        drop_recycled();
        let parking = Parking::new();
        parking.park(Arena::with_len(4 << 20).unwrap());
        parking.drop_larger_than(4 << 20);
        assert!(parking.slot().is_some(), "not larger: kept");
        parking.drop_larger_than(2 << 20);
        assert!(parking.slot().is_none(), "larger: unmapped");
    }

    #[test]
    fn a_kept_arena_is_not_parked_and_stays_mapped_until_the_last_keep_goes() {
        let parking = Parking::new();
        let mut arena = Arena::with_len(4 << 20).unwrap();
        arena.as_mut_slice()[5] = 7;
        let keep = arena.keep_mapped();
        assert!(arena.is_kept_mapped());
        parking.park(arena);
        assert!(parking.slot().is_none(), "a held arena is never handed to another load");
        let piece = keep.piece(5, 1).unwrap();
        drop(keep);
        let file = tempfile::tempfile().unwrap();
        piece.write_at(&file, 0..1, 0).unwrap();
        let mut back = [0u8];
        std::os::unix::fs::FileExt::read_exact_at(&file, &mut back, 0).unwrap();
        assert_eq!(back, [7]);
        // Without a keep-alive it is parked.
        let arena = Arena::with_len(4 << 20).unwrap();
        assert!(!arena.is_kept_mapped());
        parking.park(arena);
        assert!(parking.slot().is_some());
    }
}
