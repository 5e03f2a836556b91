//! [`Rebuild`]: what an open assembled its checkpoint from (headers, indexes, each object's URL
//! and stamp), kept so that the same checkpoint can be assembled again over other files: the
//! cache's complete local copies, which `tensora_io` then loads like any local checkpoint.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use tensora_format::assemble::{Partition, SafetensorsObject};
use tensora_format::sharded::ShardIndex;
use tensora_format::sllm::SllmIndex;
use tensora_format::{Checkpoint, FileStamp};

/// How the shards of a safetensors checkpoint are related.
#[derive(Debug, Clone)]
pub(crate) enum ShardLayout {
    /// One file.
    Single,
    /// Shards found by listing.
    Listed,
    /// Shards named by an HF index (at `url`).
    Indexed { url: PathBuf, index: Box<ShardIndex> },
}

/// The inputs of one assembly.
#[derive(Debug, Clone)]
pub(crate) enum Rebuild {
    /// Safetensors objects (paths are URLs).
    Safetensors { root: PathBuf, layout: ShardLayout, parts: Vec<SafetensorsObject> },
    /// A ServerlessLLM index and its partitions (paths are URLs).
    Sllm { root: PathBuf, index_url: PathBuf, index: SllmIndex, partitions: Vec<Partition> },
}

impl Rebuild {
    /// The checkpoint, assembled by the local rules.
    pub fn assemble(&self) -> tensora_format::Result<Checkpoint> {
        match self.clone() {
            Rebuild::Safetensors { root, layout, parts } => match layout {
                ShardLayout::Single => match parts.into_iter().next() {
                    Some(part) => tensora_format::assemble::safetensors_file(part),
                    None => tensora_format::assemble::unindexed_shards(&root, Vec::new()),
                },
                ShardLayout::Listed => tensora_format::assemble::unindexed_shards(&root, parts),
                ShardLayout::Indexed { url, index } => {
                    tensora_format::assemble::indexed_shards(&root, &url, &index, parts)
                }
            },
            Rebuild::Sllm { root, index_url, index, partitions } => {
                tensora_format::assemble::serverlessllm(&root, &index_url, index, partitions)
            }
        }
    }

    /// The same checkpoint over local files: `local` maps each object's URL to its local copy,
    /// whose stamp (size, mtime, device, inode) the load then checks. The tensors are checked to
    /// be the same (name, file, offset, length) as `remote`'s.
    pub fn relocated(
        &self,
        remote: &Checkpoint,
        local: &HashMap<String, PathBuf>,
    ) -> Result<Checkpoint, String> {
        let moved = |path: &Path| -> Result<(PathBuf, FileStamp), String> {
            let url = path.to_string_lossy();
            let to = local.get(url.as_ref()).ok_or_else(|| format!("no local copy of {url}"))?;
            let meta = std::fs::metadata(to).map_err(|e| format!("{}: {e}", to.display()))?;
            Ok((to.clone(), FileStamp::from_metadata(&meta)))
        };
        let mut rebuild = self.clone();
        match &mut rebuild {
            Rebuild::Safetensors { parts, .. } => {
                for part in parts {
                    let (path, stamp) = moved(&part.path)?;
                    if stamp.len_bytes != part.stamp.len_bytes {
                        return Err(format!("{}: not as long as the object", path.display()));
                    }
                    (part.path, part.stamp) = (path, stamp);
                }
            }
            Rebuild::Sllm { partitions, .. } => {
                for part in partitions {
                    let (path, stamp) = moved(&part.path)?;
                    if stamp.len_bytes != part.stamp.len_bytes {
                        return Err(format!("{}: not as long as the object", path.display()));
                    }
                    (part.path, part.stamp) = (path, stamp);
                }
            }
        }
        let checkpoint = rebuild.assemble().map_err(|e| e.to_string())?;
        let key = |c: &Checkpoint| -> Vec<(String, u32, u64, u64)> {
            c.tensors()
                .iter()
                .map(|t| (t.name().to_owned(), t.file().0, t.offset_bytes(), t.len_bytes()))
                .collect()
        };
        if key(&checkpoint) != key(remote) {
            return Err("the local copies assemble to other tensors".to_owned());
        }
        Ok(checkpoint)
    }
}
