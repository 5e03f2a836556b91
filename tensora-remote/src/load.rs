//! The load API: [`RemoteOptions`] in, [`RemoteLoaded`] (a `tensora_io::Loaded`) or a streamed
//! load's [`RemoteReport`] out. Loads go through `tensora_io::load` / `load_streaming` with a
//! [`RemoteBackend`], so selection, priority, streaming, hooks and the report are the local ones.

use std::collections::HashMap;
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use tensora_format::Checkpoint;
use tensora_io::{
    BackendChoice, BoxError, LoadOptions, LoadReport, Loaded, ShardRead, ShareLoad, ShareOf, TensorRef,
};

use crate::backend::RemoteBackend;
use crate::checkpoint::RemoteCheckpoint;
use crate::client::Client;
use crate::fetch::{Footprint, Layer, RetryPolicy, Unversioned};
use crate::location::ClientTimeouts;
use crate::tune::{TuneReport, Tuning};
use crate::{CacheOptions, CacheReport, CacheSync, Location, RemoteError, StoreConfig};

/// Most ranges in flight that [`RemoteOptions::validate`] accepts.
pub const READS_INFLIGHT_LIMIT: usize = 1024;
/// Most runtime threads that [`RemoteOptions::validate`] accepts.
pub const RUNTIME_THREADS_LIMIT: usize = 64;

/// How to reach the store and how hard to pull.
///
/// | field | default | meaning |
/// |---|---|---|
/// | `chunk_bytes` | 8 MiB | size of one ranged GET (with `Auto` tuning the most: a load of fewer than 32 such ranges gets shorter ones, down to 1 MiB, [`crate::range_bytes`]) |
/// | `reads_inflight_max` | 128 | most ranges in flight (one connection each); the byte cap is `chunk_bytes × reads_inflight_max` ([`Landing`]) |
/// | `streamed_bytes_max` | 256 MiB | most bytes in flight in a load that streams through a reused window (its memory) |
/// | `tuning` | `Auto` | the depth probes upward from 64 while throughput grows (see [`Tuning`]); `Fixed` keeps `reads_inflight_max` |
/// | `rate_min_bytes_per_s` | 2 MB/s | the slowest healthy link, all ranges in flight together: one attempt may take `request_overhead + remaining × reads_inflight_max / rate`, and a response that sends no byte for `request_overhead` is retried |
/// | `request_overhead` | 5 s | per-attempt allowance for connecting and the first byte, and the longest a response may send nothing |
/// | `connect_timeout` | 5 s | TCP/TLS connect |
/// | `retry` | [`RetryPolicy::default`] | retries per range and retry time, per failure episode (`HEADWAY_BYTES_MIN`) |
/// | `cache` | none | a verified local cache ([`CacheOptions`]): written in the same pass, durable behind the load ([`RemoteLoaded::wait_cache`]), resume, offline |
/// | `open_deadline` | 120 s | the most one open may take, every request and retry included |
/// | `unversioned` | `Refuse` | objects with neither ETag nor Last-Modified: refused, or `Allow`ed |
/// | `runtime_threads` | 2 | tokio worker threads driving the connections, and as many threads issuing reads and copying bodies; 0: one event loop on the calling thread does it all (like `curl --parallel`) |
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteOptions {
    /// How to reach the store (endpoint, credentials, plain HTTP, anonymous).
    pub store: StoreConfig,
    /// Size of one ranged GET (the load's read size); with [`Tuning::Auto`] the most, see
    /// [`crate::range_bytes`].
    pub chunk_bytes: u64,
    /// Ranges in flight at once, one connection each; 1..=[`READS_INFLIGHT_LIMIT`]. With
    /// [`Tuning::Auto`] the most the controller may go to, with [`Tuning::Fixed`] the depth.
    pub reads_inflight_max: usize,
    /// The most bytes in flight in a load whose ranges land in a reused window
    /// ([`Landing::Window`]: `load_streaming`, a collective load's windows): there the bytes in
    /// flight are the load's memory. A whole load's ranges land in an arena that holds the whole
    /// selection anyway, so only `reads_inflight_max` bounds it.
    pub streamed_bytes_max: u64,
    /// Whether the depth tunes itself (the default) or stays at `reads_inflight_max`.
    pub tuning: Tuning,
    /// The slowest rate a healthy link sustains, all `reads_inflight_max` ranges in flight
    /// together (they share it): one attempt may take `request_overhead + remaining bytes ×
    /// reads_inflight_max / rate` ([`RemoteOptions::connection_rate_min_bytes_per_s`]). A
    /// connection that stops is found sooner: an attempt whose response sends no byte for
    /// `request_overhead` is retried.
    pub rate_min_bytes_per_s: u64,
    /// Per-attempt allowance for connecting and the first byte, and the longest a response may
    /// send nothing before its attempt is retried.
    pub request_overhead: Duration,
    /// Bound on a TCP/TLS connect.
    pub connect_timeout: Duration,
    /// Retries and retry time per range.
    pub retry: RetryPolicy,
    /// Tokio worker threads (and as many issuing threads); 0: one event loop on the calling
    /// thread. At most [`RUNTIME_THREADS_LIMIT`].
    pub runtime_threads: usize,
    /// Objects whose server sends neither an ETag nor a Last-Modified date: refused (the
    /// default) or loaded anyway.
    pub unversioned: Unversioned,
    /// The most one open may take, all its requests and retries included
    /// ([`RemoteError::OpenDeadline`] after it).
    pub open_deadline: Duration,
    /// The verified local cache (see [`CacheOptions`]); none by default.
    pub cache: Option<CacheOptions>,
}

impl Default for RemoteOptions {
    fn default() -> Self {
        RemoteOptions {
            store: StoreConfig::default(),
            chunk_bytes: 8 << 20,
            reads_inflight_max: 128,
            streamed_bytes_max: 256 << 20,
            tuning: Tuning::Auto,
            rate_min_bytes_per_s: 2_000_000,
            request_overhead: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(5),
            retry: RetryPolicy::default(),
            runtime_threads: 2,
            unversioned: Unversioned::Refuse,
            open_deadline: Duration::from_secs(120),
            cache: None,
        }
    }
}

/// Where a load's ranges land, which decides what bounds the bytes in flight
/// ([`RemoteOptions::inflight_bytes_max`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Landing {
    /// In an arena that holds the whole selection (`load`, `load_share`): a range in flight
    /// costs no memory of its own.
    Whole,
    /// In a window reused from window to window (`load_streaming`, `load_share_runs`): the
    /// bytes in flight are the load's memory.
    Window,
}

impl RemoteOptions {
    /// Checks every knob is in range.
    pub fn validate(&self) -> Result<(), RemoteError> {
        let bad = |field, reason: String| Err(RemoteError::Options { field, reason });
        if self.chunk_bytes == 0 {
            return bad("chunk_bytes", "must be at least 1".into());
        }
        if !(1..=READS_INFLIGHT_LIMIT).contains(&self.reads_inflight_max) {
            return bad("reads_inflight_max", format!("must be 1..={READS_INFLIGHT_LIMIT}"));
        }
        if self.runtime_threads > RUNTIME_THREADS_LIMIT {
            return bad("runtime_threads", format!("must be 0..={RUNTIME_THREADS_LIMIT}"));
        }
        if self.open_deadline.is_zero() {
            return bad("open_deadline", "must be above 0".into());
        }
        if self.rate_min_bytes_per_s == 0 {
            return bad("rate_min_bytes_per_s", "must be at least 1".into());
        }
        if self.streamed_bytes_max == 0 {
            return bad("streamed_bytes_max", "must be at least 1".into());
        }
        if self.inflight_bytes_max(Landing::Whole).is_none() {
            return bad("chunk_bytes", "chunk_bytes × reads_inflight_max overflows".into());
        }
        Ok(())
    }

    /// The in-flight byte cap of a load whose ranges land as `landing` says:
    /// `chunk_bytes × reads_inflight_max`, and at most `streamed_bytes_max` for a window.
    ///
    /// ```
    /// use tensora_remote::{Landing, RemoteError, RemoteOptions};
    /// let opts = RemoteOptions { reads_inflight_max: 8, streamed_bytes_max: 40 << 20, ..RemoteOptions::default() };
    /// assert_eq!(opts.inflight_bytes_max(Landing::Whole), Some(8 * (8 << 20)));
    /// assert_eq!(opts.inflight_bytes_max(Landing::Window), Some(40 << 20));
    /// let zero = RemoteOptions { streamed_bytes_max: 0, ..opts };
    /// assert!(matches!(zero.validate(), Err(RemoteError::Options { field: "streamed_bytes_max", .. })));
    /// ```
    pub fn inflight_bytes_max(&self, landing: Landing) -> Option<u64> {
        let ranges = self.chunk_bytes.checked_mul(self.reads_inflight_max as u64)?;
        Some(match landing {
            Landing::Whole => ranges,
            Landing::Window => ranges.min(self.streamed_bytes_max),
        })
    }

    /// The slowest rate one connection is allowed: its share of the slowest healthy link
    /// (`rate_min_bytes_per_s`) when `reads_inflight_max` ranges share it (at least 1 B/s).
    /// With a minimum of 2 MB/s per connection instead, a link below 0.9 MB/s per range in
    /// flight (230 Mbit/s at 32 in flight) timed every attempt out, and a range that kept timing
    /// out past the retry time failed the load.
    ///
    /// ```
    /// use tensora_remote::RemoteOptions;
    /// let opts = RemoteOptions { rate_min_bytes_per_s: 2_000_000, reads_inflight_max: 100, ..RemoteOptions::default() };
    /// assert_eq!(opts.connection_rate_min_bytes_per_s(), 20_000);
    /// let one = RemoteOptions { rate_min_bytes_per_s: 0, ..opts };
    /// assert_eq!(one.connection_rate_min_bytes_per_s(), 1);
    /// ```
    pub fn connection_rate_min_bytes_per_s(&self) -> u64 {
        (self.rate_min_bytes_per_s / self.reads_inflight_max.max(1) as u64).max(1)
    }

    pub(crate) fn timeouts(&self) -> ClientTimeouts {
        let chunk =
            Duration::from_secs_f64(self.chunk_bytes as f64 / self.connection_rate_min_bytes_per_s() as f64);
        ClientTimeouts {
            connect: self.connect_timeout,
            request: self.request_overhead + chunk,
            idle_per_host: self.reads_inflight_max,
        }
    }
}

/// What a remote load did: the same fields as a local load's report (`retries` counts this
/// load's HTTP retries, each resuming where the previous attempt stopped), plus the requests this
/// load sent, and, in fields of their own, what opening the checkpoint cost (the same figures for
/// every load of one opened checkpoint: they are not part of any load's `requests`).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RemoteReport {
    /// The load layer's report (bytes, phases, throughput), with `retries` counting HTTP retries.
    #[serde(flatten)]
    pub load: LoadReport,
    /// The location loaded.
    pub url: String,
    /// HTTP requests this load sent (GETs, retries included).
    pub requests: u64,
    /// Total time this load's ranges spent between their first failure and their success or
    /// final failure.
    pub retry_seconds: f64,
    /// HTTP requests sent to open the checkpoint (HEADs and header/index GETs, retries included).
    pub open_requests: u64,
    /// Retries while opening the checkpoint.
    pub open_retries: u64,
    /// Retry time while opening the checkpoint.
    pub open_retry_seconds: f64,
    /// The in-flight byte cap (`chunk_bytes × reads_inflight_max`, or the load's smaller budget).
    pub inflight_bytes_max: u64,
    /// What the cache did for this load (`None` without a cache).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache: Option<CacheReport>,
    /// What the concurrency controller did: the depth it settled on, the windows it measured,
    /// and why (`None` for a load from cached local files).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<TuneReport>,
}

/// A loaded remote checkpoint: a `tensora_io::Loaded` (every selected tensor's bytes) with the
/// checkpoint it came from and the remote report.
#[derive(Debug)]
pub struct RemoteLoaded {
    checkpoint: RemoteCheckpoint,
    loaded: Loaded,
    report: RemoteReport,
    /// The cache's write-behind, while it runs (joined by [`RemoteLoaded::wait_cache`] or on drop).
    cache_sync: Option<CacheSync>,
}

impl RemoteLoaded {
    /// The checkpoint the tensors were loaded from.
    pub fn checkpoint(&self) -> &RemoteCheckpoint {
        &self.checkpoint
    }
    /// What the load did: bytes, time, requests and retries.
    pub fn report(&self) -> &RemoteReport {
        &self.report
    }
    /// The loaded tensors, as from a local load. Its `Loaded` hands out writable pointers
    /// (`tensor_mut_ptr`), so while the cache's copies are still being written behind the load,
    /// this first seals the pieces not written yet (see [`RemoteLoaded::take_cache_sync`]): a
    /// tensor changed through them is then left out of the cache, never recorded.
    pub fn loaded(&self) -> &Loaded {
        self.seal_unwritten();
        &self.loaded
    }
    /// Take the CRC-32C of every piece the write-behind has not written yet, from this load's
    /// memory, before the caller can change it.
    fn seal_unwritten(&self) {
        if let Some(sync) = self.cache_sync.as_ref() {
            sync.seal(|range| self.loaded.arena_bytes(range));
        }
    }
    /// The tensor called `name`, if it was selected.
    pub fn tensor(&self, name: &str) -> Option<TensorRef<'_>> {
        self.loaded.tensor(name)
    }
    /// Every loaded tensor.
    pub fn tensors(&self) -> impl Iterator<Item = TensorRef<'_>> {
        self.loaded.tensors()
    }
    /// Number of loaded tensors.
    pub fn len(&self) -> usize {
        self.loaded.len()
    }
    /// Whether no tensor was loaded.
    pub fn is_empty(&self) -> bool {
        self.loaded.is_empty()
    }
    /// Wait until the copies this load wrote into the cache are durable and promoted (with a
    /// cache, a load returns as soon as its tensors are in memory: the `fsync`s and renames run
    /// behind it, see [`CacheSync`]). The report's `cache` then counts them in `promoted`, with
    /// `sync_seconds`. Returns at once without a cache or once done; dropping this value waits too.
    pub fn wait_cache(&mut self) -> &RemoteReport {
        if let (Some(sync), Some(cache)) = (self.cache_sync.take(), self.report.cache.as_mut()) {
            sync.wait(cache);
        }
        &self.report
    }
    /// The cache's write-behind, taken from this value, for a caller that waits for it elsewhere
    /// (the Python bindings wait for every one at interpreter exit): neither dropping this value
    /// nor [`RemoteLoaded::into_loaded`] waits for it then, and the report's `cache` stays as
    /// the load left it (`promoting` copies, the bytes written so far). `None` without one.
    ///
    /// The tensors may then change before their copies are written, so this first takes the
    /// CRC-32C of every piece not written yet (on this thread, about 30 GB/s), and a piece is
    /// recorded only if the disk holds those bytes (`cache.sealed_bytes` counts them, and
    /// `changed_bytes` what was left out).
    pub fn take_cache_sync(&mut self) -> Option<CacheSync> {
        self.seal_unwritten();
        let sync = self.cache_sync.take()?;
        if let Some(cache) = self.report.cache.as_mut() {
            cache.sealed_bytes = sync.sealed_bytes();
        }
        Some(sync)
    }
    /// The `tensora_io::Loaded`, by value, once the cache's write-behind is done (see
    /// [`RemoteLoaded::wait_cache`]).
    pub fn into_loaded(mut self) -> Loaded {
        self.wait_cache();
        self.loaded
    }
}

/// Open a remote checkpoint: read its index and every header with ranged requests (the first 8
/// bytes, then exactly `n` more), never tensor data. The result keeps the client (connections,
/// runtime) for its loads.
///
/// ```
/// use tensora_remote::{Location, RemoteOptions, open_remote};
/// // A local path is not a remote location: the CLI sends it to tensora_io instead.
/// let err = open_remote(&Location::parse("/tmp/x.safetensors")?, &RemoteOptions::default()).unwrap_err();
/// assert!(matches!(err, tensora_remote::RemoteError::NotRemote { .. }));
/// # Ok::<(), tensora_remote::RemoteError>(())
/// ```
pub fn open_remote(location: &Location, opts: &RemoteOptions) -> Result<RemoteCheckpoint, RemoteError> {
    let t0 = Instant::now();
    let client = Client::connect(location, opts)?;
    let connect_seconds = t0.elapsed().as_secs_f64();
    crate::checkpoint::open(location, client, opts.cache.as_ref(), connect_seconds)
}

/// Load every tensor of the checkpoint at `location` into memory: [`open_remote`], then
/// [`RemoteCheckpoint::load`] with the default `LoadOptions`.
///
/// On any failure nothing is returned: no partial model, and an object replaced mid-load is
/// [`RemoteError::Changed`].
///
/// ```
/// use tensora_remote::{Location, RemoteOptions, load_remote};
/// let opts = RemoteOptions { reads_inflight_max: 0, ..RemoteOptions::default() };
/// let err = load_remote(&Location::parse("http://127.0.0.1:9/m/")?, &opts).unwrap_err();
/// assert!(matches!(err, tensora_remote::RemoteError::Options { field: "reads_inflight_max", .. }));
/// # Ok::<(), tensora_remote::RemoteError>(())
/// ```
pub fn load_remote(location: &Location, opts: &RemoteOptions) -> Result<RemoteLoaded, RemoteError> {
    open_remote(location, opts)?.load(&LoadOptions::default())
}

/// Where one load reads from.
enum Route {
    /// The store, with the layer in front of it (the cache, when there is one) read first and
    /// written through.
    Remote(Option<Arc<dyn Layer>>),
    /// Complete local copies in the cache, loaded by `tensora_io` like any local checkpoint,
    /// each held by the layer (a shared lock) until the load ends.
    Local(Checkpoint, Arc<dyn Layer>),
}

impl RemoteCheckpoint {
    /// Lock this load's objects in the cache, and pick the route: local files when every object
    /// is complete there. The copies a load writes keep their pages cached when its footprint
    /// (`load`'s selection, landing as `landing` says) fits the page cache's rule.
    fn route(&self, load: &LoadOptions, landing: Landing) -> Route {
        let Some(front) = self.front() else { return Route::Remote(None) };
        let (layer, files) = front.load_layer(self.objects(), self.footprint(load, landing));
        if let Some(files) = files {
            let local: HashMap<String, PathBuf> =
                self.objects().iter().map(|o| o.url.clone()).zip(files).collect();
            match self.rebuild().relocated(self.checkpoint(), &local) {
                Ok(checkpoint) => return Route::Local(checkpoint, layer),
                Err(why) => layer.note(format!("{}: the cached copies were not used: {why}", self.url())),
            }
        }
        Route::Remote(Some(layer))
    }

    /// What a load with `load` puts in memory: its selection (all of it when the selection does
    /// not resolve: the load then fails with its own error), into an arena of that size or a
    /// window of at most the in-flight cap.
    fn footprint(&self, load: &LoadOptions, landing: Landing) -> Footprint {
        let checkpoint = self.checkpoint();
        let selected_bytes = checkpoint.select(&load.selection).map_or_else(
            |_| checkpoint.files().iter().map(|f| f.len_bytes()).sum(),
            |selected| checkpoint.distinct_bytes(&selected),
        );
        let destination_bytes = match landing {
            Landing::Whole => selected_bytes,
            Landing::Window => {
                let cap = self.client().opts.inflight_bytes_max(landing).unwrap_or(u64::MAX);
                selected_bytes.min(cap).min(load.budget_bytes)
            }
        };
        Footprint { to_cache_bytes: selected_bytes, destination_bytes }
    }

    /// `load` with a [`RemoteBackend`] of this checkpoint; chunk size and in-flight cap from the
    /// [`RemoteOptions`] it was opened with (the budget is the smaller of `load.budget_bytes`
    /// and [`RemoteOptions::inflight_bytes_max`] for `landing`).
    fn load_options(
        &self,
        load: &LoadOptions,
        layer: Option<Arc<dyn Layer>>,
        landing: Landing,
    ) -> (LoadOptions, Arc<RemoteBackend>, u64) {
        let backend = Arc::new(RemoteBackend::new(self).with_layer(layer));
        let remote = &self.client().opts;
        let cap = remote.inflight_bytes_max(landing).unwrap_or(u64::MAX).min(load.budget_bytes);
        // A self-tuned load of fewer than LOAD_RANGES_MIN chunks gets shorter ranges (`range_bytes`).
        // A selection that does not resolve fails the load itself, with its own error.
        let chunk_bytes = match (remote.tuning, self.checkpoint().select(&load.selection)) {
            (Tuning::Auto, Ok(selected)) => {
                crate::tune::range_bytes(self.checkpoint().distinct_bytes(&selected), remote.chunk_bytes)
            }
            _ => remote.chunk_bytes,
        };
        let opts = LoadOptions {
            backend: BackendChoice::Custom(backend.clone()),
            chunk_bytes,
            budget_bytes: cap,
            ..load.clone()
        };
        (opts, backend, cap)
    }

    /// The report of a load through `backend`, with the cache's report (the disk tail filled in).
    fn finish_report(
        &self,
        mut load: LoadReport,
        backend: &RemoteBackend,
        cap: u64,
        cache: Option<CacheReport>,
    ) -> RemoteReport {
        let counts = backend.counts();
        load.retries = counts.retries;
        let remote = &self.client().opts;
        let tune = backend.tune_report();
        let depth = tune.as_ref().map_or_else(|| remote.reads_inflight_max.to_string(), |t| t.reason.clone());
        load.reason = format!(
            "object_store ranged GETs of {} KiB, one queue across {} objects, {depth}",
            backend.range_bytes() >> 10,
            self.objects().len()
        );
        load.io_mode = "streamed".to_owned();
        let mut report = self.report(load, cap);
        report.requests = counts.requests;
        report.retry_seconds = counts.retry_nanos as f64 / 1e9;
        report.concurrency = tune;
        report.cache = cache.map(|c| CacheReport { disk_tail_seconds: backend.disk_tail_seconds(), ..c });
        report
    }

    /// The report of a load from complete cached copies: no request was sent.
    fn local_report(&self, mut load: LoadReport, cache: CacheReport) -> RemoteReport {
        load.reason = format!("complete copies in the cache {}: {}", cache.dir, load.reason);
        let mut report = self.report(load, 0);
        report.cache = Some(cache);
        report
    }

    fn report(&self, mut load: LoadReport, cap: u64) -> RemoteReport {
        let open = self.open_counts();
        load.phases.open += self.connect_seconds();
        load.phases.parse += self.parse_seconds();
        load.finalize();
        RemoteReport {
            load,
            url: self.url(),
            requests: 0,
            retry_seconds: 0.0,
            open_requests: open.requests,
            open_retries: open.retries,
            open_retry_seconds: open.retry_nanos as f64 / 1e9,
            inflight_bytes_max: cap,
            cache: None,
            concurrency: None,
        }
    }

    /// The load layer's error, with the backend's typed cause (carried as
    /// `ReadErrorKind::Source`) when a fetch failed: then the load layer's file, offset and
    /// tensor name it, around the remote cause.
    fn error(e: tensora_io::LoadError) -> RemoteError {
        use tensora_io::{LoadError, ReadErrorKind};
        match e {
            LoadError::Read {
                path,
                offset_bytes,
                len_bytes,
                tensor,
                kind: ReadErrorKind::Source(source),
            } => match source.downcast::<RemoteError>() {
                Ok(cause) => RemoteError::Read {
                    url: path.to_string_lossy().into_owned(),
                    tensor,
                    offset_bytes,
                    source: cause,
                },
                Err(other) => RemoteError::Load(LoadError::Read {
                    path,
                    offset_bytes,
                    len_bytes,
                    tensor,
                    kind: ReadErrorKind::Source(other),
                }),
            },
            LoadError::Backend { backend, kind: ReadErrorKind::Source(source) } => {
                match source.downcast::<RemoteError>() {
                    Ok(cause) => *cause,
                    Err(other) => {
                        RemoteError::Load(LoadError::Backend { backend, kind: ReadErrorKind::Source(other) })
                    }
                }
            }
            other => RemoteError::Load(other),
        }
    }

    /// Load the tensors `load` selects (selection, priority, hooks, arena reuse as for a local
    /// `tensora_io::load`) from the objects. Every range is conditional on the object version
    /// seen at open; nothing partial is returned on failure. With a cache, complete cached
    /// copies are loaded as local files, other objects are read from the store and written
    /// through.
    pub fn load(&self, load: &LoadOptions) -> Result<RemoteLoaded, RemoteError> {
        let layer = match self.route(load, Landing::Whole) {
            Route::Local(checkpoint, layer) => {
                let loaded = tensora_io::load(&checkpoint, load);
                layer.add_local(
                    checkpoint.files().len() as u64,
                    loaded.as_ref().map_or(0, |l| l.report().bytes_read),
                );
                let cache = layer.finish();
                let loaded = loaded?;
                let report = self.local_report(loaded.report().clone(), cache);
                return Ok(RemoteLoaded { checkpoint: self.clone(), loaded, report, cache_sync: None });
            }
            Route::Remote(layer) => layer,
        };
        let (opts, backend, cap) = self.load_options(load, layer.clone(), Landing::Whole);
        let loaded = tensora_io::load(self.checkpoint(), &opts).map_err(RemoteCheckpoint::error);
        // On failure too: copies this load completed before it failed are kept (behind it).
        let (cache, cache_sync) = layer.map(|l| l.finish_behind()).unzip();
        let loaded = loaded?;
        let report = self.finish_report(loaded.report().clone(), &backend, cap, cache);
        Ok(RemoteLoaded { checkpoint: self.clone(), loaded, report, cache_sync: cache_sync.flatten() })
    }

    /// `tensora_io::load_streaming` from the objects: `f` gets each tensor as soon as its bytes
    /// landed, and arena memory stays within the in-flight cap (see [`RemoteCheckpoint::load`]).
    pub fn load_streaming(
        &self,
        load: &LoadOptions,
        f: impl FnMut(&TensorRef<'_>) -> Result<(), BoxError>,
    ) -> Result<RemoteReport, RemoteError> {
        let layer = match self.route(load, Landing::Window) {
            Route::Local(checkpoint, layer) => {
                let streamed = tensora_io::load_streaming(&checkpoint, load, f);
                layer.add_local(
                    checkpoint.files().len() as u64,
                    streamed.as_ref().map_or(0, |r| r.bytes_read),
                );
                let cache = layer.finish();
                return Ok(self.local_report(streamed?, cache));
            }
            Route::Remote(layer) => layer,
        };
        let (opts, backend, cap) = self.load_options(load, layer.clone(), Landing::Window);
        let streamed =
            tensora_io::load_streaming(self.checkpoint(), &opts, f).map_err(RemoteCheckpoint::error);
        let cache = layer.map(|l| l.finish());
        Ok(self.finish_report(streamed?, &backend, cap, cache))
    }

    /// How a sharded load (`load.shard`) would read each selected tensor from the objects
    /// (`tensora_io::shard_reads` through this store's backend), without reading any tensor.
    pub fn shard_reads(&self, load: &LoadOptions) -> Result<Vec<ShardRead>, RemoteError> {
        let (opts, _, _) = self.load_options(load, None, Landing::Whole);
        tensora_io::shard_reads(self.checkpoint(), &opts).map_err(RemoteCheckpoint::error)
    }

    /// Rank `share`'s share of a collective load from the objects (`tensora_io::load_share` with a
    /// [`RemoteBackend`]): the same regions on every rank, this rank's reads only, conditional on
    /// the versions seen at open. The report's `bytes_read` and `requests` are this rank's. A
    /// checkpoint opened with a cache is refused: the ranks would wait on each other's object
    /// locks (load once through the cache instead, then share the local copy).
    pub fn load_share(
        &self,
        load: &LoadOptions,
        share: ShareOf,
    ) -> Result<(ShareLoad, RemoteReport), RemoteError> {
        self.refuse_shared_cache()?;
        let (opts, backend, cap) = self.load_options(load, None, Landing::Whole);
        let loaded =
            tensora_io::load_share(self.checkpoint(), &opts, share).map_err(RemoteCheckpoint::error)?;
        let report = self.finish_report(loaded.report().clone(), &backend, cap, None);
        Ok((loaded, report))
    }

    /// [`RemoteCheckpoint::load_share`] window by window (`tensora_io::load_share_runs`; windows
    /// of at most the in-flight cap): `f` gets each window's share as soon as it is loaded and
    /// says whether to go on. One backend serves every window; each window's transfer tunes its
    /// own depth, within the window's budget (`streamed_bytes_max` over `chunk_bytes` ranges: 32
    /// by default, which is where the tuner starts).
    pub fn load_share_runs(
        &self,
        load: &LoadOptions,
        share: ShareOf,
        mut f: impl FnMut(ShareLoad) -> ControlFlow<()>,
    ) -> Result<(), RemoteError> {
        self.refuse_shared_cache()?;
        let (opts, _, _) = self.load_options(load, None, Landing::Window);
        let runs =
            tensora_io::load_share_runs(self.checkpoint(), &opts, share).map_err(RemoteCheckpoint::error)?;
        for window in runs {
            if f(window.map_err(RemoteCheckpoint::error)?).is_break() {
                break;
            }
        }
        Ok(())
    }

    fn refuse_shared_cache(&self) -> Result<(), RemoteError> {
        if self.front().is_none() {
            return Ok(());
        }
        Err(RemoteError::Load(tensora_io::LoadError::Unsupported {
            what: "a collective load through a cache (every rank would wait on the others' object locks); \
                   open the checkpoint without a cache"
                .to_owned(),
        }))
    }
}
