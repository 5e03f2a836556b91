//! Errors of the load API. Every read error names the file, the offset and the tensor.

use std::path::PathBuf;

use tensora_format::Dtype;
use tensora_format::SelectionError;
use tensora_plan::PlanError;

use crate::seam::ReadErrorKind;

/// A boxed error from a caller's callback or hook.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why a load failed. No `Loaded` is ever returned with missing bytes: any of these aborts the
/// whole load.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// The selection names tensors that do not exist, or a glob is bad.
    #[error("selection: {0}")]
    Selection(#[source] SelectionError),
    /// A shard's slice does not fit its tensor, a rule is bad, or the rank is not below the world
    /// size (the error names the tensor or the input).
    #[error("shard: {0}")]
    Shard(#[source] tensora_format::TpError),
    /// A sharded load found a landed row where packing cannot move it from (a plan laid out
    /// against the file order): an internal error, named, never a wrong tensor.
    #[error("packing the slice of tensor {tensor:?}: {what}")]
    Packing {
        /// The tensor.
        tensor: String,
        /// What was found.
        what: String,
    },
    /// The planner refused the extents or the config (e.g. a zero budget).
    #[error("plan: {0}")]
    Plan(#[source] PlanError),
    /// `--backend NAME` names no registered backend.
    #[error("unknown backend {name:?} (known: {known})")]
    UnknownBackend {
        /// The name given.
        name: String,
        /// The registered names, comma-separated.
        known: String,
    },
    /// The chosen backend cannot run here (probed).
    #[error("backend {backend} is unavailable: {reason}")]
    BackendUnavailable {
        /// The backend.
        backend: String,
        /// What the probe found (e.g. io_uring blocked by seccomp).
        reason: String,
    },
    /// Opening or stat-ing a checkpoint file failed.
    #[error("{}: {source}", path.display())]
    Open {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A file's size, mtime or inode differs from what was parsed: it was replaced or modified.
    #[error("{}: {change}", path.display())]
    Changed {
        /// The file.
        path: PathBuf,
        /// What changed.
        change: tensora_format::FileChanged,
    },
    /// The file has far fewer allocated blocks than its size (an interrupted download).
    #[error(
        "{}: sparse file ({allocated_bytes} of {len_bytes} bytes allocated); refusing to load \
         (set allow_sparse to override)",
        path.display()
    )]
    Sparse {
        /// The file.
        path: PathBuf,
        /// Bytes the filesystem has allocated for it.
        allocated_bytes: u64,
        /// Its size.
        len_bytes: u64,
    },
    /// A read failed permanently (or its transient errors outlived the retries).
    #[error("{}: reading at offset {offset_bytes} ({len_bytes} bytes) for tensor {tensor:?}: {kind}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The first byte (file offset) that did not land.
        offset_bytes: u64,
        /// Bytes of the failed read from that offset.
        len_bytes: u64,
        /// The tensor that byte belongs to.
        tensor: String,
        /// Why.
        kind: ReadErrorKind,
    },
    /// The backend failed as a whole rather than on one read (e.g. an io_uring ring could not be
    /// entered): no file or offset is involved.
    #[error("backend {backend} failed: {kind}")]
    Backend {
        /// The backend.
        backend: String,
        /// Why.
        kind: ReadErrorKind,
    },
    /// A tensor's stored dtype has no cast to the dtype asked for (see [`convert`](crate::convert)).
    #[error("tensor {tensor:?}: {source}")]
    Cast {
        /// The tensor.
        tensor: String,
        /// The dtypes (`CastError::Unsupported`).
        #[source]
        source: crate::cast::CastError,
    },
    /// A load other than [`load`](crate::load())/[`load_path`](crate::load_path) was asked for a
    /// dtype cast: only an owned load builds the copy at the target dtype.
    #[error("{api} cannot cast (dtype {dtype}): cast with load or load_path")]
    CastNotSupportedHere {
        /// The API called.
        api: &'static str,
        /// The dtype asked for.
        dtype: &'static str,
    },
    /// The destination arena could not be allocated.
    #[error("allocating a {len_bytes}-byte arena: {source}")]
    Arena {
        /// The length asked for.
        len_bytes: u64,
        /// The OS error (usually `ENOMEM`).
        #[source]
        source: std::io::Error,
    },
    /// Mapping the files for `Residence::Mapped` failed.
    #[error("mapping the checkpoint files: {0}")]
    Map(#[source] std::io::Error),
    /// The streaming callback or the `on_tensor` hook returned an error; the load stopped.
    #[error("callback failed on tensor {tensor:?}: {source}")]
    Callback {
        /// The tensor the callback was given.
        tensor: String,
        /// The callback's error.
        #[source]
        source: BoxError,
    },
    /// The options ask for something this kind of load cannot do (e.g. hooks on a collective
    /// load).
    #[error("unsupported: {what}")]
    Unsupported {
        /// What, and why not.
        what: String,
    },
    /// The load was cancelled.
    #[error("cancelled")]
    Cancelled,
    /// The backend returned without error but some tensor's reads never completed (a backend bug);
    /// reported rather than handing out missing bytes.
    #[error("backend {backend} finished without completing tensor {tensor:?}")]
    Incomplete {
        /// The backend.
        backend: String,
        /// The first tensor with missing bytes.
        tensor: String,
    },
    /// `load_path` could not open or parse the checkpoint.
    #[error(transparent)]
    Format(#[from] tensora_format::Error),
}

/// Why a typed view of a tensor was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ViewError {
    /// The tensor's dtype is not the requested element type.
    #[error("tensor {tensor:?} is {dtype}, not {requested}")]
    Dtype {
        /// The tensor.
        tensor: String,
        /// Its dtype.
        dtype: Dtype,
        /// The dtype of the element type asked for.
        requested: &'static str,
    },
    /// The bytes are not aligned for the element type (never reinterpreted unaligned).
    #[error("tensor {tensor:?} at address 0x{addr:x} is not {align_bytes}-byte aligned")]
    Misaligned {
        /// The tensor.
        tensor: String,
        /// Its address.
        addr: usize,
        /// The alignment the element type needs.
        align_bytes: usize,
    },
    /// The byte length is not a whole number of elements.
    #[error("tensor {tensor:?} has {len_bytes} bytes, not a multiple of {elem_bytes}")]
    Length {
        /// The tensor.
        tensor: String,
        /// Its length.
        len_bytes: usize,
        /// The element size.
        elem_bytes: usize,
    },
}
