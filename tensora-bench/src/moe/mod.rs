//! The MoE-scale cells (issue 20): a DeepSeek-V3-shaped checkpoint (about 90,000 tensors in 163
//! shards, [`fixture`]) opened strictly and lazily, planned for one expert and one layer, one
//! expert loaded from sparse files, `inspect --json`, and Hugging Face's `safe_open` reading the
//! same headers, all in one run; and the 100,000-tensor single file loaded by the CLI beside its
//! roofline ([`many_small`]). Written as `moe.json` and `moe.md` beside the main report.
//!
//! Times are wall-clock medians over the configured runs, at least [`RUNS_MIN`] (after one warm-up, page cache warm).
//! Peak memory is measured in a fresh process (this binary re-run as a probe), as `VmHWM`.

pub mod fixture;
pub mod many_small;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use serde::Serialize;
use tensora_format::{OpenOptions, Selection, Shards};
use tensora_io::LoadOptions;

use self::fixture::{MoeFixture, MoeShape};
use crate::bench::BenchConfig;
use crate::stats::Summary;

/// Goal: open + parse + plan of one expert, strict, in at most this many milliseconds.
pub const STRICT_PLAN_MS_GOAL: f64 = 50.0;
/// Goal: the same, lazy with a one-layer selection.
pub const LAZY_PLAN_MS_GOAL: f64 = 25.0;
/// Goal: strict open at least this many times faster than Hugging Face's header reads.
pub const HF_SPEEDUP_GOAL: f64 = 5.0;
/// Goal: `inspect --json` in at most this many milliseconds.
pub const INSPECT_MS_GOAL: f64 = 150.0;
/// Goal: peak RSS while inspecting at most twice the header bytes plus this.
pub const RSS_SLACK_BYTES: u64 = 16 << 20;
/// The argument that turns this binary into a measuring probe (see [`probe_main`]).
pub const PROBE_ARG: &str = "--moe-probe";

/// One measured quantity.
#[derive(Debug, Clone, Serialize)]
pub struct MoeCell {
    /// What was measured.
    pub name: String,
    /// `ok`, `skipped` or `failed`.
    pub status: String,
    /// Why it was skipped or failed.
    pub reason: Option<String>,
    /// Milliseconds: median, min, max over the runs.
    pub ms: Option<Summary>,
    /// Peak resident memory of the measuring process, where measured.
    pub peak_rss_bytes: Option<u64>,
    /// The goal, in words, and whether the median met it.
    pub goal: Option<String>,
    /// Whether the goal was met (`None` without a goal or a measurement).
    pub met: Option<bool>,
    /// Anything else worth keeping (phases, bytes, ratios).
    pub details: Option<serde_json::Value>,
}

impl MoeCell {
    fn ok(name: &str, samples_ms: &[f64]) -> MoeCell {
        MoeCell {
            name: name.to_owned(),
            status: "ok".into(),
            reason: None,
            ms: Summary::of(samples_ms),
            peak_rss_bytes: None,
            goal: None,
            met: None,
            details: None,
        }
    }
    fn not_run(name: &str, status: &str, reason: String) -> MoeCell {
        MoeCell { status: status.into(), reason: Some(reason), ..MoeCell::ok(name, &[]) }
    }
    fn goal_ms(mut self, max_ms: f64) -> MoeCell {
        self.goal = Some(format!("median <= {max_ms} ms"));
        self.met = self.ms.map(|s| s.median <= max_ms);
        self
    }
}

/// Everything the MoE cells measured.
#[derive(Debug, Clone, Serialize)]
pub struct MoeReport {
    /// The checkpoint measured.
    pub fixture: MoeFixture,
    /// Timed runs per cell.
    pub runs: usize,
    /// The selections: one expert and one layer.
    pub selections: Vec<String>,
    /// The cells.
    pub cells: Vec<MoeCell>,
}

/// Timed runs of each MoE cell, at least this many whatever `--runs` says: a cell takes tens of
/// milliseconds (HF's, a fresh interpreter: half a second), and with three samples one slow one
/// moved a median by a tenth.
pub const RUNS_MIN: usize = 7;

/// Timed runs of each MoE cell: the configured runs, at least [`RUNS_MIN`].
pub fn runs_of(config: &BenchConfig) -> usize {
    config.runs.max(RUNS_MIN)
}

/// `runs` timed calls of `f` after one untimed (warm-up) call; the previous result is dropped
/// before each timed call, so its teardown is not timed and its memory is free for the next.
fn time_ms<T>(runs: usize, mut f: impl FnMut() -> Result<T>) -> Result<(Vec<f64>, T)> {
    let mut last = f()?;
    let mut samples = Vec::with_capacity(runs);
    for _ in 0..runs {
        drop(last);
        let t = Instant::now();
        last = f()?;
        samples.push(t.elapsed().as_secs_f64() * 1e3);
    }
    Ok((samples, last))
}

/// A cell from a measuring closure: an error becomes a failed cell, not a failed bench.
fn cell(name: &str, log: &mut dyn FnMut(&str), f: impl FnOnce() -> Result<MoeCell>) -> MoeCell {
    let c = f().unwrap_or_else(|e| MoeCell::not_run(name, "failed", format!("{e:#}")));
    let line = match (&c.ms, &c.reason) {
        (Some(s), _) => format!("{:.1} ms median ({:.1}..{:.1})", s.median, s.min, s.max),
        (None, Some(r)) => format!("{}: {r}", c.status),
        (None, None) => c.status.clone(),
    };
    let rss = c.peak_rss_bytes.map(|b| format!(", peak RSS {:.1} MiB", b as f64 / (1 << 20) as f64));
    log(&format!("moe | {} | {line}{}", c.name, rss.unwrap_or_default()));
    c
}

fn lazy(glob: &str) -> OpenOptions {
    OpenOptions { shards: Shards::Selected(Selection::Glob(vec![glob.to_owned()])), ..OpenOptions::default() }
}

/// Open (as `how` says), then load `glob` from sparse files: milliseconds of open + parse + plan,
/// and of the whole load, and the phases of the last run.
fn load_one(dir: &Path, how: &OpenOptions, glob: &str) -> Result<(f64, f64, serde_json::Value)> {
    let t = Instant::now();
    let ckpt = tensora_format::open_with(dir, how)?;
    let parse_s = t.elapsed().as_secs_f64();
    let opts = LoadOptions {
        selection: Selection::Glob(vec![glob.to_owned()]),
        allow_sparse: true,
        ..LoadOptions::default()
    };
    let loaded = tensora_io::load(&ckpt, &opts)?;
    let r = loaded.report();
    let control_s = parse_s + r.phases.open + r.phases.plan;
    let details = serde_json::json!({
        "parse_ms": parse_s * 1e3, "open_ms": r.phases.open * 1e3, "plan_ms": r.phases.plan * 1e3,
        "io_ms": r.phases.io * 1e3, "bytes_selected": r.bytes_selected, "tensors": loaded.len(),
        "backend": r.backend, "shards_parsed": ckpt.files().len(),
    });
    Ok((control_s * 1e3, (parse_s + r.seconds) * 1e3, details))
}

/// Run every MoE cell on the fixture under the configured fixtures root.
/// `python` is the provisioned venv's interpreter (`crate::python`), or why there is none (the HF cell
/// is then reported as skipped with that reason).
pub fn run(
    config: &BenchConfig,
    python: Result<&Path, String>,
    log: &mut dyn FnMut(&str),
) -> Result<MoeReport> {
    config.validate()?;
    let shape = MoeShape::DEEPSEEK_V3;
    let t = Instant::now();
    let fixture = fixture::ensure(&config.out_dir.join("fixtures"), &shape)?;
    log(&format!(
        "fixture {}: {} ({} tensors in {} shards, {:.1} MB of headers, {:.1} MB index, {:.0} GB sparse) in {:.1} s",
        fixture::NAME,
        if fixture.generated { "generated" } else { "reused" },
        fixture.tensors,
        fixture.files.len(),
        fixture.header_bytes as f64 / 1e6,
        fixture.index_bytes as f64 / 1e6,
        fixture.files_len_bytes as f64 / 1e9,
        t.elapsed().as_secs_f64()
    ));
    let runs = runs_of(config);
    let dir = fixture.dir.clone();
    let (expert, layer) = (shape.one_expert_glob(), shape.one_layer_glob());
    let mut cells = Vec::new();
    let strict = OpenOptions::default();
    cells.push(cell("open, strict (all 163 shards parsed and checked)", log, || {
        let (ms, ckpt) = time_ms(runs, || Ok(tensora_format::open(&dir)?))?;
        let mut c = MoeCell::ok("open, strict (all 163 shards parsed and checked)", &ms);
        c.details = Some(serde_json::json!({ "tensors": ckpt.tensors().len() }));
        Ok(c)
    }));
    cells.push(cell("open, lazy, one-layer selection", log, || {
        let how = lazy(&layer);
        let (ms, ckpt) = time_ms(runs, || Ok(tensora_format::open_with(&dir, &how)?))?;
        let mut c = MoeCell::ok("open, lazy, one-layer selection", &ms).goal_ms(LAZY_PLAN_MS_GOAL);
        c.details =
            Some(serde_json::json!({ "shards_parsed": ckpt.files().len(), "tensors": ckpt.tensors().len() }));
        Ok(c)
    }));
    for (name, how, goal) in [
        ("open+parse+plan, one expert, strict", &strict, STRICT_PLAN_MS_GOAL),
        ("open+parse+plan, one expert, lazy", &lazy(&expert), LAZY_PLAN_MS_GOAL),
    ] {
        let mut total = Vec::new();
        cells.push(cell(name, log, || {
            let mut control = Vec::new();
            let mut details = serde_json::Value::Null;
            load_one(&dir, how, &expert)?; // warm-up
            for _ in 0..runs {
                let (c, t, d) = load_one(&dir, how, &expert)?;
                control.push(c);
                total.push(t);
                details = d;
            }
            let mut c = MoeCell::ok(name, &control).goal_ms(goal);
            c.details = Some(details);
            Ok(c)
        }));
        if matches!(how.shards, Shards::All) {
            cells.push(MoeCell::ok(
                "selective load, one expert, strict, allow_sparse (open to Loaded)",
                &total,
            ));
        }
    }
    cells.extend(memory_and_inspect_cells(&dir, &fixture, runs, log));
    cells.push(cell("HF safe_open header reads (python, keys of every shard)", log, || {
        hf_safe_open(config, python, &fixture, runs)
    }));
    cells.extend(many_small::cells(config, log));
    add_ratio(&mut cells);
    Ok(MoeReport { fixture, runs, selections: vec![expert, layer], cells })
}

/// Peak RSS of a fresh process opening strictly; `inspect --json` in-process and through the CLI.
fn memory_and_inspect_cells(
    dir: &Path,
    fixture: &MoeFixture,
    runs: usize,
    log: &mut dyn FnMut(&str),
) -> Vec<MoeCell> {
    let rss_goal = 2 * fixture.header_bytes + RSS_SLACK_BYTES;
    let mut cells = Vec::new();
    for (what, name) in [
        ("open", "open, strict, in a fresh process (peak RSS)"),
        ("inspect", "inspect --json built in memory (Inspection::of), fresh process"),
        ("inspect-stream", "inspect --json streamed (Inspection::write_json), fresh process"),
    ] {
        cells.push(cell(name, log, || {
            let mut ms = Vec::new();
            let mut rss = 0u64;
            for _ in 0..runs {
                let (seconds, peak) = run_probe(what, dir)?;
                ms.push(seconds * 1e3);
                rss = rss.max(peak);
            }
            let mut c = MoeCell::ok(name, &ms);
            if what != "open" {
                c = c.goal_ms(INSPECT_MS_GOAL);
            }
            c.peak_rss_bytes = Some(rss);
            c.details = Some(serde_json::json!({
                "rss_goal_bytes": rss_goal, "rss_met": rss <= rss_goal, "header_bytes": fixture.header_bytes,
            }));
            Ok(c)
        }));
    }
    let name = "tensora inspect --json (the CLI binary, stdout to /dev/null)";
    cells.push(cell(name, log, || {
        let Some(cli) = std::env::current_exe()?.parent().map(|d| d.join("tensora")).filter(|p| p.is_file())
        else {
            return Ok(MoeCell::not_run(
                name,
                "skipped",
                "no tensora binary beside this one (cargo build --release -p tensora-cli)".into(),
            ));
        };
        let (ms, ()) = time_ms(runs, || {
            let status = Command::new(&cli)
                .arg("inspect")
                .arg(dir)
                .arg("--json")
                .stdout(std::process::Stdio::null())
                .status()?;
            if !status.success() {
                bail!("{} inspect failed: {status}", cli.display());
            }
            Ok(())
        })?;
        Ok(MoeCell::ok(name, &ms).goal_ms(INSPECT_MS_GOAL))
    }));
    cells
}

/// Strict open's speed-up over HF's header reads, on the open cell.
fn add_ratio(cells: &mut [MoeCell]) {
    let hf = cells.iter().find(|c| c.name.starts_with("HF safe_open")).and_then(|c| c.ms).map(|s| s.median);
    let Some(hf) = hf else { return };
    if let Some(open) = cells.iter_mut().find(|c| c.name.starts_with("open, strict")) {
        let speedup = open.ms.and_then(|s| crate::stats::ratio(hf, s.median));
        open.goal = Some(format!(">= {HF_SPEEDUP_GOAL}x faster than HF safe_open over the same files"));
        open.met = speedup.map(|x| x >= HF_SPEEDUP_GOAL);
        if let Some(serde_json::Value::Object(d)) = &mut open.details {
            d.insert("speedup_over_hf".into(), serde_json::json!(speedup));
        }
    }
}

/// The HF peer: `safe_open` on every shard, listing its keys, in one Python process per run
/// (timed inside Python, so interpreter start-up and imports are not counted). Peak RSS is
/// `VmHWM`, of the interpreter's own memory map: `ru_maxrss` carries across `exec` the high-water
/// mark of the bench process it was forked from (6.9 GB after the main cells).
const HF_SCRIPT: &str = r#"import sys, time
from safetensors import safe_open
t = time.perf_counter()
n = 0
for path in sys.argv[1:]:
    with safe_open(path, framework="numpy") as f:
        n += len(list(f.keys()))
seconds = time.perf_counter() - t
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM:")][0].split()[1]
print(seconds, n, int(hwm) * 1024)
"#;

fn hf_safe_open(
    config: &BenchConfig,
    python: Result<&Path, String>,
    fixture: &MoeFixture,
    runs: usize,
) -> Result<MoeCell> {
    let name = "HF safe_open header reads (python, keys of every shard)";
    let python = match python {
        Ok(p) => p,
        Err(why) => return Ok(MoeCell::not_run(name, "skipped", why)),
    };
    if let Err(why) = crate::python::importable(python, &["safetensors", "numpy"]) {
        return Ok(MoeCell::not_run(
            name,
            "skipped",
            format!("{} cannot import safetensors: {why}", python.display()),
        ));
    }
    std::fs::create_dir_all(&config.out_dir)?;
    let script = config.out_dir.join("hf_safe_open_keys.py");
    crate::writer::write_text(&script, HF_SCRIPT)?;
    let mut ms = Vec::new();
    let mut rss = 0u64;
    for i in 0..=runs {
        let out = Command::new(python).arg(&script).args(&fixture.files).output()?;
        if !out.status.success() {
            bail!("python failed: {}", String::from_utf8_lossy(&out.stderr).trim());
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let mut it = text.split_whitespace();
        let seconds: f64 = it.next().context("python printed nothing")?.parse()?;
        let keys: usize = it.next().context("python printed no key count")?.parse()?;
        let peak: u64 = it.next().context("python printed no RSS")?.parse()?;
        if keys != fixture.tensors {
            bail!("python listed {keys} keys, the fixture has {}", fixture.tensors);
        }
        if i > 0 {
            ms.push(seconds * 1e3);
            rss = rss.max(peak);
        }
    }
    let mut c = MoeCell::ok(name, &ms);
    c.peak_rss_bytes = Some(rss);
    Ok(c)
}

/// Run this binary as a probe: `(seconds, peak RSS bytes)` of one `what` (`open`, `inspect`).
fn run_probe(what: &str, dir: &Path) -> Result<(f64, u64)> {
    let exe = std::env::current_exe()?;
    let out = Command::new(exe).arg(PROBE_ARG).arg(what).arg(dir).output()?;
    if !out.status.success() {
        bail!("probe {what} failed: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let mut it = text.split_whitespace();
    let seconds: f64 = it.next().context("probe printed nothing")?.parse()?;
    let peak: u64 = it.next().context("probe printed no RSS")?.parse()?;
    Ok((seconds, peak))
}

/// When this process was started as a probe (`tensora-bench --moe-probe open|inspect|inspect-stream
/// DIR`, or `read|load FILE`), do that one thing, print `seconds peak_rss_bytes` (`load`: its
/// report as JSON), and return the exit code; otherwise `None`. `inspect` builds the whole `Inspection` and writes it as JSON to a
/// sink; `inspect-stream` writes the same JSON through `Inspection::write_json`, as
/// `tensora inspect DIR --json` does.
pub fn probe_main() -> Option<ExitCode> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [flag, what, dir] = args.as_slice() else { return None };
    if flag != PROBE_ARG {
        return None;
    }
    if what == many_small::LOAD_PROBE {
        // Prints the load's report (JSON) itself.
        return Some(match many_small::load_probe(Path::new(dir)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::FAILURE
            }
        });
    }
    let t = Instant::now();
    let done = match what.as_str() {
        "open" => tensora_format::open(dir).map(|c| c.tensors().len()).map_err(anyhow::Error::from),
        "inspect" => tensora_format::open(dir).map_err(anyhow::Error::from).and_then(|c| {
            serde_json::to_writer(
                std::io::BufWriter::new(std::io::sink()),
                &tensora_format::Inspection::of(&c),
            )?;
            Ok(c.tensors().len())
        }),
        "inspect-stream" => tensora_format::open(dir).map_err(anyhow::Error::from).and_then(|c| {
            tensora_format::Inspection::write_json(&c, std::io::BufWriter::new(std::io::sink()))?;
            Ok(c.tensors().len())
        }),
        many_small::READ_PROBE => many_small::read_probe(&PathBuf::from(dir)),
        other => Err(anyhow::anyhow!("unknown probe {other:?}")),
    };
    let seconds = t.elapsed().as_secs_f64();
    match done.and_then(|_| peak_rss_bytes()) {
        Ok(peak) => {
            println!("{seconds} {peak}");
            Some(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            Some(ExitCode::FAILURE)
        }
    }
}

/// `VmHWM` of this process.
fn peak_rss_bytes() -> Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).context("no VmHWM in /proc/self/status")?;
    let kb: u64 = line.split_whitespace().nth(1).context("VmHWM without a value")?.parse()?;
    Ok(kb * 1024)
}

/// Write `moe.json` and `moe.md` into `dir`; returns their paths.
pub fn write_reports(report: &MoeReport, dir: &Path) -> Result<Vec<PathBuf>> {
    let json = dir.join("moe.json");
    let md = dir.join("moe.md");
    crate::writer::write_text(&json, &serde_json::to_string_pretty(report)?)?;
    crate::writer::write_text(&md, &report.to_markdown())?;
    Ok(vec![json, md])
}

impl MoeReport {
    /// A Markdown table of the cells.
    pub fn to_markdown(&self) -> String {
        let f = &self.fixture;
        let mut out = format!(
            "## MoE scale: {} ({} tensors, {} shards, {:.1} MB of headers, {:.1} MB index)\n\n\
             Selections: `{}` (one expert), `{}` (one layer). {} timed runs per cell, page cache warm.\n\n\
             | cell | median ms | min..max ms | peak RSS MiB | goal | met |\n|---|---|---|---|---|---|\n",
            fixture::NAME,
            f.tensors,
            f.files.len(),
            f.header_bytes as f64 / 1e6,
            f.index_bytes as f64 / 1e6,
            self.selections.first().map_or("", String::as_str),
            self.selections.get(1).map_or("", String::as_str),
            self.runs
        );
        for c in &self.cells {
            let (median, range) = match (&c.ms, &c.reason) {
                (Some(s), _) => (format!("{:.1}", s.median), format!("{:.1}..{:.1}", s.min, s.max)),
                (None, reason) => (c.status.clone(), reason.clone().unwrap_or_default()),
            };
            let rss =
                c.peak_rss_bytes.map_or(String::new(), |b| format!("{:.1}", b as f64 / (1 << 20) as f64));
            let met = c.met.map_or(String::new(), |m| if m { "yes".into() } else { "no".into() });
            out.push_str(&format!(
                "| {} | {median} | {range} | {rss} | {} | {met} |\n",
                c.name,
                c.goal.as_deref().unwrap_or("")
            ));
        }
        out
    }
}
