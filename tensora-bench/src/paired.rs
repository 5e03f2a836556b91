//! Paired acceptance runs: the loader and its roofline measured **alternately**, run after run,
//! and the ratio taken per pair.
//!
//! A virtual disk and a shared host drift within a bench run (the cells measured minutes apart can
//! differ by 20 % for the same code). The cell table compares each cell with the best roofline
//! pass of the run, which is conservative; these pairs answer the acceptance questions with the
//! drift cancelled: each pair's two runs happen back to back, the order alternates between pairs
//! (so neither side always runs on the other's leftovers), and the summary is over per-pair
//! ratios.
//!
//! - warm: `auto` owned full load vs the warm roofline (2-thread `pread` into a fresh hugepage
//!   arena), both touching one byte per page;
//! - cold: `auto` owned full load vs the better of the two device probes of the same pair
//!   (O_DIRECT QD32 8 MiB on one io_uring ring, and a buffered 2-thread `pread`), the page cache
//!   dropped before every run.

use std::path::PathBuf;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use tensora_io::{LoadOptions, LoadReport};

use crate::bench::{AUTO, WARMUP_RUNS};
use crate::cache::CacheDropper;
use crate::loaders::{TensoraCell, run_tensora_once};
use crate::report::Cache;
use crate::roofline::{self, ReadBuffers};
use crate::stats::{Summary, gbps, ratio};

/// Goal of the warm pair (issue #5): auto at least this fraction of the warm roofline.
pub const WARM_GOAL: f64 = 0.85;
/// Goal of the cold pair (issue #5): auto at least this fraction of the best device probe.
pub const COLD_GOAL: f64 = 0.9;

/// One paired comparison.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Pair {
    /// The fixture measured.
    pub fixture: String,
    /// Page cache state of both runs of each pair.
    pub cache: Cache,
    /// What the loader ran (`auto`'s choice of the last run).
    pub subject: String,
    /// What it is compared with.
    pub anchor: String,
    /// Loader GB/s per pair.
    pub subject_gbps: Vec<f64>,
    /// Anchor GB/s per pair (the better probe of the pair, cold).
    pub anchor_gbps: Vec<f64>,
    /// `subject / anchor` per pair.
    pub ratios: Vec<f64>,
    /// The median ratio the loader must reach ([`WARM_GOAL`] or [`COLD_GOAL`]).
    pub goal: f64,
}

impl Pair {
    /// Median, min and max of the per-pair ratios.
    pub fn ratio(&self) -> Option<Summary> {
        Summary::of(&self.ratios)
    }

    /// Whether the median ratio reaches the goal.
    pub fn met(&self) -> Option<bool> {
        self.ratio().map(|r| r.median >= self.goal)
    }

    /// [`Pair::met`] in a word: `met`, `missed` or `no data`.
    pub fn verdict(&self) -> &'static str {
        match self.met() {
            Some(true) => "met",
            Some(false) => "missed",
            None => "no data",
        }
    }
}

/// Runs the pairs on one fixture: warm always, cold when `dropper` is given.
pub fn measure_pairs(
    fixture: &str,
    open_path: &std::path::Path,
    files: &[PathBuf],
    runs: usize,
    dropper: Option<&CacheDropper>,
    log: &mut dyn FnMut(&str),
) -> Result<Vec<Pair>> {
    let cell = TensoraCell {
        open_path,
        backend: AUTO,
        selection: None,
        streaming: false,
        mapped: false,
        streaming_budget_bytes: 0,
    };
    let mut run = PairRun {
        fixture,
        files,
        runs,
        opts: cell.options(),
        cell,
        bufs: ReadBuffers::new(roofline::COPY_THREADS),
        held: None,
    };
    let mut out = Vec::new();
    let warm = run.warm()?;
    log(&warm.line());
    out.push(warm);
    let Some(dropper) = dropper else { return Ok(out) };
    let cold = run.cold(dropper)?;
    log(&cold.line());
    out.push(cold);
    Ok(out)
}

/// What the pairs of one fixture share: the files, the `auto` load, the roofline buffers, and the
/// last load (held until the next run frees it, as the cells do).
struct PairRun<'a> {
    fixture: &'a str,
    files: &'a [PathBuf],
    runs: usize,
    cell: TensoraCell<'a>,
    opts: LoadOptions,
    bufs: ReadBuffers,
    held: Option<tensora_io::Loaded>,
}

impl PairRun<'_> {
    /// Warm: files in the page cache, fresh memory on both sides; the anchor first in even pairs,
    /// the loader first in odd ones.
    fn warm(&mut self) -> Result<Pair> {
        roofline::read_through_cache(self.files, &mut self.bufs)?;
        let mut pair =
            Pair::new(self.fixture, Cache::Warm, crate::report::ROOFLINE_WARM.to_owned(), WARM_GOAL);
        for i in 0..WARMUP_RUNS + self.runs {
            let (a, (s, report)) = if i % 2 == 0 {
                let a = self.warm_anchor()?;
                (a, self.auto()?)
            } else {
                let s = self.auto()?;
                (self.warm_anchor()?, s)
            };
            if i >= WARMUP_RUNS {
                pair.push(s, a);
                pair.subject = auto_subject(&report);
            }
        }
        drop(self.held.take());
        Ok(pair)
    }

    /// The warm roofline once, the previous load freed first (untimed): GB/s.
    fn warm_anchor(&mut self) -> Result<f64> {
        drop(self.held.take());
        let (seconds, bytes, arena) = roofline::warm_pread_fresh(self.files)?;
        drop(arena);
        Ok(gbps(bytes, seconds))
    }

    /// One `auto` load: GB/s and its report. The load stays held until the next run.
    fn auto(&mut self) -> Result<(f64, LoadReport)> {
        let (seconds, bytes, report) = run_tensora_once(&self.cell, &self.opts, &mut self.held)?;
        Ok((gbps(bytes, seconds), report))
    }

    /// Cold: the page cache dropped before every run; each pair is three runs (the direct probe,
    /// the buffered probe, the load), rotated so that none always follows the same one, and the
    /// anchor is the better probe.
    fn cold(&mut self, dropper: &CacheDropper) -> Result<Pair> {
        let mut direct_arena = roofline::direct_arena(self.files)?;
        let direct_ok = self.files.iter().all(|f| tensora_io::auto::probe::direct_io_supported(f).is_ok())
            && tensora_io::backends::uring::probe().is_ok();
        let anchor = if direct_ok {
            format!("best of {} and {}", crate::report::ROOFLINE_DIRECT, crate::report::ROOFLINE_BUFFERED)
        } else {
            crate::report::ROOFLINE_BUFFERED.to_owned()
        };
        let mut pair = Pair::new(self.fixture, Cache::Cold, anchor, COLD_GOAL);
        for i in 0..WARMUP_RUNS + self.runs {
            let mut speeds = [0.0f64; 3];
            let mut report = None;
            for k in 0..3 {
                let which = (i + k) % 3;
                dropper.drop_files(self.files)?;
                speeds[which] = match which {
                    0 if direct_ok => {
                        let t = std::time::Instant::now();
                        let bytes = roofline::cold_direct(self.files, &mut direct_arena)?;
                        gbps(bytes, t.elapsed().as_secs_f64())
                    }
                    0 => 0.0,
                    1 => {
                        let t = std::time::Instant::now();
                        let bytes = roofline::cold_buffered(self.files, &mut self.bufs)?;
                        gbps(bytes, t.elapsed().as_secs_f64())
                    }
                    _ => {
                        let (speed, r) = self.auto().context("cold auto load")?;
                        drop(self.held.take());
                        report = Some(r);
                        speed
                    }
                };
            }
            if i >= WARMUP_RUNS {
                pair.push(speeds[2], speeds[0].max(speeds[1]));
                if let Some(r) = report {
                    pair.subject = auto_subject(&r);
                }
            }
        }
        Ok(pair)
    }
}

/// What `auto` ran, e.g. `auto (sync buffered)`.
fn auto_subject(report: &LoadReport) -> String {
    format!("{AUTO} ({} {})", report.backend, report.io_mode)
}

impl Pair {
    /// A pair with no runs yet; its subject is [`AUTO`] until a run says what `auto` chose.
    fn new(fixture: &str, cache: Cache, anchor: String, goal: f64) -> Pair {
        Pair {
            fixture: fixture.to_owned(),
            cache,
            subject: AUTO.to_owned(),
            anchor,
            subject_gbps: Vec::new(),
            anchor_gbps: Vec::new(),
            ratios: Vec::new(),
            goal,
        }
    }

    fn push(&mut self, subject_gbps: f64, anchor_gbps: f64) {
        self.subject_gbps.push(subject_gbps);
        self.anchor_gbps.push(anchor_gbps);
        if let Some(r) = ratio(subject_gbps, anchor_gbps) {
            self.ratios.push(r);
        }
    }

    /// One line for the log and the report.
    pub fn line(&self) -> String {
        let fmt = |s: Option<Summary>| {
            s.map_or("-".to_owned(), |s| format!("{:.2} ({:.2}..{:.2})", s.median, s.min, s.max))
        };
        format!(
            "{} {} pairs: {} {} GB/s vs {} {} GB/s; ratio {} (goal {:.2}: {})",
            self.fixture,
            self.cache.as_str(),
            self.subject,
            fmt(Summary::of(&self.subject_gbps)),
            self.anchor,
            fmt(Summary::of(&self.anchor_gbps)),
            fmt(self.ratio()),
            self.goal,
            self.verdict()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratios_are_per_pair_and_the_goal_uses_their_median() {
        let mut p = Pair {
            fixture: "f".into(),
            cache: Cache::Warm,
            subject: "auto".into(),
            anchor: "roofline".into(),
            subject_gbps: vec![],
            anchor_gbps: vec![],
            ratios: vec![],
            goal: 0.85,
        };
        assert_eq!(p.met(), None);
        // A drifting machine: both sides slow down together, the ratio stays put.
        for (s, a) in [(9.0, 10.0), (4.5, 5.0), (2.0, 2.5)] {
            p.push(s, a);
        }
        p.push(1.0, 0.0); // no ratio against a zero anchor
        let r = p.ratio().unwrap();
        assert_eq!((r.median, r.min, r.max, r.count), (0.9, 0.8, 0.9, 3));
        assert_eq!(p.met(), Some(true));
        assert!(p.line().contains("ratio 0.90 (0.80..0.90)"), "{}", p.line());
        p.goal = 0.95;
        assert_eq!(p.met(), Some(false));
        assert!(p.line().contains("missed"));
    }
}
