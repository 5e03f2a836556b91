//! The owned load: every selected tensor in one hugepage arena.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use tensora_format::Checkpoint;

use super::files::FileSet;
use super::loaded::Entry;
use super::mapped::load_mapped;
use super::run::{Outlives, SubDest};
use super::session::{Session, Tally, WindowPlan, begin, touched_files};
use super::{LoadOptions, Loaded};
use crate::arena::{Arena, Pages};
use crate::auto::Delivery;
use crate::cast::DtypeTarget;
use crate::error::LoadError;
use crate::report::{Faults, Phases};
use crate::seam::{Access, IoStats};

/// Load the selected tensors: into one owned hugepage arena
/// ([`Residence::Owned`](super::Residence::Owned), the default), or as zero-copy views of the files
/// ([`Residence::Mapped`](super::Residence::Mapped)), or whichever `auto` picks
/// ([`Residence::Auto`](super::Residence::Auto)). See the module docs.
///
/// With [`LoadOptions::dtype`] other than `Stored`, an owned copy at the target dtype, each read
/// converted as it lands (see [`LoadOptions::dtype`]).
pub fn load(ckpt: &Checkpoint, opts: &LoadOptions) -> Result<Loaded, LoadError> {
    if let Some(shard) = &opts.shard {
        super::session::refuse_cast(opts, "a sharded load (LoadOptions::shard)")?;
        return super::sliced::load_sharded(ckpt, opts, shard);
    }
    if opts.dtype != DtypeTarget::Stored {
        return super::cast::load_cast(ckpt, opts);
    }
    let (session, selected, phases, faults_before) = begin(ckpt, opts, Delivery::Owned)?;
    session.load_part(&selected, phases, faults_before)
}

/// The plans of one owned load: one per group of at most `files_open_max` files, each in its own
/// part of one arena (`(base, plan)`), and the arena's length.
pub(super) struct OwnedPlan {
    pub(super) plans: Vec<(u64, WindowPlan)>,
    pub(super) arena_len_bytes: u64,
}

impl Session<'_> {
    /// Load `part` of the selection (tensor indexes) as this session's residence says.
    pub(super) fn load_part(
        &self,
        part: &[usize],
        mut phases: Phases,
        faults_before: Faults,
    ) -> Result<Loaded, LoadError> {
        if self.residence.is_mapped() {
            return load_mapped(self, part, phases, faults_before);
        }
        let t = Instant::now();
        let plan = self.plan_owned(part)?;
        phases.plan += t.elapsed().as_secs_f64();
        self.load_owned(&plan, part, phases, faults_before)
    }

    /// Plan `part` for an owned load.
    pub(super) fn plan_owned(&self, part: &[usize]) -> Result<OwnedPlan, LoadError> {
        let groups = file_groups(self.ckpt, part, self.opts.files_open_max);
        let mut plans = Vec::with_capacity(groups.len());
        let mut arena_len_bytes: u64 = 0;
        for group in &groups {
            let wp = self.plan_window(group)?;
            let period = wp.plan.config().arena_period_bytes();
            let base = arena_len_bytes
                .checked_next_multiple_of(period)
                .ok_or(LoadError::Plan(tensora_plan::PlanError::ArenaOverflow))?;
            arena_len_bytes = base
                .checked_add(wp.plan.arena_len_bytes())
                .ok_or(LoadError::Plan(tensora_plan::PlanError::ArenaOverflow))?;
            plans.push((base, wp));
        }
        Ok(OwnedPlan { plans, arena_len_bytes })
    }

    /// Run an owned plan of `part` into a fresh (or recycled) arena.
    pub(super) fn load_owned(
        &self,
        owned: &OwnedPlan,
        part: &[usize],
        phases: Phases,
        faults_before: Faults,
    ) -> Result<Loaded, LoadError> {
        self.load_owned_running(owned, &owned.plans, part, phases, faults_before, None)
    }

    /// Lay out the arena of `owned` and its tensors, but run only the plans `run` (parts of
    /// `owned`'s plans, at the same bases: a collective load's own share). Into `faulted_in`, an
    /// arena of exactly `owned.arena_len_bytes` whose pages are faulted in already, if given
    /// (see [`super::runs`]); otherwise into one from [`LoadOptions::arena_reuse`].
    pub(super) fn load_owned_running(
        &self,
        owned: &OwnedPlan,
        run: &[(u64, WindowPlan)],
        part: &[usize],
        mut phases: Phases,
        faults_before: Faults,
        faulted_in: Option<Arena>,
    ) -> Result<Loaded, LoadError> {
        let opts = self.opts;
        let t = Instant::now();
        let len_bytes = owned.arena_len_bytes;
        let (arena, memory) = match faulted_in {
            Some(arena) => {
                debug_assert_eq!(arena.len_bytes(), len_bytes);
                (arena, Memory::FaultedIn)
            }
            None => opts
                .arena_reuse
                .arena(len_bytes, Access::direct_if(self.direct()))
                .map_err(|source| LoadError::Arena { len_bytes, source })?,
        };
        let mut files = FileSet::new(opts.files_open_max);
        let stats = self.run_plans(&arena, memory, run, &mut files)?;
        phases.io += t.elapsed().as_secs_f64();
        files.bill_open(&mut phases);

        let t = Instant::now();
        files.close_and_check(self.ckpt)?;
        let mut entries = Vec::with_capacity(part.len());
        for (base, wp) in &owned.plans {
            for (tag, &ti) in wp.tensors.iter().enumerate() {
                let loc = wp.plan.location(tag as u32).copied();
                let info = self.ckpt.tensors()[ti].clone();
                let offset_bytes = match loc {
                    Some(l) if info.len_bytes() > 0 => base + l.arena_offset_bytes,
                    _ => 0,
                };
                entries.push(Entry { info, file: 0, offset_bytes });
            }
        }
        phases.finish += t.elapsed().as_secs_f64();
        let tally = Tally {
            tensors: entries.len(),
            bytes_selected: self.ckpt.distinct_bytes(part),
            windows: owned.plans.len(),
        };
        let report = self.report(phases, &stats, tally, faults_before);
        Ok(Loaded::in_arena(arena, opts.arena_reuse, entries, report))
    }

    /// Run every plan into its part of `arena`, one after another. Into fresh memory helper
    /// threads fault the arena in ahead of the reads (see [`populate_ahead`]).
    fn run_plans(
        &self,
        arena: &Arena,
        memory: Memory,
        plans: &[(u64, WindowPlan)],
        files: &mut FileSet,
    ) -> Result<Vec<IoStats>, LoadError> {
        self.populating_ahead(arena, plans, memory, || {
            let mut stats = Vec::with_capacity(plans.len());
            for (base, wp) in plans {
                let dest = SubDest::new(arena, *base, wp.plan.arena_len_bytes(), Outlives::Load);
                let no_stream = |_: u32| Ok(());
                stats.push(self.run_window(files, wp, &dest, &no_stream)?);
            }
            Ok(stats)
        })
    }

    /// Run `io`, which fills `plans` into `arena`, with the helper threads that fault `Fresh`
    /// memory in ahead of its reads (see [`populate_ahead`]); they are joined before this returns.
    pub(super) fn populating_ahead<T>(
        &self,
        arena: &Arena,
        plans: &[(u64, WindowPlan)],
        memory: Memory,
        io: impl FnOnce() -> Result<T, LoadError>,
    ) -> Result<T, LoadError> {
        let io_done = AtomicBool::new(false);
        std::thread::scope(|scope| {
            let helper = match (memory, self.direct()) {
                (Memory::FaultedIn, _) => None,
                (Memory::Fresh, true) => Some(Ahead::DirectReads),
                (Memory::Fresh, false) if arena.huge_pages_advised() => Some(Ahead::WhileHuge),
                (Memory::Fresh, false) => None,
            };
            let helpers: Vec<_> = helper
                .into_iter()
                .flat_map(|ahead| {
                    let step = ahead.helpers();
                    (0..step).map(move |first| (ahead, Stride { first, step }))
                })
                .map(|(ahead, stride)| {
                    let io_done = &io_done;
                    scope.spawn(move || populate_ahead(arena, plans, io_done, ahead, stride))
                })
                .collect();
            let result = io();
            io_done.store(true, Ordering::Release);
            // Joined, not left to the scope: the scope only waits for the closure to return, and
            // the load must not return while a helper's thread still exists.
            for h in helpers {
                if let Err(payload) = h.join() {
                    std::panic::resume_unwind(payload);
                }
            }
            result
        })
    }
}

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

/// Split the selection into groups touching at most `files_max` files each (order kept per group).
pub(super) fn file_groups(ckpt: &Checkpoint, selected: &[usize], files_max: usize) -> Vec<Vec<usize>> {
    let files_max = files_max.max(1);
    let order = touched_files(ckpt, selected);
    let mut group_of = vec![0usize; ckpt.files().len()];
    for (pos, &f) in order.iter().enumerate() {
        group_of[f as usize] = pos / files_max;
    }
    let mut groups = vec![Vec::new(); order.len().div_ceil(files_max).max(1)];
    for &i in selected {
        groups[group_of[ckpt.tensors()[i].file().index()]].push(i);
    }
    groups
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
