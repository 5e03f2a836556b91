//! A sharded load ([`LoadOptions::shard`]): each selected tensor narrowed to its slice (a
//! tensor-parallel rank's share, or slices named one by one), reading only what the planner's
//! choice needs (`tensora_plan::SliceRead`: the slice's runs, or a covering range) and landing each
//! slice contiguous (`[rows, width]`) in the one owned arena.
//!
//! Landing: every run lands at its plan location; a strided or covering slice is then packed in
//! place, row by row towards the slice's first byte (each row moves to a lower or equal address,
//! so one forward pass of `copy_within` never overwrites a row not yet moved). No second buffer.

use std::time::Instant;

use tensora_format::{Checkpoint, FileId, Shard, Slice, TensorInfo};
use tensora_plan::{Extent, Order, Plan, SliceKind, SliceRead, SourceCost, StridedRows};

use super::loaded::Entry;
use super::session::{OwnedPlan, file_groups};
use super::session::{Session, WindowPlan, begin_reading};
use super::{LoadOptions, Loaded, Residence};
use crate::auto::{Delivery, Pieces};
use crate::error::LoadError;
use crate::report::SliceCounts;

/// What one request costs, in the bytes a covering read moves meanwhile, reading through the page
/// cache: measured here (`examples/slice_cost.rs`, a cached 256 MiB of the TinyLlama fixture,
/// medians of 7 alternating rounds, shared machine) one `pread` of a row costs what the covering
/// read (pieces of 8 MiB, then packing the rows in place) spends on 343 to 1,730 bytes (rows of
/// 256 B to 4 KiB every 1 to 16 KiB; about 1 µs a call, 0.6 ns a byte); rounded up. So a row-parallel
/// F16 slice at TP=4 (1 KiB of every 4 KiB, 2.75 of 11 KiB) is read strided: 1.7x and 2.5x faster
/// than covering per row there, and the arena holds the slice, not the covering range.
pub(crate) const PAGE_CACHE_REQUEST_COST_BYTES: u64 = 2 << 10;
/// The same for `O_DIRECT` reads kept busy by a queue: about 5 µs of a request's share of a local
/// NVMe drive's IOPS, at 3 GB/s. This VM's disk measured near it: 2 KiB reads at 128 in flight
/// ran 106,000 to 123,000 a second, 6.3 to 7.9 µs a request (`examples/direct_request_cost.rs`),
/// 12 to 15 KB at the 1.8 GB/s its 8 MiB reads reach; the TP=2 share of the TinyLlama fixture
/// read as exactly its rows, 90,327 requests, took 1.89 s against 0.84 s for its covering ranges
/// (1.45 GB) (`tensora-py/bench/share_plans.py`, bench_tp.py's tp2 cell).
pub(crate) const DIRECT_REQUEST_COST_BYTES: u64 = 16 << 10;
/// The same for a remote store: a ranged GET's first byte takes tens of milliseconds, at the
/// 200 MB/s one connection sustains.
pub(crate) const REMOTE_REQUEST_COST_BYTES: u64 = 4 << 20;

/// One selected tensor of a sharded load: its checkpoint index, its info as delivered (narrowed)
/// and how its bytes are read.
struct Item {
    tensor: usize,
    info: TensorInfo,
    rows: StridedRows,
    read: SliceRead,
    slice: Option<Slice>,
}

/// Loads the selected tensors narrowed as `shard` says into one owned arena (see the module docs).
/// Hooks are refused (a slice is not the tensor a digest covers); the residence is always owned.
pub(super) fn load_sharded(
    ckpt: &Checkpoint,
    opts: &LoadOptions,
    shard: &Shard,
) -> Result<Loaded, LoadError> {
    if opts.on_tensor.is_some() || opts.on_read.is_some() {
        return Err(LoadError::Unsupported {
            what: "on_tensor and on_read hooks with a shard (they cover whole tensors)".to_owned(),
        });
    }
    let owned_opts = owned_options(opts);
    let (session, selected, mut phases, faults_before) =
        begin_reading(ckpt, &owned_opts, Delivery::Owned, Pieces::Slices)?;
    let t = Instant::now();
    let items = items_of(ckpt, &session, &selected, shard)?;
    refuse_packing_shared_bytes(&items)?;
    let (owned, runs_of) = session.plan_sharded(&items, &selected)?;
    phases.plan += t.elapsed().as_secs_f64();
    let mut loaded =
        session.load_owned_running(&owned, &owned.plans, &selected, phases, faults_before, None)?;
    let t = Instant::now();
    let mut entries = Vec::with_capacity(items.len());
    let mut counts = SliceCounts::default();
    for (item, first_tag) in items.iter().zip(runs_of) {
        let offset_bytes = pack(&mut loaded, &owned, item, first_tag)?;
        counts.add(item.read.kind, item.rows.rows > 1 && item.rows.width_bytes != item.rows.stride_bytes);
        entries.push(Entry { info: item.info.clone(), file: 0, offset_bytes });
    }
    loaded.entries = entries;
    let r = &mut loaded.report;
    r.phases.finish += t.elapsed().as_secs_f64();
    r.tensors = items.len();
    r.bytes_selected = items.iter().map(|i| i.info.len_bytes()).sum();
    r.slices = counts;
    r.finalize();
    Ok(loaded)
}

/// The options a sharded load's session is built with: owned, the shard taken out (the session
/// is the unsharded load's; the slices are planned here).
fn owned_options(opts: &LoadOptions) -> LoadOptions {
    LoadOptions { residence: Residence::Owned, shard: None, ..opts.clone() }
}

/// Every selected tensor narrowed as `shard` says, with the read the session's source makes of it.
fn items_of(
    ckpt: &Checkpoint,
    session: &Session<'_>,
    selected: &[usize],
    shard: &Shard,
) -> Result<Vec<Item>, LoadError> {
    let slices = shard.slices(ckpt, selected).map_err(LoadError::Shard)?;
    let cost = session.source_cost();
    let mut items = Vec::with_capacity(selected.len());
    for (&tensor, slice) in selected.iter().zip(slices) {
        let whole = &ckpt.tensors()[tensor];
        let (info, rows) = match slice {
            Some(slice) => {
                let (info, l) = whole.sliced(slice).map_err(|e| LoadError::Shard(e.into()))?;
                let rows = StridedRows {
                    offset_bytes: l.offset_bytes,
                    rows: l.rows,
                    width_bytes: l.width_bytes,
                    stride_bytes: l.stride_bytes,
                };
                (info, rows)
            }
            None => {
                let len = whole.len_bytes();
                let rows = StridedRows {
                    offset_bytes: whole.offset_bytes(),
                    rows: 1,
                    width_bytes: len,
                    stride_bytes: len,
                };
                (whole.clone(), rows)
            }
        };
        let read = SliceRead::choose(&rows, &cost);
        items.push(Item { tensor, info, rows, read, slice });
    }
    Ok(items)
}

/// How a sharded load ([`LoadOptions::shard`]) reads one selected tensor: what [`shard_reads`]
/// tells a caller before any byte is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardRead {
    /// The tensor's index in the checkpoint.
    pub tensor: usize,
    /// Its slice, or `None` when it is read whole.
    pub slice: Option<Slice>,
    /// How its bytes are read: exactly, as runs of rows, or as one covering range.
    pub kind: SliceKind,
    /// The bytes that read takes, aligned as the load would align them.
    pub bytes_read: u64,
}

/// How [`load`](crate::load) would read each selected tensor of `opts.shard` (which must be
/// set), in selection order, decided exactly as the load decides it (the same session: backend,
/// buffered or direct, alignment), without reading any tensor. A tensor-parallel group uses it to
/// split the covering reads among its ranks (`tensora.distributed.load_tp`).
pub fn shard_reads(ckpt: &Checkpoint, opts: &LoadOptions) -> Result<Vec<ShardRead>, LoadError> {
    let Some(shard) = &opts.shard else {
        return Err(LoadError::Unsupported { what: "shard_reads without a shard".to_owned() });
    };
    let owned_opts = owned_options(opts);
    let (session, selected, _, _) = begin_reading(ckpt, &owned_opts, Delivery::Owned, Pieces::Slices)?;
    let items = items_of(ckpt, &session, &selected, shard)?;
    Ok(items
        .into_iter()
        .map(|i| ShardRead {
            tensor: i.tensor,
            slice: i.slice,
            kind: i.read.kind,
            bytes_read: i.read.bytes_read,
        })
        .collect())
}

/// Packing a slice in place moves bytes that another tensor sharing them (tied weights) would
/// still read: refused, naming the tensor.
fn refuse_packing_shared_bytes(items: &[Item]) -> Result<(), LoadError> {
    let mut spans: Vec<(FileId, u64, u64, bool, &str)> = items
        .iter()
        .filter_map(|i| {
            let r = i.read.runs.first()?.file_bytes.start..i.read.runs.last()?.file_bytes.end;
            Some((i.info.file(), r.start, r.end, i.read.kind != SliceKind::Contiguous, i.info.name()))
        })
        .collect();
    spans.sort_unstable_by_key(|s| (s.0, s.1));
    for pair in spans.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        if a.0 == b.0 && b.1 < a.2 && (a.3 || b.3) {
            let name = if a.3 { a.4 } else { b.4 };
            return Err(LoadError::Unsupported {
                what: format!(
                    "tensor {name:?}: a slice of a tensor whose bytes another selected tensor shares"
                ),
            });
        }
    }
    Ok(())
}

/// Moves `item`'s rows together at its first row's arena offset; returns that offset.
fn pack(
    loaded: &mut Loaded,
    owned: &OwnedPlan,
    item: &Item,
    first_tag: (usize, u32),
) -> Result<u64, LoadError> {
    let (window, first) = first_tag;
    let Some(first_run) = item.read.runs.first() else { return Ok(0) };
    let (base, wp) = &owned.plans[window];
    let location = |tag: u32| wp.plan.location(tag).map(|l| base + l.arena_offset_bytes);
    let internal =
        |what: &str| LoadError::Packing { tensor: item.info.name().to_owned(), what: what.to_owned() };
    let dest = location(first).ok_or_else(|| internal("no location for its first run"))?;
    if item.read.kind == SliceKind::Contiguous {
        return Ok(dest);
    }
    let s = &item.rows;
    let arena = loaded.arena_bytes_mut(0..loaded.arena_len_bytes());
    for (k, run) in item.read.runs.iter().enumerate() {
        let run_at = location(first + k as u32).ok_or_else(|| internal("a run has no location"))?;
        debug_assert!(run.file_bytes.start >= first_run.file_bytes.start);
        for r in run.first_row..run.first_row + run.rows {
            let from = run_at + (r - run.first_row) * s.stride_bytes;
            let to = dest + r * s.width_bytes;
            if from < to || from + s.width_bytes > arena.len() as u64 {
                return Err(internal("a row lies before its packed place or past the arena"));
            }
            arena.copy_within(from as usize..(from + s.width_bytes) as usize, to as usize);
        }
    }
    Ok(dest)
}

impl Session<'_> {
    /// The per-request cost and block of this load's source, for [`SliceRead::choose`].
    pub(super) fn source_cost(&self) -> SourceCost {
        let request_cost_bytes = if !self.backend.reads_local_files() {
            REMOTE_REQUEST_COST_BYTES
        } else if self.direct() {
            DIRECT_REQUEST_COST_BYTES
        } else {
            PAGE_CACHE_REQUEST_COST_BYTES
        };
        SourceCost { align_bytes: self.plan_config().align_bytes, request_cost_bytes }
    }

    /// One plan per file group, each run of each item an extent with its own tag; returns the
    /// plans and, per item, its window and the tag of its first run (its runs' tags follow).
    fn plan_sharded(
        &self,
        items: &[Item],
        selected: &[usize],
    ) -> Result<(OwnedPlan, Vec<(usize, u32)>), LoadError> {
        let position: std::collections::HashMap<usize, usize> =
            selected.iter().enumerate().map(|(k, &t)| (t, k)).collect();
        let groups = file_groups(self.ckpt, selected, self.opts.files_open_max);
        let mut first_tags = vec![(0usize, 0u32); items.len()];
        let mut plans = Vec::with_capacity(groups.len());
        let mut arena_len_bytes: u64 = 0;
        let overflow = || LoadError::Plan(tensora_plan::PlanError::ArenaOverflow);
        for (window, group) in groups.iter().enumerate() {
            let mut files: Vec<u32> = Vec::new();
            let mut extents = Vec::new();
            let mut tensors = Vec::new();
            for &tensor in group {
                let k = position[&tensor];
                let item = &items[k];
                let file = item.info.file().0;
                let local = files.iter().position(|&f| f == file).unwrap_or_else(|| {
                    files.push(file);
                    files.len() - 1
                });
                first_tags[k] = (window, extents.len() as u32);
                for run in &item.read.runs {
                    extents.push(Extent {
                        file: local as u32,
                        offset_bytes: run.file_bytes.start,
                        len_bytes: run.file_bytes.end - run.file_bytes.start,
                        tag: extents.len() as u32,
                    });
                    tensors.push(item.tensor);
                }
            }
            let lens: Vec<u64> = files.iter().map(|&f| self.ckpt.file(FileId(f)).len_bytes()).collect();
            // The runs already read every gap worth reading: the planner reads through none.
            let config = tensora_plan::PlanConfig { coalesce_gap_bytes: 0, ..self.plan_config() };
            let plan = Plan::build_with_file_lens(&extents, &config, &Order::File, &lens)
                .map_err(LoadError::Plan)?;
            let base = arena_len_bytes
                .checked_next_multiple_of(plan.config().arena_period_bytes())
                .ok_or_else(overflow)?;
            arena_len_bytes = base.checked_add(plan.arena_len_bytes()).ok_or_else(overflow)?;
            plans.push((base, WindowPlan { plan, tensors, files }));
        }
        Ok((OwnedPlan { plans, arena_len_bytes }, first_tags))
    }
}
