//! The result of an owned or mapped load: [`Loaded`], and [`TensorRef`], one tensor's metadata and
//! bytes with checked typed views ([`Element`]).

use std::ptr::NonNull;
use std::sync::OnceLock;

use tensora_format::NameTable;
use tensora_format::{Dtype, TensorInfo};

use super::ArenaReuse;
use crate::arena::Arena;
use crate::error::ViewError;
use crate::report::LoadReport;
use crate::seam::Destination;

/// A Rust element type that a tensor's bytes can be viewed as.
pub trait Element: bytemuck::Pod {
    /// The one dtype whose bytes are this type.
    const DTYPE: Dtype;
}

macro_rules! element {
    ($($t:ty => $d:ident),* $(,)?) => { $(impl Element for $t { const DTYPE: Dtype = Dtype::$d; })* };
}
element!(u8 => U8, i8 => I8, u16 => U16, i16 => I16, half::f16 => F16, half::bf16 => BF16, u32 => U32,
    i32 => I32, f32 => F32, u64 => U64, i64 => I64, f64 => F64);

/// A loaded tensor: metadata plus its bytes.
#[derive(Clone, Copy)]
pub struct TensorRef<'a> {
    pub(super) info: &'a TensorInfo,
    pub(super) bytes: &'a [u8],
}

impl std::fmt::Debug for TensorRef<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TensorRef")
            .field("name", &self.info.name())
            .field("dtype", &self.info.dtype())
            .field("shape", &self.info.shape())
            .field("len_bytes", &self.bytes.len())
            .finish()
    }
}

impl<'a> TensorRef<'a> {
    /// The tensor's name.
    pub fn name(&self) -> &'a str {
        self.info.name()
    }
    /// The tensor's dtype.
    pub fn dtype(&self) -> Dtype {
        self.info.dtype()
    }
    /// The tensor's shape.
    pub fn shape(&self) -> &'a [u64] {
        self.info.shape()
    }
    /// Everything the checkpoint says of the tensor (file, offsets, strides).
    pub fn info(&self) -> &'a TensorInfo {
        self.info
    }
    /// The tensor's stored bytes (`info().len_bytes()` of them).
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }
    /// The bytes as elements of `T`: refused unless the dtype is `T::DTYPE`, the address is aligned
    /// for `T` and the length is a whole number of elements. Never reinterprets unaligned memory.
    ///
    /// ```
    /// # let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/serverlessllm/tiny");
    /// # let ckpt = tensora_format::sllm::open_dir(std::path::Path::new(dir))?;
    /// let loaded = tensora_io::load(&ckpt, &Default::default())?;
    /// let t = loaded.tensor("layers.0.norm.weight").unwrap(); // F32, 64 elements
    /// assert_eq!(t.as_slice::<f32>()?.len(), 64);
    /// assert!(matches!(t.as_slice::<i64>(), Err(tensora_io::ViewError::Dtype { .. })));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn as_slice<T: Element>(&self) -> Result<&'a [T], ViewError> {
        let tensor = || self.info.name().to_owned();
        if self.info.dtype() != T::DTYPE {
            return Err(ViewError::Dtype {
                tensor: tensor(),
                dtype: self.info.dtype(),
                requested: T::DTYPE.as_str(),
            });
        }
        let elem_bytes = std::mem::size_of::<T>();
        let align_bytes = std::mem::align_of::<T>();
        let addr = self.bytes.as_ptr() as usize;
        if !addr.is_multiple_of(align_bytes) {
            return Err(ViewError::Misaligned { tensor: tensor(), addr, align_bytes });
        }
        if !self.bytes.len().is_multiple_of(elem_bytes) {
            return Err(ViewError::Length { tensor: tensor(), len_bytes: self.bytes.len(), elem_bytes });
        }
        bytemuck::try_cast_slice(self.bytes).map_err(|_| ViewError::Misaligned {
            tensor: tensor(),
            addr,
            align_bytes,
        })
    }
}

/// Where the tensors' bytes live.
#[derive(Debug)]
pub(super) enum Storage {
    Arena(Arena),
    Mapped(crate::map::MappedFiles),
}

#[derive(Debug)]
pub(super) struct Entry {
    pub(super) info: TensorInfo,
    /// Arena offset (owned) or file index into the mapping (mapped).
    pub(super) file: u32,
    pub(super) offset_bytes: u64,
}

/// The result of [`load`](crate::load()): every selected tensor, complete. `Send + Sync`.
#[derive(Debug)]
pub struct Loaded {
    pub(super) storage: Storage,
    pub(super) arena_reuse: ArenaReuse,
    pub(super) entries: Vec<Entry>,
    /// Name → index in `entries`, built on the first lookup by name (a load that is only iterated,
    /// or reported, never pays for it: 100,000 tensors cost no string copy and no map).
    pub(super) by_name: OnceLock<NameTable>,
    pub(super) report: LoadReport,
}

impl Drop for Loaded {
    /// Unmaps an owned arena, or parks it for the next load under [`ArenaReuse::Recycle`].
    fn drop(&mut self) {
        if let Storage::Arena(a) = &mut self.storage {
            self.arena_reuse.release(std::mem::replace(a, Arena::empty()));
        }
    }
}

impl Loaded {
    /// An owned load's result: `entries` at their offsets in `arena`.
    pub(super) fn in_arena(
        arena: Arena,
        arena_reuse: ArenaReuse,
        entries: Vec<Entry>,
        report: LoadReport,
    ) -> Loaded {
        Loaded { storage: Storage::Arena(arena), arena_reuse, entries, by_name: OnceLock::new(), report }
    }

    /// The length of an owned load's arena (0 for a mapped load).
    pub(super) fn arena_len_bytes(&self) -> u64 {
        match &self.storage {
            Storage::Arena(a) => a.len_bytes(),
            Storage::Mapped(_) => 0,
        }
    }

    /// `range` of an owned load's arena, writable (a collective load's regions, filled by the
    /// caller's transport). Empty for a mapped load or a range outside the arena.
    pub(super) fn arena_bytes_mut(&mut self, range: std::ops::Range<u64>) -> &mut [u8] {
        match &mut self.storage {
            Storage::Arena(a) => {
                let (start, end) = (range.start as usize, range.end as usize);
                a.as_mut_slice().get_mut(start..end).unwrap_or(&mut [])
            }
            Storage::Mapped(_) => &mut [],
        }
    }

    /// The index in `entries` of the tensor called `name` (the first call builds the name table:
    /// O(tensors); each later one is O(1)).
    fn index_of(&self, name: &str) -> Option<usize> {
        let entries = &self.entries;
        let table = self.by_name.get_or_init(|| {
            let mut table = NameTable::with_capacity(entries.len());
            for (i, e) in entries.iter().enumerate() {
                // Fewer than u32::MAX entries: each is a tensor of a parsed header or index.
                let previous = table.insert(e.info.name(), i as u32, |k| entries[k as usize].info.name());
                debug_assert!(previous.is_none(), "tensor {:?} loaded twice", e.info.name());
            }
            table
        });
        table.get(name, |k| entries[k as usize].info.name()).map(|i| i as usize)
    }

    /// The tensor called `name`, if it was selected.
    pub fn tensor(&self, name: &str) -> Option<TensorRef<'_>> {
        self.index_of(name).map(|i| self.get(i))
    }
    /// Every loaded tensor, in delivery (priority, then file) order.
    pub fn tensors(&self) -> impl Iterator<Item = TensorRef<'_>> {
        (0..self.entries.len()).map(|i| self.get(i))
    }
    /// Tensors loaded.
    pub fn len(&self) -> usize {
        self.entries.len()
    }
    /// Whether no tensor was selected.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
    /// What the load did and where its time went.
    pub fn report(&self) -> &LoadReport {
        &self.report
    }

    /// A pointer to tensor `name`'s bytes (`info().len_bytes()` of them, returned as the second
    /// value) that may be written through, for bindings that hand out writable buffers (numpy,
    /// DLPack). It derives from the storage's own mutable base pointer (the arena's mapping, or a
    /// private copy-on-write file mapping under [`Residence::Mapped`], whose writes never reach
    /// the file), never from a shared slice. Writing through it is sound only while no `&[u8]` of
    /// the same range (from [`Loaded::tensor`] or [`Loaded::tensors`]) is alive, and tied tensors
    /// (ServerlessLLM names sharing one storage) share their bytes. `None` for an unknown name or
    /// an empty tensor.
    ///
    /// ```
    /// use tensora_io::{load, LoadOptions};
    /// let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/serverlessllm/tiny");
    /// let ckpt = tensora_format::sllm::open_dir(std::path::Path::new(dir))?;
    /// let loaded = load(&ckpt, &LoadOptions::default())?;
    /// let name = loaded.tensors().find(|t| !t.bytes().is_empty()).unwrap().name().to_owned();
    /// let (ptr, len) = loaded.tensor_mut_ptr(&name).unwrap();
    /// assert_eq!(len as u64, loaded.tensor(&name).unwrap().info().len_bytes());
    /// // SAFETY: no slice of this tensor is alive while we write.
    /// unsafe { ptr.as_ptr().write(42) };
    /// assert_eq!(loaded.tensor(&name).unwrap().bytes()[0], 42);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// [`Residence::Mapped`]: crate::Residence::Mapped
    pub fn tensor_mut_ptr(&self, name: &str) -> Option<(NonNull<u8>, usize)> {
        let e = &self.entries[self.index_of(name)?];
        let len_bytes = e.info.len_bytes();
        let len = usize::try_from(len_bytes).ok().filter(|&l| l > 0)?;
        let end = e.offset_bytes.checked_add(len_bytes)?;
        let ptr = match &self.storage {
            Storage::Arena(a) => {
                if end > a.len_bytes() {
                    return None;
                }
                // SAFETY: `offset_bytes + len <= arena length` (checked above), so the result
                // stays inside the arena's mapping.
                unsafe { a.host_ptr().add(e.offset_bytes as usize) }
            }
            Storage::Mapped(m) => m.ptr_mut(e.file, e.offset_bytes..end)?,
        };
        Some((ptr, len))
    }

    /// Where tensor `name` starts in an owned load's arena (`None` for a mapped load or an
    /// unknown name): the offset a buffer of the same layout (a collective load's device buffer,
    /// for example) holds it at.
    pub fn arena_offset(&self, name: &str) -> Option<u64> {
        let Storage::Arena(_) = &self.storage else { return None };
        Some(self.entries[self.index_of(name)?].offset_bytes)
    }

    /// `range` of an owned load's arena (tensors, and the bytes a coalesced read brought in
    /// between them), for a backend that checks what it handed out to be written behind the load
    /// ([`HeldPiece::offset_bytes`](crate::HeldPiece::offset_bytes)). `None` for a mapped load or
    /// a range outside the arena.
    ///
    /// ```
    /// use tensora_io::{load, LoadOptions};
    /// let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/serverlessllm/tiny");
    /// let ckpt = tensora_format::sllm::open_dir(std::path::Path::new(dir))?;
    /// let loaded = load(&ckpt, &LoadOptions::default())?;
    /// let t = loaded.tensors().find(|t| !t.bytes().is_empty()).unwrap();
    /// let at = loaded.arena_offset(t.name()).unwrap();
    /// let bytes = loaded.arena_bytes(at..at + t.bytes().len() as u64).unwrap();
    /// assert_eq!(bytes, t.bytes());
    /// assert!(loaded.arena_bytes(0..u64::MAX).is_none());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn arena_bytes(&self, range: std::ops::Range<u64>) -> Option<&[u8]> {
        let Storage::Arena(a) = &self.storage else { return None };
        if range.start > range.end || range.end > a.len_bytes() {
            return None;
        }
        // SAFETY: the load finished, so no backend writes into the arena any more and `Loaded`
        // never writes to it; `range` lies inside the arena (checked above).
        Some(unsafe { a.slice_unchecked(range.start, range.end - range.start) })
    }

    /// A writable pointer to `range` of an owned load's arena and its length, for bindings that
    /// hand a collective load's regions to a transport (see [`ShareLoad`](crate::ShareLoad)). It
    /// derives from the arena's own base, never from a shared slice; writing through it is sound
    /// only while no `&[u8]` of the same bytes is alive. `None` for a mapped load, an empty range
    /// or one outside the arena.
    pub fn arena_ptr_mut(&self, range: std::ops::Range<u64>) -> Option<(NonNull<u8>, usize)> {
        let Storage::Arena(a) = &self.storage else { return None };
        if range.start >= range.end || range.end > a.len_bytes() {
            return None;
        }
        // SAFETY: `range.start < range.end <= arena length` (checked above), so the result stays
        // inside the arena's mapping.
        let ptr = unsafe { a.host_ptr().add(range.start as usize) };
        Some((ptr, (range.end - range.start) as usize))
    }

    pub(super) fn get(&self, i: usize) -> TensorRef<'_> {
        let e = &self.entries[i];
        let len = e.info.len_bytes();
        let bytes = match &self.storage {
            // SAFETY: the load finished, so no backend writes into the arena any more and `Loaded`
            // never writes to it; every entry's range was checked to lie inside the arena.
            Storage::Arena(a) => unsafe { a.slice_unchecked(e.offset_bytes, len) },
            Storage::Mapped(m) => m.get(e.file, e.offset_bytes..e.offset_bytes + len).unwrap_or(&[]),
        };
        TensorRef { info: &e.info, bytes }
    }
}
