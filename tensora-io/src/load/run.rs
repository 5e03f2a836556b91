//! Running one window: the backend job, the [`Tracker`] that counts each tensor's outstanding
//! reads and fires the hooks on the worker that completes them, and the sub-destination a window
//! writes into.

use std::path::PathBuf;
use std::ptr::NonNull;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use tensora_format::FileId;

use super::files::FileSet;
use super::session::{Session, WindowPlan};
use super::{ON_READ_STEP_BYTES, PieceRef, ReadHook, TensorRef};
use crate::arena::Arena;
use crate::error::LoadError;
use crate::seam::{
    CompletionSink, Destination, IoStats, Job, JobConfig, ReadError, ReadErrorKind, SourceFile, StopReason,
};

impl Session<'_> {
    /// Open the window's files, run the backend, and report each completed tensor to `notify`
    /// (after the `on_tensor` hook).
    pub(super) fn run_window(
        &self,
        files: &mut FileSet,
        wp: &WindowPlan,
        dest: &SubDest<'_>,
        notify: &(dyn Fn(u32) -> Result<(), StopReason> + Sync),
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

    pub(super) fn execute(
        &self,
        sources: &[SourceFile],
        wp: &WindowPlan,
        dest: &SubDest<'_>,
        notify: &(dyn Fn(u32) -> Result<(), StopReason> + Sync),
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
}

/// Counts outstanding reads per tensor and fires hooks on the completing worker.
pub(super) struct Tracker<'a> {
    pub(super) session: &'a Session<'a>,
    pub(super) wp: &'a WindowPlan,
    pub(super) dest: &'a SubDest<'a>,
    pub(super) remaining: Vec<AtomicU32>,
    /// Per read: bytes from its start already handed to `on_read` (landed prefixes). Written only
    /// by the one worker filling that read.
    pub(super) reported: Vec<AtomicU64>,
    pub(super) notify: &'a (dyn Fn(u32) -> Result<(), StopReason> + Sync),
    pub(super) hook_error: Mutex<Option<LoadError>>,
}

impl Tracker<'_> {
    pub(super) fn complete(&self, tag: u32) -> Result<(), StopReason> {
        if let Some(hook) = &self.session.opts.on_tensor {
            let info = &self.session.ckpt.tensors()[self.wp.tensors[tag as usize]];
            let bytes = self.dest.rebase(self.wp, tag).unwrap_or(&[]);
            if let Err(source) = hook(&TensorRef { info, bytes }) {
                let mut slot = self.hook_error.lock().unwrap_or_else(|p| p.into_inner());
                if slot.is_none() {
                    *slot = Some(LoadError::Callback { tensor: info.name().to_owned(), source });
                }
                return Err(StopReason);
            }
        }
        (self.notify)(tag)
    }

    /// Runs the per-read hook on one landed piece.
    pub(super) fn piece(
        &self,
        hook: &ReadHook,
        r: &tensora_plan::Read,
        p: &tensora_plan::Piece,
        window: std::ops::Range<u64>,
    ) -> Result<(), StopReason> {
        // The part of the piece inside `window` (read-relative bytes).
        let start = p.read_offset_bytes.max(window.start);
        let end = (p.read_offset_bytes + p.len_bytes).min(window.end);
        if start >= end {
            return Ok(());
        }
        let Some(&ti) = self.wp.tensors.get(p.tag as usize) else {
            return self.internal(format!("read piece names tag {} outside the window", p.tag));
        };
        let info = &self.session.ckpt.tensors()[ti];
        let Some(bytes) = self.dest.landed(r.arena_offset_bytes + start, end - start) else {
            return self.internal(format!(
                "tensor {:?}: piece {}..{} of a read at arena offset {} lies outside the destination",
                info.name(),
                start,
                end,
                r.arena_offset_bytes
            ));
        };
        let offset_in_tensor_bytes = p.extent_offset_bytes + (start - p.read_offset_bytes);
        if let Err(source) = hook(&PieceRef { info, tensor_index: ti, offset_in_tensor_bytes, bytes }) {
            let mut slot = self.hook_error.lock().unwrap_or_else(|p| p.into_inner());
            if slot.is_none() {
                *slot = Some(LoadError::Callback { tensor: info.name().to_owned(), source });
            }
            return Err(StopReason);
        }
        Ok(())
    }

    /// Stops the run with an internal error (a plan that does not match its destination): named,
    /// never reported as a cancellation.
    pub(super) fn internal(&self, what: String) -> Result<(), StopReason> {
        let mut slot = self.hook_error.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            *slot = Some(LoadError::Backend {
                backend: self.session.backend_name.clone(),
                kind: ReadErrorKind::Io(std::io::Error::other(what)),
            });
        }
        Err(StopReason)
    }

    /// The error to report after the sink stopped the run.
    pub(super) fn stop_error(&self) -> LoadError {
        self.hook_error.lock().unwrap_or_else(|p| p.into_inner()).take().unwrap_or(LoadError::Cancelled)
    }
}

impl CompletionSink for Tracker<'_> {
    fn read_done(&self, landed: crate::seam::Landed<'_>) -> Result<(), StopReason> {
        let read = landed.read();
        let plan = &self.wp.plan;
        let Some(r) = plan.reads().get(read as usize) else { return Err(StopReason) };
        let mut piece_bytes = 0;
        // What landed prefixes already handed to `on_read` is not handed again.
        let from = self.reported.get(read as usize).map_or(0, |d| d.load(Ordering::Relaxed));
        for p in plan.read_pieces(r) {
            piece_bytes += p.len_bytes;
            if let Some(hook) = &self.session.opts.on_read {
                self.piece(hook, r, p, from..r.len_bytes)?;
            }
            let Some(counter) = self.remaining.get(p.tag as usize) else { return Err(StopReason) };
            let before = counter.fetch_sub(1, Ordering::AcqRel);
            if before == 1 {
                self.complete(p.tag)?;
            }
        }
        if let Some(progress) = &self.session.opts.progress {
            let done = self.session.progress_done.fetch_add(piece_bytes, Ordering::Relaxed) + piece_bytes;
            progress(done.min(self.session.bytes_selected), self.session.bytes_selected);
        }
        Ok(())
    }

    fn prefix_landed(&self, prefix: crate::seam::LandedPrefix<'_>) -> Result<(), StopReason> {
        let (Some(hook), Some(done)) =
            (&self.session.opts.on_read, self.reported.get(prefix.read() as usize))
        else {
            return Ok(());
        };
        let plan = &self.wp.plan;
        let Some(r) = plan.reads().get(prefix.read() as usize) else { return Err(StopReason) };
        let from = done.load(Ordering::Relaxed);
        let to = prefix.len_bytes().min(r.len_bytes);
        if to <= from {
            return Ok(());
        }
        for p in plan.read_pieces(r) {
            self.piece(hook, r, p, from..to)?;
        }
        done.store(to, Ordering::Relaxed);
        Ok(())
    }
}

/// A range of an arena as a destination (one plan's part of the arena).
pub(super) struct SubDest<'a> {
    pub(super) parent: &'a Arena,
    pub(super) base_bytes: u64,
    pub(super) len_bytes: u64,
    /// The arena's keep-alive when it outlives the run as the loaded model (an owned load),
    /// handed to the job ([`crate::Job::with_kept_mapping`]); `None` for a streaming window.
    pub(super) kept: Option<crate::KeepMapped>,
}

/// Whether a sub-destination's arena outlives its run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Outlives {
    /// Reused once the run's tensors are consumed (a streaming window).
    RunOnly,
    /// Becomes the loaded model (an owned load): backends may keep its pieces past the load.
    Load,
}

impl<'a> SubDest<'a> {
    pub(super) fn new(parent: &'a Arena, base_bytes: u64, len_bytes: u64, outlives: Outlives) -> SubDest<'a> {
        // Callers pass ranges inside the arena (the arena was sized from these plans).
        let base_bytes = base_bytes.min(parent.len_bytes());
        let len_bytes = len_bytes.min(parent.len_bytes() - base_bytes);
        let kept = (outlives == Outlives::Load).then(|| parent.keep_mapped());
        SubDest { parent, base_bytes, len_bytes, kept }
    }

    /// `len_bytes` at `offset_bytes` of this sub-destination, for a read that has landed.
    pub(super) fn landed(&self, offset_bytes: u64, len_bytes: u64) -> Option<&'a [u8]> {
        if offset_bytes.checked_add(len_bytes)? > self.len_bytes {
            return None;
        }
        if len_bytes == 0 {
            return Some(&[]);
        }
        // SAFETY: inside this sub-destination (checked above); called from `read_done` for a read
        // that has landed, or from `prefix_landed` for a landed prefix of one (the backend borrows
        // only the bytes of its next call mutably, never the prefix), and plan reads never
        // overlap, so no backend writes this range again while the slice is used (the arena is
        // reused only after the run ends).
        Some(unsafe { self.parent.slice_unchecked(self.base_bytes + offset_bytes, len_bytes) })
    }

    /// The bytes of tensor `tag` of `wp`, which runs in this sub-destination.
    pub(super) fn rebase(&self, wp: &WindowPlan, tag: u32) -> Option<&'a [u8]> {
        let l = wp.plan.location(tag)?;
        if l.len_bytes == 0 {
            return Some(&[]);
        }
        // SAFETY: called once every read carrying the tensor has completed; plan reads never
        // overlap, so no backend writes this range while the slice is used (the arena is reused only
        // after the run and its callbacks end).
        Some(unsafe { self.parent.slice_unchecked(self.base_bytes + l.arena_offset_bytes, l.len_bytes) })
    }
}

// SAFETY: a sub-range of an arena, which satisfies the contract; `host_ptr` points inside it and
// `len_bytes` never passes the arena's end (clamped in `new`).
unsafe impl Destination for SubDest<'_> {
    fn len_bytes(&self) -> u64 {
        self.len_bytes
    }
    fn host_ptr(&self) -> NonNull<u8> {
        // SAFETY: `base_bytes <= parent.len_bytes()`, so the pointer stays inside (or one past) the
        // mapping.
        unsafe { self.parent.host_ptr().add(self.base_bytes as usize) }
    }
    fn align_bytes(&self) -> u64 {
        let base_align =
            if self.base_bytes == 0 { Arena::ALIGN_BYTES } else { 1 << self.base_bytes.trailing_zeros() };
        base_align.min(Arena::ALIGN_BYTES)
    }
    fn on_landed(&self, offset_bytes: u64, len_bytes: u64) -> std::io::Result<()> {
        self.parent.on_landed(self.base_bytes + offset_bytes, len_bytes)
    }
}
