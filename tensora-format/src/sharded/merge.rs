//! Merging shards into one [`Checkpoint`]: each shard's tensors are built where its header was
//! parsed ([`ShardTensors::new`], on a worker thread when opening locally), then merged in order
//! on one thread with the strict rules: every tensor in exactly one shard, exactly where the
//! index says.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::ShardIndex;
use crate::names::NameTable;
use crate::safetensors::Header;
use crate::{
    Checkpoint, Error, ErrorKind, FileEntry, FileId, FileStamp, Format, Result, TensorInfo, Warning,
};

/// The entry of a tensor that the index does not map (or of any tensor, without an index).
const UNMAPPED: u32 = crate::names::NOT_FOUND;

/// One shard, ready to merge: its file entry, its tensors (as file `file` of the checkpoint), its
/// `__metadata__`, and, with an index, each tensor's entry in it.
#[derive(Debug)]
pub(crate) struct ShardTensors {
    pub(crate) file: FileEntry,
    pub(crate) tensors: Vec<TensorInfo>,
    pub(crate) metadata: Option<BTreeMap<String, String>>,
    /// Per tensor: its entry in the index, or [`UNMAPPED`]; empty without an index.
    pub(crate) entries: Vec<u32>,
}

impl ShardTensors {
    /// Shard `file` of a checkpoint from its parsed header (which the caller validated against
    /// `stamp`); each tensor looked up in `index` when there is one.
    pub(crate) fn new(
        path: PathBuf,
        stamp: FileStamp,
        header: Header,
        file: FileId,
        index: Option<&ShardIndex>,
    ) -> ShardTensors {
        let entry = FileEntry { path, stamp, data_start_bytes: header.data_start_bytes() };
        let mut tensors = Vec::new();
        let metadata = header.into_tensors(file, &mut tensors);
        let mut shard = ShardTensors { file: entry, tensors, metadata, entries: Vec::new() };
        if let Some(index) = index {
            shard.look_up(index);
        }
        shard
    }

    /// Make it file `file` of the checkpoint, and look its tensors up in `index` unless that was
    /// done when it was built.
    pub(crate) fn place(&mut self, file: FileId, index: &ShardIndex) {
        if self.tensors.first().is_some_and(|t| t.file != file) {
            for t in &mut self.tensors {
                t.file = file;
            }
        }
        if self.entries.len() != self.tensors.len() {
            self.look_up(index);
        }
    }

    /// Each tensor's entry in `index`, all looked up at once.
    fn look_up(&mut self, index: &ShardIndex) {
        let names: Vec<&str> = self.tensors.iter().map(TensorInfo::name).collect();
        self.entries.clear();
        index.entries_of(&names, &mut self.entries);
    }
}

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

/// One safetensors file from its validated header and its stamp (which the caller checked agree).
pub(crate) fn assemble_file(path: PathBuf, stamp: FileStamp, header: Header) -> Checkpoint {
    let shard = ShardTensors::new(path.clone(), stamp, header, FileId(0), None);
    let metadata = shard.metadata.unwrap_or_default();
    Checkpoint::from_parts(Format::Safetensors, path, vec![shard.file], shard.tensors, metadata, Vec::new())
}

/// The checks of an indexed open over the shards `parse` (ids, sorted), handed out by
/// `shard_of(k, name)` for `k` in order (an error from it is returned as is). With every shard
/// parsed, every tensor must be exactly where the index says; with some, that holds for the
/// parsed ones, `total_size` is not compared, and a warning says what was skipped.
pub(crate) fn assemble_indexed(
    dir: &Path,
    index_path: &Path,
    index: &ShardIndex,
    parse: &[u32],
    mut shard_of: impl FnMut(usize, &str) -> Result<ShardTensors>,
) -> Result<Checkpoint> {
    /// Not found in any shard yet, or a shard not parsed.
    const NOWHERE: u32 = u32::MAX;
    let shard_count = index.shard_names().len();
    let mut file_of_shard = vec![NOWHERE; shard_count];
    for (file, &shard) in parse.iter().enumerate() {
        file_of_shard[shard as usize] = file as u32;
    }
    let mut files = Vec::with_capacity(parse.len());
    let mut tensors: Vec<TensorInfo> =
        Vec::with_capacity(if parse.len() == shard_count { index.len() } else { 0 });
    // Per index entry: the file whose header holds the tensor.
    let mut found_in: Vec<u32> = vec![NOWHERE; index.len()];
    let mut metadata = index.metadata().clone();
    let mut warnings = Vec::new();
    for (k, &shard_id) in parse.iter().enumerate() {
        let shard = index.shard_name(shard_id);
        let parts = shard_of(k, shard)?;
        for (t, &entry) in parts.tensors.iter().zip(&parts.entries) {
            if entry == UNMAPPED {
                return Err(Error::new(
                    &parts.file.path,
                    ErrorKind::TensorNotInIndex { shard: shard.to_string() },
                )
                .with_tensor(t.name()));
            }
            let prev = std::mem::replace(&mut found_in[entry as usize], k as u32);
            if prev != NOWHERE {
                let first = index.shard_name(parse[prev as usize]).to_string();
                return Err(Error::new(
                    index_path,
                    ErrorKind::TensorInTwoShards { first, second: shard.to_string() },
                )
                .with_tensor(t.name()));
            }
        }
        if let Some(m) = parts.metadata {
            merge_metadata(&mut metadata, m, index.metadata(), &parts.file.path, &mut warnings);
        }
        files.push(parts.file);
        tensors.extend(parts.tensors);
    }
    for (entry, &found) in found_in.iter().enumerate() {
        let (name, shard) = index.entry(entry);
        let expected = file_of_shard[shard as usize];
        if expected != NOWHERE && found != expected {
            let shard = index.shard_name(shard).to_string();
            return Err(Error::new(index_path, ErrorKind::TensorNotInShard { shard }).with_tensor(name));
        }
    }
    if parse.len() == shard_count {
        total_size_warning(index, &tensors, index_path, &mut warnings);
    } else {
        let skipped = found_in.iter().filter(|&&f| f == NOWHERE).count();
        warnings.push(Warning {
            path: index_path.to_path_buf(),
            message: format!(
                "lazy open: parsed {} of {shard_count} shards (those holding a selected tensor); the other {} were \
                 not opened and their {skipped} tensors are not in this checkpoint; total_size not compared",
                parse.len(),
                shard_count - parse.len()
            ),
        });
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

/// A `total_size` that disagrees with the tensors, or is not an integer, is a warning.
fn total_size_warning(
    index: &ShardIndex,
    tensors: &[TensorInfo],
    index_path: &Path,
    warnings: &mut Vec<Warning>,
) {
    let actual: u64 = tensors.iter().map(|t| t.len_bytes).sum();
    match index.total_size() {
        Some(Ok(declared)) if *declared != actual => warnings.push(Warning {
            path: index_path.to_path_buf(),
            message: format!("total_size is {declared} but the shards hold {actual} bytes of tensor data"),
        }),
        Some(Err(text)) => warnings.push(Warning {
            path: index_path.to_path_buf(),
            // The index's own text: escaped, so that a control character in it (a terminal
            // escape) does not reach the terminal the warning is printed on.
            message: format!("total_size {} is not a non-negative integer", text.escape_debug()),
        }),
        _ => {}
    }
}

/// The checks of an open without an index over shards in the given order (the first error
/// stops): no tensor in two shards; metadata merged.
pub(crate) fn assemble_unindexed(
    dir: &Path,
    shards: impl Iterator<Item = Result<ShardTensors>>,
) -> Result<Checkpoint> {
    let mut files: Vec<FileEntry> = Vec::new();
    let mut tensors: Vec<TensorInfo> = Vec::new();
    let mut seen = NameTable::with_capacity(0);
    let mut metadata = BTreeMap::new();
    let mut warnings = Vec::new();
    for shard in shards {
        let parts = shard?;
        let file_name =
            |p: &Path| p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let first_new = tensors.len();
        tensors.extend(parts.tensors);
        for (i, t) in tensors.iter().enumerate().skip(first_new) {
            // Fewer than u32::MAX tensors: each takes bytes of a header.
            if let Some(prev) = seen.insert(t.name(), i as u32, |k| tensors[k as usize].name()) {
                let first = file_name(&files[tensors[prev as usize].file.index()].path);
                return Err(Error::new(
                    dir,
                    ErrorKind::TensorInTwoShards { first, second: file_name(&parts.file.path) },
                )
                .with_tensor(t.name()));
            }
        }
        if let Some(m) = parts.metadata {
            merge_metadata(&mut metadata, m, &BTreeMap::new(), &parts.file.path, &mut warnings);
        }
        files.push(parts.file);
    }
    let format = if files.len() == 1 { Format::Safetensors } else { Format::SafetensorsSharded };
    Ok(Checkpoint::from_parts(format, dir.to_path_buf(), files, tensors, metadata, warnings))
}
