//! Benchmark harness for Tensora: generated fixtures, rooflines, peers and reports.
//!
//! `cargo xtask bench` builds the `tensora-bench` binary in release mode and runs it. In one run it
//! generates (or reuses) the fixtures, finds the Python peers' environment (the venv `cargo xtask
//! provision --python` fills: [`python`]), measures the machine's rooflines, every loader and every peer on the same
//! files, warm and cold, in two situations ([`report::Situation`]: (a) the first load of a fresh
//! process, each sample a child process of its own, and (b) a repeat load in a process that
//! already loaded once), runs the paired acceptance runs, and writes `report.md`, `report.json`
//! and `report.svg`. The default plan takes a few minutes; `--full` measures the whole matrix
//! ([`cells`]).
//!
//! The pieces are usable on their own: generate a fixture, time a loader on it, summarise.
//!
//! ```
//! use tensora_bench::{bench, fixtures, peers, stats::Summary};
//!
//! let dir = tempfile::tempdir()?;
//! let dims = fixtures::LlamaDims { vocab: 256, hidden: 64, intermediate: 176, layers: 2, kv_dim: 16 };
//! let spec = fixtures::FixtureSpec {
//!     name: "tiny".into(),
//!     files: vec![fixtures::FileSpec { file_name: "model.safetensors".into(), tensors: dims.tensors() }],
//!     index: false,
//! };
//! let fixture = fixtures::ensure(dir.path(), &spec, fixtures::Size::Small, 42)?;
//! assert!(fixture.generated);
//! assert_eq!(fixture.tensors, 3 + 9 * 2);
//!
//! // One warm-up, then 3 timed runs of the safetensors-rs peer.
//! let samples = bench::measure(3, None, || Ok(peers::st_read(&fixture.data_files, None)?.0.bytes))?;
//! assert!(samples.iter().all(|s| s.bytes == fixture.data_len_bytes));
//! let gbps = Summary::of(&samples.iter().map(|s| s.gbps).collect::<Vec<_>>()).unwrap();
//! assert!(gbps.min <= gbps.median && gbps.median <= gbps.max);
//! # Ok::<(), anyhow::Error>(())
//! ```
// `unsafe` only where the bench maps its own fixtures (`loaders::fixtures_unchanged`) and
// reserves the write roofline's file (`save::reserve`).
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod bench;
pub mod cache;
pub mod cells;
mod chart;
pub mod child;
pub mod fixtures;
pub mod loaders;
mod markdown;
pub mod memory;
pub mod moe;
pub mod paired;
pub mod peers;
pub mod progress;
pub mod python;
pub mod report;
pub mod rng;
pub mod roofline;
pub mod save;
pub mod stats;
pub mod torch_peers;
pub mod versus;
pub mod writer;
