//! Owned runs under a budget: [`load_runs`] cuts the selection into runs of consecutive tensors
//! (the streaming windows) and loads them one at a time, each into a [`Loaded`] of its own. What
//! `weights_iterator` hands to Python, reachable from Rust.

use std::collections::VecDeque;
use std::thread::JoinHandle;
use std::time::Instant;

use tensora_format::{Checkpoint, Selection};

use super::cast::load_cast_part;
use super::session::{Session, begin};
use super::streaming::{COLD_MAPPED_RUN_BYTES_MAX, LookAhead, stream_windows};
use super::{ArenaReuse, LoadOptions, Loaded};
use crate::arena::{Arena, Pages};
use crate::auto::Delivery;
use crate::cast::DtypeTarget;
use crate::error::LoadError;
use crate::report::{Faults, Phases};
use crate::seam::Reading;

/// Load the selection as owned runs of consecutive tensors (in priority, then file order), each
/// holding at most [`LoadOptions::budget_bytes`] of tensor data (plus alignment slack; a tensor
/// larger than the budget is a run of its own). Each item is an independent [`Loaded`]: drop it
/// to free its memory, keep it as long as you like. A run is loaded only when the iterator is
/// advanced. While it loads with direct reads, the next run's arena is mapped and faulted in on a
/// thread of its own (a short run's reads, all in flight at once, otherwise fault its fresh memory
/// in themselves: a cold 2.2 GB load in 85 MiB runs, every run kept, read 1.03-1.52 GB/s that way
/// and 1.81-2.00 with this, five alternating runs each), so memory is what the caller keeps plus
/// two runs.
///
/// With [`LoadOptions::dtype`], each run is a cast load of its tensors (an owned arena at the
/// target dtype, see [`load`](crate::load())).
///
/// The residence, backend and I/O mode are decided once, for the whole selection
/// ([`Residence::Auto`] may map warm local files: then each run is views of the files). After an
/// error the iterator ends.
///
/// ```
/// use tensora_io::{LoadOptions, load_runs};
/// let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/serverlessllm/tiny");
/// let ckpt = tensora_format::open(dir)?;
/// let opts = LoadOptions { budget_bytes: 16 << 10, ..LoadOptions::default() };
/// let mut tensors = 0;
/// for run in load_runs(&ckpt, &opts)? {
///     let run = run?;
///     assert!(run.report().bytes_selected <= 16 << 10 || run.len() == 1);
///     tensors += run.len();
/// }
/// assert_eq!(tensors, ckpt.tensors().len());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// [`Residence::Auto`]: crate::Residence::Auto
pub fn load_runs<'c>(ckpt: &'c Checkpoint, opts: &'c LoadOptions) -> Result<Runs<'c>, LoadError> {
    let (session, selected, phases, faults_before) = begin(ckpt, opts, Delivery::Streaming)?;
    // Mapped runs of cold files are short and read ahead across their ends (`LookAhead`). Warm
    // ones keep the budget: cut at `COLD_MAPPED_RUN_BYTES_MAX` too, the first tensor came sooner
    // (6.8 ms against 9.9 in-process, 1 GiB budget, the 2.2 GB fixture) but each run's populate
    // then ran beside the caller's copies more often, and the whole was slower: a copying
    // consumer 0.297 s against 0.272 (15 rounds), vLLM's warm `load_weights` 0.906 against 0.756
    // (6 rounds; shared machine, docs/performance.md "The warm gap").
    let cold_mapped = session.residence.is_mapped() && session.reading != Reading::Cached;
    let run_bytes =
        if cold_mapped { opts.budget_bytes.min(COLD_MAPPED_RUN_BYTES_MAX) } else { opts.budget_bytes };
    let pending = stream_windows(ckpt, &selected, opts, run_bytes).into();
    let ahead = cold_mapped.then(|| LookAhead::new(ckpt, &pending, opts.files_open_max));
    Ok(Runs {
        session,
        pending,
        first: Some((phases, faults_before)),
        next_arena: None,
        pages: PagesAhead::default(),
        ahead,
    })
}

/// The most bytes one step of faulting in the next run's arena covers: each step is timed, so the
/// arena gives up huge pages that fault in slowly ([`Arena::populate_write_adaptive`]).
const FAULT_STEP_BYTES: u64 = 8 << 20;

/// Arenas in a row that start on base pages, after one that gave up huge pages, before one asks
/// for huge pages again; doubled after each probe that gives them up, up to
/// [`BASE_ARENAS_MAX`].
const BASE_ARENAS_BEFORE_PROBE: u32 = 3;
/// The longest streak of arenas started on base pages between two probes.
const BASE_ARENAS_MAX: u32 = 48;

/// Which pages the next arena faulted in ahead starts with. While this VM hands free memory back,
/// each arena that asks for huge pages pays [`Arena::populate_write_adaptive`]'s two slow samples
/// (16 MiB at 0.3-0.7 GB/s, the host faulting 512 pages for each) before it gives them up: with
/// short runs that thread fell behind the reads (cold 2.2 GB in 43 MiB runs, three alternating
/// rounds each: 0.52-0.82 GB/s probing every arena against 0.97-1.04 with a probe every fourth,
/// while the disk read 1.2; 0.72-1.21 against 1.59-1.68 while it read 1.9), and the runs during
/// which one probed still took 45-72 ms, the others a median of 22. So after an arena gave huge
/// pages up, the next ones start on base pages, [`BASE_ARENAS_BEFORE_PROBE`] of them and twice as
/// many after each probe that gives them up again (after 12 s idle, five alternating rounds:
/// 0.94-1.26 GB/s, median 1.10, probing every fourth arena; 1.20-1.28, median 1.25, doubling); an
/// arena that keeps huge pages resets the streak, since memory freed a moment ago (runs the caller
/// dropped) faults in fast as huge pages.
#[derive(Debug)]
struct PagesAhead {
    /// The last arena faulted in ahead ended on base pages.
    last_base: bool,
    /// Arenas started on base pages since the last probe.
    base_in_a_row: u32,
    /// Arenas to start on base pages before the next probe.
    streak: u32,
}

impl Default for PagesAhead {
    fn default() -> PagesAhead {
        PagesAhead { last_base: false, base_in_a_row: 0, streak: BASE_ARENAS_BEFORE_PROBE }
    }
}

impl PagesAhead {
    /// The pages the next arena starts with.
    fn next(&mut self) -> Pages {
        if self.last_base && self.base_in_a_row < self.streak {
            self.base_in_a_row += 1;
            Pages::Base
        } else {
            self.base_in_a_row = 0;
            Pages::Huge
        }
    }

    /// The arena [`PagesAhead::next`] last answered for ended with `pages`.
    fn ended_with(&mut self, pages: Pages) {
        match pages {
            Pages::Huge => self.streak = BASE_ARENAS_BEFORE_PROBE,
            // A probe (an arena that asked for huge pages after base ones) that gave them up.
            Pages::Base if self.last_base && self.base_in_a_row == 0 => {
                self.streak = (self.streak * 2).min(BASE_ARENAS_MAX);
            }
            Pages::Base => {}
        }
        self.last_base = pages == Pages::Base;
    }
}

/// The next run's arena, being mapped and faulted in on a thread of its own.
struct NextArena {
    len_bytes: u64,
    thread: JoinHandle<std::io::Result<Arena>>,
}

/// Map an arena of `len_bytes` and fault every page in. Bounded: `len_bytes / FAULT_STEP_BYTES`
/// steps. (Two threads sharing the steps measured the same as one.)
fn faulted_in_arena(len_bytes: u64, pages: Pages) -> std::io::Result<Arena> {
    let arena = Arena::with_len(len_bytes)?;
    if pages == Pages::Base {
        arena.use_base_pages()?;
    }
    let mut at = 0;
    while at < len_bytes {
        arena.populate_write_adaptive(at, FAULT_STEP_BYTES)?;
        at += FAULT_STEP_BYTES;
    }
    Ok(arena)
}

/// The iterator of [`load_runs`].
pub struct Runs<'c> {
    session: Session<'c>,
    /// Runs not loaded yet, in order.
    pending: VecDeque<Vec<usize>>,
    /// The phases of the selection and the decisions, billed to the first run's report.
    first: Option<(Phases, Faults)>,
    /// The arena of `pending`'s first run, faulted in while the run before it loads.
    next_arena: Option<NextArena>,
    /// What the next arena to fault in starts with (see [`PagesAhead`]).
    pages: PagesAhead,
    /// The read-ahead across the runs of a mapped stream over cold files.
    ahead: Option<LookAhead>,
}

impl Drop for Runs<'_> {
    fn drop(&mut self) {
        // The thread ends after one pass over at most one run's arena; its arena is unmapped.
        if let Some(next) = self.next_arena.take() {
            let _ = next.thread.join();
        }
    }
}

impl std::fmt::Debug for Runs<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runs").field("pending", &self.pending.len()).finish()
    }
}

impl Runs<'_> {
    /// Runs not loaded yet (a run that turns out larger than the budget after alignment is split
    /// in two when it is reached, so the final count may be higher).
    pub fn remaining(&self) -> usize {
        self.pending.len()
    }

    /// Load the next run, splitting it first if its plan outgrows the budget.
    fn load_next(&mut self, run: Vec<usize>) -> Result<Option<Loaded>, LoadError> {
        let (mut phases, faults_before) =
            self.first.take().unwrap_or_else(|| (Phases::default(), Faults::now()));
        let (ckpt, opts) = (self.session.ckpt, self.session.opts);
        if opts.dtype != DtypeTarget::Stored {
            // A cast run: an arena of its own at the target dtype (`super::cast`).
            let names = run.iter().map(|&i| ckpt.tensors()[i].name().to_owned()).collect();
            let t = Instant::now();
            return load_cast_part(ckpt, opts, &run, Selection::Names(names), t).map(Some);
        }
        if self.session.residence.is_mapped() {
            if let Some(ahead) = &mut self.ahead {
                ahead.run_starts(ckpt, run.iter().map(|&i| ckpt.tensors()[i].len_bytes()).sum());
            }
            return self.session.load_part(&run, phases, faults_before).map(Some);
        }
        let t = Instant::now();
        let plan = self.session.plan_owned(&run)?;
        phases.plan += t.elapsed().as_secs_f64();
        if plan.arena_len_bytes > self.session.opts.budget_bytes && run.len() > 1 {
            // Alignment padding or gaps pushed it over: split and load both halves in order.
            let (a, b) = run.split_at(run.len() / 2);
            self.pending.push_front(b.to_vec());
            self.pending.push_front(a.to_vec());
            self.first = Some((phases, faults_before));
            return Ok(None);
        }
        let faulted_in = self.take_next_arena(plan.arena_len_bytes);
        self.fault_in_next_arena();
        self.session.load_owned_running(&plan, &plan.plans, &run, phases, faults_before, faulted_in).map(Some)
    }

    /// The arena faulted in for the run about to load, if one of `len_bytes` was (a run split
    /// after planning, or a failed mapping, gets none: the load maps its own).
    fn take_next_arena(&mut self, len_bytes: u64) -> Option<Arena> {
        let next = self.next_arena.take()?;
        let arena = match next.thread.join() {
            Ok(arena) => arena.ok()?,
            Err(panic) => std::panic::resume_unwind(panic),
        };
        self.pages.ended_with(arena.pages());
        (next.len_bytes == len_bytes).then_some(arena)
    }

    /// Start mapping and faulting in the arena of the run after the one about to load: only for
    /// owned runs of direct reads into fresh memory, and only for a run whose plan fits the budget
    /// (a larger one is split when reached). Buffered reads fault their destination in as they
    /// copy, on every core, so a thread ahead of them only moves that work and the run waits for
    /// it (warm, 85 MiB runs: 3.37 GB/s median with it, 3.79 without, eight alternating rounds).
    /// Best effort: when planning or the thread fails, that run maps its own arena.
    fn fault_in_next_arena(&mut self) {
        let session = &self.session;
        let direct_into_fresh = session.direct() && session.opts.arena_reuse == ArenaReuse::Fresh;
        let cast = session.opts.dtype != DtypeTarget::Stored;
        if session.residence.is_mapped() || !direct_into_fresh || cast {
            return;
        }
        let Some(next) = self.pending.front() else { return };
        let Ok(plan) = session.plan_owned(next) else { return };
        let len_bytes = plan.arena_len_bytes;
        if len_bytes == 0 || (len_bytes > session.opts.budget_bytes && next.len() > 1) {
            return;
        }
        let pages = self.pages.next();
        let spawned = std::thread::Builder::new()
            .name("tensora-next-run".into())
            .spawn(move || faulted_in_arena(len_bytes, pages));
        if let Ok(thread) = spawned {
            self.next_arena = Some(NextArena { len_bytes, thread });
        }
    }
}

impl Iterator for Runs<'_> {
    type Item = Result<Loaded, LoadError>;

    fn next(&mut self) -> Option<Result<Loaded, LoadError>> {
        // Each split leaves two smaller runs, and a run of one tensor is never split: bounded by
        // twice the tensors of the selection.
        while let Some(run) = self.pending.pop_front() {
            match self.load_next(run) {
                Ok(Some(loaded)) => return Some(Ok(loaded)),
                Ok(None) => continue,
                Err(e) => {
                    self.pending.clear();
                    return Some(Err(e));
                }
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Drive `ahead` through arenas that all end on `ended`; the pages each started with.
    fn starts(ahead: &mut PagesAhead, arenas: usize, ended: Pages) -> Vec<Pages> {
        (0..arenas)
            .map(|_| {
                let started = ahead.next();
                ahead.ended_with(ended);
                started
            })
            .collect()
    }

    #[test]
    fn base_page_streaks_double_after_each_probe_that_gives_huge_pages_up() {
        use Pages::{Base, Huge};
        let mut ahead = PagesAhead::default();
        assert_eq!(starts(&mut ahead, 2, Huge), [Huge, Huge]);
        // Gave up: 3 on base pages, a probe, then 6, a probe, 12, a probe...
        let s = starts(&mut ahead, 1 + 3 + 1 + 6 + 1 + 12 + 1, Base);
        let probes: Vec<usize> = (0..s.len()).filter(|&i| s[i] == Huge).collect();
        assert_eq!(probes, [0, 4, 11, 24]);
        // ... up to BASE_ARENAS_MAX between probes, never more.
        let s = starts(&mut ahead, 400, Base);
        let probes: Vec<usize> = (0..s.len()).filter(|&i| s[i] == Huge).collect();
        assert!(probes.windows(2).all(|w| w[1] - w[0] <= BASE_ARENAS_MAX as usize + 1), "{probes:?}");
        assert!(probes.windows(2).any(|w| w[1] - w[0] == BASE_ARENAS_MAX as usize + 1), "{probes:?}");
        // A probe that keeps huge pages resets the streak.
        while ahead.next() == Base {
            ahead.ended_with(Base);
        }
        ahead.ended_with(Huge);
        assert_eq!(starts(&mut ahead, 1, Base), [Huge]);
        assert_eq!(starts(&mut ahead, 4, Base), [Base, Base, Base, Huge]);
    }

    #[test]
    fn an_arena_started_on_base_pages_stays_on_them() {
        let arena = faulted_in_arena(FAULT_STEP_BYTES + 5, Pages::Base).unwrap();
        assert_eq!(arena.pages(), Pages::Base);
    }

    #[test]
    fn an_arena_faulted_in_ahead_has_the_length_asked_and_only_zeros() {
        for len_bytes in [1, FAULT_STEP_BYTES - 1, FAULT_STEP_BYTES + (3 << 20) + 5] {
            let mut arena = faulted_in_arena(len_bytes, Pages::Huge).unwrap();
            assert_eq!(arena.len_bytes(), len_bytes);
            assert!(arena.as_slice().iter().all(|&b| b == 0), "{len_bytes}");
        }
    }
}
