//! Checkpoints whose files are not local: parsed headers and indexes in, a validated
//! [`Checkpoint`] out, through the same checks as [`crate::open`].
//!
//! A remote loader (object store, HTTP server) reads each safetensors header with ranged requests,
//! parses it with [`crate::safetensors::parse_header`], and stamps each object with what its server
//! reported (length, last-modified; `dev` and `inode` 0). These functions then apply exactly the
//! rules the local openers apply (shards against their index, one shard per tensor, ServerlessLLM
//! partitions and offsets), so a checkpoint built here is as valid as one from a directory. Paths
//! are only names here (a URL works): nothing is opened.
//!
//! ```
//! use std::path::PathBuf;
//! use tensora_format::assemble::{SafetensorsObject, safetensors_file};
//! use tensora_format::{FileStamp, Format};
//!
//! // An 8-byte prefix, the JSON header, then 8 bytes of F32 data.
//! let json = br#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
//! let mut bytes = (json.len() as u64).to_le_bytes().to_vec();
//! bytes.extend_from_slice(json);
//! let file_len_bytes = bytes.len() as u64 + 8;
//! let header = tensora_format::safetensors::parse_header(&bytes, file_len_bytes)?;
//! let stamp = FileStamp { len_bytes: file_len_bytes, modified: None, dev: 0, inode: 0 };
//! let path = PathBuf::from("http://127.0.0.1:8080/model.safetensors");
//! let name = "model.safetensors".to_owned();
//! let ckpt = safetensors_file(SafetensorsObject { path, name, stamp, header })?;
//! assert_eq!(ckpt.format(), Format::Safetensors);
//! assert_eq!(ckpt.tensor("w").unwrap().range(), bytes.len() as u64..file_len_bytes);
//! # Ok::<(), tensora_format::Error>(())
//! ```

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::safetensors::Header;
use crate::sharded::{ShardIndex, ShardTensors};
use crate::sllm::{PARTITIONS_MAX, SllmIndex};
use crate::{Checkpoint, Error, ErrorKind, FileEntry, FileId, FileStamp, Result};

/// One safetensors object: its path (a path or URL, used in errors and as the file's path), its
/// shard name, its stamp, and its parsed header.
#[derive(Debug, Clone)]
pub struct SafetensorsObject {
    /// Where the object lives (a path or URL): named in errors, and the checkpoint file's path.
    pub path: PathBuf,
    /// The shard's name as an HF index spells it (`model-00001-of-00002.safetensors`), decoded:
    /// not the percent-encoded last segment of a URL. [`indexed_shards`] matches on it.
    pub name: String,
    /// `len_bytes` must be the size the header was parsed against.
    pub stamp: FileStamp,
    /// The object's header, parsed against `stamp.len_bytes`.
    pub header: Header,
}

/// One ServerlessLLM partition (`tensor.data_N`): its name and stamp.
#[derive(Debug, Clone)]
pub struct Partition {
    /// Where the partition lives (a path or URL): named in errors, and the checkpoint file's path.
    pub path: PathBuf,
    /// Its size and last-modified as its server reported them (`dev` and `inode` 0).
    pub stamp: FileStamp,
}

/// The header must have been validated against the size the stamp records.
fn checked(object: SafetensorsObject) -> Result<crate::sharded::ShardParts> {
    let SafetensorsObject { path, stamp, header, .. } = object;
    if header.file_len_bytes() != stamp.len_bytes {
        return Err(Error::new(
            &path,
            ErrorKind::NotACheckpoint {
                reason: format!(
                    "the header was validated for a {}-byte file, but the object is {} bytes",
                    header.file_len_bytes(),
                    stamp.len_bytes
                ),
            },
        ));
    }
    Ok((path, stamp, header))
}

/// A single safetensors file, as [`crate::open`] builds it for a `.safetensors` path.
pub fn safetensors_file(object: SafetensorsObject) -> Result<Checkpoint> {
    let (path, stamp, header) = checked(object)?;
    Ok(crate::sharded::assemble_file(path, stamp, header))
}

/// Shards without an index, in the given order (file ids follow it), as [`crate::open`] builds a
/// directory of `.safetensors` files: a tensor in two shards is an error, shard metadata is merged
/// (a disagreement is a warning). One object gives [`crate::Format::Safetensors`].
pub fn unindexed_shards(root: &Path, objects: Vec<SafetensorsObject>) -> Result<Checkpoint> {
    if objects.is_empty() {
        return Err(Error::new(root, ErrorKind::NotACheckpoint { reason: "no safetensors objects".into() }));
    }
    let shards = objects.into_iter().enumerate().map(|(k, object)| {
        let (path, stamp, header) = checked(object)?;
        Ok(ShardTensors::new(path, stamp, header, FileId(k as u32), None))
    });
    crate::sharded::assemble_unindexed(root, shards)
}

/// Shards through their HF index (`index_path` names it in errors), as [`crate::open`] builds an
/// indexed directory. Objects are matched to the index's shard names by
/// [`SafetensorsObject::name`] (never by the path, which may be a percent-encoded URL); a shard
/// the index names but `objects` lacks is [`ErrorKind::MissingShard`], an object the index does not
/// name (or a name given twice) is refused, and every tensor must be exactly where the map says.
/// File ids follow the sorted shard names.
pub fn indexed_shards(
    root: &Path,
    index_path: &Path,
    index: &ShardIndex,
    objects: Vec<SafetensorsObject>,
) -> Result<Checkpoint> {
    let mut by_name: HashMap<String, SafetensorsObject> = HashMap::with_capacity(objects.len());
    for object in objects {
        let name = object.name.clone();
        let refuse =
            |reason: &str| Error::new(&object.path, ErrorKind::NotACheckpoint { reason: reason.into() });
        if !index.has_shard(&name) {
            return Err(refuse("this object is not a shard named by the index"));
        }
        if by_name.contains_key(&name) {
            return Err(refuse("this shard is given twice"));
        }
        by_name.insert(name, object);
    }
    let all: Vec<u32> = (0..index.shard_names().len() as u32).collect();
    crate::sharded::assemble_indexed(root, index_path, index, &all, |k, shard| match by_name.remove(shard) {
        Some(object) => {
            let (path, stamp, header) = checked(object)?;
            Ok(ShardTensors::new(path, stamp, header, FileId(k as u32), Some(index)))
        }
        None => Err(Error::new(index_path, ErrorKind::MissingShard { shard: shard.to_owned() })),
    })
}

/// A ServerlessLLM checkpoint from its parsed `tensor_index.json` (`index_path` names it in
/// errors) and its partitions in order (`tensor.data_0, _1, …`), as
/// [`crate::sllm::open_dir`] builds it: every global offset mapped to (partition, local offset)
/// by the partitions' sizes, a tensor outside one partition refused, the same warnings.
pub fn serverlessllm(
    root: &Path,
    index_path: &Path,
    index: SllmIndex,
    partitions: Vec<Partition>,
) -> Result<Checkpoint> {
    if partitions.is_empty() {
        return Err(Error::new(root, ErrorKind::NoPartitions));
    }
    if partitions.len() > PARTITIONS_MAX as usize {
        return Err(Error::new(
            root,
            ErrorKind::NotACheckpoint { reason: format!("more than {PARTITIONS_MAX} partitions") },
        ));
    }
    let files = partitions
        .into_iter()
        .map(|p| FileEntry { path: p.path, stamp: p.stamp, data_start_bytes: 0 })
        .collect();
    crate::sllm::assemble(root, index_path.to_path_buf(), index, files)
}

#[cfg(test)]
mod tests;
