//! Benchmark harness for Tensora: generated fixtures, rooflines, peers and reports.
//!
//! `cargo xtask bench` builds the `tensora-bench` binary in release mode and runs it. In one run it
//! generates (or reuses) the fixtures, measures the machine's rooflines on them, measures every
//! loader and peer on the same files, warm and cold, and writes `report.md`, `report.json` and
//! `report.svg`.
#![forbid(unsafe_code)]

pub mod bench;
pub mod cache;
pub mod fixtures;
pub mod loaders;
pub mod peers;
pub mod report;
pub mod rng;
pub mod roofline;
pub mod stats;
pub mod writer;
