//! The save entry points: one safetensors file, a sharded set, bytes in memory; and the driver
//! that the conversions share (outputs, mode, writer, commit, report).

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::io::Write;
use std::path::Path;
use std::time::Instant;

use tensora_format::write::{
    AtomicFile, SHARD_INDEX_FILE_NAME, SafetensorsLayout, ShardedLayout, TensorSpec,
};
use tensora_verify::PieceDigests;
use tensora_verify::{Algo, Digest, Manifest};

use super::engine::{self, Job, WriteStats};
use super::mode::{self, WriteFacts, WriteMode};
use super::output::{Output, Placement, sync_dirs, write_err};
use super::plan::{ALIGN_BYTES, FilePlan};
use super::source::{SaveSource, StorageLayout, gather};
use super::{
    Durability, PIECE_BYTES_DEFAULT, PIECE_BYTES_MAX, STAGING_BYTES_MAX, SaveOptions, SaveReport, SaveStage,
    WriteChoice,
};
use crate::tempdir::{TempDir, parent_of};
use crate::{COPY_BUFFER_BYTES_MAX, ConvertError, SAFETENSORS_FILE_NAME};

/// Files written and synced, not yet named.
pub(crate) struct Pending {
    outputs: Vec<Output>,
    placement: Placement,
    pub(crate) stats: WriteStats,
    pub(crate) mode: WriteMode,
    pub(crate) reason: String,
    pub(crate) threads: usize,
    pub(crate) piece_bytes: u64,
    pub(crate) digests: Option<(Algo, Vec<Digest>)>,
    pub(crate) write_seconds: f64,
    pub(crate) bytes_written: u64,
    stage: Option<super::StageHook>,
    durability: Durability,
}

impl Pending {
    /// Name every output, then sync their directories (unless they are inside a temporary
    /// directory, which is committed as a whole).
    pub(crate) fn commit(&mut self) -> Result<(), ConvertError> {
        for out in &mut self.outputs {
            out.commit()?;
        }
        if self.placement != Placement::InTempDir && self.durability == Durability::Synced {
            sync_dirs(self.outputs.iter().map(|o| parent_of(&o.final_path)))?;
        }
        if let Some(hook) = &self.stage {
            for out in &self.outputs {
                hook(SaveStage::Committed, &out.final_path);
            }
        }
        Ok(())
    }
}

/// The piece size and thread count of `opts` for `mode`: within [`STAGING_BYTES_MAX`] and no
/// larger than the largest file's data (a small save allocates small buffers).
fn sizing(
    opts: &SaveOptions,
    mode: WriteMode,
    cpus: usize,
    plans: &[FilePlan],
) -> Result<(u64, usize), ConvertError> {
    let asked = if opts.piece_bytes == 0 { PIECE_BYTES_DEFAULT } else { opts.piece_bytes };
    if !asked.is_multiple_of(ALIGN_BYTES) || asked > PIECE_BYTES_MAX {
        return Err(ConvertError::Config {
            reason: format!("piece_bytes {asked} is not a multiple of {ALIGN_BYTES} up to {PIECE_BYTES_MAX}"),
        });
    }
    let threads = mode::threads(mode, cpus, opts.threads);
    let fit = (STAGING_BYTES_MAX / threads as u64) / ALIGN_BYTES * ALIGN_BYTES;
    let data_max = plans.iter().map(|p| p.len_bytes - p.head_end_bytes()).max().unwrap_or(0);
    Ok((asked.min(fit).min(data_max.next_multiple_of(ALIGN_BYTES)).max(ALIGN_BYTES), threads))
}

/// Write `plans` from `source`: choose the mode, create the outputs, run the writer, sync every
/// file. Nothing has its final name yet ([`Pending::commit`]); dropping the result removes it all.
pub(crate) fn write_files(
    source: &dyn SaveSource,
    plans: &[FilePlan],
    placement: Placement,
    opts: &SaveOptions,
) -> Result<Pending, ConvertError> {
    let started = Instant::now();
    for t in source.tensors() {
        t.check()?;
    }
    let bytes_written: u64 = plans.iter().map(|p| p.len_bytes).sum();
    let in_memory = (0..source.tensors().len()).all(|i| source.storage(i).is_some());
    let dir = plans.first().map_or(Path::new("."), |p| parent_of(&p.path));
    let facts = WriteFacts::gather(dir, bytes_written, in_memory);
    let (mut mode, mut reason) = match (opts.durability, opts.mode) {
        (Durability::ProcessCrashSafe, WriteChoice::Auto) => (
            WriteMode::Buffered,
            "buffered: not synced (process-crash-safe), the page cache takes the writes".to_owned(),
        ),
        _ => mode::choose(&facts, opts.mode),
    };
    let mut outputs = Vec::with_capacity(plans.len());
    for plan in plans {
        let direct = mode == WriteMode::Direct;
        let (out, refused) = Output::create(&plan.path, plan.len_bytes, placement, direct, opts.preallocate)?;
        if let Some(why) = refused {
            // One filesystem for every output: the first refusal decides for all.
            mode = WriteMode::Buffered;
            reason = format!("buffered: {why}; {reason}");
        }
        outputs.push(out);
    }
    let (piece_bytes, threads) = sizing(opts, mode, facts.cpus, plans)?;
    let digests = opts
        .manifest
        .map(|algo| PieceDigests::new(algo, source.tensors().iter().map(|t| (t.name.clone(), t.nbytes()))));
    let job = Job {
        source,
        plans,
        outputs: &outputs,
        digests: digests.as_ref(),
        threads,
        piece_bytes,
        progress: opts.progress.clone(),
        stage: opts.stage.clone(),
        cancel: opts.cancel.as_deref(),
        durability: opts.durability,
        gather_bytes_max: if opts.gather_bytes_max == 0 {
            COPY_BUFFER_BYTES_MAX as u64
        } else {
            opts.gather_bytes_max
        },
    };
    let stats = engine::run(&job)?;
    let digests = match digests {
        Some(d) => Some((d.algo(), d.finish().map_err(|e| ConvertError::Digest { reason: e.to_string() })?)),
        None => None,
    };
    Ok(Pending {
        outputs,
        placement,
        stats,
        mode,
        reason,
        threads,
        piece_bytes,
        digests,
        write_seconds: started.elapsed().as_secs_f64(),
        bytes_written,
        stage: opts.stage.clone(),
        durability: opts.durability,
    })
}

/// The layout of one safetensors file holding `source`'s tensors, in order, with `metadata`.
pub fn safetensors_layout(
    source: &dyn SaveSource,
    metadata: &BTreeMap<String, String>,
) -> Result<SafetensorsLayout, ConvertError> {
    Ok(SafetensorsLayout::new(specs(source), metadata.clone())?)
}

fn specs(source: &dyn SaveSource) -> Vec<TensorSpec> {
    source
        .tensors()
        .iter()
        .map(|t| TensorSpec { name: t.name.clone(), dtype: t.dtype, shape: t.shape.clone() })
        .collect()
}

/// Save `source` as one safetensors file at `path`, replacing what is there only once the new
/// file is complete (and synced, with [`Durability::Synced`]: see the module docs).
pub fn save_safetensors(
    path: &Path,
    source: &dyn SaveSource,
    metadata: &BTreeMap<String, String>,
    opts: &SaveOptions,
) -> Result<SaveReport, ConvertError> {
    let started = Instant::now();
    let layout = safetensors_layout(source, metadata)?;
    let identity: Vec<usize> = (0..source.tensors().len()).collect();
    let plan = FilePlan::safetensors(path.to_path_buf(), &layout, &identity);
    let mut pending = write_files(source, std::slice::from_ref(&plan), Placement::Replace, opts)?;
    let t = Instant::now();
    pending.commit()?;
    let commit_seconds = t.elapsed().as_secs_f64();
    let manifest = manifest_of(path, source, &pending)?;
    Ok(report(path, 1, source, &pending, started, commit_seconds, manifest))
}

/// Save `source` as HF-style shards of at most `shard_bytes_max` tensor bytes each
/// (`model-00001-of-0000N.safetensors`, greedily in order, a larger tensor alone) and
/// `model.safetensors.index.json` in `dir`; a set of one shard is `model.safetensors` without an
/// index, as `huggingface_hub` writes it.
///
/// A `dir` that does not exist is built beside it and renamed into place: all or nothing. In an
/// existing `dir` (other files in it are kept) every file is written and synced unnamed first;
/// then the previous index is removed, the shards are named, the new index is written, and the
/// previous save's weight files (`model.safetensors`, `model-*-of-*.safetensors`) that this one
/// did not write are removed. A crash during that last step (no data is written then) leaves a
/// directory without an index rather than one whose index names a mix of two saves.
pub fn save_sharded(
    dir: &Path,
    source: &dyn SaveSource,
    metadata: &BTreeMap<String, String>,
    shard_bytes_max: u64,
    opts: &SaveOptions,
) -> Result<SaveReport, ConvertError> {
    let started = Instant::now();
    let layout = ShardedLayout::new(specs(source), metadata.clone(), shard_bytes_max)?;
    let exists = match fs::symlink_metadata(dir) {
        Ok(m) if m.is_dir() => true,
        Ok(_) => {
            return Err(ConvertError::Config { reason: format!("{} is not a directory", dir.display()) });
        }
        Err(_) => false,
    };
    let temp = if exists { None } else { Some(TempDir::create_beside(dir)?) };
    let root = temp.as_ref().map_or(dir, |t| t.path());
    let plans = shard_plans(root, &layout);
    let placement = if exists { Placement::Replace } else { Placement::InTempDir };
    let mut pending = write_files(source, &plans, placement, opts)?;
    let t = Instant::now();
    let index = (plans.len() > 1).then(|| layout.index_json());
    let index_path = dir.join(SHARD_INDEX_FILE_NAME);
    match temp {
        Some(temp) => {
            pending.commit()?;
            if let Some(json) = index {
                let path = temp.path().join(SHARD_INDEX_FILE_NAME);
                let mut f = fs::File::create_new(&path).map_err(|e| write_err(&path, "creating index", e))?;
                f.write_all(json)
                    .and_then(|()| f.sync_all())
                    .map_err(|e| write_err(&path, "writing index", e))?;
            }
            temp.commit(dir)?;
        }
        None => {
            match fs::remove_file(&index_path) {
                Ok(()) => sync_dirs([dir])?,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(write_err(&index_path, "removing the previous index", e)),
            }
            pending.commit()?;
            if let Some(json) = index {
                let err = |e| write_err(&index_path, "writing index", e);
                let mut atomic = AtomicFile::create(&index_path).map_err(err)?;
                atomic.write_all(json).map_err(err)?;
                atomic.commit().map_err(err)?;
            }
            remove_stale_weights(dir, &plans)?;
        }
    }
    let commit_seconds = t.elapsed().as_secs_f64();
    let written = if plans.len() > 1 { index_path } else { dir.join(SAFETENSORS_FILE_NAME) };
    let manifest = manifest_of(&written, source, &pending)?;
    let files = plans.len() + usize::from(plans.len() > 1);
    let mut r = report(dir, files, source, &pending, started, commit_seconds, manifest);
    r.bytes_written += if files > plans.len() { layout.index_json().len() as u64 } else { 0 };
    Ok(r)
}

/// One plan per shard (a single shard is `model.safetensors`).
fn shard_plans(root: &Path, layout: &ShardedLayout) -> Vec<FilePlan> {
    let single = layout.shards().len() == 1;
    layout
        .shards()
        .iter()
        .map(|s| {
            let name = if single { SAFETENSORS_FILE_NAME } else { s.file_name.as_str() };
            FilePlan::safetensors(root.join(name), &s.layout, &s.spec_indices)
        })
        .collect()
}

/// Whether `name` is one of the weight files an HF save writes (`model.safetensors`,
/// `model-00001-of-00002.safetensors`).
fn is_weights_name(name: &str) -> bool {
    if name == SAFETENSORS_FILE_NAME {
        return true;
    }
    let Some(mid) = name.strip_prefix("model-").and_then(|n| n.strip_suffix(".safetensors")) else {
        return false;
    };
    let digits = |s: &str| s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit());
    mid.split_once("-of-").is_some_and(|(a, b)| digits(a) && digits(b))
}

/// Remove the previous save's weight files in `dir` that `plans` did not write.
fn remove_stale_weights(dir: &Path, plans: &[FilePlan]) -> Result<(), ConvertError> {
    let written: Vec<&std::ffi::OsStr> = plans.iter().filter_map(|p| p.path.file_name()).collect();
    let mut removed = false;
    for entry in fs::read_dir(dir).map_err(|e| write_err(dir, "listing", e))? {
        let entry = entry.map_err(|e| write_err(dir, "listing", e))?;
        let name = entry.file_name();
        if written.contains(&name.as_os_str()) || !name.to_str().is_some_and(is_weights_name) {
            continue;
        }
        fs::remove_file(entry.path()).map_err(|e| write_err(&entry.path(), "removing a stale shard", e))?;
        removed = true;
    }
    if removed { sync_dirs([dir]) } else { Ok(()) }
}

/// The manifest of the checkpoint at `path` from the digests computed while writing it.
fn manifest_of(
    path: &Path,
    source: &dyn SaveSource,
    pending: &Pending,
) -> Result<Option<Manifest>, ConvertError> {
    let Some((algo, digests)) = &pending.digests else { return Ok(None) };
    let ckpt = tensora_format::open(path)?;
    manifest_for(&ckpt, source, *algo, digests).map(Some)
}

/// A manifest of `ckpt` from `digests`, indexed like `source`'s tensors.
pub(crate) fn manifest_for(
    ckpt: &tensora_format::Checkpoint,
    source: &dyn SaveSource,
    algo: Algo,
    digests: &[Digest],
) -> Result<Manifest, ConvertError> {
    let by_name: HashMap<&str, Digest> =
        source.tensors().iter().zip(digests).map(|(t, d)| (t.name.as_str(), *d)).collect();
    let ordered = ckpt
        .tensors()
        .iter()
        .map(|t| {
            by_name.get(t.name()).copied().ok_or_else(|| ConvertError::Digest {
                reason: format!("tensor {:?} was written without a digest", t.name()),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Manifest::from_checkpoint(ckpt, algo, &ordered)
        .map_err(|e| ConvertError::Digest { reason: e.to_string() })
}

fn report(
    destination: &Path,
    files_written: usize,
    source: &dyn SaveSource,
    pending: &Pending,
    started: Instant,
    commit_seconds: f64,
    manifest: Option<Manifest>,
) -> SaveReport {
    let seconds = started.elapsed().as_secs_f64();
    SaveReport {
        destination: destination.to_path_buf(),
        files_written,
        tensors: source.tensors().len(),
        tensor_bytes: source.tensors().iter().map(|t| t.nbytes()).sum(),
        bytes_written: pending.bytes_written,
        mode: pending.mode.as_str(),
        reason: pending.reason.clone(),
        threads: pending.threads,
        piece_bytes: pending.piece_bytes,
        staging_bytes: pending.stats.staging_bytes,
        direct_fallbacks: pending.stats.direct_fallbacks,
        seconds,
        gbps: if seconds > 0.0 { pending.bytes_written as f64 / seconds / 1e9 } else { 0.0 },
        durability: pending.durability.as_str(),
        write_seconds: pending.write_seconds,
        commit_seconds,
        digest_algo: pending.digests.as_ref().map(|(a, _)| a.as_str()),
        manifest,
    }
}

/// Write the whole safetensors file of `layout` (from [`safetensors_layout`] of the same
/// `source`) into `out`, which must be exactly `layout.file_len_bytes()` long: what
/// `tensora.save` returns as `bytes`.
pub fn serialize_into(
    layout: &SafetensorsLayout,
    source: &dyn SaveSource,
    out: &mut [u8],
) -> Result<(), ConvertError> {
    if out.len() as u64 != layout.file_len_bytes() || layout.specs().len() != source.tensors().len() {
        return Err(ConvertError::Config {
            reason: format!("a {}-byte buffer for a {}-byte file", out.len(), layout.file_len_bytes()),
        });
    }
    let header = layout.header_bytes();
    out[..header.len()].copy_from_slice(header);
    for &j in layout.file_order() {
        let r = layout.tensor_range(j);
        let dst = &mut out[r.start as usize..r.end as usize];
        let t = &source.tensors()[j];
        t.check()?;
        let read;
        let storage = match source.storage(j) {
            Some(mem) => mem,
            None if t.layout == StorageLayout::Contiguous => {
                source.read_storage(j, 0, dst)?;
                continue;
            }
            None if t.storage_len_bytes <= COPY_BUFFER_BYTES_MAX as u64 => {
                let mut buf = vec![0u8; t.storage_len_bytes as usize];
                source.read_storage(j, 0, &mut buf)?;
                read = buf;
                &read
            }
            None => {
                return Err(ConvertError::Unsupported {
                    tensor: t.name.clone(),
                    reason: format!(
                        "non-contiguous storage over the {COPY_BUFFER_BYTES_MAX}-byte gather bound"
                    ),
                });
            }
        };
        gather(t, storage, 0, dst)?;
    }
    Ok(())
}
