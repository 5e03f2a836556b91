//! The data plane of Tensora: execute a load plan against checkpoint files into memory, as fast as
//! the disk and memory allow, with bounded memory and strict checks.
//!
//! - [`load`], [`load_streaming`], [`load_path`] and [`async_load::load_async`]: the load API
//!   ([`LoadOptions`] in, [`Loaded`] / [`LoadReport`] out, [`LoadError`] naming path, offset and
//!   tensor on failure).
//! - [`IoBackend`]: how a plan is executed. Built in: `sync` ([`sync`]), `mmap` ([`mmap`]),
//!   `io-uring` ([`uring`]) and `async` ([`async_load`]), listed in [`registry`]. Adding one is a
//!   file implementing the trait plus one line in the registry, or
//!   [`BackendChoice::Custom`] from outside the crate (`examples/custom_backend.rs`).
//! - [`Destination`]: where bytes land: the hugepage [`arena::Arena`] or caller memory
//!   ([`dest::CallerBuffer`]).
//! - [`auto`] and [`probe`]: the measured facts behind `--backend auto`.
//! - [`fault`]: test support that injects I/O faults below a backend.
//!
//! ```
//! let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/fixtures/serverlessllm/tiny");
//! let loaded = tensora_io::load_path(std::path::Path::new(dir), &tensora_io::LoadOptions::default())?;
//! let t = loaded.tensor("layers.0.norm.weight").expect("present");
//! assert_eq!(t.as_slice::<f32>()?.len(), 64);
//! assert!(loaded.report().reason.len() > 0);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod alloc;
pub mod arena;
pub mod async_load;
pub mod auto;
pub mod backend;
pub mod convert;
pub mod dest;
pub mod error;
pub mod fault;
pub mod load;
pub mod mmap;
pub mod probe;
pub mod read_progress;
pub mod registry;
pub mod report;
pub mod sync;
pub mod uring;

pub use backend::{
    CompletionSink, Destination, IoBackend, IoStats, Job, JobConfig, Landed, ReadError, ReadErrorKind,
    ReadTarget, SourceFile, StopReason,
};
pub use error::{BoxError, LoadError, ViewError};
pub use load::{
    ArenaReuse, BackendChoice, Element, IoMode, LoadOptions, Loaded, PieceRef, ProgressHook, ReadHook,
    Residence, TensorHook, TensorRef, load, load_path, load_streaming,
};
pub use report::{LoadReport, Phases};

/// The README's Rust examples, compiled as doctests so they cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;
