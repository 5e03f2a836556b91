//! [`RemoteBackend`]: a `tensora_io::IoBackend` that reads from an object store or HTTP server.
//!
//! The load layer (`tensora_io::load` / `load_streaming`) plans, selects, tracks completions and
//! runs the hooks; this backend only moves bytes. All reads of a job form one issue queue (the
//! plan's queues one after another: each file front to back, so when one shard's last chunks are
//! in flight the next shard's first chunks already are: lookahead across shards). A few issuing
//! threads (`RemoteOptions::runtime_threads`) pull the next read from that queue, each keeping its
//! share of `reads_inflight_max` ranges in flight; every range holds a budget permit while in
//! flight, is claimed from the job ([`tensora_io::Job::claim`]), fetched with one conditional GET
//! whose body is copied chunk by chunk straight into the claimed slice (resumed where it stopped
//! after a failure, see `fetch.rs`), and landed ([`tensora_io::ReadTarget::land`]).

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use futures::StreamExt;
use tensora_io::{CompletionSink, IoBackend, IoStats, Job, ReadError, ReadErrorKind};

use crate::RemoteError;
use crate::checkpoint::RemoteCheckpoint;
use crate::client::{Client, CounterSnapshot, off_runtime};
use crate::fetch::{Counters, Fetcher, RemoteObject};

/// How often an in-flight range (including its backoff sleeps) looks at the job's cancel flag
/// and at the run's stop flag (set by the first failed range): a failed or cancelled load ends
/// within about this long, not when every other in-flight range has run out of retries.
pub const STOP_POLL_INTERVAL: Duration = Duration::from_millis(20);

/// Reads a remote checkpoint's objects for `tensora_io`. Build it from an opened
/// [`RemoteCheckpoint`] and hand it to a load as `BackendChoice::Custom(Arc::new(backend))`;
/// [`RemoteCheckpoint::load`] does exactly that.
///
/// A failed range fails the run with a `ReadError` naming the object's file id, the range and the
/// cause; the typed [`RemoteError`] behind the first failure is kept for
/// [`RemoteBackend::take_error`]. The backend owns its request counters: they count its runs
/// only, never an open's or another backend's requests on the same store.
#[derive(Debug)]
pub struct RemoteBackend {
    client: Arc<Client>,
    /// Indexed by checkpoint file id.
    objects: Vec<RemoteObject>,
    name: &'static str,
    first_error: Mutex<Option<RemoteError>>,
    counters: Counters,
}

impl RemoteBackend {
    /// A backend for the objects of `checkpoint`, reusing its client (store, connections, runtime).
    pub fn new(checkpoint: &RemoteCheckpoint) -> RemoteBackend {
        RemoteBackend {
            client: Arc::clone(checkpoint.client()),
            objects: checkpoint.objects().to_vec(),
            name: match checkpoint.location() {
                crate::Location::S3 { .. } => "remote-s3",
                _ => "remote-http",
            },
            first_error: Mutex::new(None),
            counters: Counters::default(),
        }
    }

    /// The typed error behind the first failed range of the last failed run, if any.
    pub fn take_error(&self) -> Option<RemoteError> {
        self.first_error.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    /// Requests, retries and retry time of this backend's runs so far.
    pub(crate) fn counts(&self) -> CounterSnapshot {
        self.counters.snapshot()
    }

    fn keep_error(&self, e: RemoteError) -> String {
        let text = e.to_string();
        let mut slot = self.first_error.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            *slot = Some(e);
        }
        text
    }
}

/// How `reads_inflight_max` ranges are split over issuing threads: never more threads than
/// ranges, and thread `i` keeps `max / threads` ranges in flight, plus one for the first
/// `max % threads` threads, so the shares sum to exactly `max`.
fn inflight_shares(reads_inflight_max: usize, threads: usize) -> Vec<usize> {
    let max = reads_inflight_max.max(1);
    let threads = threads.clamp(1, max);
    (0..threads).map(|i| max / threads + usize::from(i < max % threads)).collect()
}

/// Why one read did not land.
enum Fail {
    Read(ReadError),
    Remote { read: u32, error: RemoteError },
}

/// Resolves once the job is cancelled or the run stopped, polling every [`STOP_POLL_INTERVAL`].
async fn stopped(cancel: &AtomicBool, stop: &AtomicBool) {
    while !cancel.load(Ordering::Relaxed) && !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(STOP_POLL_INTERVAL).await;
    }
}

impl IoBackend for RemoteBackend {
    fn name(&self) -> &'static str {
        self.name
    }

    fn reads_local_files(&self) -> bool {
        false
    }

    fn execute(&self, job: &Job<'_>, sink: &dyn CompletionSink) -> Result<IoStats, ReadError> {
        let order: Vec<u32> = job.plan.queues().iter().flat_map(|q| q.reads.clone()).collect();
        let opts = &self.client.opts;
        // A current-thread runtime (0 threads) is driven by one caller at a time: one issuer.
        let shares =
            inflight_shares(opts.reads_inflight_max, opts.runtime_threads.clamp(1, order.len().max(1)));
        let retries_before = self.counters.retries.load(Ordering::Relaxed);
        let run = Run {
            backend: self,
            job,
            sink,
            order,
            cursor: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            fetcher: self.client.fetcher(&self.counters),
        };
        let mut total = merge_issuers(run.issue_on_threads(&shares)).map_err(|f| self.read_error(job, f))?;
        total.retries = self.counters.retries.load(Ordering::Relaxed).saturating_sub(retries_before);
        total.peak_inflight_bytes = job.budget.peak_bytes();
        Ok(total)
    }
}

impl RemoteBackend {
    /// The `ReadError` a failed run returns. For a fetch that failed, the typed cause is kept for
    /// [`RemoteBackend::take_error`] and the error names the first byte that did not land, when
    /// the fetch knows it, so the load layer names the tensor that byte belongs to, not the
    /// read's first one.
    fn read_error(&self, job: &Job<'_>, failure: Fail) -> ReadError {
        match failure {
            Fail::Read(e) => e,
            Fail::Remote { read, error } => {
                let r = &job.plan.reads()[read as usize];
                let (offset_bytes, len_bytes) = error.range().unwrap_or((r.offset_bytes, r.len_bytes));
                let text = self.keep_error(error);
                ReadError {
                    file: r.file,
                    offset_bytes,
                    len_bytes,
                    kind: ReadErrorKind::Io(std::io::Error::other(text)),
                }
            }
        }
    }
}

/// One run of [`RemoteBackend::execute`]: the job, its single issue queue, and the state its
/// issuing threads share.
struct Run<'r, 'j> {
    backend: &'r RemoteBackend,
    job: &'r Job<'j>,
    sink: &'r dyn CompletionSink,
    /// Read indexes in issue order: the plan's queues one after another.
    order: Vec<u32>,
    /// The next position in `order` to issue, shared by every issuing thread.
    cursor: AtomicUsize,
    /// Set by the first failed range; every other range stops within [`STOP_POLL_INTERVAL`].
    stop: AtomicBool,
    fetcher: Fetcher<'r>,
}

impl Run<'_, '_> {
    /// Read `index` of the plan: wait for budget, claim its slice, fetch the range into it (racing
    /// a cancel or another range's failure), and land it. The bytes it read.
    async fn fetch_one(&self, index: u32) -> Result<u64, Fail> {
        let job = self.job;
        let read = &job.plan.reads()[index as usize];
        let fail_with = |kind| {
            Fail::Read(ReadError {
                file: read.file,
                offset_bytes: read.offset_bytes,
                len_bytes: read.len_bytes,
                kind,
            })
        };
        if job.cancel.load(Ordering::Relaxed) || self.stop.load(Ordering::Relaxed) {
            return Err(fail_with(ReadErrorKind::Cancelled));
        }
        let Some(object) = job.checkpoint_file(read.file).and_then(|f| self.backend.objects.get(f as usize))
        else {
            return Err(fail_with(ReadErrorKind::Io(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("read {index} names plan file {} that maps to no object", read.file),
            ))));
        };
        let _permit = job.budget.acquire_async(read.len_bytes).await;
        let mut target = job.claim(index).map_err(Fail::Read)?;
        // Race the fetch (its retries and backoff sleeps included) against a cancel or another
        // range's failure.
        let raced = {
            let fetch = std::pin::pin!(self.fetcher.fetch(object, read.offset_bytes, target.buf()));
            let halt = std::pin::pin!(stopped(job.cancel, &self.stop));
            match futures::future::select(fetch, halt).await {
                futures::future::Either::Left((fetched, _)) => Some(fetched),
                futures::future::Either::Right(((), _)) => None,
            }
        };
        match raced {
            Some(Ok(())) => {}
            Some(Err(error)) => return Err(Fail::Remote { read: index, error }),
            None => return Err(fail_with(ReadErrorKind::Cancelled)),
        }
        target.land(self.sink).map_err(Fail::Read)?;
        Ok(read.len_bytes)
    }

    /// One issuing loop: pull reads from the shared queue and keep `inflight` of them in flight
    /// on the client's runtime, until the queue is empty or a read fails (which stops the run).
    fn issue(&self, inflight: usize) -> Result<IoStats, Fail> {
        let next = std::iter::from_fn(|| {
            if self.stop.load(Ordering::Relaxed) {
                return None;
            }
            self.order.get(self.cursor.fetch_add(1, Ordering::Relaxed)).copied()
        });
        let mut stats = IoStats::default();
        let result = self.backend.client.runtime().block_on(async {
            let mut done = futures::stream::iter(next).map(|i| self.fetch_one(i)).buffer_unordered(inflight);
            while let Some(r) = done.next().await {
                let len_bytes = match r {
                    Ok(n) => n,
                    Err(f) => {
                        // Every other in-flight range stops within STOP_POLL_INTERVAL.
                        self.stop.store(true, Ordering::Relaxed);
                        return Err(f);
                    }
                };
                stats.reads += 1;
                stats.bytes_read += len_bytes;
            }
            Ok(())
        });
        result.map(|()| stats)
    }

    /// One issuing loop per share of the in-flight cap, the first on this thread. Blocking on
    /// the client's runtime panics inside another runtime: then they all run on plain threads.
    fn issue_on_threads(&self, shares: &[usize]) -> Vec<Result<IoStats, Fail>> {
        off_runtime(|| {
            std::thread::scope(|s| {
                let handles: Vec<_> = shares[1..].iter().map(|&n| s.spawn(move || self.issue(n))).collect();
                let mut results = vec![self.issue(shares[0])];
                for h in handles {
                    results.push(h.join().unwrap_or_else(|_| {
                        Err(Fail::Read(ReadError::run(ReadErrorKind::Io(std::io::Error::other(
                            "a remote issuing thread panicked",
                        )))))
                    }))
                }
                results
            })
        })
    }
}

/// The issuing loops' statistics summed, or the failure to report: a cancelled or stopped read
/// is a consequence of another failure, so the first failure that is not one is preferred.
fn merge_issuers(results: Vec<Result<IoStats, Fail>>) -> Result<IoStats, Fail> {
    let mut total = IoStats::default();
    let mut first_failure: Option<(bool, Fail)> = None;
    for r in results {
        match r {
            Ok(s) => {
                total.reads += s.reads;
                total.bytes_read += s.bytes_read;
            }
            Err(f) => {
                let is_cause = !matches!(&f, Fail::Read(ReadError { kind: ReadErrorKind::Cancelled, .. }));
                if first_failure.is_none() || is_cause && first_failure.as_ref().is_some_and(|(c, _)| !c) {
                    first_failure = Some((is_cause, f));
                }
            }
        }
    }
    match first_failure {
        Some((_, f)) => Err(f),
        None => Ok(total),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    use object_store::path::Path as ObjectPath;
    use object_store::{ObjectStore, ObjectStoreExt};
    use proptest::prelude::*;
    use tensora_format::Selection;
    use tensora_io::LoadOptions;

    use crate::test_store::{BreakingStore, upload_dir, write_f32_shards};
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

    fn open(store: Arc<BreakingStore>, opts: &RemoteOptions) -> RemoteCheckpoint {
        let location = Location::parse("http://mem.invalid/ckpt/").unwrap();
        let client = Client::with_store(store as Arc<dyn ObjectStore>, opts).unwrap();
        crate::checkpoint::open(&location, client, 0.0).unwrap()
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
            let opts = RemoteOptions { chunk_bytes: chunk, reads_inflight_max: inflight, runtime_threads: threads,
                ..RemoteOptions::default() };
            let remote = open(store, &opts);
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
        let remote = open(Arc::clone(&store), &RemoteOptions::default());
        let victim = ObjectPath::from(format!(
            "ckpt/{}",
            Path::new(remote.checkpoint().files()[0].path()).file_name().unwrap().to_str().unwrap()
        ));
        let bytes = rt.block_on(async { store.inner.get(&victim).await.unwrap().bytes().await.unwrap() });
        rt.block_on(store.inner.put(&victim, bytes.to_vec().into())).unwrap();
        let err = remote.load(&LoadOptions::default()).unwrap_err();
        assert!(err.is_changed(), "{err}");
        // The error names the object, the offset and the tensor, around the remote cause.
        let RemoteError::Read { url, tensor, offset_bytes, source } = &err else {
            panic!("not a read: {err}")
        };
        let file = remote.checkpoint().files()[0].path().to_string_lossy().into_owned();
        assert_eq!(*url, file);
        let t = remote.tensor(tensor).unwrap_or_else(|| panic!("{tensor:?} is no tensor"));
        assert_eq!(t.file(), tensora_format::FileId(0));
        assert!(t.range().contains(offset_bytes), "{offset_bytes} outside {:?}", t.range());
        assert!(matches!(**source, RemoteError::Changed { .. }), "{source}");
        let text = err.to_string();
        assert!(text.contains(&file) && text.contains(tensor.as_str()), "{text}");
        // A load layer failure that is not a fetch is the load layer's error.
        let missing =
            LoadOptions { selection: Selection::Names(vec!["nope".into()]), ..LoadOptions::default() };
        let err = remote.load(&missing).unwrap_err();
        assert!(matches!(err, RemoteError::Load(_)), "{err}");
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
        let remote = open(store, &RemoteOptions::default());
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
        let again = crate::checkpoint::open(remote.location(), Arc::clone(remote.client()), 0.0).unwrap();
        assert_eq!(again.open_requests(), remote.open_requests());
    }

    /// After the first permanent failure, ranges still in flight (here: hanging) stop within a
    /// poll interval, not when their own attempts time out.
    #[test]
    fn the_first_failure_stops_every_range_in_flight() {
        let dir = tempfile::tempdir().unwrap();
        let store = stored(dir.path(), &[20_000, 20_000, 20_000, 20_000], 40_000, &rt());
        let attempt_timeout = Duration::from_secs(3);
        let opts = RemoteOptions {
            chunk_bytes: 8192,
            reads_inflight_max: 6,
            runtime_threads: 2,
            request_overhead: attempt_timeout,
            retry: crate::RetryPolicy { retries_per_range_max: 0, ..crate::RetryPolicy::default() },
            ..RemoteOptions::default()
        };
        let remote = open(Arc::clone(&store), &opts);
        // 6 in flight over 2 threads: the first 5 GETs hang (some on each thread), the 6th fails
        // for good.
        store.hang_next.store(5, Ordering::Relaxed);
        store.refuse_next.store(1, Ordering::Relaxed);
        let t = std::time::Instant::now();
        let err = remote.load(&LoadOptions::default()).unwrap_err();
        let elapsed = t.elapsed();
        assert!(err.is_changed(), "{err}");
        assert!(elapsed < attempt_timeout / 2, "took {elapsed:?} after the first failure");
        // A cancelled load stops its hanging ranges too.
        store.hang_next.store(u32::MAX, Ordering::Relaxed);
        let cancel = Arc::new(AtomicBool::new(false));
        let load = LoadOptions { cancel: Some(Arc::clone(&cancel)), ..LoadOptions::default() };
        let t = std::time::Instant::now();
        let err = std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(100));
                cancel.store(true, Ordering::Relaxed);
            });
            remote.load(&load).unwrap_err()
        });
        assert!(t.elapsed() < attempt_timeout / 2, "took {:?} to cancel: {err}", t.elapsed());
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
        let remote = open(Arc::clone(&store), &opts);
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
        let outer =
            tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let (loaded, streamed) = outer.block_on(async move {
            let remote = open(store, &RemoteOptions::default());
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
}
