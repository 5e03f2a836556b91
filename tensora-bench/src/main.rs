//! `tensora-bench`: the whole offline bench in one run. `cargo xtask bench` builds it in release
//! mode and runs it; see the crate docs of `tensora_bench` for what it measures.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use tensora_bench::bench::{self, BenchConfig, RUNS_DEFAULT, RUNS_QUICK};
use tensora_bench::fixtures::{DEFAULT_SEED, Size};

/// Measure every Tensora backend against the machine's rooflines and against peers.
#[derive(Debug, Parser)]
#[command(name = "tensora-bench", version)]
struct Args {
    /// Small fixtures, 3 runs, a subset of the cells (for CI).
    #[arg(long)]
    quick: bool,
    /// Fixture size (default: full, or small with --quick).
    #[arg(long, value_enum)]
    size: Option<Size>,
    /// Timed runs per cell, after one warm-up (default: 5, or 3 with --quick).
    #[arg(long)]
    runs: Option<usize>,
    /// Run the cold-cache cells (the default).
    #[arg(long, overrides_with = "no_cold")]
    cold: bool,
    /// Skip the cold-cache cells.
    #[arg(long)]
    no_cold: bool,
    /// Where fixtures and reports go (default: $CARGO_TARGET_DIR/tensora-bench or
    /// target/tensora-bench).
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
}

fn main() -> ExitCode {
    if let Some(code) = tensora_bench::moe::probe_main() {
        return code;
    }
    let args = Args::parse();
    let out_dir = args.out_dir.clone().unwrap_or_else(|| {
        let target =
            std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| PathBuf::from("target"), PathBuf::from);
        target.join("tensora-bench")
    });
    let config = BenchConfig {
        out_dir,
        size: args.size.unwrap_or(if args.quick { Size::Small } else { Size::Full }),
        runs: args.runs.unwrap_or(if args.quick { RUNS_QUICK } else { RUNS_DEFAULT }),
        cold: !args.no_cold,
        quick: args.quick,
        seed: args.seed,
    };
    let result = if args.replot {
        replot(&config.out_dir)
    } else if args.pairs_only {
        pairs_only(&config)
    } else if args.moe_only {
        moe(&config)
    } else {
        run(&config, args.fixtures_only)
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn replot(out_dir: &std::path::Path) -> anyhow::Result<()> {
    use anyhow::Context;
    let path = out_dir.join("report.json");
    let text = std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?;
    let report: tensora_bench::report::Report =
        serde_json::from_str(&text).with_context(|| format!("parse {}", path.display()))?;
    for p in bench::write_reports(&report, out_dir)? {
        eprintln!("[tensora-bench] wrote {}", p.display());
    }
    println!("{}", report.to_markdown());
    Ok(())
}

fn pairs_only(config: &BenchConfig) -> anyhow::Result<()> {
    config.validate()?;
    let started = std::time::Instant::now();
    let mut log = |line: &str| eprintln!("[tensora-bench +{:.1}s] {line}", started.elapsed().as_secs_f64());
    let prepared = bench::prepare_fixtures(config, &mut log)?;
    let pairs = bench::measure_acceptance_pairs(config, &prepared.fixtures, &mut log)?;
    for p in &pairs {
        println!("{}", p.line());
    }
    let dir = config.report_dir();
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("pairs.json");
    tensora_bench::writer::write_text(&path, &serde_json::to_string_pretty(&pairs)?)?;
    eprintln!("[tensora-bench] wrote {}", path.display());
    Ok(())
}

fn run(config: &BenchConfig, fixtures_only: bool) -> anyhow::Result<()> {
    config.validate()?;
    let started = std::time::Instant::now();
    let mut log = |line: &str| eprintln!("[tensora-bench +{:.1}s] {line}", started.elapsed().as_secs_f64());
    if fixtures_only {
        let prepared = bench::prepare_fixtures(config, &mut log)?;
        for f in &prepared.fixtures {
            println!("{}\t{}", f.name, f.open_path.display());
        }
        for (name, why) in &prepared.skipped {
            println!("{name}\tskipped: {why}");
        }
        return Ok(());
    }
    let report = bench::run(config, &mut log)?;
    let report_dir = config.report_dir();
    std::fs::create_dir_all(&report_dir)?;
    let paths = bench::write_reports(&report, &report_dir)?;
    println!("{}", report.to_markdown());
    for p in paths {
        eprintln!("[tensora-bench] wrote {}", p.display());
    }
    moe(config)
}

/// The MoE-scale cells, written beside the main reports.
fn moe(config: &BenchConfig) -> anyhow::Result<()> {
    config.validate()?;
    let started = std::time::Instant::now();
    let mut log = |line: &str| eprintln!("[tensora-bench +{:.1}s] {line}", started.elapsed().as_secs_f64());
    let report = tensora_bench::moe::run(config, &mut log)?;
    let dir = config.report_dir();
    std::fs::create_dir_all(&dir)?;
    println!("{}", report.to_markdown());
    for p in tensora_bench::moe::write_reports(&report, &dir)? {
        eprintln!("[tensora-bench] wrote {}", p.display());
    }
    Ok(())
}
