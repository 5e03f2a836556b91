//! The load API: [`load`] (owned, every tensor in one hugepage arena), [`load_streaming`] (each
//! tensor handed to a callback as soon as it lands, arena space recycled) and [`load_path`].
//!
//! One load:
//! 1. the selection (and priority) picks tensors;
//! 2. `auto` (or the caller) picks a backend and buffered/direct I/O from measured facts;
//! 3. each file is opened once (at most [`LoadOptions::files_open_max`] at a time), `fstat`ed and
//!    compared with the stamp taken at parse time, and refused if sparse;
//! 4. `tensora-plan` turns the tensors into per-file read queues; the backend drains them into the
//!    arena; every completed read decrements its tensors' outstanding-read counts, and the worker
//!    that completes a tensor calls [`LoadOptions::on_tensor`];
//! 5. every file is `fstat`ed (descriptor) and `stat`ed (path) again: a size, mtime or inode change
//!    fails the load. A `Loaded` never has missing bytes.
//!
//! Each step is a function of `session.rs`, in this order, so that file reads as a load runs.
//!
//! # Example
//!
//! ```
//! use tensora_io::{load, LoadOptions};
//! let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/serverlessllm/tiny");
//! let ckpt = tensora_format::sllm::open_dir(std::path::Path::new(dir))?;
//! let loaded = load(&ckpt, &LoadOptions::default())?;
//! assert_eq!(loaded.len(), ckpt.tensors().len());
//! for t in loaded.tensors() {
//!     assert_eq!(t.bytes().len() as u64, t.info().len_bytes());
//! }
//! println!("{} via {}: {}", loaded.report().gbps, loaded.report().backend, loaded.report().reason);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod ahead;
mod cast;
mod decide;
mod files;
mod loaded;
mod mapped;
mod options;
mod run;
mod runs;
mod session;
mod share;
mod sliced;
mod streaming;

#[cfg(feature = "async")]
mod async_load;

use std::path::Path;
use std::time::Instant;

#[cfg(feature = "async")]
pub use async_load::load_async;
pub use cast::CAST_ALIGN_BYTES;
pub(crate) use files::open_regular_file;
pub use loaded::{Element, Loaded, TensorRef};
pub use options::{
    ArenaReuse, BackendChoice, FilesUnchanged, IoMode, LoadOptions, ON_READ_STEP_BYTES, PieceRef,
    ProgressHook, ReadHook, Residence, SPARSE_MIN_LEN_BYTES, SPARSE_RATIO, TensorHook, UnknownBackend,
};
pub use runs::{Runs, load_runs};
pub use session::load;
pub use share::{ShareLoad, ShareOf, ShareRuns, load_share, load_share_runs};
pub use sliced::{ShardRead, shard_reads};
pub use streaming::{COLD_MAPPED_RUN_BYTES_MAX, STREAM_LOOKAHEAD_BYTES, load_streaming};

use crate::error::LoadError;

/// Open, parse and load `path` (a safetensors file, a sharded directory or index, or a
/// ServerlessLLM directory). Fills the `parse` phase of the report.
pub fn load_path(path: &Path, opts: &LoadOptions) -> Result<Loaded, LoadError> {
    let t = Instant::now();
    let ckpt = tensora_format::open(path)?;
    let parse = t.elapsed().as_secs_f64();
    let mut loaded = load(&ckpt, opts)?;
    loaded.report.phases.parse = parse;
    loaded.report.finalize();
    Ok(loaded)
}
