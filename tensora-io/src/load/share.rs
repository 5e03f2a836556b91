//! Collective loads: each of `world_size` ranks reads one share of the selection from storage into
//! an arena laid out for the whole selection, and a transport of the caller's choice (for example
//! `torch.distributed` broadcasts, in the Python bindings) fills the other shares' regions. Storage
//! is read once in all, not once per rank.
//!
//! The shares are a pure function of the checkpoint, the selection and the load options, so every
//! rank computes the same ones with no communication: contiguous runs of the planned reads in arena
//! order, balanced by bytes (each share within one read of `bytes / world_size`), cut between
//! tensors wherever a tensor is smaller than a share. Every rank must pass the same options.
//!
//! ```
//! use tensora_io::{LoadOptions, ShareOf, load, load_share};
//! let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/serverlessllm/tiny");
//! let ckpt = tensora_format::open(dir)?;
//! let opts = LoadOptions { chunk_bytes: 4096, ..LoadOptions::default() };
//! // Two ranks, here in one process: each reads its share, then copies the other's region over.
//! let mut a = load_share(&ckpt, &opts, ShareOf::new(0, 2)?)?;
//! let mut b = load_share(&ckpt, &opts, ShareOf::new(1, 2)?)?;
//! let region_b = b.region_mut(1).to_vec();
//! a.region_mut(1).copy_from_slice(&region_b);
//! let whole = load(&ckpt, &opts)?;
//! let a = a.finish();
//! for t in whole.tensors() {
//!     assert_eq!(a.tensor(t.name()).unwrap().bytes(), t.bytes(), "{}", t.name());
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::ops::Range;
use std::time::Instant;

use tensora_format::Checkpoint;

use super::session::OwnedPlan;
use super::session::{Layout, Session, WindowPlan, begin};
use super::{LoadOptions, Loaded, Residence};
use crate::auto::Delivery;
use crate::error::LoadError;
use crate::report::{Faults, LoadReport, Phases};

/// Which share of a collective load this process reads: rank `rank` of `world_size`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShareOf {
    rank: usize,
    world_size: usize,
}

impl ShareOf {
    /// Rank `rank` of `world_size` (at least 1, `rank < world_size`).
    pub fn new(rank: usize, world_size: usize) -> Result<ShareOf, LoadError> {
        if world_size == 0 || rank >= world_size {
            return Err(LoadError::Unsupported {
                what: format!("rank {rank} of a world of {world_size}: need 0 <= rank < world_size"),
            });
        }
        Ok(ShareOf { rank, world_size })
    }

    /// This process's rank.
    pub fn rank(self) -> usize {
        self.rank
    }

    /// How many ranks share the load.
    pub fn world_size(self) -> usize {
        self.world_size
    }
}

/// One rank's share of a collective load: its own region read from storage, every other region
/// to be filled by the caller's transport before [`ShareLoad::finish`].
#[derive(Debug)]
pub struct ShareLoad {
    loaded: Loaded,
    share: ShareOf,
    /// Arena byte range of each rank's share, by rank.
    regions: Vec<Range<u64>>,
}

impl ShareLoad {
    /// Which share this process read.
    pub fn share(&self) -> ShareOf {
        self.share
    }

    /// The arena byte range rank `rank` reads (empty when its share is empty).
    ///
    /// # Panics
    /// If `rank` is not below the world size.
    pub fn region(&self, rank: usize) -> Range<u64> {
        self.regions[rank].clone()
    }

    /// The bytes of rank `rank`'s region, to fill from that rank (or, for this rank's own region,
    /// to send). Ranks' regions never overlap.
    ///
    /// # Panics
    /// If `rank` is not below the world size.
    pub fn region_mut(&mut self, rank: usize) -> &mut [u8] {
        let r = self.regions[rank].clone();
        self.loaded.arena_bytes_mut(r.start..r.end)
    }

    /// Fault in every other rank's region now (`MADV_POPULATE_WRITE` over the pages the regions
    /// touch), so that the transport's writes into them do not stop on page faults: the kernel's
    /// zeroing of fresh memory is paid off the exchange's path (the Python bindings call this on
    /// the thread that reads the next window while the current one is exchanged). The contents
    /// are unchanged. Returns the bytes populated; 0 on a kernel without `MADV_POPULATE_WRITE`
    /// (before 5.14), where the transport's writes fault the pages in as before.
    pub fn populate_regions(&self) -> u64 {
        const PAGE_BYTES: u64 = 4096;
        let mut populated = 0;
        for (rank, r) in self.regions.iter().enumerate() {
            if rank == self.share.rank || r.is_empty() {
                continue;
            }
            // The arena starts on a huge-page boundary, so page-rounding offsets page-rounds addresses.
            let start = r.start - r.start % PAGE_BYTES;
            let end = r.end.div_ceil(PAGE_BYTES).saturating_mul(PAGE_BYTES);
            let Some((ptr, len)) = self.loaded.arena_ptr_mut(start..end.min(self.loaded.arena_len_bytes()))
            else {
                continue;
            };
            // SAFETY: `ptr .. ptr + len` lies in this load's own anonymous arena mapping
            // (`arena_ptr_mut` checked the range) and starts on a page boundary; POPULATE_WRITE
            // only faults pages in (writable), never changes their contents, so a page shared with
            // this rank's own region keeps the bytes read into it.
            let rc = unsafe { libc::madvise(ptr.as_ptr().cast(), len, libc::MADV_POPULATE_WRITE) };
            if rc != 0 {
                return populated;
            }
            populated += len as u64;
        }
        populated
    }

    /// The names of every tensor of the selection (all ranks' shares together), in arena order.
    pub fn tensor_names(&self) -> impl Iterator<Item = &str> {
        self.loaded.entries.iter().map(|e| e.info.name())
    }

    /// Every rank's region, by rank.
    pub fn regions(&self) -> &[Range<u64>] {
        &self.regions
    }

    /// The report of this rank's own read: `bytes_read` is what it read from storage.
    pub fn report(&self) -> &LoadReport {
        self.loaded.report()
    }

    /// Every region filled: the tensors of the whole selection, as a single-process load gives
    /// them. The caller guarantees every other rank's region was filled with that rank's bytes.
    pub fn finish(self) -> Loaded {
        self.loaded
    }
}

/// Collective loads window by window, for memory bounded by the budget: the selection cut into
/// the streaming windows of [`load_runs`](crate::load_runs), and `share`'s share of each window
/// loaded when the iterator is advanced. Every rank gets the same windows, in the same order.
pub fn load_share_runs<'c>(
    ckpt: &'c Checkpoint,
    opts: &'c LoadOptions,
    share: ShareOf,
) -> Result<ShareRuns<'c>, LoadError> {
    refuse_unshareable(opts)?;
    super::session::refuse_cast(opts, "load_share_runs")?;
    let (mut session, selected, phases, faults_before) = begin(ckpt, opts, Delivery::Streaming)?;
    session.layout = Layout::SameOnEveryRank;
    let pending = super::streaming::stream_windows(ckpt, &selected, opts, opts.budget_bytes).into();
    Ok(ShareRuns { session, share, pending, first: Some((phases, faults_before)) })
}

/// The iterator of [`load_share_runs`].
pub struct ShareRuns<'c> {
    session: Session<'c>,
    share: ShareOf,
    pending: std::collections::VecDeque<Vec<usize>>,
    first: Option<(Phases, Faults)>,
}

impl std::fmt::Debug for ShareRuns<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShareRuns").field("share", &self.share).field("pending", &self.pending.len()).finish()
    }
}

impl Iterator for ShareRuns<'_> {
    type Item = Result<ShareLoad, LoadError>;

    fn next(&mut self) -> Option<Result<ShareLoad, LoadError>> {
        let window = self.pending.pop_front()?;
        let (phases, faults_before) = self.first.take().unwrap_or_else(|| (Phases::default(), Faults::now()));
        let result = self.session.load_share(&window, self.share, phases, faults_before);
        if result.is_err() {
            self.pending.clear();
        }
        Some(result)
    }
}

/// Load rank `share`'s share of the selection into an arena laid out for the whole selection.
/// The options must be the same on every rank; hooks (`on_tensor`, `on_read`), a priority order
/// and mapped residences are refused (a share sees parts of tensors; every rank needs an arena).
pub fn load_share(ckpt: &Checkpoint, opts: &LoadOptions, share: ShareOf) -> Result<ShareLoad, LoadError> {
    refuse_unshareable(opts)?;
    super::session::refuse_cast(opts, "load_share")?;
    let (mut session, selected, phases, faults_before) = begin(ckpt, opts, Delivery::Owned)?;
    session.layout = Layout::SameOnEveryRank;
    session.load_share(&selected, share, phases, faults_before)
}

/// The options a collective load cannot honour.
pub(super) fn refuse_unshareable(opts: &LoadOptions) -> Result<(), LoadError> {
    let what = if opts.on_tensor.is_some() || opts.on_read.is_some() {
        "hooks (on_tensor, on_read): a rank sees only part of the tensors"
    } else if opts.priority.is_some() {
        "a priority order: shares are cut in file order"
    } else if opts.residence != Residence::Owned {
        "a mapped or auto residence: every rank owns an arena for the whole selection"
    } else {
        return Ok(());
    };
    Err(LoadError::Unsupported { what: format!("a collective load with {what}") })
}

impl Session<'_> {
    /// Plan `part` for an owned load, cut it into shares and run only `share`'s reads.
    pub(super) fn load_share(
        &self,
        part: &[usize],
        share: ShareOf,
        mut phases: Phases,
        faults_before: Faults,
    ) -> Result<ShareLoad, LoadError> {
        let t = Instant::now();
        let owned = self.plan_owned(part)?;
        let read_max = owned.plans.first().map_or(1, |(_, wp)| wp.plan.config().read_bytes_max());
        let runs = read_runs(&owned);
        let cuts = cut_shares(&runs, share.world_size, read_max);
        let regions = cuts.iter().map(|c| region(&runs, c.clone())).collect();
        let mine = restrict(&owned, &runs, cuts[share.rank].clone());
        phases.plan += t.elapsed().as_secs_f64();
        let loaded = self.load_owned_running(&owned, &mine, part, phases, faults_before, None)?;
        Ok(ShareLoad { loaded, share, regions })
    }
}

/// One planned read in arena order: its plan (index into the owned plan's groups), its index in
/// that plan, its arena range, and whether a cut just before it falls between tensors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ReadRun {
    plan: usize,
    read: usize,
    arena: Range<u64>,
    clean_before: bool,
}

/// Every read of `owned` in arena order (plans back to back, each in file order).
fn read_runs(owned: &OwnedPlan) -> Vec<ReadRun> {
    let mut out = Vec::new();
    for (p, (base, wp)) in owned.plans.iter().enumerate() {
        let reads = wp.plan.reads();
        for (i, r) in reads.iter().enumerate() {
            let straddles = i > 0 && {
                let before = wp.plan.read_pieces(&reads[i - 1]);
                wp.plan.read_pieces(r).first().is_some_and(|first| before.iter().any(|b| b.tag == first.tag))
            };
            let start = base + r.arena_offset_bytes;
            out.push(ReadRun {
                plan: p,
                read: i,
                arena: start..start + r.len_bytes,
                clean_before: !straddles,
            });
        }
    }
    out
}

/// Cuts `runs` into `world` contiguous shares (ranges of indexes into `runs`) of about equal
/// bytes: each cut is the read boundary nearest its target `k * total / world`, preferring one
/// between tensors within half a read of it. Every share is then within one read (`read_max`) of
/// `total / world`.
pub(super) fn cut_shares(runs: &[ReadRun], world: usize, read_max: u64) -> Vec<Range<usize>> {
    let lens: Vec<u64> = runs.iter().map(|r| r.arena.end - r.arena.start).collect();
    let mut before = Vec::with_capacity(lens.len() + 1); // bytes before read i
    before.push(0u64);
    for l in &lens {
        before.push(before.last().copied().unwrap_or(0) + l);
    }
    let total = *before.last().unwrap_or(&0);
    let mut cuts = vec![0usize];
    for k in 1..world {
        let target = (u128::from(total) * k as u128 / world as u128) as u64;
        let floor = *cuts.last().unwrap_or(&0);
        // Boundaries are sorted by `before`: the nearest one, then a clean one close to it.
        let nearest = (floor..=runs.len()).min_by_key(|&i| before[i].abs_diff(target)).unwrap_or(floor);
        let clean = (floor..=runs.len())
            .filter(|&i| i == runs.len() || i == 0 || runs[i].clean_before)
            .filter(|&i| before[i].abs_diff(target) <= read_max / 2)
            .min_by_key(|&i| before[i].abs_diff(target));
        cuts.push(clean.unwrap_or(nearest).max(floor));
    }
    cuts.push(runs.len());
    cuts.windows(2).map(|w| w[0]..w[1]).collect()
}

/// The arena range the reads `share` of `runs` cover (empty at the next read's start when the
/// share is empty).
fn region(runs: &[ReadRun], share: Range<usize>) -> Range<u64> {
    match (runs.get(share.start), share.end.checked_sub(1).and_then(|e| runs.get(e))) {
        (Some(first), Some(last)) if share.start < share.end => first.arena.start..last.arena.end,
        (Some(next), _) => next.arena.start..next.arena.start,
        _ => runs.last().map_or(0..0, |r| r.arena.end..r.arena.end),
    }
}

/// The plans of `owned` restricted to the reads `share` of `runs`, at their bases.
fn restrict(owned: &OwnedPlan, runs: &[ReadRun], share: Range<usize>) -> Vec<(u64, WindowPlan)> {
    owned
        .plans
        .iter()
        .enumerate()
        .map(|(p, (base, wp))| {
            let mine: Vec<usize> =
                runs[share.clone()].iter().filter(|r| r.plan == p).map(|r| r.read).collect();
            let reads = match (mine.first(), mine.last()) {
                (Some(&a), Some(&b)) => a..b + 1,
                _ => 0..0,
            };
            let plan = wp.plan.restrict(reads);
            (*base, WindowPlan { plan, tensors: wp.tensors.clone(), files: wp.files.clone() })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn runs(lens: &[u64], clean: &[bool]) -> Vec<ReadRun> {
        let mut at = 0;
        lens.iter()
            .enumerate()
            .map(|(i, &l)| {
                let r = ReadRun { plan: 0, read: i, arena: at..at + l, clean_before: clean[i % clean.len()] };
                at += l;
                r
            })
            .collect()
    }

    #[test]
    fn equal_reads_split_evenly_and_cuts_prefer_tensor_boundaries() {
        let r = runs(&[10; 8], &[true]);
        assert_eq!(cut_shares(&r, 4, 10), vec![0..2, 2..4, 4..6, 6..8]);
        // The boundary at read 4 falls inside a tensor; the clean one at 5 is half a read away.
        let mut clean = [true; 8];
        clean[4] = false;
        let r = runs(&[10; 8], &clean);
        assert_eq!(cut_shares(&r, 2, 20), vec![0..3, 3..8]);
        // More ranks than reads: some shares are empty, all reads still covered once.
        let r = runs(&[10; 2], &[true]);
        let cuts = cut_shares(&r, 5, 10);
        assert_eq!(cuts.len(), 5);
        assert_eq!(cuts.iter().map(ExactSizeIterator::len).sum::<usize>(), 2);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        /// The shares partition the reads in order and each is within one read of an equal split.
        #[test]
        fn shares_partition_the_reads_within_one_read_of_equal(
            lens in proptest::collection::vec(1u64..1000, 0..60),
            clean in proptest::collection::vec(any::<bool>(), 1..8),
            world in 1usize..9,
        ) {
            let r = runs(&lens, &clean);
            let read_max = lens.iter().copied().max().unwrap_or(1);
            let cuts = cut_shares(&r, world, read_max);
            prop_assert_eq!(cuts.len(), world);
            prop_assert_eq!(cuts.first().map(|c| c.start), Some(0));
            prop_assert_eq!(cuts.last().map(|c| c.end), Some(r.len()));
            prop_assert!(cuts.windows(2).all(|w| w[0].end == w[1].start));
            let total: u64 = lens.iter().sum();
            for c in &cuts {
                let bytes: u64 = lens[c.clone()].iter().sum();
                let ideal = total as f64 / world as f64;
                prop_assert!((bytes as f64 - ideal).abs() <= read_max as f64 + 1.0, "{bytes} vs {ideal}");
            }
        }
    }
}
