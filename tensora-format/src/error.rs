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
    /// I/O error: ….
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),

    // ---- safetensors: the 8-byte prefix and header length ----
    /// file is … bytes, shorter than the 8-byte header length prefix.
    #[error("file is {len_bytes} bytes, shorter than the 8-byte header length prefix")]
    FileTooShort { len_bytes: u64 },
    /// header length is 0.
    #[error("header length is 0")]
    HeaderLenZero,
    /// header length … exceeds the limit of … bytes.
    #[error("header length {header_len_bytes} exceeds the limit of {limit_bytes} bytes")]
    HeaderTooLarge { header_len_bytes: u64, limit_bytes: u64 },
    /// header length … plus 8 exceeds the file size ….
    #[error("header length {header_len_bytes} plus 8 exceeds the file size {file_len_bytes}")]
    HeaderBeyondFile { header_len_bytes: u64, file_len_bytes: u64 },
    /// Parsing from bytes: the caller passed fewer bytes than the header needs.
    #[error("have {have_bytes} bytes of the file but the header needs the first {need_bytes}")]
    BytesTooShort { have_bytes: u64, need_bytes: u64 },

    // ---- safetensors: header text and JSON ----
    /// header is not valid UTF-8 (byte …).
    #[error("header is not valid UTF-8 (byte {valid_up_to})")]
    HeaderNotUtf8 { valid_up_to: usize },
    /// header is not valid JSON: ….
    #[error("header is not valid JSON: {message}")]
    HeaderNotJson { message: String },
    /// header must be one JSON object: ….
    #[error("header must be one JSON object: {message}")]
    HeaderNotObject { message: String },
    /// header has bytes after the JSON object (at byte …).
    #[error("header has bytes after the JSON object (at byte {at})")]
    TrailingBytes { at: usize },

    // ---- safetensors: __metadata__ ----
    /// __metadata__ must be an object of string to string, or null: ….
    #[error("__metadata__ must be an object of string to string, or null: {message}")]
    BadMetadata { message: String },
    /// duplicate metadata key ….
    #[error("duplicate metadata key {key:?}")]
    DuplicateMetadataKey { key: String },

    // ---- safetensors: tensor entries ----
    /// invalid tensor name: ….
    #[error("invalid tensor name: {reason}")]
    BadTensorName { reason: &'static str },
    /// duplicate tensor name.
    #[error("duplicate tensor name")]
    DuplicateTensor,
    /// tensor entry must be an object with dtype, shape and data_offsets: ….
    #[error("tensor entry must be an object with dtype, shape and data_offsets: {message}")]
    BadTensorEntry { message: String },
    /// missing field ….
    #[error("missing field {field:?}")]
    MissingField { field: &'static str },
    /// duplicate field ….
    #[error("duplicate field {field:?}")]
    DuplicateField { field: &'static str },
    /// unknown dtype ….
    #[error("unknown dtype {dtype:?}")]
    UnknownDtype { dtype: String },
    /// invalid shape: ….
    #[error("invalid shape: {reason}")]
    BadShape { reason: String },
    /// shape rank … exceeds the limit of ….
    #[error("shape rank {rank} exceeds the limit of {limit}")]
    RankTooLarge { rank: usize, limit: usize },
    /// An integer literal that does not fit in u64 (rule 7).
    #[error("integer at header byte {at} does not fit in u64")]
    IntegerOutOfRange { at: usize },
    /// invalid data_offsets: ….
    #[error("invalid data_offsets: {reason}")]
    BadOffsets { reason: String },
    /// size overflows u64 (shape × dtype bits).
    #[error("size overflows u64 (shape × dtype bits)")]
    SizeOverflow,
    /// … elements of … is not a whole number of bytes.
    #[error("{numel} elements of {dtype} is not a whole number of bytes")]
    PartialByte { numel: u64, dtype: crate::Dtype },
    /// data_offsets span … bytes but dtype and shape need ….
    #[error("data_offsets span {actual_bytes} bytes but dtype and shape need {expected_bytes}")]
    SizeMismatch { expected_bytes: u64, actual_bytes: u64 },

    // ---- safetensors: tiling of the data section ----
    /// tensor data does not start at 0 (first tensor starts at …).
    #[error("tensor data does not start at 0 (first tensor starts at {start})")]
    DataHole { start: u64, expected: u64 },
    /// tensor data overlaps the previous tensor (starts at …, previous ended at …).
    #[error("tensor data overlaps the previous tensor (starts at {start}, previous ended at {previous_end})")]
    DataOverlap { start: u64, previous_end: u64 },
    /// tensor data ends at … but the data section is … bytes.
    #[error("tensor data ends at {end} but the data section is {data_len_bytes} bytes")]
    DataLenMismatch { end: u64, data_len_bytes: u64 },

    // ---- sharded checkpoints ----
    /// invalid index: ….
    #[error("invalid index: {message}")]
    BadIndex { message: String },
    /// index file is … bytes, over the limit of ….
    #[error("index file is {len_bytes} bytes, over the limit of {limit_bytes}")]
    IndexTooLarge { len_bytes: u64, limit_bytes: u64 },
    /// shard name … is not a plain file name.
    #[error("shard name {shard:?} is not a plain file name")]
    BadShardName { shard: String },
    /// shard … listed in the index is missing.
    #[error("shard {shard:?} listed in the index is missing")]
    MissingShard { shard: String },
    /// tensor mapped to shard …, which does not contain it.
    #[error("tensor mapped to shard {shard:?}, which does not contain it")]
    TensorNotInShard { shard: String },
    /// tensor is in shard … but not in the index's weight_map.
    #[error("tensor is in shard {shard:?} but not in the index's weight_map")]
    TensorNotInIndex { shard: String },
    /// tensor is in two shards: … and ….
    #[error("tensor is in two shards: {first:?} and {second:?}")]
    TensorInTwoShards { first: String, second: String },
    /// no checkpoint found: ….
    #[error("no checkpoint found: {reason}")]
    NotACheckpoint { reason: String },

    // ---- ServerlessLLM ----
    /// invalid tensor_index.json entry: ….
    #[error("invalid tensor_index.json entry: {message}")]
    BadSllmEntry { message: String },
    /// unknown torch dtype ….
    #[error("unknown torch dtype {dtype:?}")]
    UnknownTorchDtype { dtype: String },
    /// shape rank … and stride rank … differ.
    #[error("shape rank {shape_rank} and stride rank {stride_rank} differ")]
    StrideRankMismatch { shape_rank: usize, stride_rank: usize },
    /// See the error message.
    /// The strides reach past the recorded storage size.
    #[error(
        "highest element reachable through shape and stride needs {needed_bytes} bytes, but size is {size_bytes}"
    )]
    StrideOutOfBounds { needed_bytes: u64, size_bytes: u64 },
    /// no partition tensor.data_0 found.
    #[error("no partition tensor.data_0 found")]
    NoPartitions,
    /// tensor range …..… does not lie wholly inside one partition.
    #[error("tensor range {offset}..{end} does not lie wholly inside one partition")]
    OutsidePartition { offset: u64, end: u64 },
    /// tensor overlaps tensor … without being tied to it (same offset and size).
    #[error("tensor overlaps tensor {other:?} without being tied to it (same offset and size)")]
    SllmOverlap { other: String },

    // ---- writing ----
    /// cannot write: ….
    #[error("cannot write: {reason}")]
    Write { reason: String },
}
