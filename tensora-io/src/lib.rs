//! The data plane of Tensora: execute a load plan against checkpoint files into memory, as fast as
//! the disk and memory allow, with bounded memory and strict checks.
//!
//! Where a byte goes, folder by folder:
//!
//! - [`load`](mod@load): the load API. [`load()`], [`load_streaming`], [`load_runs`],
//!   [`load_path`], [`load_share`] (one rank's share of a collective load) (and [`load_async`]
//!   with the `async` feature) take [`LoadOptions`] and give a
//!   [`Loaded`] or a [`LoadReport`], or a [`LoadError`] naming path, offset and tensor.
//! - [`auto`]: the measured facts ([`auto::probe`]) behind `--backend auto` and
//!   `Residence::Auto`, and the rules that read them.
//! - [`seam`]: the contract between a plan and a backend: [`Job`], [`ReadTarget`] (claim and land),
//!   [`CompletionSink`], [`Destination`], the in-flight [`Budget`].
//! - [`backends`]: the [`IoBackend`]s (`sync`, `mmap`, `io-uring`, `async`), one file each over a
//!   shared worker runtime, listed in [`registry`]. Adding one is a file plus one registry line,
//!   or [`BackendChoice::Custom`] from outside the crate (`examples/custom_backend.rs`).
//! - [`arena`]: the hugepage [`arena::Arena`] owned loads land in.
//! - [`map`]: private mappings of checkpoint files, the zero-copy views of mapped loads, and the
//!   one routine that reads mapped pages in ([`map::populate`]).
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

pub mod arena;
pub mod auto;
pub mod backends;
pub mod cast;
pub mod error;
#[cfg(feature = "fault-injection")]
pub mod fault;
pub mod fs;
pub mod load;
pub mod map;
pub mod report;
pub mod sched;
pub mod seam;

pub use backends::registry;
pub use cast::DtypeTarget;
pub use error::{BoxError, LoadError, ViewError};
#[cfg(feature = "async")]
pub use load::load_async;
pub use load::{
    ArenaReuse, BackendChoice, Element, FilesUnchanged, IoMode, LoadOptions, Loaded, PieceRef, ProgressHook,
    ReadHook, Residence, ShareLoad, ShareOf, TensorHook, TensorRef, UnknownBackend, load, load_path,
    load_runs, load_share, load_share_runs, load_streaming,
};
pub use report::{CastReport, CastTensor, LoadReport, Phases};
pub use seam::{
    Access, Budget, CompletionSink, Destination, Filled, HeldPiece, IoBackend, IoStats, Job, JobConfig,
    KeepMapped, Landed, LandedPrefix, Permit, ReadError, ReadErrorKind, ReadTarget, SourceFile, StopReason,
};

/// The README's Rust examples, compiled as doctests so they cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;
