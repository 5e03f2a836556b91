//! Pure planning for checkpoint loads: extents in, per-file read queues out.
//!
//! The planner is the control plane of every load. It does no I/O and knows no file format and
//! no file name: its input is [`Extent`]s `(file id, offset, length, tag)` (the tag is the
//! caller's tensor id), a [`PlanConfig`] and an [`Order`]; its output is a [`Plan`]. It depends on
//! nothing but `std` and an error-derive crate: the in-flight byte budget backends hold lives in
//! tensora-io (`tensora_io::Budget`), name selection in tensora-format
//! (`tensora_format::Selection`).
//!
//! ```
//! use tensora_plan::{Extent, Order, Plan, PlanConfig};
//!
//! // The caller (tensora-io) turns its selected tensors into extents: (file, offset, len, tag)...
//! let layout = [(0u32, 4160u64, 8192u64), (1, 64, 1 << 20)];
//! let extents: Vec<Extent> = layout
//!     .iter()
//!     .enumerate()
//!     .map(|(i, &(file, offset_bytes, len_bytes))| Extent { file, offset_bytes, len_bytes, tag: i as u32 })
//!     .collect();
//!
//! // ...plans them for O_DIRECT, the second tensor first...
//! let config = PlanConfig { align_bytes: 4096, chunk_bytes: 256 << 10, ..PlanConfig::default() };
//! let file_lens = [12_352, (1 << 20) + 64];
//! let plan = Plan::build_with_file_lens(&extents, &config, &Order::Priority(vec![1]), &file_lens)?;
//! assert_eq!(plan.queues()[0].file, 1); // the urgent file's queue comes first
//! assert_eq!(plan.bytes_selected(), 8192 + (1 << 20));
//! assert!(plan.bytes_read() >= plan.bytes_selected()); // + alignment padding, reported
//!
//! // ...and a backend drains the queues, counting completions per tensor.
//! let mut done = vec![0u32; extents.len()];
//! for queue in plan.queues() {
//!     for read in plan.queue_reads(queue) {
//!         assert!(read.len_bytes <= config.budget_bytes); // one read never exceeds the budget
//!         // pread(file[read.file], arena[read.arena_offset_bytes..][..read.len_bytes], read.offset_bytes)
//!         for piece in plan.read_pieces(read) {
//!             let i = plan.extent_index(piece.tag).unwrap();
//!             done[i] += 1;
//!             if done[i] == plan.locations()[i].reads_total {
//!                 // tensor `piece.tag` is complete at plan.locations()[i].arena_offset_bytes
//!             }
//!         }
//!     }
//! }
//! # Ok::<(), tensora_plan::PlanError>(())
//! ```
//!
//! # Configuration
//!
//! | [`PlanConfig`] field | default | meaning |
//! |---|---|---|
//! | `align_bytes` | 1 | Every read's file offset, length and arena offset is a multiple of this (a read may end at end of file instead). A power of two: 1 for buffered I/O, the logical block size (usually 4096) for `O_DIRECT`. |
//! | `chunk_bytes` | 8 MiB | Target and maximum size of one read. Tune with `cargo bench -p tensora-bench`. |
//! | `coalesce_gap_bytes` | 64 KiB | A gap between requested ranges smaller than this is read through instead of starting a new read. Capped at one read's size ([`PlanConfig::coalesce_gap_effective_bytes`]), so every read carries requested bytes. 0: only touching ranges share reads. |
//! | `budget_bytes` | 1 GiB | Maximum bytes in flight (the capacity of the loader's budget); also caps one read. |
//!
//! [`PlanConfig::validate`] requires `align_bytes` to be a power of two and `chunk_bytes` and
//! `budget_bytes` to be at least `align_bytes`. The largest read is
//! [`PlanConfig::read_bytes_max`] = `min(chunk_bytes, budget_bytes)` rounded down to `align_bytes`.
//!
//! # What a plan guarantees
//!
//! Each is asserted by [`Plan::check`], which `Plan::build` runs in debug builds and the property
//! tests run on random inputs:
//!
//! - reads of one file never overlap, and no two reads share arena bytes;
//! - every requested byte is read exactly once; overlapping (tied) extents are read once and
//!   share arena bytes, yet each extent still gets its own [`TagLocation`];
//! - each read's file offset, length and arena offset are multiples of `align_bytes`, except that
//!   a read may end at end of file (only when file lengths are given, see below);
//! - no read is longer than `chunk_bytes` or `budget_bytes`;
//! - the arena keeps file alignment: arena offset ≡ file offset (mod
//!   [`PlanConfig::arena_period_bytes`] = `max(4096, align_bytes)`), so a tensor aligned to
//!   N ≤ 4096 in its file is aligned to N in the arena; a 2 MiB-aligned arena therefore serves typed
//!   views and `O_DIRECT` without copies. Each separate run of reads costs at most one period of
//!   unused arena bytes;
//! - the bytes read beyond those requested are only alignment padding and gaps smaller than the
//!   effective coalesce gap. [`Plan::bytes_selected`] counts distinct requested bytes (tied bytes
//!   once); [`Plan::bytes_read`] counts what the reads fetch; [`Plan::bytes_overhead`] is the
//!   difference.
//!
//! # End of file
//!
//! The planner knows no file sizes unless told. With [`Plan::build`] an aligned read's end is
//! rounded up past the last requested byte, which may lie past end of file. For `O_DIRECT`,
//! use [`Plan::build_with_file_lens`]: extents are checked to lie inside their file
//! ([`PlanError::ExtentPastEof`]) and a final read ends exactly at end of file.
//!
//! # Order and multi-file loads
//!
//! [`Order::File`] (the default) reads files in id order and each file front to back: the
//! throughput order. [`Order::Priority`] lists tags most urgent first (e.g. layers in forward
//! order for a streaming load): within a file, reads carrying more urgent tags come first (ties in
//! offset order); files are ordered by their most urgent tag. There is one [`FileQueue`] per file
//! with reads; a backend may drain several queues at once to keep several shards busy, issuing
//! each queue's reads in order.
//!
//! # A tensor larger than the budget
//!
//! It is split into reads of at most `min(chunk_bytes, budget_bytes)`; its [`TagLocation`]
//! says how many reads (`reads_total`) must land before it is complete. The budget bounds bytes
//! in flight, not tensor size: the whole tensor must still fit in the destination arena, while
//! at most `budget_bytes` of it are being read at once.
//!
//! # Bounds
//!
//! Every size the plan allocates is bounded before allocation: at most [`READS_MAX`] reads,
//! [`PIECES_MAX`] pieces and [`EXTENTS_MAX`] extents, else a typed [`PlanError`]. All offset
//! arithmetic is checked: an extent whose end, aligned end or arena position overflows `u64`
//! is [`PlanError::Overflow`] or [`PlanError::ArenaOverflow`], never a panic. Tags must be unique
//! ([`PlanError::DuplicateTag`]).
//!
//! # Cost
//!
//! `Plan::build` is linear in the extents plus the reads and pieces. Extents already in
//! `(file, offset)` order (the order `Checkpoint::tensors()` yields) are read in place; a few
//! long sorted runs (priority tensors first, then the rest) are merged; any other order is
//! radix-sorted on a packed `(file, offset, index)` key. `cargo bench -p tensora-bench --bench plan`
//! measures all of these at 1,000 to 1,000,000 extents.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod check;
mod error;
mod plan;
mod slice;
mod types;

pub use error::PlanError;
pub use plan::{EXTENTS_MAX, Order, PIECES_MAX, Plan, READS_MAX};
pub use slice::{DeviceCost, Run, STRIDED_RUNS_MAX, SliceKind, SliceRead, SourceCost, StridedRows};
pub use types::{ARENA_PERIOD_MIN_BYTES, Extent, FileQueue, Piece, PlanConfig, Read, TagLocation};

#[cfg(test)]
mod tests {
    use super::*;

    fn send_sync_static<T: Send + Sync + 'static>() {}

    /// Backends share plans across worker threads.
    #[test]
    fn shared_types_are_send_sync_and_static() {
        send_sync_static::<Plan>();
        send_sync_static::<PlanError>();
    }
}
