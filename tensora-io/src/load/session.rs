//! One load, top to bottom: [`load`] and every step of it on a [`Session`], everything fixed
//! for one load (the selection, the backend and why, direct or buffered, the budget). The walk
//! from `load(&ckpt, &opts)` to an owned tensor reads down this file: `begin` (select, decide:
//! [`super::decide`]), `load_part`, `plan_owned` and `plan_window` (one [`WindowPlan`] per group
//! of files), `load_owned_running` (the arena, the populate-ahead helpers of [`super::ahead`]),
//! `run_window` and `execute` (one backend run, reporting to [`super::run`]'s `Tracker`), the file
//! checks and `report`. A view: `load_part` to `load_mapped`. The other loads (streaming, runs,
//! shares, sharded, cast) call the same steps.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tensora_format::{Checkpoint, FileId};
use tensora_plan::{Extent, Order, Plan, PlanConfig};

use super::ahead::{Memory, helpers, populate_ahead};
use super::decide::Decided;
use super::files::{Descriptors, FileSet, SparseFiles};
use super::loaded::{Entry, Storage};
use super::mapped::{read_in, run_hooks};
use super::run::{Notify, Outlives, SubDest, Tracker};
use super::{ArenaReuse, IoMode, LoadOptions, Loaded, ON_READ_STEP_BYTES, Residence};
use crate::arena::Arena;
use crate::auto::{Delivery, Pieces};
use crate::cast::DtypeTarget;
use crate::error::LoadError;
use crate::map::{MapMode, MappedFiles};
use crate::report::{Faults, LoadReport, Phases, peak_rss_bytes};
use crate::seam::{
    Access, Budget, IoBackend, IoStats, Job, JobConfig, ReadError, ReadErrorKind, Reading, SourceFile,
};

/// Load the selected tensors: into one owned hugepage arena ([`Residence::Owned`], the default),
/// or as zero-copy views of the files ([`Residence::Mapped`]), or whichever `auto` picks
/// ([`Residence::Auto`]). See the module docs.
///
/// With [`LoadOptions::dtype`] other than `Stored`, an owned copy at the target dtype, each read
/// converted as it lands (see [`LoadOptions::dtype`]).
pub fn load(ckpt: &Checkpoint, opts: &LoadOptions) -> Result<Loaded, LoadError> {
    if let Some(shard) = &opts.shard {
        refuse_cast(opts, "a sharded load (LoadOptions::shard)")?;
        return super::sliced::load_sharded(ckpt, opts, shard);
    }
    if opts.dtype != DtypeTarget::Stored {
        return super::cast::load_cast(ckpt, opts);
    }
    let (session, selected, phases, faults_before) = begin(ckpt, opts, Delivery::Owned)?;
    session.load_part(&selected, phases, faults_before)
}

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
    begin_reading(ckpt, opts, delivery, Pieces::WholeTensors)
}

/// [`begin`] for a load that reads `pieces` of the selected tensors (a sharded load's slices:
/// `auto` then keeps the fill that does not read whole 2 MiB folios around them).
pub(super) fn begin_reading<'c>(
    ckpt: &'c Checkpoint,
    opts: &'c LoadOptions,
    delivery: Delivery,
    pieces: Pieces,
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
    let session = Session::new(ckpt, opts, &selected, delivery, pieces)?;
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
    /// Fix everything for one load of `selected`: what the caller named or `auto` chose
    /// ([`Decided`]), checked against the backend, and the in-flight budget.
    pub(super) fn new(
        ckpt: &'c Checkpoint,
        opts: &'c LoadOptions,
        selected: &[usize],
        delivery: Delivery,
        pieces: Pieces,
    ) -> Result<Session<'c>, LoadError> {
        let decided = Decided::for_load(ckpt, opts, selected, delivery, pieces)?;
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
        let through_cache =
            if decided.reading.is_direct() { crate::auto::READ_AHEAD_COLD } else { decided.reading };
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

    /// Load `part` of the selection (tensor indexes) as this session's residence says.
    pub(super) fn load_part(
        &self,
        part: &[usize],
        mut phases: Phases,
        faults_before: Faults,
    ) -> Result<Loaded, LoadError> {
        if self.residence.is_mapped() {
            return self.load_mapped(part, phases, faults_before);
        }
        let t = Instant::now();
        let plan = self.plan_owned(part)?;
        phases.plan += t.elapsed().as_secs_f64();
        self.load_owned(&plan, part, phases, faults_before)
    }

    /// Zero-copy load of `part` (tensor indexes): map every touched file privately, read every
    /// selected page in, and hand out views.
    pub(super) fn load_mapped(
        &self,
        part: &[usize],
        mut phases: Phases,
        faults_before: Faults,
    ) -> Result<Loaded, LoadError> {
        let ckpt = self.ckpt;
        let t = Instant::now();
        let ids = touched_files(ckpt, part);
        let mut files = FileSet::new(ids.len().max(1));
        let sources = files.take(ckpt, &ids, Descriptors::Buffered, self.sparse())?;
        // Copy-on-write, so `Loaded::tensor_mut_ptr` can hand out writable views that never reach
        // the files.
        // Only a mapped session comes here, and only the caller's promise makes one.
        let Residence::Mapped(_promise) = self.residence else {
            return Err(LoadError::Map(std::io::Error::other(
                "internal: a mapped load without the files-unchanged promise",
            )));
        };
        // SAFETY: the caller promised, with `FilesUnchanged::promise`, that the files stay unchanged
        // while the views live (the contract of `MappedFiles::map`).
        let mapped = unsafe { MappedFiles::map_with(&sources, MapMode::CopyOnWrite) }.map_err(LoadError::Map);
        files.give_back(&ids, sources);
        let mapped = mapped?;
        // Mapped index of each checkpoint file, by checkpoint file id.
        let mut local: Vec<u32> = vec![0; ckpt.files().len()];
        for (i, &f) in ids.iter().enumerate() {
            local[f as usize] = i as u32;
        }
        let entries: Vec<Entry> = part
            .iter()
            .map(|&ti| {
                let info = ckpt.tensors()[ti].clone();
                Entry { offset_bytes: info.offset_bytes(), file: local[info.file().index()], info }
            })
            .collect();
        read_in(self, &entries, &mapped)?;
        let storage = Storage::Mapped(mapped);
        let mut loaded = Loaded {
            storage,
            arena_reuse: ArenaReuse::Fresh,
            entries,
            by_name: Default::default(),
            report: LoadReport::default(),
        };
        run_hooks(self, &loaded, part)?;
        phases.io += t.elapsed().as_secs_f64();
        files.bill_open(&mut phases);
        let t = Instant::now();
        files.close_and_check(ckpt)?;
        phases.finish += t.elapsed().as_secs_f64();
        let tally =
            Tally { tensors: loaded.entries.len(), bytes_selected: ckpt.distinct_bytes(part), windows: 1 };
        loaded.report = self.report(phases, &[], tally, faults_before);
        Ok(loaded)
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

    /// Plan `tensors` (part of the selection, in delivery order) as one backend run.
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

    /// The planner's alignment (the backend's; a block for direct reads and collective loads),
    /// chunk and budget.
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
                stats.push(self.run_window(files, wp, &dest, None)?);
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
            let helpers: Vec<_> = helpers(memory, Access::direct_if(self.direct()), arena)
                .into_iter()
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

    /// Open the window's files, run the backend, and report each completed tensor to `notify`, if
    /// given (after the `on_tensor` hook).
    pub(super) fn run_window(
        &self,
        files: &mut FileSet,
        wp: &WindowPlan,
        dest: &SubDest<'_>,
        notify: Option<Notify<'_>>,
    ) -> Result<IoStats, LoadError> {
        if !self.backend.reads_local_files() {
            // The backend reaches the files its own way (an object store): nothing to open here.
            return self.execute(&[], wp, dest, notify);
        }
        let sources = files.take(self.ckpt, &wp.files, self.descriptors(), self.sparse())?;
        let result = self.execute(&sources, wp, dest, notify);
        files.give_back(&wp.files, sources);
        result
    }

    /// Run the backend over `sources` into `dest` for one window, a [`Tracker`] counting each
    /// tensor's reads; a failure names file, offset and tensor ([`Session::read_error`]).
    pub(super) fn execute(
        &self,
        sources: &[SourceFile],
        wp: &WindowPlan,
        dest: &SubDest<'_>,
        notify: Option<Notify<'_>>,
    ) -> Result<IoStats, LoadError> {
        let plan = &wp.plan;
        let mut remaining: Vec<u32> = vec![0; wp.tensors.len()];
        for p in plan.pieces() {
            remaining[p.tag as usize] += 1;
        }
        let tracker = Tracker {
            session: self,
            wp,
            dest,
            remaining: remaining.iter().map(|&n| AtomicU32::new(n)).collect(),
            reported: if self.opts.on_read.is_some() {
                plan.reads().iter().map(|_| AtomicU64::new(0)).collect()
            } else {
                Vec::new()
            },
            notify,
            hook_error: Mutex::new(None),
        };
        // Tensors with no bytes are complete before any read.
        for (tag, &n) in remaining.iter().enumerate() {
            if n == 0 && tracker.complete(tag as u32).is_err() {
                return Err(tracker.stop_error());
            }
        }
        let cancel = self.opts.cancel.as_deref().unwrap_or(&self.no_cancel);
        // SAFETY: `dest` is this window's own part of the arena (windows and file groups get
        // disjoint parts, run one after another); nothing else writes it while the job runs, and
        // the only reads of it during the run are of tensors whose reads all completed
        // (`TensorRef`s handed to hooks and the streaming callback).
        let job = unsafe {
            Job::new(
                plan,
                sources,
                dest,
                &self.budget,
                cancel,
                JobConfig {
                    threads: self.opts.threads.max(1),
                    queue_depth: self.opts.queue_depth.max(1),
                    reading: self.reading,
                    retries_max: self.opts.retries_max,
                },
            )
        }
        .with_file_ids(&wp.files);
        let job = match &dest.kept {
            Some(kept) => job.with_kept_mapping(kept.clone()),
            None => job,
        };
        // Hand pieces to `on_read` while they are still in the landing core's cache.
        let job = if self.opts.on_read.is_some() { job.with_landed_step(ON_READ_STEP_BYTES) } else { job };
        let stats = if plan.reads().is_empty() {
            IoStats::default()
        } else {
            match self.backend.execute(&job, &tracker) {
                Ok(s) => s,
                Err(e) => return Err(self.read_error(&tracker, sources, e)),
            }
        };
        if let Some(tag) = tracker.remaining.iter().position(|n| n.load(Ordering::Acquire) != 0) {
            return Err(LoadError::Incomplete {
                backend: self.backend_name.clone(),
                tensor: self.ckpt.tensors()[wp.tensors[tag]].name().to_owned(),
            });
        }
        Ok(stats)
    }

    /// Turn a backend error into a `LoadError` naming path, offset and tensor.
    pub(super) fn read_error(
        &self,
        tracker: &Tracker<'_>,
        sources: &[SourceFile],
        e: ReadError,
    ) -> LoadError {
        match e.kind {
            ReadErrorKind::Stopped => return tracker.stop_error(),
            ReadErrorKind::Cancelled => return LoadError::Cancelled,
            ReadErrorKind::Unavailable(reason) => {
                return LoadError::BackendUnavailable { backend: self.backend_name.clone(), reason };
            }
            _ if e.file == ReadError::NO_FILE => {
                return LoadError::Backend { backend: self.backend_name.clone(), kind: e.kind };
            }
            _ => {}
        }
        let wp = tracker.wp;
        let path = match (sources.get(e.file as usize), wp.files.get(e.file as usize)) {
            (Some(s), _) => s.path.clone(),
            (None, Some(&f)) => self.ckpt.file(FileId(f)).path().to_owned(),
            (None, None) => PathBuf::new(),
        };
        let covering = wp.plan.reads().iter().find(|r| {
            r.file == e.file
                && r.offset_bytes <= e.offset_bytes
                && e.offset_bytes < r.offset_bytes + r.len_bytes.max(1)
        });
        let tensor = covering
            .and_then(|r| {
                let pieces = wp.plan.read_pieces(r);
                pieces
                    .iter()
                    .find(|p| {
                        let start = r.offset_bytes + p.read_offset_bytes;
                        (start..start + p.len_bytes).contains(&e.offset_bytes)
                    })
                    .or(pieces.first())
                    .map(|p| self.ckpt.tensors()[wp.tensors[p.tag as usize]].name().to_owned())
            })
            .unwrap_or_default();
        LoadError::Read { path, offset_bytes: e.offset_bytes, len_bytes: e.len_bytes, tensor, kind: e.kind }
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
            bytes_advised_beyond_reads: stats.iter().map(|s| s.bytes_advised_beyond_reads).sum(),
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

/// The plans of one owned load: one per group of at most `files_open_max` files, each in its own
/// part of one arena (`(base, plan)`), and the arena's length.
pub(super) struct OwnedPlan {
    pub(super) plans: Vec<(u64, WindowPlan)>,
    pub(super) arena_len_bytes: u64,
}

/// What a report counts: tensors delivered, their distinct bytes, backend runs.
#[derive(Debug, Clone, Copy)]
pub(super) struct Tally {
    pub(super) tensors: usize,
    pub(super) bytes_selected: u64,
    pub(super) windows: usize,
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
