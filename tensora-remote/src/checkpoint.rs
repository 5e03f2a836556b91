//! [`RemoteCheckpoint`]: a checkpoint whose headers and index were read with ranged requests.
//!
//! `tensora_format::Checkpoint` can only be built by the format crate's own (file-based) parsers,
//! so remote layouts get this type: the same validated facts (tensor ranges inside their objects,
//! dtype × shape = length, unique names, ordered by (file, offset)) plus each object's version.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;

use futures::{StreamExt, TryStreamExt};
use object_store::path::Path as ObjectPath;
use tensora_format::safetensors::{header_span_bytes, parse_header_with_path};
use tensora_format::sharded::{INDEX_BYTES_MAX, INDEX_SUFFIX, parse_index};
use tensora_format::{Dtype, Format};

use crate::fetch::{Fetcher, RemoteObject};
use crate::{Location, RemoteError};

/// The index name probed first in a directory.
pub const HF_INDEX_NAME: &str = "model.safetensors.index.json";
/// The ServerlessLLM index name.
pub const SLLM_INDEX_NAME: &str = "tensor_index.json";
/// The single-file name probed last in a directory on a plain HTTP server.
pub const SINGLE_FILE_NAME: &str = "model.safetensors";
/// Headers fetched concurrently while opening a sharded checkpoint.
pub const HEADER_FETCHES_INFLIGHT_MAX: usize = 16;
/// Listing entries read from an S3 prefix before giving up.
pub const LIST_ENTRIES_MAX: usize = tensora_format::sharded::DIR_ENTRIES_MAX;

/// One tensor of a [`RemoteCheckpoint`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteTensor {
    name: String,
    dtype: Dtype,
    shape: Vec<u64>,
    file: u32,
    offset_bytes: u64,
    len_bytes: u64,
    strides: Option<Vec<u64>>,
}

impl RemoteTensor {
    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn dtype(&self) -> Dtype {
        self.dtype
    }
    pub fn shape(&self) -> &[u64] {
        &self.shape
    }
    /// Index into [`RemoteCheckpoint::files`].
    pub fn file(&self) -> u32 {
        self.file
    }
    /// Absolute offset of the first byte in its object.
    pub fn offset_bytes(&self) -> u64 {
        self.offset_bytes
    }
    /// Bytes of storage to read (for ServerlessLLM, the recorded storage size).
    pub fn len_bytes(&self) -> u64 {
        self.len_bytes
    }
    /// Strides in elements when the format records them (ServerlessLLM); `None` is row-major.
    pub fn strides(&self) -> Option<&[u64]> {
        self.strides.as_deref()
    }
    /// `numel × bits / 8`: the dense bytes from the tensor's offset that a digest covers.
    pub fn nbytes(&self) -> u64 {
        // The parsers checked that this fits inside `len_bytes`.
        self.shape.iter().product::<u64>() * u64::from(self.dtype.bits()) / 8
    }
}

/// A remote checkpoint: its objects (with the version seen at open), tensors in (file, offset)
/// order, metadata and non-fatal warnings.
#[derive(Debug, Clone)]
pub struct RemoteCheckpoint {
    location: Location,
    format: Format,
    files: Vec<RemoteObject>,
    tensors: Vec<RemoteTensor>,
    by_name: HashMap<String, usize>,
    metadata: BTreeMap<String, String>,
    warnings: Vec<String>,
}

impl RemoteCheckpoint {
    pub fn location(&self) -> &Location {
        &self.location
    }
    pub fn format(&self) -> Format {
        self.format
    }
    /// The objects, indexed by [`RemoteTensor::file`].
    pub fn files(&self) -> &[RemoteObject] {
        &self.files
    }
    /// All tensors, ordered by (file, offset).
    pub fn tensors(&self) -> &[RemoteTensor] {
        &self.tensors
    }
    /// O(1) lookup by name.
    pub fn tensor(&self, name: &str) -> Option<&RemoteTensor> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }
    /// O(1) lookup of a tensor's index in [`RemoteCheckpoint::tensors`].
    pub fn tensor_index(&self, name: &str) -> Option<usize> {
        self.by_name.get(name).copied()
    }
    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.metadata
    }
    /// Non-fatal findings (e.g. a disagreeing `total_size`).
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }
    /// Sum of the tensors' lengths.
    pub fn total_tensor_bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.len_bytes).sum()
    }
}

struct Shard {
    object: RemoteObject,
    header: tensora_format::safetensors::Header,
}

fn file_name(path: &ObjectPath) -> &str {
    path.filename().unwrap_or("")
}

fn parent(path: &ObjectPath) -> ObjectPath {
    let parts: Vec<_> = path.parts().collect();
    let keep = parts.len().saturating_sub(1);
    parts.into_iter().take(keep).collect()
}

/// Open the checkpoint at `location` (headers and index only).
pub(crate) async fn open(
    location: &Location,
    fetcher: &Fetcher<'_>,
) -> Result<RemoteCheckpoint, RemoteError> {
    let path = location.object_path().ok_or_else(|| match location {
        Location::Local(p) => RemoteError::NotRemote { path: p.clone() },
        _ => RemoteError::NoCheckpoint { url: String::new(), reason: "no object path".to_owned() },
    })?;
    if !location.is_dir() {
        let name = file_name(path);
        if name.ends_with(INDEX_SUFFIX) {
            return open_indexed(location, fetcher, path).await;
        }
        if name == SLLM_INDEX_NAME {
            return open_sllm(location, fetcher, path).await;
        }
        let shard = open_shard(location, fetcher, path.clone()).await?;
        return assemble(location, Format::Safetensors, vec![shard], None);
    }
    let index = path.clone().join(HF_INDEX_NAME);
    match fetcher.head(&index, &location.url_of(&index)).await {
        Ok(_) => return open_indexed(location, fetcher, &index).await,
        Err(RemoteError::NotFound { .. }) => {}
        Err(e) => return Err(e),
    }
    if let Location::S3 { .. } = location {
        return open_listed(location, fetcher, path).await;
    }
    let sllm = path.clone().join(SLLM_INDEX_NAME);
    match fetcher.head(&sllm, &location.url_of(&sllm)).await {
        Ok(_) => return open_sllm(location, fetcher, &sllm).await,
        Err(RemoteError::NotFound { .. }) => {}
        Err(e) => return Err(e),
    }
    let single = path.clone().join(SINGLE_FILE_NAME);
    match open_shard(location, fetcher, single).await {
        Ok(shard) => assemble(location, Format::Safetensors, vec![shard], None),
        Err(RemoteError::NotFound { .. }) => Err(RemoteError::NoCheckpoint {
            url: location.url_of(path),
            reason: format!(
                "none of {HF_INDEX_NAME}, {SLLM_INDEX_NAME}, {SINGLE_FILE_NAME} exists (an HTTP server cannot be listed)"
            ),
        }),
        Err(e) => Err(e),
    }
}

/// A ServerlessLLM directory: `tensor_index.json` (parsed and checked by
/// `tensora_format::sllm::parse_index`), then `tensor.data_0, _1, …` probed with HEAD until one is
/// missing; global offsets are mapped to (partition, local offset) by the partitions' sizes, and a
/// tensor must lie inside one partition.
async fn open_sllm(
    location: &Location,
    fetcher: &Fetcher<'_>,
    index_path: &ObjectPath,
) -> Result<RemoteCheckpoint, RemoteError> {
    use tensora_format::sllm::{INDEX_LEN_BYTES_MAX, PARTITION_PREFIX, PARTITIONS_MAX, parse_index};
    let url = location.url_of(index_path);
    let meta = fetcher.head(index_path, &url).await?;
    if meta.size > INDEX_LEN_BYTES_MAX {
        return Err(RemoteError::TooLarge { url, len_bytes: meta.size, limit_bytes: INDEX_LEN_BYTES_MAX });
    }
    let object = RemoteObject { url: url.clone(), meta };
    // Bounded by INDEX_LEN_BYTES_MAX above.
    let mut bytes = vec![0u8; object.len_bytes() as usize];
    fetcher.fetch(&object, 0, &mut bytes).await?;
    let index = parse_index(&bytes).map_err(|kind| RemoteError::Index { url: url.clone(), kind })?;
    drop(bytes);
    let dir = parent(index_path);
    let mut files = Vec::new();
    for i in 0..=PARTITIONS_MAX {
        let path = dir.clone().join(format!("{PARTITION_PREFIX}{i}").as_str());
        let part_url = location.url_of(&path);
        match fetcher.head(&path, &part_url).await {
            Ok(meta) if i < PARTITIONS_MAX => files.push(RemoteObject { url: part_url, meta }),
            Ok(_) => {
                return Err(RemoteError::NoCheckpoint {
                    url,
                    reason: format!("more than {PARTITIONS_MAX} partitions"),
                });
            }
            Err(RemoteError::NotFound { .. }) => break,
            Err(e) => return Err(e),
        }
    }
    if files.is_empty() {
        return Err(RemoteError::NoCheckpoint {
            url,
            reason: format!("no {PARTITION_PREFIX}0 beside the index"),
        });
    }
    let lens: Vec<u64> = files.iter().map(RemoteObject::len_bytes).collect();
    let mut starts = Vec::with_capacity(lens.len());
    let mut total = 0u64;
    for &len in &lens {
        starts.push(total);
        total = total.checked_add(len).ok_or_else(|| RemoteError::NoCheckpoint {
            url: url.clone(),
            reason: "partition sizes overflow u64".to_owned(),
        })?;
    }
    let mut tensors = Vec::with_capacity(index.entries.len());
    for e in index.entries {
        let located = match e.partition {
            None => {
                let p = starts.partition_point(|&s| s <= e.offset_bytes).saturating_sub(1);
                let local = e.offset_bytes - starts[p];
                local.checked_add(e.size_bytes).is_some_and(|end| end <= lens[p]).then_some((p, local))
            }
            Some(p) => {
                let p = p as usize;
                (p < lens.len() && e.end_bytes() <= lens[p]).then_some((p, e.offset_bytes))
            }
        };
        let Some((p, local)) = located else {
            return Err(RemoteError::Shards {
                url,
                message: format!(
                    "tensor {:?} (bytes {}..{}) does not lie inside one partition",
                    e.name,
                    e.offset_bytes,
                    e.end_bytes()
                ),
            });
        };
        tensors.push(RemoteTensor {
            name: e.name,
            dtype: e.dtype,
            shape: e.shape,
            file: p as u32,
            offset_bytes: local,
            len_bytes: e.size_bytes,
            strides: Some(e.strides),
        });
    }
    tensors.sort_by_key(|t| (t.file, t.offset_bytes));
    let by_name = tensors.iter().enumerate().map(|(i, t)| (t.name.clone(), i)).collect();
    Ok(RemoteCheckpoint {
        location: location.clone(),
        format: Format::ServerlessLlm,
        files,
        tensors,
        by_name,
        metadata: BTreeMap::new(),
        warnings: Vec::new(),
    })
}

/// An S3 prefix without an index: every `*.safetensors` object directly under it is a shard.
async fn open_listed(
    location: &Location,
    fetcher: &Fetcher<'_>,
    prefix: &ObjectPath,
) -> Result<RemoteCheckpoint, RemoteError> {
    let url = location.url_of(prefix);
    let listed = fetcher.store.list_with_delimiter(Some(prefix)).await.map_err(|e| {
        RemoteError::NoCheckpoint { url: url.clone(), reason: format!("listing failed: {e}") }
    })?;
    if listed.objects.len() > LIST_ENTRIES_MAX {
        return Err(RemoteError::NoCheckpoint {
            url,
            reason: format!("more than {LIST_ENTRIES_MAX} objects"),
        });
    }
    let names: BTreeSet<&ObjectPath> = listed.objects.iter().map(|o| &o.location).collect();
    let indexes: Vec<_> = names.iter().filter(|p| file_name(p).ends_with(INDEX_SUFFIX)).collect();
    match indexes.as_slice() {
        [one] => return open_indexed(location, fetcher, one).await,
        [] => {}
        _ => {
            return Err(RemoteError::NoCheckpoint {
                url,
                reason: "more than one *.safetensors.index.json".to_owned(),
            });
        }
    }
    if let Some(sllm) = names.iter().find(|p| file_name(p) == SLLM_INDEX_NAME) {
        return open_sllm(location, fetcher, sllm).await;
    }
    let shards: Vec<ObjectPath> =
        names.into_iter().filter(|p| file_name(p).ends_with(".safetensors")).cloned().collect();
    if shards.is_empty() {
        return Err(RemoteError::NoCheckpoint {
            url,
            reason: "no *.safetensors objects under the prefix".to_owned(),
        });
    }
    let format = if shards.len() == 1 { Format::Safetensors } else { Format::SafetensorsSharded };
    let shards = open_shards(location, fetcher, shards).await?;
    assemble(location, format, shards, None)
}

async fn open_indexed(
    location: &Location,
    fetcher: &Fetcher<'_>,
    index_path: &ObjectPath,
) -> Result<RemoteCheckpoint, RemoteError> {
    let url = location.url_of(index_path);
    let meta = fetcher.head(index_path, &url).await?;
    if meta.size > INDEX_BYTES_MAX {
        return Err(RemoteError::TooLarge { url, len_bytes: meta.size, limit_bytes: INDEX_BYTES_MAX });
    }
    let object = RemoteObject { url: url.clone(), meta };
    // Bounded by INDEX_BYTES_MAX above.
    let mut bytes = vec![0u8; object.len_bytes() as usize];
    fetcher.fetch(&object, 0, &mut bytes).await?;
    let index = parse_index(&bytes).map_err(|kind| RemoteError::Index { url: url.clone(), kind })?;
    let dir = parent(index_path);
    let names: BTreeSet<&str> = index.weight_map().iter().map(|(_, shard)| shard.as_str()).collect();
    let paths: Vec<ObjectPath> = names.into_iter().map(|n| dir.clone().join(n)).collect();
    let shards = open_shards(location, fetcher, paths).await?;
    assemble(location, Format::SafetensorsSharded, shards, Some((&url, &index)))
}

async fn open_shards(
    location: &Location,
    fetcher: &Fetcher<'_>,
    paths: Vec<ObjectPath>,
) -> Result<Vec<Shard>, RemoteError> {
    futures::stream::iter(paths)
        .map(|p| open_shard(location, fetcher, p))
        .buffered(HEADER_FETCHES_INFLIGHT_MAX)
        .try_collect()
        .await
}

/// The header of one safetensors object: the first 8 bytes, then exactly `n` more.
async fn open_shard(
    location: &Location,
    fetcher: &Fetcher<'_>,
    path: ObjectPath,
) -> Result<Shard, RemoteError> {
    let url = location.url_of(&path);
    let meta = fetcher.head(&path, &url).await?;
    let object = RemoteObject { url: url.clone(), meta };
    let file_len_bytes = object.len_bytes();
    let format_err = |source| RemoteError::Format { url: url.clone(), source };
    let mut prefix = [0u8; 8];
    let prefix_len = file_len_bytes.min(8) as usize;
    fetcher.fetch(&object, 0, &mut prefix[..prefix_len]).await?;
    let span = header_span_bytes(&prefix[..prefix_len], file_len_bytes).map_err(format_err)?;
    // `span` was checked against the header size limit and the object size.
    let mut bytes = vec![0u8; span as usize];
    bytes[..8].copy_from_slice(&prefix);
    fetcher.fetch(&object, 8, &mut bytes[8..]).await?;
    let header = parse_header_with_path(&bytes, file_len_bytes, Path::new(&url)).map_err(format_err)?;
    Ok(Shard { object, header })
}

fn assemble(
    location: &Location,
    format: Format,
    mut shards: Vec<Shard>,
    index: Option<(&str, &tensora_format::sharded::ShardIndex)>,
) -> Result<RemoteCheckpoint, RemoteError> {
    let mut tensors = Vec::new();
    let mut by_name = HashMap::new();
    let mut metadata = BTreeMap::new();
    let mut warnings = Vec::new();
    let wanted: Option<HashMap<&str, &str>> =
        index.map(|(_, ix)| ix.weight_map().iter().map(|(t, s)| (t.as_str(), s.as_str())).collect());
    for (file, shard) in shards.iter_mut().enumerate() {
        let shard_name = file_name(&shard.object.meta.location).to_owned();
        let data_start = shard.header.data_start_bytes();
        if index.is_none() {
            metadata.extend(shard.header.take_metadata().unwrap_or_default());
        }
        for t in shard.header.tensors() {
            let shards_err = |message: String| RemoteError::Shards { url: shard.object.url.clone(), message };
            if let Some(map) = &wanted {
                match map.get(t.name()) {
                    Some(s) if *s == shard_name => {}
                    Some(s) => {
                        return Err(shards_err(format!(
                            "tensor {:?} is here, the index puts it in {s}",
                            t.name()
                        )));
                    }
                    None => return Err(shards_err(format!("tensor {:?} is not in the index", t.name()))),
                }
            }
            let (start, end) = t.data_offsets();
            let tensor = RemoteTensor {
                name: t.name().to_owned(),
                dtype: t.dtype(),
                shape: t.shape().to_vec(),
                file: file as u32,
                offset_bytes: data_start + start,
                len_bytes: end - start,
                strides: None,
            };
            if by_name.insert(tensor.name.clone(), tensors.len()).is_some() {
                return Err(shards_err(format!("tensor {:?} appears in more than one shard", t.name())));
            }
            tensors.push(tensor);
        }
    }
    if let Some((url, ix)) = index {
        if let Some((missing, shard)) =
            ix.weight_map().iter().find(|(t, _)| !by_name.contains_key(t.as_str()))
        {
            return Err(RemoteError::Shards {
                url: url.to_owned(),
                message: format!("tensor {missing:?} is indexed in {shard} but not found there"),
            });
        }
        metadata.extend(ix.metadata().iter().map(|(k, v)| (k.clone(), v.clone())));
        if let Some(total) = ix.total_size_bytes() {
            let actual: u64 = tensors.iter().map(|t: &RemoteTensor| t.len_bytes).sum();
            if total != actual {
                warnings.push(format!("{url}: total_size {total} differs from the tensors' {actual} bytes"));
            }
        }
    }
    Ok(RemoteCheckpoint {
        location: location.clone(),
        format,
        files: shards.into_iter().map(|s| s.object).collect(),
        tensors,
        by_name,
        metadata,
        warnings,
    })
}
