//! The cast load ([`LoadOptions::dtype`]): one arena allocated at the target dtype, the stored
//! bytes landing in a bounded staging window (a [`load_streaming`] run of at most
//! [`CAST_STAGING_DEFAULT_BYTES`] per window), each landed piece converted into the arena by the
//! worker that landed it, while it is hot in that core's cache ([`LoadOptions::on_read`]).
//!
//! A piece may start or end inside an element (a tensor at an odd file offset, split by the
//! plan's chunks or a backend's steps): the bytes of such an element are gathered in the tensor's
//! edge list and converted once all of them have landed. Every element is converted exactly once;
//! the load checks the count before it builds the [`Loaded`].

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tensora_format::{Checkpoint, Dtype, Selection};

use super::ahead::Memory;
use super::loaded::Entry;
use super::session::select;
use super::{
    ArenaReuse, BackendChoice, FilesUnchanged, LoadOptions, Loaded, PieceRef, Residence, load_streaming,
};
use crate::arena::{Arena, Pages};
use crate::auto::{self, Delivery};
use crate::cast::{self, CastError, DtypeTarget, Simd};
use crate::error::{BoxError, LoadError};
use crate::report::{CastReport, CastTensor, LoadReport};
use crate::seam::{Access, Destination};

/// The bound on a cast load's staging window (and in-flight bytes), below
/// [`LoadOptions::budget_bytes`] when that is larger. A tensor larger than it gets a window of
/// its own size.
pub const CAST_STAGING_DEFAULT_BYTES: u64 = 256 << 20;
/// Where each tensor starts in a cast load's arena: a multiple of this (every element type's
/// alignment, and a cache line, so two workers never write one line).
pub const CAST_ALIGN_BYTES: u64 = 64;

/// A cast load of the selection (see the [module docs](self)).
pub(super) fn load_cast(ckpt: &Checkpoint, opts: &LoadOptions) -> Result<Loaded, LoadError> {
    let t = Instant::now();
    let selected = select(ckpt, opts)?;
    load_cast_part(ckpt, opts, &selected, opts.selection.clone(), t)
}

/// A cast load of `selected` (tensor indexes, in delivery order), which `selection` names for
/// the staging load; `started` is when its planning began.
pub(super) fn load_cast_part(
    ckpt: &Checkpoint,
    opts: &LoadOptions,
    selected: &[usize],
    selection: Selection,
    started: Instant,
) -> Result<Loaded, LoadError> {
    let layout = Layout::of(ckpt, selected, opts.dtype)?;
    let plan_seconds = started.elapsed().as_secs_f64();

    let t = Instant::now();
    let len_bytes = layout.len_bytes;
    let (arena, memory) = opts
        .arena_reuse
        .arena(len_bytes, Access::Buffered)
        .map_err(|source| LoadError::Arena { len_bytes, source })?;
    let landing = Arc::new(Landing {
        base_addr: arena.host_ptr().as_ptr() as usize,
        len_bytes: arena.len_bytes(),
        slots: layout.slots,
        cast_nanos: AtomicU64::new(0),
    });
    let alloc_seconds = t.elapsed().as_secs_f64();

    let views = views_of(ckpt, opts, selected);
    let staging_bytes = match views {
        Some(_) => 0,
        None => opts.budget_bytes.min(CAST_STAGING_DEFAULT_BYTES),
    };
    let io_done = AtomicBool::new(false);
    let result = std::thread::scope(|scope| {
        let ahead = (memory == Memory::Fresh).then(|| scope.spawn(|| fault_in_ahead(&arena, &io_done)));
        let result = match views {
            Some((promise, _)) => from_views(ckpt, opts, promise, selection, &landing),
            None => through_staging(ckpt, opts, staging_bytes, selection, &landing),
        };
        io_done.store(true, Ordering::Release);
        if let Some(Err(panic)) = ahead.map(|h| h.join()) {
            std::panic::resume_unwind(panic);
        }
        result
    });
    let mut report = result?;
    landing.check_complete(ckpt)?;

    let t = Instant::now();
    let mut entries = Vec::with_capacity(selected.len());
    let mut cast = CastReport {
        to: opts.dtype.dtype().map_or("", Dtype::as_str).to_owned(),
        simd: Simd::detected().as_str().to_owned(),
        staging_bytes,
        ..CastReport::default()
    };
    for &i in selected {
        let stored = &ckpt.tensors()[i];
        let Some(slot) = landing.slots.get(i).and_then(Option::as_ref) else { continue };
        let info = if slot.from == slot.to {
            cast.kept += 1;
            stored.clone()
        } else {
            cast.tensors
                .push(CastTensor { name: stored.name().to_owned(), from: slot.from.as_str().to_owned() });
            cast.bytes_in += stored.len_bytes();
            cast.bytes_out += slot.len_bytes;
            // Checked by `Layout::of`.
            stored.cast_to(slot.to).unwrap_or_else(|| stored.clone())
        };
        entries.push(Entry { info, file: 0, offset_bytes: slot.offset_bytes });
    }
    cast.seconds = landing.cast_nanos.load(Ordering::Relaxed) as f64 / 1e9;
    report.phases.plan += plan_seconds;
    report.phases.io += alloc_seconds;
    report.phases.finish += t.elapsed().as_secs_f64();
    report.residence = Residence::Owned.as_str().to_owned();
    let source = match views {
        Some((_, why)) => format!("converted straight from views of the files ({why})"),
        None => {
            format!("each read converted as it landed in a staging window of at most {staging_bytes} bytes")
        }
    };
    report.reason =
        format!("{}; cast to {}: an owned copy at the target dtype, {source}", report.reason, cast.to);
    report.tensors = entries.len();
    report.cast = Some(cast);
    report.finalize();
    Ok(Loaded::in_arena(arena, opts.arena_reuse, entries, report))
}

/// Whether a cast load converts straight from views of the files, and why: under
/// [`Residence::Mapped`] (the caller's promise), and under [`Residence::Auto`] with the `auto`
/// backend when the selected pages are warm (converting from the page cache skips the staging
/// copy: F32 to BF16 of a warm 2.2 GB checkpoint read 4.4 GB through it). Cold data goes through
/// the staging window, read the way `auto` reads an owned load.
fn views_of(
    ckpt: &Checkpoint,
    opts: &LoadOptions,
    selected: &[usize],
) -> Option<(FilesUnchanged, &'static str)> {
    match opts.residence {
        Residence::Mapped(promise) => Some((promise, "residence mapped")),
        Residence::Auto(promise) if matches!(opts.backend, BackendChoice::Auto) => {
            let asked = auto::Asked {
                delivery: Delivery::Owned,
                residence: opts.residence,
                io_mode: opts.io_mode,
                budget_bytes: opts.budget_bytes,
                pieces: auto::Pieces::WholeTensors,
            };
            auto::cast_from_views(&auto::gather(ckpt, selected, asked)).map(|why| (promise, why))
        }
        Residence::Auto(_) | Residence::Owned => None,
    }
}

/// The stored bytes through a staging window of `staging_bytes`: a [`load_streaming`] run whose
/// `on_read` hook converts each landed piece into the arena.
fn through_staging(
    ckpt: &Checkpoint,
    opts: &LoadOptions,
    staging_bytes: u64,
    selection: Selection,
    landing: &Arc<Landing>,
) -> Result<LoadReport, LoadError> {
    let user_on_read = opts.on_read.clone();
    let hook_landing = Arc::clone(landing);
    let staged = LoadOptions {
        residence: Residence::Owned,
        arena_reuse: ArenaReuse::Fresh,
        budget_bytes: staging_bytes,
        selection,
        dtype: DtypeTarget::Stored,
        on_read: Some(Arc::new(move |p: &PieceRef<'_>| {
            hook_landing.piece(p)?;
            user_on_read.as_ref().map_or(Ok(()), |user| user(p))
        })),
        ..opts.clone()
    };
    load_streaming(ckpt, &staged, |_| Ok(()))
}

/// Source bytes converted per work item of [`from_views`].
const VIEW_CHUNK_BYTES: usize = 4 << 20;

/// Under the caller's files-unchanged promise ([`Residence::Mapped`]): map the files (every page
/// read in, as a mapped load does), then convert straight from the page cache into the arena on
/// [`LoadOptions::threads`] workers, in chunks of [`VIEW_CHUNK_BYTES`]: no staging copy. The
/// mapping is gone when this returns.
fn from_views(
    ckpt: &Checkpoint,
    opts: &LoadOptions,
    promise: FilesUnchanged,
    selection: Selection,
    landing: &Landing,
) -> Result<LoadReport, LoadError> {
    let views_opts = LoadOptions {
        residence: Residence::Mapped(promise),
        arena_reuse: ArenaReuse::Fresh,
        selection,
        dtype: DtypeTarget::Stored,
        ..opts.clone()
    };
    let views = super::load(ckpt, &views_opts)?;
    let t = Instant::now();
    // (tensor in `views`, checkpoint index, start, length): bounded by the bytes / the chunk.
    let mut items: Vec<(usize, usize, usize, usize)> = Vec::new();
    for (k, tensor) in views.tensors().enumerate() {
        let Some(i) = ckpt.tensor_index(tensor.name()) else { continue };
        let se = tensor.dtype().size_bytes().unwrap_or(1) as usize;
        let step = (VIEW_CHUNK_BYTES / se).max(1) * se;
        let len = tensor.bytes().len();
        items.extend((0..len).step_by(step).map(|at| (k, i, at, step.min(len - at))));
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let failed: Mutex<Option<LoadError>> = Mutex::new(None);
    std::thread::scope(|scope| {
        for _ in 0..opts.threads.max(1) {
            scope.spawn(|| {
                loop {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&(k, i, at, len)) = items.get(n) else { return };
                    let tensor = views.get(k);
                    let converted = match landing.slots.get(i).and_then(Option::as_ref) {
                        Some(slot) => elem_sizes(slot).and_then(|(se, de)| {
                            landing.convert(slot, at as u64 / se * de, &tensor.bytes()[at..at + len])
                        }),
                        None => Err("a view of a tensor that is not selected".into()),
                    };
                    if let Err(source) = converted {
                        let mut slot = failed.lock().unwrap_or_else(|p| p.into_inner());
                        slot.get_or_insert(LoadError::Callback { tensor: tensor.name().to_owned(), source });
                        next.store(items.len(), Ordering::Relaxed);
                        return;
                    }
                }
            });
        }
    });
    if let Some(e) = failed.into_inner().unwrap_or_else(|p| p.into_inner()) {
        return Err(e);
    }
    let mut report = views.report().clone();
    report.phases.io += t.elapsed().as_secs_f64();
    Ok(report)
}

/// The step of [`fault_in_ahead`]: each is timed, so the arena gives up huge pages that fault in
/// slowly ([`Arena::populate_write_adaptive`]).
const FAULT_AHEAD_STEP_BYTES: u64 = 8 << 20;

/// Fault the cast arena's fresh huge pages in, in order, ahead of the conversions that write
/// them, until `done` (as an owned load's buffered helper, `ahead::Ahead::WhileHuge`): when huge
/// pages fault in slowly (this VM hands free memory back to its host) the arena switches to base
/// pages and this stops, leaving the converting workers to fault base pages in as they write.
/// Without it the workers faulted every huge page in themselves: 2.2 GB BF16 to F32 took 46 s
/// here, 44 of them in the conversions. Bounded by one pass over the arena; an error (no
/// `MADV_POPULATE_WRITE` before Linux 5.14) ends it quietly.
fn fault_in_ahead(arena: &Arena, done: &AtomicBool) {
    let mut at = 0;
    while at < arena.len_bytes() && !done.load(Ordering::Acquire) {
        match arena.populate_write_adaptive(at, FAULT_AHEAD_STEP_BYTES) {
            Ok(Pages::Huge) => at += FAULT_AHEAD_STEP_BYTES,
            Ok(Pages::Base) | Err(_) => return,
        }
    }
}

/// Where each selected tensor goes in the cast arena, and the arena's length.
struct Layout {
    /// By checkpoint tensor index; `None` for a tensor not selected.
    slots: Vec<Option<Slot>>,
    len_bytes: u64,
}

impl Layout {
    /// Refuses, before any read, a floating-point tensor with no cast to the target.
    fn of(ckpt: &Checkpoint, selected: &[usize], target: DtypeTarget) -> Result<Layout, LoadError> {
        let mut slots: Vec<Option<Slot>> = (0..ckpt.tensors().len()).map(|_| None).collect();
        let mut cursor: u64 = 0;
        for &i in selected {
            let info = &ckpt.tensors()[i];
            let named = |source| LoadError::Cast { tensor: info.name().to_owned(), source };
            let from = info.dtype();
            let to = target.cast_of(from).map_err(named)?.unwrap_or(from);
            let len_bytes = info.cast_to(to).map(|c| c.len_bytes()).ok_or_else(|| {
                named(CastError::Length {
                    from,
                    to,
                    src_len_bytes: usize::try_from(info.len_bytes()).unwrap_or(usize::MAX),
                    dst_len_bytes: 0,
                })
            })?;
            let overflow = || LoadError::Plan(tensora_plan::PlanError::ArenaOverflow);
            let offset_bytes = cursor.checked_next_multiple_of(CAST_ALIGN_BYTES).ok_or_else(overflow)?;
            cursor = offset_bytes.checked_add(len_bytes).ok_or_else(overflow)?;
            slots[i] = Some(Slot {
                from,
                to,
                offset_bytes,
                len_bytes,
                converted_bytes: AtomicU64::new(0),
                edges: Mutex::default(),
            });
        }
        Ok(Layout { slots, len_bytes: cursor })
    }
}

/// One tensor's place in the cast arena.
struct Slot {
    from: Dtype,
    to: Dtype,
    offset_bytes: u64,
    /// Bytes at the target dtype.
    len_bytes: u64,
    /// Target bytes written so far (checked against `len_bytes` after the load).
    converted_bytes: AtomicU64,
    /// Elements split between pieces, gathered until whole. At most two per piece of the tensor
    /// (one at each end), so bounded by the plan's reads and the backend's steps.
    edges: Mutex<Vec<Edge>>,
}

/// The bytes of one element that straddles pieces, as they land.
struct Edge {
    elem: u64,
    bytes: [u8; 8],
    /// Bit `k` set: `bytes[k]` has landed.
    landed: u8,
}

/// What the hook needs: the arena's address and the slots.
struct Landing {
    base_addr: usize,
    len_bytes: u64,
    slots: Vec<Option<Slot>>,
    cast_nanos: AtomicU64,
}

impl Landing {
    /// Convert the whole elements of a landed piece into the arena, and gather its partial ones.
    fn piece(&self, p: &PieceRef<'_>) -> Result<(), BoxError> {
        let Some(slot) = self.slots.get(p.tensor_index).and_then(Option::as_ref) else {
            return Err(format!("a piece of tensor {:?}, which is not selected", p.info.name()).into());
        };
        let (se, de) = elem_sizes(slot)?;
        let off = p.offset_in_tensor_bytes;
        let end = off + p.bytes.len() as u64;
        let (first, last) = (off.div_ceil(se), end / se);
        if first > last {
            // Inside one element.
            return self.edge(slot, off / se, off % se, p.bytes);
        }
        if first < last {
            let src = &p.bytes[(first * se - off) as usize..(last * se - off) as usize];
            self.convert(slot, first * de, src)?;
        }
        if !off.is_multiple_of(se) {
            self.edge(slot, off / se, off % se, &p.bytes[..(first * se - off) as usize])?;
        }
        if !end.is_multiple_of(se) {
            self.edge(slot, last, 0, &p.bytes[(last * se - off) as usize..])?;
        }
        Ok(())
    }

    /// Convert `src` (whole stored elements) into the slot's bytes from `at_bytes` on.
    fn convert(&self, slot: &Slot, at_bytes: u64, src: &[u8]) -> Result<(), BoxError> {
        let (se, de) = elem_sizes(slot)?;
        let len_bytes = src.len() as u64 / se * de;
        if at_bytes + len_bytes > slot.len_bytes {
            return Err(format!(
                "cast output {at_bytes}+{len_bytes} outside a tensor of {} bytes",
                slot.len_bytes
            )
            .into());
        }
        let start = slot.offset_bytes + at_bytes;
        if start + len_bytes > self.len_bytes {
            return Err("cast output outside the arena".into());
        }
        // SAFETY: the range lies inside the arena (checked above), which outlives the load that
        // runs this hook (`load_cast` drops the hook before the arena). Slots are disjoint, the
        // pieces of one tensor never overlap, and a straddling element is converted once, under
        // its slot's lock: no two writers and no reader share these bytes during the load.
        let dst = unsafe {
            std::slice::from_raw_parts_mut((self.base_addr + start as usize) as *mut u8, len_bytes as usize)
        };
        let t = Instant::now();
        cast::convert(slot.from, slot.to, src, dst)?;
        self.cast_nanos.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        slot.converted_bytes.fetch_add(len_bytes, Ordering::Relaxed);
        Ok(())
    }

    /// Gather `bytes` of element `elem` from byte `at` of it; convert it once all have landed.
    fn edge(&self, slot: &Slot, elem: u64, at: u64, bytes: &[u8]) -> Result<(), BoxError> {
        let (se, de) = elem_sizes(slot)?;
        let mut edges = slot.edges.lock().unwrap_or_else(|p| p.into_inner());
        let k = match edges.iter().position(|e| e.elem == elem) {
            Some(k) => k,
            None => {
                edges.push(Edge { elem, bytes: [0; 8], landed: 0 });
                edges.len() - 1
            }
        };
        let e = &mut edges[k];
        for (j, &b) in bytes.iter().enumerate() {
            let at = at as usize + j;
            e.bytes[at] = b;
            e.landed |= 1 << at;
        }
        if u64::from(e.landed.count_ones()) == se {
            let whole = edges.swap_remove(k);
            self.convert(slot, elem * de, &whole.bytes[..se as usize])?;
        }
        Ok(())
    }

    /// Every selected tensor's bytes were all converted (a plan that skipped one would leave
    /// zeros; this makes it an error instead).
    fn check_complete(&self, ckpt: &Checkpoint) -> Result<(), LoadError> {
        for (i, slot) in self.slots.iter().enumerate() {
            let Some(slot) = slot else { continue };
            let done = slot.converted_bytes.load(Ordering::Relaxed);
            if done != slot.len_bytes {
                return Err(LoadError::Incomplete {
                    backend: format!("cast ({done} of {} bytes converted)", slot.len_bytes),
                    tensor: ckpt.tensors()[i].name().to_owned(),
                });
            }
        }
        Ok(())
    }
}

/// Bytes per element of the slot's two dtypes (whole bytes, at most 8: checked by `Layout::of`
/// through `cast_of` and `cast_to`).
fn elem_sizes(slot: &Slot) -> Result<(u64, u64), BoxError> {
    match (slot.from.size_bytes(), slot.to.size_bytes()) {
        (Some(se), Some(de)) if se <= 8 => Ok((se, de)),
        _ => Err(format!("no element-wise copy of {} to {}", slot.from, slot.to).into()),
    }
}
