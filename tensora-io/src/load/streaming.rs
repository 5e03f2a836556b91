//! The streaming load: each tensor handed to a callback as soon as it lands, one arena of at most
//! the budget reused window after window. The first window (or one that outgrew the arena) lands
//! in fresh memory, faulted in ahead of its reads as an owned load's arena is; after the VM had
//! handed its free memory back (12 s idle), that took a cold 2.2 GB `tensora load --stream` (1 GiB
//! windows) from 1.04-1.34 GB/s to 1.68-1.99, six alternating runs each.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use tensora_format::Checkpoint;

use super::ahead::Memory;
use super::files::FileSet;
use super::run::{Outlives, SubDest};
use super::session::{Tally, begin, refuse_cast};
use super::{LoadOptions, TensorRef};
use crate::arena::Arena;
use crate::auto::Delivery;
use crate::error::{BoxError, LoadError};
use crate::report::LoadReport;
use crate::seam::{Access, StopReason};

/// Load the selected tensors, handing each to `f` (on the calling thread) as soon as all its bytes
/// have landed, and recycling arena space.
///
/// Memory: tensors are planned in windows, in priority order, each holding at most
/// `budget_bytes` of arena (a window's plan is split until it fits). One arena is reused for
/// every window, so the peak is `max(budget_bytes, largest single tensor + 8 KiB)` of arena: a
/// tensor larger than the budget gets a window (and, only then, an arena) of its own. Reads stay
/// within the same in-flight budget.
///
/// An error from `f` (or from `on_tensor`) stops the load: the backend stops issuing reads,
/// drains what is in flight, and the error is returned as [`LoadError::Callback`].
///
/// ```
/// let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/serverlessllm/tiny");
/// let ckpt = tensora_format::sllm::open_dir(std::path::Path::new(dir))?;
/// let opts = tensora_io::LoadOptions { budget_bytes: 16 << 10, ..Default::default() };
/// let mut seen = 0;
/// let report = tensora_io::load_streaming(&ckpt, &opts, |t| {
///     assert_eq!(t.bytes().len() as u64, t.info().len_bytes());
///     seen += 1;
///     Ok(())
/// })?;
/// assert_eq!(seen, ckpt.tensors().len());
/// assert!(report.windows > 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn load_streaming(
    ckpt: &Checkpoint,
    opts: &LoadOptions,
    mut f: impl FnMut(&TensorRef<'_>) -> Result<(), BoxError>,
) -> Result<LoadReport, LoadError> {
    refuse_cast(opts, "load_streaming")?;
    let (session, selected, mut phases, faults_before) = begin(ckpt, opts, Delivery::Streaming)?;

    if session.residence.is_mapped() {
        let mut loaded = session.load_mapped(&selected, phases, faults_before)?;
        for t in loaded.tensors() {
            f(&t).map_err(|source| LoadError::Callback { tensor: t.name().to_owned(), source })?;
        }
        return Ok(std::mem::take(&mut loaded.report));
    }

    crate::arena::drop_recycled_larger_than(opts.budget_bytes);
    let mut pending: VecDeque<Vec<usize>> = stream_windows(ckpt, &selected, opts).into();
    let mut arena: Option<Arena> = None;
    let mut files = FileSet::new(opts.files_open_max);
    let mut stats = Vec::new();
    let mut delivered = 0usize;
    while let Some(window) = pending.pop_front() {
        let t = Instant::now();
        let wp = session.plan_window(&window)?;
        if wp.plan.arena_len_bytes() > opts.budget_bytes && window.len() > 1 {
            // Alignment padding or gaps pushed it over: split and retry both halves in order.
            let (a, b) = window.split_at(window.len() / 2);
            pending.push_front(b.to_vec());
            pending.push_front(a.to_vec());
            phases.plan += t.elapsed().as_secs_f64();
            continue;
        }
        phases.plan += t.elapsed().as_secs_f64();

        let t = Instant::now();
        let need = wp.plan.arena_len_bytes();
        // A window lands in fresh memory only in an arena mapped for it (the first window, or
        // one that outgrew the arena); later windows reuse pages the ones before faulted in.
        let mut memory = Memory::FaultedIn;
        if arena.as_ref().is_none_or(|a| a.len_bytes() < need) {
            // Free the old arena before mapping a bigger one, so the peak stays at one arena.
            drop(arena.take());
            let len_bytes = need.max(opts.budget_bytes.min(session.bytes_selected.max(need)));
            let (new, new_memory) = opts
                .arena_reuse
                .arena(len_bytes, Access::direct_if(session.direct()))
                .map_err(|source| LoadError::Arena { len_bytes, source })?;
            arena = Some(new);
            memory = new_memory;
        }
        let Some(arena_ref) = arena.as_ref() else { continue };
        let planned = (0, wp);
        let wp = &planned.1;
        let dest = SubDest::new(arena_ref, 0, need, Outlives::RunOnly);
        let stopped = AtomicBool::new(false);
        let callback_error: Mutex<Option<LoadError>> = Mutex::new(None);
        let (tx, rx) = std::sync::mpsc::sync_channel::<u32>(wp.tensors.len().max(1));
        let result = std::thread::scope(|s| {
            let handle = s.spawn(|| {
                let tx = tx;
                let notify = |tag: u32| {
                    if stopped.load(Ordering::Acquire) {
                        return Err(StopReason);
                    }
                    tx.send(tag).map_err(|_| StopReason)
                };
                session.populating_ahead(arena_ref, std::slice::from_ref(&planned), memory, || {
                    session.run_window(&mut files, wp, &dest, Some(&notify))
                })
            });
            for tag in rx {
                if stopped.load(Ordering::Acquire) {
                    continue;
                }
                let ti = wp.tensors[tag as usize];
                let info = &ckpt.tensors()[ti];
                let bytes = wp.tensor_bytes(arena_ref, tag);
                if let Err(source) = f(&TensorRef { info, bytes }) {
                    stopped.store(true, Ordering::Release);
                    let e = LoadError::Callback { tensor: info.name().to_owned(), source };
                    *callback_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                } else {
                    delivered += 1;
                }
            }
            handle.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        });
        phases.io += t.elapsed().as_secs_f64();
        files.bill_open(&mut phases);
        if let Some(e) = callback_error.into_inner().unwrap_or_else(|p| p.into_inner()) {
            return Err(e);
        }
        stats.push(result?);
    }
    let t = Instant::now();
    if let Some(a) = arena {
        opts.arena_reuse.release(a);
    }
    files.close_and_check(ckpt)?;
    phases.finish += t.elapsed().as_secs_f64();
    let tally = Tally { tensors: delivered, bytes_selected: session.bytes_selected, windows: stats.len() };
    Ok(session.report(phases, &stats, tally, faults_before))
}

/// Streaming windows: consecutive tensors (in selection order) whose bytes plus per-tensor slack fit
/// the budget and that touch at most `files_open_max` files; an oversized tensor stands alone.
pub(super) fn stream_windows(ckpt: &Checkpoint, selected: &[usize], opts: &LoadOptions) -> Vec<Vec<usize>> {
    // Alignment padding the plan may add around one tensor (arena period on both sides).
    const SLACK_PER_TENSOR_BYTES: u64 = 2 * tensora_plan::ARENA_PERIOD_MIN_BYTES;
    let files_max = opts.files_open_max.max(1);
    let mut windows = Vec::new();
    let mut current: Vec<usize> = Vec::new();
    let mut current_bytes: u64 = 0;
    let mut current_files: Vec<u32> = Vec::new();
    // Whether each checkpoint file (by id) is in `current_files`.
    let mut in_current = vec![false; ckpt.files().len()];
    for &i in selected {
        let t = &ckpt.tensors()[i];
        let cost = t.len_bytes().saturating_add(SLACK_PER_TENSOR_BYTES);
        let new_file = !in_current[t.file().index()];
        let over_bytes = current_bytes.saturating_add(cost) > opts.budget_bytes;
        let over_files = new_file && current_files.len() >= files_max;
        if !current.is_empty() && (over_bytes || over_files) {
            windows.push(std::mem::take(&mut current));
            current_bytes = 0;
            for f in current_files.drain(..) {
                in_current[f as usize] = false;
            }
        }
        current.push(i);
        current_bytes = current_bytes.saturating_add(cost);
        if !in_current[t.file().index()] {
            in_current[t.file().index()] = true;
            current_files.push(t.file().0);
        }
    }
    if !current.is_empty() {
        windows.push(current);
    }
    windows
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn stream_windows_split_on_files_and_bytes() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/serverlessllm/tiny");
        let ckpt = tensora_format::sllm::open_dir(Path::new(dir)).unwrap();
        let selected: Vec<usize> = (0..ckpt.tensors().len()).collect();
        for files_open_max in [1, 2, 8] {
            let opts = LoadOptions { files_open_max, budget_bytes: 16 << 10, ..LoadOptions::default() };
            let windows = stream_windows(&ckpt, &selected, &opts);
            assert_eq!(windows.concat(), selected);
            for w in &windows {
                let mut files: Vec<u32> = w.iter().map(|&i| ckpt.tensors()[i].file().0).collect();
                files.dedup();
                files.sort_unstable();
                files.dedup();
                assert!(files.len() <= files_open_max, "{w:?}");
            }
        }
    }
}
