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
//! after a failure, see `fetch.rs`), and landed ([`tensora_io::ReadTarget::land`]). The bytes
//! come from a source of ranges (`fetch::RangeSource`): the store's fetcher, or what a layer in
//! front of the store (the cache) makes of it for each run; the backend does not know which.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use tensora_io::{CompletionSink, IoBackend, IoStats, Job, ReadError, ReadErrorKind, ReadTarget};

use crate::RemoteError;
use crate::checkpoint::RemoteCheckpoint;
use crate::client::{Client, CounterSnapshot, off_runtime};
use crate::fetch::{Counters, Fetcher, Layer, RangeSource, RemoteObject};
use crate::tune::{TUNE_TICK, TuneReport, Tuner};

/// Reads the pager claims (and touches) ahead of the issuing threads.
pub const PAGE_AHEAD_READS: usize = 16;
/// The pager writes one byte per this many bytes of a claimed read (the smallest page size).
pub const PAGE_TOUCH_BYTES: usize = 4096;

/// How often an in-flight range (including its backoff sleeps) looks at the job's cancel flag
/// and at the run's stop flag (set by the first failed range): a failed or cancelled load ends
/// within about this long, not when every other in-flight range has run out of retries.
pub const STOP_POLL_INTERVAL: Duration = Duration::from_millis(20);

/// Reads a remote checkpoint's objects for `tensora_io`. Build it from an opened
/// [`RemoteCheckpoint`] and hand it to a load as `BackendChoice::Custom(Arc::new(backend))`;
/// [`RemoteCheckpoint::load`] does exactly that.
///
/// A failed range fails the run with a `ReadError` naming the object's file id, the range and the
/// cause: the typed [`RemoteError`], carried as `ReadErrorKind::Source` (the load's error then
/// holds it, downcastable, where the load layer names the file, offset and tensor). The backend owns its request counters: they count its runs
/// only, never an open's or another backend's requests on the same store.
#[derive(Debug)]
pub struct RemoteBackend {
    client: Arc<Client>,
    /// Indexed by checkpoint file id.
    objects: Vec<RemoteObject>,
    name: &'static str,
    counters: Counters,
    /// What is in front of the store (the cache its ranges are read from and written through),
    /// if anything.
    layer: Option<Arc<dyn Layer>>,
    /// What the concurrency controller did in the last run.
    tune: Mutex<Option<TuneReport>>,
    /// Nanoseconds the runs' lane threads wrote after the last range had arrived, summed.
    disk_tail_nanos: AtomicU64,
    /// The longest range of the last run.
    range_bytes: AtomicU64,
}

impl RemoteBackend {
    /// A backend for the objects of `checkpoint`, reusing its client (store, connections, runtime).
    pub fn new(checkpoint: &RemoteCheckpoint) -> RemoteBackend {
        RemoteBackend {
            client: Arc::clone(checkpoint.client()),
            objects: checkpoint.objects().to_vec(),
            name: checkpoint.location().backend_name(),
            counters: Counters::default(),
            layer: None,
            tune: Mutex::new(None),
            disk_tail_nanos: AtomicU64::new(0),
            range_bytes: AtomicU64::new(checkpoint.client().opts.chunk_bytes),
        }
    }

    /// The longest range of the last run (its plan's reads), `chunk_bytes` before one.
    pub fn range_bytes(&self) -> u64 {
        self.range_bytes.load(Ordering::Relaxed)
    }

    /// What the concurrency controller did in the last run (`None` before one).
    pub fn tune_report(&self) -> Option<TuneReport> {
        self.tune.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Seconds its runs waited for the layer's work (the cache's lane threads) after their last
    /// range had arrived (summed over the runs; 0 without a cache).
    pub(crate) fn disk_tail_seconds(&self) -> f64 {
        self.disk_tail_nanos.load(Ordering::Relaxed) as f64 / 1e9
    }

    /// This backend reading its ranges through `layer` (the cache), if any.
    pub(crate) fn with_layer(self, layer: Option<Arc<dyn Layer>>) -> RemoteBackend {
        RemoteBackend { layer, ..self }
    }

    /// Requests, retries and retry time of this backend's runs so far.
    pub(crate) fn counts(&self) -> CounterSnapshot {
        self.counters.snapshot()
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

    /// What the layer in front of the store asks (the cache: whole blocks), else nothing.
    fn read_align_bytes(&self) -> u64 {
        self.layer.as_ref().map_or(1, |l| l.read_align_bytes())
    }

    fn execute(&self, job: &Job<'_>, sink: &dyn CompletionSink) -> Result<IoStats, ReadError> {
        let order: Vec<u32> = job.plan.queues().iter().flat_map(|q| q.reads.clone()).collect();
        let opts = &self.client.opts;
        // A current-thread runtime (0 threads) is driven by one caller at a time: one issuer.
        let issuers = opts.runtime_threads.clamp(1, order.len().max(1));
        // The job's ranges (the load may have sized them below `chunk_bytes`: `tune::range_bytes`).
        let range_bytes = job.plan.reads().iter().map(|r| r.len_bytes).max().unwrap_or(1).max(1);
        self.range_bytes.store(range_bytes, Ordering::Relaxed);
        // The depth is bounded by the option, the budget (a range holds its length in budget
        // while in flight) and the job's ranges (more in flight than there are is none).
        let budget_depth = usize::try_from(job.budget.capacity_bytes() / range_bytes).unwrap_or(usize::MAX);
        let depth_max = opts.reads_inflight_max.min(budget_depth).min(order.len()).max(1);
        let tuner = Tuner::new(opts.tuning, depth_max, range_bytes);
        let retries_before = self.counters.retries.load(Ordering::Relaxed);
        let (paged, pages) = tokio::sync::mpsc::channel(PAGE_AHEAD_READS);
        let run = Run {
            backend: self,
            job,
            sink,
            order,
            pages: tokio::sync::Mutex::new(pages),
            stop: AtomicBool::new(false),
            fetcher: self.client.fetcher(&self.counters),
            tuner,
            issuers,
            lane_failure: Mutex::new(None),
        };
        let results = run.issue_on_threads(paged);
        *self.tune.lock().unwrap_or_else(|p| p.into_inner()) = Some(run.tuner.report());
        let mut total = merge_issuers(results).map_err(|f| read_error(job, f))?;
        total.retries = self.counters.retries.load(Ordering::Relaxed).saturating_sub(retries_before);
        total.peak_inflight_bytes = job.budget.peak_bytes();
        Ok(total)
    }
}

/// The `ReadError` a failed run returns. For a fetch that failed, it carries the typed cause
/// (`ReadErrorKind::Source`) and names the first byte that did not land, when the fetch knows it,
/// so the load layer names the tensor that byte belongs to, not the read's first one.
fn read_error(job: &Job<'_>, failure: Fail) -> ReadError {
    match failure {
        Fail::Read(e) => e,
        Fail::Remote { read, error } => {
            let r = &job.plan.reads()[read as usize];
            let (offset_bytes, len_bytes) = error.range().unwrap_or((r.offset_bytes, r.len_bytes));
            ReadError { file: r.file, offset_bytes, len_bytes, kind: ReadErrorKind::Source(Box::new(error)) }
        }
    }
}

/// A read claimed ahead, with its pages touched, or the claim's error.
type Paged<'j> = Result<(u32, ReadTarget<'j>), ReadError>;

/// One run of [`RemoteBackend::execute`]: the job, its single issue queue, and the state its
/// issuing threads share.
struct Run<'r, 'j> {
    backend: &'r RemoteBackend,
    job: &'r Job<'j>,
    sink: &'r dyn CompletionSink,
    /// Read indexes in issue order: the plan's queues one after another.
    order: Vec<u32>,
    /// Reads claimed ahead by the pager, in issue order, shared by every issuing thread.
    pages: tokio::sync::Mutex<tokio::sync::mpsc::Receiver<Paged<'r>>>,
    /// Set by the first failed range; every other range stops within [`STOP_POLL_INTERVAL`].
    stop: AtomicBool,
    fetcher: Fetcher<'r>,
    tuner: Tuner,
    issuers: usize,
    /// The first range the cache's lane could not land (it then stops the run too).
    lane_failure: Mutex<Option<ReadError>>,
}

impl<'r> Run<'r, '_> {
    /// The pager: claims the reads in issue order, at most [`PAGE_AHEAD_READS`] ahead of the
    /// issuing threads, and writes one byte per 4 KiB of each, so that the first-touch faults of
    /// a fresh arena (the kernel zeroing each page, which on a loaded machine costs more than the
    /// network copy) happen here, beside the transfers, not inside them.
    fn page_ahead(&self, paged: tokio::sync::mpsc::Sender<Paged<'r>>) {
        for &index in &self.order {
            if self.stop.load(Ordering::Relaxed) || self.job.cancel.load(Ordering::Relaxed) {
                return;
            }
            let item = self.job.claim(index).map(|mut target| {
                let buf = target.buf();
                for at in (0..buf.len()).step_by(PAGE_TOUCH_BYTES) {
                    buf[at] = 0;
                }
                (index, target)
            });
            let failed = item.is_err();
            if paged.blocking_send(item).is_err() || failed {
                return;
            }
        }
    }

    /// The next claimed read, `None` once the pager is done.
    async fn next_read(&self) -> Option<Paged<'r>> {
        if self.stop.load(Ordering::Relaxed) {
            return None;
        }
        self.pages.lock().await.recv().await
    }

    /// Read `index` of the plan into its claimed `target`: wait for budget, fill the range from
    /// `source` (racing a cancel or another range's failure), and land it, unless the source took
    /// it to land itself (the cache's lane threads do, once its pieces are written). The bytes it
    /// read.
    async fn fetch_one(
        &self,
        index: u32,
        target: ReadTarget<'r>,
        source: &(dyn RangeSource<'r> + '_),
    ) -> Result<u64, Fail> {
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
        let permit = job.budget.acquire_async(read.len_bytes).await;
        // Race the fill (its retries and backoff sleeps included) against a cancel or another
        // range's failure.
        let fill = source.fill(object, read.offset_bytes, target, permit);
        let halt = std::pin::pin!(stopped(job.cancel, &self.stop));
        match futures::future::select(fill, halt).await {
            futures::future::Either::Left((Ok(Some((target, permit))), _)) => {
                target.land(self.sink).map_err(Fail::Read)?;
                drop(permit);
                Ok(read.len_bytes)
            }
            futures::future::Either::Left((Ok(None), _)) => Ok(read.len_bytes),
            futures::future::Either::Left((Err(error), _)) => Err(Fail::Remote { read: index, error }),
            futures::future::Either::Right(((), _)) => Err(fail_with(ReadErrorKind::Cancelled)),
        }
    }

    /// This issuer's share of the tuner's depth (at least one range).
    fn share(&self, issuer: usize) -> usize {
        let depth = self.tuner.depth().max(self.issuers);
        inflight_shares(depth, self.issuers).get(issuer).copied().unwrap_or(1)
    }

    /// One issuing loop: take claimed reads from the pager and keep this issuer's share of the
    /// tuner's depth in flight on the client's runtime, until the queue is empty or a read fails
    /// (which stops the run). The tuner sees the load's byte counter on each landing and tick.
    fn issue(&self, issuer: usize, source: &(dyn RangeSource<'r> + '_)) -> Result<IoStats, Fail> {
        use futures::future::{Either, select};
        let mut stats = IoStats::default();
        let result = self.backend.client.runtime().block_on(async {
            let mut inflight = futures::stream::FuturesUnordered::new();
            let mut source_done = false;
            loop {
                let wants = !source_done && inflight.len() < self.share(issuer);
                // While the tuner probes, wake every tick: to show it the byte counter, and to
                // issue a depth it raised without waiting for a landing.
                let tick = async {
                    if self.tuner.probing() {
                        tokio::time::sleep(TUNE_TICK).await;
                    } else {
                        std::future::pending::<()>().await;
                    }
                };
                let next = std::pin::pin!(async {
                    if wants { self.next_read().await } else { std::future::pending().await }
                });
                let event = if wants && inflight.is_empty() {
                    Either::Left(next.await)
                } else {
                    match select(next, select(inflight.next(), std::pin::pin!(tick))).await {
                        Either::Left((paged, _)) => Either::Left(paged),
                        Either::Right((Either::Left((landed, _)), _)) => Either::Right(Some(landed)),
                        Either::Right((Either::Right(((), _)), _)) => Either::Right(None),
                    }
                };
                let landed = match event {
                    Either::Left(Some(Ok((i, target)))) => {
                        inflight.push(self.fetch_one(i, target, source));
                        continue;
                    }
                    Either::Left(Some(Err(e))) => return Err(Fail::Read(e)),
                    Either::Left(None) => {
                        source_done = true;
                        continue;
                    }
                    Either::Right(landed) => landed,
                };
                self.tuner.observe(self.backend.counters.bytes.load(Ordering::Relaxed), Instant::now());
                match landed {
                    // A tick.
                    None => {}
                    Some(Some(Ok(n))) => {
                        stats.reads += 1;
                        stats.bytes_read += n;
                    }
                    Some(Some(Err(f))) => {
                        // Every other in-flight range stops within STOP_POLL_INTERVAL.
                        self.stop.store(true, Ordering::Relaxed);
                        return Err(f);
                    }
                    Some(None) => return Ok(()),
                }
            }
        });
        result.map(|()| stats)
    }

    /// The pager on a thread of its own and one issuing loop per issuer (the first on this
    /// thread), reading from the store, or through the backend's layer (the cache), which runs
    /// its own threads around them (lanes writing fetched ranges into copies and landing them).
    /// Blocking on the client's runtime panics inside another runtime: then they all run on
    /// plain threads. The pager's channel closes when the issuers are done; how long the layer
    /// went on after that is added to the disk tail. A range the layer could not land is the
    /// run's failure too.
    fn issue_on_threads(&self, paged: tokio::sync::mpsc::Sender<Paged<'r>>) -> Vec<Result<IoStats, Fail>> {
        let land = |target: ReadTarget<'r>| {
            if let Err(e) = target.land(self.sink) {
                self.stop.store(true, Ordering::Relaxed);
                self.lane_failure.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(e);
            }
        };
        let (mut results, tail) = off_runtime(|| {
            let mut paged = Some(paged);
            let mut results = Vec::new();
            let mut issue = |source: &(dyn RangeSource<'r> + '_)| {
                if let Some(paged) = paged.take() {
                    results = self.issue_all(paged, source);
                }
            };
            let tail = match self.backend.layer.as_deref() {
                Some(layer) => layer.run(self.fetcher, self.job.keeps_mapping(), &land, &mut issue),
                None => {
                    issue(&self.fetcher);
                    None
                }
            };
            (results, tail)
        });
        if let Some(tail) = tail {
            let tail_nanos = u64::try_from(tail.as_nanos()).unwrap_or(u64::MAX);
            self.backend.disk_tail_nanos.fetch_add(tail_nanos, Ordering::Relaxed);
        }
        if let Some(e) = self.lane_failure.lock().unwrap_or_else(|p| p.into_inner()).take() {
            results.push(Err(Fail::Read(e)));
        }
        results
    }

    /// The pager and the issuing loops over `source`, until every issuer is done.
    fn issue_all(
        &self,
        paged: tokio::sync::mpsc::Sender<Paged<'r>>,
        source: &(dyn RangeSource<'r> + '_),
    ) -> Vec<Result<IoStats, Fail>> {
        std::thread::scope(|s| {
            let pager = s.spawn(move || self.page_ahead(paged));
            let handles: Vec<_> = (1..self.issuers).map(|i| s.spawn(move || self.issue(i, source))).collect();
            let mut results = vec![self.issue(0, source)];
            for h in handles {
                results.push(h.join().unwrap_or_else(|_| {
                    Err(Fail::Read(ReadError::run(ReadErrorKind::Io(std::io::Error::other(
                        "a remote issuing thread panicked",
                    )))))
                }))
            }
            // Unblock the pager if it waits on a full channel, then wait for it.
            self.stop.store(true, Ordering::Relaxed);
            self.pages.blocking_lock().close();
            let _ = pager.join();
            results
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
mod tests;
