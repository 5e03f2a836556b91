//! The verified local cache against a real nginx on 127.0.0.1: write-through in the same pass,
//! local loads after one HEAD per object, offline loads with no request, a changed object
//! fetched anew, partial loads, the size cap, and the CRC check of cached bytes. The
//! two-process and kill -9 cases run the `tensora` binary (tensora-cli's tests).

mod support;

use std::path::Path;

use sha2::{Digest, Sha256};
use support::{Nginx, write_checkpoint};
use tensora_format::Selection;
use tensora_io::LoadOptions;
use tensora_remote::{
    Cache, CacheOptions, CacheWrites, Location, RemoteLoaded, RemoteOptions, Tuning, open_remote,
};

fn started<T>(server: Result<T, String>) -> T {
    server.unwrap_or_else(|e| panic!("test server unavailable: {e}"))
}

fn opts(cache: &Path, offline: bool, size_max_bytes: Option<u64>) -> RemoteOptions {
    RemoteOptions {
        chunk_bytes: 256 << 10,
        reads_inflight_max: 4,
        cache: Some(CacheOptions {
            dir: cache.to_path_buf(),
            size_max_bytes,
            offline,
            writes: tensora_remote::CacheWrites::default(),
        }),
        ..RemoteOptions::default()
    }
}

fn assert_matches_local(remote: &RemoteLoaded, dir: &Path) {
    let local = tensora_io::load_path(dir, &LoadOptions::default()).expect("local load");
    assert_eq!(remote.len(), local.len());
    for t in remote.tensors() {
        let want = local.tensor(t.name()).unwrap();
        assert_eq!(Sha256::digest(t.bytes()), Sha256::digest(want.bytes()), "{}", t.name());
    }
}

/// The cache in `dir`, to list and verify.
fn handle(dir: &Path) -> Cache {
    Cache::open(&CacheOptions {
        dir: dir.to_path_buf(),
        size_max_bytes: None,
        offline: false,
        writes: tensora_remote::CacheWrites::default(),
    })
    .unwrap()
}

/// A load whose budget holds two of the tests' 256 KiB ranges: a streamed one recycles its
/// window while the lane still writes what landed in it.
fn two_ranges() -> LoadOptions {
    LoadOptions { budget_bytes: 512 << 10, ..LoadOptions::default() }
}

/// A checkpoint and its index served by nginx, and an empty cache.
struct Served {
    _root: tempfile::TempDir,
    dir: std::path::PathBuf,
    nginx: Nginx,
    cache: tempfile::TempDir,
    location: Location,
}

/// Two shards of three 192 KiB tensors.
fn served() -> Served {
    served_checkpoint(2, 3, 192 << 10)
}

/// `shards` shards of `tensors_per_shard` tensors of `tensor_bytes`, served by nginx, and an
/// empty cache.
fn served_checkpoint(shards: usize, tensors_per_shard: usize, tensor_bytes: u64) -> Served {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("ckpt");
    std::fs::create_dir(&dir).unwrap();
    write_checkpoint(&dir, shards, tensors_per_shard, tensor_bytes);
    let nginx = started(Nginx::start(root.path(), "50m"));
    let location = Location::parse(&nginx.url("ckpt/")).unwrap();
    Served { _root: root, dir, nginx, cache: tempfile::tempdir().unwrap(), location }
}

#[test]
fn a_cached_load_is_local_after_one_head_per_object_and_offline_after_none() {
    let Served { _root, dir, mut nginx, cache, location } = served();
    let total: u64 = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().metadata().unwrap().len()).sum();

    // Cold: every byte fetched once and written through in the same pass; index and shards
    // promoted.
    let first = open_remote(&location, &opts(cache.path(), false, None)).unwrap();
    let mut loaded = first.load(&LoadOptions::default()).unwrap();
    assert_matches_local(&loaded, &dir);
    // The tensors are there when the load returns; the copies are finished behind it.
    let behind = loaded.report().cache.clone().expect("a cache report");
    assert_eq!(behind.promoted + behind.promoting, 2, "{behind:?}");
    // An owned load lands each range as it arrives: its pieces are written behind it, so it
    // waited for no disk.
    assert_eq!(behind.disk_tail_seconds, 0.0, "{behind:?}");
    let report = loaded.wait_cache().cache.clone().expect("a cache report");
    assert_eq!((report.promoted, report.promoting), (2, 0), "{report:?}");
    // Every byte the load read, written from where it landed: every tensor byte, on whole 4 KiB
    // blocks (so the last block of each header again; headers and index were written by the
    // open).
    let read_bytes = loaded.report().load.bytes_read;
    assert_eq!(report.written_bytes, read_bytes, "{report:?}");
    assert!((2 * 3 * (192 << 10)..2 * 3 * (192 << 10) + 2 * 4096).contains(&read_bytes), "{read_bytes}");
    assert!(report.skipped.is_empty(), "{report:?}");
    let open_report = first.open_cache_report().unwrap();
    assert_eq!(open_report.promoted, 1, "the index, fetched whole at open: {open_report:?}");
    let listed = handle(cache.path()).list();
    assert_eq!(listed.len(), 3);
    assert!(listed.iter().all(|o| o.complete && o.cached_bytes == o.size_bytes), "{listed:?}");
    assert_eq!(listed.iter().map(|o| o.size_bytes).sum::<u64>(), total);

    // Warm: one HEAD per object confirms it, then the load reads local files (no request).
    let second = open_remote(&location, &opts(cache.path(), false, None)).unwrap();
    assert_eq!(second.open_requests(), 3);
    let loaded = second.load(&LoadOptions::default()).unwrap();
    assert_matches_local(&loaded, &dir);
    let r = loaded.report();
    assert_eq!(r.requests, 0, "{r:?}");
    assert_eq!(r.cache.as_ref().map(|c| c.disk_tail_seconds), Some(0.0), "local files: {r:?}");
    assert_eq!(r.cache.as_ref().unwrap().local_objects, 2, "{r:?}");
    let streamed = second.load_streaming(&LoadOptions::default(), |_| Ok(())).unwrap();
    assert_eq!(streamed.requests, 0);

    // Offline, with the server gone: no request at all.
    nginx.kill();
    let offline = open_remote(&location, &opts(cache.path(), true, None)).unwrap();
    assert_eq!(offline.open_requests(), 0);
    let loaded = offline.load(&LoadOptions::default()).unwrap();
    assert_matches_local(&loaded, &dir);
    // A location never cached is refused offline, naming it.
    let other = Location::parse(&nginx.url("other/")).unwrap();
    let err = open_remote(&other, &opts(cache.path(), true, None)).unwrap_err();
    assert!(matches!(err, tensora_remote::RemoteError::NotCached { .. }), "{err}");
}

/// The cache is each open's own, not its client's: opens of one URL in one process with one
/// cache directory, another, and none share a client (the cache is left out of what makes two
/// clients interchangeable), and each writes its copies where it was told, or nowhere.
#[test]
fn opens_with_other_caches_in_one_process_each_write_their_own() {
    let Served { _root, dir, nginx: _nginx, cache, location } = served();
    let other = tempfile::tempdir().unwrap();
    for (k, target) in [cache.path(), other.path()].into_iter().enumerate() {
        let mut loaded = open_remote(&location, &opts(target, false, None))
            .unwrap()
            .load(&LoadOptions::default())
            .unwrap();
        assert_matches_local(&loaded, &dir);
        let report = loaded.wait_cache().cache.clone().expect("a cache report");
        assert_eq!(
            (report.dir.as_str(), report.promoted),
            (target.to_str().unwrap(), 2),
            "open {k}: {report:?}"
        );
        let listed = handle(target).list();
        assert_eq!(listed.len(), 3, "open {k}: {listed:?}");
        assert!(listed.iter().all(|o| o.complete), "open {k}: {listed:?}");
    }
    // The first cache again: every object complete there, read from local files.
    let again = open_remote(&location, &opts(cache.path(), false, None))
        .unwrap()
        .load(&LoadOptions::default())
        .unwrap();
    assert_eq!(again.report().requests, 0, "{:?}", again.report());
    assert_eq!(again.report().cache.as_ref().map(|c| c.local_objects), Some(2));
    // Without a cache, the same other options: fetched, and no cache reported.
    let plain = RemoteOptions { cache: None, ..opts(cache.path(), false, None) };
    let loaded = open_remote(&location, &plain).unwrap().load(&LoadOptions::default()).unwrap();
    assert_matches_local(&loaded, &dir);
    assert!(loaded.report().cache.is_none(), "{:?}", loaded.report());
    assert!(loaded.report().requests > 0, "{:?}", loaded.report());
    // And offline with the second cache: no request, although the shared client is online.
    let offline = open_remote(&location, &opts(other.path(), true, None)).unwrap();
    assert_eq!(offline.open_requests(), 0);
    assert_eq!(offline.load(&LoadOptions::default()).unwrap().report().requests, 0);
}

#[test]
fn a_changed_object_is_fetched_anew_and_a_partial_load_stays_partial() {
    let Served { _root, dir, nginx: _nginx, cache, location } = served();
    let checkpoint = open_remote(&location, &opts(cache.path(), false, None)).unwrap();
    // One tensor: its ranges are cached, its object is not complete.
    let name = checkpoint.tensors()[0].name().to_owned();
    let one = LoadOptions { selection: Selection::Names(vec![name.clone()]), ..LoadOptions::default() };
    let mut loaded = checkpoint.load(&one).unwrap();
    let report = loaded.wait_cache().cache.clone().unwrap();
    assert_eq!((report.promoted, report.promoting), (0, 0), "{report:?}");
    assert!(report.written_bytes >= 192 << 10, "{report:?}");
    // The same tensor again: read from the partial copy, no request.
    let again = checkpoint.load(&one).unwrap();
    assert_eq!(again.report().requests, 0, "{:?}", again.report());
    assert_eq!(
        Sha256::digest(again.tensor(&name).unwrap().bytes()),
        Sha256::digest(loaded.tensor(&name).unwrap().bytes())
    );

    // The second shard changes (new bytes, new mtime: a new ETag): its new version is fetched,
    // the first shard's copy is used.
    let full = checkpoint.load(&LoadOptions::default()).unwrap();
    assert_matches_local(&full, &dir);
    let shard = dir.join("model-00002-of-00002.safetensors");
    let mut bytes = std::fs::read(&shard).unwrap();
    let n = bytes.len();
    bytes[n - 1] ^= 0xFF;
    std::fs::write(&shard, &bytes).unwrap();
    let later = std::time::SystemTime::now() + std::time::Duration::from_secs(100);
    std::fs::File::options().write(true).open(&shard).unwrap().set_modified(later).unwrap();
    let reopened = open_remote(&location, &opts(cache.path(), false, None)).unwrap();
    let mut loaded = reopened.load(&LoadOptions::default()).unwrap();
    assert_matches_local(&loaded, &dir);
    let r = loaded.wait_cache().cache.clone().unwrap();
    assert!(r.hit_bytes > 0 && r.written_bytes > 0, "{r:?}");
}

#[test]
fn the_size_cap_evicts_what_nobody_holds_and_cached_bytes_are_checked() {
    let Served { _root, dir, nginx: _nginx, cache, location } = served();
    let checkpoint = open_remote(&location, &opts(cache.path(), false, None)).unwrap();
    assert_matches_local(&checkpoint.load(&LoadOptions::default()).unwrap(), &dir);
    let cache_opts = CacheOptions {
        dir: cache.path().to_path_buf(),
        size_max_bytes: None,
        offline: false,
        writes: tensora_remote::CacheWrites::default(),
    };
    let handle = Cache::open(&cache_opts).unwrap();
    assert!(handle.verify().iter().all(|v| !v.is_damaged()));
    // A flipped byte in a cached copy fails its range's CRC.
    let victim = handle.list().into_iter().max_by_key(|o| o.size_bytes).unwrap();
    let data = cache.path().join("objects").join(&victim.key).join("data");
    let mut bytes = std::fs::read(&data).unwrap();
    bytes[100_000] ^= 1;
    std::fs::write(&data, &bytes).unwrap();
    let bad: Vec<_> = handle.verify().into_iter().filter(|v| v.is_damaged()).collect();
    assert_eq!(bad.len(), 1);
    assert_eq!(bad[0].object.key, victim.key);

    // A cap below one shard: after the next load nothing held remains, and the cache is under it.
    let capped = open_remote(&location, &opts(cache.path(), false, Some(300 << 10))).unwrap();
    let mut loaded = capped.load(&LoadOptions::default()).unwrap();
    let report = loaded.wait_cache().cache.clone().unwrap();
    assert!(report.evicted >= 2, "{report:?}");
    let left: u64 = Cache::open(&cache_opts).unwrap().list().iter().map(|o| o.cached_bytes).sum();
    assert!(left <= 300 << 10, "{left} bytes left");
}

/// The range log of the cached object whose URL ends with `name`: (offset, length) of each
/// record (24 bytes each: offset, length, CRC-32C, little-endian).
fn recorded_ranges(cache: &Path, name: &str) -> Vec<(u64, u64)> {
    let object = handle(cache).list().into_iter().find(|o| o.url.ends_with(name)).unwrap();
    let dir = if object.complete { "objects" } else { "partial" };
    let log = std::fs::read(cache.join(dir).join(&object.key).join("ranges")).unwrap();
    let word = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap());
    log.chunks_exact(24).map(|r| (word(&r[..8]), word(&r[8..16]))).collect()
}

#[test]
fn a_range_longer_than_a_piece_is_written_and_recorded_piece_by_piece() {
    // One shard of two 1.5 MiB tensors, fetched in one 4 MiB range (a fixed depth keeps the
    // chunk: `range_bytes`).
    let Served { _root, dir, nginx: _nginx, cache, location } = served_checkpoint(1, 2, 3 << 19);
    let options =
        RemoteOptions { chunk_bytes: 4 << 20, tuning: Tuning::Fixed, ..opts(cache.path(), false, None) };
    let checkpoint = open_remote(&location, &options).unwrap();
    let mut loaded = checkpoint.load(&LoadOptions::default()).unwrap();
    assert_matches_local(&loaded, &dir);
    assert_eq!(loaded.report().requests, 1, "one range: {:?}", loaded.report());
    let report = loaded.wait_cache().cache.clone().unwrap();
    assert_eq!(report.written_bytes, loaded.report().load.bytes_read, "{report:?}");
    // The range went to the disk in whole pieces (the last one shorter), each recorded.
    let name = "model-00001-of-00001.safetensors";
    // Written behind the load by several threads: recorded in the order they were done.
    let mut load_records: Vec<_> =
        recorded_ranges(cache.path(), name).into_iter().filter(|&(_, len)| len > 64 << 10).collect();
    load_records.sort_unstable();
    assert!(load_records.len() >= 3, "{load_records:?}");
    assert!(
        load_records.iter().all(|&(_, len)| len <= tensora_remote::PIECE_BYTES as u64),
        "{load_records:?}"
    );
    assert!(load_records.windows(2).all(|w| w[0].0 + w[0].1 == w[1].0), "contiguous: {load_records:?}");
    let handle = handle(cache.path());
    assert!(handle.verify().iter().all(|v| !v.is_damaged()));
    let copy = handle.list().into_iter().find(|o| o.url.ends_with(name)).unwrap();
    assert!(copy.complete, "{copy:?}");
    let data = std::fs::read(cache.path().join("objects").join(&copy.key).join("data")).unwrap();
    assert!(data == std::fs::read(dir.join(name)).unwrap());
}

#[test]
fn written_before_landing_every_range_is_on_disk_when_the_load_returns() {
    let Served { _root, dir, nginx: _nginx, cache, location } = served();
    let mut options = opts(cache.path(), false, None);
    if let Some(c) = options.cache.as_mut() {
        c.writes = CacheWrites::BeforeLanding;
    }
    let mut loaded = open_remote(&location, &options).unwrap().load(&LoadOptions::default()).unwrap();
    assert_matches_local(&loaded, &dir);
    let r = loaded.report().cache.clone().unwrap();
    assert_eq!(r.written_bytes, loaded.report().load.bytes_read, "{r:?}");
    assert!(r.disk_tail_seconds > 0.0, "the load waited for its last pieces: {r:?}");
    let r = loaded.wait_cache().cache.clone().unwrap();
    assert_eq!((r.promoted, r.changed_bytes), (2, 0), "{r:?}");
}

#[test]
fn a_model_rewritten_as_soon_as_it_is_loaded_leaves_its_copies_as_they_arrived() {
    // Two shards of three 1.5 MiB tensors: 9 MiB of pieces written behind the load.
    let Served { _root, dir, nginx: _nginx, cache, location } = served_checkpoint(2, 3, 3 << 19);
    let options = RemoteOptions { chunk_bytes: 1 << 20, ..opts(cache.path(), false, None) };
    let mut loaded = open_remote(&location, &options).unwrap().load(&LoadOptions::default()).unwrap();
    let read_bytes = loaded.report().load.bytes_read;
    // What an inference engine does to weights it owns: rewrite them in place, at once.
    let names: Vec<String> = loaded.tensors().map(|t| t.name().to_owned()).collect();
    for name in &names {
        let (ptr, len) = loaded.loaded().tensor_mut_ptr(name).unwrap();
        // SAFETY: no slice of the tensor is alive while it is written; this test is its only user.
        unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0xEE, len) };
    }
    let report = loaded.wait_cache().cache.clone().unwrap();
    // Every piece is either recorded as it arrived or left out as changed, and only a piece
    // sealed before it was written (by `loaded()`, the way to the writable pointers) can be.
    assert_eq!(report.written_bytes + report.changed_bytes, read_bytes, "{report:?}");
    assert!(report.changed_bytes <= report.sealed_bytes, "{report:?}");
    assert!(loaded.tensors().all(|t| t.bytes().iter().all(|&b| b == 0xEE)));
    let handle = handle(cache.path());
    assert!(handle.verify().iter().all(|v| !v.is_damaged()));
    // The next loads get the server's bytes: what the cache kept, and the rest fetched again
    // (and cached, this time unchanged).
    for _ in 0..2 {
        let mut again = open_remote(&location, &options).unwrap().load(&LoadOptions::default()).unwrap();
        assert_matches_local(&again, &dir);
        let r = again.wait_cache().cache.clone().unwrap();
        assert_eq!(r.changed_bytes, 0, "{r:?}");
    }
    assert!(handle.list().iter().all(|o| o.complete), "{:?}", handle.list());
}

#[test]
fn pieces_sealed_before_they_are_written_are_recorded_when_unchanged() {
    // Sealed right after the load returns, unchanged: each sealed piece's CRC, taken from the
    // load's memory at the piece's arena offset, must equal what the disk holds once written.
    // Which pieces are still unwritten then depends on the writers, so up to
    // SEAL_ATTEMPTS_MAX fresh caches are tried until one seals some.
    const SEAL_ATTEMPTS_MAX: usize = 5;
    let Served { _root, dir, nginx: _nginx, cache: _unused, location } = served_checkpoint(2, 3, 3 << 19);
    let mut sealed_any = false;
    for _ in 0..SEAL_ATTEMPTS_MAX {
        let cache = tempfile::tempdir().unwrap();
        let options = RemoteOptions { chunk_bytes: 1 << 20, ..opts(cache.path(), false, None) };
        let mut loaded = open_remote(&location, &options).unwrap().load(&LoadOptions::default()).unwrap();
        let read_bytes = loaded.report().load.bytes_read;
        let _ = loaded.loaded();
        let r = loaded.wait_cache().cache.clone().unwrap();
        assert_eq!((r.written_bytes, r.changed_bytes, r.promoted), (read_bytes, 0, 2), "{r:?}");
        assert!(r.sealed_bytes <= read_bytes, "{r:?}");
        assert!(handle(cache.path()).verify().iter().all(|v| !v.is_damaged()));
        let offline = opts(cache.path(), true, None);
        let again = open_remote(&location, &offline).unwrap().load(&LoadOptions::default()).unwrap();
        assert_matches_local(&again, &dir);
        sealed_any |= r.sealed_bytes > 0;
        if sealed_any {
            break;
        }
    }
    assert!(sealed_any, "no attempt sealed a piece before it was written");
}

#[test]
fn a_load_nobody_writes_to_seals_nothing() {
    let Served { _root, dir, nginx: _nginx, cache, location } = served_checkpoint(2, 3, 3 << 19);
    let options = RemoteOptions { chunk_bytes: 1 << 20, ..opts(cache.path(), false, None) };
    let mut loaded = open_remote(&location, &options).unwrap().load(&LoadOptions::default()).unwrap();
    assert_matches_local(&loaded, &dir);
    let read_bytes = loaded.report().load.bytes_read;
    let r = loaded.wait_cache().cache.clone().unwrap();
    assert_eq!((r.written_bytes, r.changed_bytes, r.sealed_bytes), (read_bytes, 0, 0), "{r:?}");
}

#[test]
fn a_streamed_load_writes_multi_piece_ranges_before_their_window_is_reused() {
    // Two shards of two 1.5 MiB tensors: two 4 MiB ranges, each in a window of its own.
    let Served { _root, dir, nginx: _nginx, cache, location } = served_checkpoint(2, 2, 3 << 19);
    let options = RemoteOptions { chunk_bytes: 4 << 20, ..opts(cache.path(), false, None) };
    let checkpoint = open_remote(&location, &options).unwrap();
    let local = tensora_io::load_path(&dir, &LoadOptions::default()).unwrap();
    let mut seen = 0;
    let one_window = LoadOptions { budget_bytes: 5 << 20, ..LoadOptions::default() };
    let report = checkpoint
        .load_streaming(&one_window, |t| {
            let want = local.tensor(t.name()).ok_or("not a local tensor")?;
            if Sha256::digest(t.bytes()) != Sha256::digest(want.bytes()) {
                return Err(format!("{} differs", t.name()).into());
            }
            seen += 1;
            Ok(())
        })
        .unwrap();
    assert_eq!(seen, 4);
    assert!(report.load.windows > 1, "{report:?}");
    let handle = handle(cache.path());
    assert!(handle.verify().iter().all(|v| !v.is_damaged()));
    for name in ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"] {
        let pieces =
            recorded_ranges(cache.path(), name).into_iter().filter(|&(_, len)| len > 64 << 10).count();
        assert!(pieces >= 3, "{name}: {pieces} pieces");
        let copy = handle.list().into_iter().find(|o| o.url.ends_with(name)).unwrap();
        let data = cache.path().join("objects").join(&copy.key).join("data");
        assert!(copy.complete && std::fs::read(data).unwrap() == std::fs::read(dir.join(name)).unwrap());
    }
}

#[test]
fn a_dropped_load_leaves_its_copies_complete() {
    let Served { _root, dir, nginx: _nginx, cache, location } = served();
    let checkpoint = open_remote(&location, &opts(cache.path(), false, None)).unwrap();
    let loaded = checkpoint.load(&LoadOptions::default()).unwrap();
    assert_matches_local(&loaded, &dir);
    // Dropping the result waits for the write-behind: nothing is left partial or locked.
    drop(loaded);
    let handle = handle(cache.path());
    let listed = handle.list();
    assert_eq!(listed.len(), 3, "{listed:?}");
    assert!(listed.iter().all(|o| o.complete && o.cached_bytes == o.size_bytes), "{listed:?}");
    assert!(std::fs::read_dir(cache.path().join("partial")).unwrap().next().is_none());
    // And the copies hold the objects' bytes (CRC of every range).
    assert!(handle.verify().iter().all(|v| !v.is_damaged()));
}

#[test]
fn a_streamed_load_writes_its_copies_from_a_recycled_window() {
    let Served { _root, dir, nginx: _nginx, cache, location } = served();
    let checkpoint = open_remote(&location, &opts(cache.path(), false, None)).unwrap();
    // Each range is written before it lands, so before its window is reused.
    let mut seen = std::collections::BTreeMap::new();
    let report = checkpoint
        .load_streaming(&two_ranges(), |t| {
            seen.insert(t.name().to_owned(), Sha256::digest(t.bytes()).to_vec());
            Ok(())
        })
        .unwrap();
    let written = report.cache.as_ref().map(|c| (c.written_bytes, c.hit_bytes, c.promoted));
    assert!(report.load.windows > 1, "{report:?}");
    assert_eq!(written, Some((report.load.bytes_read, 0, 2)), "{report:?}");
    let local = tensora_io::load_path(&dir, &LoadOptions::default()).unwrap();
    assert_eq!(seen.len(), local.len());
    for t in local.tensors() {
        assert_eq!(seen[t.name()], Sha256::digest(t.bytes()).to_vec(), "{}", t.name());
    }
    // Every copy complete, its ranges' CRCs right, and its bytes the served file's.
    let handle = handle(cache.path());
    let listed = handle.list();
    assert!(listed.len() == 3 && listed.iter().all(|o| o.complete), "{listed:?}");
    assert!(handle.verify().iter().all(|v| !v.is_damaged()));
    for name in ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"] {
        let want = std::fs::read(dir.join(name)).unwrap();
        let copy = listed.iter().find(|o| o.url.ends_with(name)).unwrap();
        let data = cache.path().join("objects").join(&copy.key).join("data");
        assert!(std::fs::read(data).unwrap() == want, "{name}");
    }
}

#[test]
fn a_consumer_that_stops_a_streamed_load_stops_it_while_the_lane_writes() {
    let Served { _root, dir: _, nginx: _nginx, cache, location } = served();
    let checkpoint = open_remote(&location, &opts(cache.path(), false, None)).unwrap();
    let mut handed = 0;
    let err = checkpoint
        .load_streaming(&two_ranges(), |_| {
            handed += 1;
            if handed == 2 { Err("enough".into()) } else { Ok(()) }
        })
        .unwrap_err();
    assert!(err.to_string().contains("enough"), "{err}");
    assert_eq!(handed, 2);
    // The stop came before the last shard was fetched: its copy stays partial (no rename), and
    // every range written is right.
    let handle = handle(cache.path());
    assert!(handle.verify().iter().all(|v| !v.is_damaged()));
    let shards: Vec<_> = handle.list().into_iter().filter(|o| o.url.ends_with(".safetensors")).collect();
    assert!(shards.iter().any(|o| !o.complete && o.cached_bytes < o.size_bytes), "{shards:?}");
}
