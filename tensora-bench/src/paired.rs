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
//! Both sides run in situation (a), the first load of a fresh process (each run a child process,
//! [`crate::child`]), the situation the chart and the README show by default:
//! - warm: `auto` owned full load vs the better of the two warm rooflines of the same pair
//!   (2-thread `pread` into a fresh arena as a load gets it, and into fresh base pages), all
//!   touching one byte per page;
//! - cold: `auto` owned full load vs the better of the two device probes of the same pair
//!   (O_DIRECT QD32 8 MiB on one io_uring ring, and a buffered 2-thread `pread`, both in the
//!   bench's process with their memory ready), the page cache dropped before every run.

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::bench::{AUTO, BenchConfig, CellSpec, Runner, Subject, WARMUP_RUNS};
use crate::cells::RooflinePages;
use crate::fixtures::Fixture;
use crate::report::{Cache, Mode, Scope, Situation};
use crate::stats::{Summary, ratio};

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
    /// Cast pairs only: per pair, the best ratio the memory traffic allows, measured in the
    /// same round ([`crate::casts::memory_bound`]); empty for the other pairs (and in reports
    /// written before it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bounds: Vec<f64>,
    /// Per pair with a ratio and a bound: the ratio over the bound.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub of_bounds: Vec<f64>,
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

    /// `B: R of the bound` (the memory bound and the ratio over it, medians with min..max), or
    /// `None` for a pair without bounds. Information next to the goal, never part of
    /// [`Pair::met`].
    pub fn bound_text(&self) -> Option<String> {
        let bound = Summary::of(&self.bounds)?;
        Some(format!(
            "{}: {} of the bound",
            Summary::text(Some(bound)),
            Summary::text(Summary::of(&self.of_bounds))
        ))
    }
}

/// Progress keys of the pairs `measure_pairs` runs for `config` (one per pair).
pub fn step_keys(config: &BenchConfig) -> Vec<String> {
    let pairs = WARMUP_RUNS + config.pair_runs;
    let mut keys = vec!["pairs warm".to_owned(); pairs];
    if config.cold {
        keys.extend(vec!["pairs cold".to_owned(); pairs]);
    }
    keys
}

/// Runs the pairs on `fixture`: warm always, cold when the runner drops caches.
pub(crate) fn measure_pairs(runner: &mut Runner<'_>, fixture: &Fixture) -> Result<Vec<Pair>> {
    let mut out = Vec::new();
    let warm = warm(runner, fixture)?;
    runner.steps.log(&warm.line());
    out.push(warm);
    if runner.config().cold {
        let cold = cold(runner, fixture)?;
        runner.steps.log(&cold.line());
        out.push(cold);
    }
    Ok(out)
}

fn first_load(subject: Subject, cache: Cache, mode: Mode) -> CellSpec {
    CellSpec::new(subject, (Situation::FirstLoad, cache), Scope::Full, mode)
}

/// One run of a side of a pair: GB/s and, for `auto`, what it ran.
pub(crate) fn side(
    runner: &mut Runner<'_>,
    fixture: &Fixture,
    spec: &CellSpec,
) -> Result<(f64, Option<String>)> {
    let m = runner.sample(fixture, spec).with_context(|| spec.label())?;
    Ok((m.sample.gbps, m.details.as_ref().and_then(auto_subject)))
}

/// Warm: files in the page cache, fresh memory in a fresh process on both sides; each pair is
/// three runs (the two warm rooflines, the load) rotated so that none always follows the same one,
/// and the anchor is the better roofline.
fn warm(runner: &mut Runner<'_>, fixture: &Fixture) -> Result<Pair> {
    let roofline = |pages| first_load(Subject::RooflineWarm { again: false, pages }, Cache::Warm, Mode::Raw);
    let specs = [
        roofline(RooflinePages::Arena),
        roofline(RooflinePages::Base),
        first_load(Subject::Tensora(AUTO.to_owned()), Cache::Warm, Mode::Owned),
    ];
    let anchor =
        format!("best of {} and {}", crate::report::ROOFLINE_WARM, crate::report::ROOFLINE_WARM_BASE);
    let pair = Pair::new(&fixture.name, Cache::Warm, anchor, WARM_GOAL);
    run_pairs(runner, fixture, pair, &specs, ["fresh arena", "base pages"], First::Runs)
}

/// The pairs of `pair`: each three runs of `specs` (two anchors, then the load) rotated, the
/// anchor the better of the two; `names` name the anchors in the progress lines.
fn run_pairs(
    runner: &mut Runner<'_>,
    fixture: &Fixture,
    mut pair: Pair,
    specs: &[CellSpec; 3],
    names: [&str; 2],
    first: First,
) -> Result<Pair> {
    let label = format!("pairs {}", pair.cache.as_str());
    for i in 0..WARMUP_RUNS + runner.config().pair_runs {
        runner.steps.begin(&label);
        let t = std::time::Instant::now();
        let (speeds, ran) = three(runner, fixture, specs, i, first)?;
        let warmup = i < WARMUP_RUNS;
        let anchor_gbps = speeds[0].max(speeds[1]);
        if !warmup {
            pair.push(speeds[2], anchor_gbps);
            pair.subject = ran.unwrap_or(pair.subject);
        }
        let what = format!(
            "{label} {i}: {:.2} vs {anchor_gbps:.2} GB/s ({} {:.2}, {} {:.2}){}",
            speeds[2],
            names[0],
            speeds[0],
            names[1],
            speeds[1],
            if warmup { " (warm-up)" } else { "" }
        );
        runner.steps.done(t.elapsed().as_secs_f64(), &what);
    }
    Ok(pair)
}

/// Whether the first of a pair's three specs runs (the O_DIRECT probe cannot everywhere).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum First {
    Runs,
    Skipped,
}

/// The three runs of pair `i`, rotated: GB/s of each spec (0 for a first spec that is skipped)
/// and what `auto` ran.
fn three(
    runner: &mut Runner<'_>,
    fixture: &Fixture,
    specs: &[CellSpec; 3],
    i: usize,
    first: First,
) -> Result<([f64; 3], Option<String>)> {
    let mut speeds = [0.0f64; 3];
    let mut ran = None;
    for k in 0..3 {
        let which = (i + k) % 3;
        if which == 0 && first == First::Skipped {
            continue;
        }
        let (speed, subject) = side(runner, fixture, &specs[which])?;
        speeds[which] = speed;
        ran = ran.or(subject);
    }
    Ok((speeds, ran))
}

/// Cold: the page cache dropped before every run; each pair is three runs (the direct probe, the
/// buffered probe, the load), rotated so that none always follows the same one, and the anchor
/// is the better probe.
fn cold(runner: &mut Runner<'_>, fixture: &Fixture) -> Result<Pair> {
    let direct_ok = crate::bench::direct_unavailable(&fixture.data_files).is_none();
    let anchor = if direct_ok {
        format!("best of {} and {}", crate::report::ROOFLINE_DIRECT, crate::report::ROOFLINE_BUFFERED)
    } else {
        crate::report::ROOFLINE_BUFFERED.to_owned()
    };
    let device = |subject| CellSpec::new(subject, (Situation::Device, Cache::Cold), Scope::Full, Mode::Raw);
    let specs = [
        device(Subject::RooflineDirect { again: false }),
        device(Subject::RooflineBuffered { again: false }),
        first_load(Subject::Tensora(AUTO.to_owned()), Cache::Cold, Mode::Owned),
    ];
    let pair = Pair::new(&fixture.name, Cache::Cold, anchor, COLD_GOAL);
    let first = if direct_ok { First::Runs } else { First::Skipped };
    run_pairs(runner, fixture, pair, &specs, ["direct", "buffered"], first)
}

/// What `auto` ran, e.g. `auto (sync buffered)`, from its load report.
fn auto_subject(report: &serde_json::Value) -> Option<String> {
    let backend = report.get("backend")?.as_str()?;
    let io_mode = report.get("io_mode")?.as_str()?;
    Some(format!("{AUTO} ({backend} {io_mode})"))
}

impl Pair {
    /// A pair with no runs yet; its subject is [`AUTO`] until a run says what `auto` chose.
    pub(crate) fn new(fixture: &str, cache: Cache, anchor: String, goal: f64) -> Pair {
        Pair {
            fixture: fixture.to_owned(),
            cache,
            subject: AUTO.to_owned(),
            anchor,
            subject_gbps: Vec::new(),
            anchor_gbps: Vec::new(),
            ratios: Vec::new(),
            goal,
            bounds: Vec::new(),
            of_bounds: Vec::new(),
        }
    }

    pub(crate) fn push(&mut self, subject_gbps: f64, anchor_gbps: f64) {
        self.subject_gbps.push(subject_gbps);
        self.anchor_gbps.push(anchor_gbps);
        if let Some(r) = ratio(subject_gbps, anchor_gbps) {
            self.ratios.push(r);
        }
    }

    /// One line for the log and the report.
    pub fn line(&self) -> String {
        let bound = self.bound_text().map_or(String::new(), |b| format!("; memory bound {b}"));
        format!("{} (goal {:.2}: {}){bound}", self.measured_text(), self.goal, self.verdict())
    }

    /// The line of a pair measured as context for the others, with no goal to meet.
    pub fn context_line(&self) -> String {
        format!("{} (context, no goal)", self.measured_text())
    }

    /// What both lines start with: the pair's GB/s and ratio.
    fn measured_text(&self) -> String {
        let fmt = Summary::text;
        format!(
            "{} {} pairs: {} {} GB/s vs {} {} GB/s; ratio {}",
            self.fixture,
            self.cache.as_str(),
            self.subject,
            fmt(Summary::of(&self.subject_gbps)),
            self.anchor,
            fmt(Summary::of(&self.anchor_gbps)),
            fmt(self.ratio()),
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
            bounds: vec![],
            of_bounds: vec![],
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
        assert!(!p.line().contains("bound"), "{}", p.line());
        // A context pair says the same numbers and no goal, met or missed.
        let c = p.context_line();
        assert!(c.contains("ratio 0.90 (0.80..0.90)") && c.ends_with("(context, no goal)"), "{c}");
        assert!(!c.contains("goal 0.95") && !c.contains("missed") && !c.contains("met"), "{c}");
    }
}
