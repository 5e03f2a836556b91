//! Saving tensors as safetensors (one file, or HF-style shards with their index) at the speed of
//! the disk, atomically, with the manifest's digests computed in the same pass.
//!
//! [`save_safetensors`] and [`save_sharded`] take any [`SaveSource`]: tensors in memory
//! ([`MemoryTensors`]: borrowed slices, or a `tensora_io::Loaded`), or a source that reads them
//! on demand ([`crate::sources::CheckpointSource`], or your own), so memory stays bounded by the
//! writer's staging buffers (at most [`STAGING_BYTES_MAX`]). The same writer runs
//! [`crate::convert`].
//!
//! How it writes (`engine`): the layout is computed first, so every byte's offset is known;
//! worker threads take pieces of the files in file order (aligned, [`PIECE_BYTES_DEFAULT`] each),
//! fill them, digest their tensor bytes while they are in cache ([`SaveOptions::manifest`]), and
//! `pwrite` them at their offsets, with `O_DIRECT` or through the page cache as chosen from the
//! facts (`mode`: the choice and its reason are in the [`SaveReport`]). The header is written
//! last, then the file is `fsync`ed and only then given its name (`output`: `O_TMPFILE` linked in,
//! or a temporary name renamed; then the directory is `fsync`ed). A process killed at any point
//! leaves the previous file (or nothing) at the destination, never a torn one; a full disk is
//! [`ConvertError::NoSpace`](crate::ConvertError::NoSpace), and the temporary file goes with it.
//!
//! ```
//! use std::collections::BTreeMap;
//! use tensora_convert::{MemoryTensors, SaveOptions, SourceTensor, save_safetensors};
//! use tensora_format::Dtype;
//!
//! let dir = tempfile::tempdir()?;
//! let path = dir.path().join("model.safetensors");
//! let w: Vec<u8> = (0..24).collect();
//! let mut tensors = MemoryTensors::new();
//! tensors.push(SourceTensor::dense("w", Dtype::F32, vec![2, 3])?, &w)?;
//! let opts = SaveOptions { manifest: Some(tensora_verify::Algo::Crc32c), ..SaveOptions::default() };
//! let report = save_safetensors(&path, &tensors, &BTreeMap::new(), &opts)?;
//! assert_eq!((report.tensors, report.mode), (1, "buffered"));
//! let ckpt = tensora_format::open(&path)?;
//! assert_eq!(ckpt.tensor("w").unwrap().shape(), &[2, 3]);
//! let manifest = report.manifest.unwrap();
//! assert_eq!(manifest.tensors["w"].digest, tensora_verify::Algo::Crc32c.digest(&w));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub(crate) mod engine;
pub mod mode;
pub(crate) mod output;
pub(crate) mod plan;
pub mod source;

pub(crate) mod api;

pub use api::{safetensors_layout, save_safetensors, save_sharded, serialize_into};
pub use mode::{WriteChoice, WriteMode};
pub use output::Preallocate;
pub use plan::ALIGN_BYTES;
pub use source::{MemoryTensors, SaveSource, SourceTensor, StorageLayout, gather};

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use tensora_verify::{Algo, Manifest};

use crate::ConvertProgress;

/// Default piece: the bytes one worker fills and writes at a time.
pub const PIECE_BYTES_DEFAULT: u64 = 8 << 20;
/// Largest piece accepted.
pub const PIECE_BYTES_MAX: u64 = 64 << 20;
/// Most staging memory a save allocates (`threads × piece`; the piece shrinks to fit).
pub const STAGING_BYTES_MAX: u64 = 32 << 20;

/// A point a save reached in one output file (for logs, and for tests that stop a save there).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SaveStage {
    /// A data piece was written.
    PieceWritten,
    /// The head (the header and the first data bytes) was written, after every data piece.
    HeaderWritten,
    /// The file was `fsync`ed (not reached with [`Durability::ProcessCrashSafe`]).
    Synced,
    /// The file has its final name (and, for a save into an existing directory, the directory was
    /// synced).
    Committed,
}

/// Called at each [`SaveStage`] with the output's final path, from the writer's threads.
pub type StageHook = Arc<dyn Fn(SaveStage, &Path) + Send + Sync>;

/// How to save.
#[derive(Clone, Default)]
pub struct SaveOptions {
    /// Buffered, direct, or chosen from the facts (the default).
    pub mode: WriteChoice,
    /// Writer threads; 0 chooses (`mode::threads`).
    pub threads: usize,
    /// Bytes per piece, a multiple of [`ALIGN_BYTES`] up to [`PIECE_BYTES_MAX`]; 0 is
    /// `PIECE_BYTES_DEFAULT`. Shrunk so that `threads × piece` stays within
    /// `STAGING_BYTES_MAX`.
    pub piece_bytes: u64,
    /// Digest every tensor as it is written and return the manifest
    /// ([`SaveReport::manifest`]).
    pub manifest: Option<Algo>,
    /// Reserve each file's space before writing (the default).
    pub preallocate: Preallocate,
    /// Largest storage of a non-contiguous tensor read whole (from a source not in memory) to be
    /// gathered into row-major order; 0 is [`crate::COPY_BUFFER_BYTES_MAX`].
    pub gather_bytes_max: u64,
    /// Told `(bytes_done, bytes_total)` of tensor data after each piece, from any thread.
    pub progress: Option<ConvertProgress>,
    /// Told each [`SaveStage`].
    pub stage: Option<StageHook>,
    /// Set to stop the save ([`crate::ConvertError::Cancelled`]; nothing is left behind).
    pub cancel: Option<Arc<AtomicBool>>,
    /// What the saved files survive once the save returns ([`Durability::Synced`] by default).
    pub durability: Durability,
}

/// What a finished save survives. Both are atomic: the destination holds the previous file (or
/// nothing) until the new one is complete and renamed into place, so a crash of the process at
/// any point never leaves a torn file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// Every file and its directory are `fsync`ed before the save returns: the new file survives
    /// a power loss or kernel crash right after the save returns.
    #[default]
    Synced,
    /// Written and renamed, never synced (what HF `safetensors`' `save_file` does): survives a
    /// crash of the process; after a power loss the destination may hold the previous file,
    /// nothing, or (on filesystems without rename ordering) an empty or partial file. Writes go
    /// through the page cache (`"auto"` chooses buffered), so the save returns at memory speed.
    ProcessCrashSafe,
}

impl Durability {
    /// `"synced"` or `"process-crash-safe"`, as in reports and as parsed.
    pub fn as_str(self) -> &'static str {
        match self {
            Durability::Synced => "synced",
            Durability::ProcessCrashSafe => "process-crash-safe",
        }
    }
}

impl std::str::FromStr for Durability {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "synced" => Ok(Durability::Synced),
            "process-crash-safe" => Ok(Durability::ProcessCrashSafe),
            other => Err(format!("unknown durability {other:?} (expected synced or process-crash-safe)")),
        }
    }
}

impl std::fmt::Debug for SaveOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SaveOptions")
            .field("mode", &self.mode)
            .field("threads", &self.threads)
            .field("piece_bytes", &self.piece_bytes)
            .field("manifest", &self.manifest)
            .field("preallocate", &self.preallocate)
            .field("gather_bytes_max", &self.gather_bytes_max)
            .field("progress", &self.progress.is_some())
            .field("stage", &self.stage.is_some())
            .field("cancel", &self.cancel.is_some())
            .field("durability", &self.durability)
            .finish()
    }
}

/// What a save did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SaveReport {
    /// The file or directory written.
    pub destination: PathBuf,
    /// Files written (shards and index included).
    pub files_written: usize,
    /// Tensors written.
    pub tensors: usize,
    /// Tensor data bytes written.
    pub tensor_bytes: u64,
    /// Bytes of every file written (headers, padding and indexes included).
    pub bytes_written: u64,
    /// `"direct"` or `"buffered"`.
    pub mode: &'static str,
    /// Why that mode: the deciding facts, in one line.
    pub reason: String,
    /// Writer threads.
    pub threads: usize,
    /// Bytes per piece.
    pub piece_bytes: u64,
    /// Staging memory the writers allocated.
    pub staging_bytes: u64,
    /// Files whose `O_DIRECT` writes were refused part-way and finished buffered.
    pub direct_fallbacks: usize,
    /// Wall-clock seconds of the whole save (layout, writes, syncs, renames).
    pub seconds: f64,
    /// `bytes_written / seconds`, in GB/s (10^9 bytes).
    pub gbps: f64,
    /// `"synced"` or `"process-crash-safe"` ([`Durability`]).
    pub durability: &'static str,
    /// Seconds until every file was written (and synced, with [`Durability::Synced`]).
    pub write_seconds: f64,
    /// Seconds of naming the files and syncing their directories.
    pub commit_seconds: f64,
    /// The digest algorithm of [`SaveReport::manifest`], if one was asked for.
    pub digest_algo: Option<&'static str>,
    /// The manifest of the files written (digests computed while writing), when asked for.
    #[serde(skip)]
    pub manifest: Option<Manifest>,
}
