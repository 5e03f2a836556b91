//! The whole bench: fixtures, rooflines, loaders and peers, in one run, into one [`Report`].

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};

use crate::cache::{CacheDropper, DropMethod};
pub use crate::cells::{CellSpec, Subject, plan_cells};
use crate::fixtures::{self, Fixture, Size};
use crate::peers;
use crate::report::{
    Cache, Cell, FixtureFacts, Machine, Mode, Report, RunFacts, SCHEMA_VERSION, Sample, Scope,
};
use crate::roofline::{self, ReadBuffers};
use crate::stats::gbps;
use tensora_io::arena::Arena;

/// Warm-up runs before the timed ones (they fill the cache for warm cells).
pub const WARMUP_RUNS: usize = 1;
/// Upper bound on timed runs per cell.
pub const RUNS_MAX: usize = 100;
/// Default timed runs per cell.
pub const RUNS_DEFAULT: usize = 5;
/// Timed runs per cell with `--quick`.
pub const RUNS_QUICK: usize = 3;
/// In-flight budget of the streaming cells.
pub const STREAMING_BUDGET_BYTES: u64 = 256 << 20;
/// Partial cells select every `PARTIAL_EVERY`-th tensor (10 %).
pub const PARTIAL_EVERY: usize = 10;

/// Peer: `fs::read` + `SafeTensors::deserialize`.
pub const PEER_ST_READ: &str = "safetensors-rs fs::read";
/// Peer: mmap + `to_vec` per tensor.
pub const PEER_ST_MMAP: &str = "safetensors-rs mmap+to_vec";
/// Peer: Hugging Face's Python `load_file`.
pub const PEER_PYTHON: &str = "hf-python load_file";
/// The adaptive backend choice.
pub const AUTO: &str = "auto";

/// How to run the bench.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    /// Where fixtures and reports go (e.g. `target/tensora-bench`).
    pub out_dir: PathBuf,
    /// The fixture size to generate and measure.
    pub size: Size,
    /// Timed runs per cell, `1..=RUNS_MAX`.
    pub runs: usize,
    /// Run the cold cells.
    pub cold: bool,
    /// Only a subset of cells.
    pub quick: bool,
    /// Seed of the generated fixture data.
    pub seed: u64,
}

impl BenchConfig {
    /// Check the knobs.
    pub fn validate(&self) -> Result<()> {
        if !(1..=RUNS_MAX).contains(&self.runs) {
            bail!("--runs must be in 1..={RUNS_MAX}, got {}", self.runs);
        }
        Ok(())
    }

    /// Where the reports go: `out_dir`, or `out_dir/quick` for `--quick`, so that the quick bench
    /// run by `cargo xtask test` never overwrites a full run's reports.
    pub fn report_dir(&self) -> PathBuf {
        if self.quick { self.out_dir.join("quick") } else { self.out_dir.clone() }
    }

    /// Where the fixtures of this size live.
    pub fn fixtures_dir(&self) -> PathBuf {
        self.out_dir.join("fixtures").join(self.size.as_str())
    }
}

#[cfg(test)]
impl BenchConfig {
    /// Tests: a full run (every cell, cold ones too) of small fixtures, 3 runs.
    pub(crate) fn full_for_tests() -> BenchConfig {
        BenchConfig {
            out_dir: PathBuf::from("unused"),
            size: Size::Small,
            runs: 3,
            cold: true,
            quick: false,
            seed: fixtures::DEFAULT_SEED,
        }
    }

    /// Tests: [`BenchConfig::full_for_tests`] with `--quick`.
    pub(crate) fn quick_for_tests() -> BenchConfig {
        BenchConfig { quick: true, ..BenchConfig::full_for_tests() }
    }

    /// Tests: [`BenchConfig::full_for_tests`] with `--no-cold`.
    pub(crate) fn warm_only_for_tests() -> BenchConfig {
        BenchConfig { cold: false, ..BenchConfig::full_for_tests() }
    }
}

/// How many times to run a measured body: `warmup` untimed runs, then `timed` ones. A plain
/// `usize` converts to that many timed runs after [`WARMUP_RUNS`] warm-ups.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Runs {
    /// Untimed runs first.
    pub warmup: usize,
    /// Timed runs after them.
    pub timed: usize,
}

impl From<usize> for Runs {
    fn from(timed: usize) -> Runs {
        Runs { warmup: WARMUP_RUNS, timed }
    }
}

/// Run `body` `warmup + timed` times, dropping the cache before each run when `cold` is given.
/// `body` returns (seconds, bytes) so that it can time itself (the Python peer does).
pub fn measure_timed(
    runs: impl Into<Runs>,
    cold: Option<(&CacheDropper, &[PathBuf])>,
    mut body: impl FnMut() -> Result<(f64, u64)>,
) -> Result<Vec<Sample>> {
    let Runs { warmup, timed } = runs.into();
    let (warmup, timed) = (warmup.min(RUNS_MAX), timed.min(RUNS_MAX));
    let mut samples = Vec::with_capacity(timed);
    for i in 0..warmup + timed {
        if let Some((dropper, files)) = cold {
            dropper.drop_files(files)?;
        }
        let (seconds, bytes) = body()?;
        if i >= warmup {
            samples.push(Sample { seconds, bytes, gbps: gbps(bytes, seconds) });
        }
    }
    Ok(samples)
}

/// [`measure_timed`] with the wall clock around `body`, which returns the bytes it loaded.
pub fn measure(
    runs: impl Into<Runs>,
    cold: Option<(&CacheDropper, &[PathBuf])>,
    mut body: impl FnMut() -> Result<u64>,
) -> Result<Vec<Sample>> {
    measure_timed(runs, cold, || {
        let t = Instant::now();
        let bytes = body()?;
        Ok((t.elapsed().as_secs_f64(), bytes))
    })
}

/// Names of the partial selection: every [`PARTIAL_EVERY`]-th tensor of the checkpoint.
pub fn partial_names(all_names: &[String]) -> Vec<String> {
    all_names.iter().step_by(PARTIAL_EVERY).cloned().collect()
}

/// Shared state of one bench run.
struct Runner<'a> {
    dropper: Option<CacheDropper>,
    python: Result<PathBuf, String>,
    copy_buffers: Option<ReadBuffers>,
    log: &'a mut dyn FnMut(&str),
}

/// Run the bench and return the report (not yet written; see [`write_reports`]). `log` receives
/// one line per step.
pub fn run(config: &BenchConfig, log: &mut dyn FnMut(&str)) -> Result<Report> {
    config.validate()?;
    let prepared = prepare_fixtures(config, log)?;
    let machine = Machine::detect(&config.fixtures_dir());
    let (cells, cache_drop) = measure_fixtures(config, &prepared.fixtures, log)?;
    let pairs = measure_acceptance_pairs(config, &prepared.fixtures, log)?;
    let mut report = build_report(config, machine, prepared, cells, cache_drop);
    report.pairs = pairs;
    Ok(report)
}

/// The paired acceptance runs ([`crate::paired`]) on the main fixture: warm always, cold when
/// cold cells run.
pub fn measure_acceptance_pairs(
    config: &BenchConfig,
    fixtures: &[Fixture],
    log: &mut dyn FnMut(&str),
) -> Result<Vec<crate::paired::Pair>> {
    let Some(main) = fixtures.iter().find(|f| f.name == fixtures::TINYLLAMA) else { return Ok(Vec::new()) };
    let dropper = match (config.cold, main.data_files.first()) {
        (true, Some(probe)) => Some(CacheDropper::probe(probe)?),
        _ => None,
    };
    let mut pairs = crate::paired::measure_pairs(
        &main.name,
        &main.open_path,
        &main.data_files,
        config.runs,
        dropper.as_ref(),
        log,
    )?;
    pairs.extend(crate::save::measure_save_pairs(config, fixtures, log)?);
    Ok(pairs)
}

/// Measure every planned cell of every fixture. Returns the cells and, when cold cells ran, how
/// the cache was dropped.
pub fn measure_fixtures(
    config: &BenchConfig,
    fixtures: &[Fixture],
    log: &mut dyn FnMut(&str),
) -> Result<(Vec<Cell>, Option<DropMethod>)> {
    config.validate()?;
    let dropper = if config.cold {
        let probe = fixtures.first().and_then(|f| f.data_files.first()).context("no fixture files")?;
        Some(CacheDropper::probe(probe)?)
    } else {
        None
    };
    let python = peers::python_available().and_then(|()| {
        std::fs::create_dir_all(&config.out_dir).map_err(|e| e.to_string())?;
        let script = config.out_dir.join("hf_load_file.py");
        crate::writer::write_text(&script, peers::PYTHON_SCRIPT).map_err(|e| format!("{e:#}"))?;
        Ok(script)
    });
    let mut runner = Runner { dropper, python, copy_buffers: None, log };
    let backends = crate::loaders::backend_names();
    let mut cells = Vec::new();
    for fixture in fixtures {
        let names = crate::loaders::tensor_names(fixture)?;
        let partial: Vec<String> = partial_names(&names);
        let specs = plan_cells(config, &fixture.name, &backends);
        // Interleaved rounds: every cell runs once per round (its warm-up in the first), so drift
        // of the machine within the run spreads over all cells alike instead of favouring
        // whichever ran during a fast minute.
        let mut fixture_cells: Vec<Option<Cell>> = vec![None; specs.len()];
        for round in 0..config.runs {
            let runs = Runs { warmup: if round == 0 { WARMUP_RUNS } else { 0 }, timed: 1 };
            for (spec, slot) in specs.iter().zip(fixture_cells.iter_mut()) {
                match slot {
                    Some(cell) if cell.status != crate::report::Status::Ok => continue,
                    _ => {}
                }
                let cell = runner.run_cell(fixture, spec, &partial, runs);
                *slot = Some(match slot.take() {
                    Some(mut so_far) if cell.status == crate::report::Status::Ok => {
                        let mut samples = std::mem::take(&mut so_far.samples);
                        samples.extend(cell.samples.iter().cloned());
                        let details = cell.details.clone().or(so_far.details.take());
                        let mut merged = so_far.with_samples(samples);
                        merged.details = details;
                        merged
                    }
                    _ => cell,
                });
            }
        }
        for (spec, cell) in specs.iter().zip(fixture_cells) {
            let Some(cell) = cell else { continue };
            let line = match &cell.gbps {
                Some(g) => format!("{:.2} GB/s median ({:.2}..{:.2})", g.median, g.min, g.max),
                None => format!("{:?}: {}", cell.status, cell.reason.as_deref().unwrap_or("")),
            };
            (runner.log)(&format!(
                "{} | {} | {} {} {} | {line}",
                fixture.name,
                spec.subject.name(),
                spec.cache.as_str(),
                spec.scope.as_str(),
                spec.mode.as_str()
            ));
            cells.push(cell);
        }
    }
    Ok((cells, runner.dropper.as_ref().map(CacheDropper::method)))
}

/// Assemble the report and compute rooflines and ratios.
pub fn build_report(
    config: &BenchConfig,
    machine: Machine,
    prepared: Prepared,
    cells: Vec<Cell>,
    cache_drop: Option<DropMethod>,
) -> Report {
    let mut report = Report {
        schema_version: SCHEMA_VERSION,
        run: RunFacts {
            size: config.size.as_str().to_string(),
            runs: config.runs,
            warmup_runs: WARMUP_RUNS,
            cold: config.cold,
            quick: config.quick,
            seed: config.seed,
            streaming_budget_bytes: STREAMING_BUDGET_BYTES,
            cache_drop: cache_drop.map(|d| d.describe().to_string()),
        },
        machine,
        fixtures: prepared.facts,
        fixtures_skipped: prepared.skipped,
        rooflines: Vec::new(),
        cells,
        pairs: Vec::new(),
    };
    report.compute_rooflines();
    report
}

/// Fixtures ready to measure.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// The fixtures on disk.
    pub fixtures: Vec<Fixture>,
    /// What the report says of each (same order as `fixtures`).
    pub facts: Vec<FixtureFacts>,
    /// Fixtures that could not be produced, and why.
    pub skipped: Vec<(String, String)>,
}

/// Generate or reuse every fixture of the configured size.
pub fn prepare_fixtures(config: &BenchConfig, log: &mut dyn FnMut(&str)) -> Result<Prepared> {
    let dir = config.fixtures_dir();
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    let mut fixtures = Vec::new();
    let mut facts = Vec::new();
    for spec in fixtures::specs(config.size, config.seed) {
        let t = Instant::now();
        let f = fixtures::ensure(&dir, &spec, config.size, config.seed)?;
        let seconds = t.elapsed().as_secs_f64();
        log(&format!(
            "fixture {}: {} ({} tensors, {:.3} GB) in {seconds:.1} s",
            f.name,
            if f.generated { "generated" } else { "reused" },
            f.tensors,
            f.files_len_bytes as f64 / 1e9
        ));
        facts.push(fixture_facts(&f, seconds));
        fixtures.push(f);
    }
    let mut skipped = Vec::new();
    let source = fixtures.iter().find(|f| f.name == fixtures::TINYLLAMA).cloned();
    if let Some(source) = source {
        let t = Instant::now();
        match crate::loaders::ensure_sllm(&dir, &source, config.size, config.seed) {
            Ok(f) => {
                let seconds = t.elapsed().as_secs_f64();
                log(&format!(
                    "fixture {}: {} in {seconds:.1} s",
                    f.name,
                    if f.generated { "converted" } else { "reused" }
                ));
                facts.push(fixture_facts(&f, seconds));
                fixtures.push(f);
            }
            Err(e) => {
                log(&format!("fixture {}: skipped: {e:#}", fixtures::TINYLLAMA_SLLM));
                skipped.push((fixtures::TINYLLAMA_SLLM.to_string(), format!("{e:#}")));
            }
        }
    }
    Ok(Prepared { fixtures, facts, skipped })
}

/// Facts of a fixture for the report.
pub fn fixture_facts(f: &Fixture, generate_seconds: f64) -> FixtureFacts {
    FixtureFacts {
        name: f.name.clone(),
        path: f.open_path.display().to_string(),
        files: f.data_files.len(),
        tensors: f.tensors,
        data_len_bytes: f.data_len_bytes,
        files_len_bytes: f.files_len_bytes,
        generated: f.generated,
        generate_seconds,
    }
}

impl Runner<'_> {
    fn run_cell(&mut self, fixture: &Fixture, spec: &CellSpec, partial: &[String], runs: Runs) -> Cell {
        let cell = Cell::new(
            &fixture.name,
            spec.subject.name(),
            spec.subject.kind(),
            spec.cache,
            spec.scope,
            spec.mode,
        );
        match self.try_cell(fixture, spec, partial, runs) {
            Ok(Outcome::Samples(samples, details)) => {
                let mut cell = cell.with_samples(samples);
                cell.details = details;
                cell
            }
            Ok(Outcome::Skipped(why)) => cell.skipped(why),
            Err(e) => cell.failed(&e),
        }
    }

    fn try_cell(
        &mut self,
        fixture: &Fixture,
        spec: &CellSpec,
        partial: &[String],
        runs: Runs,
    ) -> Result<Outcome> {
        let cold = match spec.cache {
            Cache::Warm => {
                // Warm means the files are in the page cache, whatever the previous cell did (a
                // cold cell, or an O_DIRECT load that bypassed the cache).
                let bufs = self.copy_buffers.get_or_insert_with(|| ReadBuffers::new(roofline::COPY_THREADS));
                roofline::read_through_cache(&fixture.data_files, bufs)?;
                None
            }
            Cache::Cold => {
                let dropper = self.dropper.as_ref().context("cold cell without a cache dropper")?;
                Some((dropper, &fixture.data_files[..]))
            }
        };
        let selected: Option<HashSet<String>> = match spec.scope {
            Scope::Full => None,
            Scope::Partial => Some(partial.iter().cloned().collect()),
        };
        let files = &fixture.data_files;
        let samples = match &spec.subject {
            Subject::RooflineWarm { .. } => {
                // A fresh arena per run, as an owned load maps one; the previous run's arena is
                // unmapped before the clock starts.
                let mut held: Option<Arena> = None;
                let mut huge = false;
                let samples = measure_timed(runs, cold, || {
                    drop(held.take());
                    let (seconds, bytes, arena) = roofline::warm_pread_fresh(files)?;
                    huge = arena.huge_pages_advised();
                    held = Some(arena);
                    Ok((seconds, bytes))
                })?;
                drop(held);
                let details =
                    Some(serde_json::json!({ "huge_pages_advised": huge, "arena": "fresh per run" }));
                return Ok(Outcome::Samples(samples, details));
            }
            Subject::RooflineDirect { .. } => {
                for f in files {
                    if let Err(why) = tensora_io::auto::probe::direct_io_supported(f) {
                        return Ok(Outcome::Skipped(format!("no O_DIRECT on {}: {why}", f.display())));
                    }
                }
                if let Err(why) = tensora_io::backends::uring::probe() {
                    return Ok(Outcome::Skipped(format!("io_uring unavailable: {why}")));
                }
                let mut arena = roofline::direct_arena(files)?;
                measure(runs, cold, || roofline::cold_direct(files, &mut arena))?
            }
            Subject::RooflineBuffered { .. } => {
                let bufs = self.copy_buffers.get_or_insert_with(|| ReadBuffers::new(roofline::COPY_THREADS));
                measure(runs, cold, || roofline::cold_buffered(files, bufs))?
            }
            Subject::PeerRead => measure(runs, cold, || Ok(peers::st_read(files, selected.as_ref())?.bytes))?,
            Subject::PeerMmap => {
                return crate::loaders::peer_mmap(files, runs, cold, selected.as_ref())
                    .map(|s| Outcome::Samples(s, None));
            }
            Subject::PeerPython => {
                let script = match &self.python {
                    Ok(script) => script,
                    Err(why) => {
                        return Ok(Outcome::Skipped(format!(
                            "python3 cannot import safetensors+numpy: {why}"
                        )));
                    }
                };
                measure_timed(runs, cold, || {
                    let (seconds, loaded) = peers::python_load(script, files)?;
                    Ok((seconds, loaded.bytes))
                })?
            }
            Subject::Tensora(backend) => {
                let load = crate::loaders::TensoraCell {
                    open_path: &fixture.open_path,
                    backend,
                    selection: selected.is_some().then_some(partial),
                    streaming: spec.mode == Mode::Streaming,
                    mapped: spec.mode == Mode::Mapped,
                    streaming_budget_bytes: STREAMING_BUDGET_BYTES,
                };
                return crate::loaders::measure_tensora(&load, runs, cold);
            }
        };
        Ok(Outcome::Samples(samples, None))
    }
}

/// What a cell produced.
#[derive(Debug)]
pub enum Outcome {
    /// Timed samples, with optional details of the last run.
    Samples(Vec<Sample>, Option<serde_json::Value>),
    /// Not run, and why.
    Skipped(String),
}

/// Write `report.md`, `report.json` and `report.svg` into `dir`; returns their paths.
pub fn write_reports(report: &Report, dir: &Path) -> Result<Vec<PathBuf>> {
    let md = dir.join("report.md");
    let json = dir.join("report.json");
    let svg = dir.join("report.svg");
    crate::writer::write_text(&md, &report.to_markdown())?;
    crate::writer::write_text(&json, &report.to_json()?)?;
    crate::writer::write_text(&svg, &report.to_svg(fixtures::TINYLLAMA)?)?;
    Ok(vec![md, json, svg])
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn measure_drops_the_warm_up_and_keeps_every_run() {
        let mut calls = 0u64;
        let samples = measure_timed(4, None, || {
            calls += 1;
            Ok((0.5, calls * 1_000_000_000))
        })
        .unwrap();
        assert_eq!(calls, 5);
        assert_eq!(samples.len(), 4);
        // The warm-up (bytes = 1e9) is not among the samples.
        assert_eq!(samples[0].bytes, 2_000_000_000);
        assert_eq!(samples[0].gbps, 4.0);
        let mut n = 0;
        let err = measure(3, None, || {
            n += 1;
            if n == 2 { anyhow::bail!("second run fails") } else { Ok(1) }
        });
        assert!(err.is_err());
    }

    #[test]
    fn quick_reports_do_not_overwrite_full_ones() {
        let (full, quick) = (BenchConfig::full_for_tests(), BenchConfig::quick_for_tests());
        assert_eq!(full.report_dir(), PathBuf::from("unused"));
        assert_eq!(quick.report_dir(), PathBuf::from("unused/quick"));
        // Fixtures are shared by size, whatever the mode.
        assert_eq!(quick.fixtures_dir(), full.fixtures_dir());
    }

    #[test]
    fn runs_are_bounded() {
        let config = BenchConfig::warm_only_for_tests;
        assert!(config().validate().is_ok());
        assert!(BenchConfig { runs: 0, ..config() }.validate().is_err());
        assert!(BenchConfig { runs: RUNS_MAX + 1, ..config() }.validate().is_err());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn partial_is_every_tenth(n in 0usize..2000) {
            let names: Vec<String> = (0..n).map(|i| format!("t{i}")).collect();
            let p = partial_names(&names);
            prop_assert_eq!(p.len(), n.div_ceil(PARTIAL_EVERY));
            prop_assert!(p.iter().all(|x| names.contains(x)));
        }
    }
}
