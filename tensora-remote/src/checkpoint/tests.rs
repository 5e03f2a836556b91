//! Opening against in-memory stores: the local dispatch rules, listing bounds, the deadline.
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
    open(&location, client, None, 0.0)
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
    assert_eq!(open_at(upload(dir.path(), "ckpt"), "s3://b/ckpt/").unwrap().checkpoint().files().len(), 2);
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
    let names: Vec<&str> = names.keys().map(|p| p.as_ref()).collect();
    // Finding 8 of issue 14: only the names the layout rules look at are kept.
    assert_eq!(names, ["p/a.safetensors"]);
    let many: Vec<ObjectMeta> =
        (0..=LISTED_NAMES_MAX).map(|i| meta(&format!("p/s{i}.safetensors"))).collect();
    let err = rt().block_on(direct_children(listing(&many), &prefix, LIST_ENTRIES_MAX)).unwrap_err();
    assert!(err.contains(&format!("more than {LISTED_NAMES_MAX} checkpoint objects")), "{err}");
    let junk: Vec<ObjectMeta> = (0..LISTED_NAMES_MAX * 2).map(|i| meta(&format!("p/log{i}.txt"))).collect();
    assert!(rt().block_on(direct_children(listing(&junk), &prefix, LIST_ENTRIES_MAX)).unwrap().is_empty());
    let err = rt().block_on(direct_children(listing(&entries), &prefix, 3)).unwrap_err();
    assert!(err.contains("more than 3"), "{err}");
    // An endless listing is cut off after the bound, not read to its end.
    let endless = futures::stream::repeat_with(|| Ok(meta("p/x.safetensors"))).boxed();
    let err = rt().block_on(direct_children(endless, &prefix, 1000)).unwrap_err();
    assert!(err.contains("more than 1000"), "{err}");
}

/// Finding 8 of issue 14: an open that cannot finish (here the index GET never answers, and
/// no single attempt would time out) fails at the open deadline, which the error names.
#[test]
fn an_open_that_cannot_finish_fails_at_its_deadline() {
    let dir = tempfile::tempdir().unwrap();
    write_ckpt(dir.path(), &[100, 200], 400);
    let store = Arc::new(crate::test_store::BreakingStore::default());
    upload_dir(&store.inner, dir.path(), "ckpt", &rt());
    store.hang_next.store(1, std::sync::atomic::Ordering::Relaxed);
    let opts = RemoteOptions {
        open_deadline: std::time::Duration::from_millis(300),
        request_overhead: std::time::Duration::from_secs(3600),
        ..RemoteOptions::default()
    };
    let location = Location::parse("http://mem.invalid/ckpt/").unwrap();
    let client = Client::with_store(store as Arc<dyn ObjectStore>, &opts).unwrap();
    let err = open(&location, client, None, 0.0).unwrap_err();
    assert!(matches!(err, RemoteError::OpenDeadline { requests, .. } if requests >= 2), "{err}");
    assert!(err.to_string().contains("open_deadline"), "{err}");
}

/// Finding 8 of issue 14: ServerlessLLM partitions are probed only as far as the index needs,
/// not until one is missing (up to 65,536 HEADs on a server that has many).
#[test]
fn serverlessllm_probing_asks_only_for_the_partitions_the_index_needs() {
    let dir = tempfile::tempdir().unwrap();
    let tiny = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/serverlessllm/tiny"));
    for entry in std::fs::read_dir(tiny).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
    }
    // Partitions nobody refers to.
    for i in 3..40 {
        std::fs::write(dir.path().join(format!("tensor.data_{i}")), [0u8; 16]).unwrap();
    }
    let remote = open_at(upload(dir.path(), "ckpt"), "http://mem.invalid/ckpt/").unwrap();
    assert_eq!(remote.checkpoint().files().len(), 3);
    // The index probe (a HEAD, whose answer the index's GET goes by), the GET, and the three
    // partitions' HEADs.
    assert_eq!(remote.open_requests(), 1 + 1 + 3);
    let local = tensora_format::open(tiny).unwrap();
    assert_eq!(remote.tensors().len(), local.tensors().len());
}

/// Opening a shard reads its header length and, when it fits, its header in one ranged read
/// ([`HEADER_FIRST_READ_BYTES`]); a longer header costs one more read for the rest. Either way
/// the tensors are those of a local open.
#[test]
fn a_shard_header_costs_one_read_unless_it_is_longer_than_the_first() {
    // Three shards with headers (and files) far shorter than the first read.
    let short = tempfile::tempdir().unwrap();
    write_ckpt(short.path(), &[100, 200, 300], 1000);
    let files = tensora_format::open(short.path()).unwrap().files().len() as u64;
    assert_eq!(files, 3);
    // Opened from a listing, each shard's version is its first read's; probed (plain HTTP, and
    // the index names the shards), a HEAD's.
    // S3: the listing, the index read whole (its size listed). HTTP: two HEADs probing (the
    // second finds the index), its GET. Then a first read per shard, after a HEAD if unlisted.
    for (location, before_shards, per_shard) in
        [("s3://b/ckpt/", 1 + 1, 1), ("http://mem.invalid/ckpt/", 2 + 1, 2)]
    {
        let store = upload(short.path(), "ckpt");
        let remote = open_at(Arc::clone(&store), location).unwrap();
        assert_eq!(remote.open_requests(), before_shards + per_shard * files, "{location}");
        assert_eq!(remote.tensors().len(), 3);
        for object in remote.objects() {
            let meta = rt().block_on(store.head(object.path())).unwrap();
            assert_eq!(object.version(), crate::fetch::RemoteObject { url: String::new(), meta }.version());
        }
    }

    // One shard whose header (2,000 entries) is longer than the first read.
    let long = tempfile::tempdir().unwrap();
    write_ckpt(long.path(), &[1; 2000], u64::MAX);
    let local = tensora_format::open(long.path()).unwrap();
    assert_eq!(local.files().len(), 1);
    let location = "s3://b/ckpt/";
    let header_bytes = local.files()[0].data_start_bytes();
    assert!(header_bytes > HEADER_FIRST_READ_BYTES, "a {header_bytes}-byte header");
    let remote = open_at(upload(long.path(), "ckpt"), location).unwrap();
    // The listing, the index, then the shard's first read and the rest of its header.
    assert_eq!(remote.open_requests(), 1 + 1 + 2);
    assert_eq!(remote.tensors(), local.tensors());
}

/// An object shorter than a header length is refused as the local parser refuses a file that
/// short, naming the object, after one read of what it has.
#[test]
fn an_object_shorter_than_a_header_length_is_a_format_error() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("model.safetensors"), [1u8, 0, 0]).unwrap();
    let err = open_at(upload(dir.path(), "ckpt"), "s3://b/ckpt/").unwrap_err();
    match &err {
        RemoteError::Format { url, .. } => assert!(url.ends_with("ckpt/model.safetensors"), "{url}"),
        other => panic!("{other}"),
    }
    assert!(err.to_string().contains("model.safetensors"), "{err}");
}

/// A listed index is read whole at its listed size, and refused as changed when the response
/// says the object now has another size (rewritten between the listing and the read): it is
/// never parsed cut short.
#[test]
fn an_index_whose_size_changed_since_the_listing_is_refused_as_changed() {
    let dir = tempfile::tempdir().unwrap();
    write_ckpt(dir.path(), &[100, 200, 300], 1000);
    let store = upload(dir.path(), "ckpt");
    let index_path = ObjectPath::from(format!("ckpt/{HF_INDEX_NAME}"));
    let mut listed = rt().block_on(store.head(&index_path)).unwrap();
    let len_bytes = listed.size;
    // Listed one byte shorter than it now is.
    listed.size -= 1;
    let client = Client::with_store(store as Arc<dyn ObjectStore>, &RemoteOptions::default()).unwrap();
    let counters = Counters::default();
    let fetcher = client.fetcher(&counters);
    let location = Location::parse("s3://b/ckpt/").unwrap();
    let read = fetch_index(&location, &fetcher, &index_path, Known::Listed(listed), INDEX_BYTES_MAX);
    match client.runtime().block_on(read) {
        Err(RemoteError::Changed { url, planned, found }) => {
            assert!(url.ends_with(HF_INDEX_NAME), "{url}");
            assert_eq!(
                (planned, found),
                (format!("{} bytes when listed", len_bytes - 1), format!("{len_bytes} bytes"))
            );
        }
        other => panic!("{:?}", other.map(|(url, _)| url)),
    }
    assert_eq!(counters.requests.load(std::sync::atomic::Ordering::Relaxed), 1);
}
