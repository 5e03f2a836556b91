//! Bytes that outlive their load: [`KeepMapped`], a destination's promise that its memory stays
//! mapped while a holder lives, and [`HeldPiece`], a filled piece of a read handed out under it
//! ([`ReadTarget::hand_out_held`](super::ReadTarget::hand_out_held)).
//!
//! A backend that copies what it read elsewhere (the remote cache's copies on disk) can then
//! land a read at once and write its pieces after the load has returned. Once the load has
//! returned, the bytes belong to the caller, who may change them at any time (an inference
//! engine rewrites weights in place after loading them), so a held piece gives out a reference to
//! them only to a holder that promises nobody writes them meanwhile
//! ([`HeldPiece::read_unchanged`], `unsafe`: only the owner of the loaded memory can know);
//! otherwise it only asks the kernel to write them to a file ([`HeldPiece::write_at`]), and what
//! was written must be checked before anyone relies on it (compared with a checksum of the bytes
//! taken before the caller could change them: the owner of the loaded memory finds them at
//! [`HeldPiece::offset_bytes`] until then).

use std::io;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;
use std::sync::Arc;

/// Keeps a destination's memory mapped for as long as it (or any [`HeldPiece`] made under it)
/// lives, even after the destination itself is dropped; the memory is unmapped when the last
/// holder goes. An arena gives one out with
/// [`Arena::keep_mapped`](crate::arena::Arena::keep_mapped); a held arena is never parked for
/// reuse, so no later load writes into memory a holder may still read.
#[derive(Clone)]
pub struct KeepMapped {
    /// Whatever unmaps the memory when dropped.
    _owner: Arc<dyn Send + Sync>,
    /// The kept memory: `base..base + len_bytes`.
    base: NonNull<u8>,
    len_bytes: usize,
}

// SAFETY: a keep-alive is an address range and the owner (`Send + Sync`) that keeps it mapped; it
// gives out no reference to the bytes.
unsafe impl Send for KeepMapped {}
// SAFETY: as for `Send`.
unsafe impl Sync for KeepMapped {}

impl KeepMapped {
    /// A keep-alive over `len_bytes` at `base`, mapped for as long as `owner` lives.
    ///
    /// # Safety
    ///
    /// `base..base + len_bytes` stays mapped (readable by the kernel) until `owner` is dropped.
    pub(crate) unsafe fn new(owner: Arc<dyn Send + Sync>, base: NonNull<u8>, len_bytes: usize) -> KeepMapped {
        KeepMapped { _owner: owner, base, len_bytes }
    }

    /// A held piece of `len_bytes` at `offset_bytes` of the kept memory; `None` outside it.
    ///
    /// ```
    /// use std::os::unix::fs::FileExt;
    /// use tensora_io::Arena;
    ///
    /// let mut arena = Arena::with_len(8192)?;
    /// arena.as_mut_slice()[..4].copy_from_slice(b"abcd");
    /// let piece = arena.keep_mapped().piece(1, 3).expect("inside the arena");
    /// drop(arena); // the piece keeps the memory mapped
    /// let file = tempfile::tempfile()?;
    /// piece.write_at(&file, 0..3, 0)?;
    /// let mut back = [0u8; 3];
    /// file.read_exact_at(&mut back, 0)?;
    /// assert_eq!(&back, b"bcd");
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn piece(&self, offset_bytes: usize, len_bytes: usize) -> Option<HeldPiece> {
        let end = offset_bytes.checked_add(len_bytes)?;
        if end > self.len_bytes {
            return None;
        }
        // SAFETY: `offset_bytes + len_bytes <= len_bytes` of the kept memory (checked above), so
        // the result stays inside the mapping.
        let ptr = unsafe { self.base.add(offset_bytes) };
        Some(HeldPiece::new(self.clone(), ptr, len_bytes))
    }

    /// Whether `ptr..ptr + len_bytes` lies inside the kept memory.
    pub(crate) fn covers(&self, ptr: NonNull<u8>, len_bytes: usize) -> bool {
        let (start, base) = (ptr.as_ptr() as usize, self.base.as_ptr() as usize);
        start >= base && start.checked_add(len_bytes).is_some_and(|end| end <= base + self.len_bytes)
    }
}

impl std::fmt::Debug for KeepMapped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeepMapped").field("len_bytes", &self.len_bytes).finish()
    }
}

/// Attempts of one `pwrite` interrupted by a signal before [`HeldPiece::write_at`] gives up.
const INTERRUPTED_RETRIES_MAX: u32 = 64;

/// A filled piece of a read that stays mapped after its load (see the module docs): its bytes
/// can be written to a file, and read as a slice only under the promise that nobody changes them
/// meanwhile, since its load's caller may be changing them.
pub struct HeldPiece {
    _keep: KeepMapped,
    ptr: NonNull<u8>,
    len_bytes: usize,
}

// SAFETY: a held piece is an address range kept mapped by `_keep` (itself `Send + Sync`); it gives
// out no reference to the bytes, only their address, and hands them to the kernel.
unsafe impl Send for HeldPiece {}
// SAFETY: as for `Send`.
unsafe impl Sync for HeldPiece {}

impl HeldPiece {
    /// A piece over `ptr..ptr + len_bytes`, which `keep` covers (checked by the caller).
    pub(crate) fn new(keep: KeepMapped, ptr: NonNull<u8>, len_bytes: usize) -> HeldPiece {
        debug_assert!(keep.covers(ptr, len_bytes), "a held piece lies inside its kept memory");
        HeldPiece { _keep: keep, ptr, len_bytes }
    }

    /// The piece's length.
    pub fn len_bytes(&self) -> usize {
        self.len_bytes
    }

    /// Whether the piece is empty.
    pub fn is_empty(&self) -> bool {
        self.len_bytes == 0
    }

    /// The address of its first byte (for alignment checks: a direct write needs the memory's
    /// address aligned like the file offset).
    pub fn addr(&self) -> usize {
        self.ptr.as_ptr() as usize
    }

    /// Where the piece starts in its kept memory: for the pieces of an owned load, its offset in
    /// the load's arena, where [`Loaded::arena_bytes`](crate::Loaded::arena_bytes) finds the same
    /// bytes while the caller cannot yet change them.
    pub fn offset_bytes(&self) -> usize {
        self.addr() - self._keep.base.as_ptr() as usize
    }

    /// Call `f` with the piece's bytes.
    ///
    /// ```
    /// use tensora_io::Arena;
    ///
    /// let mut arena = Arena::with_len(4096)?;
    /// arena.as_mut_slice()[..3].copy_from_slice(b"abc");
    /// let piece = arena.keep_mapped().piece(1, 2).expect("inside the arena");
    /// // SAFETY: nothing writes the arena until `f` returns (this thread holds it and waits).
    /// let copy = unsafe { piece.read_unchanged(<[u8]>::to_vec) };
    /// assert_eq!(copy, b"bc");
    /// # Ok::<(), std::io::Error>(())
    /// ```
    ///
    /// # Safety
    ///
    /// Nothing writes the piece's bytes until `f` returns: neither the load's caller (who owns
    /// them once the load has returned) nor anyone else. A piece is handed out only once its
    /// bytes are filled, and its backend never writes them again; the caller's writes are what
    /// the one calling this must rule out (the remote cache holds a lock that the caller's way to
    /// writable memory takes first).
    pub unsafe fn read_unchanged<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        // SAFETY: `ptr..ptr + len_bytes` lies inside the memory `_keep` keeps mapped (checked when
        // the piece was made), and nothing writes it while the slice lives (the caller's promise).
        let bytes = unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len_bytes) };
        f(bytes)
    }

    /// Write the piece's bytes `range` (relative to the piece) at `offset_bytes` of `file`, as they
    /// are when the kernel copies them: if the load's caller changes them meanwhile, the file gets
    /// the changed bytes, so check what was written before relying on it. A signal interrupting
    /// the write is retried at most 64 times (`INTERRUPTED_RETRIES_MAX`); a write that makes no
    /// progress fails with `WriteZero`.
    ///
    /// Why this may run while the load's caller holds a `&mut` to the same bytes (issue 39,
    /// finding 10), and the limit of that argument: this code makes no Rust reference to the
    /// bytes and reads none of them; it passes an address to `pwrite`, and the kernel copies the
    /// bytes with its own instructions, outside the program's memory model (as it does for any
    /// `write` from memory another thread may be writing, such as a shared mapping). What the
    /// compiler may assume of the caller's `&mut` (nobody else reads it) can then change only
    /// *which* bytes the kernel copies, never the caller's own results, and which bytes the file
    /// got is never trusted: the cache records a piece with a CRC-32C taken while the caller had
    /// no `&mut` (before the load returned, or when the caller reached for one: the seal), reads
    /// back and compares a sealed piece before recording it, and checks every recorded range
    /// against its CRC-32C again before serving it. Under Rust's abstract machine, which treats a
    /// system call's access as the calling thread's, the copy is an unsynchronized read racing
    /// the caller's writes; no tool or compiler in use exploits a race with a system call's copy,
    /// and the only alternative found (the caller's first `&mut` waiting for every piece's write,
    /// i.e. `CacheWrites::BeforeLanding`'s cost) is offered as that option.
    pub fn write_at(
        &self,
        file: &std::fs::File,
        range: std::ops::Range<usize>,
        offset_bytes: u64,
    ) -> io::Result<()> {
        if range.start > range.end || range.end > self.len_bytes {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "a range outside the held piece"));
        }
        let (mut at, mut offset, mut interrupted) = (range.start, offset_bytes, 0);
        while at < range.end {
            let file_offset = libc::off_t::try_from(offset)
                .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a file offset past off_t"))?;
            // SAFETY: `ptr + at .. ptr + range.end` lies inside the piece (checked above), which
            // `_keep` keeps mapped; the kernel only reads it. No Rust reference to the bytes is
            // made, so a concurrent writer (the load's caller) races with the kernel's copy, not
            // with this code: the file may then hold changed bytes, which callers check for.
            let n = unsafe {
                libc::pwrite(file.as_raw_fd(), self.ptr.as_ptr().add(at).cast(), range.end - at, file_offset)
            };
            match n {
                0 => return Err(io::Error::new(io::ErrorKind::WriteZero, "the file took no bytes")),
                n if n > 0 => {
                    at += n as usize;
                    offset += n as u64;
                }
                _ => {
                    let e = io::Error::last_os_error();
                    if e.kind() != io::ErrorKind::Interrupted || interrupted >= INTERRUPTED_RETRIES_MAX {
                        return Err(e);
                    }
                    interrupted += 1;
                }
            }
        }
        Ok(())
    }
}

impl std::fmt::Debug for HeldPiece {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeldPiece").field("len_bytes", &self.len_bytes).finish()
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::FileExt;

    use proptest::prelude::*;

    use crate::arena::Arena;

    #[test]
    fn a_piece_writes_the_bytes_as_they_are_when_written() {
        let mut arena = Arena::with_len(3 << 20).unwrap();
        arena.as_mut_slice()[..4096].fill(1);
        let piece = arena.keep_mapped().piece(0, 4096).unwrap();
        // Changed after the hand-out, before the write: the file gets the change.
        arena.as_mut_slice()[100] = 9;
        assert!(arena.is_kept_mapped());
        drop(arena);
        let file = tempfile::tempfile().unwrap();
        piece.write_at(&file, 0..4096, 8192).unwrap();
        let mut back = vec![0u8; 4096];
        file.read_exact_at(&mut back, 8192).unwrap();
        assert_eq!((back[99], back[100], back[101]), (1, 9, 1));
        let err = piece.write_at(&file, 10..4097, 0).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    }

    #[test]
    fn a_piece_reads_its_own_bytes_after_its_arena_is_dropped() {
        let mut arena = Arena::with_len(3 << 20).unwrap();
        let filled: Vec<u8> = (0..10_000u32).map(|i| (i % 253) as u8).collect();
        arena.as_mut_slice()[5000..15_000].copy_from_slice(&filled);
        let keep = arena.keep_mapped();
        let (piece, empty) = (keep.piece(5000, 10_000).unwrap(), keep.piece(3 << 20, 0).unwrap());
        drop((arena, keep));
        // SAFETY: the arena is dropped: nothing but the pieces reaches the memory.
        let (bytes, none) =
            unsafe { (piece.read_unchanged(<[u8]>::to_vec), empty.read_unchanged(<[u8]>::len)) };
        assert!(bytes == filled, "the piece's bytes, not its neighbours'");
        assert_eq!(none, 0);
    }

    proptest! {
        /// A piece exists exactly for the ranges inside the kept memory.
        #[test]
        fn pieces_stay_inside_the_kept_memory(len in 0usize..20_000, offset in 0usize..30_000, piece in 0usize..30_000) {
            let arena = Arena::with_len(len as u64).unwrap();
            let keep = arena.keep_mapped();
            let held = keep.piece(offset, piece);
            prop_assert_eq!(held.is_some(), offset + piece <= arena.len_bytes() as usize);
            if let Some(h) = held {
                prop_assert_eq!(h.len_bytes(), piece);
                prop_assert_eq!(h.addr(), arena.as_ptr() as usize + offset);
                prop_assert_eq!(h.offset_bytes(), offset);
            }
        }
    }
}
