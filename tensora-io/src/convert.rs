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

use std::collections::{BTreeMap, HashMap};
use std::ffi::{CString, OsString};
use std::fmt;
use std::fs::{self, File};
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use tensora_format::sllm::write::{SllmLayout, SllmLayoutConfig, SllmTensorSpec, contiguous_strides};
use tensora_format::write::{SafetensorsLayout, ShardedLayout, TensorSpec};
use tensora_format::{Checkpoint, FileEntry, Format, TensorInfo};

/// Default size of the copy buffer (64 MiB).
pub const COPY_BUFFER_BYTES_DEFAULT: usize = 64 << 20;
/// Largest copy buffer accepted (256 MiB), so a conversion stays well under 512 MiB of RSS.
pub const COPY_BUFFER_BYTES_MAX: usize = 256 << 20;
/// Output chunk used when gathering a non-contiguous tensor into row-major order.
const GATHER_OUT_BYTES: usize = 1 << 20;
/// How many temporary directory names are tried before giving up.
const TEMP_NAME_ATTEMPTS_MAX: u32 = 64;
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
    pub source: PathBuf,
    pub destination: PathBuf,
    pub from: &'static str,
    pub to: &'static str,
    pub tensors: usize,
    /// Tensors written as a reference to another one's storage (ServerlessLLM ties).
    pub tied_tensors: usize,
    pub files_written: usize,
    /// Tensor data bytes read from the source and written.
    pub bytes_copied: u64,
    /// Total size of everything in the destination.
    pub bytes_written: u64,
    pub buffer_bytes: u64,
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
    #[error("invalid conversion config: {reason}")]
    Config { reason: String },
    #[error("{}: destination already exists", path.display())]
    DestinationExists { path: PathBuf },
    #[error("tensor {tensor:?} cannot be converted: {reason}")]
    Unsupported { tensor: String, reason: String },
    #[error("{}: source changed since it was parsed ({what})", path.display())]
    SourceChanged { path: PathBuf, what: String },
    #[error("{}: reading {len_bytes} bytes at offset {offset_bytes} for tensor {tensor:?}: {source}", path.display())]
    Read {
        path: PathBuf,
        offset_bytes: u64,
        len_bytes: u64,
        tensor: String,
        #[source]
        source: io::Error,
    },
    #[error("{}: {op}: {source}", path.display())]
    Io {
        path: PathBuf,
        op: &'static str,
        #[source]
        source: io::Error,
    },
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
/// use tensora_io::convert::{convert, ConvertConfig, TargetFormat};
/// let tiny = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/fixtures/serverlessllm/tiny");
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
        peak_rss_bytes: crate::report::peak_rss_bytes(),
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

/// Open every source file and check it still looks as it did when parsed.
fn open_sources(files: &[FileEntry]) -> Result<Vec<File>, ConvertError> {
    files
        .iter()
        .map(|f| {
            let file = File::open(f.path()).map_err(io_err(f.path(), "opening source"))?;
            let meta = file.metadata().map_err(io_err(f.path(), "stat of source"))?;
            compare_source_stamp(f, &meta)?;
            Ok(file)
        })
        .collect()
}

/// After the copy: `fstat` every source descriptor and `stat` every source path against the
/// parse-time stamp (size, mtime, inode), like the load path's close check. A source rewritten or
/// replaced during the conversion fails it.
fn check_sources(files: &[FileEntry], sources: &[File]) -> Result<(), ConvertError> {
    for (f, file) in files.iter().zip(sources) {
        let meta = file.metadata().map_err(io_err(f.path(), "stat of source"))?;
        compare_source_stamp(f, &meta)?;
        let meta = fs::metadata(f.path()).map_err(io_err(f.path(), "stat of source"))?;
        compare_source_stamp(f, &meta)?;
    }
    Ok(())
}

/// The full stamp of `meta` against the parse-time one.
fn compare_source_stamp(f: &FileEntry, meta: &fs::Metadata) -> Result<(), ConvertError> {
    let now = tensora_format::FileStamp::from_metadata(meta);
    let then = f.stamp();
    let what = if now.len_bytes != then.len_bytes {
        format!("size {} is now {}", then.len_bytes, now.len_bytes)
    } else if (now.dev, now.inode) != (then.dev, then.inode) {
        "replaced by another file".to_owned()
    } else if now.modified != then.modified {
        "modified in place (mtime changed)".to_owned()
    } else {
        return Ok(());
    };
    Err(ConvertError::SourceChanged { path: f.path().to_path_buf(), what })
}

/// Bytes one tensor needs in the copy buffer for safetensors output: its logical bytes when
/// contiguous, its whole storage when it must be gathered.
fn safetensors_copy_len_bytes(t: &TensorInfo) -> u64 {
    if is_contiguous(t) { t.nbytes() } else { t.len_bytes() }
}

/// Copies tensor bytes from the sources through one bounded buffer, reporting progress.
struct Copier<'a> {
    ckpt: &'a Checkpoint,
    sources: &'a [File],
    buffer_bytes_max: usize,
    buf: Vec<u8>,
    done_bytes: u64,
    total_bytes: u64,
    progress: Option<ConvertProgress>,
    /// The detailed error behind the last `io::Error` handed to a writer.
    failure: Option<ConvertError>,
    /// When non-zero: after this many [`Copier::dense`] calls, check the source stamps (the
    /// single-file writer commits right after its last tensor, so the check runs inside it).
    check_sources_after: usize,
    dense_done: usize,
}

impl<'a> Copier<'a> {
    fn new(ckpt: &'a Checkpoint, sources: &'a [File], cfg: &ConvertConfig) -> Copier<'a> {
        Copier {
            ckpt,
            sources,
            buffer_bytes_max: cfg.buffer_bytes,
            buf: Vec::new(),
            done_bytes: 0,
            total_bytes: 0,
            progress: cfg.progress.clone(),
            failure: None,
            check_sources_after: 0,
            dense_done: 0,
        }
    }

    fn set_total(&mut self, total_bytes: u64) {
        self.total_bytes = total_bytes;
        if let Some(p) = &self.progress {
            p(0, total_bytes);
        }
    }

    /// Allocate the buffer once: as big as the largest copy needs, never above the bound.
    fn prepare_buffer(&mut self, copy_lens_bytes: impl Iterator<Item = u64>) {
        let largest = copy_lens_bytes.max().unwrap_or(0);
        let len = usize::try_from(largest).unwrap_or(usize::MAX).clamp(1, self.buffer_bytes_max);
        self.buf = vec![0u8; len];
    }

    /// Turn a writer result into ours, preferring the detailed error stashed by a fill.
    fn finish(&mut self, result: tensora_format::Result<()>) -> Result<(), ConvertError> {
        match (result, self.failure.take()) {
            (Ok(()), _) => Ok(()),
            (Err(_), Some(detail)) => Err(detail),
            (Err(e), None) => Err(ConvertError::Format(e)),
        }
    }

    fn stash(&mut self, err: ConvertError) -> io::Error {
        let message = err.to_string();
        self.failure = Some(err);
        io::Error::other(message)
    }

    /// Copy `len_bytes` of tensor `t` starting at its offset.
    fn copy_raw(&mut self, t: &TensorInfo, len_bytes: u64, out: &mut dyn Write) -> io::Result<()> {
        let file = &self.sources[t.file().index()];
        let path = self.ckpt.file(t.file()).path();
        let mut offset = t.offset_bytes();
        let end = offset + len_bytes;
        while offset < end {
            let chunk = (end - offset).min(self.buf.len() as u64) as usize;
            if let Err(source) = file.read_exact_at(&mut self.buf[..chunk], offset) {
                let err = ConvertError::Read {
                    path: path.to_path_buf(),
                    offset_bytes: offset,
                    len_bytes: chunk as u64,
                    tensor: t.name().to_owned(),
                    source,
                };
                return Err(self.stash(err));
            }
            out.write_all(&self.buf[..chunk])?;
            offset += chunk as u64;
            self.advance(chunk as u64);
        }
        Ok(())
    }

    fn advance(&mut self, bytes: u64) {
        self.done_bytes += bytes;
        if let Some(p) = &self.progress {
            p(self.done_bytes, self.total_bytes);
        }
    }

    /// Write tensor `i`'s logical bytes in row-major order (`numel × itemsize` bytes).
    fn dense(&mut self, i: usize, out: &mut dyn Write) -> io::Result<()> {
        let t = &self.ckpt.tensors()[i];
        if is_contiguous(t) {
            self.copy_raw(t, t.nbytes(), out)?;
        } else {
            self.gather(t, out)?;
        }
        self.dense_done += 1;
        if self.check_sources_after > 0 && self.dense_done == self.check_sources_after {
            check_sources(self.ckpt.files(), self.sources).map_err(|e| self.stash(e))?;
        }
        Ok(())
    }

    /// Gather a strided tensor: read its storage (which must fit in the buffer), then emit the
    /// elements in row-major order.
    fn gather(&mut self, t: &TensorInfo, out: &mut dyn Write) -> io::Result<()> {
        let item = t.dtype().size_bytes().unwrap_or(1) as usize;
        let strides = t.strides().unwrap_or(&[]);
        let storage = t.len_bytes();
        if storage > self.buf.len() as u64 {
            let err = ConvertError::Unsupported {
                tensor: t.name().to_owned(),
                reason: format!(
                    "non-contiguous tensor with {storage} bytes of storage does not fit the {}-byte copy buffer",
                    self.buf.len()
                ),
            };
            return Err(self.stash(err));
        }
        let storage = storage as usize;
        let file = &self.sources[t.file().index()];
        if let Err(source) = file.read_exact_at(&mut self.buf[..storage], t.offset_bytes()) {
            let err = ConvertError::Read {
                path: self.ckpt.file(t.file()).path().to_path_buf(),
                offset_bytes: t.offset_bytes(),
                len_bytes: storage as u64,
                tensor: t.name().to_owned(),
                source,
            };
            return Err(self.stash(err));
        }
        let shape = t.shape();
        let numel = t.numel();
        let mut index = vec![0u64; shape.len()];
        let mut chunk = Vec::with_capacity(GATHER_OUT_BYTES.max(item));
        for _ in 0..numel {
            // In bounds: the parser checked the highest reachable element fits the storage.
            let elem = index.iter().zip(strides).map(|(&i, &s)| i * s).sum::<u64>() as usize;
            chunk.extend_from_slice(&self.buf[elem * item..(elem + 1) * item]);
            if chunk.len() + item > GATHER_OUT_BYTES {
                out.write_all(&chunk)?;
                chunk.clear();
            }
            for d in (0..shape.len()).rev() {
                index[d] += 1;
                if index[d] < shape[d] {
                    break;
                }
                index[d] = 0;
            }
        }
        out.write_all(&chunk)?;
        self.advance(t.nbytes());
        Ok(())
    }
}

/// Row-major contiguous (dimensions of size 1 may have any stride; empty tensors always are).
fn is_contiguous(t: &TensorInfo) -> bool {
    let Some(strides) = t.strides() else { return true };
    if t.numel() == 0 {
        return true;
    }
    let expected = contiguous_strides(t.shape());
    t.shape().iter().zip(strides.iter().zip(&expected)).all(|(&d, (&s, &e))| d == 1 || s == e)
}

fn write_sllm(
    src: &Checkpoint,
    dir: &Path,
    cfg: &ConvertConfig,
    copier: &mut Copier<'_>,
) -> Result<(usize, usize), ConvertError> {
    let mut storage_of: HashMap<(u32, u64, u64), usize> = HashMap::new();
    let mut specs = Vec::with_capacity(src.tensors().len());
    let mut tied = 0usize;
    for (i, t) in src.tensors().iter().enumerate() {
        let key = (t.file().0, t.offset_bytes(), t.len_bytes());
        let tied_to = if t.len_bytes() > 0 { storage_of.get(&key).copied() } else { None };
        if tied_to.is_some() {
            tied += 1;
        } else {
            storage_of.insert(key, i);
        }
        specs.push(SllmTensorSpec {
            name: t.name().to_owned(),
            dtype: t.dtype(),
            shape: t.shape().to_vec(),
            strides: t.strides().map(<[u64]>::to_vec),
            size_bytes: t.len_bytes(),
            tied_to,
        });
    }
    let layout = SllmLayout::new(specs, &SllmLayoutConfig { partition_bytes_max: cfg.partition_bytes_max })?;
    copier.set_total(layout.records().iter().map(|r| r.size_bytes).sum());
    copier.prepare_buffer(layout.records().iter().map(|r| r.size_bytes));
    let result = tensora_format::sllm::write::write_dir(dir, &layout, |r, out| {
        let spec = layout.records()[r].spec;
        let t = &src.tensors()[spec];
        copier.copy_raw(t, t.len_bytes(), out)
    });
    copier.finish(result)?;
    Ok((tied, layout.partition_lens_bytes().len() + 1))
}

fn safetensors_specs(src: &Checkpoint) -> Vec<TensorSpec> {
    src.tensors()
        .iter()
        .map(|t| TensorSpec { name: t.name().to_owned(), dtype: t.dtype(), shape: t.shape().to_vec() })
        .collect()
}

fn safetensors_metadata(src: &Checkpoint) -> BTreeMap<String, String> {
    let mut metadata = src.metadata().clone();
    if src.format() == Format::ServerlessLlm || metadata.is_empty() {
        // transformers refuses safetensors without a known "format".
        metadata.entry("format".to_owned()).or_insert_with(|| "pt".to_owned());
    }
    metadata.remove("total_size");
    metadata
}

fn safetensors_layout(src: &Checkpoint) -> Result<SafetensorsLayout, ConvertError> {
    Ok(SafetensorsLayout::new(safetensors_specs(src), safetensors_metadata(src))?)
}

fn write_st_dir(
    src: &Checkpoint,
    dir: &Path,
    cfg: &ConvertConfig,
    copier: &mut Copier<'_>,
) -> Result<(usize, usize), ConvertError> {
    copier.set_total(src.tensors().iter().map(TensorInfo::nbytes).sum());
    copier.prepare_buffer(src.tensors().iter().map(safetensors_copy_len_bytes));
    match cfg.shard_bytes_max {
        None => {
            let layout = safetensors_layout(src)?;
            let path = dir.join(SAFETENSORS_FILE_NAME);
            let result =
                tensora_format::write::write_safetensors(&path, &layout, |i, out| copier.dense(i, out));
            copier.finish(result)?;
            Ok((0, 1))
        }
        Some(cap) => {
            let layout = ShardedLayout::new(safetensors_specs(src), safetensors_metadata(src), cap)?;
            let result = tensora_format::write::write_sharded(dir, &layout, |i, out| copier.dense(i, out));
            copier.finish(result)?;
            Ok((0, layout.shards().len() + 1))
        }
    }
}

/// Sum of the sizes of the regular files directly inside `dir`.
fn dir_len_bytes(dir: &Path) -> Result<u64, ConvertError> {
    let mut total = 0u64;
    for entry in fs::read_dir(dir).map_err(io_err(dir, "listing output"))? {
        let entry = entry.map_err(io_err(dir, "listing output"))?;
        let meta = entry.metadata().map_err(io_err(&entry.path(), "stat of output"))?;
        if meta.is_file() {
            total += meta.len();
        }
    }
    Ok(total)
}

static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A directory beside the destination that is removed on drop unless committed.
#[derive(Debug)]
struct TempDir {
    path: PathBuf,
    committed: bool,
}

fn parent_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

impl TempDir {
    fn create_beside(dst: &Path) -> Result<TempDir, ConvertError> {
        let name = dst.file_name().ok_or_else(|| ConvertError::Config {
            reason: format!("destination {} has no file name", dst.display()),
        })?;
        let parent = parent_of(dst);
        for _ in 0..TEMP_NAME_ATTEMPTS_MAX {
            let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
            let mut temp_name = OsString::from(".");
            temp_name.push(name);
            temp_name.push(format!(".tmp-{}-{n}", std::process::id()));
            let path = parent.join(temp_name);
            match fs::create_dir(&path) {
                Ok(()) => return Ok(TempDir { path, committed: false }),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(io_err(&path, "creating temporary directory")(e)),
            }
        }
        Err(ConvertError::Io {
            path: parent.to_path_buf(),
            op: "creating temporary directory",
            source: io::Error::new(io::ErrorKind::AlreadyExists, "no free temporary name"),
        })
    }

    fn path(&self) -> &Path {
        &self.path
    }

    /// fsync the directory, rename it to `dst` (refusing to replace anything), fsync the parent.
    fn commit(mut self, dst: &Path) -> Result<(), ConvertError> {
        File::open(&self.path).and_then(|d| d.sync_all()).map_err(io_err(&self.path, "fsync of output"))?;
        match rename_noreplace(&self.path, dst) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                return Err(ConvertError::DestinationExists { path: dst.to_path_buf() });
            }
            Err(e) => return Err(io_err(dst, "renaming output into place")(e)),
        }
        self.committed = true;
        let parent = parent_of(dst);
        File::open(parent).and_then(|d| d.sync_all()).map_err(io_err(parent, "fsync of parent directory"))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if !self.committed {
            let _ = fs::remove_dir_all(&self.path);
        }
    }
}

/// `rename(2)` that fails with `AlreadyExists` instead of replacing an existing (empty) directory.
fn rename_noreplace(from: &Path, to: &Path) -> io::Result<()> {
    let c = |p: &Path| {
        CString::new(p.as_os_str().as_bytes()).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
    };
    let (from_c, to_c) = (c(from)?, c(to)?);
    // SAFETY: both pointers come from live, NUL-terminated CStrings owned by this frame; AT_FDCWD
    // makes the paths relative to the current directory exactly as std::fs::rename does.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            from_c.as_ptr(),
            libc::AT_FDCWD,
            to_c.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if rc == 0 {
        return Ok(());
    }
    let err = io::Error::last_os_error();
    match err.raw_os_error() {
        // Filesystems without RENAME_NOREPLACE: check, then rename (a narrow race, documented).
        Some(libc::EINVAL) | Some(libc::ENOSYS) => {
            if fs::symlink_metadata(to).is_ok() {
                return Err(io::Error::new(io::ErrorKind::AlreadyExists, "destination exists"));
            }
            fs::rename(from, to)
        }
        _ => Err(err),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use proptest::prelude::*;
    use tensora_format::write::write_safetensors;
    use tensora_format::{Dtype, sllm};

    use super::*;

    const TINY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/fixtures/serverlessllm/tiny");
    const REAL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/fixtures/real");

    fn tiny() -> Checkpoint {
        sllm::open_dir(Path::new(TINY)).unwrap()
    }

    /// The dense bytes of a contiguous tensor.
    fn bytes_of(ckpt: &Checkpoint, name: &str) -> Vec<u8> {
        let t = ckpt.tensor(name).unwrap();
        assert!(is_contiguous(t), "{name}");
        let mut buf = vec![0u8; t.nbytes() as usize];
        File::open(ckpt.file(t.file()).path()).unwrap().read_exact_at(&mut buf, t.offset_bytes()).unwrap();
        buf
    }

    fn assert_same_tensors(a: &Checkpoint, b: &Checkpoint) {
        assert_eq!(a.tensors().len(), b.tensors().len());
        for t in a.tensors() {
            let u = b.tensor(t.name()).unwrap_or_else(|| panic!("missing {}", t.name()));
            assert_eq!((t.dtype(), t.shape()), (u.dtype(), u.shape()), "{}", t.name());
            assert_eq!(bytes_of(a, t.name()), bytes_of(b, t.name()), "{}", t.name());
        }
    }

    fn cfg(to: TargetFormat) -> ConvertConfig {
        ConvertConfig { to, ..ConvertConfig::default() }
    }

    fn leftovers(dir: &Path) -> Vec<PathBuf> {
        fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect()
    }

    /// A generated safetensors model with varied dtypes and odd sizes.
    fn generated_model(dir: &Path, tensors: usize, seed: u8) -> PathBuf {
        let dtypes = [Dtype::BF16, Dtype::F32, Dtype::I8, Dtype::F16, Dtype::F8E4M3, Dtype::I64];
        let specs: Vec<TensorSpec> = (0..tensors)
            .map(|i| TensorSpec {
                name: format!("layers.{i}.weight"),
                dtype: dtypes[i % dtypes.len()],
                shape: vec![(i as u64 % 7) + 1, 13 + i as u64],
            })
            .collect();
        let path = dir.join("model.safetensors");
        let meta = BTreeMap::from([("format".to_owned(), "pt".to_owned())]);
        let layout = SafetensorsLayout::new(specs, meta).unwrap();
        write_safetensors(&path, &layout, |i, out| {
            let n = layout.specs()[i].nbytes().unwrap();
            let data: Vec<u8> =
                (0..n).map(|k| (k as u8).wrapping_mul(7).wrapping_add(i as u8 ^ seed)).collect();
            out.write_all(&data)
        })
        .unwrap();
        path
    }

    #[test]
    fn tiny_to_safetensors_and_back_keeps_every_tensor() {
        let out = tempfile::tempdir().unwrap();
        let src = tiny();
        let st = out.path().join("st");
        let report = convert(&src, &st, &cfg(TargetFormat::Safetensors)).unwrap();
        assert_eq!((report.from, report.to, report.tensors), ("serverlessllm", "safetensors", 14));
        let st_ckpt = tensora_format::open(&st).unwrap();
        assert_same_tensors(&src, &st_ckpt);
        assert_eq!(st_ckpt.metadata().get("format").map(String::as_str), Some("pt"));

        let back = out.path().join("sllm");
        let report = convert(&st_ckpt, &back, &cfg(TargetFormat::ServerlessLlm)).unwrap();
        assert_eq!(report.tied_tensors, 0, "safetensors has no ties");
        assert_same_tensors(&src, &sllm::open_dir(&back).unwrap());
    }

    #[test]
    fn sllm_to_sllm_stores_tied_weights_once() {
        let out = tempfile::tempdir().unwrap();
        let src = tiny();
        let dst = out.path().join("again");
        let report = convert(
            &src,
            &dst,
            &ConvertConfig { partition_bytes_max: 40_000, ..cfg(TargetFormat::ServerlessLlm) },
        )
        .unwrap();
        assert_eq!(report.tied_tensors, 1);
        let again = sllm::open_dir(&dst).unwrap();
        assert_same_tensors(&src, &again);
        let (e, h) = (again.tensor("embed.weight").unwrap(), again.tensor("lm_head.weight").unwrap());
        assert_eq!((e.file(), e.range()), (h.file(), h.range()));
        let src_total: u64 = src.files().iter().map(FileEntry::len_bytes).sum();
        let dst_total: u64 = again.files().iter().map(FileEntry::len_bytes).sum();
        assert_eq!(src_total, dst_total);
        // Padding is written as zeros (the fixture's 0xAA is not copied).
        let p1 = fs::read(sllm::partition_path(&dst, 1)).unwrap();
        assert_eq!(&p1[8454..8456], &[0, 0]);
    }

    #[test]
    fn legacy_layout_migrates_to_upstream() {
        let out = tempfile::tempdir().unwrap();
        let dir = out.path().join("legacy");
        fs::create_dir(&dir).unwrap();
        let index = r#"{"a": [0, 8, [2], [1], "f32", 0], "b": [0, 6, [3], [1], "bf16", 1], "c": [8, 2, [2], [1], "i8", 1]}"#;
        fs::write(dir.join(sllm::INDEX_FILE_NAME), index).unwrap();
        fs::write(sllm::partition_path(&dir, 0), [1u8, 2, 3, 4, 5, 6, 7, 8]).unwrap();
        fs::write(sllm::partition_path(&dir, 1), [9u8, 10, 11, 12, 13, 14, 0, 0, 15, 16]).unwrap();
        let src = sllm::open_dir(&dir).unwrap();
        assert_eq!(src.warnings().len(), 1);
        let dst = out.path().join("upstream");
        convert(&src, &dst, &cfg(TargetFormat::ServerlessLlm)).unwrap();
        let index = fs::read(dst.join(sllm::INDEX_FILE_NAME)).unwrap();
        let parsed = sllm::parse_index(&index).unwrap();
        assert_eq!(parsed.layout, sllm::IndexLayout::Upstream);
        let migrated = sllm::open_dir(&dst).unwrap();
        assert!(migrated.warnings().is_empty());
        assert_same_tensors(&src, &migrated);
        assert_eq!(bytes_of(&migrated, "c"), [15, 16]);
    }

    #[test]
    fn real_fixtures_round_trip_byte_identical() {
        let mut seen = 0;
        for entry in fs::read_dir(REAL).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_none_or(|e| e != "safetensors") {
                continue;
            }
            seen += 1;
            let out = tempfile::tempdir().unwrap();
            let src = tensora_format::open(&path).unwrap();
            let mid = out.path().join("sllm");
            convert(
                &src,
                &mid,
                &ConvertConfig { partition_bytes_max: 1 << 16, ..cfg(TargetFormat::ServerlessLlm) },
            )
            .unwrap();
            let mid_ckpt = sllm::open_dir(&mid).unwrap();
            assert_same_tensors(&src, &mid_ckpt);
            let back = out.path().join("back.safetensors");
            convert(&mid_ckpt, &back, &cfg(TargetFormat::Safetensors)).unwrap();
            let back_ckpt = tensora_format::open(&back).unwrap();
            assert_same_tensors(&src, &back_ckpt);
        }
        assert!(seen >= 2, "expected the shared real fixtures");
    }

    #[test]
    fn generated_model_round_trips_through_many_partitions_and_shards() {
        let out = tempfile::tempdir().unwrap();
        let src = tensora_format::open(generated_model(out.path(), 40, 3)).unwrap();
        let mid = out.path().join("sllm");
        let report = convert(
            &src,
            &mid,
            &ConvertConfig { partition_bytes_max: 300, ..cfg(TargetFormat::ServerlessLlm) },
        )
        .unwrap();
        let mid_ckpt = sllm::open_dir(&mid).unwrap();
        assert!(mid_ckpt.files().len() > 10, "{} partitions", mid_ckpt.files().len());
        assert_eq!(report.files_written, mid_ckpt.files().len() + 1);
        assert_same_tensors(&src, &mid_ckpt);
        let back = out.path().join("sharded");
        let report = convert(
            &mid_ckpt,
            &back,
            &ConvertConfig {
                shard_bytes_max: Some(2_000),
                buffer_bytes: 64,
                ..cfg(TargetFormat::Safetensors)
            },
        )
        .unwrap();
        assert!(report.files_written > 3);
        assert!(back.join(tensora_format::write::SHARD_INDEX_FILE_NAME).is_file());
        let back_ckpt = tensora_format::open(&back).unwrap();
        assert_eq!(back_ckpt.format(), Format::SafetensorsSharded);
        assert_same_tensors(&src, &back_ckpt);
    }

    #[test]
    fn gathers_non_contiguous_tensors_into_row_major_order() {
        let out = tempfile::tempdir().unwrap();
        let dir = out.path().join("strided");
        fs::create_dir(&dir).unwrap();
        // Storage [0, 1, 2, 3, 4, 5] as u8 viewed as a [3, 2] transpose of a [2, 3] matrix.
        fs::write(dir.join(sllm::INDEX_FILE_NAME), r#"{"t": [0, 6, [3, 2], [1, 3], "torch.uint8"]}"#)
            .unwrap();
        fs::write(sllm::partition_path(&dir, 0), [0u8, 1, 2, 3, 4, 5, 0xAA, 0xAA]).unwrap();
        let src = sllm::open_dir(&dir).unwrap();
        let dst = out.path().join("t.safetensors");
        convert(&src, &dst, &cfg(TargetFormat::Safetensors)).unwrap();
        let st = tensora_format::open(&dst).unwrap();
        assert_eq!(st.tensor("t").unwrap().shape(), &[3, 2]);
        assert_eq!(bytes_of(&st, "t"), [0, 3, 1, 4, 2, 5]);
        // To ServerlessLLM the storage and strides are kept as they are.
        let again = out.path().join("again");
        convert(&src, &again, &cfg(TargetFormat::ServerlessLlm)).unwrap();
        let again = sllm::open_dir(&again).unwrap();
        assert_eq!(again.tensor("t").unwrap().strides(), Some(&[1u64, 3][..]));
    }

    #[test]
    fn single_file_output_sizes_the_buffer_for_strided_storage() {
        let out = tempfile::tempdir().unwrap();
        let dir = out.path().join("strided");
        fs::create_dir(&dir).unwrap();
        // A [2, 2] u8 view with strides [1, 4] over 16 bytes of storage: 4 logical bytes, but the
        // gather reads all 16 into the buffer.
        fs::write(dir.join(sllm::INDEX_FILE_NAME), r#"{"t": [0, 16, [2, 2], [1, 4], "torch.uint8"]}"#)
            .unwrap();
        let storage: Vec<u8> = (0..16).collect();
        fs::write(sllm::partition_path(&dir, 0), &storage).unwrap();
        let src = sllm::open_dir(&dir).unwrap();
        for dst in [out.path().join("t.safetensors"), out.path().join("t-dir")] {
            convert(&src, &dst, &cfg(TargetFormat::Safetensors)).unwrap();
            let st = tensora_format::open(&dst).unwrap();
            assert_eq!(bytes_of(&st, "t"), [0, 4, 1, 5], "{}", dst.display());
        }
    }

    #[test]
    fn a_source_rewritten_in_place_during_conversion_fails() {
        for single_file in [true, false] {
            let out = tempfile::tempdir().unwrap();
            let model = generated_model(out.path(), 4, 3);
            let src = tensora_format::open(&model).unwrap();
            // Rewrite the source in place (same size, same inode, new mtime) once copying started.
            let victim = model.clone();
            let touched = Mutex::new(false);
            let progress: ConvertProgress = Arc::new(move |done, _| {
                let mut touched = touched.lock().unwrap();
                if done > 0 && !*touched {
                    *touched = true;
                    let f = fs::OpenOptions::new().write(true).open(&victim).unwrap();
                    f.set_modified(std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1))
                        .unwrap();
                }
            });
            let dst = if single_file { out.path().join("o.safetensors") } else { out.path().join("o") };
            let c = ConvertConfig { progress: Some(progress), ..cfg(TargetFormat::Safetensors) };
            let err = convert(&src, &dst, &c).unwrap_err();
            assert!(
                matches!(&err, ConvertError::SourceChanged { what, .. } if what.contains("mtime")),
                "{err}"
            );
            assert!(!dst.exists());
            assert_eq!(leftovers(out.path()), std::slice::from_ref(&model));
        }
    }

    #[test]
    fn failure_mid_way_leaves_no_destination() {
        let out = tempfile::tempdir().unwrap();
        let dir = out.path().join("strided");
        fs::create_dir(&dir).unwrap();
        // "big" is non-contiguous and its 64-byte storage does not fit a 16-byte buffer; it comes
        // after "a", so the output is half written when the conversion fails.
        let index =
            r#"{"a": [0, 16, [16], [1], "torch.uint8"], "big": [16, 64, [8, 8], [1, 8], "torch.uint8"]}"#;
        fs::write(dir.join(sllm::INDEX_FILE_NAME), index).unwrap();
        fs::write(sllm::partition_path(&dir, 0), [7u8; 80]).unwrap();
        let src = sllm::open_dir(&dir).unwrap();
        let dst = out.path().join("out");
        let cfg = ConvertConfig { buffer_bytes: 16, ..cfg(TargetFormat::Safetensors) };
        let err = convert(&src, &dst, &cfg).unwrap_err();
        assert!(matches!(&err, ConvertError::Unsupported { tensor, .. } if tensor == "big"), "{err}");
        assert!(!dst.exists());
        assert_eq!(leftovers(out.path()), std::slice::from_ref(&dir));
    }

    #[test]
    fn truncated_source_is_refused_and_leaves_no_destination() {
        let out = tempfile::tempdir().unwrap();
        let model = generated_model(out.path(), 4, 1);
        let src = tensora_format::open(&model).unwrap();
        let f = fs::OpenOptions::new().write(true).open(&model).unwrap();
        f.set_len(src.files()[0].len_bytes() - 10).unwrap();
        let dst = out.path().join("out");
        let err = convert(&src, &dst, &cfg(TargetFormat::ServerlessLlm)).unwrap_err();
        assert!(matches!(err, ConvertError::SourceChanged { .. }), "{err}");
        assert!(!dst.exists());
        assert_eq!(leftovers(out.path()), [model]);
    }

    #[test]
    fn read_error_during_copy_names_file_offset_and_tensor_and_leaves_nothing() {
        let out = tempfile::tempdir().unwrap();
        let model = generated_model(out.path(), 8, 2);
        let src = tensora_format::open(&model).unwrap();
        let dst = out.path().join("out");
        // Truncate the source from the progress callback, after the first chunk was copied.
        let victim = model.clone();
        let cut = Mutex::new(false);
        let progress: ConvertProgress = Arc::new(move |done, _| {
            let mut cut = cut.lock().unwrap();
            if done > 0 && !*cut {
                *cut = true;
                fs::OpenOptions::new().write(true).open(&victim).unwrap().set_len(100).unwrap();
            }
        });
        let cfg =
            ConvertConfig { progress: Some(progress), buffer_bytes: 32, ..cfg(TargetFormat::ServerlessLlm) };
        let err = convert(&src, &dst, &cfg).unwrap_err();
        let ConvertError::Read { path, offset_bytes, tensor, .. } = &err else { panic!("unexpected {err}") };
        assert_eq!(path, &model);
        assert!(*offset_bytes >= 100 - 32);
        assert!(src.tensor(tensor).is_some());
        assert!(!dst.exists());
        assert_eq!(leftovers(out.path()), [model]);
    }

    #[test]
    fn dtype_without_a_torch_name_is_refused_before_writing() {
        let out = tempfile::tempdir().unwrap();
        let path = out.path().join("f4.safetensors");
        let specs = vec![TensorSpec { name: "packed".into(), dtype: Dtype::F4, shape: vec![4] }];
        let layout = SafetensorsLayout::new(specs, BTreeMap::new()).unwrap();
        write_safetensors(&path, &layout, |_, o| o.write_all(&[0x12, 0x34])).unwrap();
        let src = tensora_format::open(&path).unwrap();
        let dst = out.path().join("out");
        let err = convert(&src, &dst, &cfg(TargetFormat::ServerlessLlm)).unwrap_err();
        let ConvertError::Format(e) = &err else { panic!("unexpected {err}") };
        assert_eq!(e.tensor(), Some("packed"));
        assert_eq!(leftovers(out.path()), [path]);
    }

    #[test]
    fn existing_destination_is_refused_and_untouched() {
        let out = tempfile::tempdir().unwrap();
        let dst = out.path().join("taken");
        fs::create_dir(&dst).unwrap();
        let err = convert(&tiny(), &dst, &cfg(TargetFormat::ServerlessLlm)).unwrap_err();
        assert!(matches!(err, ConvertError::DestinationExists { .. }));
        assert!(leftovers(&dst).is_empty());
        assert_eq!(leftovers(out.path()), std::slice::from_ref(&dst));
        // The final rename refuses to replace as well.
        let temp = TempDir::create_beside(&dst).unwrap();
        assert!(matches!(temp.commit(&dst), Err(ConvertError::DestinationExists { .. })));
        assert_eq!(leftovers(out.path()), [dst]);
    }

    #[test]
    fn bad_configs_are_refused() {
        let out = tempfile::tempdir().unwrap();
        let dst = out.path().join("x");
        let bad = [
            ConvertConfig { buffer_bytes: 0, ..ConvertConfig::default() },
            ConvertConfig { buffer_bytes: COPY_BUFFER_BYTES_MAX + 1, ..ConvertConfig::default() },
            ConvertConfig { partition_bytes_max: 0, ..ConvertConfig::default() },
            ConvertConfig { shard_bytes_max: Some(0), ..cfg(TargetFormat::Safetensors) },
            ConvertConfig { shard_bytes_max: Some(10), ..cfg(TargetFormat::ServerlessLlm) },
        ];
        for c in bad {
            assert!(matches!(convert(&tiny(), &dst, &c), Err(ConvertError::Config { .. })), "{c:?}");
        }
        assert!(leftovers(out.path()).is_empty());
    }

    #[test]
    fn progress_is_monotone_and_reaches_the_total() {
        let out = tempfile::tempdir().unwrap();
        let calls = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&calls);
        let progress: ConvertProgress = Arc::new(move |done, total| sink.lock().unwrap().push((done, total)));
        let c = ConvertConfig {
            progress: Some(progress),
            buffer_bytes: 1000,
            ..cfg(TargetFormat::ServerlessLlm)
        };
        let report = convert(&tiny(), &out.path().join("p"), &c).unwrap();
        let calls = calls.lock().unwrap();
        assert!(calls.windows(2).all(|w| w[0].0 <= w[1].0 && w[0].1 == w[1].1));
        let &(done, total) = calls.last().unwrap();
        assert_eq!((done, total), (report.bytes_copied, report.bytes_copied));
        assert_eq!(report.buffer_bytes, 1000);
        // All 79048 bytes of the partitions minus the padding (2 + 2 + 4 + 5): embed.weight, tied
        // with lm_head.weight, is copied once.
        let unique: u64 = 79_048 - (2 + 2 + 4 + 5);
        assert_eq!(report.bytes_copied, unique);
    }

    proptest! {
        // Every conversion fsyncs each output file, so keep the case count low.
        #![proptest_config(ProptestConfig::with_cases(12))]

        #[test]
        fn random_models_round_trip(tensors in 1usize..16, seed in any::<u8>(), cap in 64u64..4_000, buf in 1usize..300) {
            let out = tempfile::tempdir().unwrap();
            let src = tensora_format::open(generated_model(out.path(), tensors, seed)).unwrap();
            let mid = out.path().join("sllm");
            let c = ConvertConfig { partition_bytes_max: cap, buffer_bytes: buf, ..cfg(TargetFormat::ServerlessLlm) };
            convert(&src, &mid, &c).unwrap();
            let mid_ckpt = sllm::open_dir(&mid).unwrap();
            let back = out.path().join("st");
            let c = ConvertConfig { shard_bytes_max: Some(cap), buffer_bytes: buf, ..cfg(TargetFormat::Safetensors) };
            convert(&mid_ckpt, &back, &c).unwrap();
            let back_ckpt = tensora_format::open(&back).unwrap();
            assert_same_tensors(&src, &mid_ckpt);
            assert_same_tensors(&src, &back_ckpt);
        }
    }
}
