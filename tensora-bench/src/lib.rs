//! Benchmark harness for Tensora: generated fixtures, rooflines, peers and reports.
//!
//! `cargo xtask bench` builds the `tensora-bench` binary in release mode and runs it. In one run it
//! generates (or reuses) the fixtures, finds the Python peers' environment (the venv `cargo xtask
//! provision --python` fills: `python`), measures the machine's rooflines, every loader and every peer on the same
//! files, warm and cold, in two situations ([`Situation`]: (a) the first load of a fresh
//! process, each sample a child process of its own, and (b) a repeat load in a process that
//! already loaded once), runs the paired acceptance runs, and writes `report.md`, `report.json`
//! and `report.svg`. The default plan takes a few minutes; `--full` measures the whole matrix
//! (`cells.rs`).
//!
//! The pieces are usable on their own: generate a fixture, time a loader on it, summarise.
//!
//! ```
//! use tensora_bench::{FileSpec, FixtureSpec, LlamaDims, Size, Summary, ensure_fixture, measure, st_read};
//!
//! let dir = tempfile::tempdir()?;
//! let dims = LlamaDims { vocab: 256, hidden: 64, intermediate: 176, layers: 2, kv_dim: 16 };
//! let spec = FixtureSpec {
//!     name: "tiny".into(),
//!     files: vec![FileSpec { file_name: "model.safetensors".into(), tensors: dims.tensors() }],
//!     index: false,
//! };
//! let fixture = ensure_fixture(dir.path(), &spec, Size::Small, 42)?;
//! assert!(fixture.generated);
//! assert_eq!(fixture.tensors, 3 + 9 * 2);
//!
//! // One warm-up, then 3 timed runs of the safetensors-rs peer.
//! let samples = measure(3, None, || Ok(st_read(&fixture.data_files, None)?.0.bytes))?;
//! assert!(samples.iter().all(|s| s.bytes == fixture.data_len_bytes));
//! let gbps = Summary::of(&samples.iter().map(|s| s.gbps).collect::<Vec<_>>()).unwrap();
//! assert!(gbps.min <= gbps.median && gbps.median <= gbps.max);
//! # Ok::<(), anyhow::Error>(())
//! ```
// `unsafe` only where the bench maps its own fixtures (`loaders::fixtures_unchanged`) and
// reserves the write roofline's file (`save::reserve`).
#![deny(unsafe_code)]
#![warn(missing_docs)]

mod bench;
mod cache;
mod casts;
mod cells;
mod chart;
mod child;
mod fixtures;
mod loaders;
mod markdown;
mod memory;
mod moe;
mod paired;
mod peers;
mod progress;
mod python;
mod report;
mod rng;
mod roofline;
mod save;
mod stats;
mod torch_peers;
mod versus;
mod writer;

pub use bench::{
    BenchConfig, PAIR_RUNS_DEFAULT, PlanKind, Prepared, RUNS_DEFAULT, RUNS_QUICK, build_report,
    fixture_facts, measure, measure_acceptance_pairs, measure_fixtures, prepare_fixtures, run, write_reports,
};
pub use casts::memory_bound;
pub use child::child_main;
pub use fixtures::{
    DEFAULT_SEED, FileSpec, Fixture, FixtureSpec, LlamaDims, Size, TINYLLAMA, ensure as ensure_fixture, specs,
};
pub use loaders::ensure_sllm;
pub use memory::{IDLE_SECONDS_MAX, MemoryState};
pub use moe::{probe_main as moe_probe_main, run as run_moe, write_reports as write_moe_reports};
pub use peers::st_read;
pub use progress::clock;
pub use python::{PEERS, prepare as prepare_python};
pub use report::{Cache, Kind, Machine, Report, Scope, Situation, Status};
pub use rng::SplitMix64;
pub use save::measure_save_pairs;
pub use stats::Summary;
pub use writer::write_text;
