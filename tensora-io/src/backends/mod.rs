//! The built-in [`IoBackend`](crate::IoBackend)s, one file each, and the [`registry`] that names
//! them. Every backend runs on the shared worker runtime (`runtime.rs`: the job check, one work
//! cursor per file queue, scoped workers) and the shared per-read rules (`read_progress`); no
//! backend imports another.
//!
//! | backend | file | how it reads |
//! |---|---|---|
//! | `sync` | [`sync`] | scoped threads doing positional `pread`s (warm loads: what `auto` picks) |
//! | `io-uring` | [`uring`] | one ring per worker, deep queues, `O_DIRECT` (cold loads) |
//! | `mmap` | [`mmap`] | copies out of read-only mappings with worker threads |
//! | `async` | [`async_tokio`] | positional reads on tokio's blocking pool (feature `async`) |

#[cfg(feature = "async")]
pub mod async_tokio;
pub mod mmap;
pub(crate) mod read_progress;
pub mod registry;
pub(crate) mod runtime;
pub mod sync;
pub mod uring;

pub use runtime::DIRECT_BLOCK_BYTES;
