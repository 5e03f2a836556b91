//! End-to-end loads from real servers on 127.0.0.1: nginx (HTTP, `If-Match`, rate limit) and
//! s3rver (S3 API). A missing server binary fails the test with the line that installs it.

mod support;

use std::path::Path;
use std::time::Duration;

use sha2::{Digest, Sha256};
use support::{Nginx, S3rver, write_checkpoint};
use tensora_format::Selection;
use tensora_io::LoadOptions;
use tensora_remote::{
    Location, RemoteError, RemoteLoaded, RemoteOptions, RetryPolicy, load_remote, open_remote,
};

fn started<T>(server: Result<T, String>) -> T {
    server.unwrap_or_else(|e| panic!("test server unavailable: {e}"))
}

/// Small chunks and short timeouts so that the tests stay fast.
fn small_opts() -> RemoteOptions {
    RemoteOptions {
        chunk_bytes: 256 << 10,
        reads_inflight_max: 4,
        tuning: tensora_remote::Tuning::Fixed,
        request_overhead: Duration::from_secs(2),
        connect_timeout: Duration::from_secs(1),
        retry: RetryPolicy {
            retries_per_range_max: 50,
            retry_time_max: Duration::from_secs(8),
            backoff_initial: Duration::from_millis(50),
            backoff_max: Duration::from_millis(250),
        },
        ..RemoteOptions::default()
    }
}

/// A checkpoint of `shards` shards of `tensors` tensors of `tensor_bytes` in `ckpt/` under a fresh
/// root (the root a server serves): `(root, its ckpt/)`.
fn checkpoint_under_root(
    shards: usize,
    tensors: usize,
    tensor_bytes: u64,
) -> (tempfile::TempDir, std::path::PathBuf) {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("ckpt");
    std::fs::create_dir(&dir).unwrap();
    write_checkpoint(&dir, shards, tensors, tensor_bytes);
    (root, dir)
}

/// Every tensor of `remote` has the same bytes as a local load of `dir`.
fn assert_matches_local(remote: &RemoteLoaded, dir: &Path) {
    let local = tensora_io::load_path(dir, &tensora_io::LoadOptions::default()).expect("local load");
    assert_eq!(remote.len(), local.len());
    let mut seen = 0;
    for t in remote.tensors() {
        let want = local.tensor(t.name()).unwrap_or_else(|| panic!("{} missing locally", t.name()));
        assert_eq!(t.dtype(), want.dtype());
        assert_eq!(t.shape(), want.shape());
        assert_eq!(Sha256::digest(t.bytes()), Sha256::digest(want.bytes()), "{}", t.name());
        seen += 1;
    }
    assert_eq!(seen, local.len());
}

#[test]
fn http_sharded_checkpoint_matches_a_local_load() {
    let (root, dir) = checkpoint_under_root(3, 4, 192 << 10);
    let nginx = started(Nginx::start(root.path(), "50m"));
    let loaded = load_remote(&Location::parse(&nginx.url("ckpt/")).unwrap(), &small_opts()).unwrap();
    assert_matches_local(&loaded, &dir);
    let r = loaded.report();
    assert_eq!(r.load.files, 3);
    assert_eq!(r.load.retries, 0);
    assert_eq!(r.load.bytes_selected, 12 * (192 << 10));
    // Open: a tensor_index.json probe, the index's probe (a HEAD, whose answer its GET goes by)
    // and GET, 3 × (HEAD + one GET of the header length and header, `HEADER_FIRST_READ_BYTES`);
    // the load: 12 tensors of 192 KiB in 256 KiB reads. Each counted once, in its own field.
    assert_eq!(r.open_requests, 1 + 2 + 6 + r.open_retries, "{} open requests", r.open_requests);
    assert!((9..=12).contains(&r.requests), "{} requests", r.requests);
    assert!(r.load.peak_inflight_bytes <= r.inflight_bytes_max);
    let json = serde_json::to_value(r).unwrap();
    assert!(json["requests"].is_u64() && json["bytes_selected"].is_u64() && json["phases"]["io"].is_f64());

    // The index file itself is a location too, and so is one shard.
    let via_index = load_remote(
        &Location::parse(&nginx.url("ckpt/model.safetensors.index.json")).unwrap(),
        &small_opts(),
    )
    .unwrap();
    assert_matches_local(&via_index, &dir);
    let shard = load_remote(
        &Location::parse(&nginx.url("ckpt/model-00002-of-00003.safetensors")).unwrap(),
        &small_opts(),
    )
    .unwrap();
    assert_eq!(shard.len(), 4);
}

/// The ranges in flight share the link: four at 64 KB/s each are a healthy 256 KB/s link, so with
/// `rate_min_bytes_per_s` at 200 KB/s (50 KB/s per connection: 2 s + 10.5 s for a 512 KiB range)
/// no attempt times out, though each range takes about 7 s (nginx lets 1 s of bytes through at
/// once), longer than 200 KB/s per connection would allow (2 s + 2.6 s).
#[test]
fn ranges_in_flight_share_the_slowest_healthy_link() {
    let (root, dir) = checkpoint_under_root(1, 3, 400 << 10);
    let nginx = started(Nginx::start(root.path(), "64k"));
    let opts = RemoteOptions { chunk_bytes: 512 << 10, rate_min_bytes_per_s: 200_000, ..small_opts() };
    assert_eq!((opts.reads_inflight_max, opts.connection_rate_min_bytes_per_s()), (4, 50_000));
    let start = std::time::Instant::now();
    let loaded = load_remote(&Location::parse(&nginx.slow_url("ckpt/")).unwrap(), &opts).unwrap();
    // A lower bound on time, which a slow machine only makes longer: the link was that slow.
    assert!(start.elapsed() > Duration::from_secs_f64(2.0 + (512 << 10) as f64 / 200_000.0));
    assert_matches_local(&loaded, &dir);
    let r = loaded.report();
    assert_eq!((r.load.retries, r.open_retries), (0, 0));
    assert_eq!(r.requests, 3, "three ranges of at most 512 KiB, one request each");
}

#[test]
fn shares_of_an_http_checkpoint_rebuild_it_and_read_it_once() {
    let (root, dir) = checkpoint_under_root(3, 4, 160 << 10);
    let nginx = started(Nginx::start(root.path(), "50m"));
    let opened = open_remote(&Location::parse(&nginx.url("ckpt/")).unwrap(), &small_opts()).unwrap();
    let local = tensora_io::load_path(&dir, &LoadOptions::default()).unwrap();
    let world = 3;
    let mut shares = Vec::new();
    for rank in 0..world {
        let (share, report) = opened
            .load_share(&LoadOptions::default(), tensora_io::ShareOf::new(rank, world).unwrap())
            .unwrap();
        assert_eq!(report.load.bytes_read, share.report().bytes_read);
        assert!(report.requests >= 1, "rank {rank} sent {} requests", report.requests);
        shares.push(share);
    }
    // Every rank computes the same regions; they read the checkpoint once in all (block-aligned
    // reads clamped to each object's end: a few KiB more than the tensors at most).
    let read: u64 = shares.iter().map(|s| s.report().bytes_read).sum();
    let selected = local.report().bytes_selected;
    assert!(read >= selected && read <= selected + 3 * 2 * 4096, "{read} vs {selected}");
    for s in &shares {
        assert_eq!(s.regions(), shares[0].regions());
    }
    // A transport copies every other region into rank 0's arena.
    let (first, rest) = shares.split_at_mut(1);
    for (i, other) in rest.iter_mut().enumerate() {
        let bytes = other.region_mut(i + 1).to_vec();
        first[0].region_mut(i + 1).copy_from_slice(&bytes);
    }
    let whole = shares.swap_remove(0).finish();
    assert_eq!(whole.len(), local.len());
    for t in local.tensors() {
        assert_eq!(
            Sha256::digest(whole.tensor(t.name()).unwrap().bytes()),
            Sha256::digest(t.bytes()),
            "{}",
            t.name()
        );
    }
    // Window by window: every rank gets the same windows; put together they rebuild every tensor.
    let windowed = LoadOptions { budget_bytes: 512 << 10, ..LoadOptions::default() };
    let mut by_rank: Vec<Vec<tensora_io::ShareLoad>> = Vec::new();
    for rank in 0..2 {
        let mut windows = Vec::new();
        opened
            .load_share_runs(&windowed, tensora_io::ShareOf::new(rank, 2).unwrap(), |w| {
                windows.push(w);
                std::ops::ControlFlow::Continue(())
            })
            .unwrap();
        by_rank.push(windows);
    }
    assert!(by_rank[0].len() > 1 && by_rank[0].len() == by_rank[1].len(), "{} windows", by_rank[0].len());
    let mut rebuilt = 0;
    let (zero, one) = by_rank.split_at_mut(1);
    for (mut a, mut b) in zero[0].drain(..).zip(one[0].drain(..)) {
        assert_eq!(a.regions(), b.regions());
        let bytes = b.region_mut(1).to_vec();
        a.region_mut(1).copy_from_slice(&bytes);
        for t in a.finish().tensors() {
            assert_eq!(t.bytes(), local.tensor(t.name()).unwrap().bytes(), "{}", t.name());
            rebuilt += 1;
        }
    }
    assert_eq!(rebuilt, local.len());
    // Through a cache the ranks would wait on each other's locks: refused, naming why.
    let cache = tempfile::tempdir().unwrap();
    let cached_opts = RemoteOptions {
        cache: Some(tensora_remote::CacheOptions {
            dir: cache.path().to_owned(),
            size_max_bytes: None,
            offline: false,
            writes: tensora_remote::CacheWrites::default(),
        }),
        ..small_opts()
    };
    let cached = open_remote(&Location::parse(&nginx.url("ckpt/")).unwrap(), &cached_opts).unwrap();
    let err =
        cached.load_share(&LoadOptions::default(), tensora_io::ShareOf::new(0, 2).unwrap()).unwrap_err();
    assert!(err.to_string().contains("cache"), "{err}");
    let share = tensora_io::ShareOf::new(0, 2).unwrap();
    let err = cached
        .load_share_runs(&LoadOptions::default(), share, |_| std::ops::ControlFlow::Continue(()))
        .unwrap_err();
    assert!(err.to_string().contains("cache"), "{err}");
}

#[test]
fn partial_and_streaming_remote_loads_match_a_local_load() {
    let (root, dir) = checkpoint_under_root(3, 4, 96 << 10);
    let nginx = started(Nginx::start(root.path(), "50m"));
    let location = Location::parse(&nginx.url("ckpt/")).unwrap();
    let opened = open_remote(&location, &small_opts()).unwrap();
    assert_eq!(opened.checkpoint().files().len(), 3);
    assert!(opened.checkpoint().files()[0].path().to_string_lossy().starts_with("http://127.0.0.1:"));
    let local = tensora_io::load_path(&dir, &tensora_io::LoadOptions::default()).unwrap();

    // Partial: one shard's worth of names by glob, plus one exact name from another shard.
    let names: Vec<String> = opened.tensors().iter().map(|t| t.name().to_owned()).collect();
    let pick = vec![names[0].clone(), names[names.len() - 1].clone()];
    let opts = LoadOptions { selection: Selection::Names(pick.clone()), ..LoadOptions::default() };
    let partial = opened.load(&opts).unwrap();
    assert_eq!(partial.len(), 2);
    for name in &pick {
        let (got, want) = (partial.tensor(name).unwrap(), local.tensor(name).unwrap());
        assert_eq!(Sha256::digest(got.bytes()), Sha256::digest(want.bytes()), "{name}");
    }
    assert_eq!(partial.report().load.bytes_selected, 2 * (96 << 10));
    assert!(partial.report().load.bytes_read < 3 * (96 << 10), "{:?}", partial.report().load);

    // Streaming under a budget smaller than the checkpoint: every tensor once, same bytes.
    let opts = LoadOptions { budget_bytes: 256 << 10, ..LoadOptions::default() };
    let mut seen = std::collections::BTreeMap::new();
    let report = opened
        .load_streaming(&opts, |t| {
            seen.insert(t.name().to_owned(), Sha256::digest(t.bytes()));
            Ok(())
        })
        .unwrap();
    assert_eq!(seen.len(), names.len());
    for (name, digest) in &seen {
        assert_eq!(*digest, Sha256::digest(local.tensor(name).unwrap().bytes()), "{name}");
    }
    assert!(report.load.windows > 1, "{:?}", report.load);
    assert!(report.load.peak_inflight_bytes <= 256 << 10);
    assert_eq!(report.open_requests, opened.open_requests());
    assert!(report.requests >= 3, "{} requests", report.requests);
}

#[test]
fn http_real_fixtures_match_expected_digests() {
    let fixtures = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/real"));
    let nginx = started(Nginx::start(fixtures, "50m"));
    let mut checked = 0;
    for entry in std::fs::read_dir(fixtures).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(stem) = name.strip_suffix(".safetensors") else { continue };
        let expected: serde_json::Value =
            serde_json::from_slice(&std::fs::read(fixtures.join(format!("{stem}.expected.json"))).unwrap())
                .unwrap();
        let loaded = load_remote(&Location::parse(&nginx.url(&name)).unwrap(), &small_opts()).unwrap();
        let tensors = expected["tensors"].as_object().expect("tensors object");
        assert_eq!(loaded.len(), tensors.len(), "{name}");
        for (tname, want) in tensors {
            let t = loaded.tensor(tname).unwrap_or_else(|| panic!("{name}: {tname} missing"));
            assert_eq!(
                hex::encode(Sha256::digest(t.bytes())),
                want["sha256"].as_str().unwrap(),
                "{name}: {tname}"
            );
        }
        checked += 1;
    }
    assert!(checked >= 1, "no fixtures found in {}", fixtures.display());
}

#[test]
fn http_serverlessllm_matches_expected_digests() {
    let root = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/serverlessllm"));
    let expected: serde_json::Value =
        serde_json::from_slice(&std::fs::read(root.join("tiny.expected.json")).unwrap()).unwrap();
    let tensors = expected["tensors"].as_object().expect("tensors object");
    let nginx = started(Nginx::start(root, "50m"));
    for path in ["tiny/", "tiny/tensor_index.json"] {
        let loaded = load_remote(&Location::parse(&nginx.url(path)).unwrap(), &small_opts()).unwrap();
        assert_eq!(loaded.checkpoint().format(), tensora_format::Format::ServerlessLlm);
        assert_eq!(loaded.len(), tensors.len(), "{path}");
        for (name, want) in tensors {
            let t = loaded.tensor(name).unwrap_or_else(|| panic!("{path}: {name} missing"));
            assert!(t.info().strides().is_some());
            let dense = &t.bytes()[..t.info().nbytes() as usize];
            assert_eq!(
                hex::encode(Sha256::digest(dense)),
                want["sha256"].as_str().unwrap(),
                "{path}: {name}"
            );
        }
    }
}

#[test]
fn s3_sharded_checkpoint_matches_a_local_load_by_index_and_by_listing() {
    let src = tempfile::tempdir().unwrap();
    write_checkpoint(src.path(), 2, 3, 160 << 10);
    let shards_only = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(src.path()).unwrap().flatten() {
        if entry.file_name().to_string_lossy().ends_with(".safetensors") {
            std::fs::copy(entry.path(), shards_only.path().join(entry.file_name())).unwrap();
        }
    }
    let s3 = started(S3rver::start());
    s3.upload_dir(src.path(), "indexed").unwrap();
    s3.upload_dir(shards_only.path(), "listed").unwrap();
    let opts = RemoteOptions { store: s3.store_config(), ..small_opts() };
    // Opening costs the listing, the index read whole (its size listed), and one read per shard
    // (its version from the response; no HEAD).
    for (prefix, open_requests) in [("indexed", 1 + 1 + 2), ("listed", 1 + 2)] {
        let location = Location::parse(&format!("s3://{}/{prefix}/", support::BUCKET)).unwrap();
        let loaded = load_remote(&location, &opts).unwrap_or_else(|e| panic!("{prefix}: {e}"));
        assert_matches_local(&loaded, src.path());
        let r = loaded.report();
        assert_eq!(r.load.backend, "remote-s3");
        assert_eq!(r.open_requests, open_requests + r.open_retries, "{prefix}");
    }
    let missing = Location::parse(&format!("s3://{}/nothing-here/", support::BUCKET)).unwrap();
    assert!(matches!(load_remote(&missing, &opts), Err(RemoteError::NoCheckpoint { .. })));
}

/// Two shards of two 512 KiB tensors, read 512 KiB at a time, one range in flight on each of two
/// issuing threads: the reads of the first shard come first.
fn two_shards() -> (tempfile::TempDir, std::path::PathBuf) {
    checkpoint_under_root(2, 2, 512 << 10)
}

/// Generous retry bounds: the tests below end a load's trouble by events, and the retry budget
/// only has to outlast a slow test thread.
fn patient_opts() -> RemoteOptions {
    let mut opts = RemoteOptions { reads_inflight_max: 2, chunk_bytes: 512 << 10, ..small_opts() };
    opts.retry.retry_time_max = support::EVENT_WAIT_MAX;
    opts.retry.retries_per_range_max = 1000;
    opts
}

/// A pause in a load, forced by events rather than sleeps: the load's `on_read` hook, on every
/// landed read, waits until the test opens the gate; the first one also tells the test that a
/// read has landed. Until the gate opens each issuing thread holds its landed read, so no
/// further range is requested.
struct Gate {
    opened: std::sync::Mutex<bool>,
    wake: std::sync::Condvar,
    first: std::sync::Mutex<Option<std::sync::mpsc::Sender<()>>>,
}

impl Gate {
    /// Load options with the hook, and the receiver of the first-read event.
    fn new() -> (std::sync::Arc<Gate>, LoadOptions, std::sync::mpsc::Receiver<()>) {
        let (tx, rx) = std::sync::mpsc::channel();
        let gate = std::sync::Arc::new(Gate {
            opened: std::sync::Mutex::new(false),
            wake: std::sync::Condvar::new(),
            first: std::sync::Mutex::new(Some(tx)),
        });
        let hook_gate = std::sync::Arc::clone(&gate);
        let hook: tensora_io::ReadHook = std::sync::Arc::new(move |_piece| {
            if let Some(tx) = hook_gate.first.lock().unwrap().take() {
                let _ = tx.send(());
            }
            let opened = hook_gate.opened.lock().unwrap();
            let (opened, timeout) =
                hook_gate.wake.wait_timeout_while(opened, support::EVENT_WAIT_MAX, |o| !*o).unwrap();
            if timeout.timed_out() && !*opened {
                return Err("the test never opened the gate".into());
            }
            Ok(())
        });
        (gate, LoadOptions { on_read: Some(hook), ..LoadOptions::default() }, rx)
    }

    fn open(&self) {
        *self.opened.lock().unwrap() = true;
        self.wake.notify_all();
    }
}

/// Wait for the load's first landed read (bounded against a hang).
fn first_read(rx: &std::sync::mpsc::Receiver<()>) {
    rx.recv_timeout(support::EVENT_WAIT_MAX).expect("no read landed");
}

/// Accept one connection on `listener` and close it unanswered; blocks (bounded) until one comes.
fn refuse_one(listener: &std::net::TcpListener) {
    listener.set_nonblocking(true).unwrap();
    let mut accepted = None;
    support::wait_for("connection from the loader", || match listener.accept() {
        Ok((stream, _)) => {
            accepted = Some(stream);
            true
        }
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => false,
        Err(e) => panic!("accept: {e}"),
    });
    drop(accepted);
}

/// Issue 21: ordered by events. After the first range lands, nginx is killed and its port taken
/// by the test, which accepts the loader's next connection and closes it (a failed attempt for
/// certain); then nginx comes back, and the load completes with equal bytes.
#[test]
fn server_killed_and_restarted_mid_load_completes_with_equal_bytes() {
    let (root, dir) = two_shards();
    let mut nginx = started(Nginx::start(root.path(), "50m"));
    let location = Location::parse(&nginx.url("ckpt/")).unwrap();
    let checkpoint = open_remote(&location, &patient_opts()).unwrap();
    let (gate, load, first) = Gate::new();
    let loader = std::thread::spawn(move || checkpoint.load(&load));
    first_read(&first);
    nginx.kill();
    let listener = std::net::TcpListener::bind(("127.0.0.1", nginx.port)).unwrap();
    gate.open();
    refuse_one(&listener);
    drop(listener);
    nginx.restart().unwrap();
    let loaded = loader.join().unwrap().expect("the load survives a restart");
    assert_matches_local(&loaded, &dir);
    assert!(loaded.report().load.retries > 0, "no retry was counted");
}

/// Issue 21: after the first range lands the server goes away for good; the load fails with the
/// object, the offset and the tensor around the exhausted retries (no timing asserted).
#[test]
fn server_gone_for_good_fails_within_the_retry_budget() {
    let (root, _dir) = two_shards();
    let mut nginx = started(Nginx::start(root.path(), "50m"));
    let location = Location::parse(&nginx.url("ckpt/")).unwrap();
    let mut opts = patient_opts();
    opts.retry.retries_per_range_max = 3;
    let checkpoint = open_remote(&location, &opts).unwrap();
    let (gate, load, first) = Gate::new();
    let loader = std::thread::spawn(move || checkpoint.load(&load));
    first_read(&first);
    nginx.kill();
    gate.open();
    let err = loader.join().unwrap().expect_err("no result without a server");
    let RemoteError::Read { url, tensor, source, .. } = &err else { panic!("not a read error: {err}") };
    assert!(matches!(**source, RemoteError::RetriesExhausted { attempts: 4, .. }), "{err}");
    assert!(url.contains("/ckpt/model-0000"), "{err}");
    assert!(err.to_string().contains(tensor.as_str()), "{err}");
}

/// Issue 21: ordered by events. The last shard is replaced (same size, new bytes and mtime: a new
/// ETag) while the first shard's reads are held at the gate, before any range of the last shard
/// was requested; the load fails naming it.
#[test]
fn object_replaced_mid_load_fails_cleanly() {
    let (root, dir) = two_shards();
    let nginx = started(Nginx::start(root.path(), "50m"));
    let location = Location::parse(&nginx.url("ckpt/")).unwrap();
    let checkpoint = open_remote(&location, &patient_opts()).unwrap();
    let (gate, load, first) = Gate::new();
    let loader = std::thread::spawn(move || checkpoint.load(&load));
    first_read(&first);
    let shard = dir.join("model-00002-of-00002.safetensors");
    let mut bytes = std::fs::read(&shard).unwrap();
    let n = bytes.len();
    bytes[n - 1] ^= 0xFF;
    let tmp = dir.join("replacement.tmp");
    std::fs::write(&tmp, &bytes).unwrap();
    let later = std::fs::metadata(&shard).unwrap().modified().unwrap() + Duration::from_secs(100);
    std::fs::File::options().write(true).open(&tmp).unwrap().set_modified(later).unwrap();
    std::fs::rename(&tmp, &shard).unwrap();
    gate.open();
    let err = loader.join().unwrap().expect_err("a replaced object must fail the load");
    assert!(err.is_changed(), "{err}");
    assert!(err.to_string().contains("model-00002-of-00002.safetensors"), "{err}");
}

/// Issue 21: HTTP 500, 503 and 429 (the last two with `Retry-After: 1`) from a real nginx are
/// retried until the server recovers: after the first range lands, nginx answers every request
/// with the status; once its log shows one such answer, it serves files again, and the load
/// completes with equal bytes. A 503 or 429 waited as long as `Retry-After` asked.
#[test]
fn http_errors_are_retried_until_the_server_recovers() {
    let (root, dir) = two_shards();
    let nginx = started(Nginx::start(root.path(), "50m"));
    let location = Location::parse(&nginx.url("ckpt/")).unwrap();
    for status in [500u16, 503, 429] {
        let checkpoint = open_remote(&location, &patient_opts()).unwrap();
        let (gate, load, first) = Gate::new();
        let loader = std::thread::spawn(move || checkpoint.load(&load));
        first_read(&first);
        nginx.fail_with(Some(status));
        let before = nginx.count_status(status);
        gate.open();
        nginx.wait_for_status(status, before + 1);
        nginx.fail_with(None);
        let loaded = loader.join().unwrap().unwrap_or_else(|e| panic!("{status}: {e}"));
        assert_matches_local(&loaded, &dir);
        let r = loaded.report();
        assert!(r.load.retries >= 1, "{status}: {r:?}");
        if status != 500 {
            // A lower bound on time, which a slow machine only makes longer.
            assert!(r.retry_seconds >= 1.0, "{status}: Retry-After not waited: {r:?}");
        }
    }
}

/// Issue 21: a server that keeps answering 500, 503 or 429 exhausts the retries: the error names
/// the object, the tensor and the status.
#[test]
fn http_errors_exhaust_the_retries() {
    let (root, _dir) = two_shards();
    let nginx = started(Nginx::start(root.path(), "50m"));
    let location = Location::parse(&nginx.url("ckpt/")).unwrap();
    let mut opts = small_opts();
    opts.retry = RetryPolicy {
        retries_per_range_max: 2,
        retry_time_max: support::EVENT_WAIT_MAX,
        backoff_initial: Duration::ZERO,
        backoff_max: Duration::ZERO,
    };
    let checkpoint = open_remote(&location, &opts).unwrap();
    for status in [500u16, 503, 429] {
        nginx.fail_with(Some(status));
        let err = checkpoint.load(&LoadOptions::default()).expect_err("the server never recovers");
        let RemoteError::Read { url, source, .. } = &err else { panic!("{status}: not a read error: {err}") };
        let RemoteError::RetriesExhausted { attempts, last_error, .. } = &**source else {
            panic!("{status}: {err}")
        };
        assert_eq!(*attempts, 3, "{err}");
        assert!(last_error.contains(&status.to_string()), "{status}: {err}");
        assert!(url.contains("/ckpt/model-0000"), "{err}");
    }
    nginx.fail_with(None);
    assert!(checkpoint.load(&LoadOptions::default()).is_ok());
}

#[test]
fn bad_objects_get_typed_errors() {
    let root = tempfile::tempdir().unwrap();
    // Claims a 1000-byte header in a 16-byte file.
    let mut bad = 1000u64.to_le_bytes().to_vec();
    bad.extend_from_slice(b"{}      ");
    std::fs::write(root.path().join("bad.safetensors"), &bad).unwrap();
    std::fs::create_dir(root.path().join("empty")).unwrap();
    std::fs::write(root.path().join("short.safetensors"), b"abc").unwrap();
    let nginx = started(Nginx::start(root.path(), "50m"));
    let opts = small_opts();
    let err = load_remote(&Location::parse(&nginx.url("bad.safetensors")).unwrap(), &opts).unwrap_err();
    assert!(
        matches!(&err, RemoteError::Format { source, .. }
        if matches!(source.kind(), tensora_format::ErrorKind::HeaderBeyondFile { .. })),
        "{err}"
    );
    let err = load_remote(&Location::parse(&nginx.url("short.safetensors")).unwrap(), &opts).unwrap_err();
    assert!(matches!(err, RemoteError::Format { .. }), "{err}");
    let err = load_remote(&Location::parse(&nginx.url("missing.safetensors")).unwrap(), &opts).unwrap_err();
    assert!(matches!(err, RemoteError::NotFound { .. }), "{err}");
    let err = load_remote(&Location::parse(&nginx.url("empty/")).unwrap(), &opts).unwrap_err();
    assert!(matches!(err, RemoteError::NoCheckpoint { .. }), "{err}");
}

/// Shard names an index may spell that are not URL-safe (accepted by a local open) load remotely
/// too: objects are matched to the index by name, not by their percent-encoded URL, and each name
/// is percent-encoded exactly once on the way to the server (`%`, `#` and non-ASCII included).
#[test]
fn shard_names_that_need_percent_encoding_load_over_http() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("odd");
    std::fs::create_dir(&dir).unwrap();
    write_checkpoint(&dir, 2, 2, 64 << 10);
    let index_path = dir.join("model.safetensors.index.json");
    let mut index = std::fs::read_to_string(&index_path).unwrap();
    for (i, new) in [(1, "part one é.safetensors"), (2, "part+two,=&;@#%20.safetensors")] {
        let old = format!("model-0000{i}-of-00002.safetensors");
        std::fs::rename(dir.join(&old), dir.join(new)).unwrap();
        index = index.replace(&old, new);
    }
    std::fs::write(&index_path, index).unwrap();
    let nginx = started(Nginx::start(root.path(), "50m"));
    let loaded = load_remote(&Location::parse(&nginx.url("odd/")).unwrap(), &small_opts()).unwrap();
    assert_matches_local(&loaded, &dir);
}

/// Finding 1 of issue 14: a password in an HTTP URL is sent (basic auth), and appears in no
/// error text, report or `Debug` output, for a load that works, a wrong password and a failed
/// open.
#[test]
fn passwords_in_http_urls_do_not_leak() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("private/ckpt");
    std::fs::create_dir_all(&dir).unwrap();
    write_checkpoint(&dir, 2, 2, 32 << 10);
    let nginx = started(Nginx::start(root.path(), "50m"));
    let no_secret = |text: &str| assert!(!text.contains("hunter2"), "{text}");
    let url = format!("http://u:hunter2@127.0.0.1:{}/private/ckpt/", nginx.port);
    let loaded = load_remote(&Location::parse(&url).unwrap(), &small_opts()).expect("basic auth accepted");
    assert_matches_local(&loaded, &dir);
    no_secret(&serde_json::to_string(loaded.report()).unwrap());
    no_secret(&format!("{:?} {:?}", loaded.report(), loaded.checkpoint()));
    for f in loaded.checkpoint().checkpoint().files() {
        no_secret(&f.path().to_string_lossy());
    }
    // Without the password nginx refuses (so it was sent); with a wrong one, the error hides it.
    let anonymous = format!("http://127.0.0.1:{}/private/ckpt/", nginx.port);
    assert!(load_remote(&Location::parse(&anonymous).unwrap(), &small_opts()).is_err());
    let wrong = format!("http://u:not-hunter2@127.0.0.1:{}/private/ckpt/", nginx.port);
    let err = load_remote(&Location::parse(&wrong).unwrap(), &small_opts()).unwrap_err();
    no_secret(&format!("{err} {err:?}"));
    // Nothing listens on port 1: the failed open names the redacted URL.
    let opts = RemoteOptions {
        retry: RetryPolicy { retries_per_range_max: 0, ..small_opts().retry },
        ..small_opts()
    };
    let err =
        open_remote(&Location::parse("http://u:hunter2@127.0.0.1:1/ckpt/").unwrap(), &opts).unwrap_err();
    let text = format!("{err} {err:?}");
    no_secret(&text);
    assert!(text.contains("u:***@127.0.0.1:1/ckpt/"), "{text}");
}

/// Every store loads like a local checkpoint (issue 16; issue 45: one test over
/// `support::stores()`, so a new store adds a server there and no test code): partial, streamed
/// and full loads equal a local load, the report names the store's backend, a directory without an
/// index is found by listing where the store lists, and a replaced object fails the next load
/// with `Changed`. Every store of `tensora_remote::schemes()` has a server.
#[test]
fn every_store_loads_like_a_local_checkpoint() {
    let servers = support::stores();
    let mut backends: Vec<_> = servers.iter().map(|s| s.backend).collect();
    let mut wanted: Vec<_> = tensora_remote::schemes().map(|s| s.backend).collect();
    backends.sort_unstable();
    wanted.sort_unstable();
    assert_eq!(backends, wanted, "support::stores() has a server for each store, and only those");
    let src = tempfile::tempdir().unwrap();
    write_checkpoint(src.path(), 2, 3, 96 << 10);
    let shards_only = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(src.path()).unwrap().flatten() {
        if entry.file_name().to_string_lossy().ends_with(".safetensors") {
            std::fs::copy(entry.path(), shards_only.path().join(entry.file_name())).unwrap();
        }
    }
    // The same-size replacement each store gets after the loads.
    let changed = tempfile::tempdir().unwrap();
    let shard = "model-00002-of-00002.safetensors";
    let mut bytes = std::fs::read(src.path().join(shard)).unwrap();
    let n = bytes.len();
    bytes[n - 1] ^= 0xFF;
    std::fs::write(changed.path().join(shard), &bytes).unwrap();
    for server in servers {
        let store = started((server.start)());
        let scheme = tensora_remote::schemes().find(|s| s.backend == server.backend).unwrap();
        store.upload_dir(src.path(), "m").unwrap();
        let url = store.url("m");
        let location = Location::parse(&url).unwrap();
        assert_eq!(location.to_string().split_once("://").map(|s| s.0), url.split_once("://").map(|s| s.0));
        let opts = RemoteOptions { store: store.store_config(), ..small_opts() };
        let checkpoint = open_remote(&location, &opts).unwrap_or_else(|e| panic!("{url}: {e}"));
        let loaded = checkpoint.load(&LoadOptions::default()).unwrap_or_else(|e| panic!("{url}: {e}"));
        assert_matches_local(&loaded, src.path());
        assert_eq!(loaded.report().load.backend, server.backend, "{url}");
        let name = checkpoint.tensors()[1].name().to_owned();
        let one = LoadOptions { selection: Selection::Names(vec![name.clone()]), ..LoadOptions::default() };
        let partial = checkpoint.load(&one).unwrap();
        assert_eq!(partial.tensor(&name).unwrap().bytes(), loaded.tensor(&name).unwrap().bytes());
        let mut streamed = 0;
        checkpoint
            .load_streaming(&LoadOptions { budget_bytes: 256 << 10, ..LoadOptions::default() }, |t| {
                assert_eq!(t.bytes(), loaded.tensor(t.name()).unwrap().bytes());
                streamed += 1;
                Ok(())
            })
            .unwrap();
        assert_eq!(streamed, 6, "{url}");
        if scheme.lists {
            store.upload_dir(shards_only.path(), "listed").unwrap();
            let listed = Location::parse(&store.url("listed")).unwrap();
            let loaded = load_remote(&listed, &opts).unwrap_or_else(|e| panic!("{listed}: {e}"));
            assert_matches_local(&loaded, src.path());
        }
        store.upload_dir(changed.path(), "m").unwrap();
        let err = checkpoint.load(&LoadOptions::default()).unwrap_err();
        assert!(err.is_changed(), "{url}: {err}");
    }
}

/// An `az://container@account/` URL naming another account than the key's (account A's key,
/// account B's URL) is refused before any request, naming both accounts and not the key: the
/// store would sign B's requests with A's key. The key's own account, named, loads.
#[test]
fn an_azure_url_naming_another_account_than_the_key_is_refused() {
    let src = tempfile::tempdir().unwrap();
    write_checkpoint(src.path(), 1, 2, 16 << 10);
    let azurite = started(support::Azurite::start());
    azurite.upload_dir(src.path(), "m").unwrap();
    let opts = RemoteOptions { store: azurite.store_config(), ..small_opts() };
    let (account, key) = support::AZURITE_ACCOUNT;
    let own = format!("az://{}@{account}/m/", support::BUCKET);
    let loaded = load_remote(&Location::parse(&own).unwrap(), &opts).unwrap_or_else(|e| panic!("{own}: {e}"));
    assert_matches_local(&loaded, src.path());
    let other = format!("az://{}@otheraccount/m/", support::BUCKET);
    let err = open_remote(&Location::parse(&other).unwrap(), &opts).unwrap_err();
    let text = format!("{err} {err:?}");
    match &err {
        RemoteError::AccountMismatch { url_account, credential_account, .. } => {
            assert_eq!(
                (url_account.as_str(), credential_account.as_str()),
                ("otheraccount", account),
                "{text}"
            );
        }
        wrong => panic!("{wrong} is not the account mismatch"),
    }
    assert!(!text.contains(key), "the key leaked: {text}");
}
