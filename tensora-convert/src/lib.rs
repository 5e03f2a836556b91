//! Conversion between checkpoint layouts, and saving tensors, through one writer.
//!
//! [`save_safetensors`] and [`save_sharded`] write safetensors (one file, or HF-style shards and their index) from tensors in
//! memory or read on demand, at the speed of the disk: parallel positional writes of large aligned
//! pieces, `O_DIRECT` where the facts say it helps, the header last, then `fsync`, the final name
//! and a directory `fsync`; digests for a manifest are computed on the bytes as they are written.
//!
//! [`convert`] copies every tensor of a parsed [`Checkpoint`] into a new checkpoint in the
//! ServerlessLLM layout or as (optionally sharded) safetensors through the same writer, reading
//! the source with positional reads into the writer's staging buffers
//! ([`CheckpointSource`]), so memory stays bounded whatever the model's size. The output
//! is built beside the destination (an unnamed file linked in, or a temporary directory renamed
//! with `RENAME_NOREPLACE`): a failed or interrupted conversion leaves no destination.
//!
//! Dtypes are kept as they are (no casts). Tied tensors (several names on one storage, which only
//! ServerlessLLM can express) are stored once when writing ServerlessLLM and written out per name
//! for safetensors. Non-contiguous ServerlessLLM tensors are gathered into row-major order for
//! safetensors (their storage must fit [`ConvertConfig::buffer_bytes`]).
//!
//! Sources are checked like the load path checks them: each file's full parse-time stamp (size,
//! mtime, inode) is compared at open, and again after the copy with `fstat` on the descriptor and
//! `stat` on the path, before the output is committed; a source rewritten or replaced during the
//! conversion fails it with [`ConvertError::SourceChanged`] and leaves no destination.

// The syscalls std has no safe form of (`renameat2`, `linkat`, `fallocate`) are tensora-sys's.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod save;
mod sources;
mod tempdir;
#[cfg(test)]
mod tests;
mod write;

use std::fmt;
use std::fs::{self};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use tensora_format::Checkpoint;

pub use save::{
    ALIGN_BYTES, Durability, MemoryTensors, PIECE_BYTES_MAX, Preallocate, SaveOptions, SaveReport,
    SaveSource, SaveStage, SourceTensor, StageHook, StorageLayout, WriteChoice, WriteMode, gather,
    safetensors_layout, save_safetensors, save_sharded, serialize_into,
};
pub use sources::CheckpointSource;

use save::plan::FilePlan;
use tempdir::TempDir;
use write::{sllm_plans, st_plans, write_small};

/// Default bound on the storage of a non-contiguous tensor read to be gathered (64 MiB).
pub const COPY_BUFFER_BYTES_DEFAULT: usize = 64 << 20;
/// Largest gather bound accepted (256 MiB), so a conversion stays well under 512 MiB of RSS.
pub const COPY_BUFFER_BYTES_MAX: usize = 256 << 20;
/// File name of a single-file safetensors output inside the destination directory.
pub const SAFETENSORS_FILE_NAME: &str = "model.safetensors";

/// Progress callback: `(bytes_done, bytes_total)` of tensor data copied.
pub type ConvertProgress = Arc<dyn Fn(u64, u64) + Send + Sync>;

/// The layout to convert to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TargetFormat {
    /// sllm-store's `tensor_index.json` + `tensor.data_N`, upstream 5-field layout.
    ServerlessLlm,
    /// HF-compatible safetensors: `model.safetensors`, or shards plus
    /// `model.safetensors.index.json` when [`ConvertConfig::shard_bytes_max`] is set.
    Safetensors,
}

impl TargetFormat {
    /// The spelling used on the command line and in reports.
    pub const fn as_str(self) -> &'static str {
        match self {
            TargetFormat::ServerlessLlm => "serverlessllm",
            TargetFormat::Safetensors => "safetensors",
        }
    }
}

/// How to convert.
#[derive(Clone)]
pub struct ConvertConfig {
    /// The layout to write.
    pub to: TargetFormat,
    /// ServerlessLLM partition cap (upstream default: 10 GiB).
    pub partition_bytes_max: u64,
    /// Safetensors shard cap; `None` writes one file.
    pub shard_bytes_max: Option<u64>,
    /// Largest storage of a non-contiguous tensor, read whole to be gathered into row-major
    /// order, `1..=COPY_BUFFER_BYTES_MAX` (the writer's own staging is bounded by
    /// `STAGING_BYTES_MAX`, 32 MiB).
    pub buffer_bytes: usize,
    /// Buffered, direct or chosen from the facts (`save/mode.rs`).
    pub mode: WriteChoice,
    /// Writer threads; 0 chooses.
    pub threads: usize,
    /// Digest every tensor as it is written: [`ConvertReport::manifest`].
    pub manifest: Option<tensora_verify::Algo>,
    /// Called after every piece written.
    pub progress: Option<ConvertProgress>,
}

impl Default for ConvertConfig {
    fn default() -> Self {
        ConvertConfig {
            to: TargetFormat::ServerlessLlm,
            partition_bytes_max: tensora_format::sllm::PARTITION_BYTES_MAX_DEFAULT,
            shard_bytes_max: None,
            buffer_bytes: COPY_BUFFER_BYTES_DEFAULT,
            mode: WriteChoice::Auto,
            threads: 0,
            manifest: None,
            progress: None,
        }
    }
}

impl fmt::Debug for ConvertConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConvertConfig")
            .field("to", &self.to)
            .field("partition_bytes_max", &self.partition_bytes_max)
            .field("shard_bytes_max", &self.shard_bytes_max)
            .field("buffer_bytes", &self.buffer_bytes)
            .field("mode", &self.mode)
            .field("threads", &self.threads)
            .field("manifest", &self.manifest)
            .field("progress", &self.progress.as_ref().map(|_| "<callback>"))
            .finish()
    }
}

/// What a conversion did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ConvertReport {
    /// The checkpoint converted (as opened).
    pub source: PathBuf,
    /// The directory written.
    pub destination: PathBuf,
    /// The source layout (`safetensors`, `safetensors-sharded`, `serverlessllm`).
    pub from: &'static str,
    /// The layout written.
    pub to: &'static str,
    /// Tensors written.
    pub tensors: usize,
    /// Tensors written as a reference to another one's storage (ServerlessLLM ties).
    pub tied_tensors: usize,
    /// Files in the destination.
    pub files_written: usize,
    /// Tensor data bytes read from the source and written.
    pub bytes_copied: u64,
    /// Total size of everything in the destination.
    pub bytes_written: u64,
    /// The gather bound ([`ConvertConfig::buffer_bytes`]).
    pub buffer_bytes: u64,
    /// `"direct"` or `"buffered"`.
    pub mode: &'static str,
    /// Why that mode, in one line (`save/mode.rs`).
    pub reason: String,
    /// Writer threads.
    pub threads: usize,
    /// Bytes per piece.
    pub piece_bytes: u64,
    /// Staging memory the writers allocated.
    pub staging_bytes: u64,
    /// Wall-clock seconds of the whole conversion.
    pub seconds: f64,
    /// `bytes_copied / seconds`, in GB/s (10^9 bytes).
    pub gbps: f64,
    /// Seconds until every file was written and synced.
    pub write_seconds: f64,
    /// The digest algorithm of [`ConvertReport::manifest`], when asked for.
    pub digest_algo: Option<&'static str>,
    /// Peak resident set of the process so far (`VmHWM`), 0 if unknown.
    pub peak_rss_bytes: u64,
    /// The destination's manifest, digests computed while writing (when asked for).
    #[serde(skip)]
    pub manifest: Option<tensora_verify::Manifest>,
}

/// Why a conversion failed. The destination does not exist after any of these.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConvertError {
    /// A [`ConvertConfig`] field is out of range.
    #[error("invalid conversion config: {reason}")]
    Config {
        /// Which field and why.
        reason: String,
    },
    /// The destination exists; conversion never overwrites.
    #[error("{}: destination already exists", path.display())]
    DestinationExists {
        /// The destination.
        path: PathBuf,
    },
    /// A tensor cannot be written in the target layout (e.g. a dtype torch has no name for).
    #[error("tensor {tensor:?} cannot be converted: {reason}")]
    Unsupported {
        /// The tensor.
        tensor: String,
        /// Why.
        reason: String,
    },
    /// A source file was modified or replaced during the conversion.
    #[error("{}: source {change}", path.display())]
    SourceChanged {
        /// The source file.
        path: PathBuf,
        /// What changed.
        change: tensora_format::FileChanged,
    },
    /// Reading a source tensor failed.
    #[error("{}: reading {len_bytes} bytes at offset {offset_bytes} for tensor {tensor:?}: {source}", path.display())]
    Read {
        /// The source file.
        path: PathBuf,
        /// Where the failed read started.
        offset_bytes: u64,
        /// Bytes it asked for.
        len_bytes: u64,
        /// The tensor being copied.
        tensor: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A filesystem operation on the output failed (create, write, fsync, rename).
    #[error("{}: {op}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The operation.
        op: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The source checkpoint or the written layout is invalid.
    #[error(transparent)]
    Format(#[from] tensora_format::Error),
    /// The disk (or the quota) is full. Nothing is left behind: the temporary file or directory
    /// went with the error.
    #[error("{}: {op}: {source}", path.display())]
    NoSpace {
        /// The file or directory being written.
        path: PathBuf,
        /// The operation that found no space.
        op: &'static str,
        /// `ENOSPC` or `EDQUOT`.
        #[source]
        source: io::Error,
    },
    /// A tensor handed to a save is inconsistent (storage shorter than its data, elements outside
    /// it, a size that overflows).
    #[error("tensor {tensor:?}: {reason}")]
    InvalidTensor {
        /// The tensor.
        tensor: String,
        /// What is wrong.
        reason: String,
    },
    /// The save was cancelled through its cancel flag.
    #[error("cancelled")]
    Cancelled,
    /// The digests computed while writing could not be completed (a manifest was asked for).
    #[error("digest of the written tensors: {reason}")]
    Digest {
        /// Why.
        reason: String,
    },
}

/// An I/O error on the output or a source as a [`ConvertError`]: `ENOSPC` and `EDQUOT` are
/// [`ConvertError::NoSpace`].
fn io_err<'p>(path: &'p Path, op: &'static str) -> impl FnOnce(io::Error) -> ConvertError + 'p {
    move |source| save::output::write_err(path, op, source)
}

/// Convert `src` into a new checkpoint at `dst` (a directory, or a `.safetensors` file when
/// converting to unsharded safetensors). `dst` must not exist.
///
/// ```
/// use tensora_convert::{convert, ConvertConfig, TargetFormat};
/// let tiny = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/serverlessllm/tiny");
/// let src = tensora_format::sllm::open_dir(std::path::Path::new(tiny)).unwrap();
/// let out = tempfile::tempdir().unwrap();
/// let dst = out.path().join("st");
/// let cfg = ConvertConfig { to: TargetFormat::Safetensors, ..ConvertConfig::default() };
/// let report = convert(&src, &dst, &cfg).unwrap();
/// assert_eq!(report.tensors, src.tensors().len());
/// assert!(dst.join("model.safetensors").is_file());
/// ```
pub fn convert(src: &Checkpoint, dst: &Path, cfg: &ConvertConfig) -> Result<ConvertReport, ConvertError> {
    let started = Instant::now();
    validate(cfg)?;
    if fs::symlink_metadata(dst).is_ok() {
        return Err(ConvertError::DestinationExists { path: dst.to_path_buf() });
    }
    let source = CheckpointSource::open(src)?;
    let opts = SaveOptions {
        mode: cfg.mode,
        threads: cfg.threads,
        manifest: cfg.manifest,
        progress: cfg.progress.clone(),
        gather_bytes_max: cfg.buffer_bytes as u64,
        ..SaveOptions::default()
    };
    let single_file = cfg.to == TargetFormat::Safetensors
        && cfg.shard_bytes_max.is_none()
        && dst.extension().is_some_and(|e| e == "safetensors");
    let (pending, plans, tied_tensors, extra_bytes) = if single_file {
        let identity: Vec<usize> = (0..src.tensors().len()).collect();
        let plans =
            vec![FilePlan::safetensors(dst.to_path_buf(), &write::safetensors_layout(src)?, &identity)];
        let mut pending = save::api::write_files(&source, &plans, save::output::Placement::NoReplace, &opts)?;
        source.check_unchanged()?;
        pending.commit()?;
        (pending, plans, 0, 0)
    } else {
        let temp = TempDir::create_beside(dst)?;
        let dir = match cfg.to {
            TargetFormat::ServerlessLlm => sllm_plans(src, temp.path(), cfg)?,
            TargetFormat::Safetensors => st_plans(src, temp.path(), cfg)?,
        };
        let mut pending =
            save::api::write_files(&source, &dir.plans, save::output::Placement::InTempDir, &opts)?;
        for (name, bytes) in &dir.extra_files {
            write_small(temp.path(), name, bytes)?;
        }
        source.check_unchanged()?;
        pending.commit()?;
        temp.commit(dst)?;
        let extra: u64 = dir.extra_files.iter().map(|(_, b)| b.len() as u64).sum();
        (pending, dir.plans, dir.tied_tensors, extra)
    };
    let manifest = match &pending.digests {
        Some((algo, digests)) => {
            Some(save::api::manifest_for(&tensora_format::open(dst)?, &source, *algo, digests)?)
        }
        None => None,
    };
    let seconds = started.elapsed().as_secs_f64();
    let bytes_copied: u64 = plans.iter().map(FilePlan::tensor_bytes).sum();
    Ok(ConvertReport {
        source: src.root().to_path_buf(),
        destination: dst.to_path_buf(),
        from: src.format().as_str(),
        to: cfg.to.as_str(),
        tensors: src.tensors().len(),
        tied_tensors,
        files_written: plans.len() + usize::from(extra_bytes > 0),
        bytes_copied,
        bytes_written: pending.bytes_written + extra_bytes,
        buffer_bytes: cfg.buffer_bytes as u64,
        mode: pending.mode.as_str(),
        reason: pending.reason.clone(),
        threads: pending.threads,
        piece_bytes: pending.piece_bytes,
        staging_bytes: pending.stats.staging_bytes,
        seconds,
        gbps: if seconds > 0.0 { bytes_copied as f64 / seconds / 1e9 } else { 0.0 },
        write_seconds: pending.write_seconds,
        digest_algo: pending.digests.as_ref().map(|(a, _)| a.as_str()),
        peak_rss_bytes: tensora_sys::peak_rss_bytes(),
        manifest,
    })
}

fn validate(cfg: &ConvertConfig) -> Result<(), ConvertError> {
    let bad = |reason: String| Err(ConvertError::Config { reason });
    if cfg.buffer_bytes == 0 || cfg.buffer_bytes > COPY_BUFFER_BYTES_MAX {
        return bad(format!("buffer_bytes {} is not in 1..={COPY_BUFFER_BYTES_MAX}", cfg.buffer_bytes));
    }
    if cfg.partition_bytes_max == 0 {
        return bad("partition_bytes_max must be at least 1".to_owned());
    }
    if cfg.shard_bytes_max == Some(0) {
        return bad("shard_bytes_max must be at least 1".to_owned());
    }
    if cfg.to == TargetFormat::ServerlessLlm && cfg.shard_bytes_max.is_some() {
        return bad("shard_bytes_max applies to safetensors output only".to_owned());
    }
    Ok(())
}
