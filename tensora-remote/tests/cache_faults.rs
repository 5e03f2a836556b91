//! Issue 39: the cache under faults, against a real nginx on 127.0.0.1 and real cache files. Each
//! fault (a torn log record, a flipped or cut data file, a full disk, a FIFO or symlink in place of
//! a cache file, a process killed at each stage of a promotion) either has its ranges fetched
//! again or fails with a typed error offline; no load ever serves bytes other than the object's.

mod support;

use std::io::Write as _;
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use support::{Nginx, write_checkpoint};
use tensora_format::Selection;
use tensora_io::LoadOptions;
use tensora_remote::{Cache, CacheOptions, CacheWrites, Location, RemoteError, RemoteOptions, open_remote};

const SHARD: &str = "model-00001-of-00001.safetensors";

fn started<T>(server: Result<T, String>) -> T {
    server.unwrap_or_else(|e| panic!("test server unavailable: {e}"))
}

fn cache_options(cache: &Path, offline: bool) -> CacheOptions {
    CacheOptions { dir: cache.to_path_buf(), size_max_bytes: None, offline, writes: CacheWrites::default() }
}

fn opts(cache: &Path, offline: bool) -> RemoteOptions {
    RemoteOptions {
        chunk_bytes: 256 << 10,
        reads_inflight_max: 4,
        cache: Some(cache_options(cache, offline)),
        ..RemoteOptions::default()
    }
}

/// One shard of three 192 KiB tensors (`layers.{0,1,2}.weight`), served by nginx, and an
/// empty cache directory.
struct Served {
    _root: tempfile::TempDir,
    dir: PathBuf,
    _nginx: Nginx,
    cache: tempfile::TempDir,
    location: Location,
}

fn served() -> Served {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("ckpt");
    std::fs::create_dir(&dir).unwrap();
    write_checkpoint(&dir, 1, 3, 192 << 10);
    let nginx = started(Nginx::start(root.path(), "50m"));
    let location = Location::parse(&nginx.url("ckpt/")).unwrap();
    Served { _root: root, dir, _nginx: nginx, cache: tempfile::tempdir().unwrap(), location }
}

fn only(name: &str) -> LoadOptions {
    LoadOptions { selection: Selection::Names(vec![name.to_owned()]), ..LoadOptions::default() }
}

/// Load `load` through the cache (its copies finished), checking every tensor against the local
/// file's; the load's requests.
fn load_checked(s: &Served, load: &LoadOptions) -> u64 {
    let checkpoint = open_remote(&s.location, &opts(s.cache.path(), false)).unwrap();
    let mut loaded = checkpoint.load(load).unwrap();
    loaded.wait_cache();
    let local = tensora_io::load_path(&s.dir, &LoadOptions::default()).unwrap();
    assert!(!loaded.is_empty());
    for t in loaded.tensors() {
        let want = local.tensor(t.name()).unwrap();
        assert_eq!(Sha256::digest(t.bytes()), Sha256::digest(want.bytes()), "{} differs", t.name());
    }
    loaded.report().requests
}

/// The directory of the shard's copy (complete or partial).
fn shard_copy(cache: &Path) -> PathBuf {
    let object = Cache::open(&cache_options(cache, true))
        .unwrap()
        .list()
        .into_iter()
        .find(|o| o.url.ends_with(SHARD))
        .expect("the shard is cached");
    cache.join(if object.complete { "objects" } else { "partial" }).join(object.key)
}

/// Flip one byte of `path` at `offset_bytes`.
fn flip(path: &Path, offset_bytes: u64) {
    let file = std::fs::File::options().read(true).write(true).open(path).unwrap();
    let mut b = [0u8];
    file.read_exact_at(&mut b, offset_bytes).unwrap();
    file.write_all_at(&[b[0] ^ 0x5A], offset_bytes).unwrap();
}

/// Finding 1 (issue 39), as a user met it: load tensor `a` with the cache, tear the shard's range
/// log 16 bytes into a record (what a full disk leaves: the record's offset and length, here those
/// of tensor `c`, never fetched), load `b`, then load everything: every tensor is the object's
/// (it was: `c` all zeros, with no request: `b`'s records, read out of step, completed the torn
/// one).
#[test]
fn finding_1_a_torn_log_tail_then_more_loads_serves_no_zeros() {
    let s = served();
    load_checked(&s, &only("layers.0.weight"));
    let log = shard_copy(s.cache.path()).join("ranges");
    let shard_bytes = std::fs::metadata(s.dir.join(SHARD)).unwrap().len();
    let c_bytes: u64 = 192 << 10;
    let mut torn = (shard_bytes - c_bytes).to_le_bytes().to_vec();
    torn.extend_from_slice(&c_bytes.to_le_bytes());
    std::fs::File::options().append(true).open(&log).unwrap().write_all(&torn).unwrap();
    load_checked(&s, &only("layers.1.weight"));
    load_checked(&s, &LoadOptions::default());
}

/// Finding 1 (issue 39): a byte flipped in a complete cached copy is fetched again with the
/// cache, and refused (a typed error) offline; it was served by both, with exit 0.
#[test]
fn finding_1_a_flipped_byte_in_a_cached_copy_is_fetched_again_or_refused_offline() {
    let s = served();
    load_checked(&s, &LoadOptions::default());
    let data = shard_copy(s.cache.path()).join("data");
    // Inside `layers.2.weight`, the last tensor.
    let len = std::fs::metadata(&data).unwrap().len();
    flip(&data, len - 1000);
    let offline = open_remote(&s.location, &opts(s.cache.path(), true)).unwrap();
    let err = offline.load(&LoadOptions::default()).expect_err("offline, a damaged copy is not served");
    assert!(err.to_string().contains("not in the cache"), "{err}");
    assert!(load_checked(&s, &LoadOptions::default()) > 0, "fetched again");
    flip(&shard_copy(s.cache.path()).join("data"), len - 1000);
    assert!(load_checked(&s, &LoadOptions::default()) > 0, "fetched again");
    assert_eq!(load_checked(&s, &LoadOptions::default()), 0, "then served from the repaired copy");
}

/// The load of `load` through the cache, on a thread: a load that hung (on a FIFO, say) fails
/// the test after [`HANG_BOUND`] instead of hanging it. Every tensor checked; the requests.
fn load_bounded(s: &Served, load: LoadOptions) -> u64 {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| load_checked(s, &load)));
            let _ = tx.send(result);
        });
        match rx.recv_timeout(HANG_BOUND) {
            Ok(Ok(requests)) => requests,
            Ok(Err(panic)) => std::panic::resume_unwind(panic),
            Err(_) => panic!("the load hung"),
        }
    })
}

/// Longer than any load of the tests' checkpoint takes.
const HANG_BOUND: std::time::Duration = std::time::Duration::from_secs(120);

/// The fault matrix: a byte flipped in a partial copy, inside a range a later load reads, is
/// found by that read (the record is dropped and counted, the range fetched again).
#[test]
fn a_flipped_byte_in_a_partial_copy_is_fetched_again() {
    let s = served();
    load_checked(&s, &only("layers.0.weight"));
    let data = shard_copy(s.cache.path()).join("data");
    let shard = tensora_format::open(s.dir.join(SHARD)).unwrap();
    let a = shard.tensors().iter().find(|t| t.name() == "layers.0.weight").unwrap().offset_bytes();
    flip(&data, a + 1000);
    let checkpoint = open_remote(&s.location, &opts(s.cache.path(), false)).unwrap();
    let mut loaded = checkpoint.load(&only("layers.0.weight")).unwrap();
    let report = loaded.wait_cache().cache.clone().unwrap();
    assert!(report.damaged_records >= 1 && report.damaged_bytes > 0, "{report:?}");
    assert!(loaded.report().requests > 0, "fetched again");
    let local = tensora_io::load_path(&s.dir, &LoadOptions::default()).unwrap();
    let want = local.tensor("layers.0.weight").unwrap();
    assert!(loaded.tensor("layers.0.weight").unwrap().bytes() == want.bytes());
    drop(loaded);
    load_checked(&s, &LoadOptions::default());
    assert_eq!(load_checked(&s, &LoadOptions::default()), 0, "complete, checked whole and served");
}

/// The fault matrix: a complete copy cut short is fetched again whole, or refused offline.
#[test]
fn a_truncated_data_file_is_fetched_again_or_refused_offline() {
    let s = served();
    load_checked(&s, &LoadOptions::default());
    let data = shard_copy(s.cache.path()).join("data");
    let len = std::fs::metadata(&data).unwrap().len();
    std::fs::File::options().write(true).open(&data).unwrap().set_len(len / 2).unwrap();
    // Offline, the open already finds the header's range missing.
    let offline =
        open_remote(&s.location, &opts(s.cache.path(), true)).and_then(|c| c.load(&LoadOptions::default()));
    let err = offline.expect_err("a cut copy is not served offline");
    assert!(matches!(err, RemoteError::NotCached { .. }), "{err}");
    assert!(load_bounded(&s, LoadOptions::default()) > 0);
    assert_eq!(load_bounded(&s, LoadOptions::default()), 0);
}

/// Replace `path` with `what` (a FIFO, or a symlink to `victim`).
fn plant(path: &Path, what: Planted, victim: &Path) {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => panic!("{}: {e}", path.display()),
    }
    match what {
        Planted::Fifo => {
            assert!(std::process::Command::new("mkfifo").arg(path).status().unwrap().success());
        }
        Planted::Symlink => std::os::unix::fs::symlink(victim, path).unwrap(),
    }
}

#[derive(Debug, Clone, Copy)]
enum Planted {
    Fifo,
    Symlink,
}

/// The fault matrix, finding 3 (issue 39): a FIFO or a symlink planted in place of each file of a
/// complete and of a partial copy (and of the object's lock file and the location record) never
/// hangs a load, is never followed (the victim it points to is left as it was), and every tensor
/// loaded is the object's.
#[test]
fn a_fifo_or_symlink_in_place_of_each_cache_file_is_refused() {
    let s = served();
    let victim_dir = tempfile::tempdir().unwrap();
    let victim = victim_dir.path().join("victim");
    let precious = vec![0x42u8; 700 << 10];
    for what in [Planted::Fifo, Planted::Symlink] {
        for name in ["data", "ranges", "object.json", "verified"] {
            for partial in [false, true] {
                std::fs::write(&victim, &precious).unwrap();
                std::fs::remove_dir_all(s.cache.path()).unwrap();
                load_checked(&s, &if partial { only("layers.0.weight") } else { LoadOptions::default() });
                plant(&shard_copy(s.cache.path()).join(name), what, &victim);
                load_bounded(&s, LoadOptions::default());
                load_bounded(&s, LoadOptions::default());
                assert!(std::fs::read(&victim).unwrap() == precious, "{what:?} {name} partial {partial}");
            }
        }
        // The lock file and the location record.
        std::fs::remove_dir_all(s.cache.path()).unwrap();
        load_checked(&s, &LoadOptions::default());
        let key = shard_copy(s.cache.path()).file_name().unwrap().to_owned();
        plant(&s.cache.path().join("locks").join(&key), what, &victim);
        for record in std::fs::read_dir(s.cache.path().join("locations")).unwrap() {
            plant(&record.unwrap().path(), what, &victim);
        }
        load_bounded(&s, LoadOptions::default());
        assert!(std::fs::read(&victim).unwrap() == precious, "{what:?}");
    }
}

/// The fault matrix, finding 3: the folders are private, and a cache directory open to others
/// is refused with why.
#[test]
fn the_cache_is_private_and_an_open_directory_is_refused() {
    use std::os::unix::fs::PermissionsExt as _;
    let s = served();
    load_checked(&s, &LoadOptions::default());
    for sub in ["objects", "partial", "locks", "locations"] {
        let mode = std::fs::metadata(s.cache.path().join(sub)).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700, "{sub}");
    }
    let data = shard_copy(s.cache.path()).join("data");
    assert_eq!(std::fs::metadata(&data).unwrap().permissions().mode() & 0o777, 0o600);
    std::fs::set_permissions(s.cache.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let err = open_remote(&s.location, &opts(s.cache.path(), false)).expect_err("refused");
    assert!(err.to_string().contains("writable by other users"), "{err}");
}

/// The fault matrix: the cache on a disk too small for the shard's copy (a tmpfs, which the
/// cache does not preallocate: the writes themselves fail with `ENOSPC`, data and log). Every
/// load is right; what was written verifies.
#[test]
fn a_full_disk_under_the_cache_never_serves_wrong_bytes() {
    let Some(fs) = tensora_testkit::small_tmpfs_or_skip(320 << 10, "a_full_disk_under_the_cache") else {
        return;
    };
    let s = Served { cache: tempfile::TempDir::new_in(fs.path()).unwrap(), ..served() };
    for _ in 0..3 {
        load_bounded(&s, LoadOptions::default());
    }
    let handle = Cache::open(&cache_options(s.cache.path(), true)).unwrap();
    assert!(handle.verify().iter().all(|v| !v.is_damaged()));
}

/// What a `kill -9` leaves at each stage of a promotion (`Entry::promote`: data `fsync`ed, copy
/// checked whole, log `fsync`ed, marker written by rename, directory renamed): the copy complete
/// in `partial/` without a marker, with a marker cut short at its temporary name, with its marker,
/// and renamed to `objects/`.
#[derive(Debug, Clone, Copy)]
enum KilledAt {
    BeforeMarker,
    InMarker,
    BeforeRename,
    AfterRename,
}

/// The fault matrix: a process killed at each stage of a promotion leaves a copy the next load
/// reads right (from the partial copy, checked as it reads, then promoted) and the one after
/// reads locally, with no request.
#[test]
fn a_kill_at_each_stage_of_a_promotion_leaves_a_copy_read_right() {
    let s = served();
    for stage in [KilledAt::BeforeMarker, KilledAt::InMarker, KilledAt::BeforeRename, KilledAt::AfterRename] {
        std::fs::remove_dir_all(s.cache.path()).unwrap();
        load_checked(&s, &LoadOptions::default());
        let complete = shard_copy(s.cache.path());
        let partial = s.cache.path().join("partial").join(complete.file_name().unwrap());
        let marker = complete.join("verified");
        assert!(marker.exists(), "promoted with its marker");
        match stage {
            KilledAt::BeforeMarker => std::fs::remove_file(&marker).unwrap(),
            KilledAt::InMarker => {
                std::fs::remove_file(&marker).unwrap();
                std::fs::write(complete.join("verified.tmp.1.0"), b"tnsr").unwrap();
            }
            KilledAt::BeforeRename | KilledAt::AfterRename => {}
        }
        if !matches!(stage, KilledAt::AfterRename) {
            std::fs::rename(&complete, &partial).unwrap();
        }
        load_bounded(&s, LoadOptions::default());
        assert_eq!(load_bounded(&s, LoadOptions::default()), 0, "{stage:?}: local after");
    }
}
