//! Everything fixed for one load ([`Session`]): the selection, the backend and why, direct or
//! buffered, the budget; and the plan of one window of tensors ([`WindowPlan`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::time::Instant;

use tensora_format::{Checkpoint, FileId};
use tensora_plan::{Extent, Order, Plan, PlanConfig};

use super::files::{Descriptors, SparseFiles};
use super::{BackendChoice, IoMode, LoadOptions, Residence};
use crate::arena::Arena;
use crate::auto::{self, Delivery};
use crate::error::LoadError;
use crate::report::{Faults, LoadReport, Phases, peak_rss_bytes};
use crate::seam::{Budget, IoBackend, IoStats, Reading};

/// Refuse a dtype cast in `api`, a load that hands out views of its own arena at the stored
/// dtype (only `load` and `load_runs` build arenas at the target dtype, in `super::cast`).
pub(super) fn refuse_cast(opts: &LoadOptions, api: &'static str) -> Result<(), LoadError> {
    match opts.dtype {
        crate::cast::DtypeTarget::Stored => Ok(()),
        other => Err(LoadError::CastNotSupportedHere { api, dtype: other.as_str() }),
    }
}

/// What every load starts with: the page-fault counters, the selection (billed to the `plan`
/// phase) and the session with its backend (billed to `open`).
pub(super) fn begin<'c>(
    ckpt: &'c Checkpoint,
    opts: &'c LoadOptions,
    delivery: Delivery,
) -> Result<(Session<'c>, Vec<usize>, Phases, Faults), LoadError> {
    if opts.shard.is_some() {
        return Err(LoadError::Unsupported {
            what: "a shard with a streamed, mapped-only or collective load (only load takes one)".to_owned(),
        });
    }
    let faults_before = Faults::now();
    let mut phases = Phases::default();
    let t = Instant::now();
    let selected = select(ckpt, opts)?;
    phases.plan += t.elapsed().as_secs_f64();
    let t = Instant::now();
    let session = Session::new(ckpt, opts, &selected, delivery)?;
    phases.open += t.elapsed().as_secs_f64();
    Ok((session, selected, phases, faults_before))
}

/// The selected tensor indexes, priority names first (in the given order), then file order.
pub(super) fn select(ckpt: &Checkpoint, opts: &LoadOptions) -> Result<Vec<usize>, LoadError> {
    let mut selected = ckpt.select(&opts.selection).map_err(LoadError::Selection)?;
    if let Some(priority) = &opts.priority {
        let mut rank: HashMap<usize, usize> = HashMap::with_capacity(priority.len());
        let mut unknown = Vec::new();
        for (r, name) in priority.iter().enumerate() {
            match ckpt.tensor_index(name) {
                Some(i) => {
                    rank.entry(i).or_insert(r);
                }
                None => unknown.push(name.clone()),
            }
        }
        if !unknown.is_empty() {
            return Err(LoadError::Selection(tensora_format::SelectionError::UnknownNames {
                names: unknown,
            }));
        }
        // Stable: unlisted tensors keep file order after the listed ones.
        selected.sort_by_key(|i| rank.get(i).copied().unwrap_or(usize::MAX));
    }
    Ok(selected)
}

/// Checkpoint file ids the selection touches, in order of first use.
pub(super) fn touched_files(ckpt: &Checkpoint, selected: &[usize]) -> Vec<u32> {
    let mut seen = vec![false; ckpt.files().len()];
    let mut out = Vec::new();
    for &i in selected {
        let f = ckpt.tensors()[i].file().0;
        if !seen[f as usize] {
            seen[f as usize] = true;
            out.push(f);
        }
    }
    out
}

/// One plan over a subset of the selection; tag `i` is `tensors[i]`, file `j` is `files[j]`.
pub(super) struct WindowPlan {
    pub(super) plan: Plan,
    pub(super) tensors: Vec<usize>,
    pub(super) files: Vec<u32>,
}

impl WindowPlan {
    pub(super) fn tensor_bytes<'a>(&self, arena: &'a Arena, tag: u32) -> &'a [u8] {
        match self.plan.location(tag) {
            // SAFETY: every read carrying this tensor completed before its tag was reported, and
            // plan reads never overlap, so nothing writes this range while the slice lives (the
            // arena is only reused after the window's backend run and all callbacks return).
            Some(l) if l.len_bytes > 0 => unsafe { arena.slice_unchecked(l.arena_offset_bytes, l.len_bytes) },
            _ => &[],
        }
    }
}

/// Everything fixed for one load.
pub(super) struct Session<'c> {
    pub(super) ckpt: &'c Checkpoint,
    pub(super) opts: &'c LoadOptions,
    pub(super) backend: Arc<dyn IoBackend>,
    pub(super) backend_name: String,
    /// Where the tensors live: `Owned` or `Mapped`, never `Auto` (decided here).
    pub(super) residence: Residence,
    /// How the reads meet the page cache (never `Direct` for mapped views).
    pub(super) reading: Reading,
    pub(super) reason: String,
    pub(super) budget: Budget,
    pub(super) bytes_selected: u64,
    pub(super) files_touched: usize,
    pub(super) no_cancel: AtomicBool,
    pub(super) progress_done: AtomicU64,
    /// What the arena layout may depend on.
    pub(super) layout: Layout,
}

/// What the arena layout (the plan's alignment) may depend on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Layout {
    /// This load's own I/O decision: block-aligned reads only for O_DIRECT.
    ForThisLoad,
    /// Nothing a rank decides alone (a collective load: every rank must compute the same regions,
    /// whatever its residency sample made `auto` pick): always block-aligned reads.
    SameOnEveryRank,
}

impl<'c> Session<'c> {
    pub(super) fn new(
        ckpt: &'c Checkpoint,
        opts: &'c LoadOptions,
        selected: &[usize],
        delivery: Delivery,
    ) -> Result<Session<'c>, LoadError> {
        let decided = Decided::for_load(ckpt, opts, selected, delivery)?;
        let mapped = decided.residence.is_mapped();
        if let Err(reason) = decided.backend.available() {
            return Err(LoadError::BackendUnavailable { backend: decided.backend_name, reason });
        }
        if mapped && !decided.backend.reads_local_files() {
            return Err(LoadError::BackendUnavailable {
                backend: decided.backend_name,
                reason: "mapped residence needs local files; this backend reads from elsewhere".to_owned(),
            });
        }
        let through_cache = if decided.reading.is_direct() { Reading::ReadAhead } else { decided.reading };
        let reading = match opts.io_mode {
            IoMode::Auto if decided.reading.is_direct() && direct_plannable(opts) => Reading::Direct,
            IoMode::Direct if !mapped => Reading::Direct,
            IoMode::Auto | IoMode::Buffered | IoMode::Direct => through_cache,
        };
        Ok(Session {
            ckpt,
            opts,
            backend: decided.backend,
            backend_name: decided.backend_name,
            residence: decided.residence,
            reading,
            reason: decided.reason,
            budget: Budget::new(opts.budget_bytes),
            bytes_selected: ckpt.distinct_bytes(selected),
            files_touched: touched_files(ckpt, selected).len(),
            no_cancel: AtomicBool::new(false),
            progress_done: AtomicU64::new(0),
            layout: Layout::ForThisLoad,
        })
    }

    /// Whether reads go around the page cache (`O_DIRECT`).
    pub(super) fn direct(&self) -> bool {
        self.reading.is_direct()
    }

    /// The descriptors each file is opened with.
    pub(super) fn descriptors(&self) -> Descriptors {
        if self.direct() { Descriptors::BufferedAndDirect } else { Descriptors::Buffered }
    }

    /// What to do with sparse files.
    pub(super) fn sparse(&self) -> SparseFiles {
        SparseFiles::from_allow(self.opts.allow_sparse)
    }

    pub(super) fn plan_config(&self) -> PlanConfig {
        let wanted = self.backend.read_align_bytes();
        let backend_align =
            if wanted.is_power_of_two() && aligned_plannable(self.opts, wanted) { wanted } else { 1 };
        PlanConfig {
            align_bytes: if self.direct() || self.layout == Layout::SameOnEveryRank {
                crate::backends::DIRECT_BLOCK_BYTES.max(backend_align)
            } else {
                backend_align
            },
            chunk_bytes: self.opts.chunk_bytes.max(1),
            budget_bytes: self.opts.budget_bytes,
            ..PlanConfig::default()
        }
    }

    pub(super) fn plan_window(&self, tensors: &[usize]) -> Result<WindowPlan, LoadError> {
        let ckpt = self.ckpt;
        let mut files: Vec<u32> = Vec::new();
        // Local (plan) id of each checkpoint file, by checkpoint file id.
        let mut local_of: Vec<Option<usize>> = vec![None; ckpt.files().len()];
        let mut extents = Vec::with_capacity(tensors.len());
        for (tag, &ti) in tensors.iter().enumerate() {
            let t = &ckpt.tensors()[ti];
            let local = match local_of[t.file().index()] {
                Some(p) => p,
                None => {
                    files.push(t.file().0);
                    local_of[t.file().index()] = Some(files.len() - 1);
                    files.len() - 1
                }
            };
            extents.push(Extent {
                file: local as u32,
                offset_bytes: t.offset_bytes(),
                len_bytes: t.len_bytes(),
                tag: tag as u32,
            });
        }
        let lens: Vec<u64> = files.iter().map(|&f| ckpt.file(FileId(f)).len_bytes()).collect();
        let order = if self.opts.priority.is_some() {
            Order::Priority((0..tensors.len() as u32).collect())
        } else {
            Order::File
        };
        let plan = Plan::build_with_file_lens(&extents, &self.plan_config(), &order, &lens)
            .map_err(LoadError::Plan)?;
        Ok(WindowPlan { plan, tensors: tensors.to_vec(), files })
    }

    pub(super) fn report(
        &self,
        phases: Phases,
        stats: &[IoStats],
        tally: Tally,
        faults_before: Faults,
    ) -> LoadReport {
        let faults = Faults::now().since(faults_before);
        let io_mode = match (self.residence, self.direct()) {
            (Residence::Mapped(_), _) => "mapped",
            (_, true) => "direct",
            (_, false) => "buffered",
        };
        let mut r = LoadReport {
            backend: self.backend_name.clone(),
            reason: self.reason.clone(),
            residence: self.residence.as_str().to_owned(),
            io_mode: io_mode.to_owned(),
            bytes_selected: tally.bytes_selected,
            bytes_read: stats.iter().map(|s| s.bytes_read).sum(),
            phases,
            // The budget's own peak: exact, and the same measure for every backend.
            peak_inflight_bytes: self.budget.peak_bytes(),
            retries: stats.iter().map(|s| s.retries).sum(),
            direct_fallbacks: stats.iter().map(|s| s.direct_fallbacks).sum(),
            minor_faults: faults.minor,
            major_faults: faults.major,
            peak_rss_bytes: peak_rss_bytes(),
            tensors: tally.tensors,
            files: self.files_touched,
            windows: tally.windows,
            ..LoadReport::default()
        };
        r.finalize();
        r
    }
}

/// What a report counts: tensors delivered, their distinct bytes, backend runs.
#[derive(Debug, Clone, Copy)]
pub(super) struct Tally {
    pub(super) tensors: usize,
    pub(super) bytes_selected: u64,
    pub(super) windows: usize,
}

/// The residence, backend and I/O mode of one load, and the one-line reason.
struct Decided {
    residence: Residence,
    backend: Arc<dyn IoBackend>,
    backend_name: String,
    reading: Reading,
    reason: String,
}

impl Decided {
    /// What the caller named, or what `auto` chose from the facts.
    fn for_load(
        ckpt: &Checkpoint,
        opts: &LoadOptions,
        selected: &[usize],
        delivery: Delivery,
    ) -> Result<Decided, LoadError> {
        let (backend, reason) = match &opts.backend {
            BackendChoice::Auto => {
                let asked = auto::Asked {
                    delivery,
                    residence: opts.residence,
                    io_mode: opts.io_mode,
                    budget_bytes: opts.budget_bytes,
                };
                let choice = auto::choose(&auto::gather(ckpt, selected, asked));
                let backend = by_name(choice.backend)?;
                let backend_name = backend.name().to_owned();
                return Ok(Decided {
                    residence: choice.residence,
                    backend,
                    backend_name,
                    reading: choice.reading,
                    reason: choice.reason,
                });
            }
            BackendChoice::Named(n) => (by_name(n)?, format!("backend {n} requested")),
            BackendChoice::Custom(b) => (Arc::clone(b), "custom backend".to_owned()),
        };
        let backend_name = backend.name().to_owned();
        Ok(match opts.residence {
            // Mapped views never run a backend: name what actually serves the bytes.
            Residence::Mapped(promise) => Decided {
                residence: Residence::Mapped(promise),
                backend,
                backend_name: "mmap".to_owned(),
                reading: Reading::ReadAhead,
                reason: format!("mapped: residence \"mapped\" (views run no backend; {reason})"),
            },
            Residence::Owned => Decided {
                residence: Residence::Owned,
                backend,
                backend_name,
                reading: Reading::ReadAhead,
                reason,
            },
            Residence::Auto(_) => Decided {
                residence: Residence::Owned,
                backend,
                backend_name,
                reading: Reading::ReadAhead,
                reason: format!("owned: a backend was named (it copies into the arena); {reason}"),
            },
        })
    }
}

pub(super) fn by_name(name: &str) -> Result<Arc<dyn IoBackend>, LoadError> {
    crate::registry::by_name(name).map(Arc::from).ok_or_else(|| LoadError::UnknownBackend {
        name: name.to_owned(),
        known: crate::registry::names().join(", "),
    })
}

/// Whether a direct plan can be built under `opts`: direct reads are block-aligned, and
/// `PlanConfig::validate` refuses a budget or chunk below the alignment. `auto` stays buffered
/// when this is false (an explicit [`IoMode::Direct`] still gets the planner's typed error).
pub(super) fn direct_plannable(opts: &LoadOptions) -> bool {
    aligned_plannable(opts, crate::backends::DIRECT_BLOCK_BYTES)
}

/// Whether reads aligned to `align_bytes` can be planned under `opts`.
fn aligned_plannable(opts: &LoadOptions, align_bytes: u64) -> bool {
    opts.budget_bytes >= align_bytes && opts.chunk_bytes.max(1) >= align_bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_direct_needs_a_budget_and_chunk_of_at_least_one_block() {
        let block = crate::backends::DIRECT_BLOCK_BYTES;
        assert!(direct_plannable(&LoadOptions::default()));
        for (budget_bytes, chunk_bytes, ok) in
            [(block, block, true), (block - 1, block, false), (block, block - 1, false), (1, 0, false)]
        {
            let opts = LoadOptions { budget_bytes, chunk_bytes, ..LoadOptions::default() };
            assert_eq!(direct_plannable(&opts), ok, "budget {budget_bytes} chunk {chunk_bytes}");
            // Whatever `auto` decides must be plannable: the direct config validates exactly
            // when `direct_plannable` says so.
            let config = PlanConfig {
                align_bytes: block,
                chunk_bytes: chunk_bytes.max(1),
                budget_bytes,
                ..PlanConfig::default()
            };
            assert_eq!(config.validate().is_ok(), ok, "budget {budget_bytes} chunk {chunk_bytes}");
        }
    }
}
