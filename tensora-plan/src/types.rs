//! The planner's input and output types. The layout of these is the contract between the planner
//! (control plane) and every `IoBackend` (data plane).

use std::ops::Range;

/// A byte range of one file that the caller wants, labelled with an opaque tag (the caller's
/// tensor id). Extents may overlap exactly or partly (tied weights); the planner reads the union
/// once and every extent still gets its own [`TagLocation`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Extent {
    pub file: u32,
    pub offset_bytes: u64,
    pub len_bytes: u64,
    pub tag: u32,
}

/// Planner knobs. See the crate docs for defaults and how to tune them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlanConfig {
    /// Every read's file offset, length and arena offset is a multiple of this (a final read may
    /// end at EOF). 1 for buffered I/O; the logical block size (usually 4096) for O_DIRECT.
    pub align_bytes: u64,
    /// Target (and maximum) size of one read.
    pub chunk_bytes: u64,
    /// Read through a gap smaller than this instead of issuing a second read.
    pub coalesce_gap_bytes: u64,
    /// Maximum bytes in flight; no single read is larger.
    pub budget_bytes: u64,
}

/// One positional read: `len_bytes` from `offset_bytes` of `file` into the arena at
/// `arena_offset_bytes`. It carries `pieces` (indexes into [`Plan::pieces`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Read {
    pub file: u32,
    pub offset_bytes: u64,
    pub len_bytes: u64,
    pub arena_offset_bytes: u64,
    pub pieces: Range<u32>,
}

/// The part of one extent that one read carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    pub tag: u32,
    /// Offset of this piece inside its read.
    pub read_offset_bytes: u64,
    /// Offset of this piece inside its extent.
    pub extent_offset_bytes: u64,
    pub len_bytes: u64,
}

/// Where an extent's bytes land in the arena, and how many reads must complete before all of them
/// have landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TagLocation {
    pub tag: u32,
    pub arena_offset_bytes: u64,
    pub len_bytes: u64,
    pub reads_total: u32,
}

/// The ordered read queue of one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileQueue {
    pub file: u32,
    /// Indexes into [`Plan::reads`], in issue order.
    pub reads: Range<u32>,
}
