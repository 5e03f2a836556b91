//! [`RemoteCheckpoint`]: a checkpoint whose headers and index were read with ranged requests.
//!
//! The headers and indexes are parsed by `tensora_format` and assembled by
//! `tensora_format::assemble` with the same rules as a local directory, so what comes out is a
//! real, valid-by-construction `tensora_format::Checkpoint` (file paths are the objects' URLs;
//! each file's stamp is the object's size and last-modified, device and inode 0), plus each
//! object's version (ETag) that every later range is conditional on.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use futures::{StreamExt, TryStreamExt};
use object_store::path::Path as ObjectPath;
use tensora_format::assemble::{Partition, SafetensorsObject};
use tensora_format::safetensors::{header_span_bytes, parse_header_with_path};
use tensora_format::sharded::{INDEX_BYTES_MAX, INDEX_SUFFIX, parse_index};
use tensora_format::{Checkpoint, FileStamp, Format, TensorInfo};

use crate::client::{Client, CounterSnapshot};
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

/// A remote checkpoint: a validated `tensora_format::Checkpoint` whose file paths are URLs, and
/// for each of its files the object version seen at open.
#[derive(Debug, Clone)]
pub struct RemoteCheckpoint {
    location: Location,
    checkpoint: Checkpoint,
    /// Indexed like `checkpoint.files()`.
    objects: Vec<RemoteObject>,
    client: Arc<Client>,
    connect_seconds: f64,
    parse_seconds: f64,
    /// Requests and retries spent opening.
    open_counts: CounterSnapshot,
}

impl RemoteCheckpoint {
    pub fn location(&self) -> &Location {
        &self.location
    }
    /// The checkpoint, for `tensora_io::load`, digests and inspection.
    pub fn checkpoint(&self) -> &Checkpoint {
        &self.checkpoint
    }
    pub fn format(&self) -> Format {
        self.checkpoint.format()
    }
    /// The objects, indexed like `checkpoint().files()` (file ids).
    pub fn objects(&self) -> &[RemoteObject] {
        &self.objects
    }
    /// All tensors, ordered by (file, offset).
    pub fn tensors(&self) -> &[TensorInfo] {
        self.checkpoint.tensors()
    }
    /// O(1) lookup by name.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.checkpoint.tensor(name)
    }
    /// Sum of the tensors' lengths.
    pub fn total_tensor_bytes(&self) -> u64 {
        self.checkpoint.total_tensor_bytes()
    }
    /// The location as a printable URL.
    pub fn url(&self) -> String {
        root_url(&self.location)
    }
    /// Requests sent to open the checkpoint (HEAD and GET, retries included).
    pub fn open_requests(&self) -> u64 {
        self.open_counts.requests
    }
    pub(crate) fn client(&self) -> &Arc<Client> {
        &self.client
    }
    pub(crate) fn connect_seconds(&self) -> f64 {
        self.connect_seconds
    }
    pub(crate) fn parse_seconds(&self) -> f64 {
        self.parse_seconds
    }
    pub(crate) fn open_counts(&self) -> CounterSnapshot {
        self.open_counts
    }
}

/// What the async opening produces; [`open`] adds the client and the timings.
pub(crate) struct Opened {
    checkpoint: Checkpoint,
    objects: Vec<RemoteObject>,
}

impl Opened {
    /// Pair a checkpoint with its objects, ordered like its files (matched by URL).
    fn new(checkpoint: Checkpoint, objects: Vec<RemoteObject>) -> Result<Opened, RemoteError> {
        let mut by_url: HashMap<String, RemoteObject> =
            objects.into_iter().map(|o| (o.url.clone(), o)).collect();
        let objects = checkpoint
            .files()
            .iter()
            .map(|f| {
                let url = f.path().to_string_lossy();
                by_url.remove(url.as_ref()).ok_or_else(|| RemoteError::NoCheckpoint {
                    url: url.into_owned(),
                    reason: "a checkpoint file without its object".to_owned(),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Opened { checkpoint, objects })
    }
}

/// Open the checkpoint at `location` (headers and index only) with `client`.
pub(crate) fn open(
    location: &Location,
    client: Arc<Client>,
    connect_seconds: f64,
) -> Result<RemoteCheckpoint, RemoteError> {
    let t = Instant::now();
    let before = client.snapshot();
    let fetcher = client.fetcher();
    let Opened { checkpoint, objects } = client.runtime.block_on(open_async(location, &fetcher))?;
    let parse_seconds = t.elapsed().as_secs_f64();
    let open_counts = client.snapshot().since(before);
    Ok(RemoteCheckpoint {
        location: location.clone(),
        checkpoint,
        objects,
        client,
        connect_seconds,
        parse_seconds,
        open_counts,
    })
}

/// What a local file's stamp is to the load layer: the object's size and last-modified.
fn stamp(object: &RemoteObject) -> FileStamp {
    FileStamp {
        len_bytes: object.meta.size,
        modified: Some(SystemTime::from(object.meta.last_modified)),
        dev: 0,
        inode: 0,
    }
}

fn format_err(e: tensora_format::Error) -> RemoteError {
    RemoteError::Format { url: e.path().to_string_lossy().into_owned(), source: e }
}

struct Shard {
    object: RemoteObject,
    header: tensora_format::safetensors::Header,
}

impl Shard {
    fn into_parts(self) -> (SafetensorsObject, RemoteObject) {
        let part = SafetensorsObject {
            path: PathBuf::from(&self.object.url),
            stamp: stamp(&self.object),
            header: self.header,
        };
        (part, self.object)
    }
}

/// How the shards of [`assemble`] are related.
enum Layout<'a> {
    /// One file.
    Single,
    /// Shards found by listing, in name order.
    Listed,
    /// Shards named by an HF index.
    Indexed { url: &'a str, index: &'a tensora_format::sharded::ShardIndex },
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
async fn open_async(location: &Location, fetcher: &Fetcher<'_>) -> Result<Opened, RemoteError> {
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
        return assemble(location, vec![shard], Layout::Single);
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
        Ok(shard) => assemble(location, vec![shard], Layout::Single),
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
) -> Result<Opened, RemoteError> {
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
    let partitions = files
        .iter()
        .map(|object| Partition { path: PathBuf::from(&object.url), stamp: stamp(object) })
        .collect();
    let root = PathBuf::from(location.url_of(&dir));
    let checkpoint = tensora_format::assemble::serverlessllm(&root, Path::new(&url), index, partitions)
        .map_err(format_err)?;
    Opened::new(checkpoint, files)
}

/// An S3 prefix without an index: every `*.safetensors` object directly under it is a shard.
async fn open_listed(
    location: &Location,
    fetcher: &Fetcher<'_>,
    prefix: &ObjectPath,
) -> Result<Opened, RemoteError> {
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
    let shards = open_shards(location, fetcher, shards).await?;
    assemble(location, shards, Layout::Listed)
}

async fn open_indexed(
    location: &Location,
    fetcher: &Fetcher<'_>,
    index_path: &ObjectPath,
) -> Result<Opened, RemoteError> {
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
    assemble(location, shards, Layout::Indexed { url: &url, index: &index })
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

fn assemble(location: &Location, shards: Vec<Shard>, layout: Layout<'_>) -> Result<Opened, RemoteError> {
    let root = PathBuf::from(root_url(location));
    let (parts, objects): (Vec<_>, Vec<_>) = shards.into_iter().map(Shard::into_parts).unzip();
    let checkpoint = match layout {
        Layout::Single => {
            let Some(part) = parts.into_iter().next() else {
                return Err(RemoteError::NoCheckpoint {
                    url: root_url(location),
                    reason: "no object".into(),
                });
            };
            tensora_format::assemble::safetensors_file(part)
        }
        Layout::Listed => tensora_format::assemble::unindexed_shards(&root, parts),
        Layout::Indexed { url, index } => {
            tensora_format::assemble::indexed_shards(&root, Path::new(url), index, parts)
        }
    }
    .map_err(format_err)?;
    Opened::new(checkpoint, objects)
}

/// The printable URL of the location itself.
fn root_url(location: &Location) -> String {
    location.url_of(location.object_path().unwrap_or(&ObjectPath::default()))
}
