//! [`RemoteCheckpoint`]: a checkpoint whose headers and index were read with ranged requests.
//!
//! The headers and indexes are parsed by `tensora_format` and assembled by
//! `tensora_format::assemble` with the same rules as a local directory, so what comes out is a
//! real, valid-by-construction `tensora_format::Checkpoint` (file paths are the objects' URLs;
//! each file's stamp is the object's size and last-modified, device and inode 0), plus each
//! object's version (ETag) that every later range is conditional on.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use futures::{StreamExt, TryStreamExt};
use object_store::ObjectMeta;
use object_store::path::Path as ObjectPath;
use tensora_format::assemble::{Partition, SafetensorsObject};
use tensora_format::safetensors::{header_span_bytes, parse_header_with_path};
use tensora_format::sharded::{INDEX_BYTES_MAX, INDEX_SUFFIX, parse_index};
use tensora_format::{Checkpoint, FileStamp, Format, TensorInfo};

use crate::client::{Client, CounterSnapshot, off_runtime};
use crate::fetch::{Counters, Fetcher, Front, Layer, RemoteObject};
use crate::rebuild::{Rebuild, ShardLayout};
use crate::{CacheOptions, CacheReport, Location, RemoteError};

/// The HF index name probed in a directory on a plain HTTP server (after [`SLLM_INDEX_NAME`]).
pub const HF_INDEX_NAME: &str = "model.safetensors.index.json";
/// The ServerlessLLM index name: in a directory it wins over any HF index, as locally.
pub const SLLM_INDEX_NAME: &str = "tensor_index.json";
/// The single-file name probed last in a directory on a plain HTTP server.
pub const SINGLE_FILE_NAME: &str = "model.safetensors";
/// Headers fetched concurrently while opening a sharded checkpoint.
pub const HEADER_FETCHES_INFLIGHT_MAX: usize = 16;
/// Listing entries read from an S3 prefix before giving up.
pub const LIST_ENTRIES_MAX: usize = tensora_format::sharded::DIR_ENTRIES_MAX;
/// Checkpoint objects (indexes and `*.safetensors`) kept from one listing; each is opened with
/// one or two ranged reads, so more is refused rather than opened.
pub const LISTED_NAMES_MAX: usize = 65_536;
/// Bytes the first ranged read of a safetensors object asks for (or the whole object, if
/// shorter): the 8-byte header length, and the header itself when it fits in them, so that
/// opening an object costs one read (after a HEAD where no listing gave its size) instead of a
/// HEAD and two. Each request is a round trip (tens of milliseconds from an object store), the
/// shards' opens run 16 at a time, and a header of a few hundred tensors is some tens of KiB; a
/// longer one costs a second read. The bytes past the header are the first tensor's, read again
/// by a load.
pub const HEADER_FIRST_READ_BYTES: u64 = 64 << 10;

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
    /// What the checkpoint was assembled from, to assemble it again over cached copies.
    rebuild: Arc<Rebuild>,
    /// What stands in front of the store (the local cache), when the options name it.
    front: Option<Arc<dyn Front>>,
    /// What the cache did for the open.
    open_cache: Option<CacheReport>,
}

impl RemoteCheckpoint {
    /// Where the checkpoint was opened.
    pub(crate) fn location(&self) -> &Location {
        &self.location
    }
    /// The checkpoint, for `tensora_io::load`, digests and inspection.
    pub fn checkpoint(&self) -> &Checkpoint {
        &self.checkpoint
    }
    /// Its layout, decided by the local rules.
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
    pub(crate) fn rebuild(&self) -> &Rebuild {
        &self.rebuild
    }
    pub(crate) fn front(&self) -> Option<&dyn Front> {
        self.front.as_deref()
    }
    /// What the cache did while opening (`None` without a cache).
    pub fn open_cache_report(&self) -> Option<&CacheReport> {
        self.open_cache.as_ref()
    }
}

/// What the async opening produces; [`open`] adds the client and the timings.
pub(crate) struct Opened {
    checkpoint: Checkpoint,
    objects: Vec<RemoteObject>,
    rebuild: Rebuild,
}

impl Opened {
    /// Pair a checkpoint with its objects, ordered like its files (matched by URL).
    fn new(rebuild: Rebuild, objects: Vec<RemoteObject>) -> Result<Opened, RemoteError> {
        let checkpoint = rebuild.assemble().map_err(format_err)?;
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
        Ok(Opened { checkpoint, objects, rebuild })
    }
}

/// Open the checkpoint at `location` (headers and index only) with `client`. With a cache, a
/// location opened before is confirmed with one HEAD per object it resolved to (none offline)
/// and then opened from the record and the cached copies; otherwise the open goes to the store,
/// writing what it reads through to the cache and recording what the location resolved to.
pub(crate) fn open(
    location: &Location,
    client: Arc<Client>,
    cache: Option<&CacheOptions>,
    connect_seconds: f64,
) -> Result<RemoteCheckpoint, RemoteError> {
    let t = Instant::now();
    // Every URL of the open names the store's account (Azure), and so does every cache key.
    let location = &location.in_account(&client.opts.store);
    // This open's own counters: a concurrent open or load on the same client counts its own.
    let counters = Counters::default();
    let url = root_url(location);
    let front = crate::fetch::open_front(cache)?;
    // Blocking on the client's runtime panics inside another runtime: open from a plain thread.
    // The whole open (probes, listing, indexes, headers and their retries) has one deadline.
    let deadline = client.opts.open_deadline;
    let (opened, layer) = off_runtime(|| {
        client.runtime().block_on(async {
            let work = async {
                let layer = open_layer(front.as_deref(), location, &url, &client.fetcher(&counters)).await?;
                let fetcher = client.fetcher(&counters).with_layer(layer.as_deref());
                let opened = open_async(location, &fetcher).await?;
                Ok::<_, RemoteError>((opened, layer))
            };
            match tokio::time::timeout(deadline, work).await {
                Ok(result) => result,
                Err(_) => Err(RemoteError::OpenDeadline {
                    url: url.clone(),
                    deadline,
                    requests: counters.requests.load(std::sync::atomic::Ordering::Relaxed),
                }),
            }
        })
    })?;
    let open_cache = layer.map(|l| l.finish());
    let Opened { checkpoint, objects, rebuild } = opened;
    Ok(RemoteCheckpoint {
        location: location.clone(),
        checkpoint,
        objects,
        client,
        connect_seconds,
        parse_seconds: t.elapsed().as_secs_f64(),
        open_counts: counters.snapshot(),
        rebuild: Arc::new(rebuild),
        front,
        open_cache,
    })
}

/// The open's layer (from `front`, the cache): in record mode when the location was opened
/// through it before, each recorded object is unchanged (one HEAD each,
/// [`HEADER_FETCHES_INFLIGHT_MAX`] at a time) and, for a prefix of a store that lists, a listing
/// (one request) names no checkpoint object the record lacks; trusted without a request offline.
async fn open_layer(
    front: Option<&dyn Front>,
    location: &Location,
    url: &str,
    network: &Fetcher<'_>,
) -> Result<Option<Arc<dyn Layer>>, RemoteError> {
    let Some(front) = front else { return Ok(None) };
    let offline = front.offline();
    let record = match front.record(url) {
        Some(record) if offline => Some(record),
        Some(record) => {
            let heads = futures::stream::iter(record.iter())
                .map(|recorded| async move {
                    match network.head(recorded.path(), &recorded.url).await {
                        Ok(meta) => Ok(front.unchanged(recorded, &meta)),
                        Err(RemoteError::NotFound { .. }) => Ok(false),
                        Err(e) => Err(e),
                    }
                })
                .buffer_unordered(HEADER_FETCHES_INFLIGHT_MAX)
                .try_collect::<Vec<bool>>()
                .await?;
            let unchanged = heads.iter().all(|&same| same);
            (unchanged && !listed_beyond(location, &record, network).await?).then_some(record)
        }
        None if offline => {
            return Err(RemoteError::NotCached {
                url: url.to_owned(),
                what: "this location was never opened with this cache",
            });
        }
        None => None,
    };
    Ok(Some(front.open_layer(url, record)))
}

/// Whether a listing of `location`'s prefix (one request; none for a single object or a store
/// that cannot list) shows an object the layout rules would open first ([`layout_objects`]) that
/// `record` lacks: one added since the record was made (a new shard, an index), so the record no
/// longer says what the prefix resolves to. Objects the record has and the listing lacks are left
/// to their HEADs.
async fn listed_beyond(
    location: &Location,
    record: &[RemoteObject],
    network: &Fetcher<'_>,
) -> Result<bool, RemoteError> {
    let Some(prefix) = location.object_path().filter(|_| location.is_dir() && location.can_list()) else {
        return Ok(false);
    };
    let names = direct_children(network.list(prefix), prefix, LIST_ENTRIES_MAX)
        .await
        .map_err(|reason| RemoteError::NoCheckpoint { url: location.url_of(prefix), reason })?;
    let recorded: BTreeSet<&str> = record.iter().map(|o| o.path().as_ref()).collect();
    Ok(layout_objects(&names).iter().any(|p| !recorded.contains(p.as_ref())))
}

/// The objects of a listing that [`open_listed`]'s rules open first: the ServerlessLLM index;
/// else the HF index (several: all of them, which the open refuses); else every shard.
fn layout_objects(names: &BTreeMap<ObjectPath, ObjectMeta>) -> Vec<&ObjectPath> {
    if let Some(sllm) = names.keys().find(|p| file_name(p) == SLLM_INDEX_NAME) {
        return vec![sllm];
    }
    let indexes: Vec<&ObjectPath> = names.keys().filter(|p| file_name(p).ends_with(INDEX_SUFFIX)).collect();
    if !indexes.is_empty() {
        return indexes;
    }
    names.keys().filter(|p| file_name(p).ends_with(".safetensors")).collect()
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
    /// The shard's name as the index spells it (decoded; the URL is percent-encoded).
    name: String,
    header: tensora_format::safetensors::Header,
}

impl Shard {
    fn into_parts(self) -> (SafetensorsObject, RemoteObject) {
        let part = SafetensorsObject {
            path: PathBuf::from(&self.object.url),
            name: self.name,
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

/// `dir/name` with `name` kept as the index spells it. `ObjectPath::join` would percent-encode
/// `%`, `#`, non-ASCII and other characters into the path itself, and the HTTP store encodes the
/// path again when it builds the URL, so such a shard would be requested under a doubly encoded
/// name; a parsed path is encoded once, by the store.
fn child_raw(dir: &ObjectPath, name: &str) -> Result<ObjectPath, object_store::path::Error> {
    if dir.as_ref().is_empty() { ObjectPath::parse(name) } else { ObjectPath::parse(format!("{dir}/{name}")) }
}

fn parent(path: &ObjectPath) -> ObjectPath {
    let parts: Vec<_> = path.parts().collect();
    let keep = parts.len().saturating_sub(1);
    parts.into_iter().take(keep).collect()
}

/// Open the checkpoint at `location` (headers and index only).
async fn open_async(location: &Location, fetcher: &Fetcher<'_>) -> Result<Opened, RemoteError> {
    let path = location.object_path().ok_or_else(|| match location.local_path() {
        Some(p) => RemoteError::NotRemote { path: p.to_owned() },
        None => RemoteError::NoCheckpoint { url: String::new(), reason: "no object path".to_owned() },
    })?;
    if !location.is_dir() {
        let name = file_name(path);
        if name.ends_with(INDEX_SUFFIX) {
            return open_indexed(location, fetcher, path, Known::Nothing, None).await;
        }
        if name == SLLM_INDEX_NAME {
            return open_sllm(location, fetcher, path, Known::Nothing).await;
        }
        let at = ShardAt { path: path.clone(), name: name.to_owned(), listed: None };
        let shard = open_shard(location, fetcher, at).await?;
        return assemble(location, vec![shard], Layout::Single);
    }
    // The local rules (tensora_format::open): a ServerlessLLM index wins, then the one HF index.
    if location.can_list() {
        return open_listed(location, fetcher, path).await;
    }
    // A plain HTTP server cannot be listed: probe the names a directory would have, in the
    // order the local opener decides by.
    let sllm = path.clone().join(SLLM_INDEX_NAME);
    match fetcher.head(&sllm, &location.url_of(&sllm)).await {
        Ok(meta) => return open_sllm(location, fetcher, &sllm, Known::Headed(meta)).await,
        Err(RemoteError::NotFound { .. }) => {}
        Err(e) => return Err(e),
    }
    let index = path.clone().join(HF_INDEX_NAME);
    match fetcher.head(&index, &location.url_of(&index)).await {
        Ok(meta) => return open_indexed(location, fetcher, &index, Known::Headed(meta), None).await,
        Err(RemoteError::NotFound { .. }) => {}
        Err(e) => return Err(e),
    }
    let single = path.clone().join(SINGLE_FILE_NAME);
    let at = ShardAt { path: single, name: SINGLE_FILE_NAME.to_owned(), listed: None };
    match open_shard(location, fetcher, at).await {
        Ok(shard) => assemble(location, vec![shard], Layout::Single),
        Err(RemoteError::NotFound { .. }) => Err(RemoteError::NoCheckpoint {
            url: location.url_of(path),
            reason: format!(
                "none of {SLLM_INDEX_NAME}, {HF_INDEX_NAME}, {SINGLE_FILE_NAME} exists (an HTTP server cannot be listed)"
            ),
        }),
        Err(e) => Err(e),
    }
}

/// A ServerlessLLM checkpoint: the index (size-checked with HEAD, then read whole and parsed by
/// `tensora_format::sllm::parse_index`), then only the partitions the index needs, probed with
/// HEAD: for a legacy index (a partition id per entry), `tensor.data_0` up to the highest id it
/// names, [`HEADER_FETCHES_INFLIGHT_MAX`] at a time; for an upstream index (global offsets),
/// `tensor.data_0, _1, …` one after another until their sizes cover the last entry's end (or one
/// is missing). Global offsets are mapped to (partition, local offset) by the partitions' sizes,
/// and a tensor must lie inside one partition.
async fn open_sllm(
    location: &Location,
    fetcher: &Fetcher<'_>,
    index_path: &ObjectPath,
    known: Known,
) -> Result<Opened, RemoteError> {
    use tensora_format::sllm::{INDEX_LEN_BYTES_MAX, PARTITION_PREFIX, parse_index};
    let (url, bytes) = fetch_index(location, fetcher, index_path, known, INDEX_LEN_BYTES_MAX).await?;
    let index = parse_index(&bytes).map_err(|kind| RemoteError::Index { url: url.clone(), kind })?;
    drop(bytes);
    let dir = parent(index_path);
    let partition = |i: u32| {
        let path = dir.clone().join(format!("{PARTITION_PREFIX}{i}").as_str());
        let url = location.url_of(&path);
        (path, url)
    };
    let files = match needed_partitions(&index, &url)? {
        Needed::Ids(count) => {
            futures::stream::iter(0..count)
                .map(|i| {
                    let (path, part_url) = partition(i);
                    async move {
                        let meta = fetcher.head(&path, &part_url).await?;
                        Ok::<_, RemoteError>(RemoteObject { url: part_url, meta })
                    }
                })
                .buffered(HEADER_FETCHES_INFLIGHT_MAX)
                .try_collect::<Vec<_>>()
                .await?
        }
        Needed::Covering(end_bytes) => {
            let mut files = Vec::new();
            let mut covered_bytes = 0u64;
            let mut i = 0u32;
            while covered_bytes < end_bytes && i < tensora_format::sllm::PARTITIONS_MAX {
                let (path, part_url) = partition(i);
                match fetcher.head(&path, &part_url).await {
                    Ok(meta) => {
                        covered_bytes = covered_bytes.saturating_add(meta.size);
                        files.push(RemoteObject { url: part_url, meta });
                    }
                    // The partitions end early: the assembly names the tensor they cut off.
                    Err(RemoteError::NotFound { .. }) => break,
                    Err(e) => return Err(e),
                }
                i += 1;
            }
            files
        }
    };
    if files.is_empty() {
        return Err(RemoteError::NoCheckpoint {
            url,
            reason: format!("no {PARTITION_PREFIX}0 beside the index"),
        });
    }
    for object in &files {
        fetcher.check_versioned(object, "its ranges")?;
    }
    let partitions = files
        .iter()
        .map(|object| Partition { path: PathBuf::from(&object.url), stamp: stamp(object) })
        .collect();
    let root = PathBuf::from(location.url_of(&dir));
    let rebuild = Rebuild::Sllm { root, index_url: PathBuf::from(&url), index, partitions };
    Opened::new(rebuild, files)
}

/// Which partitions a ServerlessLLM index needs.
#[derive(Debug, PartialEq, Eq)]
enum Needed {
    /// Partitions `0..n` (a legacy index names each entry's partition).
    Ids(u32),
    /// Partitions from 0 on until their sizes add up to this many bytes (an upstream index's
    /// global offsets).
    Covering(u64),
}

fn needed_partitions(index: &tensora_format::sllm::SllmIndex, url: &str) -> Result<Needed, RemoteError> {
    use tensora_format::sllm::{IndexLayout, PARTITIONS_MAX};
    match index.layout {
        IndexLayout::Legacy => {
            let highest = index.entries().filter_map(|e| e.partition).max().unwrap_or(0);
            if highest >= PARTITIONS_MAX {
                return Err(RemoteError::NoCheckpoint {
                    url: url.to_owned(),
                    reason: format!("more than {PARTITIONS_MAX} partitions"),
                });
            }
            Ok(Needed::Ids(highest + 1))
        }
        IndexLayout::Upstream => {
            Ok(Needed::Covering(index.entries().map(|e| e.end_bytes()).max().unwrap_or(0).max(1)))
        }
    }
}

/// An S3 prefix, by the rules `tensora_format::open` applies to a directory: among the objects
/// directly under it (names starting with `.` skipped), `tensor_index.json` makes it
/// ServerlessLLM; else exactly one `*.safetensors.index.json` makes it indexed (two or more are
/// refused); else every `*.safetensors` object is a shard. The listing is streamed and stops
/// after [`LIST_ENTRIES_MAX`] entries (nested ones included): more is refused.
async fn open_listed(
    location: &Location,
    fetcher: &Fetcher<'_>,
    prefix: &ObjectPath,
) -> Result<Opened, RemoteError> {
    let url = location.url_of(prefix);
    let listed = fetcher.list(prefix);
    let names = direct_children(listed, prefix, LIST_ENTRIES_MAX)
        .await
        .map_err(|reason| RemoteError::NoCheckpoint { url: url.clone(), reason })?;
    if let Some((sllm, meta)) = names.iter().find(|(p, _)| file_name(p) == SLLM_INDEX_NAME) {
        return open_sllm(location, fetcher, sllm, Known::Listed(meta.clone())).await;
    }
    let indexes: Vec<&ObjectPath> = names.keys().filter(|p| file_name(p).ends_with(INDEX_SUFFIX)).collect();
    match indexes.as_slice() {
        [one] => {
            let known = names.get(*one).map_or(Known::Nothing, |m| Known::Listed(m.clone()));
            return open_indexed(location, fetcher, one, known, Some(&names)).await;
        }
        [] => {}
        many => {
            let listed: Vec<&str> = many.iter().map(|p| file_name(p)).collect();
            return Err(RemoteError::NoCheckpoint {
                url,
                reason: format!(
                    "{} index files ({}); open one of them directly",
                    many.len(),
                    listed.join(", ")
                ),
            });
        }
    }
    let shards: Vec<ShardAt> = names
        .into_iter()
        .filter(|(p, _)| file_name(p).ends_with(".safetensors"))
        .map(|(path, meta)| {
            let name = file_name(&path).to_owned();
            ShardAt { path, name, listed: Some(meta) }
        })
        .collect();
    if shards.is_empty() {
        return Err(RemoteError::NoCheckpoint {
            url,
            reason: "no tensor_index.json, *.safetensors.index.json or *.safetensors object under the prefix"
                .to_owned(),
        });
    }
    let shards = open_shards(location, fetcher, shards).await?;
    assemble(location, shards, Layout::Listed)
}

/// The objects directly under `prefix` that the layout rules look at (`tensor_index.json`,
/// `*.safetensors.index.json`, `*.safetensors`; names starting with `.` skipped), with what the
/// listing said of each, from a listing of everything under it, read as a stream: more than
/// `entries_max` entries (nested ones included), or more than [`LISTED_NAMES_MAX`] such names, is
/// refused without reading further.
async fn direct_children(
    listed: futures::stream::BoxStream<'_, object_store::Result<ObjectMeta>>,
    prefix: &ObjectPath,
    entries_max: usize,
) -> Result<BTreeMap<ObjectPath, ObjectMeta>, String> {
    let mut listed = listed.take(entries_max.saturating_add(1));
    let mut seen = 0usize;
    let mut names = BTreeMap::new();
    while let Some(meta) = listed.next().await {
        let meta = meta.map_err(|e| crate::redact::redact(&format!("listing failed: {e}")))?;
        seen += 1;
        if seen > entries_max {
            return Err(format!("more than {entries_max} objects under the prefix"));
        }
        let direct = meta.location.prefix_match(prefix).is_some_and(|rest| rest.count() == 1);
        let name = file_name(&meta.location);
        // Only the names the layout rules look at are kept, and at most LISTED_NAMES_MAX of them.
        let matters =
            name == SLLM_INDEX_NAME || name.ends_with(INDEX_SUFFIX) || name.ends_with(".safetensors");
        if direct && matters && !name.starts_with('.') {
            if names.len() >= LISTED_NAMES_MAX {
                return Err(format!("more than {LISTED_NAMES_MAX} checkpoint objects under the prefix"));
            }
            names.insert(meta.location.clone(), meta);
        }
    }
    Ok(names)
}

/// The whole index object at `index_path` (its URL and bytes), refused without a download when
/// HEAD says it is larger than `limit_bytes`: the buffer is never sized from an unchecked length.
/// A listed one no cache record answers for is read whole in one request
/// ([`Fetcher::first_read`]) when the listing's size is within the limit.
async fn fetch_index(
    location: &Location,
    fetcher: &Fetcher<'_>,
    index_path: &ObjectPath,
    known: Known,
    limit_bytes: u64,
) -> Result<(String, Vec<u8>), RemoteError> {
    let url = location.url_of(index_path);
    let meta = match known {
        Known::Listed(listed)
            if (1..=limit_bytes).contains(&listed.size) && !fetcher.recorded(index_path) =>
        {
            // Bounded by `limit_bytes`.
            let mut bytes = vec![0u8; listed.size as usize];
            let listed = RemoteObject { url: url.clone(), meta: listed };
            let meta = fetcher.first_read(&listed, &mut bytes).await?;
            if meta.size != listed.len_bytes() {
                return Err(RemoteError::Changed {
                    url,
                    planned: format!("{} bytes when listed", listed.len_bytes()),
                    found: format!("{} bytes", meta.size),
                });
            }
            let object = RemoteObject { url: url.clone(), meta };
            fetcher.write_through(&object, 0, &bytes).await;
            return Ok((url, bytes));
        }
        Known::Headed(meta) => meta,
        Known::Listed(_) | Known::Nothing => fetcher.head(index_path, &url).await?,
    };
    if meta.size > limit_bytes {
        return Err(RemoteError::TooLarge { url, len_bytes: meta.size, limit_bytes });
    }
    let object = RemoteObject { url: url.clone(), meta };
    // Bounded by `limit_bytes` above.
    let mut bytes = vec![0u8; object.len_bytes() as usize];
    fetcher.fetch(&object, 0, &mut bytes).await?;
    Ok((url, bytes))
}

/// The index at `index_path` and the shards it names; `listing`: what a listing of its
/// directory said of each object in it.
async fn open_indexed(
    location: &Location,
    fetcher: &Fetcher<'_>,
    index_path: &ObjectPath,
    known: Known,
    listing: Option<&BTreeMap<ObjectPath, ObjectMeta>>,
) -> Result<Opened, RemoteError> {
    let (url, bytes) = fetch_index(location, fetcher, index_path, known, INDEX_BYTES_MAX).await?;
    let index = parse_index(bytes).map_err(|kind| RemoteError::Index { url: url.clone(), kind })?;
    let dir = parent(index_path);
    let names: BTreeSet<&str> = index.shard_names().collect();
    let paths: Vec<ShardAt> = names
        .into_iter()
        .map(|n| {
            child_raw(&dir, n).map(|path| {
                let listed = listing.and_then(|l| l.get(&path)).cloned();
                ShardAt { path, name: n.to_owned(), listed }
            })
        })
        .collect::<Result<_, _>>()
        .map_err(|e| RemoteError::NoCheckpoint { url: url.clone(), reason: e.to_string() })?;
    let shards = open_shards(location, fetcher, paths).await?;
    assemble(location, shards, Layout::Indexed { url: &url, index: &index })
}

/// What opening knows of an object before it reads it.
enum Known {
    Nothing,
    /// What a HEAD that probed for it answered (a plain HTTP server's directory): not asked again.
    Headed(ObjectMeta),
    /// What a listing said of it: its size bounds its first read, whose response gives the
    /// version (a listing's ETag or date may be spelled otherwise than a response's).
    Listed(ObjectMeta),
}

/// A safetensors object to open: its path, its name as the index spells it, and what a listing
/// said of it (`None`: not listed).
struct ShardAt {
    path: ObjectPath,
    name: String,
    listed: Option<ObjectMeta>,
}

async fn open_shards(
    location: &Location,
    fetcher: &Fetcher<'_>,
    paths: Vec<ShardAt>,
) -> Result<Vec<Shard>, RemoteError> {
    futures::stream::iter(paths)
        .map(|shard| open_shard(location, fetcher, shard))
        .buffered(HEADER_FETCHES_INFLIGHT_MAX)
        .try_collect()
        .await
}

/// The version and header of one safetensors object. One a listing named (and no cache record
/// answers for) is read from its first ranged GET ([`Fetcher::first_read`]), whose response
/// gives the version; any other is asked with a HEAD first ([`read_header`]).
async fn open_shard(location: &Location, fetcher: &Fetcher<'_>, at: ShardAt) -> Result<Shard, RemoteError> {
    let ShardAt { path, name, listed } = at;
    let url = location.url_of(&path);
    // Shorter than a header length: the HEAD path names that (`read_header`), with no read.
    let listed = listed.filter(|m| m.size >= 8 && !fetcher.recorded(&path));
    let (object, first) = match listed {
        Some(meta) => {
            // At most HEADER_FIRST_READ_BYTES, whatever the listing claims.
            let mut first = vec![0u8; meta.size.min(HEADER_FIRST_READ_BYTES) as usize];
            let listed = RemoteObject { url: url.clone(), meta };
            let meta = fetcher.first_read(&listed, &mut first).await?;
            (RemoteObject { url: url.clone(), meta }, Some(first))
        }
        None => (RemoteObject { url: url.clone(), meta: fetcher.head(&path, &url).await? }, None),
    };
    fetcher.check_versioned(&object, "its header and its tensors")?;
    let file_len_bytes = object.len_bytes();
    let format_err = |source| RemoteError::Format { url: url.clone(), source };
    let bytes = read_header(fetcher, &object, first).await?;
    let header = parse_header_with_path(&bytes, file_len_bytes, Path::new(&url)).map_err(format_err)?;
    Ok(Shard { object, name, header })
}

/// The first `8 + n` bytes of a safetensors object: its header length and header. `first`: its
/// first bytes, already read with its version ([`Fetcher::first_read`]). Otherwise a cached copy
/// answers as it recorded them (the length, then the header), or the store sends the first
/// [`HEADER_FIRST_READ_BYTES`] in one request. The rest of a longer header comes in a second,
/// and the cache (if any) records the header alone: the tensor bytes of the first read are the
/// load's to write there, from where they land.
async fn read_header(
    fetcher: &Fetcher<'_>,
    object: &RemoteObject,
    first: Option<Vec<u8>>,
) -> Result<Vec<u8>, RemoteError> {
    let file_len_bytes = object.len_bytes();
    let format_err = |source| RemoteError::Format { url: object.url.clone(), source };
    let mut prefix = [0u8; 8];
    let prefix_len = file_len_bytes.min(8) as usize;
    if first.is_none() && fetcher.read_cached(object, 0, &mut prefix[..prefix_len])? {
        let span = header_span_bytes(&prefix[..prefix_len], file_len_bytes).map_err(format_err)?;
        // `span` was checked against the header size limit and the object size.
        let mut bytes = vec![0u8; span as usize];
        bytes[..8].copy_from_slice(&prefix);
        fetcher.fetch(object, 8, &mut bytes[8..]).await?;
        return Ok(bytes);
    }
    let mut bytes = match first {
        Some(first) => first,
        None => {
            // At most HEADER_FIRST_READ_BYTES, whatever the object's size claims.
            let mut bytes = vec![0u8; file_len_bytes.min(HEADER_FIRST_READ_BYTES) as usize];
            fetcher.fetch_store(object, 0, &mut bytes).await?;
            bytes
        }
    };
    let span = header_span_bytes(&bytes, file_len_bytes).map_err(format_err)?;
    let first_len = bytes.len().min(span as usize);
    bytes.resize(span as usize, 0);
    fetcher.write_through(object, 0, &bytes[..first_len]).await;
    if let Some(rest) = bytes.get_mut(first_len..).filter(|rest| !rest.is_empty()) {
        fetcher.fetch(object, first_len as u64, rest).await?;
    }
    Ok(bytes)
}

fn assemble(location: &Location, shards: Vec<Shard>, layout: Layout<'_>) -> Result<Opened, RemoteError> {
    let root = PathBuf::from(root_url(location));
    let (parts, objects): (Vec<_>, Vec<_>) = shards.into_iter().map(Shard::into_parts).unzip();
    let layout = match layout {
        Layout::Single if parts.is_empty() => {
            return Err(RemoteError::NoCheckpoint { url: root_url(location), reason: "no object".into() });
        }
        Layout::Single => ShardLayout::Single,
        Layout::Listed => ShardLayout::Listed,
        Layout::Indexed { url, index } => {
            ShardLayout::Indexed { url: PathBuf::from(url), index: Box::new(index.clone()) }
        }
    };
    Opened::new(Rebuild::Safetensors { root, layout, parts }, objects)
}

/// The printable URL of the location itself.
fn root_url(location: &Location) -> String {
    location.url_of(location.object_path().unwrap_or(&ObjectPath::default()))
}

#[cfg(test)]
mod tests;
