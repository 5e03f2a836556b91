//! The planner's input and output types. The layout of these is the contract between the planner
//! (control plane) and every `IoBackend` (data plane).

use std::ops::Range;

use crate::PlanError;

/// A byte range of one file that the caller wants, labelled with an opaque tag (the caller's
/// tensor id). Extents may overlap exactly or partly (tied weights); the planner reads the union
/// once and every extent still gets its own [`TagLocation`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Extent {
    /// The caller's file id (an index into its own file list; the planner never opens files).
    pub file: u32,
    /// First byte of the extent in its file.
    pub offset_bytes: u64,
    /// Length of the extent; 0 is allowed (it gets a location and no reads).
    pub len_bytes: u64,
    /// Opaque caller id (usually a tensor index). Tags must be unique within one plan.
    pub tag: u32,
}

/// Planner knobs. See the crate docs for defaults and how to tune them.
///
/// | field | default | meaning |
/// |---|---|---|
/// | `align_bytes` | 1 | power of two; 4096 (the logical block size) for `O_DIRECT` |
/// | `chunk_bytes` | 8 MiB | target and maximum size of one read |
/// | `coalesce_gap_bytes` | 64 KiB | read through gaps smaller than this |
/// | `budget_bytes` | 1 GiB | bytes in flight; also caps one read |
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

impl Default for PlanConfig {
    /// Buffered I/O defaults: `align_bytes` 1, `chunk_bytes` 8 MiB, `coalesce_gap_bytes` 64 KiB,
    /// `budget_bytes` 1 GiB.
    fn default() -> Self {
        Self { align_bytes: 1, chunk_bytes: 8 << 20, coalesce_gap_bytes: 64 << 10, budget_bytes: 1 << 30 }
    }
}

impl PlanConfig {
    /// Checks the config: `align_bytes` is a power of two, and `chunk_bytes` and `budget_bytes`
    /// are each at least `align_bytes` (so at least one aligned block fits in a read).
    /// `coalesce_gap_bytes` may be anything (0 disables coalescing across gaps).
    ///
    /// ```
    /// use tensora_plan::PlanConfig;
    /// assert!(PlanConfig::default().validate().is_ok());
    /// let direct = PlanConfig { align_bytes: 4096, chunk_bytes: 1024, ..PlanConfig::default() };
    /// assert!(direct.validate().is_err());
    /// ```
    pub fn validate(&self) -> Result<(), PlanError> {
        if !self.align_bytes.is_power_of_two() {
            return Err(PlanError::InvalidConfig {
                field: "align_bytes",
                reason: format!("must be a power of two, got {}", self.align_bytes),
            });
        }
        if self.chunk_bytes < self.align_bytes {
            return Err(PlanError::InvalidConfig {
                field: "chunk_bytes",
                reason: format!(
                    "must be at least align_bytes ({}), got {}",
                    self.align_bytes, self.chunk_bytes
                ),
            });
        }
        if self.budget_bytes < self.align_bytes {
            return Err(PlanError::InvalidConfig {
                field: "budget_bytes",
                reason: format!(
                    "must be at least align_bytes ({}), got {}",
                    self.align_bytes, self.budget_bytes
                ),
            });
        }
        Ok(())
    }

    /// The largest read this config allows: `min(chunk_bytes, budget_bytes)` rounded down to a
    /// multiple of `align_bytes`. Meaningful only for a config that passes [`PlanConfig::validate`].
    pub fn read_bytes_max(&self) -> u64 {
        let cap = self.chunk_bytes.min(self.budget_bytes);
        let align = self.align_bytes.max(1);
        cap - cap % align
    }

    /// The gap the planner actually reads through: `min(coalesce_gap_bytes, read_bytes_max())`.
    /// Reading through a gap as large as a whole read never saves a read, and this bound
    /// guarantees that every read carries at least one requested byte.
    pub fn coalesce_gap_effective_bytes(&self) -> u64 {
        self.coalesce_gap_bytes.min(self.read_bytes_max())
    }

    /// An upper bound on the arena bytes a plan adds per non-empty extent beyond
    /// [`crate::Plan::bytes_selected`]: alignment padding on both sides (`2 × (align_bytes − 1)`),
    /// one gap read through (below [`PlanConfig::coalesce_gap_effective_bytes`]) and the arena
    /// shift that keeps file alignment (below [`PlanConfig::arena_period_bytes`]). So
    /// `arena_len_bytes ≤ bytes_selected + extents × arena_slack_per_extent_bytes()`; a loader can
    /// size windows or arenas before planning. Saturates instead of overflowing.
    pub fn arena_slack_per_extent_bytes(&self) -> u64 {
        let align_pad = self.align_bytes.saturating_sub(1).saturating_mul(2);
        align_pad
            .saturating_add(self.coalesce_gap_effective_bytes())
            .saturating_add(self.arena_period_bytes() - 1)
    }

    /// The arena keeps `arena offset ≡ file offset (mod arena_period_bytes())`:
    /// `max(4096, align_bytes)`. So a tensor aligned to N ≤ 4096 in its file is aligned to N in the
    /// arena, and every `O_DIRECT` read lands on a block-aligned address.
    pub fn arena_period_bytes(&self) -> u64 {
        self.align_bytes.max(ARENA_PERIOD_MIN_BYTES)
    }
}

/// The smallest arena period: tensors keep their file alignment up to this many bytes.
pub const ARENA_PERIOD_MIN_BYTES: u64 = 4096;

/// One positional read: `len_bytes` from `offset_bytes` of `file` into the arena at
/// `arena_offset_bytes`. It carries `pieces` (indexes into [`Plan::pieces`](crate::Plan::pieces)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Read {
    /// File id, as in the extents.
    pub file: u32,
    /// First byte to read in the file.
    pub offset_bytes: u64,
    /// Bytes to read: at most [`PlanConfig::read_bytes_max`], never 0.
    pub len_bytes: u64,
    /// Where the first byte lands in the arena.
    pub arena_offset_bytes: u64,
    /// The pieces this read carries: indexes into [`Plan::pieces`](crate::Plan::pieces), in file
    /// order.
    pub pieces: Range<u32>,
}

/// The part of one extent that one read carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    /// The tag of the extent the piece belongs to.
    pub tag: u32,
    /// Offset of this piece inside its read.
    pub read_offset_bytes: u64,
    /// Offset of this piece inside its extent.
    pub extent_offset_bytes: u64,
    /// Length of the piece; never 0.
    pub len_bytes: u64,
}

/// Where an extent's bytes land in the arena, and how many reads must complete before all of them
/// have landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TagLocation {
    /// The extent's tag.
    pub tag: u32,
    /// Where the extent's first byte lands (0 for a zero-length extent).
    pub arena_offset_bytes: u64,
    /// The extent's length.
    pub len_bytes: u64,
    /// How many reads carry a piece of this extent (0 for a zero-length extent). The extent is
    /// complete when that many of its reads have landed.
    pub reads_total: u32,
}

/// The ordered read queue of one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileQueue {
    /// File id.
    pub file: u32,
    /// Indexes into [`Plan::reads`](crate::Plan::reads), in issue order.
    pub reads: Range<u32>,
}
