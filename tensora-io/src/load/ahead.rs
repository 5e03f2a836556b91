//! The populate-ahead helpers: threads that fault a fresh arena's pages in, in the order the
//! backends will fill them, while the reads run ([`Memory`], [`Ahead`], [`populate_ahead`]).

use std::sync::atomic::{AtomicBool, Ordering};

use super::session::WindowPlan;
use crate::arena::{Arena, Pages};
use crate::seam::Access;

/// Whether an arena's pages still need faulting in when a load starts: only fresh memory gets
/// populate-ahead helpers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Memory {
    /// Mapped for this load, nothing faulted in (under `ArenaReuse::Recycle` too when nothing
    /// fitting was parked).
    Fresh,
    /// Faulted in before this load's reads: a recycled arena, a streaming window after the first,
    /// `load_runs`' next run.
    FaultedIn,
}

/// What a populate-ahead helper is for, and so when it stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ahead {
    /// Direct reads are DMA into the arena: whoever submits them faults the fresh pages in first,
    /// stalling the queue. [`DIRECT_HELPERS`] helpers fault every page in ahead of the queue
    /// while the device works (I/O bound, so the cores have time).
    DirectReads,
    /// Buffered reads fault their destination in as they copy, on both cores. The helper faults
    /// huge pages in ahead of them, which moves the work rather than adding to it, and watches
    /// their cost: once they fault in slowly (a hypervisor took them back) the arena switches to
    /// base pages and the helper stops, leaving the copies to fault base pages in themselves (a
    /// third thread faulting base pages beside two copying ones measured slower).
    WhileHuge,
}

/// Helper threads faulting the arena in ahead of direct reads. On this project's 2-core VM, with
/// its free memory handed back to the host (12 s idle before each cold 2.2 GB `tensora load`),
/// two took the load from 1.83 GB/s (1.75-2.07) with one to 2.00 (1.82-2.16), and in a second
/// series, old and new builds alternating, from 1.49 (1.16-1.90) to 1.96 (1.29-2.18): ahead in
/// ten of twelve pairs. With memory freed a moment ago: 2.05 against 2.01, the same.
pub(super) const DIRECT_HELPERS: usize = 2;

impl Ahead {
    /// How many helper threads share the work.
    fn helpers(self) -> usize {
        match self {
            Ahead::DirectReads => DIRECT_HELPERS,
            Ahead::WhileHuge => 1,
        }
    }
}

/// The populate-ahead helpers a run into `arena` starts, each with its share of the fill order:
/// none into memory faulted in already, [`DIRECT_HELPERS`] ahead of direct reads, one ahead of
/// buffered reads while the arena's huge pages are advised (see [`Ahead`]).
pub(super) fn helpers(memory: Memory, access: Access, arena: &Arena) -> Vec<(Ahead, Stride)> {
    let helper = match (memory, access) {
        (Memory::FaultedIn, _) => None,
        (Memory::Fresh, Access::Direct) => Some(Ahead::DirectReads),
        (Memory::Fresh, Access::Buffered) if arena.huge_pages_advised() => Some(Ahead::WhileHuge),
        (Memory::Fresh, Access::Buffered) => None,
    };
    helper
        .into_iter()
        .flat_map(|ahead| {
            let step = ahead.helpers();
            (0..step).map(move |first| (ahead, Stride { first, step }))
        })
        .collect()
}

/// Which reads of the fill order one helper takes: the `first`, then every `step`-th after it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Stride {
    first: usize,
    step: usize,
}

impl Stride {
    fn takes(self, position: usize) -> bool {
        position % self.step.max(1) == self.first
    }
}

/// Faults in the arena's pages in the order the backends will fill them (the reads of every file
/// queue, round-robin across queues, plan after plan), the reads `stride` gives this helper,
/// until `done`, or for [`Ahead::WhileHuge`] until the arena gets base pages. Each read's range
/// is timed ([`Arena::populate_write_adaptive`]): when huge pages fault in slower than
/// [`crate::arena::HUGE_FAULT_BYTES_PER_SECOND_MIN`], the rest of the arena gets base pages. A
/// hint: the first error (e.g. no `MADV_POPULATE_WRITE` before Linux 5.14) ends it quietly.
/// Bounded by one pass over the reads.
pub(super) fn populate_ahead(
    arena: &Arena,
    plans: &[(u64, WindowPlan)],
    done: &AtomicBool,
    ahead: Ahead,
    stride: Stride,
) {
    // Position of each read in the fill order, over every plan.
    let mut position = 0usize;
    for (base, wp) in plans {
        let plan = &wp.plan;
        let queues: Vec<&[tensora_plan::Read]> = plan.queues().iter().map(|q| plan.queue_reads(q)).collect();
        let longest = queues.iter().map(|q| q.len()).max().unwrap_or(0);
        for k in 0..longest {
            for read in queues.iter().filter_map(|q| q.get(k)) {
                let mine = stride.takes(position);
                position += 1;
                if !mine {
                    continue;
                }
                if done.load(Ordering::Acquire) {
                    return;
                }
                match arena.populate_write_adaptive(base + read.arena_offset_bytes, read.len_bytes) {
                    Err(_) => return,
                    Ok(Pages::Base) if ahead == Ahead::WhileHuge => return,
                    Ok(_) => {}
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// The helpers' strides share the fill order out: every read goes to exactly one helper.
        #[test]
        fn every_read_goes_to_exactly_one_helper(step in 1usize..6, position in 0usize..10_000) {
            let takers = (0..step).filter(|&first| Stride { first, step }.takes(position)).count();
            proptest::prop_assert_eq!(takers, 1);
        }
    }

    #[test]
    fn direct_reads_get_their_helpers_and_copies_one() {
        assert_eq!(Ahead::DirectReads.helpers(), DIRECT_HELPERS);
        assert_eq!(Ahead::WhileHuge.helpers(), 1);
        assert!(Stride { first: 1, step: 2 }.takes(3) && !Stride { first: 1, step: 2 }.takes(4));
    }
}
