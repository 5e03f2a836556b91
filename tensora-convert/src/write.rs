//! The two output layouts: ServerlessLLM partitions and (sharded) safetensors, each written
//! through the copy loop into the temporary directory.

use std::collections::{BTreeMap, HashMap};
use std::fs::{self};
use std::path::Path;

use tensora_format::sllm::write::{SllmLayout, SllmLayoutConfig, SllmTensorSpec};
use tensora_format::write::{SafetensorsLayout, ShardedLayout, TensorSpec};
use tensora_format::{Checkpoint, Format, TensorInfo};

use crate::copy::{Copier, safetensors_copy_len_bytes};
use crate::{ConvertConfig, ConvertError, SAFETENSORS_FILE_NAME, io_err};

pub(crate) fn write_sllm(
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

pub(crate) fn safetensors_specs(src: &Checkpoint) -> Vec<TensorSpec> {
    src.tensors()
        .iter()
        .map(|t| TensorSpec { name: t.name().to_owned(), dtype: t.dtype(), shape: t.shape().to_vec() })
        .collect()
}

pub(crate) fn safetensors_metadata(src: &Checkpoint) -> BTreeMap<String, String> {
    let mut metadata = src.metadata().clone();
    if src.format() == Format::ServerlessLlm || metadata.is_empty() {
        // transformers refuses safetensors without a known "format".
        metadata.entry("format".to_owned()).or_insert_with(|| "pt".to_owned());
    }
    metadata.remove("total_size");
    metadata
}

pub(crate) fn safetensors_layout(src: &Checkpoint) -> Result<SafetensorsLayout, ConvertError> {
    Ok(SafetensorsLayout::new(safetensors_specs(src), safetensors_metadata(src))?)
}

pub(crate) fn write_st_dir(
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
pub(crate) fn dir_len_bytes(dir: &Path) -> Result<u64, ConvertError> {
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
