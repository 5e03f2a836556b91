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
//! assert_eq!(parsed.weight_map()[0], ("w".to_string(), "a.safetensors".to_string()));
//! assert_eq!(parsed.total_size_bytes(), Some(8));
//! ```

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use simd_json::{Buffers, Node, StaticNode};

use crate::safetensors::{Header, Members, read_header_stamped};
use crate::{
    Checkpoint, Error, ErrorKind, FileEntry, FileId, FileStamp, Format, Result, TensorInfo, Warning,
};

/// The largest index file accepted, in bytes (an index for a 1,000-shard, million-tensor model is
/// well under this).
pub const INDEX_BYTES_MAX: u64 = 64 * 1024 * 1024;
/// The most directory entries looked at when listing a checkpoint directory.
pub const DIR_ENTRIES_MAX: usize = 1_000_000;
/// Suffix of an HF index file.
pub const INDEX_SUFFIX: &str = ".safetensors.index.json";

/// A parsed sharded-checkpoint index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardIndex {
    metadata: BTreeMap<String, String>,
    total_size: Option<std::result::Result<u64, String>>,
    weight_map: Vec<(String, String)>,
}

impl ShardIndex {
    /// `metadata`, flattened: strings as they are, every other value as compact JSON text.
    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.metadata
    }
    /// `metadata.total_size` when present and a non-negative integer.
    pub fn total_size_bytes(&self) -> Option<u64> {
        self.total_size.as_ref().and_then(|r| r.as_ref().ok().copied())
    }
    /// `(tensor, shard file)` in index order. Tensor names are unique.
    pub fn weight_map(&self) -> &[(String, String)] {
        &self.weight_map
    }
}

fn bad_index(message: impl Into<String>) -> ErrorKind {
    ErrorKind::BadIndex { message: message.into() }
}

/// Parse an index from bytes. Duplicate top-level keys, duplicate metadata keys and duplicate
/// tensors in `weight_map` are errors, as are shard names that are not plain file names.
pub fn parse_index(bytes: &[u8]) -> std::result::Result<ShardIndex, ErrorKind> {
    if bytes.len() as u64 > INDEX_BYTES_MAX {
        return Err(ErrorKind::IndexTooLarge { len_bytes: bytes.len() as u64, limit_bytes: INDEX_BYTES_MAX });
    }
    let mut copy = bytes.to_vec();
    let mut buffers = Buffers::with_max_depth(copy.len(), copy.len() + 2);
    let tape = simd_json::to_tape_with_buffers(&mut copy, &mut buffers)
        .map_err(|e| bad_index(format!("not valid JSON: {:?} near byte {}", e.error(), e.index())))?;
    let nodes = &tape.0;
    let Some(&Node::Object { len, .. }) = nodes.first() else {
        return Err(bad_index("not a JSON object"));
    };
    let mut metadata: Option<BTreeMap<String, String>> = None;
    let mut total_size = None;
    let mut weight_map: Option<Vec<(String, String)>> = None;
    for member in Members::of(nodes, len) {
        let Some((key, value)) = member else {
            return Err(bad_index("object key is not a string"));
        };
        match key {
            "metadata" => {
                if metadata.is_some() {
                    return Err(bad_index("duplicate key \"metadata\""));
                }
                let (map, size) = parse_index_metadata(value)?;
                metadata = Some(map);
                total_size = size;
            }
            "weight_map" => {
                if weight_map.is_some() {
                    return Err(bad_index("duplicate key \"weight_map\""));
                }
                weight_map = Some(parse_weight_map(value)?);
            }
            _ => {} // Other top-level keys are not ours to judge.
        }
    }
    let weight_map = weight_map.ok_or_else(|| bad_index("missing \"weight_map\""))?;
    Ok(ShardIndex { metadata: metadata.unwrap_or_default(), total_size, weight_map })
}

type MetadataAndSize = (BTreeMap<String, String>, Option<std::result::Result<u64, String>>);

fn parse_index_metadata(value: &[Node<'_>]) -> std::result::Result<MetadataAndSize, ErrorKind> {
    match value.first() {
        Some(Node::Static(StaticNode::Null)) => Ok((BTreeMap::new(), None)),
        Some(&Node::Object { len, .. }) => {
            let mut map = BTreeMap::new();
            let mut total_size = None;
            for member in Members::of(value, len) {
                let Some((k, v)) = member else {
                    return Err(bad_index("metadata key is not a string"));
                };
                let text = match v.first() {
                    Some(Node::String(s)) => (*s).to_string(),
                    _ => tape_to_json(v),
                };
                if k == "total_size" {
                    total_size = Some(match v.first() {
                        Some(Node::Static(StaticNode::U64(n))) => Ok(*n),
                        _ => Err(text.clone()),
                    });
                }
                if map.insert(k.to_string(), text).is_some() {
                    return Err(bad_index(format!("duplicate metadata key {k:?}")));
                }
            }
            Ok((map, total_size))
        }
        _ => Err(bad_index("\"metadata\" is not an object")),
    }
}

fn parse_weight_map(value: &[Node<'_>]) -> std::result::Result<Vec<(String, String)>, ErrorKind> {
    let Some(&Node::Object { len, .. }) = value.first() else {
        return Err(bad_index("\"weight_map\" is not an object"));
    };
    let mut seen: HashMap<&str, ()> = HashMap::with_capacity(len);
    let mut out = Vec::with_capacity(len);
    for member in Members::of(value, len) {
        let Some((name, shard)) = member else {
            return Err(bad_index("malformed weight_map"));
        };
        let Some(Node::String(shard)) = shard.first() else {
            return Err(bad_index(format!("weight_map value for {name:?} is not a string")));
        };
        check_shard_name(shard)?;
        if seen.insert(name, ()).is_some() {
            return Err(bad_index(format!("tensor {name:?} appears twice in weight_map")));
        }
        out.push((name.to_string(), (*shard).to_string()));
    }
    Ok(out)
}

/// A shard name must be a plain file name: no separator, not `.` or `..`, not absolute, no NUL.
pub fn check_shard_name(shard: &str) -> std::result::Result<(), ErrorKind> {
    let plain = !shard.is_empty()
        && shard != "."
        && shard != ".."
        && !shard.contains(['/', '\\', '\0'])
        && !Path::new(shard).is_absolute();
    if plain { Ok(()) } else { Err(ErrorKind::BadShardName { shard: shard.to_string() }) }
}

/// Compact JSON text of a tape value, without recursion (any depth).
fn tape_to_json(nodes: &[Node<'_>]) -> String {
    struct Open {
        is_object: bool,
        members_left: usize,
        expect_key: bool,
        members_emitted: usize,
    }
    let mut stack: Vec<Open> = Vec::new();
    let mut out = Vec::new();
    for node in nodes {
        let is_key = stack.last().is_some_and(|top| top.is_object && top.expect_key);
        if let Some(top) = stack.last()
            && (is_key || !top.is_object)
            && top.members_emitted > 0
        {
            out.push(b',');
        }
        match node {
            Node::String(s) => crate::write::json_string(&mut out, s),
            Node::Static(StaticNode::Null) => out.extend_from_slice(b"null"),
            Node::Static(StaticNode::Bool(b)) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
            Node::Static(StaticNode::U64(v)) => out.extend_from_slice(v.to_string().as_bytes()),
            Node::Static(StaticNode::I64(v)) => out.extend_from_slice(v.to_string().as_bytes()),
            Node::Static(StaticNode::F64(v)) => out.extend_from_slice(v.to_string().as_bytes()),
            Node::Object { .. } => out.push(b'{'),
            Node::Array { .. } => out.push(b'['),
            #[allow(unreachable_patterns)]
            _ => out.extend_from_slice(b"null"),
        }
        if is_key {
            out.push(b':');
            if let Some(top) = stack.last_mut() {
                top.expect_key = false;
            }
            continue;
        }
        if let Some(top) = stack.last_mut() {
            top.members_left = top.members_left.saturating_sub(1);
            top.members_emitted += 1;
            top.expect_key = true;
        }
        if let Node::Object { len, .. } | Node::Array { len, .. } = node {
            stack.push(Open {
                is_object: matches!(node, Node::Object { .. }),
                members_left: *len,
                expect_key: true,
                members_emitted: 0,
            });
        }
        while let Some(top) = stack.last() {
            if top.members_left != 0 {
                break;
            }
            out.push(if top.is_object { b'}' } else { b']' });
            stack.pop();
        }
    }
    String::from_utf8(out).unwrap_or_default()
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
    let mut shard_names: Vec<&str> = index.weight_map.iter().map(|(_, s)| s.as_str()).collect();
    shard_names.sort_unstable();
    shard_names.dedup();
    let shard_id: HashMap<&str, usize> = shard_names.iter().enumerate().map(|(i, s)| (*s, i)).collect();
    let mapped: HashMap<&str, usize> =
        index.weight_map.iter().map(|(t, s)| (t.as_str(), shard_id[s.as_str()])).collect();

    let mut files = Vec::with_capacity(shard_names.len());
    let mut tensors: Vec<TensorInfo> = Vec::with_capacity(index.weight_map.len());
    let mut found_in: HashMap<String, usize> = HashMap::with_capacity(index.weight_map.len());
    let mut metadata = index.metadata.clone();
    let mut warnings = Vec::new();
    for (k, shard) in shard_names.iter().enumerate() {
        let (path, stamp, header) = shard_of(shard)?;
        files.push(FileEntry { path: path.clone(), stamp, data_start_bytes: header.data_start_bytes() });
        let first_new = tensors.len();
        let shard_meta = tensors_of(header, FileId(k as u32), &mut tensors);
        for t in &tensors[first_new..] {
            if !mapped.contains_key(t.name.as_str()) {
                return Err(Error::new(&path, ErrorKind::TensorNotInIndex { shard: (*shard).to_string() })
                    .with_tensor(t.name.clone()));
            }
            if let Some(prev) = found_in.insert(t.name.clone(), k) {
                return Err(Error::new(
                    index_path,
                    ErrorKind::TensorInTwoShards {
                        first: shard_names[prev].to_string(),
                        second: (*shard).to_string(),
                    },
                )
                .with_tensor(t.name.clone()));
            }
        }
        if let Some(m) = shard_meta {
            merge_metadata(&mut metadata, m, &index.metadata, &path, &mut warnings);
        }
    }
    for (name, shard) in &index.weight_map {
        if found_in.get(name.as_str()) != Some(&shard_id[shard.as_str()]) {
            return Err(Error::new(index_path, ErrorKind::TensorNotInShard { shard: shard.clone() })
                .with_tensor(name.clone()));
        }
    }
    let actual: u64 = tensors.iter().map(|t| t.len_bytes).sum();
    match &index.total_size {
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
