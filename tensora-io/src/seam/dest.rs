//! Where bytes land: the [`Destination`] contract, and [`CallerBuffer`], caller memory (a pinned
//! staging buffer, a slab from another allocator, a slice of a larger arena) as a destination.
//! The hugepage [`Arena`](crate::arena::Arena) is the other built-in destination.
//!
//! # Example
//!
//! ```
//! use tensora_io::Destination;
//! use tensora_io::CallerBuffer;
//!
//! let mut memory = vec![0u8; 4096];
//! let dest = CallerBuffer::new(&mut memory);
//! assert_eq!(dest.len_bytes(), 4096);
//! drop(dest);
//! assert_eq!(memory.len(), 4096);
//! ```

use std::io;
use std::marker::PhantomData;
use std::ptr::NonNull;

/// Where bytes land.
///
/// # Safety
///
/// Implementors guarantee that [`Destination::host_ptr`] points to `len_bytes()` bytes of
/// writable, **initialised** memory that stays valid and does not move for as long as the
/// destination lives, and that writing to disjoint ranges of it from several threads at once is
/// sound. Initialised matters: backends make `&mut [u8]` over a read's range (the `sync` backend
/// hands it to [`ReadAt`](crate::backends::sync::ReadAt)), which is undefined behaviour over uninitialised
/// bytes. An [`Arena`](crate::arena::Arena) is zero-filled anonymous memory and a
/// [`CallerBuffer`](CallerBuffer) comes from a `&mut [u8]`, so both qualify; a
/// staging buffer from a device allocator must be zeroed (or otherwise written) once before use.
/// Backends write only inside the ranges the plan gives them, and a plan's reads never overlap.
///
/// A pinned-memory or GPU staging sink implements this by exposing a host staging buffer and
/// doing its device copy in [`Destination::on_landed`]; neither the planner nor the backends change.
pub unsafe trait Destination: Send + Sync {
    /// Usable length in bytes.
    fn len_bytes(&self) -> u64;
    /// Base of the host-writable memory.
    fn host_ptr(&self) -> NonNull<u8>;
    /// Alignment of `host_ptr` in bytes (a power of two). O_DIRECT needs at least the block size.
    fn align_bytes(&self) -> u64;
    /// Called by the backend after `len_bytes` have landed at `offset_bytes` (a whole plan read).
    /// A device sink starts its copy here. It may be called from any worker thread.
    fn on_landed(&self, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
        let _ = (offset_bytes, len_bytes);
        Ok(())
    }
}

/// Largest alignment [`CallerBuffer`] reports (one huge page); larger alignments are not useful.
const REPORTED_ALIGN_MAX_BYTES: u64 = 2 << 20;

/// Borrowed caller memory as a [`Destination`]. Holding the exclusive borrow for `'a` means the
/// caller cannot read or move the memory while backends write into it.
#[derive(Debug)]
pub struct CallerBuffer<'a> {
    ptr: NonNull<u8>,
    len_bytes: usize,
    _borrow: PhantomData<&'a mut [u8]>,
}

// SAFETY: a `CallerBuffer` is an exclusive borrow of plain bytes; sending it is like sending the
// `&mut [u8]` it came from.
unsafe impl Send for CallerBuffer<'_> {}
// SAFETY: shared access only hands out the base pointer; writes through it follow the
// `Destination` contract (disjoint ranges).
unsafe impl Sync for CallerBuffer<'_> {}

impl<'a> CallerBuffer<'a> {
    /// Wrap `memory`; it must stay borrowed until the load that writes into it is done.
    pub fn new(memory: &'a mut [u8]) -> CallerBuffer<'a> {
        let len_bytes = memory.len();
        // A slice pointer is never null (a dangling, aligned one for an empty slice).
        let ptr = NonNull::from(memory).cast::<u8>();
        CallerBuffer { ptr, len_bytes, _borrow: PhantomData }
    }

    /// The memory, readable again once no backend writes into it (proved by `&mut self`).
    pub fn as_slice(&mut self) -> &[u8] {
        // SAFETY: `ptr` came from a live `&'a mut [u8]` of `len_bytes`; the exclusive borrow rules
        // out concurrent writers.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len_bytes) }
    }
}

// SAFETY: the pointer comes from an exclusive borrow of `len_bytes` initialised bytes that lives for
// `'a`, which outlives `self`; the memory never moves while borrowed.
unsafe impl Destination for CallerBuffer<'_> {
    fn len_bytes(&self) -> u64 {
        self.len_bytes as u64
    }
    fn host_ptr(&self) -> NonNull<u8> {
        self.ptr
    }
    fn align_bytes(&self) -> u64 {
        let addr = self.ptr.as_ptr() as usize as u64;
        if addr == 0 {
            return 1;
        }
        // The largest power of two dividing the address, capped.
        (1u64 << addr.trailing_zeros()).min(REPORTED_ALIGN_MAX_BYTES)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_len_and_alignment_of_the_borrow() {
        let mut v = vec![0u64; 1024];
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut v);
        let mut b = CallerBuffer::new(&mut bytes[8..]);
        assert_eq!(b.len_bytes(), 8 * 1024 - 8);
        assert!(b.align_bytes() >= 8);
        assert!(b.align_bytes().is_power_of_two());
        assert_eq!(b.host_ptr().as_ptr() as usize as u64 % b.align_bytes(), 0);
        assert_eq!(b.as_slice().len(), 8 * 1024 - 8);
    }

    #[test]
    fn odd_offset_reports_alignment_one() {
        let mut v = vec![0u64; 4];
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut v);
        let b = CallerBuffer::new(&mut bytes[1..]);
        assert_eq!(b.align_bytes(), 1);
    }
}
