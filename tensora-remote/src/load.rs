//! The load API: [`RemoteOptions`] in, [`RemoteLoaded`] (tensor bytes in a hugepage arena) and
//! [`RemoteReport`] out.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde::Serialize;
use tensora_io::arena::Arena;
use tensora_io::report::{Faults, peak_rss_bytes};
use tensora_io::{CompletionSink, LoadReport, Phases, StopReason};
use tensora_plan::{Budget, Extent, Order, Plan, PlanConfig};

use crate::checkpoint::{RemoteCheckpoint, RemoteTensor};
use crate::executor::RemoteExecutor;
use crate::fetch::{Counters, Fetcher, RetryPolicy};
use crate::location::{ClientTimeouts, build_store};
use crate::{Location, RemoteError, StoreConfig};

/// Most ranges in flight that [`RemoteOptions::validate`] accepts.
pub const READS_INFLIGHT_LIMIT: usize = 1024;
/// Most runtime threads that [`RemoteOptions::validate`] accepts.
pub const RUNTIME_THREADS_LIMIT: usize = 64;

/// How to reach the store and how hard to pull.
///
/// | field | default | meaning |
/// |---|---|---|
/// | `chunk_bytes` | 8 MiB | size of one ranged GET |
/// | `reads_inflight_max` | 16 | ranges in flight (one connection each); the byte cap is `chunk_bytes × reads_inflight_max` |
/// | `rate_min_bytes_per_s` | 2 MB/s | the slowest healthy rate: one attempt may take `request_overhead + remaining / rate` |
/// | `request_overhead` | 5 s | per-attempt allowance for connecting and the first byte |
/// | `connect_timeout` | 5 s | TCP/TLS connect |
/// | `retry` | [`RetryPolicy::default`] | retries per range and retry time |
/// | `runtime_threads` | 2 | tokio worker threads driving the connections |
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteOptions {
    pub store: StoreConfig,
    pub chunk_bytes: u64,
    pub reads_inflight_max: usize,
    pub rate_min_bytes_per_s: u64,
    pub request_overhead: Duration,
    pub connect_timeout: Duration,
    pub retry: RetryPolicy,
    pub runtime_threads: usize,
}

impl Default for RemoteOptions {
    fn default() -> Self {
        RemoteOptions {
            store: StoreConfig::default(),
            chunk_bytes: 8 << 20,
            reads_inflight_max: 16,
            rate_min_bytes_per_s: 2_000_000,
            request_overhead: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(5),
            retry: RetryPolicy::default(),
            runtime_threads: 2,
        }
    }
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
        if !(1..=RUNTIME_THREADS_LIMIT).contains(&self.runtime_threads) {
            return bad("runtime_threads", format!("must be 1..={RUNTIME_THREADS_LIMIT}"));
        }
        if self.rate_min_bytes_per_s == 0 {
            return bad("rate_min_bytes_per_s", "must be at least 1".into());
        }
        if self.inflight_bytes_max().is_none() {
            return bad("chunk_bytes", "chunk_bytes × reads_inflight_max overflows".into());
        }
        Ok(())
    }

    /// The in-flight byte cap: `chunk_bytes × reads_inflight_max`.
    pub fn inflight_bytes_max(&self) -> Option<u64> {
        self.chunk_bytes.checked_mul(self.reads_inflight_max as u64)
    }

    fn timeouts(&self) -> ClientTimeouts {
        let chunk =
            Duration::from_secs_f64(self.chunk_bytes as f64 / self.rate_min_bytes_per_s.max(1) as f64);
        ClientTimeouts {
            connect: self.connect_timeout,
            request: self.request_overhead + chunk,
            idle_per_host: self.reads_inflight_max,
        }
    }
}

/// What a remote load did: the same fields as a local load's report, plus request counts.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RemoteReport {
    #[serde(flatten)]
    pub load: LoadReport,
    /// The location loaded.
    pub url: String,
    /// HTTP requests sent (HEAD and GET, retries included).
    pub requests: u64,
    /// Requests that were retries (each resumed where the previous one stopped).
    pub retries: u64,
    /// Total time ranges spent between their first failure and their success or final failure.
    pub retry_seconds: f64,
    /// The in-flight byte cap.
    pub inflight_bytes_max: u64,
}

/// A loaded remote checkpoint: every tensor's bytes in one arena.
#[derive(Debug)]
pub struct RemoteLoaded {
    checkpoint: RemoteCheckpoint,
    arena: Arena,
    /// Arena offset of each tensor, by index in `checkpoint.tensors()`.
    offsets: Vec<u64>,
    report: RemoteReport,
}

/// One tensor of a [`RemoteLoaded`], with its bytes.
#[derive(Debug, Clone, Copy)]
pub struct RemoteTensorRef<'a> {
    pub info: &'a RemoteTensor,
    pub bytes: &'a [u8],
}

/// Read access to a [`RemoteLoaded`]'s tensors (the arena hands out slices only through `&mut`).
#[derive(Debug)]
pub struct RemoteTensors<'a> {
    checkpoint: &'a RemoteCheckpoint,
    data: &'a [u8],
    offsets: &'a [u64],
}

impl<'a> RemoteTensors<'a> {
    fn at(&self, index: usize) -> Option<RemoteTensorRef<'a>> {
        let info = self.checkpoint.tensors().get(index)?;
        let start = usize::try_from(*self.offsets.get(index)?).ok()?;
        let bytes = self.data.get(start..start.checked_add(usize::try_from(info.len_bytes()).ok()?)?)?;
        Some(RemoteTensorRef { info, bytes })
    }
    /// The tensor called `name`.
    pub fn get(&self, name: &str) -> Option<RemoteTensorRef<'a>> {
        self.at(self.checkpoint.tensor_index(name)?)
    }
    /// Every tensor, in (file, offset) order.
    pub fn iter(&self) -> impl Iterator<Item = RemoteTensorRef<'a>> + '_ {
        (0..self.checkpoint.tensors().len()).filter_map(|i| self.at(i))
    }
}

impl RemoteLoaded {
    pub fn checkpoint(&self) -> &RemoteCheckpoint {
        &self.checkpoint
    }
    pub fn report(&self) -> &RemoteReport {
        &self.report
    }
    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.offsets.len()
    }
    pub fn is_empty(&self) -> bool {
        self.offsets.is_empty()
    }
    /// Borrow the tensors' bytes.
    pub fn tensors(&mut self) -> RemoteTensors<'_> {
        RemoteTensors { checkpoint: &self.checkpoint, data: self.arena.as_slice(), offsets: &self.offsets }
    }
}

impl Drop for RemoteLoaded {
    /// Park the arena for the next load (`tensora_io::arena::Arena::recycle`).
    fn drop(&mut self) {
        std::mem::replace(&mut self.arena, Arena::empty()).recycle();
    }
}

fn runtime(opts: &RemoteOptions) -> Result<tokio::runtime::Runtime, RemoteError> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(opts.runtime_threads)
        .enable_all()
        .build()
        .map_err(|source| RemoteError::Resource { what: "cannot start the async runtime", source })
}

/// Open a remote checkpoint: read its index and every header with ranged requests (the first 8
/// bytes, then exactly `n` more), never tensor data.
///
/// ```
/// use tensora_remote::{Location, RemoteOptions, open_remote};
/// // A local path is not a remote location: the CLI sends it to tensora_io instead.
/// let err = open_remote(&Location::parse("/tmp/x.safetensors")?, &RemoteOptions::default()).unwrap_err();
/// assert!(matches!(err, tensora_remote::RemoteError::NotRemote { .. }));
/// # Ok::<(), tensora_remote::RemoteError>(())
/// ```
pub fn open_remote(location: &Location, opts: &RemoteOptions) -> Result<RemoteCheckpoint, RemoteError> {
    opts.validate()?;
    let store = build_store(location, &opts.store, opts.timeouts())?;
    let counters = Counters::default();
    let fetcher = fetcher(&*store, opts, &counters);
    runtime(opts)?.block_on(crate::checkpoint::open(location, &fetcher))
}

fn fetcher<'a>(
    store: &'a dyn object_store::ObjectStore,
    opts: &RemoteOptions,
    counters: &'a Counters,
) -> Fetcher<'a> {
    Fetcher {
        store,
        policy: opts.retry,
        rate_min_bytes_per_s: opts.rate_min_bytes_per_s,
        request_overhead: opts.request_overhead,
        counters,
    }
}

struct NoSink;
impl CompletionSink for NoSink {
    fn read_done(&self, _read: u32) -> Result<(), StopReason> {
        Ok(())
    }
}

/// Load every tensor of the checkpoint at `location` into memory.
///
/// Plans the tensors with `tensora_plan` (reads of `chunk_bytes`), fetches the reads of all
/// shards through one queue with `reads_inflight_max` in flight, each range conditional on the
/// ETag (or size and last-modified) seen at open. On any failure nothing is returned: no partial
/// model, and an object replaced mid-load is [`RemoteError::Changed`].
///
/// ```
/// use tensora_remote::{Location, RemoteOptions, load_remote};
/// let opts = RemoteOptions { reads_inflight_max: 0, ..RemoteOptions::default() };
/// let err = load_remote(&Location::parse("http://127.0.0.1:9/m/")?, &opts).unwrap_err();
/// assert!(matches!(err, tensora_remote::RemoteError::Options { field: "reads_inflight_max", .. }));
/// # Ok::<(), tensora_remote::RemoteError>(())
/// ```
pub fn load_remote(location: &Location, opts: &RemoteOptions) -> Result<RemoteLoaded, RemoteError> {
    opts.validate()?;
    let inflight_bytes_max = opts.inflight_bytes_max().unwrap_or(u64::MAX);
    let faults_before = Faults::now();
    let t0 = Instant::now();
    let store = build_store(location, &opts.store, opts.timeouts())?;
    let rt = runtime(opts)?;
    let counters = Counters::default();
    let fetcher = fetcher(&*store, opts, &counters);
    let t_open = t0.elapsed();

    let t1 = Instant::now();
    let checkpoint = rt.block_on(crate::checkpoint::open(location, &fetcher))?;
    let t_parse = t1.elapsed();

    let t2 = Instant::now();
    let extents: Vec<Extent> = checkpoint
        .tensors()
        .iter()
        .enumerate()
        .map(|(i, t)| Extent {
            file: t.file(),
            offset_bytes: t.offset_bytes(),
            len_bytes: t.len_bytes(),
            tag: i as u32,
        })
        .collect();
    let file_lens: Vec<u64> = checkpoint.files().iter().map(|f| f.len_bytes()).collect();
    let config = PlanConfig {
        chunk_bytes: opts.chunk_bytes,
        budget_bytes: inflight_bytes_max,
        ..PlanConfig::default()
    };
    let plan = Plan::build_with_file_lens(&extents, &config, &Order::File, &file_lens)?;
    let offsets: Vec<u64> =
        (0..extents.len()).map(|i| plan.location(i as u32).map_or(0, |l| l.arena_offset_bytes)).collect();
    let t_plan = t2.elapsed();

    let t3 = Instant::now();
    // Every byte a tensor view can see is written by a read, so a recycled arena's old contents
    // never show; reuse spares repeated loads the page faults of a fresh mapping.
    let mut arena = Arena::recycled(plan.arena_len_bytes())
        .map_err(|source| RemoteError::Resource { what: "cannot allocate the destination arena", source })?;
    let budget = Budget::new(inflight_bytes_max);
    let executor =
        RemoteExecutor { fetcher, objects: checkpoint.files(), reads_inflight_max: opts.reads_inflight_max };
    let stats = rt.block_on(executor.execute(&plan, arena.as_mut_slice(), &budget, &NoSink))?;
    let t_io = t3.elapsed();

    let t4 = Instant::now();
    drop(rt);
    let faults = Faults::now().since(faults_before);
    let mut load = LoadReport {
        backend: format!("{}-{}", executor.name(), scheme(location)),
        reason: format!(
            "object_store ranged GETs of {} KiB, {} in flight, one queue across {} objects",
            opts.chunk_bytes >> 10,
            opts.reads_inflight_max,
            checkpoint.files().len()
        ),
        io_mode: "streamed".to_owned(),
        bytes_selected: plan.bytes_selected(),
        bytes_read: stats.bytes_read,
        phases: Phases::default(),
        peak_inflight_bytes: stats.peak_inflight_bytes,
        retries: stats.retries,
        minor_faults: faults.minor,
        major_faults: faults.major,
        peak_rss_bytes: peak_rss_bytes(),
        tensors: checkpoint.tensors().len(),
        files: checkpoint.files().len(),
        windows: 1,
        ..LoadReport::default()
    };
    load.phases = Phases {
        open: t_open.as_secs_f64(),
        parse: t_parse.as_secs_f64(),
        plan: t_plan.as_secs_f64(),
        io: t_io.as_secs_f64(),
        finish: t4.elapsed().as_secs_f64(),
    };
    load.finalize();
    let report = RemoteReport {
        load,
        url: location.url_of(location.object_path().unwrap_or(&object_store::path::Path::default())),
        requests: counters.requests.load(Ordering::Relaxed),
        retries: counters.retries.load(Ordering::Relaxed),
        retry_seconds: counters.retry_nanos.load(Ordering::Relaxed) as f64 / 1e9,
        inflight_bytes_max,
    };
    Ok(RemoteLoaded { checkpoint, arena, offsets, report })
}

fn scheme(location: &Location) -> &'static str {
    match location {
        Location::Local(_) => "local",
        Location::Http { .. } => "http",
        Location::S3 { .. } => "s3",
    }
}
