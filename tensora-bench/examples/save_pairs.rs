//! The save pairs alone (`tensora_bench::save`), on the TinyLlama-shaped fixture and its
//! ServerlessLLM conversion only (the other fixtures are not generated):
//!
//! ```text
//! cargo run --release -p tensora-bench --example save_pairs -- [--size small|full] [--runs N]
//! ```
//!
//! Writes `save-pairs.json` beside the fixtures' directory.
#![forbid(unsafe_code)]

use anyhow::{Context, Result};
use tensora_bench::MemoryState;
use tensora_bench::{BenchConfig, PlanKind};
use tensora_bench::{DEFAULT_SEED, Size};

fn main() -> Result<()> {
    let mut size = Size::Full;
    let mut runs = 5;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--size" => size = if args.next().as_deref() == Some("small") { Size::Small } else { Size::Full },
            "--runs" => runs = args.next().context("--runs N")?.parse()?,
            other => anyhow::bail!("unknown argument {other:?}"),
        }
    }
    let target =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| "target".into(), std::path::PathBuf::from);
    let config = BenchConfig {
        out_dir: target.join("tensora-bench"),
        size,
        runs,
        pair_runs: runs,
        cold: false,
        plan: PlanKind::Default,
        seed: DEFAULT_SEED,
        child_exe: std::env::current_exe()?,
        memory: MemoryState::Relay,
    };
    config.validate()?;
    let started = std::time::Instant::now();
    let mut log = |line: &str| eprintln!("[save-pairs +{:.1}s] {line}", started.elapsed().as_secs_f64());
    let dir = config.fixtures_dir();
    std::fs::create_dir_all(&dir)?;
    let spec =
        tensora_bench::specs(size, config.seed).into_iter().find(|s| s.name == tensora_bench::TINYLLAMA);
    let main = tensora_bench::ensure_fixture(&dir, &spec.context("no TinyLlama spec")?, size, config.seed)?;
    let sllm = tensora_bench::ensure_sllm(&dir, &main, size, config.seed)?;
    let pairs = tensora_bench::measure_save_pairs(&config, &[main, sllm], &mut log)?;
    for p in &pairs {
        println!("{}", p.line());
    }
    let path = config.out_dir.join("save-pairs.json");
    tensora_bench::write_text(&path, &serde_json::to_string_pretty(&pairs)?)?;
    eprintln!("wrote {}", path.display());
    Ok(())
}
