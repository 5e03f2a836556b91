//! The planner's error type.

/// Why a plan, a selection or a config was refused. Every variant names the offending input, so
/// a caller can report it without guessing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PlanError {
    /// A [`crate::PlanConfig`] field is out of range.
    #[error("invalid plan config: {field} {reason}")]
    InvalidConfig {
        /// The field's name, e.g. `"align_bytes"`.
        field: &'static str,
        /// What is wrong with its value, naming the value.
        reason: String,
    },
    /// Two extents carry the same tag; tags must identify one extent each.
    #[error("tag {tag} is used by more than one extent")]
    DuplicateTag {
        /// The tag carried by more than one extent.
        tag: u32,
    },
    /// `Order::Priority` names a tag that no extent carries.
    #[error("priority order names tag {tag}, which no extent carries")]
    UnknownPriorityTag {
        /// The listed tag that no extent carries.
        tag: u32,
    },
    /// An extent's end (or its aligned end, or an arena offset) does not fit in a `u64`.
    #[error("extent with tag {tag} (file #{file}, offset {offset_bytes}, {len_bytes} bytes) overflows u64")]
    Overflow {
        /// The extent's tag.
        tag: u32,
        /// The extent's file id.
        file: u32,
        /// The extent's first byte in its file.
        offset_bytes: u64,
        /// The extent's length in bytes.
        len_bytes: u64,
    },
    /// The arena would be larger than `u64::MAX` bytes.
    #[error("arena length overflows u64")]
    ArenaOverflow,
    /// An extent names a file that the given file lengths do not cover.
    #[error("extent with tag {tag} names file #{file}, but only {files} file lengths were given")]
    UnknownFile {
        /// The extent's tag.
        tag: u32,
        /// The file id the extent names.
        file: u32,
        /// How many file lengths were given (valid ids are `0..files`).
        files: usize,
    },
    /// An extent ends beyond the end of its file.
    #[error(
        "extent with tag {tag} ends at byte {end_bytes} of file #{file}, which has {file_len_bytes} bytes"
    )]
    ExtentPastEof {
        /// The extent's tag.
        tag: u32,
        /// The extent's file id.
        file: u32,
        /// The extent's end (`offset_bytes + len_bytes`) in its file.
        end_bytes: u64,
        /// The file's length as given.
        file_len_bytes: u64,
    },
    /// More extents than a `u32` index can address.
    #[error("{extents} extents given; at most {max} are supported")]
    TooManyExtents {
        /// How many extents were given.
        extents: usize,
        /// The limit, [`crate::EXTENTS_MAX`].
        max: usize,
    },
    /// The plan would need more reads than [`crate::READS_MAX`] (raise `chunk_bytes`).
    #[error("the plan needs {reads} reads; at most {max} are supported (raise chunk_bytes)")]
    TooManyReads {
        /// How many reads the plan needs (counted up to the first group past the limit).
        reads: u64,
        /// The limit, [`crate::READS_MAX`].
        max: u64,
    },
    /// The plan would need more pieces than [`crate::PIECES_MAX`].
    #[error("the plan needs {pieces} pieces; at most {max} are supported (raise chunk_bytes)")]
    TooManyPieces {
        /// How many pieces the plan needs (counted up to the first group past the limit).
        pieces: u64,
        /// The limit, [`crate::PIECES_MAX`].
        max: u64,
    },
}
