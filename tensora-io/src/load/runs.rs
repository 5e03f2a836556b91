//! Owned runs under a budget: [`load_runs`] cuts the selection into runs of consecutive tensors
//! (the streaming windows) and loads them one at a time, each into a [`Loaded`] of its own. What
//! `weights_iterator` hands to Python, reachable from Rust.

use std::collections::VecDeque;
use std::time::Instant;

use tensora_format::Checkpoint;

use super::session::{Session, begin};
use super::streaming::stream_windows;
use super::{LoadOptions, Loaded};
use crate::auto::Delivery;
use crate::error::LoadError;
use crate::report::{Faults, Phases};

/// Load the selection as owned runs of consecutive tensors (in priority, then file order), each
/// holding at most [`LoadOptions::budget_bytes`] of tensor data (plus alignment slack; a tensor
/// larger than the budget is a run of its own). Each item is an independent [`Loaded`]: drop it
/// to free its memory, keep it as long as you like. A run is loaded only when the iterator is
/// advanced, so memory is what the caller keeps plus one run.
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
pub fn load_runs<'c>(ckpt: &'c Checkpoint, opts: &'c LoadOptions) -> Result<Runs<'c>, LoadError> {
    let (session, selected, phases, faults_before) = begin(ckpt, opts, Delivery::Streaming)?;
    let pending = stream_windows(ckpt, &selected, opts).into();
    Ok(Runs { session, pending, first: Some((phases, faults_before)) })
}

/// The iterator of [`load_runs`].
pub struct Runs<'c> {
    session: Session<'c>,
    /// Runs not loaded yet, in order.
    pending: VecDeque<Vec<usize>>,
    /// The phases of the selection and the decisions, billed to the first run's report.
    first: Option<(Phases, Faults)>,
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
        if self.session.residence.is_mapped() {
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
        self.session.load_owned(&plan, &run, phases, faults_before).map(Some)
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
