//! The data plane of Tensora: execute a load plan against checkpoint files into memory, as fast as
//! the disk and memory allow, with bounded memory and strict checks.
//!
//! Where a byte goes, folder by folder (the folders are private; everything public is listed
//! once, at the bottom of this file):
//!
//! - `load/`: the load API. [`load()`], [`load_streaming`], [`load_runs`], [`load_path`],
//!   [`load_share`] (one rank's share of a collective load) (and `load_async` with the `async`
//!   feature) take [`LoadOptions`] and give a [`Loaded`] or a [`LoadReport`], or a [`LoadError`]
//!   naming path, offset and tensor.
//! - `auto/`: the rules behind `--backend auto` and [`Residence::Auto`], over facts `tensora_sys`
//!   measures.
//! - `seam/`: the contract between a plan and a backend: [`Job`], [`ReadTarget`] (claim and land),
//!   [`CompletionSink`], [`Destination`], the in-flight [`Budget`].
//! - `backends/`: the [`IoBackend`]s ([`SyncBackend`], [`MmapBackend`], [`UringBackend`],
//!   `AsyncBackend`), one file each over a shared worker runtime, listed in [`registry`]. Adding
//!   one is a file plus one registry line, or [`BackendChoice::Custom`] from outside the crate
//!   (`examples/custom_backend.rs`).
//! - `arena/`: the hugepage [`Arena`] owned loads land in.
//! - `map/`: private mappings of checkpoint files ([`MappedFiles`]), the zero-copy views of mapped
//!   loads, and the one routine that reads mapped pages in ([`populate()`]).
//!
//! ```
//! let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/serverlessllm/tiny");
//! let loaded = tensora_io::load_path(std::path::Path::new(dir), &tensora_io::LoadOptions::default())?;
//! let t = loaded.tensor("layers.0.norm.weight").expect("present");
//! assert_eq!(t.as_slice::<f32>()?.len(), 64);
//! assert!(loaded.report().reason.len() > 0);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Cargo features: `async` (default) adds the tokio-driven `async` backend and [`load_async`];
//! without it tensora-io does not depend on tokio. `fault-injection` adds the `fault` module,
//! test support that injects I/O faults below a backend.
#![warn(missing_docs)]

mod arena;
mod auto;
mod backends;
mod cast;
mod error;
#[cfg(feature = "fault-injection")]
mod fault;
mod load;
mod map;
mod report;
mod seam;

pub use arena::{Arena, ArenaConfig, Prefault, drop_recycled};
pub use auto::{PageCache, WARM_FRACTION, pages_fit};
#[cfg(feature = "async")]
pub use backends::async_tokio::AsyncBackend;
pub use backends::mmap::{MmapBackend, MmapConfig};
pub use backends::registry;
pub use backends::sync::{Pread, ReadAt, SyncBackend};
pub use backends::uring::{UringBackend, UringConfig, probe as uring_probe};
pub use cast::{CastError, DtypeTarget, Simd, convert, convert_with};
pub use error::{BoxError, LoadError, ViewError};
#[cfg(feature = "fault-injection")]
pub use fault::{Fault, FaultPlan, FaultySource};
#[cfg(feature = "async")]
pub use load::load_async;
pub use load::{
    ArenaReuse, BackendChoice, CAST_ALIGN_BYTES, COLD_MAPPED_RUN_BYTES_MAX, Element, FilesUnchanged, IoMode,
    LoadOptions, Loaded, ON_READ_STEP_BYTES, PieceRef, ProgressHook, ReadHook, Residence, Runs,
    STREAM_LOOKAHEAD_BYTES, ShardRead, ShareLoad, ShareOf, ShareRuns, TensorHook, TensorRef, UnknownBackend,
    load, load_path, load_runs, load_share, load_share_runs, load_streaming, shard_reads,
};
pub use map::populate::{
    POPULATE_PIECE_BYTES_MAX, PopulateConfig, PopulateError, Populated, ReadAhead, Span, populate,
};
pub use map::readahead::Prefetch;
pub use map::{FileRange, MapMode, MappedFiles};
pub use report::{CastReport, CastTensor, LoadReport, Phases, SliceCounts};
pub use seam::{
    Access, Budget, CallerBuffer, CompletionSink, Destination, Filled, HeldPiece, IoBackend, IoStats, Job,
    JobConfig, KeepMapped, Landed, LandedPrefix, Permit, ReadError, ReadErrorKind, ReadTarget, Reading,
    SourceFile, StopReason,
};

/// The README's Rust examples, compiled as doctests so they cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;
