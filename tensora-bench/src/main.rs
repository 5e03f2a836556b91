//! `tensora-bench`: the whole offline bench in one run. `cargo xtask bench` builds it in release
//! mode and runs it; see the crate docs of `tensora_bench` for what it measures.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use tensora_bench::{BenchConfig, PAIR_RUNS_DEFAULT, PlanKind, RUNS_DEFAULT, RUNS_QUICK};
use tensora_bench::{DEFAULT_SEED, Size};
use tensora_bench::{IDLE_SECONDS_MAX, MemoryState};

/// Measure Tensora against the machine's rooflines and against peers, in a fresh process (the
/// first load) and in a process that already loaded once (a repeat load).
#[derive(Debug, Parser)]
#[command(name = "tensora-bench", version)]
struct Args {
    /// Small fixtures, 3 runs, a subset of the cells (for CI).
    #[arg(long, conflicts_with = "full")]
    quick: bool,
    /// The whole matrix: every fixture, backend, scope and mode (the default measures the main
    /// fixture: `auto`, the peers and the rooflines in both situations, and the paired runs).
    #[arg(long)]
    full: bool,
    /// Fixture size (default: full, or small with --quick).
    #[arg(long, value_enum)]
    size: Option<Size>,
    /// Timed runs per cell, one per round (default: 3).
    #[arg(long)]
    runs: Option<usize>,
    /// Timed pairs of each paired acceptance run (default: 7, or 3 with --quick).
    #[arg(long)]
    pair_runs: Option<usize>,
    /// Run the cold-cache cells (the default).
    #[arg(long, overrides_with = "no_cold")]
    cold: bool,
    /// Skip the cold-cache cells.
    #[arg(long)]
    no_cold: bool,
    /// Where fixtures and reports go (default: $CARGO_TARGET_DIR/tensora-bench
    /// or target/tensora-bench).
    #[arg(long)]
    out_dir: Option<PathBuf>,
    /// Seed of the fixture data.
    #[arg(long, default_value_t = DEFAULT_SEED)]
    seed: u64,
    /// Only generate (or check) the fixtures.
    #[arg(long, conflicts_with = "replot")]
    fixtures_only: bool,
    /// Only the paired acceptance runs on the main fixture (see `tensora_bench::paired`); writes
    /// pairs.json beside the reports.
    #[arg(long, conflicts_with_all = ["replot", "fixtures_only"])]
    pairs_only: bool,
    /// Measure nothing: re-render report.md and report.svg from the existing report.json.
    #[arg(long)]
    replot: bool,
    /// Only the MoE-scale cells (`tensora_bench::moe`); writes moe.json and moe.md.
    #[arg(long, conflicts_with_all = ["replot", "fixtures_only", "pairs_only"])]
    moe_only: bool,
    /// Start each child process after this many idle seconds, on memory that stayed free (the
    /// default, 0, starts each on memory the bench freed a moment before: see
    /// `tensora_bench::memory`).
    #[arg(long, default_value_t = 0)]
    idle_seconds: u64,
    /// Internal: run one subject in this process (the bench starts itself this way).
    #[arg(long = "child-spec", hide = true)]
    child_spec: Option<String>,
}

fn main() -> ExitCode {
    if let Some(code) = tensora_bench::moe_probe_main() {
        return code;
    }
    let args = Args::parse();
    if let Some(spec) = &args.child_spec {
        return match tensora_bench::child_main(spec) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    let result = config(&args).and_then(|config| {
        if args.replot {
            replot(&config.report_dir())
        } else if args.pairs_only {
            pairs_only(&config)
        } else if args.moe_only {
            moe(&config, &mut logger())
        } else {
            run(&config, args.fixtures_only)
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn config(args: &Args) -> anyhow::Result<BenchConfig> {
    let out_dir = args.out_dir.clone().unwrap_or_else(|| {
        let target =
            std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| PathBuf::from("target"), PathBuf::from);
        target.join("tensora-bench")
    });
    let plan = match (args.quick, args.full) {
        (true, _) => PlanKind::Quick,
        (false, true) => PlanKind::Full,
        (false, false) => PlanKind::Default,
    };
    Ok(BenchConfig {
        out_dir,
        size: args.size.unwrap_or(if args.quick { Size::Small } else { Size::Full }),
        runs: args.runs.unwrap_or(if args.quick { RUNS_QUICK } else { RUNS_DEFAULT }),
        pair_runs: args.pair_runs.unwrap_or(if args.quick { RUNS_QUICK } else { PAIR_RUNS_DEFAULT }),
        cold: !args.no_cold,
        plan,
        seed: args.seed,
        child_exe: std::env::current_exe()?,
        memory: match args.idle_seconds {
            0 => MemoryState::Relay,
            seconds if seconds <= IDLE_SECONDS_MAX => MemoryState::Idle { seconds },
            seconds => anyhow::bail!("--idle-seconds must be at most {IDLE_SECONDS_MAX}, got {seconds}"),
        },
    })
}

/// The log: one line per step on stderr, after clearing a progress bar on a terminal.
fn logger() -> impl FnMut(&str) {
    use std::io::IsTerminal;
    let started = std::time::Instant::now();
    let terminal = std::io::stderr().is_terminal();
    move |line: &str| {
        if terminal {
            eprint!("\r\x1b[2K");
        }
        eprintln!("[tensora-bench +{:.1}s] {line}", started.elapsed().as_secs_f64());
    }
}

fn replot(report_dir: &std::path::Path) -> anyhow::Result<()> {
    use anyhow::Context;
    let path = report_dir.join("report.json");
    let text = std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?;
    let mut report: tensora_bench::Report =
        serde_json::from_str(&text).with_context(|| format!("parse {}", path.display()))?;
    report.compute_rooflines();
    for p in tensora_bench::write_reports(&report, report_dir)? {
        eprintln!("[tensora-bench] wrote {}", p.display());
    }
    println!("{}", report.to_markdown());
    Ok(())
}

fn pairs_only(config: &BenchConfig) -> anyhow::Result<()> {
    config.validate()?;
    let mut log = logger();
    let prepared = tensora_bench::prepare_fixtures(config, &mut log)?;
    let pairs = tensora_bench::measure_acceptance_pairs(config, &prepared.fixtures, &mut log)?;
    for p in &pairs {
        println!("{}", p.line());
    }
    let dir = config.report_dir();
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("pairs.json");
    tensora_bench::write_text(&path, &serde_json::to_string_pretty(&pairs)?)?;
    eprintln!("[tensora-bench] wrote {}", path.display());
    Ok(())
}

fn run(config: &BenchConfig, fixtures_only: bool) -> anyhow::Result<()> {
    config.validate()?;
    let mut log = logger();
    if fixtures_only {
        let prepared = tensora_bench::prepare_fixtures(config, &mut log)?;
        for f in &prepared.fixtures {
            println!("{}\t{}", f.name, f.open_path.display());
        }
        for (name, why) in &prepared.skipped {
            println!("{name}\tskipped: {why}");
        }
        return Ok(());
    }
    let report = tensora_bench::run(config, &mut log)?;
    let report_dir = config.report_dir();
    std::fs::create_dir_all(&report_dir)?;
    let paths = tensora_bench::write_reports(&report, &report_dir)?;
    println!("{}", report.to_markdown());
    for p in paths {
        eprintln!("[tensora-bench] wrote {}", p.display());
    }
    eprintln!(
        "[tensora-bench] {} plan measured in {} (load average {} at the start, {} at the end)",
        report.run.plan,
        tensora_bench::clock(report.run.seconds),
        report.run.load_average[0],
        report.run.load_average[1]
    );
    // A cell that errors is a bug and fails the run; a missed goal is reported, not an error.
    let failures = report.failures();
    if !failures.is_empty() {
        anyhow::bail!("{} cell(s) failed:\n  {}", failures.len(), failures.join("\n  "));
    }
    moe(config, &mut log)
}

/// The MoE-scale cells (`tensora_bench::moe`), written beside the main reports (moe.json, moe.md).
fn moe(config: &BenchConfig, log: &mut dyn FnMut(&str)) -> anyhow::Result<()> {
    config.validate()?;
    let python = tensora_bench::prepare_python(&config.out_dir, log)?;
    let report = tensora_bench::run_moe(config, python.python.as_deref().map_err(|u| u.to_string()), log)?;
    let dir = config.report_dir();
    std::fs::create_dir_all(&dir)?;
    println!("{}", report.to_markdown());
    for p in tensora_bench::write_moe_reports(&report, &dir)? {
        eprintln!("[tensora-bench] wrote {}", p.display());
    }
    Ok(())
}
