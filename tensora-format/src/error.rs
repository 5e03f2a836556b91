//! The one error type of this crate. Every error names the file and, where there is one, the
//! tensor; the [`ErrorKind`] says which rule failed, so tests and callers can match on it.

use std::fmt;
use std::path::{Path, PathBuf};

/// A parse or write failure. `Display` reads `"<path>: tensor '<name>': <kind>"`.
#[derive(Debug)]
pub struct Error {
    path: PathBuf,
    tensor: Option<String>,
    kind: ErrorKind,
}

impl Error {
    /// An error about the file at `path`.
    pub fn new(path: impl Into<PathBuf>, kind: ErrorKind) -> Error {
        Error { path: path.into(), tensor: None, kind }
    }
    /// The same error, naming the tensor it is about.
    pub fn with_tensor(mut self, tensor: impl Into<String>) -> Error {
        self.tensor = Some(tensor.into());
        self
    }
    /// The file (or directory) the error is about.
    pub fn path(&self) -> &Path {
        &self.path
    }
    /// The tensor the error is about, if any.
    pub fn tensor(&self) -> Option<&str> {
        self.tensor.as_deref()
    }
    /// Which rule failed.
    pub fn kind(&self) -> &ErrorKind {
        &self.kind
    }
    /// Which rule failed, by value.
    pub fn into_kind(self) -> ErrorKind {
        self.kind
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.path.display())?;
        if let Some(t) = &self.tensor {
            write!(f, ": tensor {t:?}")?;
        }
        write!(f, ": {}", self.kind)
    }
}

/// `source()` is `None` for every kind: the message of an underlying I/O error is already part of
/// `Display` (so `{e}` alone says everything), and an error-chain printer such as anyhow's `{:#}`
/// would otherwise repeat it. Match on [`ErrorKind::Io`] to get at the `io::Error`.
impl std::error::Error for Error {}

/// Which rule failed. One variant per rule, so tests match on the variant.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Opening, reading or inspecting the file failed; the `io::Error` says how.
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),

    // ---- safetensors: the 8-byte prefix and header length ----
    /// The file cannot even hold the 8-byte header length.
    #[error("file is {len_bytes} bytes, shorter than the 8-byte header length prefix")]
    FileTooShort {
        /// The file's size.
        len_bytes: u64,
    },
    /// The 8-byte prefix says the JSON header is empty.
    #[error("header length is 0")]
    HeaderLenZero,
    /// The header length is over [`crate::safetensors::HEADER_LEN_BYTES_MAX`]; refused before
    /// anything is allocated.
    #[error("header length {header_len_bytes} exceeds the limit of {limit_bytes} bytes")]
    HeaderTooLarge {
        /// `n`, the header length the prefix claims.
        header_len_bytes: u64,
        /// The largest header length accepted.
        limit_bytes: u64,
    },
    /// The header claims more bytes than the file holds (a truncated file, or a bad prefix).
    #[error("header length {header_len_bytes} plus 8 exceeds the file size {file_len_bytes}")]
    HeaderBeyondFile {
        /// `n`, the header length the prefix claims.
        header_len_bytes: u64,
        /// The file's size (or what could be read of it).
        file_len_bytes: u64,
    },
    /// Parsing from bytes: the caller passed fewer bytes than the header needs.
    #[error("have {have_bytes} bytes of the file but the header needs the first {need_bytes}")]
    BytesTooShort {
        /// How many leading bytes of the file were passed.
        have_bytes: u64,
        /// How many the header needs: 8, or `8 + n` once the prefix is read.
        need_bytes: u64,
    },

    // ---- safetensors: header text and JSON ----
    /// The header is not valid UTF-8.
    #[error("header is not valid UTF-8 (byte {valid_up_to})")]
    HeaderNotUtf8 {
        /// Offset in the header of the first byte that is not valid UTF-8.
        valid_up_to: usize,
    },
    /// The header is not valid JSON (or is only whitespace, or an object member is empty).
    #[error("header is not valid JSON: {message}")]
    HeaderNotJson {
        /// The JSON parser's complaint, with the byte it was near.
        message: String,
    },
    /// The header is valid JSON but not one object (an array, a string, ...).
    #[error("header must be one JSON object: {message}")]
    HeaderNotObject {
        /// What the header holds instead.
        message: String,
    },
    /// The header object is followed by something other than whitespace.
    #[error("header has bytes after the JSON object (at byte {at})")]
    TrailingBytes {
        /// Offset in the header of the first trailing byte.
        at: usize,
    },

    // ---- safetensors: __metadata__ ----
    /// `__metadata__` is not an object of strings to strings (nor `null`), or appears twice.
    #[error("__metadata__ must be an object of string to string, or null: {message}")]
    BadMetadata {
        /// What is wrong with it.
        message: String,
    },
    /// A key appears twice in `__metadata__`.
    #[error("duplicate metadata key {key:?}")]
    DuplicateMetadataKey {
        /// The repeated key.
        key: String,
    },

    // ---- safetensors: tensor entries ----
    /// A tensor name is empty or holds a control character.
    #[error("invalid tensor name: {reason}")]
    BadTensorName {
        /// Which of the two it is.
        reason: &'static str,
    },
    /// Two tensors (or two index entries) have the same name.
    #[error("duplicate tensor name")]
    DuplicateTensor,
    /// A tensor entry is not an object, or one of its fields has the wrong JSON type.
    #[error("tensor entry must be an object with dtype, shape and data_offsets: {message}")]
    BadTensorEntry {
        /// What is wrong with the entry.
        message: String,
    },
    /// A tensor entry lacks one of `dtype`, `shape` and `data_offsets`.
    #[error("missing field {field:?}")]
    MissingField {
        /// The missing field's name.
        field: &'static str,
    },
    /// A tensor entry has one of its fields twice.
    #[error("duplicate field {field:?}")]
    DuplicateField {
        /// The repeated field's name.
        field: &'static str,
    },
    /// A dtype that is not one of the safetensors dtypes.
    #[error("unknown dtype {dtype:?}")]
    UnknownDtype {
        /// The dtype as spelled in the header.
        dtype: String,
    },
    /// A shape that is not a list of non-negative integers.
    #[error("invalid shape: {reason}")]
    BadShape {
        /// Which element is wrong, and how.
        reason: String,
    },
    /// A shape with more dimensions than the format accepts.
    #[error("shape rank {rank} exceeds the limit of {limit}")]
    RankTooLarge {
        /// The shape's number of dimensions.
        rank: usize,
        /// The highest rank accepted.
        limit: usize,
    },
    /// An integer literal that does not fit in u64 (rule 7).
    #[error("integer at header byte {at} does not fit in u64")]
    IntegerOutOfRange {
        /// Offset in the header of the integer.
        at: usize,
    },
    /// `data_offsets` (or a ServerlessLLM offset, size or partition) is not a valid byte range.
    #[error("invalid data_offsets: {reason}")]
    BadOffsets {
        /// What is wrong, naming the values.
        reason: String,
    },
    /// `numel × dtype bits` (or an extent reached through strides) overflows u64.
    #[error("size overflows u64 (shape × dtype bits)")]
    SizeOverflow,
    /// A sub-byte dtype whose elements do not fill a whole number of bytes.
    #[error("{numel} elements of {dtype} is not a whole number of bytes")]
    PartialByte {
        /// The number of elements (the product of the shape).
        numel: u64,
        /// The sub-byte element type.
        dtype: crate::Dtype,
    },
    /// The bytes a tensor occupies disagree with what its dtype and shape need.
    #[error("data_offsets span {actual_bytes} bytes but dtype and shape need {expected_bytes}")]
    SizeMismatch {
        /// `numel × dtype bits / 8`.
        expected_bytes: u64,
        /// What `data_offsets` spans (or a ServerlessLLM entry's `size`).
        actual_bytes: u64,
    },

    // ---- safetensors: tiling of the data section ----
    /// The tensor data leaves a gap: a tensor starts after the previous one ended (or the first
    /// after byte 0).
    #[error("tensor data does not start at 0 (first tensor starts at {start})")]
    DataHole {
        /// Where the tensor starts, relative to the data section.
        start: u64,
        /// Where it should start: the end of the previous tensor (0 for the first).
        expected: u64,
    },
    /// A tensor's data starts inside the previous tensor's.
    #[error("tensor data overlaps the previous tensor (starts at {start}, previous ended at {previous_end})")]
    DataOverlap {
        /// Where the tensor starts, relative to the data section.
        start: u64,
        /// Where the previous tensor ends.
        previous_end: u64,
    },
    /// The tensors do not end exactly at the end of the data section.
    #[error("tensor data ends at {end} but the data section is {data_len_bytes} bytes")]
    DataLenMismatch {
        /// Where the last tensor ends, relative to the data section.
        end: u64,
        /// The data section's length: file size − 8 − `n`.
        data_len_bytes: u64,
    },

    // ---- sharded checkpoints ----
    /// A shard index (`*.safetensors.index.json`) that is not valid JSON of the expected shape.
    #[error("invalid index: {message}")]
    BadIndex {
        /// What is wrong with it.
        message: String,
    },
    /// An index file larger than this crate reads; refused before any of it is read.
    #[error("index file is {len_bytes} bytes, over the limit of {limit_bytes}")]
    IndexTooLarge {
        /// The file's size (or what was read of it, if it grew).
        len_bytes: u64,
        /// The largest index accepted.
        limit_bytes: u64,
    },
    /// A shard name in an index that is not a plain file name (a path, `..`, empty, ...).
    #[error("shard name {shard:?} is not a plain file name")]
    BadShardName {
        /// The name as the index spells it.
        shard: String,
    },
    /// A shard the index names does not exist.
    #[error("shard {shard:?} listed in the index is missing")]
    MissingShard {
        /// The missing shard's name.
        shard: String,
    },
    /// The index maps a tensor to a shard whose header does not have it.
    #[error("tensor mapped to shard {shard:?}, which does not contain it")]
    TensorNotInShard {
        /// The shard the index names.
        shard: String,
    },
    /// A shard holds a tensor that the index does not map.
    #[error("tensor is in shard {shard:?} but not in the index's weight_map")]
    TensorNotInIndex {
        /// The shard holding the tensor.
        shard: String,
    },
    /// Two shards both hold the same tensor.
    #[error("tensor is in two shards: {first:?} and {second:?}")]
    TensorInTwoShards {
        /// The shard where the tensor was found first.
        first: String,
        /// The other shard holding it.
        second: String,
    },
    /// A path that must be a regular file (a header, index, manifest or partition) is a FIFO,
    /// a device, a directory, …; refused by [`crate::open_regular`] before anything is read.
    #[error("not a regular file ({found})")]
    NotRegularFile {
        /// What the path is instead.
        found: crate::NonRegular,
    },
    /// The path holds no checkpoint this crate recognises, or a file that cannot be one.
    #[error("no checkpoint found: {reason}")]
    NotACheckpoint {
        /// Why (no index and no shards, not a regular file, too many entries, ...).
        reason: String,
    },

    // ---- ServerlessLLM ----
    /// A `tensor_index.json` entry that is not a 5- or 6-element array of the expected types.
    #[error("invalid tensor_index.json entry: {message}")]
    BadSllmEntry {
        /// Which element is wrong, and how.
        message: String,
    },
    /// A dtype name that is not a known torch dtype (or legacy short name).
    #[error("unknown torch dtype {dtype:?}")]
    UnknownTorchDtype {
        /// The dtype as spelled in the index.
        dtype: String,
    },
    /// An entry's shape and strides have different numbers of dimensions.
    #[error("shape rank {shape_rank} and stride rank {stride_rank} differ")]
    StrideRankMismatch {
        /// The shape's number of dimensions.
        shape_rank: usize,
        /// The strides' number of dimensions.
        stride_rank: usize,
    },
    /// The strides reach past the recorded storage size.
    #[error(
        "highest element reachable through shape and stride needs {needed_bytes} bytes, but size is {size_bytes}"
    )]
    StrideOutOfBounds {
        /// Bytes up to and including the highest element shape and strides reach.
        needed_bytes: u64,
        /// The entry's recorded storage size.
        size_bytes: u64,
    },
    /// The directory has no `tensor.data_0`.
    #[error("no partition tensor.data_0 found")]
    NoPartitions,
    /// A tensor's bytes do not lie inside one partition (most often: a truncated partition).
    #[error("tensor range {offset}..{end} does not lie wholly inside one partition")]
    OutsidePartition {
        /// The tensor's offset as the index records it (global, or local for the legacy layout).
        offset: u64,
        /// `offset + size`.
        end: u64,
    },
    /// Two entries overlap without being tied (same offset and size: one storage, two names).
    #[error("tensor overlaps tensor {other:?} without being tied to it (same offset and size)")]
    SllmOverlap {
        /// The entry it overlaps.
        other: String,
    },

    // ---- writing ----
    /// A checkpoint cannot be written as asked (a bad spec, layout or destination).
    #[error("cannot write: {reason}")]
    Write {
        /// Why.
        reason: String,
    },
}
