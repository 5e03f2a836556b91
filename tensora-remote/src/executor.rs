//! [`RemoteExecutor`]: executes a `tensora_plan::Plan` against remote objects, in the shape of
//! `tensora_io::IoBackend::execute` (plan + destination + budget in, `IoStats` out, every
//! completed read reported to a `CompletionSink`).
//!
//! All reads of all files form one issue queue (file order, each file front to back), so when one
//! shard's last chunks are in flight the next shard's first chunks already are too (lookahead
//! across shards). At most `reads_inflight_max` ranges and `budget` bytes are in flight. Each
//! range is one conditional GET whose body is copied, chunk by chunk as it arrives, straight into
//! that read's own slice of the destination: no intermediate buffer per read, no `get_ranges`.

use futures::StreamExt;
use tensora_io::{CompletionSink, IoStats};
use tensora_plan::{Budget, Plan};

use crate::RemoteError;
use crate::fetch::{Fetcher, RemoteObject};

/// Executes plans against remote objects; plan file ids index `objects`.
#[derive(Debug, Clone, Copy)]
pub struct RemoteExecutor<'a> {
    pub(crate) fetcher: Fetcher<'a>,
    pub(crate) objects: &'a [RemoteObject],
    /// Ranges in flight at once (each its own request and connection).
    pub(crate) reads_inflight_max: usize,
}

impl RemoteExecutor<'_> {
    /// Stable name, as in `LoadReport::backend`.
    pub fn name(&self) -> &'static str {
        "remote"
    }

    /// Fetch every read of `plan` into `dest` (which must be at least `plan.arena_len_bytes()`),
    /// calling `sink.read_done` after each read's bytes have all landed. On error, the in-flight
    /// requests are dropped (cancelled) before this returns.
    pub async fn execute(
        &self,
        plan: &Plan,
        dest: &mut [u8],
        budget: &Budget,
        sink: &dyn CompletionSink,
    ) -> Result<IoStats, RemoteError> {
        let reads = plan.reads();
        let mut slots = split_reads(plan, dest)?;
        let mut ordered = Vec::with_capacity(reads.len());
        for queue in plan.queues() {
            for index in queue.reads.clone() {
                let slot = slots.get_mut(index as usize).and_then(Option::take);
                ordered.push((index, slot));
            }
        }
        let fetcher = self.fetcher;
        let objects = self.objects;
        let mut done = futures::stream::iter(ordered)
            .map(|(index, slot)| async move {
                let read = &reads[index as usize];
                let (Some(slot), Some(object)) = (slot, objects.get(read.file as usize)) else {
                    return Err(RemoteError::Options {
                        field: "plan",
                        reason: format!("read {index} names no object or destination range"),
                    });
                };
                let _permit = budget.acquire_async(read.len_bytes).await;
                fetcher.fetch(object, read.offset_bytes, slot).await?;
                Ok(index)
            })
            .buffer_unordered(self.reads_inflight_max.max(1));
        let mut stats = IoStats::default();
        while let Some(result) = done.next().await {
            let index = result?;
            sink.read_done(index).map_err(|_| RemoteError::Stopped)?;
            stats.reads += 1;
            stats.bytes_read += reads[index as usize].len_bytes;
        }
        stats.peak_inflight_bytes = budget.peak_bytes();
        stats.retries = fetcher.counters.retries.load(std::sync::atomic::Ordering::Relaxed);
        Ok(stats)
    }
}

/// Give every read its own disjoint slice of `dest` (the plan guarantees reads never share arena
/// bytes), without `unsafe`: walk the reads in arena order and split the remainder each time.
fn split_reads<'d>(plan: &Plan, dest: &'d mut [u8]) -> Result<Vec<Option<&'d mut [u8]>>, RemoteError> {
    let reads = plan.reads();
    let mut order: Vec<usize> = (0..reads.len()).collect();
    order.sort_unstable_by_key(|&i| reads[i].arena_offset_bytes);
    let mut slots: Vec<Option<&'d mut [u8]>> = (0..reads.len()).map(|_| None).collect();
    let mut rest: &'d mut [u8] = dest;
    let mut rest_start_bytes = 0u64;
    for i in order {
        let read = &reads[i];
        let bad = |what: &str| RemoteError::Options {
            field: "dest",
            reason: format!("read {i} at arena offset {}: {what}", read.arena_offset_bytes),
        };
        let skip = read
            .arena_offset_bytes
            .checked_sub(rest_start_bytes)
            .ok_or_else(|| bad("overlaps another read"))?;
        let skip = usize::try_from(skip).map_err(|_| bad("offset too large"))?;
        let len = usize::try_from(read.len_bytes).map_err(|_| bad("length too large"))?;
        let (_, tail) =
            std::mem::take(&mut rest).split_at_mut_checked(skip).ok_or_else(|| bad("past the end"))?;
        let (mine, tail) = tail.split_at_mut_checked(len).ok_or_else(|| bad("past the end"))?;
        slots[i] = Some(mine);
        rest = tail;
        rest_start_bytes = read.arena_offset_bytes + read.len_bytes;
    }
    Ok(slots)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use tensora_plan::{Extent, Order, PlanConfig};

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]
        /// Every read gets exactly its arena range, and slices never overlap.
        #[test]
        fn split_matches_plan(lens in proptest::collection::vec((0u32..3, 1u64..300_000), 1..40), chunk in 4096u64..200_000) {
            let mut offsets = [0u64; 3];
            let mut extents = Vec::new();
            for (tag, (file, len)) in lens.iter().enumerate() {
                let off = &mut offsets[*file as usize];
                extents.push(Extent { file: *file, offset_bytes: *off, len_bytes: *len, tag: tag as u32 });
                *off += len + 100;
            }
            extents.sort_by_key(|e| (e.file, e.offset_bytes));
            let config = PlanConfig { chunk_bytes: chunk, ..PlanConfig::default() };
            let plan = Plan::build(&extents, &config, &Order::File).unwrap();
            let mut dest = vec![0u8; plan.arena_len_bytes() as usize];
            let base = dest.as_ptr() as usize;
            let slots = split_reads(&plan, &mut dest).unwrap();
            prop_assert_eq!(slots.len(), plan.reads().len());
            for (slot, read) in slots.iter().zip(plan.reads()) {
                let slot = slot.as_ref().unwrap();
                prop_assert_eq!(slot.as_ptr() as usize - base, read.arena_offset_bytes as usize);
                prop_assert_eq!(slot.len() as u64, read.len_bytes);
            }
        }
    }

    #[test]
    fn split_refuses_a_short_destination() {
        let extents = [Extent { file: 0, offset_bytes: 0, len_bytes: 10_000, tag: 0 }];
        let plan = Plan::build(&extents, &PlanConfig::default(), &Order::File).unwrap();
        let mut dest = vec![0u8; 100];
        assert!(matches!(split_reads(&plan, &mut dest), Err(RemoteError::Options { field: "dest", .. })));
    }
}
