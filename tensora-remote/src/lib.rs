//! Load checkpoints from object stores and HTTP servers at wire speed ([`schemes`] lists every
//! store).
//!
//! - [`Location`]: a file or a directory (`s3://bucket/prefix/`, `https://host/path/`) in one of
//!   the stores [`schemes`] lists, the one list of them (made from the crate's table of stores,
//!   `stores/`). [`StoreConfig`]: endpoint, plain HTTP, anonymous, credentials; each store's
//!   environment variables otherwise ([`Scheme::credentials`]).
//! - [`open_remote`]: the index and every safetensors header through ranged reads (the first 8
//!   bytes, then exactly `n` more) into a [`RemoteCheckpoint`]: a real `tensora_format::Checkpoint`
//!   (assembled by `tensora_format::assemble` under the local rules) plus each object's version.
//!   A directory follows the local rules: `tensor_index.json` (ServerlessLLM, partitions
//!   `tensor.data_N` probed with HEAD) wins, then the one `*.safetensors.index.json`; on an object store
//!   the prefix is listed (then unindexed `*.safetensors` shards too), on HTTP the names are probed.
//! - [`RemoteCheckpoint::load`] / [`RemoteCheckpoint::load_streaming`] / [`load_remote`]:
//!   `tensora_io::load` and `load_streaming` with a [`RemoteBackend`], so selection, priority,
//!   streaming, hooks and the report are those of a local load. The backend fetches ~8 MiB planned
//!   reads, one queue across all shards, a bounded number in flight, each body streamed straight
//!   into the read's slice of the destination. Every range carries `If-Match` with the ETag seen at
//!   open (or `If-Unmodified-Since`), and the response's ETag and size are compared too. Broken
//!   bodies are resumed where they stopped, under a bounded [`RetryPolicy`].
//! - [`Cache`]: a verified local copy of every object; every byte served from it equals the
//!   CRC-32C recorded when it arrived.
//! - [`verify`] / [`digests`]: `tensora verify URL` and `tensora hash URL` as library calls.
//!
//! ```
//! use tensora_remote::{Landing, Location, RemoteOptions};
//! let loc = Location::parse("s3://weights/llama-3-8b/")?;
//! assert!(loc.is_remote() && loc.is_dir());
//! let opts = RemoteOptions::default();
//! // 128 ranges of 8 MiB for a whole load; a streamed one holds at most 256 MiB in flight.
//! assert_eq!(opts.inflight_bytes_max(Landing::Whole), Some(128 * (8 << 20)));
//! assert_eq!(opts.inflight_bytes_max(Landing::Window), Some(256 << 20));
//! # Ok::<(), tensora_remote::RemoteError>(())
//! ```
// One read of a held piece's memory is `unsafe`, allowed where its promise is argued: `cache::seal`.
#![deny(unsafe_code)]
#![warn(missing_docs)]

mod backend;
mod cache;
mod checkpoint;
mod client;
mod crc;
mod error;
mod fetch;
mod load;
mod location;
mod rebuild;
mod redact;
mod retry_after;
mod stores;
#[cfg(test)]
mod test_store;
mod tune;
mod verify;

pub use backend::RemoteBackend;
#[doc(hidden)]
pub use cache::fuzzing;
pub use cache::{
    Cache, CacheOptions, CacheReport, CacheSync, CacheWrites, CachedObject, LANE_THREADS, LOCKS_HELD_MAX,
    PIECE_BYTES, RECORDS_MAX, RangeRecord, VerifiedObject, WRITE_BEHIND_BYTES, WRITER_THREADS,
};
pub use checkpoint::{HEADER_FIRST_READ_BYTES, RemoteCheckpoint};
pub use error::RemoteError;
pub use fetch::{RemoteObject, RetryPolicy, Unversioned};
pub use load::{
    Landing, READS_INFLIGHT_LIMIT, RUNTIME_THREADS_LIMIT, RemoteLoaded, RemoteOptions, RemoteReport,
    load_remote, open_remote,
};
pub use location::{Location, StoreConfig};
pub use redact::redact;
pub use stores::{Scheme, schemes};
pub use tune::{Probe, TuneReport, Tuning, range_bytes};
pub use verify::{DigestError, digests, verify};
