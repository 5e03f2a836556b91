//! RemoteBackend against in-memory stores: equal bytes, errors naming tensors, stops and cancels.
use super::*;
use std::path::Path;

use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt};
use proptest::prelude::*;
use tensora_format::Selection;
use tensora_io::LoadOptions;

use crate::test_store::{BreakingStore, VersionlessStore, upload_dir, write_f32_shards};
use crate::{Location, RemoteOptions};

/// A sharded checkpoint of tensors with the given byte lengths (F32, so multiples of 4), in
/// `dir`, and the same files in an in-memory store under `ckpt/`.
fn stored(
    dir: &Path,
    lens_words: &[u64],
    shard_cap: u64,
    rt: &tokio::runtime::Runtime,
) -> Arc<BreakingStore> {
    write_f32_shards(dir, lens_words, shard_cap, |i, b| (b as usize * 7 + i * 13) as u8);
    let store = Arc::new(BreakingStore::default());
    upload_dir(&store.inner, dir, "ckpt", rt);
    store
}

fn open(store: Arc<dyn ObjectStore>, opts: &RemoteOptions) -> RemoteCheckpoint {
    try_open(store, opts).unwrap()
}

fn try_open(store: Arc<dyn ObjectStore>, opts: &RemoteOptions) -> Result<RemoteCheckpoint, RemoteError> {
    let location = Location::parse("http://mem.invalid/ckpt/").unwrap();
    let client = Client::with_store(store, opts).unwrap();
    crate::checkpoint::open(&location, client, opts.cache.as_ref(), 0.0)
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().build().unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    /// For any layout, selection, chunk size, reads in flight and issuing threads, owned and
    /// streamed remote loads deliver exactly the bytes a local load of the same files does.
    #[test]
    fn remote_loads_equal_local_loads(
        lens in proptest::collection::vec(0u64..20_000, 1..10),
        cap_words in 1u64..40_000,
        chunk in 4096u64..100_000,
        inflight in 1usize..9,
        threads in 0usize..4,
        picks in proptest::collection::vec(any::<bool>(), 10),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let store = stored(dir.path(), &lens, cap_words * 4, &rt());
        let tuning = if inflight % 2 == 0 { crate::Tuning::Auto } else { crate::Tuning::Fixed };
        let opts = RemoteOptions { chunk_bytes: chunk, reads_inflight_max: inflight, runtime_threads: threads,
            tuning, ..RemoteOptions::default() };
        let remote = open(store as Arc<dyn ObjectStore>, &opts);
        let names: Vec<String> =
            (0..lens.len()).filter(|&i| picks[i]).map(|i| format!("t{i}")).collect();
        let selection = if names.is_empty() { Selection::All } else { Selection::Names(names) };
        let load = LoadOptions { selection, ..LoadOptions::default() };
        let local = tensora_io::load_path(dir.path(), &load).unwrap();
        let loaded = remote.load(&load).unwrap();
        prop_assert_eq!(loaded.len(), local.len());
        for t in local.tensors() {
            prop_assert_eq!(loaded.tensor(t.name()).unwrap().bytes(), t.bytes(), "{}", t.name());
        }
        prop_assert!(loaded.report().load.peak_inflight_bytes <= loaded.report().inflight_bytes_max);
        let mut streamed = 0usize;
        let stream = LoadOptions { budget_bytes: (chunk * 2).max(100_000), ..load };
        remote.load_streaming(&stream, |t| {
            let want = local.tensor(t.name()).ok_or("not selected locally")?;
            if t.bytes() != want.bytes() {
                return Err(format!("{} differs", t.name()).into());
            }
            streamed += 1;
            Ok(())
        }).unwrap();
        prop_assert_eq!(streamed, local.len());
    }
}

#[test]
fn an_object_replaced_after_open_fails_with_changed() {
    let dir = tempfile::tempdir().unwrap();
    let rt = rt();
    let store = stored(dir.path(), &[1000, 2000, 3000], 8000, &rt);
    let remote = open(Arc::clone(&store) as Arc<dyn ObjectStore>, &RemoteOptions::default());
    let victim = ObjectPath::from(format!(
        "ckpt/{}",
        Path::new(remote.checkpoint().files()[0].path()).file_name().unwrap().to_str().unwrap()
    ));
    let bytes = rt.block_on(async { store.inner.get(&victim).await.unwrap().bytes().await.unwrap() });
    rt.block_on(store.inner.put(&victim, bytes.to_vec().into())).unwrap();
    let err = remote.load(&LoadOptions::default()).unwrap_err();
    assert!(err.is_changed(), "{err}");
    // The error names the object, the offset and the tensor, around the remote cause.
    let RemoteError::Read { url, tensor, offset_bytes, source } = &err else { panic!("not a read: {err}") };
    let file = remote.checkpoint().files()[0].path().to_string_lossy().into_owned();
    assert_eq!(*url, file);
    let t = remote.tensor(tensor).unwrap_or_else(|| panic!("{tensor:?} is no tensor"));
    assert_eq!(t.file(), tensora_format::FileId(0));
    assert!(t.range().contains(offset_bytes), "{offset_bytes} outside {:?}", t.range());
    assert!(matches!(**source, RemoteError::Changed { .. }), "{source}");
    let text = err.to_string();
    assert!(text.contains(&file) && text.contains(tensor.as_str()), "{text}");
    // A load layer failure that is not a fetch is the load layer's error.
    let missing = LoadOptions { selection: Selection::Names(vec!["nope".into()]), ..LoadOptions::default() };
    let err = remote.load(&missing).unwrap_err();
    assert!(matches!(err, RemoteError::Load(_)), "{err}");
}

/// A self-tuned load of fewer than LOAD_RANGES_MIN chunks is fetched in shorter ranges, so that
/// more connections share it; a fixed depth keeps the chunk. Either way the depth is at
/// most the load's ranges.
#[test]
fn a_small_self_tuned_load_is_fetched_in_shorter_ranges() {
    let dir = tempfile::tempdir().unwrap();
    let store = stored(dir.path(), &[2 << 20], u64::MAX, &rt());
    let local = tensora_io::load_path(dir.path(), &LoadOptions::default()).unwrap();
    for (tuning, requests, range_kib) in [(crate::Tuning::Auto, 8, 1024), (crate::Tuning::Fixed, 1, 8192)] {
        let opts = RemoteOptions { tuning, ..RemoteOptions::default() };
        let remote = open(Arc::clone(&store) as Arc<dyn ObjectStore>, &opts);
        let loaded = remote.load(&LoadOptions::default()).unwrap();
        assert_eq!(loaded.tensor("t0").unwrap().bytes(), local.tensor("t0").unwrap().bytes());
        let report = loaded.report();
        assert_eq!(report.requests, requests, "{tuning:?}: {report:?}");
        assert!(report.load.reason.contains(&format!("GETs of {range_kib} KiB")), "{report:?}");
        // No more in flight than the load has ranges.
        assert_eq!(report.concurrency.as_ref().unwrap().depth, requests as usize, "{report:?}");
    }
}

/// The tuner measures in arriving bytes: on a load of twice its start depth in ranges it still
/// measures the start and the doubled depth, where windows counted in landed ranges closed too
/// late for the second (every range had started by then).
#[test]
fn the_tuner_measures_two_depths_within_a_load_of_twice_its_start() {
    use crate::tune::START_DEPTH;
    let dir = tempfile::tempdir().unwrap();
    let chunk_bytes = 16 << 10;
    let ranges = 2 * START_DEPTH as u64;
    let store = stored(dir.path(), &[ranges * chunk_bytes / 4], u64::MAX, &rt());
    let opts = RemoteOptions { chunk_bytes, reads_inflight_max: 2 * START_DEPTH, ..RemoteOptions::default() };
    let remote = open(store as Arc<dyn ObjectStore>, &opts);
    let loaded = remote.load(&LoadOptions::default()).unwrap();
    let tune = loaded.report().concurrency.clone().unwrap();
    assert_eq!(tune.mode, "auto");
    let depths: Vec<usize> = tune.probes.iter().map(|p| p.depth).collect();
    assert!(depths.len() >= 2 && depths[..2] == [START_DEPTH, 2 * START_DEPTH], "{tune:?}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]
    /// The in-flight shares never exceed the cap, sum to it, and differ by at most one.
    #[test]
    fn inflight_shares_split_the_cap_exactly(max in 1usize..200, threads in 0usize..80) {
        let shares = inflight_shares(max, threads);
        prop_assert_eq!(shares.len(), threads.clamp(1, max));
        prop_assert_eq!(shares.iter().sum::<usize>(), max);
        prop_assert!(shares.iter().all(|&n| n >= 1));
        let (lo, hi) = (shares.iter().min().unwrap(), shares.iter().max().unwrap());
        prop_assert!(hi - lo <= 1);
    }
}

#[test]
fn inflight_shares_examples() {
    // 3 threads × ceil(4 / 3) = 6 would exceed a cap of 4.
    assert_eq!(inflight_shares(4, 3), vec![2, 1, 1]);
    assert_eq!(inflight_shares(2, 8), vec![1, 1]);
    assert_eq!(inflight_shares(16, 2), vec![8, 8]);
}

/// One tensor smaller than a chunk: exactly one GET per load, whatever else runs.
#[test]
fn each_load_counts_its_own_requests_only() {
    let dir = tempfile::tempdir().unwrap();
    let store = stored(dir.path(), &[100, 200, 300, 400], 1200, &rt());
    let remote = open(store as Arc<dyn ObjectStore>, &RemoteOptions::default());
    assert!(remote.open_requests() > 0);
    let one = LoadOptions { selection: Selection::Names(vec!["t1".into()]), ..LoadOptions::default() };
    let first = remote.load(&one).unwrap();
    let second = remote.load(&one).unwrap();
    for r in [first.report(), second.report()] {
        assert_eq!((r.requests, r.load.retries), (1, 0), "{r:?}");
        assert_eq!(r.open_requests, remote.open_requests());
    }
    // Concurrent loads on one client (one runtime, one store) do not count each other's.
    let reports: Vec<crate::RemoteReport> = std::thread::scope(|s| {
        let handles: Vec<_> =
            (0..4).map(|_| s.spawn(|| remote.load(&one).unwrap().report().clone())).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for r in reports {
        assert_eq!(r.requests, 1, "{r:?}");
    }
    // A second open on the same client counts its own requests, as many as the first.
    let again = crate::checkpoint::open(remote.location(), Arc::clone(remote.client()), None, 0.0).unwrap();
    assert_eq!(again.open_requests(), remote.open_requests());
}

/// After the first permanent failure, ranges still in flight (here: hanging, each for longer
/// than any working test runs, and no attempt would time out) are stopped, not waited out:
/// every hanging GET is dropped by the loader, none runs to its end. Issue 21: counted, not timed.
#[test]
fn the_first_failure_stops_every_range_in_flight() {
    let dir = tempfile::tempdir().unwrap();
    let store = stored(dir.path(), &[20_000, 20_000, 20_000, 20_000], 40_000, &rt());
    let opts = RemoteOptions {
        chunk_bytes: 8192,
        reads_inflight_max: 6,
        tuning: crate::Tuning::Fixed,
        runtime_threads: 2,
        request_overhead: Duration::from_secs(3600),
        retry: crate::RetryPolicy { retries_per_range_max: 0, ..crate::RetryPolicy::default() },
        ..RemoteOptions::default()
    };
    let remote = open(Arc::clone(&store) as Arc<dyn ObjectStore>, &opts);
    // 6 in flight over 2 threads: the first 5 GETs hang (some on each thread), the 6th fails
    // for good.
    store.hang_next.store(5, Ordering::Relaxed);
    store.refuse_next.store(1, Ordering::Relaxed);
    let err = remote.load(&LoadOptions::default()).unwrap_err();
    assert!(err.is_changed(), "{err}");
    let hangs = &store.hangs;
    assert_eq!(hangs.started.load(Ordering::Acquire), 5);
    assert_eq!((hangs.dropped.load(Ordering::Acquire), hangs.finished.load(Ordering::Acquire)), (5, 0));
}

/// A cancel stops the ranges in flight: the test cancels once the store signals that four GETs
/// hang, and the load ends with the load layer's cancellation, every hanging GET dropped.
#[test]
fn a_cancel_stops_every_range_in_flight() {
    let dir = tempfile::tempdir().unwrap();
    let store = stored(dir.path(), &[20_000, 20_000, 20_000, 20_000], 40_000, &rt());
    let opts = RemoteOptions {
        chunk_bytes: 8192,
        reads_inflight_max: 4,
        tuning: crate::Tuning::Fixed,
        runtime_threads: 2,
        request_overhead: Duration::from_secs(3600),
        ..RemoteOptions::default()
    };
    let remote = open(Arc::clone(&store) as Arc<dyn ObjectStore>, &opts);
    store.hang_next.store(u32::MAX, Ordering::Relaxed);
    let cancel = Arc::new(AtomicBool::new(false));
    let load = LoadOptions { cancel: Some(Arc::clone(&cancel)), ..LoadOptions::default() };
    let err = std::thread::scope(|s| {
        s.spawn(|| {
            store.hangs.wait_started(4);
            cancel.store(true, Ordering::Relaxed);
        });
        remote.load(&load).unwrap_err()
    });
    assert!(matches!(err, RemoteError::Load(tensora_io::LoadError::Cancelled)), "{err}");
    let hangs = &store.hangs;
    assert_eq!(hangs.started.load(Ordering::Acquire), 4);
    assert_eq!((hangs.dropped.load(Ordering::Acquire), hangs.finished.load(Ordering::Acquire)), (4, 0));
}

/// A body that breaks for good inside the second tensor of a read names that tensor and the
/// first byte that did not land, not the read's first tensor.
#[test]
fn a_broken_range_names_the_tensor_of_the_first_missing_byte() {
    let dir = tempfile::tempdir().unwrap();
    // Two 8,000-byte tensors in one shard, read as one range.
    let store = stored(dir.path(), &[2000, 2000], 1 << 20, &rt());
    let opts = RemoteOptions {
        retry: crate::RetryPolicy { retries_per_range_max: 0, ..crate::RetryPolicy::default() },
        ..RemoteOptions::default()
    };
    let remote = open(Arc::clone(&store) as Arc<dyn ObjectStore>, &opts);
    let data_start = remote.checkpoint().tensor("t0").unwrap().offset_bytes();
    // The body breaks 12,000 bytes in: inside t1.
    store.breaks.lock().unwrap().push_back(12_000);
    let err = remote.load(&LoadOptions::default()).unwrap_err();
    match &err {
        RemoteError::Read { tensor, offset_bytes, .. } => {
            assert_eq!(tensor, "t1", "{err}");
            assert_eq!(*offset_bytes, data_start + 12_000, "{err}");
        }
        other => panic!("expected a read error naming the tensor, got {other}"),
    }
}

/// Opening, loading and dropping the last client from async code works (no nested
/// `block_on`, no runtime dropped on a runtime thread).
#[test]
fn works_from_inside_an_async_runtime() {
    let dir = tempfile::tempdir().unwrap();
    let store = stored(dir.path(), &[100, 200, 300], 1200, &rt());
    let outer = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let (loaded, streamed) = outer.block_on(async move {
        let remote = open(store as Arc<dyn ObjectStore>, &RemoteOptions::default());
        let loaded = remote.load(&LoadOptions::default()).unwrap().len();
        let mut streamed = 0;
        remote
            .load_streaming(&LoadOptions::default(), |_| {
                streamed += 1;
                Ok(())
            })
            .unwrap();
        // The last user of the client goes here, on a runtime thread.
        drop(remote);
        (loaded, streamed)
    });
    assert_eq!((loaded, streamed), (3, 3));
}

/// A checkpoint of one shard with four 8,000-byte tensors in a [`VersionlessStore`], read in
/// 4 KiB ranges one at a time (so one load is many GETs, in file order).
fn versionless(dir: &Path, drop_last_modified: bool) -> (Arc<VersionlessStore>, RemoteOptions) {
    write_f32_shards(dir, &[2000; 4], 1 << 20, |i, b| (b as usize * 7 + i * 13) as u8);
    let store = Arc::new(VersionlessStore { drop_last_modified, ..VersionlessStore::default() });
    upload_dir(&store.inner.inner, dir, "ckpt", &rt());
    let opts = RemoteOptions {
        chunk_bytes: 4096,
        reads_inflight_max: 1,
        runtime_threads: 0,
        ..RemoteOptions::default()
    };
    (store, opts)
}

/// Finding 7 of issue 14: without an ETag, a same-size replacement between two ranges (the
/// server ignoring `If-Unmodified-Since`) is caught by the response's Last-Modified date, not
/// loaded as a mix of two versions.
#[test]
fn an_object_without_etag_replaced_mid_load_fails_with_changed() {
    let dir = tempfile::tempdir().unwrap();
    let (store, opts) = versionless(dir.path(), false);
    let remote = open(Arc::clone(&store) as Arc<dyn ObjectStore>, &opts);
    assert!(remote.objects().iter().all(|o| o.meta.e_tag.is_none()));
    let file =
        Path::new(remote.checkpoint().files()[0].path()).file_name().unwrap().to_str().unwrap().to_owned();
    let mut bytes = std::fs::read(dir.path().join(&file)).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xFF;
    // Replaced right after the load's first range is served.
    *store.replace_after.lock().unwrap() = Some((1, ObjectPath::from(format!("ckpt/{file}")), bytes.into()));
    let err = remote.load(&LoadOptions::default()).unwrap_err();
    assert!(err.is_changed(), "{err}");
    assert!(err.to_string().contains("last-modified"), "{err}");
}

/// Finding 7 of issue 14: an object with neither ETag nor Last-Modified is refused (its header
/// and its tensors are separate requests), naming the opt-in; opted in, it loads.
#[test]
fn an_object_with_no_version_is_refused_unless_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let (store, opts) = versionless(dir.path(), true);
    let err = try_open(Arc::clone(&store) as Arc<dyn ObjectStore>, &opts).unwrap_err();
    assert!(matches!(err, RemoteError::Unversioned { .. }), "{err}");
    assert!(err.to_string().contains("--allow-unversioned"), "{err}");
    let allowed = RemoteOptions { unversioned: crate::Unversioned::Allow, ..opts };
    let remote = open(store as Arc<dyn ObjectStore>, &allowed);
    let local = tensora_io::load_path(dir.path(), &LoadOptions::default()).unwrap();
    let loaded = remote.load(&LoadOptions::default()).unwrap();
    for t in local.tensors() {
        assert_eq!(loaded.tensor(t.name()).unwrap().bytes(), t.bytes(), "{}", t.name());
    }
}

/// A cold-cache load whose range breaks twice mid-body (inside its second piece, then inside its
/// third): each retry resumes where the body stopped, the pieces go on with the bytes that did
/// land, and every recorded piece's CRC-32C matches the copy.
#[test]
fn a_broken_body_resumes_into_the_pieces_of_a_cached_range() {
    let dir = tempfile::tempdir().unwrap();
    let cache_dir = tempfile::tempdir().unwrap();
    // One 3 MiB tensor, read as one range (a fixed depth keeps the chunk: `range_bytes`).
    let store = stored(dir.path(), &[3 << 18], 8 << 20, &rt());
    let cache = crate::CacheOptions {
        dir: cache_dir.path().to_path_buf(),
        size_max_bytes: None,
        offline: false,
        writes: crate::CacheWrites::default(),
    };
    let opts = RemoteOptions {
        chunk_bytes: 4 << 20,
        tuning: crate::Tuning::Fixed,
        cache: Some(cache.clone()),
        ..RemoteOptions::default()
    };
    let remote = open(Arc::clone(&store) as Arc<dyn ObjectStore>, &opts);
    store.breaks.lock().unwrap().extend([1_500_000, 700_000]);
    let mut loaded = remote.load(&LoadOptions::default()).unwrap();
    let local = tensora_io::load_path(dir.path(), &LoadOptions::default()).unwrap();
    assert_eq!(loaded.tensor("t0").unwrap().bytes(), local.tensor("t0").unwrap().bytes());
    assert_eq!(loaded.report().load.retries, 2, "{:?}", loaded.report());
    let report = loaded.wait_cache().cache.clone().unwrap();
    assert_eq!(report.written_bytes, loaded.report().load.bytes_read, "{report:?}");
    let handle = crate::Cache::open(&cache).unwrap();
    let verified = handle.verify();
    assert!(!verified.is_empty() && verified.iter().all(|v| !v.is_damaged()), "{verified:?}");
    assert!(handle.list().iter().all(|o| o.complete), "{:?}", handle.list());
}

/// An object with no version, loaded (opted in) with a cache: the cache never writes it (two
/// requests could have read two versions), and the load fetches every range from the store.
#[test]
fn a_cache_writes_nothing_of_an_object_with_no_version() {
    let dir = tempfile::tempdir().unwrap();
    let cache_dir = tempfile::tempdir().unwrap();
    let (store, opts) = versionless(dir.path(), true);
    let cache = crate::CacheOptions {
        dir: cache_dir.path().to_path_buf(),
        size_max_bytes: None,
        offline: false,
        writes: crate::CacheWrites::default(),
    };
    let opts = RemoteOptions { unversioned: crate::Unversioned::Allow, cache: Some(cache.clone()), ..opts };
    let remote = open(store as Arc<dyn ObjectStore>, &opts);
    let local = tensora_io::load_path(dir.path(), &LoadOptions::default()).unwrap();
    for _ in 0..2 {
        let mut loaded = remote.load(&LoadOptions::default()).unwrap();
        for t in local.tensors() {
            assert_eq!(loaded.tensor(t.name()).unwrap().bytes(), t.bytes(), "{}", t.name());
        }
        assert!(loaded.report().requests > 0, "from the store: {:?}", loaded.report());
        let report = loaded.wait_cache().cache.clone().unwrap();
        assert_eq!((report.written_bytes, report.hit_bytes, report.promoted), (0, 0, 0), "{report:?}");
    }
    assert!(crate::Cache::open(&cache).unwrap().list().iter().all(|o| o.cached_bytes == 0));
}
