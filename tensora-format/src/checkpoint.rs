//! The parsed, validated view of a checkpoint. Every value of these types was built by a parser in
//! this crate, so the rest of the workspace never re-checks it: ranges lie inside their files,
//! sizes agree with dtype and shape, and names are unique.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use crate::Dtype;
use crate::names::NameTable;
use crate::select::{Selection, SelectionError};

/// Which on-disk layout a checkpoint came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    /// One `.safetensors` file.
    Safetensors,
    /// Several `.safetensors` files, with or without `model.safetensors.index.json`.
    SafetensorsSharded,
    /// `tensor_index.json` plus `tensor.data_N` partitions (sllm-store).
    ServerlessLlm,
}

impl Format {
    /// The spelling used in `--json` output.
    pub const fn as_str(self) -> &'static str {
        match self {
            Format::Safetensors => "safetensors",
            Format::SafetensorsSharded => "safetensors-sharded",
            Format::ServerlessLlm => "serverlessllm",
        }
    }
}

/// Index of a file inside [`Checkpoint::files`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileId(pub u32);

impl FileId {
    /// The index into [`Checkpoint::files`].
    pub const fn index(self) -> usize {
        self.0 as usize
    }
}

/// What the file looked like when it was parsed. A loader compares it with `fstat` after the load:
/// a file whose size, mtime or inode changed in between was replaced or modified under us.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileStamp {
    /// File size in bytes.
    pub len_bytes: u64,
    /// Modification time, where the platform reports one.
    pub modified: Option<SystemTime>,
    /// Device id (0 off Unix).
    pub dev: u64,
    /// Inode number (0 off Unix).
    pub inode: u64,
}

impl FileStamp {
    /// Stamp from file metadata.
    pub fn from_metadata(meta: &std::fs::Metadata) -> FileStamp {
        #[cfg(unix)]
        let (dev, inode) = {
            use std::os::unix::fs::MetadataExt;
            (meta.dev(), meta.ino())
        };
        #[cfg(not(unix))]
        let (dev, inode) = (0, 0);
        FileStamp { len_bytes: meta.len(), modified: meta.modified().ok(), dev, inode }
    }

    /// `Ok` when `now` is this stamp, else what changed. The one check of "the file is still the
    /// one that was parsed" for the whole workspace (loads, conversion, verification, bindings).
    ///
    /// ```
    /// use tensora_format::FileStamp;
    /// let then = FileStamp { len_bytes: 10, modified: None, dev: 1, inode: 7 };
    /// assert!(then.check(&then).is_ok());
    /// let now = FileStamp { len_bytes: 12, inode: 8, ..then };
    /// let e = then.check(&now).unwrap_err();
    /// assert_eq!(e.to_string(), "file changed since it was parsed (size 10 -> 12, inode 7 -> 8: replaced)");
    /// ```
    pub fn check(&self, now: &FileStamp) -> Result<(), FileChanged> {
        if self == now { Ok(()) } else { Err(FileChanged { before: *self, after: *now }) }
    }
}

/// A file whose size, mtime or identity differs from its parse-time [`FileStamp`]: it was modified
/// in place or replaced since it was parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("file changed since it was parsed ({})", self.what())]
pub struct FileChanged {
    /// The stamp taken when the file was parsed.
    pub before: FileStamp,
    /// The stamp now.
    pub after: FileStamp,
}

impl FileChanged {
    /// What differs, e.g. `size 10 -> 12, mtime: modified in place`.
    pub fn what(&self) -> String {
        let (b, a) = (&self.before, &self.after);
        let mut what = Vec::new();
        if b.len_bytes != a.len_bytes {
            what.push(format!("size {} -> {}", b.len_bytes, a.len_bytes));
        }
        if (b.dev, b.inode) != (a.dev, a.inode) {
            what.push(format!("inode {} -> {}: replaced", b.inode, a.inode));
        }
        if b.modified != a.modified {
            what.push("mtime: modified in place".to_owned());
        }
        what.join(", ")
    }
}

/// One file of a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileEntry {
    pub(crate) path: PathBuf,
    pub(crate) stamp: FileStamp,
    /// Where tensor data starts (`8 + n` for safetensors, 0 for ServerlessLLM partitions).
    pub(crate) data_start_bytes: u64,
}

impl FileEntry {
    /// Path as opened.
    pub fn path(&self) -> &Path {
        &self.path
    }
    /// File size in bytes at parse time.
    pub fn len_bytes(&self) -> u64 {
        self.stamp.len_bytes
    }
    /// Size, mtime and inode at parse time.
    pub fn stamp(&self) -> FileStamp {
        self.stamp
    }
    /// Whether `meta` (an `fstat` of an open descriptor, or a `stat` of the path, taken now) still
    /// describes the file that was parsed.
    pub fn check_unchanged(&self, meta: &std::fs::Metadata) -> Result<(), FileChanged> {
        self.stamp.check(&FileStamp::from_metadata(meta))
    }
    /// First byte of tensor data.
    pub fn data_start_bytes(&self) -> u64 {
        self.data_start_bytes
    }
}

/// Tensor names and dimensions, back to back, shared by the [`TensorInfo`]s of one header or
/// index (each names its ranges): a checkpoint holds no string or vector per tensor.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Strings {
    pub(crate) names: String,
    pub(crate) dims: Vec<u64>,
}

/// One tensor: where its bytes live and how to interpret them.
#[derive(Clone)]
pub struct TensorInfo {
    /// Holds the name and the dimensions.
    pub(crate) strings: Arc<Strings>,
    pub(crate) name_start: u32,
    pub(crate) name_len: u32,
    /// The shape is `dims[dims_start..][..rank]`; strides, when recorded, follow it.
    pub(crate) dims_start: u32,
    pub(crate) rank: u8,
    pub(crate) strided: Strided,
    pub(crate) dtype: Dtype,
    pub(crate) file: FileId,
    /// Absolute offset of the first byte in `file`.
    pub(crate) offset_bytes: u64,
    /// Bytes of storage to read. Equal to [`TensorInfo::nbytes`] for safetensors; for a
    /// ServerlessLLM tensor it is the recorded storage size, which strides may make larger.
    pub(crate) len_bytes: u64,
}

/// Whether a [`TensorInfo`] records strides (after its shape in the shared dimensions).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Strided {
    /// Contiguous row-major.
    No,
    /// Strides in elements follow the shape.
    Yes,
}

impl PartialEq for TensorInfo {
    fn eq(&self, other: &TensorInfo) -> bool {
        (self.name(), self.dtype, self.shape(), self.file, self.offset_bytes, self.len_bytes, self.strides())
            == (
                other.name(),
                other.dtype,
                other.shape(),
                other.file,
                other.offset_bytes,
                other.len_bytes,
                other.strides(),
            )
    }
}

impl Eq for TensorInfo {}

impl std::fmt::Debug for TensorInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TensorInfo")
            .field("name", &self.name())
            .field("dtype", &self.dtype)
            .field("shape", &self.shape())
            .field("file", &self.file)
            .field("offset_bytes", &self.offset_bytes)
            .field("len_bytes", &self.len_bytes)
            .field("strides", &self.strides())
            .finish()
    }
}

/// Where a tensor's name and dimensions are in its [`Strings`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Spans {
    pub(crate) name_start: u32,
    pub(crate) name_len: u32,
    pub(crate) dims_start: u32,
    pub(crate) rank: u8,
    pub(crate) strided: Strided,
}

impl TensorInfo {
    /// A tensor whose name and dimensions are at `spans` in `strings` (which the caller checked).
    pub(crate) fn new(
        strings: &Arc<Strings>,
        spans: Spans,
        dtype: Dtype,
        file: FileId,
        offset_bytes: u64,
        len_bytes: u64,
    ) -> TensorInfo {
        let Spans { name_start, name_len, dims_start, rank, strided } = spans;
        TensorInfo {
            strings: Arc::clone(strings),
            name_start,
            name_len,
            dims_start,
            rank,
            strided,
            dtype,
            file,
            offset_bytes,
            len_bytes,
        }
    }

    /// A tensor with its own strings (a slice's narrowed info; tests build checkpoints by hand).
    pub(crate) fn owned(
        name: &str,
        dtype: Dtype,
        shape: &[u64],
        strides: Option<&[u64]>,
        (file, offset_bytes, len_bytes): (FileId, u64, u64),
    ) -> TensorInfo {
        let mut dims = shape.to_vec();
        dims.extend_from_slice(strides.unwrap_or(&[]));
        let strings = Arc::new(Strings { names: name.to_owned(), dims });
        let spans = Spans {
            name_start: 0,
            name_len: name.len() as u32,
            dims_start: 0,
            rank: shape.len() as u8,
            strided: if strides.is_some() { Strided::Yes } else { Strided::No },
        };
        TensorInfo::new(&strings, spans, dtype, file, offset_bytes, len_bytes)
    }

    /// The tensor's name, unique in its checkpoint.
    pub fn name(&self) -> &str {
        &self.strings.names[self.name_start as usize..(self.name_start + self.name_len) as usize]
    }
    /// Element type.
    pub fn dtype(&self) -> Dtype {
        self.dtype
    }
    /// Shape; `[]` is a scalar.
    pub fn shape(&self) -> &[u64] {
        let start = self.dims_start as usize;
        &self.strings.dims[start..start + usize::from(self.rank)]
    }
    /// The file that holds the tensor's bytes.
    pub fn file(&self) -> FileId {
        self.file
    }
    /// Absolute byte offset in the file.
    pub fn offset_bytes(&self) -> u64 {
        self.offset_bytes
    }
    /// Bytes of storage to read (see the field docs).
    pub fn len_bytes(&self) -> u64 {
        self.len_bytes
    }
    /// Absolute byte range in the file: `offset_bytes .. offset_bytes + len_bytes`.
    pub fn range(&self) -> Range<u64> {
        // Cannot overflow: the parser checked that the range lies inside the file.
        self.offset_bytes..self.offset_bytes + self.len_bytes
    }
    /// Strides in elements, when the format records them; `None` means contiguous row-major.
    pub fn strides(&self) -> Option<&[u64]> {
        let start = self.dims_start as usize + usize::from(self.rank);
        match self.strided {
            Strided::No => None,
            Strided::Yes => Some(&self.strings.dims[start..start + usize::from(self.rank)]),
        }
    }
    /// Number of elements (1 for a scalar, 0 when any dimension is 0).
    pub fn numel(&self) -> u64 {
        // Cannot overflow: the parser checked `numel * bits` fits in u64.
        self.shape().iter().product()
    }
    /// The same tensor delivered as `dtype` (a cast copy): `dtype` and [`TensorInfo::len_bytes`]
    /// are those of the copy (the stored length's elements at the new size); name, shape,
    /// strides (in elements), file and offset stay those of the stored bytes. `None` when either
    /// dtype is sub-byte or the stored length is not a whole number of elements.
    ///
    /// ```
    /// # let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/serverlessllm/tiny");
    /// # let ckpt = tensora_format::sllm::open_dir(std::path::Path::new(dir))?;
    /// let t = ckpt.tensor("layers.0.norm.weight").unwrap(); // F32, 64 elements
    /// let cast = t.cast_to(tensora_format::Dtype::BF16).unwrap();
    /// assert_eq!((cast.len_bytes(), cast.nbytes(), cast.shape()), (128, 128, t.shape()));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn cast_to(&self, dtype: Dtype) -> Option<TensorInfo> {
        let (from_size, to_size) = (self.dtype.size_bytes()?, dtype.size_bytes()?);
        if !self.len_bytes.is_multiple_of(from_size) {
            return None;
        }
        let len_bytes = (self.len_bytes / from_size).checked_mul(to_size)?;
        Some(TensorInfo { dtype, len_bytes, ..self.clone() })
    }
    /// `numel × bits / 8`: the bytes of the tensor's data as a dense array. A digest of a tensor
    /// covers exactly these bytes from [`TensorInfo::offset_bytes`].
    pub fn nbytes(&self) -> u64 {
        // Checked by the parser to fit and to be a whole number of bytes.
        self.numel() * u64::from(self.dtype.bits()) / 8
    }
}

/// A non-fatal finding while parsing, e.g. a `total_size` that disagrees with the shards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    /// The file the finding is about.
    pub path: PathBuf,
    /// What was found, in one line.
    pub message: String,
}

/// A whole checkpoint: its files, its tensors (in file order), and its metadata.
/// Built only by this crate's parsers, so it is valid by construction.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    pub(crate) format: Format,
    pub(crate) root: PathBuf,
    pub(crate) files: Vec<FileEntry>,
    pub(crate) tensors: Vec<TensorInfo>,
    /// Name → index in `tensors`, built on the first lookup (a load by selection never needs it).
    pub(crate) by_name: std::sync::OnceLock<NameTable>,
    pub(crate) metadata: BTreeMap<String, String>,
    pub(crate) warnings: Vec<Warning>,
}

impl Checkpoint {
    /// Assemble a checkpoint from parts that a parser in this crate already validated.
    /// Builds the name index; the caller guarantees names are unique (debug-asserted).
    pub(crate) fn from_parts(
        format: Format,
        root: PathBuf,
        files: Vec<FileEntry>,
        tensors: Vec<TensorInfo>,
        metadata: BTreeMap<String, String>,
        warnings: Vec<Warning>,
    ) -> Checkpoint {
        debug_assert!(tensors.iter().all(|t| t.file.index() < files.len()));
        debug_assert!(tensors.iter().all(|t| {
            t.offset_bytes
                .checked_add(t.len_bytes)
                .is_some_and(|end| end <= files[t.file.index()].stamp.len_bytes)
        }));
        let ckpt =
            Checkpoint { format, root, files, tensors, by_name: Default::default(), metadata, warnings };
        #[cfg(debug_assertions)]
        ckpt.names(); // Checks the names are unique.
        ckpt
    }

    /// The name table, built on first use.
    fn names(&self) -> &NameTable {
        self.by_name.get_or_init(|| {
            let tensors = &self.tensors;
            let mut by_name = NameTable::with_capacity(tensors.len());
            for (i, t) in tensors.iter().enumerate() {
                // Fewer than u32::MAX tensors: each takes bytes of a header or index.
                let previous = by_name.insert(t.name(), i as u32, |k| tensors[k as usize].name());
                debug_assert!(previous.is_none(), "duplicate tensor name {:?}", t.name());
            }
            by_name
        })
    }

    /// The on-disk layout this checkpoint was read from.
    pub fn format(&self) -> Format {
        self.format
    }
    /// The path that was opened (a file or a directory).
    pub fn root(&self) -> &Path {
        &self.root
    }
    /// The files, indexed by [`FileId`].
    pub fn files(&self) -> &[FileEntry] {
        &self.files
    }
    /// One file.
    ///
    /// # Panics
    /// If `id` does not come from this checkpoint.
    pub fn file(&self, id: FileId) -> &FileEntry {
        &self.files[id.index()]
    }
    /// All tensors, ordered by (file, offset).
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }
    /// O(1) lookup by name (the first lookup builds the name table: O(tensors)).
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index(name).map(|i| &self.tensors[i])
    }
    /// O(1) lookup of a tensor's index in [`Checkpoint::tensors`] (the first lookup builds the
    /// name table: O(tensors)).
    pub fn tensor_index(&self, name: &str) -> Option<usize> {
        self.names().get(name, |k| self.tensors[k as usize].name()).map(|i| i as usize)
    }
    /// `__metadata__` (safetensors) or the index's `metadata` (sharded), flattened to strings.
    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.metadata
    }
    /// Non-fatal findings made while opening (e.g. a disagreeing `total_size`).
    pub fn warnings(&self) -> &[Warning] {
        &self.warnings
    }
    /// Sum of [`TensorInfo::len_bytes`] over all tensors (tied tensors counted once each).
    /// Saturates at `u64::MAX` (tied tensors can alias huge storage many times).
    pub fn total_tensor_bytes(&self) -> u64 {
        self.tensors.iter().fold(0u64, |sum, t| sum.saturating_add(t.len_bytes))
    }

    /// The indexes (into [`Checkpoint::tensors`]) of the tensors `selection` picks, in file order.
    /// An exact name that no tensor has, or a glob that matches none, is an error naming it.
    ///
    /// ```
    /// use tensora_format::Selection;
    /// let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/serverlessllm/tiny");
    /// let ckpt = tensora_format::open(dir)?;
    /// let picked = ckpt.select(&Selection::Glob(vec!["layers.0.*".into()]))?;
    /// assert!(picked.iter().all(|&i| ckpt.tensors()[i].name().starts_with("layers.0.")));
    /// assert!(ckpt.select(&Selection::Names(vec!["nope".into()])).is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn select(&self, selection: &Selection) -> Result<Vec<usize>, SelectionError> {
        selection.matcher()?.select(self.tensors.iter().map(|t| t.name()))
    }

    /// Bytes covered by the tensors `selected` (indexes into [`Checkpoint::tensors`]), counting
    /// bytes that tied tensors share (ServerlessLLM names aliasing one storage) once: the size of
    /// the union of their file ranges. Indexes out of range are ignored.
    pub fn distinct_bytes(&self, selected: &[usize]) -> u64 {
        let mut ranges: Vec<(u32, u64, u64)> = selected
            .iter()
            .filter_map(|&i| self.tensors.get(i))
            .filter(|t| t.len_bytes > 0)
            .map(|t| (t.file.0, t.offset_bytes, t.offset_bytes + t.len_bytes))
            .collect();
        ranges.sort_unstable();
        let mut total_bytes = 0u64;
        let mut current: Option<(u32, u64, u64)> = None;
        for (file, start, end) in ranges {
            current = match current {
                Some((f, s, e)) if f == file && start <= e => Some((f, s, e.max(end))),
                Some((_, s, e)) => {
                    // A union of ranges inside files whose sizes are u64: cannot pass u64::MAX
                    // per file, but many files together saturate rather than wrap.
                    total_bytes = total_bytes.saturating_add(e - s);
                    Some((file, start, end))
                }
                None => Some((file, start, end)),
            };
        }
        if let Some((_, s, e)) = current {
            total_bytes = total_bytes.saturating_add(e - s);
        }
        total_bytes
    }
}
