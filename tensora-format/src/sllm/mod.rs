//! The ServerlessLLM (sllm-store) layout: `tensor_index.json` plus `tensor.data_N` partitions.
//!
//! A ServerlessLLM checkpoint is a directory. `tensor_index.json` is one JSON object keyed by tensor
//! name (state-dict order); each value is `[offset, size, shape, stride, dtype]` where `offset` is a
//! byte offset into the concatenation of `tensor.data_0`, `tensor.data_1`, … (in order), `size` is
//! the byte size of the tensor's storage, strides are in elements and `dtype` is a torch name such
//! as `"torch.bfloat16"`. Tensora's older variant has a sixth field, the partition number, with
//! offsets local to that partition and short dtype names (`"bf16"`).
//!
//! [`open_dir`] validates all of it and yields the same [`Checkpoint`] as the safetensors parsers;
//! [`parse_index`] is the file-free part (used by the fuzz target). The writer side lives in
//! [`write`](mod@write).

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use self::index::{check_extent, parse_index_inner};
use crate::checkpoint::{FileEntry, FileId, FileStamp, Format, Spans, Strided, Strings, TensorInfo, Warning};
use crate::{Checkpoint, Dtype, Error, ErrorKind};

mod index;
pub mod write;

/// Name of the index file inside a ServerlessLLM directory.
pub const INDEX_FILE_NAME: &str = "tensor_index.json";
/// Partition files are `tensor.data_0`, `tensor.data_1`, … (decimal, no zero padding).
pub const PARTITION_PREFIX: &str = "tensor.data_";
/// The largest `tensor_index.json` this crate reads (256 MiB). A bigger index is refused with
/// [`ErrorKind::IndexTooLarge`] before any of it is read.
pub const INDEX_LEN_BYTES_MAX: u64 = 256 << 20;
/// Partition probing stops with an error after this many partitions (at 10 GiB each, 640 TiB).
pub const PARTITIONS_MAX: u32 = 65_536;
/// Highest tensor rank accepted in an index.
pub const RANK_MAX: usize = 64;
/// Every record in a partition starts at a multiple of this many bytes (upstream pads with 0..8
/// bytes after each record; the padding content is undefined).
pub const RECORD_ALIGN_BYTES: u64 = 8;
/// Upstream's partition cap: a new partition starts when the current one plus the next record
/// would pass 10 GiB.
pub const PARTITION_BYTES_MAX_DEFAULT: u64 = 10 << 30;

/// Which flavour of `tensor_index.json` an index is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IndexLayout {
    /// Upstream sllm-store: `[offset, size, shape, stride, dtype]`, global offsets, torch dtype
    /// names.
    Upstream,
    /// Tensora's older layout: `[offset, size, shape, stride, dtype, partition_id]`, offsets local
    /// to the partition, short dtype names (`f16`, `bf16`, `f32`, …).
    Legacy,
}

/// One validated entry of `tensor_index.json`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexEntry {
    /// The tensor's name (the entry's key), unique in the index.
    pub name: String,
    /// Global offset ([`IndexLayout::Upstream`]) or offset within `partition` (legacy).
    pub offset_bytes: u64,
    /// Byte size of the tensor's storage.
    pub size_bytes: u64,
    /// Shape; `[]` is a scalar.
    pub shape: Vec<u64>,
    /// Strides in elements, same rank as `shape`.
    pub strides: Vec<u64>,
    /// Element type, mapped from the torch name (or the legacy short name).
    pub dtype: Dtype,
    /// The partition number (legacy layout only).
    pub partition: Option<u32>,
}

impl IndexEntry {
    /// `offset_bytes + size_bytes` (checked by the parser not to overflow).
    pub fn end_bytes(&self) -> u64 {
        self.offset_bytes + self.size_bytes
    }
}

/// One entry of a parsed [`SllmIndex`], borrowed from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexEntryRef<'a> {
    /// The tensor's name (the entry's key), unique in the index.
    pub name: &'a str,
    /// Global offset ([`IndexLayout::Upstream`]) or offset within `partition` (legacy).
    pub offset_bytes: u64,
    /// Byte size of the tensor's storage.
    pub size_bytes: u64,
    /// Shape; `[]` is a scalar.
    pub shape: &'a [u64],
    /// Strides in elements, same rank as `shape`.
    pub strides: &'a [u64],
    /// Element type, mapped from the torch name (or the legacy short name).
    pub dtype: Dtype,
    /// The partition number (legacy layout only).
    pub partition: Option<u32>,
}

impl IndexEntryRef<'_> {
    /// `offset_bytes + size_bytes` (checked by the parser not to overflow).
    pub fn end_bytes(&self) -> u64 {
        self.offset_bytes + self.size_bytes
    }
    /// An owned copy.
    pub fn to_entry(&self) -> IndexEntry {
        IndexEntry {
            name: self.name.to_owned(),
            offset_bytes: self.offset_bytes,
            size_bytes: self.size_bytes,
            shape: self.shape.to_vec(),
            strides: self.strides.to_vec(),
            dtype: self.dtype,
            partition: self.partition,
        }
    }
}

/// One entry as an index stores it: its name and dimensions are places in the index's shared
/// buffers (shape, then strides).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Record {
    offset_bytes: u64,
    size_bytes: u64,
    name_start: u32,
    name_len: u32,
    dims_start: u32,
    rank: u8,
    dtype: Dtype,
    partition: Option<u32>,
}

/// A parsed and validated `tensor_index.json`, entries in file (state-dict) order. Stored
/// compactly (every name in one string, every dimension in one buffer, 40 bytes per entry);
/// [`SllmIndex::entries`] hands out borrowed views.
#[derive(Debug, Clone)]
pub struct SllmIndex {
    /// Which flavour the entries were written in (all entries share one).
    pub layout: IndexLayout,
    names: String,
    dims: Vec<u64>,
    records: Vec<Record>,
}

impl PartialEq for SllmIndex {
    fn eq(&self, other: &SllmIndex) -> bool {
        self.layout == other.layout && self.entries().eq(other.entries())
    }
}

impl Eq for SllmIndex {}

impl SllmIndex {
    /// Number of entries.
    pub fn len(&self) -> usize {
        self.records.len()
    }
    /// Whether the index has no entries.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }
    /// Entry `i` in index order, if there is one.
    pub fn entry(&self, i: usize) -> Option<IndexEntryRef<'_>> {
        self.records.get(i).map(|r| self.view(r))
    }
    /// The entries, in the index's (state-dict) order.
    pub fn entries(&self) -> impl ExactSizeIterator<Item = IndexEntryRef<'_>> + '_ {
        self.records.iter().map(|r| self.view(r))
    }
    /// Owned copies of the entries (what [`write::index_json`] writes).
    pub fn to_entries(&self) -> Vec<IndexEntry> {
        self.entries().map(|e| e.to_entry()).collect()
    }
    fn record_name(&self, r: &Record) -> &str {
        &self.names[r.name_start as usize..(r.name_start + r.name_len) as usize]
    }
    fn view(&self, r: &Record) -> IndexEntryRef<'_> {
        let (start, rank) = (r.dims_start as usize, usize::from(r.rank));
        IndexEntryRef {
            name: self.record_name(r),
            offset_bytes: r.offset_bytes,
            size_bytes: r.size_bytes,
            shape: &self.dims[start..start + rank],
            strides: &self.dims[start + rank..start + 2 * rank],
            dtype: r.dtype,
            partition: r.partition,
        }
    }
}

/// Parse and validate the bytes of a `tensor_index.json`, without touching any file.
///
/// Checks everything that does not need the partitions: the JSON shape, the field types, that
/// offsets and sizes fit in `u64`, known dtypes, shape/stride ranks, that the highest element
/// reachable through shape and stride fits inside `size`, unique names, and that two entries either
/// do not overlap or are exactly tied (same offset and size; same partition for the legacy layout).
///
/// ```
/// use tensora_format::sllm::{parse_index, IndexLayout};
/// let index = br#"{"w": [0, 8, [2], [1], "torch.float32"], "tied": [0, 8, [2], [1], "torch.float32"]}"#;
/// let parsed = parse_index(index).unwrap();
/// assert_eq!(parsed.layout, IndexLayout::Upstream);
/// assert_eq!(parsed.len(), 2);
/// assert_eq!(parsed.entry(1).unwrap().name, "tied");
/// assert!(parse_index(br#"{"w": [0, 4, [2], [1], "torch.float32"]}"#).is_err());
/// ```
pub fn parse_index(bytes: &[u8]) -> Result<SllmIndex, ErrorKind> {
    parse_index_inner(bytes).map_err(|e| e.kind)
}

/// Map a torch dtype name (`str(tensor.dtype)`) to the safetensors dtype.
pub fn dtype_from_torch(name: &str) -> Option<Dtype> {
    Some(match name {
        "torch.float16" => Dtype::F16,
        "torch.bfloat16" => Dtype::BF16,
        "torch.float32" => Dtype::F32,
        "torch.float64" => Dtype::F64,
        "torch.int8" => Dtype::I8,
        "torch.int16" => Dtype::I16,
        "torch.int32" => Dtype::I32,
        "torch.int64" => Dtype::I64,
        "torch.uint8" => Dtype::U8,
        "torch.uint16" => Dtype::U16,
        "torch.uint32" => Dtype::U32,
        "torch.uint64" => Dtype::U64,
        "torch.bool" => Dtype::Bool,
        "torch.complex64" => Dtype::C64,
        "torch.float8_e4m3fn" => Dtype::F8E4M3,
        "torch.float8_e5m2" => Dtype::F8E5M2,
        "torch.float8_e4m3fnuz" => Dtype::F8E4M3Fnuz,
        "torch.float8_e5m2fnuz" => Dtype::F8E5M2Fnuz,
        "torch.float8_e8m0fnu" => Dtype::F8E8M0,
        _ => return None,
    })
}

/// The torch name of a dtype, or `None` for dtypes torch cannot hold (the sub-byte types).
pub fn dtype_to_torch(dtype: Dtype) -> Option<&'static str> {
    Some(match dtype {
        Dtype::F16 => "torch.float16",
        Dtype::BF16 => "torch.bfloat16",
        Dtype::F32 => "torch.float32",
        Dtype::F64 => "torch.float64",
        Dtype::I8 => "torch.int8",
        Dtype::I16 => "torch.int16",
        Dtype::I32 => "torch.int32",
        Dtype::I64 => "torch.int64",
        Dtype::U8 => "torch.uint8",
        Dtype::U16 => "torch.uint16",
        Dtype::U32 => "torch.uint32",
        Dtype::U64 => "torch.uint64",
        Dtype::Bool => "torch.bool",
        Dtype::C64 => "torch.complex64",
        Dtype::F8E4M3 => "torch.float8_e4m3fn",
        Dtype::F8E5M2 => "torch.float8_e5m2",
        Dtype::F8E4M3Fnuz => "torch.float8_e4m3fnuz",
        Dtype::F8E5M2Fnuz => "torch.float8_e5m2fnuz",
        Dtype::F8E8M0 => "torch.float8_e8m0fnu",
        Dtype::F4 | Dtype::F6E2M3 | Dtype::F6E3M2 => return None,
    })
}

/// The legacy layout's short names: the safetensors spelling in lower case (`f16`, `bf16`,
/// `f8_e4m3`, `bool`, …). Sub-byte types are refused (torch cannot hold them).
pub fn dtype_from_short(name: &str) -> Option<Dtype> {
    if name.bytes().any(|b| b.is_ascii_uppercase()) {
        return None;
    }
    Dtype::from_safetensors(&name.to_ascii_uppercase()).filter(|d| d.size_bytes().is_some())
}

/// `true` when `dir` holds something named `tensor_index.json` (cheap: one `lstat`; validates
/// nothing, so a FIFO or a dangling link so named is refused by [`open_dir`], not skipped).
pub fn looks_like_sllm_dir(dir: &Path) -> bool {
    fs::symlink_metadata(dir.join(INDEX_FILE_NAME)).is_ok()
}

/// Read and parse `dir/tensor_index.json` (at most [`INDEX_LEN_BYTES_MAX`], a regular file);
/// errors name the index and, where there is one, the tensor.
fn read_index(dir: &Path) -> crate::Result<(PathBuf, SllmIndex)> {
    let index_path = dir.join(INDEX_FILE_NAME);
    let bytes = crate::read_capped(&index_path, INDEX_LEN_BYTES_MAX)?;
    let index = parse_index_inner(&bytes).map_err(|e| {
        let err = Error::new(&index_path, e.kind);
        match e.tensor {
            Some(t) => err.with_tensor(t),
            None => err,
        }
    })?;
    Ok((index_path, index))
}

/// The partition an upstream (global) offset starts in: the last one whose global start
/// (`starts[p]`) is at or before it.
fn partition_at(starts: &[u64], offset_bytes: u64) -> usize {
    starts.partition_point(|&s| s <= offset_bytes).saturating_sub(1)
}

/// The path of partition `index` inside `dir`.
pub fn partition_path(dir: &Path, index: u32) -> PathBuf {
    dir.join(format!("{PARTITION_PREFIX}{index}"))
}

/// Probe `tensor.data_0`, `tensor.data_1`, … until one is missing.
fn probe_partitions(dir: &Path) -> crate::Result<Vec<FileEntry>> {
    let mut files = Vec::new();
    for index in 0..=PARTITIONS_MAX {
        let path = partition_path(dir, index);
        // The partition's stamp through the one regular-file open (a FIFO or device is refused).
        let meta = match crate::open_regular(&path) {
            Ok((_, meta)) => meta,
            Err(e) if matches!(e.kind(), ErrorKind::Io(io) if io.kind() == io::ErrorKind::NotFound) => break,
            Err(e) => return Err(e),
        };
        if index == PARTITIONS_MAX {
            return Err(Error::new(
                path,
                ErrorKind::NotACheckpoint { reason: format!("more than {PARTITIONS_MAX} partitions") },
            ));
        }
        files.push(FileEntry { path, stamp: FileStamp::from_metadata(&meta), data_start_bytes: 0 });
    }
    if files.is_empty() {
        return Err(Error::new(partition_path(dir, 0), ErrorKind::NoPartitions));
    }
    Ok(files)
}

/// Find the partition holding `offset .. offset + size` of the concatenation, and the offset
/// within it. `starts[p]` is the global offset of partition `p`.
fn locate_global(starts: &[u64], lens: &[u64], offset: u64, size: u64) -> Option<(usize, u64)> {
    let after = starts.partition_point(|&s| s <= offset);
    let p = after.checked_sub(1)?;
    let local = offset - starts[p];
    (local.checked_add(size)? <= lens[p]).then_some((p, local))
}

/// The lowest offset of a non-empty tensor in each partition (`None` for a partition without one).
fn first_record_offsets(tensors: &[TensorInfo], partitions: usize) -> Vec<Option<u64>> {
    let mut first: Vec<Option<u64>> = vec![None; partitions];
    for t in tensors.iter().filter(|t| t.len_bytes > 0) {
        let slot = &mut first[t.file.index()];
        *slot = Some(slot.map_or(t.offset_bytes, |o| o.min(t.offset_bytes)));
    }
    first
}

/// A partition shorter than the index needs (see [`partition_shortfalls`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionShortfall {
    /// The partition file, `dir/tensor.data_N`.
    pub path: PathBuf,
    /// The end of the last tensor the index places in this partition.
    pub expected_len_bytes: u64,
    /// The partition's size now.
    pub actual_len_bytes: u64,
}

/// The partitions of `dir` that are shorter than its `tensor_index.json` needs: what a
/// `tensora verify` reports as truncation after [`open_dir`] failed with
/// [`ErrorKind::OutsidePartition`].
///
/// Each tensor is placed as [`open_dir`] places it: by its partition number (legacy layout), or
/// in the partition where its global offset starts given the current file sizes (upstream). A
/// truncated last partition is thus named exactly; a shortened middle one shifts the global
/// offsets of the partitions after it, so the shortfall may show on a later partition too.
///
/// ```
/// let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/serverlessllm/tiny");
/// let short = tensora_format::sllm::partition_shortfalls(std::path::Path::new(dir)).unwrap();
/// assert!(short.is_empty());
/// ```
pub fn partition_shortfalls(dir: &Path) -> crate::Result<Vec<PartitionShortfall>> {
    let (_, index) = read_index(dir)?;
    let files = probe_partitions(dir)?;
    let lens: Vec<u64> = files.iter().map(|f| f.stamp.len_bytes).collect();
    let mut starts = Vec::with_capacity(lens.len());
    let mut total_bytes = 0u64;
    for &len in &lens {
        starts.push(total_bytes);
        total_bytes = total_bytes.saturating_add(len);
    }
    let mut needed: Vec<u64> = vec![0; lens.len()];
    for e in index.entries() {
        let (p, local_end) = match e.partition {
            None => {
                let p = partition_at(&starts, e.offset_bytes);
                (p, e.end_bytes() - starts[p])
            }
            Some(p) => (p as usize, e.end_bytes()),
        };
        if let Some(slot) = needed.get_mut(p) {
            *slot = (*slot).max(local_end);
        }
    }
    Ok(files
        .into_iter()
        .zip(needed)
        .filter(|(f, need)| *need > f.stamp.len_bytes)
        .map(|(f, need)| PartitionShortfall {
            expected_len_bytes: need,
            actual_len_bytes: f.stamp.len_bytes,
            path: f.path,
        })
        .collect())
}

/// Open a ServerlessLLM directory: read and validate `tensor_index.json` (at most
/// [`INDEX_LEN_BYTES_MAX`]), probe the partitions, and map every tensor to its partition and
/// local offset. Tied weights (several names on the same storage) become several tensors with the
/// same file and range.
///
/// ```
/// let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/serverlessllm/tiny");
/// let ckpt = tensora_format::sllm::open_dir(std::path::Path::new(dir)).unwrap();
/// assert_eq!(ckpt.format(), tensora_format::Format::ServerlessLlm);
/// let embed = ckpt.tensor("embed.weight").unwrap();
/// let head = ckpt.tensor("lm_head.weight").unwrap();
/// assert_eq!((embed.file(), embed.range()), (head.file(), head.range()));
/// ```
pub fn open_dir(dir: &Path) -> crate::Result<Checkpoint> {
    let (index_path, index) = read_index(dir)?;
    let files = probe_partitions(dir)?;
    assemble(dir, index_path, index, files)
}

/// The checks of [`open_dir`] after the partitions were found: every tensor mapped to its
/// partition and local offset (and refused when it lies outside one), the warnings added.
pub(crate) fn assemble(
    dir: &Path,
    index_path: PathBuf,
    index: SllmIndex,
    files: Vec<FileEntry>,
) -> crate::Result<Checkpoint> {
    let lens: Vec<u64> = files.iter().map(|f| f.stamp.len_bytes).collect();
    let mut starts = Vec::with_capacity(lens.len());
    let mut total_bytes = 0u64;
    for &len in &lens {
        starts.push(total_bytes);
        total_bytes = total_bytes.checked_add(len).ok_or_else(|| {
            Error::new(dir, ErrorKind::NotACheckpoint { reason: "partition sizes overflow u64".to_owned() })
        })?;
    }

    let SllmIndex { layout, names, dims, records } = index;
    let strings = Arc::new(Strings { names, dims });
    let mut tensors = Vec::with_capacity(records.len());
    for r in &records {
        let end_bytes = r.offset_bytes + r.size_bytes;
        let located = match r.partition {
            None => locate_global(&starts, &lens, r.offset_bytes, r.size_bytes),
            Some(p) => {
                let p = p as usize;
                (p < lens.len() && end_bytes <= lens[p]).then_some((p, r.offset_bytes))
            }
        };
        let Some((p, local)) = located else {
            // Name the partition the tensor starts in (most often a truncated one); the range is
            // the index's own (global for the upstream layout, local for the legacy one).
            let p = match r.partition {
                None => partition_at(&starts, r.offset_bytes) as u32,
                Some(p) => p,
            };
            let name = &strings.names[r.name_start as usize..(r.name_start + r.name_len) as usize];
            return Err(Error::new(
                partition_path(dir, p),
                ErrorKind::OutsidePartition { offset: r.offset_bytes, end: end_bytes },
            )
            .with_tensor(name));
        };
        let spans = Spans {
            name_start: r.name_start,
            name_len: r.name_len,
            dims_start: r.dims_start,
            rank: r.rank,
            strided: Strided::Yes,
        };
        tensors.push(TensorInfo::new(&strings, spans, r.dtype, FileId(p as u32), local, r.size_bytes));
    }
    tensors.sort_by_key(|t| (t.file, t.offset_bytes));

    let mut warnings = Vec::new();
    if layout == IndexLayout::Upstream {
        // A writer fills each partition from its first byte. A partition whose first stored record
        // starts later suggests offsets that do not follow the file sizes (e.g. partitions rounded
        // up by an O_DIRECT writer), so the mapping deserves a look.
        for (p, first) in first_record_offsets(&tensors, files.len()).into_iter().enumerate() {
            if let Some(first) = first.filter(|&o| o != 0) {
                warnings.push(Warning {
                    path: files[p].path.clone(),
                    message: format!(
                        "first tensor of this partition starts at byte {first}, not 0: global offsets may not \
                         follow the partition file sizes"
                    ),
                });
            }
        }
    }
    if layout == IndexLayout::Legacy {
        warnings.push(Warning {
            path: index_path,
            message: "older Tensora 6-field tensor_index.json layout; convert to upgrade".to_owned(),
        });
    }
    Ok(Checkpoint::from_parts(
        Format::ServerlessLlm,
        dir.to_path_buf(),
        files,
        tensors,
        BTreeMap::new(),
        warnings,
    ))
}

#[cfg(test)]
mod tests;
