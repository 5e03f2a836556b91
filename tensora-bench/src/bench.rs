//! The whole bench: fixtures, the Python peers' environment, rooflines, loaders and peers in both
//! situations, and the paired acceptance runs, in one run, into one [`Report`].
//!
//! Every cell runs once per round, rounds interleaved, so drift of the machine spreads over all
//! cells alike. Every subject but the device rooflines runs in a child process per sample
//! ([`crate::child`]); the device rooflines run in the bench's own process, their memory faulted in
//! before the clock starts.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};

use crate::cache::{CacheDropper, DropMethod};
pub use crate::cells::{CastTo, CellSpec, PlanKind, RooflinePages, Subject, plan_cells};
use crate::child::{self, ChildSpec, Measured};
use crate::fixtures::{self, Fixture, Size};
use crate::memory::{MemoryState, Relay, Wants, relay_bytes};
use crate::progress::{Output, Progress};
use crate::python::PythonEnv;
use crate::report::{Cache, Cell, FixtureFacts, Machine, Report, RunFacts, SCHEMA_VERSION, Sample, Status};
use crate::roofline::{self, ReadBuffers};
use tensora_io::{Arena, ArenaConfig, Prefault};

/// Warm-up runs of [`measure`] and of the paired runs before the timed ones.
pub const WARMUP_RUNS: usize = 1;
/// Upper bound on timed runs per cell.
pub const RUNS_MAX: usize = 100;
/// Default timed runs per cell (one per round; `default` and `full` plans).
pub const RUNS_DEFAULT: usize = 3;
/// Default timed pairs of the paired acceptance runs.
pub const PAIR_RUNS_DEFAULT: usize = 7;
/// Timed runs per cell and timed pairs with `--quick`.
pub const RUNS_QUICK: usize = 3;
/// In-flight budget of the streaming cells.
pub const STREAMING_BUDGET_BYTES: u64 = 256 << 20;
/// Partial cells select every `PARTIAL_EVERY`-th tensor (10 %).
pub const PARTIAL_EVERY: usize = 10;

/// Peer: `fs::read` + `SafeTensors::deserialize`.
pub const PEER_ST_READ: &str = "safetensors-rs fs::read";
/// Peer: mmap + `to_vec` per tensor.
pub const PEER_ST_MMAP: &str = "safetensors-rs mmap+to_vec";
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
    /// Timed pairs of each paired acceptance run, `1..=RUNS_MAX`.
    pub pair_runs: usize,
    /// Run the cold cells.
    pub cold: bool,
    /// Which cells.
    pub plan: PlanKind,
    /// Seed of the generated fixture data.
    pub seed: u64,
    /// The `tensora-bench` binary that runs each sample in a child process (the running binary,
    /// or, in the crate's tests, the one Cargo built).
    pub child_exe: PathBuf,
    /// The memory state each child starts in (`crate::memory`).
    pub memory: MemoryState,
}

impl BenchConfig {
    /// Check the knobs.
    pub fn validate(&self) -> Result<()> {
        if !(1..=RUNS_MAX).contains(&self.runs) {
            bail!("--runs must be in 1..={RUNS_MAX}, got {}", self.runs);
        }
        if !(1..=RUNS_MAX).contains(&self.pair_runs) {
            bail!("--pair-runs must be in 1..={RUNS_MAX}, got {}", self.pair_runs);
        }
        Ok(())
    }

    /// Where the reports go: `out_dir` for the default plan, `out_dir/quick` and `out_dir/full`
    /// for the others, so that the quick bench run by `cargo xtask test` never overwrites the
    /// reports of `cargo xtask bench`.
    pub fn report_dir(&self) -> PathBuf {
        match self.plan {
            PlanKind::Default => self.out_dir.clone(),
            other => self.out_dir.join(other.as_str()),
        }
    }

    /// Where the fixtures of this size live.
    pub fn fixtures_dir(&self) -> PathBuf {
        self.out_dir.join("fixtures").join(self.size.as_str())
    }
}

#[cfg(test)]
impl BenchConfig {
    /// Tests: a plan of small fixtures, cold cells included, 3 runs.
    pub(crate) fn for_tests(plan: PlanKind) -> BenchConfig {
        BenchConfig {
            out_dir: PathBuf::from("unused"),
            size: Size::Small,
            runs: 3,
            pair_runs: 3,
            cold: true,
            plan,
            seed: fixtures::DEFAULT_SEED,
            child_exe: PathBuf::from("unused"),
            memory: MemoryState::Relay,
        }
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

/// Run `body` `warmup + timed` times in this process, dropping the cache before each run when
/// `cold` is given. `body` returns (seconds, bytes) so that it can time itself.
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
            samples.push(Sample::new(seconds, bytes));
        }
    }
    Ok(samples)
}

/// `measure_timed` with the wall clock around `body`, which returns the bytes it loaded.
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

/// Run the bench and return the report (not yet written; see [`write_reports`]). `log` receives
/// one line per step.
pub fn run(config: &BenchConfig, log: &mut dyn FnMut(&str)) -> Result<Report> {
    config.validate()?;
    let started = Instant::now();
    let prepared = prepare_fixtures(config, log)?;
    let python = crate::python::prepare(&config.out_dir, log)?;
    let machine = Machine::detect(&config.fixtures_dir());
    let load_start = crate::report::load_average();
    let mut runner = Runner::new(config, &python, &prepared.fixtures, Pairs::Measure, log)?;
    let cells = runner.measure_cells(&prepared.fixtures)?;
    let mut pairs = match prepared.fixtures.iter().find(|f| f.name == fixtures::TINYLLAMA) {
        Some(main) => crate::paired::measure_pairs(&mut runner, main)?,
        None => Vec::new(),
    };
    pairs.extend(crate::casts::measure_cast_pairs(&mut runner, &prepared.fixtures)?);
    let cache_drop = runner.drop_method();
    runner.steps.close();
    pairs.extend(crate::save::measure_save_pairs(config, &prepared.fixtures, log)?);
    let main = prepared.fixtures.iter().find(|f| f.name == fixtures::TINYLLAMA);
    let python_peers = main.map(|main| crate::torch_peers::run(config, &main.open_path, log));
    let restarts = main.map(|main| crate::torch_peers::run_restarts(config, &main.open_path, log));
    let mut report = build_report(config, machine, prepared, cells, cache_drop);
    report.pairs = pairs;
    report.python_peers = python_peers;
    report.restarts = restarts;
    report.run.seconds = started.elapsed().as_secs_f64();
    report.run.load_average = [load_start, crate::report::load_average()];
    Ok(report)
}

/// Only the paired acceptance runs (`crate::paired`) on the main fixture: warm always, cold when
/// `config.cold`.
pub fn measure_acceptance_pairs(
    config: &BenchConfig,
    fixtures: &[Fixture],
    log: &mut dyn FnMut(&str),
) -> Result<Vec<crate::paired::Pair>> {
    let Some(main) = fixtures.iter().find(|f| f.name == fixtures::TINYLLAMA) else { return Ok(Vec::new()) };
    let python = PythonEnv::not_prepared(&config.out_dir, "not needed by the paired runs");
    let mut runner = Runner::new(config, &python, std::slice::from_ref(main), Pairs::Only, log)?;
    let mut pairs = crate::paired::measure_pairs(&mut runner, main)?;
    pairs.extend(crate::casts::measure_cast_pairs(&mut runner, fixtures)?);
    runner.steps.close();
    pairs.extend(crate::save::measure_save_pairs(config, fixtures, log)?);
    Ok(pairs)
}

/// Measure every planned cell of every fixture (no paired runs). Returns the cells and, when cold
/// cells ran, how the cache was dropped.
pub fn measure_fixtures(
    config: &BenchConfig,
    fixtures: &[Fixture],
    python: &PythonEnv,
    log: &mut dyn FnMut(&str),
) -> Result<(Vec<Cell>, Option<DropMethod>)> {
    config.validate()?;
    let mut runner = Runner::new(config, python, fixtures, Pairs::Skip, log)?;
    let cells = runner.measure_cells(fixtures)?;
    runner.steps.close();
    Ok((cells, runner.drop_method()))
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
            pair_runs: config.pair_runs,
            cold: config.cold,
            plan: config.plan.as_str().to_owned(),
            seed: config.seed,
            streaming_budget_bytes: STREAMING_BUDGET_BYTES,
            cache_drop: cache_drop.map(|d| d.describe().to_string()),
            memory: config.memory.describe(),
            seconds: 0.0,
            load_average: [String::new(), String::new()],
        },
        machine,
        fixtures: prepared.facts,
        fixtures_skipped: prepared.skipped,
        rooflines: Vec::new(),
        cells,
        pairs: Vec::new(),
        versus: Vec::new(),
        python_peers: None,
        restarts: None,
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

/// Generate or reuse every fixture the plan measures, at the configured size.
pub fn prepare_fixtures(config: &BenchConfig, log: &mut dyn FnMut(&str)) -> Result<Prepared> {
    let dir = config.fixtures_dir();
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    let mut fixtures = Vec::new();
    let mut facts = Vec::new();
    for spec in fixtures::specs(config.size, config.seed).iter().filter(|s| config.plan.measures(&s.name)) {
        let t = Instant::now();
        let f = fixtures::ensure(&dir, spec, config.size, config.seed)?;
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
    // Every plan converts it back in the save pairs (crate::save), whether or not it measures
    // loads of it.
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

/// Whether a runner also measures the paired runs (for the progress estimate).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pairs {
    /// Cells, then pairs.
    Measure,
    /// Cells only.
    Skip,
    /// Pairs only.
    Only,
}

/// The steps of a run as the user sees them: progress on the terminal, lines in the log.
pub(crate) struct Steps<'a> {
    progress: Progress,
    log: &'a mut dyn FnMut(&str),
}

impl Steps<'_> {
    /// A permanent line.
    pub(crate) fn log(&mut self, line: &str) {
        (self.log)(line);
    }

    /// A step is about to run `what` (the bar is redrawn on a terminal).
    pub(crate) fn begin(&mut self, what: &str) {
        if self.progress.output() == Output::Bar {
            eprint!("\r\x1b[2K{}", self.progress.bar(what));
        }
    }

    /// The step took `seconds` and gave `what` (a line, except on a terminal).
    pub(crate) fn done(&mut self, seconds: f64, what: &str) {
        self.progress.finish(seconds);
        if self.progress.output() == Output::Lines {
            let line = self.progress.line(what);
            (self.log)(&line);
        }
    }

    /// A planned step that will not run (its cell failed in an earlier round).
    fn skip(&mut self) {
        self.progress.finish(0.0);
    }

    /// The run is over: clear the bar.
    fn close(&mut self) {
        if self.progress.output() == Output::Bar {
            eprint!("\r\x1b[2K");
        }
    }
}

/// One fixture's planned cells, each with the reason it cannot run (known before the run).
type FixturePlan = Vec<(CellSpec, Option<String>)>;

/// Shared state of one bench run.
pub(crate) struct Runner<'a> {
    config: &'a BenchConfig,
    python: &'a PythonEnv,
    dropper: Option<CacheDropper>,
    bufs: ReadBuffers,
    /// The device roofline's arena, faulted in once, for the files it was made for.
    direct: Option<(Vec<PathBuf>, Arena)>,
    /// The memory handed to each child.
    relay: Relay,
    plans: Vec<FixturePlan>,
    pub(crate) steps: Steps<'a>,
}

impl<'a> Runner<'a> {
    fn new(
        config: &'a BenchConfig,
        python: &'a PythonEnv,
        fixtures: &[Fixture],
        pairs: Pairs,
        log: &'a mut dyn FnMut(&str),
    ) -> Result<Runner<'a>> {
        let dropper = match (config.cold, fixtures.first().and_then(|f| f.data_files.first())) {
            (true, Some(probe)) => Some(CacheDropper::probe(probe)?),
            _ => None,
        };
        let mut runner = Runner {
            config,
            python,
            dropper,
            bufs: ReadBuffers::new(roofline::COPY_THREADS),
            direct: None,
            relay: Relay::new(config.memory),
            plans: Vec::new(),
            steps: Steps { progress: Progress::new(Vec::new(), Output::Lines), log },
        };
        let backends = crate::loaders::backend_names();
        let keys_python = python.keys();
        let mut keys = Vec::new();
        for f in fixtures.iter().filter(|f| pairs != Pairs::Only && config.plan.measures(&f.name)) {
            let specs = plan_cells(config, &f.name, &backends, &keys_python);
            let plan: FixturePlan =
                specs.into_iter().map(|s| (runner.precheck(f, &s), s)).map(|(skip, s)| (s, skip)).collect();
            for round in 0..config.runs {
                let order = round_order(plan.len(), config.seed, round);
                let planned = order.iter().map(|&i| &plan[i]).filter(|(_, skip)| skip.is_none());
                keys.extend(planned.map(|(s, _)| format!("{} {}", f.name, s.label())));
            }
            runner.plans.push(plan);
        }
        if pairs != Pairs::Skip {
            keys.extend(crate::paired::step_keys(config));
            keys.extend(crate::casts::step_keys(config));
        }
        runner.steps.progress = Progress::new(keys, Output::detect());
        Ok(runner)
    }

    /// The run's configuration.
    pub(crate) fn config(&self) -> &BenchConfig {
        self.config
    }

    /// How cold cells dropped the cache, if any ran.
    fn drop_method(&self) -> Option<DropMethod> {
        self.dropper.as_ref().map(CacheDropper::method)
    }

    /// Why `spec` cannot run on `fixture` here, known before the run: `None` when it can.
    fn precheck(&self, fixture: &Fixture, spec: &CellSpec) -> Option<String> {
        match &spec.subject {
            Subject::PeerPython(key) => self.python.status(key).err().map(|u| u.to_string()),
            Subject::Tensora(backend) => match crate::loaders::backend_unavailable(backend) {
                Ok(why) => why,
                Err(e) => Some(format!("{e:#}")),
            },
            Subject::RooflineDirect { .. } => direct_unavailable(&fixture.data_files),
            _ => None,
        }
    }

    /// Measure the planned cells of every fixture (`fixtures` in the order given to `new`).
    fn measure_cells(&mut self, fixtures: &[Fixture]) -> Result<Vec<Cell>> {
        let mut out = Vec::new();
        // The plans of `new`: the fixtures the plan measures (the others feed the save pairs).
        let measured = fixtures.iter().filter(|f| self.config.plan.measures(&f.name));
        for (fixture, plan) in measured.zip(std::mem::take(&mut self.plans)) {
            out.extend(self.measure_fixture(fixture, &plan)?);
            self.direct = None;
        }
        Ok(out)
    }

    /// One fixture's cells in interleaved rounds: every cell once per round.
    fn measure_fixture(&mut self, fixture: &Fixture, plan: &FixturePlan) -> Result<Vec<Cell>> {
        let mut cells: Vec<Cell> = plan
            .iter()
            .map(|(spec, skip)| {
                let cell = Cell::new(
                    &fixture.name,
                    spec.subject.name(),
                    spec.subject.kind(),
                    (spec.situation, spec.cache),
                    spec.scope,
                    spec.mode,
                );
                match skip {
                    Some(why) => cell.skipped(why.clone()),
                    None => cell,
                }
            })
            .collect();
        let mut samples: Vec<Vec<Sample>> = vec![Vec::new(); plan.len()];
        for round in 0..self.config.runs {
            for i in round_order(plan.len(), self.config.seed, round) {
                let (spec, skip) = &plan[i];
                if skip.is_some() {
                    continue;
                }
                if cells[i].status == Status::Failed {
                    self.steps.skip();
                    continue;
                }
                let what = format!("{} {}", fixture.name, spec.label());
                self.steps.begin(&what);
                let t = Instant::now();
                let result = self.sample(fixture, spec);
                let line = match result {
                    Ok(m) => {
                        let start =
                            m.sample.start_seconds.map(|s| format!(", start {s:.2} s")).unwrap_or_default();
                        let line = format!("{what}: {:.2} GB/s{start}", m.sample.gbps);
                        samples[i].push(m.sample);
                        cells[i].details = m.details.or(cells[i].details.take());
                        line
                    }
                    Err(e) => {
                        cells[i] = cells[i].clone().failed(&e);
                        format!("{what}: FAILED: {e:#}")
                    }
                };
                self.steps.done(t.elapsed().as_secs_f64(), &line);
            }
        }
        let out: Vec<Cell> = cells
            .into_iter()
            .zip(samples)
            .map(|(cell, samples)| if cell.status == Status::Ok { cell.with_samples(samples) } else { cell })
            .collect();
        for c in &out {
            self.steps.log(&cell_line(c));
        }
        Ok(out)
    }

    /// One sample of `spec` on `fixture`.
    pub(crate) fn sample(&mut self, fixture: &Fixture, spec: &CellSpec) -> Result<Measured> {
        // Warm means the files are in the page cache, whatever ran before (a cold cell, or an
        // O_DIRECT load that bypassed the cache). Cold runs start from the same state too: the
        // files are read into the page cache here and evicted right before the timed load, so the
        // memory the eviction frees is the same for every subject and run (on a VM that hands free
        // memory back to its hypervisor, what was freed a moment ago decides how fast fresh huge
        // pages fault in: docs/design.md).
        // The device rooflines' memory is ready before the clock starts, so for them the
        // eviction frees nothing that matters.
        if spec.subject.in_process() {
            return self.device(fixture, &spec.subject);
        }
        roofline::ensure_cached(&fixture.data_files, &mut self.bufs)?;
        let drop = match spec.cache {
            Cache::Warm => None,
            Cache::Cold => Some(self.dropper.as_ref().context("cold cell without a cache dropper")?.method()),
        };
        let mut cmd = match &spec.subject {
            Subject::PeerPython(key) => {
                let python = self.python.python.as_ref().map_err(|u| anyhow::anyhow!("{u}"))?;
                let mut cmd = std::process::Command::new(python);
                cmd.arg(&self.python.script).arg(key).arg(spec.situation.as_str());
                cmd.arg(drop.map_or("none", DropMethod::as_str)).args(&fixture.data_files);
                cmd
            }
            subject => child::command(
                &self.config.child_exe,
                &ChildSpec {
                    subject: subject.clone(),
                    open_path: fixture.open_path.clone(),
                    data_files: fixture.data_files.clone(),
                    scope: spec.scope,
                    mode: spec.mode,
                    situation: spec.situation,
                    drop,
                    streaming_budget_bytes: STREAMING_BUDGET_BYTES,
                },
            )?,
        };
        // After the page cache was filled above, so that the read does not take the memory.
        let wants = match spec.subject {
            Subject::Tensora(_)
            | Subject::Cast(_)
            | Subject::RooflineWarm { pages: RooflinePages::Arena, .. } => Wants::HugePages,
            _ => Wants::BasePages,
        };
        self.relay.hand_over(relay_bytes(fixture.data_len_bytes), wants)?;
        let measured = child::measure_child(&mut cmd);
        self.relay.take_back()?;
        measured
    }

    /// One run of a device roofline in this process, the page cache dropped first.
    fn device(&mut self, fixture: &Fixture, subject: &Subject) -> Result<Measured> {
        let files = &fixture.data_files;
        let dropper = self.dropper.as_ref().context("device roofline without a cache dropper")?;
        if matches!(subject, Subject::RooflineDirect { .. })
            && self.direct.as_ref().is_none_or(|(f, _)| f != files)
        {
            // Faulted in now, untimed: the figure is the device's alone.
            let lens =
                files.iter().map(|f| std::fs::metadata(f).map(|m| m.len())).collect::<Result<Vec<_>, _>>()?;
            let len_bytes = tensora_testkit::direct_roofline_arena_bytes(&lens);
            self.direct = Some((
                files.clone(),
                Arena::new(&ArenaConfig { len_bytes, prefault: Prefault::PopulateWrite })?,
            ));
        }
        dropper.drop_files(files)?;
        let t = Instant::now();
        let bytes = match (subject, self.direct.as_mut()) {
            (Subject::RooflineDirect { .. }, Some((_, arena))) => roofline::cold_direct(files, arena)?,
            (Subject::RooflineBuffered { .. }, _) => roofline::cold_buffered(files, &mut self.bufs)?,
            (other, _) => bail!("{} is not a device roofline", other.name()),
        };
        Ok(Measured { sample: Sample::new(t.elapsed().as_secs_f64(), bytes), details: None })
    }
}

/// The order in which a round runs `cells` cells: shuffled per round (deterministically, from the
/// seed), so that no cell always runs right after the same one. On a VM that hands free memory
/// back to its hypervisor, a process that starts right after another freed its memory faults it
/// in faster than one that starts after a pause.
pub fn round_order(cells: usize, seed: u64, round: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..cells).collect();
    let mut rng = crate::rng::SplitMix64::for_stream(seed, 0x0DE5 + round as u64);
    for i in (1..cells).rev() {
        let j = rng.range_inclusive(0, i as u64) as usize;
        order.swap(i, j);
    }
    order
}

/// Why the O_DIRECT roofline cannot run on `files`, or `None`.
pub(crate) fn direct_unavailable(files: &[PathBuf]) -> Option<String> {
    for f in files {
        if let Err(why) = tensora_sys::direct_io_supported(f) {
            return Some(format!("no O_DIRECT on {}: {why}", f.display()));
        }
    }
    tensora_io::uring_probe().err().map(|why| format!("io_uring unavailable: {why}"))
}

/// A cell's summary line for the log.
fn cell_line(cell: &Cell) -> String {
    let result = match &cell.gbps {
        Some(g) => format!("{:.2} GB/s median ({:.2}..{:.2})", g.median, g.min, g.max),
        None => format!("{:?}: {}", cell.status, cell.reason.as_deref().unwrap_or("")),
    };
    format!("{} | {result}", cell.key())
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
    fn reports_of_each_plan_have_their_own_directory() {
        let dir = |plan| BenchConfig::for_tests(plan).report_dir();
        assert_eq!(dir(PlanKind::Default), PathBuf::from("unused"));
        assert_eq!(dir(PlanKind::Quick), PathBuf::from("unused/quick"));
        assert_eq!(dir(PlanKind::Full), PathBuf::from("unused/full"));
        // Fixtures are shared by size, whatever the plan.
        let (a, b) = (BenchConfig::for_tests(PlanKind::Quick), BenchConfig::for_tests(PlanKind::Full));
        assert_eq!(a.fixtures_dir(), b.fixtures_dir());
    }

    #[test]
    fn runs_are_bounded() {
        let config = || BenchConfig::for_tests(PlanKind::Default);
        assert!(config().validate().is_ok());
        assert!(BenchConfig { runs: 0, ..config() }.validate().is_err());
        assert!(BenchConfig { runs: RUNS_MAX + 1, ..config() }.validate().is_err());
        assert!(BenchConfig { pair_runs: 0, ..config() }.validate().is_err());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn every_round_runs_every_cell_once(cells in 0usize..60, seed in any::<u64>(), round in 0usize..10) {
            let mut order = round_order(cells, seed, round);
            prop_assert_eq!(&order, &round_order(cells, seed, round));
            order.sort_unstable();
            prop_assert_eq!(order, (0..cells).collect::<Vec<_>>());
        }

        #[test]
        fn partial_is_every_tenth(n in 0usize..2000) {
            let names: Vec<String> = (0..n).map(|i| format!("t{i}")).collect();
            let p = partial_names(&names);
            prop_assert_eq!(p.len(), n.div_ceil(PARTIAL_EVERY));
            prop_assert!(p.iter().all(|x| names.contains(x)));
        }
    }
}
