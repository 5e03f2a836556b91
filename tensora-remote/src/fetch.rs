//! Ranged reads with bounded retries: one request per attempt, the body streamed straight into
//! the caller's slice, a broken or stalled body resumed from the first byte that did not land.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{GetOptions, GetRange, ObjectMeta, ObjectStore};

use crate::RemoteError;
use crate::crc::Crc32c;
use crate::redact::redact;

/// Bytes an attempt must move at the link's pace before it fails, or the load's other ranges
/// while it is silent, for the failure to start a new episode of retries (a new count against
/// [`RetryPolicy`]'s bounds): a range has at most its load's length over this of them (its
/// attempts run one after another, each new episode after a MiB more of the load).
pub const HEADWAY_BYTES_MIN: usize = 1 << 20;

/// Bounds on retrying one range, counted per failure episode: an attempt that moved
/// `HEADWAY_BYTES_MIN` at the link's pace before it failed, or went silent while the load's
/// other ranges moved that much, starts a new episode. A range that fails more often in one
/// episode, or keeps failing for longer, fails the load. Network errors, broken bodies and HTTP 5xx, 408 and 429 answers are retried;
/// after a 429 or 503 with `Retry-After: N` the next attempt waits at least N seconds (and a wait
/// longer than the retry time left ends the retries).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Retries of one range in one failure episode (each a new request that resumes where the
    /// last one stopped).
    pub retries_per_range_max: u32,
    /// How long one range may keep failing, from the first failure of its episode, before the
    /// load fails.
    pub retry_time_max: Duration,
    /// First backoff; doubled after each failure of the same range up to `backoff_max`.
    pub backoff_initial: Duration,
    /// The longest wait between two attempts on one range.
    pub backoff_max: Duration,
}

impl Default for RetryPolicy {
    /// 10 retries per range, 30 s of retrying per range, backoff 100 ms doubling to 2 s.
    fn default() -> Self {
        RetryPolicy {
            retries_per_range_max: 10,
            retry_time_max: Duration::from_secs(30),
            backoff_initial: Duration::from_millis(100),
            backoff_max: Duration::from_secs(2),
        }
    }
}

impl RetryPolicy {
    /// The wait before retry number `retry` (1-based) of one range.
    pub fn backoff(&self, retry: u32) -> Duration {
        let shift = retry.saturating_sub(1).min(20);
        self.backoff_initial.saturating_mul(1u32 << shift).min(self.backoff_max)
    }
}

/// One object as seen when the plan was made. Every later range is conditional on it.
#[derive(Debug, Clone)]
pub struct RemoteObject {
    /// Printable URL.
    pub url: String,
    /// Size, ETag and last-modified at plan time.
    pub meta: ObjectMeta,
}

impl RemoteObject {
    /// Size in bytes at plan time.
    pub fn len_bytes(&self) -> u64 {
        self.meta.size
    }
    /// What identifies this version of the object: its ETag, else size and last-modified.
    pub fn version(&self) -> String {
        version_of(&self.meta)
    }
    pub(crate) fn path(&self) -> &ObjectPath {
        &self.meta.location
    }
    /// What this object's responses can be checked against. A missing Last-Modified header is
    /// read by object_store as the Unix epoch.
    pub(crate) fn versioning(&self) -> Versioning {
        if self.meta.e_tag.is_some() {
            Versioning::ETag
        } else if self.meta.last_modified.timestamp_nanos_opt() != Some(0) {
            Versioning::LastModified
        } else {
            Versioning::None
        }
    }
}

/// What an object's responses can be checked against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Versioning {
    /// An ETag: every range carries `If-Match`, and each response's ETag is compared.
    ETag,
    /// No ETag but a Last-Modified date: every range carries `If-Unmodified-Since` (which some
    /// servers ignore), and each response's Last-Modified is compared.
    LastModified,
    /// Neither: two requests cannot be told to have read the same version.
    None,
}

/// What to do with an object whose server sends neither an ETag nor a Last-Modified date: every
/// load of it reads several ranges (the header at open, the tensors later; a broken body is
/// resumed with a second request), and nothing shows whether they came from one version.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Unversioned {
    /// Refuse such an object with [`RemoteError::Unversioned`], naming the opt-in (the default).
    #[default]
    Refuse,
    /// Load it anyway: a replacement during the load can go unnoticed (same size).
    Allow,
}

fn version_of(meta: &ObjectMeta) -> String {
    match &meta.e_tag {
        Some(tag) => format!("etag {tag}"),
        None => format!("size {} last-modified {}", meta.size, meta.last_modified.to_rfc3339()),
    }
}

/// One operation's request counters (an open's, or one load's), shared by its in-flight ranges.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub requests: AtomicU64,
    pub retries: AtomicU64,
    pub retry_nanos: AtomicU64,
    /// Body bytes landed so far, counted chunk by chunk as they arrive: also whether the link
    /// kept moving while one connection was silent ([`Fetcher::fetch_filling`]).
    pub bytes: AtomicU64,
}

impl Counters {
    pub fn snapshot(&self) -> crate::client::CounterSnapshot {
        crate::client::CounterSnapshot {
            requests: self.requests.load(Ordering::Relaxed),
            retries: self.retries.load(Ordering::Relaxed),
            retry_nanos: self.retry_nanos.load(Ordering::Relaxed),
        }
    }

    fn add_retry_time(&self, since: Option<Instant>) {
        if let Some(t) = since {
            self.add_retry_span(t, Instant::now());
        }
    }

    fn add_retry_span(&self, since: Instant, until: Instant) {
        let nanos = u64::try_from(until.saturating_duration_since(since).as_nanos()).unwrap_or(u64::MAX);
        self.retry_nanos.fetch_add(nanos, Ordering::Relaxed);
    }
}

/// Where a fetched range's bytes came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    /// A cached copy (or nothing to fetch).
    Cache,
    /// The store: not in the cache yet. With a cache, the bytes' CRC-32C, computed chunk by
    /// chunk as they were copied in (while each chunk was still in the CPU's caches).
    Store { crc32c: Option<u32> },
}

/// What each fetch needs: the store, the bounds and the counters.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fetcher<'a> {
    pub store: &'a dyn ObjectStore,
    pub policy: RetryPolicy,
    /// The slowest transfer rate one healthy connection is expected to sustain (its share of
    /// the link, [`crate::RemoteOptions::connection_rate_min_bytes_per_s`]).
    pub rate_min_bytes_per_s: u64,
    /// Allowance per attempt for connecting and the first byte, and the longest a response may
    /// send nothing.
    pub request_overhead: Duration,
    /// Whether objects without any version may be read in more than one request.
    pub unversioned: Unversioned,
    pub counters: &'a Counters,
    /// What this operation reads from and writes through in front of the store (the cache),
    /// if anything.
    pub layer: Option<&'a dyn Layer>,
}

/// What a response must match.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Match {
    /// The version the object was planned at: the request is conditional on it, and a response
    /// of another version or size fails as `Changed`.
    Planned,
    /// Nothing yet: the first read of an object a listing named, whose response gives the
    /// version ([`Fetcher::first_read`]).
    Any,
}

enum Failure {
    /// Retrying cannot help (missing object, changed object, bad range).
    Fatal(RemoteError),
    /// Network trouble, a server error, a short or stalled body: retry from where it stopped.
    Transient(String),
    /// The connection sent nothing for `request_overhead` (see [`Silence`]): retried like
    /// `Transient`.
    Silent(String),
}

impl Failure {
    /// An attempt that did not finish within its `timeout` ([`Fetcher::attempt_timeout`]).
    fn timed_out(timeout: Duration) -> Failure {
        Failure::Transient(format!("no complete body within {:.1} s", timeout.as_secs_f64()))
    }
}

impl<'a> Fetcher<'a> {
    /// This fetcher reading from and writing through `layer`.
    pub fn with_layer(self, layer: Option<&'a dyn Layer>) -> Fetcher<'a> {
        Fetcher { layer, ..self }
    }

    fn offline(&self) -> bool {
        self.layer.is_some_and(|l| l.offline())
    }

    /// Everything under `prefix` (a recorded location's objects in record mode).
    pub fn list(
        &self,
        prefix: &ObjectPath,
    ) -> futures::stream::BoxStream<'a, object_store::Result<ObjectMeta>> {
        if let Some(listed) = self.layer.and_then(|l| l.recorded_list(prefix)) {
            return futures::stream::iter(listed.into_iter().map(Ok)).boxed();
        }
        self.counters.requests.fetch_add(1, Ordering::Relaxed);
        self.store.list(Some(prefix))
    }

    /// The time allowed for one attempt that still has `remaining_bytes` to transfer.
    pub fn attempt_timeout(&self, remaining_bytes: u64) -> Duration {
        let rate = self.rate_min_bytes_per_s.max(1);
        self.request_overhead + Duration::from_secs_f64(remaining_bytes as f64 / rate as f64)
    }

    /// Whether the layer's record answers for `path` (a location opened before, confirmed): its
    /// HEAD is then answered without a request.
    pub fn recorded(&self, path: &ObjectPath) -> bool {
        self.layer.and_then(|l| l.recorded_head(path)).is_some()
    }

    /// The object's current metadata (a `HEAD` request), retried under the policy.
    pub async fn head(&self, path: &ObjectPath, url: &str) -> Result<ObjectMeta, RemoteError> {
        if let Some(answer) = self.layer.and_then(|l| l.recorded_head(path)) {
            return answer.ok_or_else(|| RemoteError::NotFound { url: url.to_owned() });
        }
        let meta = self.head_from_store(path, url).await?;
        if let Some(layer) = self.layer {
            layer.saw(url, &meta);
        }
        Ok(meta)
    }

    async fn head_from_store(&self, path: &ObjectPath, url: &str) -> Result<ObjectMeta, RemoteError> {
        let mut retries = 0u32;
        let mut first_failure: Option<Instant> = None;
        loop {
            self.counters.requests.fetch_add(1, Ordering::Relaxed);
            let options = GetOptions { head: true, ..GetOptions::default() };
            let attempt = tokio::time::timeout(self.attempt_timeout(0), self.store.get_opts(path, options));
            let failure = match attempt.await {
                Ok(Ok(result)) => {
                    self.counters.add_retry_time(first_failure);
                    return Ok(result.meta);
                }
                Ok(Err(e)) => classify(e, url, None),
                Err(_) => Failure::Transient("HEAD timed out".to_owned()),
            };
            self.retry_or_fail(failure, url, 0, 0, &mut retries, &mut first_failure).await?;
        }
    }

    /// Fill `dest` with the object's bytes from `offset_bytes`, conditional on the version in
    /// `object`. The body is copied chunk by chunk as it arrives; after a failure the next
    /// attempt asks only for the bytes that have not landed. A range fetched from the store is
    /// written through to the layer (the cache: copied into its writers' buffers).
    pub async fn fetch(
        &self,
        object: &RemoteObject,
        offset_bytes: u64,
        dest: &mut [u8],
    ) -> Result<(), RemoteError> {
        if let (Source::Store { crc32c: Some(crc32c) }, Some(layer)) =
            (self.fetch_unwritten(object, offset_bytes, dest).await?, self.layer)
        {
            layer.write(object, offset_bytes, dest, crc32c).await;
        }
        Ok(())
    }

    /// Record `bytes` (the object's from `offset_bytes`, just fetched from the store) in the
    /// layer, if there is one, with the CRC-32C of the memory they landed in.
    pub async fn write_through(&self, object: &RemoteObject, offset_bytes: u64, bytes: &[u8]) {
        if let Some(layer) = self.layer {
            let mut crc = Crc32c::new();
            crc.append(bytes);
            layer.write(object, offset_bytes, bytes, crc.value()).await;
        }
    }

    /// [`Fetcher::fetch`] without the write-through: where the bytes came from, for a caller that
    /// writes them into the layer itself.
    pub async fn fetch_unwritten(
        &self,
        object: &RemoteObject,
        offset_bytes: u64,
        dest: &mut [u8],
    ) -> Result<Source, RemoteError> {
        if self.read_cached(object, offset_bytes, dest)? {
            return Ok(Source::Cache);
        }
        let mut fill = SliceFill { dest, crc32c: self.layer.map(|_| Crc32c::new()) };
        self.fetch_filling(object, offset_bytes, &mut fill).await?;
        Ok(Source::Store { crc32c: fill.crc32c.map(|c| c.value()) })
    }

    /// Fill `dest` with the object's bytes from `offset_bytes`, from the store only: neither read
    /// from nor written to the layer, no CRC.
    pub async fn fetch_store(
        &self,
        object: &RemoteObject,
        offset_bytes: u64,
        dest: &mut [u8],
    ) -> Result<(), RemoteError> {
        if dest.is_empty() {
            return Ok(());
        }
        self.fetch_filling(object, offset_bytes, &mut SliceFill { dest, crc32c: None }).await
    }

    /// Whether `dest` (the object's bytes from `offset_bytes`) was filled from the layer (the
    /// cache): `true` for an empty range too; `false` if the store must be asked, an error if it
    /// may not be (offline).
    pub fn read_cached(
        &self,
        object: &RemoteObject,
        offset_bytes: u64,
        dest: &mut [u8],
    ) -> Result<bool, RemoteError> {
        if dest.is_empty() {
            return Ok(true);
        }
        let Some(layer) = self.layer else { return Ok(false) };
        if layer.read(object, offset_bytes, dest) {
            return Ok(true);
        }
        if self.offline() {
            return Err(RemoteError::NotCached {
                url: object.url.clone(),
                what: "a range of it is not cached",
            });
        }
        Ok(false)
    }

    /// Whether an attempt that failed after landing `got` bytes in `took` moved them at the
    /// link's pace: at least [`HEADWAY_BYTES_MIN`], at no less than this connection's share of
    /// the slowest healthy link. Such an attempt ends the range's failure episode (see
    /// [`Fetcher::fetch_filling`]).
    fn made_headway(&self, got: usize, took: Duration) -> bool {
        let rate = got as f64 / took.as_secs_f64().max(1e-9);
        got >= HEADWAY_BYTES_MIN && rate >= self.rate_min_bytes_per_s.max(1) as f64
    }

    /// Fill `fill` (the object's bytes from `offset_bytes`) from the store, chunk by chunk as
    /// the body arrives; after a failure the next attempt asks only for what has not landed.
    /// Retries and retry time ([`RetryPolicy`]) count one failure episode. A new one starts
    /// after an attempt that failed having moved at least [`HEADWAY_BYTES_MIN`] at the link's
    /// pace, or that went silent while the load's other ranges moved at least that much (the
    /// link is shared, and on a slow one TCP leaves some connections waiting longer than
    /// `request_overhead`): a slow, lossy or crowded link is not taken for a failing server.
    /// Each new episode follows at least that many bytes of this range, or of the load, since
    /// the last, so a range has at most its load's length over [`HEADWAY_BYTES_MIN`] of them.
    pub async fn fetch_filling<F: Fill>(
        &self,
        object: &RemoteObject,
        offset_bytes: u64,
        fill: &mut F,
    ) -> Result<(), RemoteError> {
        let len_bytes = fill.len_bytes() as u64;
        let mut landed = 0usize;
        let mut retries = 0u32;
        let mut first_failure: Option<Instant> = None;
        loop {
            if landed > 0 {
                // A resumed body is a second request: without a version it may read another one.
                self.check_versioned(object, "a resumed range")?;
            }
            self.counters.requests.fetch_add(1, Ordering::Relaxed);
            let start = offset_bytes + landed as u64;
            let mut got = 0usize;
            let timeout = self.attempt_timeout(len_bytes - landed as u64);
            let attempt_start = Instant::now();
            let link_start = self.counters.bytes.load(Ordering::Relaxed);
            let attempt = self.attempt(object, Match::Planned, start, fill, landed, &mut got);
            let attempt = tokio::time::timeout(timeout, attempt).await;
            landed += got;
            let failure = match attempt {
                Ok(Ok(_)) => {
                    self.counters.add_retry_time(first_failure);
                    return Ok(());
                }
                Ok(Err(failure)) => failure,
                Err(_) => Failure::timed_out(timeout),
            };
            let link_moved = self.counters.bytes.load(Ordering::Relaxed).saturating_sub(link_start);
            let shared = matches!(failure, Failure::Silent(_)) && link_moved >= HEADWAY_BYTES_MIN as u64;
            if (shared || self.made_headway(got, attempt_start.elapsed()))
                && let Some(since) = first_failure.take()
            {
                self.counters.add_retry_span(since, attempt_start);
                retries = 0;
            }
            // Name the first byte that has not landed, and what is left of the range.
            self.retry_or_fail(
                failure,
                &object.url,
                offset_bytes + landed as u64,
                len_bytes - landed as u64,
                &mut retries,
                &mut first_failure,
            )
            .await?;
        }
    }

    /// Refuses an object without ETag and Last-Modified (unless allowed): `what` is the reason
    /// it would be read in more than one request.
    pub fn check_versioned(&self, object: &RemoteObject, what: &'static str) -> Result<(), RemoteError> {
        if object.versioning() == Versioning::None && self.unversioned == Unversioned::Refuse {
            return Err(RemoteError::Unversioned { url: object.url.clone(), what });
        }
        Ok(())
    }

    async fn retry_or_fail(
        &self,
        failure: Failure,
        url: &str,
        offset_bytes: u64,
        len_bytes: u64,
        retries: &mut u32,
        first_failure: &mut Option<Instant>,
    ) -> Result<(), RemoteError> {
        let message = match failure {
            Failure::Fatal(e) => {
                self.counters.add_retry_time(*first_failure);
                return Err(e);
            }
            Failure::Transient(message) | Failure::Silent(message) => message,
        };
        let since = *first_failure.get_or_insert_with(Instant::now);
        let elapsed = since.elapsed();
        // A 429 or 503 with `Retry-After` waits at least as long as the server asked; a longer
        // wait than the retry time left ends the retries now.
        let asked = crate::retry_after::retry_after(&message).unwrap_or_default();
        let wait = self.policy.backoff(*retries + 1).max(asked);
        if *retries >= self.policy.retries_per_range_max || elapsed + wait > self.policy.retry_time_max {
            self.counters.add_retry_time(*first_failure);
            return Err(RemoteError::RetriesExhausted {
                url: url.to_owned(),
                offset_bytes,
                len_bytes,
                attempts: *retries + 1,
                retry_time: elapsed,
                last_error: message,
            });
        }
        *retries += 1;
        self.counters.retries.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(wait).await;
        Ok(())
    }

    /// The object's version and its first `dest.len()` bytes, in `dest`, for an object a listing
    /// named (`listed`: its URL and the listing's metadata, of which only the path is used; `dest`
    /// at most its listed size): one unconditional ranged GET instead of a HEAD and a GET, its
    /// response's metadata the version every later read is conditional on. A failed attempt is
    /// retried whole under the policy (the range is short: the start of a safetensors header).
    pub async fn first_read(
        &self,
        listed: &RemoteObject,
        dest: &mut [u8],
    ) -> Result<ObjectMeta, RemoteError> {
        let len_bytes = dest.len() as u64;
        let mut retries = 0u32;
        let mut first_failure: Option<Instant> = None;
        loop {
            self.counters.requests.fetch_add(1, Ordering::Relaxed);
            let mut got = 0usize;
            let mut fill = SliceFill { dest: &mut *dest, crc32c: None };
            let timeout = self.attempt_timeout(len_bytes);
            let attempt = self.attempt(listed, Match::Any, 0, &mut fill, 0, &mut got);
            let failure = match tokio::time::timeout(timeout, attempt).await {
                Ok(Ok(meta)) => {
                    self.counters.add_retry_time(first_failure);
                    if let Some(layer) = self.layer {
                        layer.saw(&listed.url, &meta);
                    }
                    return Ok(meta);
                }
                Ok(Err(failure)) => failure,
                Err(_) => Failure::timed_out(timeout),
            };
            self.retry_or_fail(failure, &listed.url, 0, len_bytes, &mut retries, &mut first_failure).await?;
        }
    }

    /// One request for the bytes of `fill` from `from` on (the object's from `start`), matched
    /// against the object's planned version as `matching` says; `got` counts the bytes that
    /// landed, so a timed-out attempt still reports its progress. Returns the response's
    /// metadata.
    async fn attempt<F: Fill>(
        &self,
        object: &RemoteObject,
        matching: Match,
        start: u64,
        fill: &mut F,
        from: usize,
        got: &mut usize,
    ) -> Result<ObjectMeta, Failure> {
        let want = fill.len_bytes() - from;
        let end = start + want as u64;
        let planned = &object.meta;
        let conditional = matching == Match::Planned;
        let options = GetOptions {
            range: Some(GetRange::Bounded(start..end)),
            if_match: planned.e_tag.clone().filter(|_| conditional),
            if_unmodified_since: (conditional && planned.e_tag.is_none()).then_some(planned.last_modified),
            ..GetOptions::default()
        };
        let mut silence = Silence::new(self.request_overhead);
        let result = silence
            .heard(self.store.get_opts(object.path(), options))
            .await?
            .map_err(|e| classify(e, &object.url, Some(planned)))?;
        // Without an ETag the Last-Modified date is the version, compared on every response: a
        // server that ignores `If-Unmodified-Since` still cannot hand out a newer version's bytes.
        let changed = match (matching, object.versioning()) {
            // The first read of a listed object: its response is the version (a range shorter
            // than asked for, as from an object shrunk since the listing, fails below).
            (Match::Any, _) => false,
            (Match::Planned, Versioning::ETag) => result.meta.e_tag != planned.e_tag,
            (Match::Planned, Versioning::LastModified | Versioning::None) => {
                result.meta.last_modified != planned.last_modified
            }
        };
        if changed || (matching == Match::Planned && result.meta.size != planned.size) {
            return Err(Failure::Fatal(RemoteError::Changed {
                url: object.url.clone(),
                planned: version_of(planned),
                found: version_of(&result.meta),
            }));
        }
        if result.range != (start..end) {
            return Err(Failure::Fatal(RemoteError::BadResponse {
                url: object.url.clone(),
                offset_bytes: start,
                len_bytes: want as u64,
                what: format!("got bytes {}..{}", result.range.start, result.range.end),
            }));
        }
        let meta = result.meta.clone();
        let mut body = result.into_stream();
        while let Some(chunk) = silence.heard(body.next()).await? {
            let chunk = chunk.map_err(|e| Failure::Transient(redact(&format!("body: {e}"))))?;
            if got.checked_add(chunk.len()).is_none_or(|e| e > want) {
                return Err(Failure::Fatal(RemoteError::BadResponse {
                    url: object.url.clone(),
                    offset_bytes: start,
                    len_bytes: want as u64,
                    what: "the body is longer than the range".to_owned(),
                }));
            }
            fill.put(from + *got, &chunk);
            *got += chunk.len();
            self.counters.bytes.fetch_add(chunk.len() as u64, Ordering::Relaxed);
        }
        if *got < want {
            return Err(Failure::Transient(format!("body ended after {} of {} bytes", *got, want)));
        }
        Ok(meta)
    }
}

/// The watch on one attempt's response for silence: a connection that sends nothing (no head,
/// no chunk) for `limit` fails the attempt as transient, so a stopped connection is retried
/// without waiting out the attempt's allowance for the whole range. One timer per attempt,
/// moved only when it fires (at most once per `limit`), not one per chunk.
struct Silence {
    limit: Duration,
    last_heard: tokio::time::Instant,
    alarm: std::pin::Pin<Box<tokio::time::Sleep>>,
}

impl Silence {
    fn new(limit: Duration) -> Silence {
        let now = tokio::time::Instant::now();
        Silence { limit, last_heard: now, alarm: Box::pin(tokio::time::sleep_until(now + limit)) }
    }

    /// `step` (the response's head, or its next chunk), unless nothing was heard for `limit`.
    async fn heard<T>(&mut self, step: impl Future<Output = T>) -> Result<T, Failure> {
        let mut step = std::pin::pin!(step);
        // Each turn either ends or moves the alarm past `last_heard + limit`: it fires once per
        // `limit` at most, and the loop ends within `limit` of the last byte.
        loop {
            match futures::future::select(step.as_mut(), self.alarm.as_mut()).await {
                futures::future::Either::Left((value, _)) => {
                    self.last_heard = tokio::time::Instant::now();
                    return Ok(value);
                }
                futures::future::Either::Right(((), _)) => {
                    let deadline = self.last_heard + self.limit;
                    if tokio::time::Instant::now() >= deadline {
                        let s = self.limit.as_secs_f64();
                        return Err(Failure::Silent(format!("no byte for {s:.1} s")));
                    }
                    self.alarm.as_mut().reset(deadline);
                }
            }
        }
    }
}

/// Where a fetched range's body goes, chunk by chunk, front to back. A resumed body continues
/// where the last one stopped: the bytes put before are final.
pub(crate) trait Fill {
    /// The range's length.
    fn len_bytes(&self) -> usize;
    /// Put `chunk` at `at` within the range (`at + chunk.len() <= len_bytes()`; each call
    /// starts where the last ended).
    fn put(&mut self, at: usize, chunk: &[u8]);
}

/// A range filled into a slice, with the CRC-32C of its bytes if asked (chunk by chunk, while
/// each is still in the CPU's caches).
struct SliceFill<'a> {
    dest: &'a mut [u8],
    crc32c: Option<Crc32c>,
}

impl Fill for SliceFill<'_> {
    fn len_bytes(&self) -> usize {
        self.dest.len()
    }

    fn put(&mut self, at: usize, chunk: &[u8]) {
        self.dest[at..at + chunk.len()].copy_from_slice(chunk);
        if let Some(crc) = self.crc32c.as_mut() {
            crc.append(chunk);
        }
    }
}

fn classify(e: object_store::Error, url: &str, planned: Option<&ObjectMeta>) -> Failure {
    use object_store::Error as E;
    let changed = |found: String| {
        Failure::Fatal(RemoteError::Changed {
            url: url.to_owned(),
            planned: planned.map(version_of).unwrap_or_default(),
            found,
        })
    };
    match e {
        E::NotFound { .. } => match planned {
            Some(_) => changed("gone".to_owned()),
            None => Failure::Fatal(RemoteError::NotFound { url: url.to_owned() }),
        },
        E::Precondition { .. } | E::NotModified { .. } => {
            changed("a different version (the server refused the precondition)".to_owned())
        }
        E::PermissionDenied { .. }
        | E::Unauthenticated { .. }
        | E::InvalidPath { .. }
        | E::NotSupported { .. }
        | E::NotImplemented { .. } => Failure::Fatal(RemoteError::BadResponse {
            url: url.to_owned(),
            offset_bytes: 0,
            len_bytes: 0,
            what: redact(&e.to_string()),
        }),
        other => Failure::Transient(redact(&other.to_string())),
    }
}

mod source;
#[cfg(test)]
mod tests;

pub(crate) use source::{Footprint, Front, Land, Layer, RangeSource, ToLand, open_front};
