//! Sharded safetensors: the HF index (`*.safetensors.index.json`) and directories of shards.
//!
//! The index is `{"metadata": {...}, "weight_map": {tensor: shard file}}`. Metadata may hold any
//! keys; `total_size` is compared with the shards and a disagreement is a [`Warning`], not an
//! error. Everything else is strict: shard names must be plain file names, every listed shard
//! must exist, every tensor must be exactly where the map says and nowhere else.
//!
//! ```
//! let index = br#"{"metadata": {"total_size": 8}, "weight_map": {"w": "a.safetensors"}}"#;
//! let parsed = tensora_format::sharded::parse_index(index).unwrap();
//! assert_eq!(parsed.weight_map().collect::<Vec<_>>(), [("w", "a.safetensors")]);
//! assert_eq!(parsed.total_size_bytes(), Some(8));
//! ```

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use crate::safetensors::{Header, read_header_stamped};
use crate::{
    Checkpoint, Error, ErrorKind, FileEntry, FileId, FileStamp, Format, Result, TensorInfo, Warning,
};

mod index;

pub use index::{INDEX_BYTES_MAX, INDEX_METADATA_KEYS_MAX, ShardIndex, parse_index};

/// The most directory entries looked at when listing a checkpoint directory.
pub const DIR_ENTRIES_MAX: usize = 1_000_000;
/// Suffix of an HF index file.
pub const INDEX_SUFFIX: &str = ".safetensors.index.json";

/// A shard name must be a plain file name: no separator, not `.` or `..`, not absolute, no NUL.
pub fn check_shard_name(shard: &str) -> std::result::Result<(), ErrorKind> {
    let plain = !shard.is_empty()
        && shard != "."
        && shard != ".."
        && !shard.contains(['/', '\\', '\0'])
        && !Path::new(shard).is_absolute();
    if plain { Ok(()) } else { Err(ErrorKind::BadShardName { shard: shard.to_string() }) }
}

/// Read an index file with the [`INDEX_BYTES_MAX`] cap.
fn read_index_file(path: &Path) -> Result<Vec<u8>> {
    crate::read_capped(path, INDEX_BYTES_MAX)
}

/// Turn a parsed header into tensor infos for file `file`.
fn tensors_of(
    mut header: Header,
    file: FileId,
    out: &mut Vec<TensorInfo>,
) -> Option<BTreeMap<String, String>> {
    let data_start = header.data_start_bytes();
    out.reserve(header.len());
    for t in header.tensors() {
        let (start, end) = t.data_offsets();
        out.push(TensorInfo {
            len_bytes: end - start,
            offset_bytes: data_start + start,
            name: t.name().to_string(),
            dtype: t.dtype(),
            shape: t.shape().to_vec(),
            file,
            strides: None,
        });
    }
    header.take_metadata()
}

/// Open one `.safetensors` file.
pub(crate) fn open_file(path: &Path) -> Result<Checkpoint> {
    let (header, meta) = read_header_stamped(path)?;
    Ok(assemble_file(path.to_path_buf(), FileStamp::from_metadata(&meta), header))
}

/// One safetensors file from its validated header and its stamp (which the caller checked agree).
pub(crate) fn assemble_file(path: PathBuf, stamp: FileStamp, header: Header) -> Checkpoint {
    let entry = FileEntry { path: path.clone(), stamp, data_start_bytes: header.data_start_bytes() };
    let mut tensors = Vec::new();
    let metadata = tensors_of(header, FileId(0), &mut tensors).unwrap_or_default();
    Checkpoint::from_parts(Format::Safetensors, path, vec![entry], tensors, metadata, Vec::new())
}

/// A shard as handed to the assembly functions: where it is, its stamp and its parsed header.
pub(crate) type ShardParts = (PathBuf, FileStamp, Header);

/// Merge a shard's `__metadata__` into `into`; keys already present keep their value, and a
/// different value from another shard is a warning.
fn merge_metadata(
    into: &mut BTreeMap<String, String>,
    from: BTreeMap<String, String>,
    protected: &BTreeMap<String, String>,
    shard: &Path,
    warnings: &mut Vec<Warning>,
) {
    for (k, v) in from {
        if protected.contains_key(&k) {
            continue;
        }
        match into.get(&k) {
            None => {
                into.insert(k, v);
            }
            Some(existing) if *existing == v => {}
            Some(existing) => warnings.push(Warning {
                path: shard.to_path_buf(),
                message: format!(
                    "metadata {k:?} is {v:?} here but {existing:?} in an earlier shard; kept the first"
                ),
            }),
        }
    }
}

/// Open a sharded checkpoint through its index.
pub(crate) fn open_indexed(dir: &Path, index_path: &Path) -> Result<Checkpoint> {
    let bytes = read_index_file(index_path)?;
    let index = parse_index(&bytes).map_err(|k| Error::new(index_path, k))?;
    drop(bytes);
    assemble_indexed(dir, index_path, &index, |shard| {
        let path = dir.join(shard);
        let (header, meta) = read_header_stamped(&path).map_err(|e| match e.kind() {
            ErrorKind::Io(io) if io.kind() == std::io::ErrorKind::NotFound => {
                Error::new(index_path, ErrorKind::MissingShard { shard: shard.to_string() })
            }
            _ => e,
        })?;
        Ok((path, FileStamp::from_metadata(&meta), header))
    })
}

/// The checks of [`open_indexed`] over shards handed out by `shard_of` (called once per shard
/// name of the index, in sorted order; an error from it is returned as is).
pub(crate) fn assemble_indexed(
    dir: &Path,
    index_path: &Path,
    index: &ShardIndex,
    mut shard_of: impl FnMut(&str) -> Result<ShardParts>,
) -> Result<Checkpoint> {
    /// Not found in any shard yet.
    const NOWHERE: u32 = u32::MAX;
    let shard_names: Vec<&str> = index.shard_names().collect();
    let mut files = Vec::with_capacity(shard_names.len());
    let mut tensors: Vec<TensorInfo> = Vec::with_capacity(index.len());
    // Per index entry: the shard (id) whose header holds the tensor.
    let mut found_in: Vec<u32> = vec![NOWHERE; index.len()];
    let mut metadata = index.metadata().clone();
    let mut warnings = Vec::new();
    for (k, shard) in shard_names.iter().enumerate() {
        let (path, stamp, header) = shard_of(shard)?;
        files.push(FileEntry { path: path.clone(), stamp, data_start_bytes: header.data_start_bytes() });
        let first_new = tensors.len();
        let shard_meta = tensors_of(header, FileId(k as u32), &mut tensors);
        for t in &tensors[first_new..] {
            let Some(entry) = index.entry_of(&t.name) else {
                return Err(Error::new(&path, ErrorKind::TensorNotInIndex { shard: (*shard).to_string() })
                    .with_tensor(t.name.clone()));
            };
            let prev = std::mem::replace(&mut found_in[entry], k as u32);
            if prev != NOWHERE {
                return Err(Error::new(
                    index_path,
                    ErrorKind::TensorInTwoShards {
                        first: shard_names[prev as usize].to_string(),
                        second: (*shard).to_string(),
                    },
                )
                .with_tensor(t.name.clone()));
            }
        }
        if let Some(m) = shard_meta {
            merge_metadata(&mut metadata, m, index.metadata(), &path, &mut warnings);
        }
    }
    for (entry, &found) in found_in.iter().enumerate() {
        let (name, shard) = index.entry(entry);
        if found != shard {
            let shard = index.shard_name(shard).to_string();
            return Err(Error::new(index_path, ErrorKind::TensorNotInShard { shard }).with_tensor(name));
        }
    }
    let actual: u64 = tensors.iter().map(|t| t.len_bytes).sum();
    match index.total_size() {
        Some(Ok(declared)) if *declared != actual => warnings.push(Warning {
            path: index_path.to_path_buf(),
            message: format!("total_size is {declared} but the shards hold {actual} bytes of tensor data"),
        }),
        Some(Err(text)) => warnings.push(Warning {
            path: index_path.to_path_buf(),
            message: format!("total_size {text} is not a non-negative integer"),
        }),
        _ => {}
    }
    Ok(Checkpoint::from_parts(
        Format::SafetensorsSharded,
        dir.to_path_buf(),
        files,
        tensors,
        metadata,
        warnings,
    ))
}

/// Open a directory of `.safetensors` files with no index (files in name order).
pub(crate) fn open_unindexed(dir: &Path, shard_paths: &[PathBuf]) -> Result<Checkpoint> {
    assemble_unindexed(
        dir,
        shard_paths.iter().map(|path| {
            let (header, meta) = read_header_stamped(path)?;
            Ok((path.clone(), FileStamp::from_metadata(&meta), header))
        }),
    )
}

/// The checks of [`open_unindexed`] over shards in the given order (the first error stops).
pub(crate) fn assemble_unindexed(
    dir: &Path,
    shards: impl Iterator<Item = Result<ShardParts>>,
) -> Result<Checkpoint> {
    let mut files: Vec<FileEntry> = Vec::new();
    let mut tensors: Vec<TensorInfo> = Vec::new();
    let mut found_in: HashMap<String, usize> = HashMap::new();
    let mut metadata = BTreeMap::new();
    let mut warnings = Vec::new();
    for (k, shard) in shards.enumerate() {
        let (path, stamp, header) = shard?;
        files.push(FileEntry { path: path.clone(), stamp, data_start_bytes: header.data_start_bytes() });
        let path = &path;
        let first_new = tensors.len();
        let shard_meta = tensors_of(header, FileId(k as u32), &mut tensors);
        for t in &tensors[first_new..] {
            if let Some(prev) = found_in.insert(t.name.clone(), k) {
                let name_of =
                    |p: &Path| p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                return Err(Error::new(
                    dir,
                    ErrorKind::TensorInTwoShards { first: name_of(&files[prev].path), second: name_of(path) },
                )
                .with_tensor(t.name.clone()));
            }
        }
        if let Some(m) = shard_meta {
            merge_metadata(&mut metadata, m, &BTreeMap::new(), path, &mut warnings);
        }
    }
    let format = if files.len() == 1 { Format::Safetensors } else { Format::SafetensorsSharded };
    Ok(Checkpoint::from_parts(format, dir.to_path_buf(), files, tensors, metadata, warnings))
}

/// Open a directory: ServerlessLLM, indexed shards, or a plain directory of `.safetensors` files.
pub(crate) fn open_dir(dir: &Path) -> Result<Checkpoint> {
    if crate::sllm::looks_like_sllm_dir(dir) {
        return crate::sllm::open_dir(dir);
    }
    let io = |e| Error::new(dir, ErrorKind::Io(e));
    let mut indexes = Vec::new();
    let mut shards = Vec::new();
    for (seen, entry) in std::fs::read_dir(dir).map_err(io)?.enumerate() {
        if seen >= DIR_ENTRIES_MAX {
            return Err(Error::new(
                dir,
                ErrorKind::NotACheckpoint {
                    reason: format!("more than {DIR_ENTRIES_MAX} directory entries"),
                },
            ));
        }
        let entry = entry.map_err(io)?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.starts_with('.') {
            continue; // Hidden files, including our own in-progress temp files.
        }
        if name.ends_with(INDEX_SUFFIX) {
            indexes.push(entry.path());
        } else if name.ends_with(".safetensors") {
            // Whatever it is: a FIFO or a directory so named is refused when opened, not skipped.
            shards.push(entry.path());
        }
    }
    indexes.sort();
    shards.sort();
    match indexes.len() {
        1 => open_indexed(dir, &indexes[0]),
        0 if !shards.is_empty() => open_unindexed(dir, &shards),
        0 => Err(Error::new(
            dir,
            ErrorKind::NotACheckpoint {
                reason: "no tensor_index.json, *.safetensors.index.json or *.safetensors file".into(),
            },
        )),
        _ => Err(Error::new(
            dir,
            ErrorKind::NotACheckpoint {
                reason: format!(
                    "{} index files ({}); open one of them directly",
                    indexes.len(),
                    indexes
                        .iter()
                        .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            },
        )),
    }
}

#[cfg(test)]
mod tests;
