//! The planner's error type.

/// Why a plan, a selection or a config was refused. Every variant names the offending input, so
/// a caller can report it without guessing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PlanError {
    /// A [`crate::PlanConfig`] field is out of range.
    #[error("invalid plan config: {field} {reason}")]
    InvalidConfig { field: &'static str, reason: String },
    /// Two extents carry the same tag; tags must identify one extent each.
    #[error("tag {tag} is used by more than one extent")]
    DuplicateTag { tag: u32 },
    /// `Order::Priority` names a tag that no extent carries.
    #[error("priority order names tag {tag}, which no extent carries")]
    UnknownPriorityTag { tag: u32 },
    /// An extent's end (or its aligned end, or an arena offset) does not fit in a `u64`.
    #[error("extent with tag {tag} (file #{file}, offset {offset_bytes}, {len_bytes} bytes) overflows u64")]
    Overflow { tag: u32, file: u32, offset_bytes: u64, len_bytes: u64 },
    /// The arena would be larger than `u64::MAX` bytes.
    #[error("arena length overflows u64")]
    ArenaOverflow,
    /// An extent names a file that the given file lengths do not cover.
    #[error("extent with tag {tag} names file #{file}, but only {files} file lengths were given")]
    UnknownFile { tag: u32, file: u32, files: usize },
    /// An extent ends beyond the end of its file.
    #[error(
        "extent with tag {tag} ends at byte {end_bytes} of file #{file}, which has {file_len_bytes} bytes"
    )]
    ExtentPastEof { tag: u32, file: u32, end_bytes: u64, file_len_bytes: u64 },
    /// More extents than a `u32` index can address.
    #[error("{extents} extents given; at most {max} are supported")]
    TooManyExtents { extents: usize, max: usize },
    /// The plan would need more reads than [`crate::READS_MAX`] (raise `chunk_bytes`).
    #[error("the plan needs {reads} reads; at most {max} are supported (raise chunk_bytes)")]
    TooManyReads { reads: u64, max: u64 },
    /// The plan would need more pieces than [`crate::PIECES_MAX`].
    #[error("the plan needs {pieces} pieces; at most {max} are supported (raise chunk_bytes)")]
    TooManyPieces { pieces: u64, max: u64 },
}
