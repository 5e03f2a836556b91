//! Streaming conversion between checkpoint layouts, with bounded memory.
//!
//! [`convert`] copies every tensor of a parsed [`Checkpoint`] into a new checkpoint in the
//! ServerlessLLM layout or as (optionally sharded) safetensors. Data flows through one copy buffer
//! of at most [`ConvertConfig::buffer_bytes`] (64 MiB by default, capped at
//! [`COPY_BUFFER_BYTES_MAX`]) using positional reads, so memory stays bounded whatever the model's
//! size. The output is built in a temporary directory beside the destination, fsynced, and renamed
//! into place with `RENAME_NOREPLACE`: a failed or interrupted conversion leaves no destination.
//!
//! Dtypes are kept as they are (no casts). Tied tensors (several names on one storage, which only
//! ServerlessLLM can express) are stored once when writing ServerlessLLM and written out per name
//! for safetensors. Non-contiguous ServerlessLLM tensors are gathered into row-major order for
//! safetensors (their storage must fit in the copy buffer).
//!
//! Sources are checked like the load path checks them: each file's full parse-time stamp (size,
//! mtime, inode) is compared at open, and again after the copy with `fstat` on the descriptor and
//! `stat` on the path, before the output is committed; a source rewritten or replaced during the
//! conversion fails it with [`ConvertError::SourceChanged`] and leaves no destination.

#![warn(missing_docs)]

mod copy;
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

use copy::{Copier, safetensors_copy_len_bytes};
use sources::{check_sources, open_sources};
use tempdir::TempDir;
use write::{dir_len_bytes, safetensors_layout, write_sllm, write_st_dir};

/// Default size of the copy buffer (64 MiB).
pub const COPY_BUFFER_BYTES_DEFAULT: usize = 64 << 20;
/// Largest copy buffer accepted (256 MiB), so a conversion stays well under 512 MiB of RSS.
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
    /// Size of the one copy buffer, `1..=COPY_BUFFER_BYTES_MAX`.
    pub buffer_bytes: usize,
    /// Called after every chunk copied.
    pub progress: Option<ConvertProgress>,
}

impl Default for ConvertConfig {
    fn default() -> Self {
        ConvertConfig {
            to: TargetFormat::ServerlessLlm,
            partition_bytes_max: tensora_format::sllm::PARTITION_BYTES_MAX_DEFAULT,
            shard_bytes_max: None,
            buffer_bytes: COPY_BUFFER_BYTES_DEFAULT,
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
    /// The copy buffer used.
    pub buffer_bytes: u64,
    /// Wall-clock seconds of the whole conversion.
    pub seconds: f64,
    /// `bytes_copied / seconds`, in GB/s (10^9 bytes).
    pub gbps: f64,
    /// Peak resident set of the process so far (`VmHWM`), 0 if unknown.
    pub peak_rss_bytes: u64,
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
}

fn io_err<'p>(path: &'p Path, op: &'static str) -> impl FnOnce(io::Error) -> ConvertError + 'p {
    move |source| ConvertError::Io { path: path.to_path_buf(), op, source }
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
    let sources = open_sources(src.files())?;
    let single_file = cfg.to == TargetFormat::Safetensors
        && cfg.shard_bytes_max.is_none()
        && dst.extension().is_some_and(|e| e == "safetensors");

    let mut copier = Copier::new(src, &sources, cfg);
    let (tied_tensors, files_written, bytes_written) = if single_file {
        let layout = safetensors_layout(src)?;
        copier.set_total(layout.specs().iter().map(|s| s.nbytes().unwrap_or(0)).sum());
        copier.prepare_buffer(src.tensors().iter().map(safetensors_copy_len_bytes));
        // The writer commits `dst` when the last tensor is written: check the sources before that.
        copier.check_sources_after = src.tensors().len();
        let result = tensora_format::write::write_safetensors(dst, &layout, |i, out| copier.dense(i, out));
        copier.finish(result)?;
        (0, 1, layout.file_len_bytes())
    } else {
        let temp = TempDir::create_beside(dst)?;
        let (tied, files) = match cfg.to {
            TargetFormat::ServerlessLlm => write_sllm(src, temp.path(), cfg, &mut copier)?,
            TargetFormat::Safetensors => write_st_dir(src, temp.path(), cfg, &mut copier)?,
        };
        check_sources(src.files(), &sources)?;
        let bytes = dir_len_bytes(temp.path())?;
        temp.commit(dst)?;
        (tied, files, bytes)
    };
    let seconds = started.elapsed().as_secs_f64();
    let bytes_copied = copier.done_bytes;
    Ok(ConvertReport {
        source: src.root().to_path_buf(),
        destination: dst.to_path_buf(),
        from: src.format().as_str(),
        to: cfg.to.as_str(),
        tensors: src.tensors().len(),
        tied_tensors,
        files_written,
        bytes_copied,
        bytes_written,
        buffer_bytes: copier.buf.len() as u64,
        seconds,
        gbps: if seconds > 0.0 { bytes_copied as f64 / seconds / 1e9 } else { 0.0 },
        peak_rss_bytes: tensora_io::report::peak_rss_bytes(),
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
