//! [`Plan::restrict`]: the part of a plan one worker of several executes, with every destination
//! offset unchanged, so that the parts together fill the one arena the whole plan lays out.

use std::ops::Range;

use super::Plan;
use crate::types::{FileQueue, Piece, Read, TagLocation};

impl Plan {
    /// The plan of `reads` (a range of indexes into [`Plan::reads`]) alone: the same arena
    /// layout, config and order, those reads with their pieces, queues cut to them, and each
    /// location's `reads_total` counting only the reads kept (0 for an extent none of them
    /// carries). `bytes_selected` and `bytes_read` count the kept reads. An out-of-range end is
    /// clamped to the plan.
    ///
    /// Several ranks that each execute a disjoint range of one plan fill one arena between them,
    /// each byte once (the collective load of `tensora-io`).
    ///
    /// ```
    /// use tensora_plan::{Extent, Order, Plan, PlanConfig};
    /// let extents = [Extent { file: 0, offset_bytes: 0, len_bytes: 1 << 20, tag: 0 }];
    /// let config = PlanConfig { chunk_bytes: 256 << 10, ..PlanConfig::default() };
    /// let plan = Plan::build(&extents, &config, &Order::File)?;
    /// assert_eq!(plan.reads().len(), 4);
    /// let part = plan.restrict(1..3);
    /// assert_eq!(part.reads().len(), 2);
    /// assert_eq!(part.reads()[0].arena_offset_bytes, plan.reads()[1].arena_offset_bytes);
    /// assert_eq!((part.arena_len_bytes(), part.bytes_read()), (plan.arena_len_bytes(), 512 << 10));
    /// assert_eq!(part.location(0).unwrap().reads_total, 2);
    /// # Ok::<(), tensora_plan::PlanError>(())
    /// ```
    pub fn restrict(&self, reads: Range<usize>) -> Plan {
        let end = reads.end.min(self.reads.len());
        let start = reads.start.min(end);
        let mut kept_reads: Vec<Read> = Vec::with_capacity(end - start);
        let mut pieces: Vec<Piece> = Vec::new();
        let mut reads_of_tag = vec![0u32; self.locations.len()];
        let mut bytes_selected = 0u64;
        for read in &self.reads[start..end] {
            let first = pieces.len() as u32;
            for p in self.read_pieces(read) {
                pieces.push(*p);
                bytes_selected += p.len_bytes;
                if let Some(i) = self.tags.get(p.tag) {
                    reads_of_tag[i] += 1;
                }
            }
            kept_reads.push(Read { pieces: first..pieces.len() as u32, ..read.clone() });
        }
        let queues: Vec<FileQueue> = self
            .queues
            .iter()
            .filter_map(|q| {
                let (s, e) = ((q.reads.start as usize).max(start), (q.reads.end as usize).min(end));
                (s < e).then(|| FileQueue { file: q.file, reads: (s - start) as u32..(e - start) as u32 })
            })
            .collect();
        let locations: Vec<TagLocation> = self
            .locations
            .iter()
            .zip(&reads_of_tag)
            .map(|(l, &n)| TagLocation { reads_total: n, ..*l })
            .collect();
        Plan {
            config: self.config,
            order: self.order.clone(),
            file_lens_bytes: self.file_lens_bytes.clone(),
            bytes_read: kept_reads.iter().map(|r| r.len_bytes).sum(),
            reads: kept_reads,
            pieces,
            queues,
            locations,
            tags: self.tags.clone(),
            arena_len_bytes: self.arena_len_bytes,
            // Pieces of tied extents overlap; a share counts each piece it carries.
            bytes_selected,
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::{Extent, Order, Plan, PlanConfig};
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Restricting a plan to consecutive ranges that cover it keeps every read, piece and
        /// destination exactly once, and the `reads_total` of the parts add up to the whole.
        #[test]
        fn consecutive_parts_partition_the_plan(
            lens in proptest::collection::vec(1u64..200_000, 1..20),
            chunk in 4096u64..100_000,
            cuts in proptest::collection::vec(0usize..64, 0..5),
        ) {
            let mut offset = 0;
            let extents: Vec<Extent> = lens.iter().enumerate().map(|(i, &len)| {
                let e = Extent { file: (i % 3) as u32, offset_bytes: offset, len_bytes: len, tag: i as u32 };
                offset += len + 7;
                e
            }).collect();
            let config = PlanConfig { chunk_bytes: chunk, ..PlanConfig::default() };
            let plan = Plan::build(&extents, &config, &Order::File).unwrap();
            let n = plan.reads().len();
            let mut bounds: Vec<usize> = cuts.iter().map(|c| c % (n + 1)).collect();
            bounds.push(0);
            bounds.push(n);
            bounds.sort_unstable();
            let mut reads = Vec::new();
            let mut totals = vec![0u32; extents.len()];
            for w in bounds.windows(2) {
                let part = plan.restrict(w[0]..w[1]);
                prop_assert_eq!(part.arena_len_bytes(), plan.arena_len_bytes());
                let queued: usize = part.queues().iter().map(|q| q.reads.len()).sum();
                prop_assert_eq!(queued, part.reads().len());
                for r in part.reads() {
                    prop_assert_eq!(part.read_pieces(r).len(), r.pieces.len());
                    reads.push(r.clone());
                }
                for (t, l) in totals.iter_mut().zip(part.locations()) {
                    *t += l.reads_total;
                }
            }
            prop_assert_eq!(reads.len(), n);
            for (a, b) in reads.iter().zip(plan.reads()) {
                prop_assert_eq!((a.file, a.offset_bytes, a.len_bytes, a.arena_offset_bytes), (b.file, b.offset_bytes, b.len_bytes, b.arena_offset_bytes));
            }
            let whole: Vec<u32> = plan.locations().iter().map(|l| l.reads_total).collect();
            prop_assert_eq!(totals, whole);
        }
    }
}
