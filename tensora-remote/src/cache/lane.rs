//! The cache's in-place lane, what a load's fetched ranges take into the copies: a range is
//! written from where it landed in the load's destination (the arena) by one of
//! [`LANE_THREADS`] threads scoped to the load's run, and lands (is handed to the load) only once
//! written. No copy of the bytes is made; with reads planned on 4 KiB blocks
//! (`RemoteBackend::read_align_bytes`) the whole range goes to the disk with `O_DIRECT`, so
//! neither a buffer nor the page cache holds a second copy of what is loaded.
//!
//! The fetch that handed a range over is done: its connection takes the next range while the
//! disk writes this one. Bounds: a range waits here holding its budget permit (given back when it
//! lands), so the ranges fetched and not yet landed never pass the load's in-flight budget; a
//! disk slower than the network slows the fetches to its pace once the budget is taken, with no
//! memory of its own.

use std::sync::Arc;

use tensora_io::{Permit, ReadTarget};

use super::{CacheSession, Entry};

/// Threads writing a load's ranges into the copies.
pub const LANE_THREADS: usize = 4;

/// A fetched range on its way into its object's copy: the claimed read itself, and its budget.
pub(crate) struct LaneWrite<'j> {
    pub entry: Arc<Entry>,
    pub offset_bytes: u64,
    /// The CRC-32C of the range's bytes, computed as they landed.
    pub crc32c: u32,
    pub target: ReadTarget<'j>,
    /// The range's share of the load's in-flight budget, held until it lands.
    pub permit: Permit,
}

impl<'j> LaneWrite<'j> {
    /// Write the range into its copy (a failure is counted in `session`'s tally, never fatal: the
    /// copy stays partial); the read to land, and its permit.
    pub fn write(self, session: &CacheSession) -> (ReadTarget<'j>, Permit) {
        let LaneWrite { entry, offset_bytes, crc32c, mut target, permit } = self;
        let bytes = target.buf();
        let written = entry.write(offset_bytes, bytes, crc32c);
        session.writers.record(&entry.description.url, bytes.len(), written);
        (target, permit)
    }
}
