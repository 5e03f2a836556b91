//! A counting global allocator for measuring peak heap in benchmarks and tests.
//!
//! It forwards every call to [`System`] and, while counting is enabled, tracks live heap bytes and
//! their high-water mark. A bench or test installs it with no `unsafe` of its own:
//!
//! ```
//! use tensora_testkit::CountingAlloc;
//!
//! #[global_allocator]
//! static ALLOC: CountingAlloc = CountingAlloc::new();
//!
//! let (v, peak_bytes) = ALLOC.peak_during(|| vec![0u8; 1 << 20]);
//! assert_eq!(v.len(), 1 << 20);
//! assert!(peak_bytes >= 1 << 20);
//! ```

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Counts live heap bytes and their peak while enabled; delegates to the system allocator.
/// Counting is off outside [`CountingAlloc::peak_during`], so timed runs are not skewed.
#[derive(Debug)]
pub struct CountingAlloc {
    enabled: AtomicBool,
    live_bytes: AtomicUsize,
    peak_bytes: AtomicUsize,
}

impl CountingAlloc {
    /// A counter that is off until [`CountingAlloc::peak_during`].
    pub const fn new() -> CountingAlloc {
        CountingAlloc {
            enabled: AtomicBool::new(false),
            live_bytes: AtomicUsize::new(0),
            peak_bytes: AtomicUsize::new(0),
        }
    }

    fn added(&self, bytes: usize) {
        if !self.enabled.load(Ordering::Relaxed) {
            return;
        }
        let now = self.live_bytes.fetch_add(bytes, Ordering::Relaxed).saturating_add(bytes);
        self.peak_bytes.fetch_max(now, Ordering::Relaxed);
    }

    fn removed(&self, bytes: usize) {
        if !self.enabled.load(Ordering::Relaxed) {
            return;
        }
        // Saturating: a free of memory allocated before counting started must not wrap.
        let _ = self
            .live_bytes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |live| Some(live.saturating_sub(bytes)));
    }

    /// Run `f` and return the peak heap growth it caused, in bytes. Frees of memory allocated
    /// before counting started are clamped at zero, so `f` should only drop what it allocated.
    pub fn peak_during<T>(&self, f: impl FnOnce() -> T) -> (T, usize) {
        self.live_bytes.store(0, Ordering::Relaxed);
        self.peak_bytes.store(0, Ordering::Relaxed);
        self.enabled.store(true, Ordering::Relaxed);
        let out = f();
        self.enabled.store(false, Ordering::Relaxed);
        (out, self.peak_bytes.load(Ordering::Relaxed))
    }
}

impl Default for CountingAlloc {
    fn default() -> Self {
        CountingAlloc::new()
    }
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged, so `System`'s
// guarantees are ours; the counters are plain atomics and never affect the memory handed out.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded unchanged; the caller upholds `GlobalAlloc::alloc`'s contract.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            self.added(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            self.added(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator (hence from `System`) with this `layout`.
        unsafe { System.dealloc(ptr, layout) };
        self.removed(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr`/`layout` came from this allocator; the caller upholds `realloc`'s contract.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            if new_size <= layout.size() {
                // Shrinking needs no new block (the allocator trims in place or remaps).
                self.removed(layout.size() - new_size);
            } else {
                // Growing may copy into a new block: both count until the old one is freed.
                self.added(new_size);
                self.removed(layout.size());
            }
        }
        p
    }
}
