//! The two output layouts of a conversion as file plans for the writer: ServerlessLLM partitions
//! (and `tensor_index.json`) and (sharded) safetensors.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::io::Write;
use std::path::Path;

use tensora_format::sllm::write::{SllmLayout, SllmLayoutConfig, SllmTensorSpec};
use tensora_format::write::{SHARD_INDEX_FILE_NAME, SafetensorsLayout, ShardedLayout, TensorSpec};
use tensora_format::{Checkpoint, Format};

use crate::save::output::write_err;
use crate::save::plan::FilePlan;
use crate::{ConvertConfig, ConvertError, SAFETENSORS_FILE_NAME};

/// The plans of a conversion into directory `dir`, the small files written after them (indexes:
/// name and bytes), and how many tensors are stored as ties.
pub(crate) struct DirPlans {
    pub(crate) plans: Vec<FilePlan>,
    pub(crate) extra_files: Vec<(&'static str, Vec<u8>)>,
    pub(crate) tied_tensors: usize,
}

/// ServerlessLLM: each distinct storage once (ties point at it), partitions under the cap.
pub(crate) fn sllm_plans(
    src: &Checkpoint,
    dir: &Path,
    cfg: &ConvertConfig,
) -> Result<DirPlans, ConvertError> {
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
    let plans = FilePlan::sllm(&layout, |p| tensora_format::sllm::partition_path(dir, p));
    let index = layout.index_json().into_bytes();
    Ok(DirPlans {
        plans,
        extra_files: vec![(tensora_format::sllm::INDEX_FILE_NAME, index)],
        tied_tensors: tied,
    })
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

/// Safetensors into `dir`: `model.safetensors`, or shards and their index under a cap.
pub(crate) fn st_plans(src: &Checkpoint, dir: &Path, cfg: &ConvertConfig) -> Result<DirPlans, ConvertError> {
    let identity: Vec<usize> = (0..src.tensors().len()).collect();
    match cfg.shard_bytes_max {
        None => {
            let layout = safetensors_layout(src)?;
            let plan = FilePlan::safetensors(dir.join(SAFETENSORS_FILE_NAME), &layout, &identity);
            Ok(DirPlans { plans: vec![plan], extra_files: Vec::new(), tied_tensors: 0 })
        }
        Some(cap) => {
            let layout = ShardedLayout::new(safetensors_specs(src), safetensors_metadata(src), cap)?;
            let plans = layout
                .shards()
                .iter()
                .map(|s| FilePlan::safetensors(dir.join(&s.file_name), &s.layout, &s.spec_indices))
                .collect();
            let index = layout.index_json().to_vec();
            Ok(DirPlans { plans, extra_files: vec![(SHARD_INDEX_FILE_NAME, index)], tied_tensors: 0 })
        }
    }
}

/// Write a small file (an index) into the temporary directory, synced.
pub(crate) fn write_small(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), ConvertError> {
    let path = dir.join(name);
    let mut f = fs::File::create_new(&path).map_err(|e| write_err(&path, "creating", e))?;
    f.write_all(bytes).and_then(|()| f.sync_all()).map_err(|e| write_err(&path, "writing", e))
}
