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
    let mut pending: VecDeque<Vec<usize>> = stream_windows(ckpt, &selected, opts, opts.budget_bytes).into();
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
/// `budget_bytes` and that touch at most `files_open_max` files; an oversized tensor stands alone.
pub(super) fn stream_windows(
    ckpt: &Checkpoint,
    selected: &[usize],
    opts: &LoadOptions,
    budget_bytes: u64,
) -> Vec<Vec<usize>> {
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
        let over_bytes = current_bytes.saturating_add(cost) > budget_bytes;
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

/// The most bytes of one run of a mapped stream over cold files ([`load_runs`](super::load_runs),
/// what `weights_iterator` and vLLM's `tensora` load format read): a run is handed over once its
/// pages are in, so short runs hand each tensor over soon after its own pages land, and the
/// caller's copies overlap the reads of the runs after it. (vLLM cold, 341 MB runs: `load_weights`
/// 1.19x the device's read of the same bytes, the last run's copies after every read.)
pub const COLD_MAPPED_RUN_BYTES_MAX: u64 = 32 << 20;
/// How far past the end of the run being read in a mapped stream over cold files asks the kernel
/// to read ahead (`POSIX_FADV_WILLNEED`), at most: the device keeps a deep queue across run
/// boundaries while the caller works through the runs before.
pub const STREAM_LOOKAHEAD_BYTES: u64 = 256 << 20;

/// The read-ahead of a mapped stream over cold files: the selection's tensors in delivery order
/// as one line of bytes, advised in steps up to [`STREAM_LOOKAHEAD_BYTES`] past the run being
/// read in. Files are opened for the advice only, at most `files_max` at a time. Advice is a
/// hint: a failure costs read-ahead, never the load.
pub(super) struct LookAhead {
    /// (file id, file offset, length) of each tensor in delivery order.
    tensors: Vec<(u32, u64, u64)>,
    /// Where each tensor starts on the line, and the line's length at the end.
    starts: Vec<u64>,
    /// The line's bytes up to here have been advised.
    advised_to: u64,
    /// The line's bytes up to here belong to runs handed to [`LookAhead::run_starts`].
    runs_to: u64,
    files: Vec<(u32, std::fs::File)>,
    files_max: usize,
    /// [`STREAM_LOOKAHEAD_BYTES`] (smaller in tests).
    lead_bytes: u64,
}

impl LookAhead {
    /// The line of `runs` (in order) of `ckpt`.
    pub(super) fn new(ckpt: &Checkpoint, runs: &VecDeque<Vec<usize>>, files_max: usize) -> LookAhead {
        let tensors: Vec<(u32, u64, u64)> = runs
            .iter()
            .flatten()
            .map(|&i| {
                let t = &ckpt.tensors()[i];
                (t.file().0, t.offset_bytes(), t.len_bytes())
            })
            .collect();
        let mut starts = Vec::with_capacity(tensors.len() + 1);
        let mut at = 0u64;
        starts.push(0);
        for &(_, _, len) in &tensors {
            at = at.saturating_add(len);
            starts.push(at);
        }
        let files_max = files_max.max(1);
        LookAhead {
            tensors,
            starts,
            advised_to: 0,
            runs_to: 0,
            files: Vec::new(),
            files_max,
            lead_bytes: STREAM_LOOKAHEAD_BYTES,
        }
    }

    /// A run of `run_bytes` (the next on the line) is about to be read in: advise the line up to
    /// [`STREAM_LOOKAHEAD_BYTES`] past its end.
    pub(super) fn run_starts(&mut self, ckpt: &Checkpoint, run_bytes: u64) {
        self.runs_to = self.runs_to.saturating_add(run_bytes);
        let (from, to) = self.next_advice(self.lead_bytes);
        self.advise(ckpt, from, to);
    }

    /// The part of the line to advise now, `[from, to)`: from what was advised (or the current
    /// run's start) to `lead_bytes` past the runs started, clipped to the line. Pure.
    fn next_advice(&self, lead_bytes: u64) -> (u64, u64) {
        let end = self.starts.last().copied().unwrap_or(0);
        let to = self.runs_to.saturating_add(lead_bytes).min(end);
        (self.advised_to.min(to), to)
    }

    /// `POSIX_FADV_WILLNEED` over `[from, to)` of the line, in steps of at most
    /// `READAHEAD_STEP_BYTES` (the kernel reads only a few MiB of one call).
    fn advise(&mut self, ckpt: &Checkpoint, from: u64, to: u64) {
        use crate::map::readahead::{READAHEAD_STEP_BYTES, willneed_file};
        let first = self.starts.partition_point(|&s| s <= from).saturating_sub(1);
        for k in first..self.tensors.len() {
            let (start, (file, offset_bytes, len_bytes)) = (self.starts[k], self.tensors[k]);
            if start >= to {
                break;
            }
            let (lo, hi) = (from.max(start) - start, to.min(start + len_bytes) - start);
            let Some(f) = self.file(ckpt, file) else { continue };
            let mut at = lo;
            while at < hi {
                let step = READAHEAD_STEP_BYTES.min(hi - at);
                willneed_file(f, offset_bytes + at, step);
                at += step;
            }
        }
        self.advised_to = self.advised_to.max(to);
    }

    /// The open descriptor of `file`, opening it (and closing the oldest beyond `files_max`).
    fn file(&mut self, ckpt: &Checkpoint, file: u32) -> Option<&std::fs::File> {
        if let Some(k) = self.files.iter().position(|(f, _)| *f == file) {
            return Some(&self.files[k].1);
        }
        // Advice only: a path that names no regular file by now is skipped (the load's own open
        // refuses it), never opened plainly (a FIFO would block).
        let (opened, _) = super::open_regular_file(ckpt.file(tensora_format::FileId(file)).path()).ok()?;
        if self.files.len() >= self.files_max {
            self.files.remove(0);
        }
        self.files.push((file, opened));
        self.files.last().map(|(_, f)| f)
    }
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
            let windows = stream_windows(&ckpt, &selected, &opts, opts.budget_bytes);
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

    /// One file of `n` F32 tensors of `len_bytes` each, written and synced, its pages then
    /// dropped from the page cache.
    fn cold_file(dir: &Path, n: usize, len_bytes: u64) -> Checkpoint {
        use std::io::Write;
        let mut header = String::from("{");
        for k in 0..n {
            let (a, b) = (k as u64 * len_bytes, (k as u64 + 1) * len_bytes);
            let sep = if k == 0 { "" } else { "," };
            header += &format!(
                r#"{sep}"t{k}":{{"dtype":"F32","shape":[{}],"data_offsets":[{a},{b}]}}"#,
                len_bytes / 4
            );
        }
        header += "}";
        // Pad the header so the data starts on a page.
        let pad = (4096 - (8 + header.len()) % 4096) % 4096;
        header += &" ".repeat(pad);
        let path = dir.join("cold.safetensors");
        let mut f = std::fs::File::create(&path).unwrap();
        f.write_all(&(header.len() as u64).to_le_bytes()).unwrap();
        f.write_all(header.as_bytes()).unwrap();
        f.write_all(&vec![7u8; n * len_bytes as usize]).unwrap();
        f.sync_all().unwrap();
        // SAFETY: posix_fadvise only drops this file's clean pages from the page cache.
        let rc = unsafe {
            libc::posix_fadvise(std::os::fd::AsRawFd::as_raw_fd(&f), 0, 0, libc::POSIX_FADV_DONTNEED)
        };
        assert_eq!(rc, 0);
        tensora_format::open(&path).unwrap()
    }

    /// Which pages of the file are in the page cache.
    fn resident_pages(path: &Path) -> Vec<bool> {
        let file = std::fs::File::open(path).unwrap();
        // SAFETY: a read-only mapping of a file nobody writes during the test.
        let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
        let pages = map.len().div_ceil(4096);
        let mut vec = vec![0u8; pages];
        // SAFETY: `vec` has one byte per page of the live mapping `map`.
        let rc = unsafe { libc::mincore(map.as_ptr() as *mut libc::c_void, map.len(), vec.as_mut_ptr()) };
        assert_eq!(rc, 0);
        vec.iter().map(|b| b & 1 == 1).collect()
    }

    #[test]
    fn the_look_ahead_advises_at_most_its_lead_past_the_runs_started() {
        let dir = tempfile::tempdir().unwrap();
        let tensor_bytes = 1 << 20;
        let ckpt = cold_file(dir.path(), 16, tensor_bytes);
        let data_start = ckpt.tensors()[0].offset_bytes();
        assert_eq!(data_start % 4096, 0);
        let runs: VecDeque<Vec<usize>> = (0..16).map(|i| vec![i]).collect();
        let mut ahead = LookAhead::new(&ckpt, &runs, 1);
        ahead.lead_bytes = 3 << 20;
        let path = ckpt.file(tensora_format::FileId(0)).path().to_owned();
        for run in 0..4u64 {
            ahead.run_starts(&ckpt, tensor_bytes);
            let bound = (run + 1) * tensor_bytes + ahead.lead_bytes;
            assert_eq!(ahead.advised_to, bound, "run {run}");
            assert_eq!(
                ahead.next_advice(ahead.lead_bytes),
                (bound, bound),
                "nothing more until the next run"
            );
            // The advised pages arrive (asynchronously); none past the bound is read.
            let page_of = |line: u64| ((data_start + line) / 4096) as usize;
            // Polled up to a deadline far beyond an idle machine's few milliseconds: a loaded
            // disk may take seconds to read what was advised.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            let mut pages = resident_pages(&path);
            while !pages[page_of(0)..page_of(bound)].iter().all(|&r| r)
                && std::time::Instant::now() < deadline
            {
                std::thread::sleep(std::time::Duration::from_millis(10));
                pages = resident_pages(&path);
            }
            assert!(
                pages[page_of(0)..page_of(bound)].iter().all(|&r| r),
                "run {run}: advised pages not read"
            );
            let past = pages[page_of(bound)..page_of(16 * tensor_bytes)].iter().filter(|&&r| r).count();
            assert_eq!(past, 0, "run {run}: {past} pages read past the look-ahead bound");
        }
        // The line's end clips the advice.
        for _ in 4..16 {
            ahead.run_starts(&ckpt, tensor_bytes);
        }
        assert_eq!(ahead.advised_to, 16 * tensor_bytes);
    }

    #[test]
    fn cold_mapped_runs_are_short_and_read_ahead_warm_ones_are_not() {
        let dir = tempfile::tempdir().unwrap();
        // 48 tensors of 1 MiB: one run under a 1 GiB budget, 2 under the cold mapped cap.
        let ckpt = cold_file(dir.path(), 48, 1 << 20);
        // SAFETY: nothing writes the test's file.
        let promise = unsafe { super::super::FilesUnchanged::promise() };
        let opts =
            LoadOptions { residence: super::super::Residence::Auto(promise), ..LoadOptions::default() };
        let runs: Vec<_> = super::super::load_runs(&ckpt, &opts).unwrap().map(Result::unwrap).collect();
        assert!(runs[0].report().reason.contains("mapped: cold"), "{}", runs[0].report().reason);
        assert_eq!(runs.len(), 2);
        assert!(runs.iter().all(|r| r.report().bytes_selected <= COLD_MAPPED_RUN_BYTES_MAX));
        // Warm now: one run, as the budget allows.
        let warm: Vec<_> = super::super::load_runs(&ckpt, &opts).unwrap().map(Result::unwrap).collect();
        assert!(warm[0].report().reason.contains("mapped: warm"), "{}", warm[0].report().reason);
        assert_eq!(warm.len(), 1);
    }
}
