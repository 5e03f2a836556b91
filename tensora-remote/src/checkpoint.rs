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

use crate::client::{Client, CounterSnapshot, off_runtime};
use crate::fetch::{Counters, Fetcher, RemoteObject};
use crate::{Location, RemoteError};

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
    // This open's own counters: a concurrent open or load on the same client counts its own.
    let counters = Counters::default();
    let fetcher = client.fetcher(&counters);
    // Blocking on the client's runtime panics inside another runtime: open from a plain thread.
    let opened = off_runtime(|| client.runtime().block_on(open_async(location, &fetcher)));
    let Opened { checkpoint, objects } = opened?;
    let parse_seconds = t.elapsed().as_secs_f64();
    let open_counts = counters.snapshot();
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
        let shard = open_shard(location, fetcher, path.clone(), name.to_owned()).await?;
        return assemble(location, vec![shard], Layout::Single);
    }
    // The local rules (tensora_format::open): a ServerlessLLM index wins, then the one HF index.
    if let Location::S3 { .. } = location {
        return open_listed(location, fetcher, path).await;
    }
    // A plain HTTP server cannot be listed: probe the names a directory would have, in the
    // order the local opener decides by.
    let sllm = path.clone().join(SLLM_INDEX_NAME);
    match fetcher.head(&sllm, &location.url_of(&sllm)).await {
        Ok(_) => return open_sllm(location, fetcher, &sllm).await,
        Err(RemoteError::NotFound { .. }) => {}
        Err(e) => return Err(e),
    }
    let index = path.clone().join(HF_INDEX_NAME);
    match fetcher.head(&index, &location.url_of(&index)).await {
        Ok(_) => return open_indexed(location, fetcher, &index).await,
        Err(RemoteError::NotFound { .. }) => {}
        Err(e) => return Err(e),
    }
    let single = path.clone().join(SINGLE_FILE_NAME);
    match open_shard(location, fetcher, single, SINGLE_FILE_NAME.to_owned()).await {
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
    let (url, bytes) = fetch_index(location, fetcher, index_path, INDEX_LEN_BYTES_MAX).await?;
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
    let listed = fetcher.store.list(Some(prefix));
    let names = direct_children(listed, prefix, LIST_ENTRIES_MAX)
        .await
        .map_err(|reason| RemoteError::NoCheckpoint { url: url.clone(), reason })?;
    if let Some(sllm) = names.iter().find(|p| file_name(p) == SLLM_INDEX_NAME) {
        return open_sllm(location, fetcher, sllm).await;
    }
    let indexes: Vec<&ObjectPath> = names.iter().filter(|p| file_name(p).ends_with(INDEX_SUFFIX)).collect();
    match indexes.as_slice() {
        [one] => return open_indexed(location, fetcher, one).await,
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
    let shards: Vec<(ObjectPath, String)> = names
        .into_iter()
        .filter(|p| file_name(p).ends_with(".safetensors"))
        .map(|p| {
            let name = file_name(&p).to_owned();
            (p, name)
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

/// The objects directly under `prefix` whose names do not start with `.`, from a listing of
/// everything under it, read as a stream: more than `entries_max` entries (nested ones included)
/// is refused without reading further.
async fn direct_children(
    listed: futures::stream::BoxStream<'_, object_store::Result<object_store::ObjectMeta>>,
    prefix: &ObjectPath,
    entries_max: usize,
) -> Result<BTreeSet<ObjectPath>, String> {
    let mut listed = listed.take(entries_max.saturating_add(1));
    let mut seen = 0usize;
    let mut names = BTreeSet::new();
    while let Some(meta) = listed.next().await {
        let meta = meta.map_err(|e| format!("listing failed: {e}"))?;
        seen += 1;
        if seen > entries_max {
            return Err(format!("more than {entries_max} objects under the prefix"));
        }
        let direct = meta.location.prefix_match(prefix).is_some_and(|rest| rest.count() == 1);
        if direct && !file_name(&meta.location).starts_with('.') {
            names.insert(meta.location);
        }
    }
    Ok(names)
}

/// The whole index object at `index_path` (its URL and bytes), refused without a download when
/// HEAD says it is larger than `limit_bytes`: the buffer is never sized from an unchecked length.
async fn fetch_index(
    location: &Location,
    fetcher: &Fetcher<'_>,
    index_path: &ObjectPath,
    limit_bytes: u64,
) -> Result<(String, Vec<u8>), RemoteError> {
    let url = location.url_of(index_path);
    let meta = fetcher.head(index_path, &url).await?;
    if meta.size > limit_bytes {
        return Err(RemoteError::TooLarge { url, len_bytes: meta.size, limit_bytes });
    }
    let object = RemoteObject { url: url.clone(), meta };
    // Bounded by `limit_bytes` above.
    let mut bytes = vec![0u8; object.len_bytes() as usize];
    fetcher.fetch(&object, 0, &mut bytes).await?;
    Ok((url, bytes))
}

async fn open_indexed(
    location: &Location,
    fetcher: &Fetcher<'_>,
    index_path: &ObjectPath,
) -> Result<Opened, RemoteError> {
    let (url, bytes) = fetch_index(location, fetcher, index_path, INDEX_BYTES_MAX).await?;
    let index = parse_index(&bytes).map_err(|kind| RemoteError::Index { url: url.clone(), kind })?;
    let dir = parent(index_path);
    let names: BTreeSet<&str> = index.shard_names().collect();
    let paths: Vec<(ObjectPath, String)> = names
        .into_iter()
        .map(|n| child_raw(&dir, n).map(|p| (p, n.to_owned())))
        .collect::<Result<_, _>>()
        .map_err(|e| RemoteError::NoCheckpoint { url: url.clone(), reason: e.to_string() })?;
    let shards = open_shards(location, fetcher, paths).await?;
    assemble(location, shards, Layout::Indexed { url: &url, index: &index })
}

async fn open_shards(
    location: &Location,
    fetcher: &Fetcher<'_>,
    paths: Vec<(ObjectPath, String)>,
) -> Result<Vec<Shard>, RemoteError> {
    futures::stream::iter(paths)
        .map(|(p, name)| open_shard(location, fetcher, p, name))
        .buffered(HEADER_FETCHES_INFLIGHT_MAX)
        .try_collect()
        .await
}

/// The header of one safetensors object (`name`: the shard's name as the index spells it): the
/// first 8 bytes, then exactly `n` more.
async fn open_shard(
    location: &Location,
    fetcher: &Fetcher<'_>,
    path: ObjectPath,
    name: String,
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
    Ok(Shard { object, name, header })
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

#[cfg(test)]
mod tests {
    use super::*;

    use object_store::memory::InMemory;
    use object_store::{ObjectMeta, ObjectStore, ObjectStoreExt};

    use crate::RemoteOptions;
    use crate::test_store::{upload_dir, write_f32_shards};

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
    }

    /// Tensor `i` of the checkpoint is `lens_words[i]` F32 elements, every byte `i`.
    fn write_ckpt(dir: &Path, lens_words: &[u64], shard_cap: u64) {
        write_f32_shards(dir, lens_words, shard_cap, |i, _| i as u8);
    }

    /// Every file of `dir` under `prefix/` in a fresh in-memory store.
    fn upload(dir: &Path, prefix: &str) -> Arc<InMemory> {
        let store = Arc::new(InMemory::new());
        upload_dir(&store, dir, prefix, &rt());
        store
    }

    fn open_at(store: Arc<InMemory>, location: &str) -> Result<RemoteCheckpoint, RemoteError> {
        let location = Location::parse(location).unwrap();
        let client = Client::with_store(store as Arc<dyn ObjectStore>, &RemoteOptions::default()).unwrap();
        open(&location, client, 0.0)
    }

    /// Which layout a local open of `dir` picks, and which a remote open of the same files does,
    /// on S3 (listing) and on plain HTTP (probing).
    fn assert_same_dispatch(dir: &Path) {
        let local = tensora_format::open(dir);
        for location in ["s3://b/ckpt/", "http://mem.invalid/ckpt/"] {
            let remote = open_at(upload(dir, "ckpt"), location);
            match (&local, &remote) {
                (Ok(l), Ok(r)) => {
                    assert_eq!(l.format(), r.format(), "{location}");
                    assert_eq!(l.tensors().len(), r.tensors().len(), "{location}");
                }
                // Two index files: refused locally; on S3 too (HTTP cannot see the second one).
                (Err(_), Err(e)) => assert!(matches!(e, RemoteError::NoCheckpoint { .. }), "{e}"),
                (Err(l), Ok(_)) if location.starts_with("http") => {
                    assert!(l.to_string().contains("index files"), "{l}");
                }
                (l, r) => panic!("{location}: local {:?}, remote {:?}", l.as_ref().err(), r.as_ref().err()),
            }
        }
    }

    #[test]
    fn a_serverlessllm_index_wins_over_an_hf_index_as_locally() {
        let dir = tempfile::tempdir().unwrap();
        write_ckpt(dir.path(), &[100, 200, 300], 1200);
        let tiny = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/serverlessllm/tiny"));
        for entry in std::fs::read_dir(tiny).unwrap() {
            let path = entry.unwrap().path();
            std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
        }
        assert_eq!(tensora_format::open(dir.path()).unwrap().format(), Format::ServerlessLlm);
        assert_same_dispatch(dir.path());
        let remote = open_at(upload(dir.path(), "ckpt"), "s3://b/ckpt/").unwrap();
        assert_eq!(remote.format(), Format::ServerlessLlm);
        let remote = open_at(upload(dir.path(), "ckpt"), "http://mem.invalid/ckpt/").unwrap();
        assert_eq!(remote.format(), Format::ServerlessLlm);
    }

    #[test]
    fn hidden_objects_are_skipped_and_two_indexes_are_refused_as_locally() {
        let dir = tempfile::tempdir().unwrap();
        write_ckpt(dir.path(), &[100, 200, 300], 1200);
        let index = dir.path().join(HF_INDEX_NAME);
        // A hidden copy of the index (an editor's, a partial upload's) is not a second index.
        std::fs::copy(&index, dir.path().join(".partial.safetensors.index.json")).unwrap();
        assert_same_dispatch(dir.path());
        assert_eq!(
            open_at(upload(dir.path(), "ckpt"), "s3://b/ckpt/").unwrap().checkpoint().files().len(),
            2
        );
        // A visible second index: the local open refuses, so does the listed S3 one.
        std::fs::copy(&index, dir.path().join("other.safetensors.index.json")).unwrap();
        assert!(tensora_format::open(dir.path()).is_err());
        assert_same_dispatch(dir.path());
        let err = open_at(upload(dir.path(), "ckpt"), "s3://b/ckpt/").unwrap_err();
        assert!(err.to_string().contains("2 index files"), "{err}");
    }

    #[test]
    fn listing_keeps_direct_children_and_stops_at_its_bound() {
        let store = InMemory::new();
        let one = ObjectPath::from("one");
        let template: ObjectMeta = rt().block_on(async {
            store.put(&one, vec![1u8].into()).await.unwrap();
            store.head(&one).await.unwrap()
        });
        let meta = |key: &str| ObjectMeta { location: ObjectPath::from(key), ..template.clone() };
        let prefix = ObjectPath::from("p");
        let entries = vec![
            meta("p/a.safetensors"),
            meta("p/.hidden.safetensors"),
            meta("p/sub/b.safetensors"),
            meta("p/c.json"),
        ];
        let listing = |entries: &Vec<ObjectMeta>| futures::stream::iter(entries.clone()).map(Ok).boxed();
        let names = rt().block_on(direct_children(listing(&entries), &prefix, 4)).unwrap();
        let names: Vec<&str> = names.iter().map(|p| p.as_ref()).collect();
        assert_eq!(names, ["p/a.safetensors", "p/c.json"]);
        let err = rt().block_on(direct_children(listing(&entries), &prefix, 3)).unwrap_err();
        assert!(err.contains("more than 3"), "{err}");
        // An endless listing is cut off after the bound, not read to its end.
        let endless = futures::stream::repeat_with(|| Ok(meta("p/x.safetensors"))).boxed();
        let err = rt().block_on(direct_children(endless, &prefix, 1000)).unwrap_err();
        assert!(err.contains("more than 1000"), "{err}");
    }
}
