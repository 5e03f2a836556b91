//! Test-only object stores: an in-memory store whose GETs can break mid-body, be refused, or
//! hang, to drive the retry, cancellation and error paths without a server; and the sharded
//! checkpoints the tests put in them.

use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use object_store::memory::InMemory;
use object_store::path::Path as ObjectPath;
use object_store::{
    GetOptions, GetResultPayload, ListResult, MultipartUpload, ObjectMeta, ObjectStore, ObjectStoreExt,
    PutMultipartOptions, PutOptions, PutPayload, PutResult,
};
use tensora_format::Dtype;
use tensora_format::write::{ShardedLayout, TensorSpec, write_sharded};

/// Write a sharded checkpoint into `dir`: tensor `t{i}` is F32 with `lens_words[i]` elements,
/// shards hold at most `shard_cap` bytes, and byte `b` of tensor `i` is `fill(i, b)`.
pub fn write_f32_shards(dir: &Path, lens_words: &[u64], shard_cap: u64, fill: impl Fn(usize, u64) -> u8) {
    let specs = lens_words
        .iter()
        .enumerate()
        .map(|(i, &n)| TensorSpec { name: format!("t{i}"), dtype: Dtype::F32, shape: vec![n] })
        .collect();
    let layout = ShardedLayout::new(specs, BTreeMap::new(), shard_cap).unwrap();
    write_sharded(dir, &layout, |i, out| {
        let bytes: Vec<u8> = (0..lens_words[i] * 4).map(|b| fill(i, b)).collect();
        out.write_all(&bytes)
    })
    .unwrap();
}

/// Put every file of `dir` into `store` under `prefix/`.
pub fn upload_dir(store: &InMemory, dir: &Path, prefix: &str, rt: &tokio::runtime::Runtime) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_owned();
        let key = ObjectPath::from(format!("{prefix}/{name}"));
        rt.block_on(store.put(&key, std::fs::read(&path).unwrap().into())).unwrap();
    }
}

/// How long a hanging GET waits before it answers: longer than any working test runs, so a hang
/// that finishes ([`BreakingStore::hangs_finished`]) means the load did not stop it.
pub const HANG: Duration = Duration::from_secs(60);

type BoxFut<'a, T> = Pin<Box<dyn Future<Output = object_store::Result<T>> + Send + 'a>>;

/// The `ObjectStore` methods a test store passes straight to `self.inner`: everything but
/// `get_opts` and `list`.
macro_rules! delegate_to_inner {
    () => {
        fn put_opts<'a, 'b, 'c>(
            &'a self,
            l: &'b ObjectPath,
            p: PutPayload,
            o: PutOptions,
        ) -> BoxFut<'c, PutResult>
        where
            'a: 'c,
            'b: 'c,
            Self: 'c,
        {
            self.inner.put_opts(l, p, o)
        }
        fn put_multipart_opts<'a, 'b, 'c>(
            &'a self,
            l: &'b ObjectPath,
            o: PutMultipartOptions,
        ) -> BoxFut<'c, Box<dyn MultipartUpload>>
        where
            'a: 'c,
            'b: 'c,
            Self: 'c,
        {
            self.inner.put_multipart_opts(l, o)
        }
        fn delete_stream(
            &self,
            locations: BoxStream<'static, object_store::Result<ObjectPath>>,
        ) -> BoxStream<'static, object_store::Result<ObjectPath>> {
            self.inner.delete_stream(locations)
        }
        fn list_with_delimiter<'a, 'b, 'c>(&'a self, prefix: Option<&'b ObjectPath>) -> BoxFut<'c, ListResult>
        where
            'a: 'c,
            'b: 'c,
            Self: 'c,
        {
            self.inner.list_with_delimiter(prefix)
        }
        fn copy_opts<'a, 'b, 'c, 'd>(
            &'a self,
            from: &'b ObjectPath,
            to: &'c ObjectPath,
            o: object_store::CopyOptions,
        ) -> BoxFut<'d, ()>
        where
            'a: 'd,
            'b: 'd,
            'c: 'd,
            Self: 'd,
        {
            self.inner.copy_opts(from, to, o)
        }
    };
}

/// An in-memory store whose GET bodies break: each GET pops a byte count after which its body
/// fails (none left: whole bodies). Bodies arrive in `BODY_CHUNK_BYTES` pieces. While
/// `hang_next` is above 0, each GET (not HEAD) takes one off and waits [`HANG`] first; after
/// those, while `refuse_next` is above 0, each GET takes one off and is refused with a failed
/// precondition.
#[derive(Debug, Default)]
pub struct BreakingStore {
    pub inner: InMemory,
    pub breaks: Mutex<VecDeque<usize>>,
    pub hang_next: AtomicU32,
    pub refuse_next: AtomicU32,
    /// Counters of hanging GETs (events for the tests): started, dropped by the loader while
    /// hanging, and waited out to the end of [`HANG`].
    pub hangs: HangCounts,
}

/// How many GETs started hanging, were dropped while hanging, and hung to the end.
#[derive(Debug, Default)]
pub struct HangCounts {
    pub started: AtomicU32,
    pub dropped: AtomicU32,
    pub finished: AtomicU32,
}

impl HangCounts {
    /// Block until `n` GETs are hanging (polled; fails after `HANG`, which only a broken store
    /// could take).
    pub fn wait_started(&self, n: u32) {
        let deadline = std::time::Instant::now() + HANG;
        while self.started.load(Ordering::Acquire) < n {
            assert!(std::time::Instant::now() < deadline, "fewer than {n} GETs hanging");
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// Counts a hanging GET as dropped unless it ran to its end.
struct HangGuard<'a> {
    counts: &'a HangCounts,
    finished: bool,
}

impl Drop for HangGuard<'_> {
    fn drop(&mut self) {
        let counter = if self.finished { &self.counts.finished } else { &self.counts.dropped };
        counter.fetch_add(1, Ordering::AcqRel);
    }
}

pub const BODY_CHUNK_BYTES: usize = 1000;

impl std::fmt::Display for BreakingStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BreakingStore")
    }
}

impl ObjectStore for BreakingStore {
    delegate_to_inner!();
    fn get_opts<'a, 'b, 'c>(&'a self, l: &'b ObjectPath, o: GetOptions) -> BoxFut<'c, object_store::GetResult>
    where
        'a: 'c,
        'b: 'c,
        Self: 'c,
    {
        Box::pin(async move {
            let head = o.head;
            let mut result = self.inner.get_opts(l, o).await?;
            if head {
                return Ok(result);
            }
            let take =
                |n: &AtomicU32| n.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
            if take(&self.hang_next).is_ok() {
                let mut guard = HangGuard { counts: &self.hangs, finished: false };
                self.hangs.started.fetch_add(1, Ordering::AcqRel);
                tokio::time::sleep(HANG).await;
                guard.finished = true;
            } else if take(&self.refuse_next).is_ok() {
                return Err(object_store::Error::Precondition {
                    path: l.to_string(),
                    source: "refused by the test store".into(),
                });
            }
            let brk = self.breaks.lock().unwrap().pop_front();
            let GetResultPayload::Stream(body) = result.payload;
            let bytes: Vec<bytes::Bytes> = body.try_collect::<Vec<_>>().await?;
            let all: Vec<u8> = bytes.concat();
            let keep = brk.map_or(all.len(), |k| k.min(all.len()));
            let mut pieces: Vec<object_store::Result<bytes::Bytes>> =
                all[..keep].chunks(BODY_CHUNK_BYTES).map(|c| Ok(bytes::Bytes::copy_from_slice(c))).collect();
            if keep < all.len() {
                pieces.push(Err(object_store::Error::Generic {
                    store: "BreakingStore",
                    source: "connection reset".into(),
                }));
            }
            result.payload = GetResultPayload::Stream(futures::stream::iter(pieces).boxed());
            Ok(result)
        })
    }
    fn list(&self, prefix: Option<&ObjectPath>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list(prefix)
    }
}

/// A store over a [`BreakingStore`] for servers that keep no versions: its HEAD and GET results
/// carry no ETag (and, with `drop_last_modified`, no Last-Modified date: object_store reads a
/// missing one as the epoch), it ignores every precondition, and it can replace an object right
/// after serving a GET: `replace_after` holds (GETs still to serve, the object, its new bytes).
#[derive(Debug, Default)]
pub struct VersionlessStore {
    pub inner: BreakingStore,
    pub drop_last_modified: bool,
    pub replace_after: Mutex<Option<(u32, ObjectPath, bytes::Bytes)>>,
}

impl std::fmt::Display for VersionlessStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "VersionlessStore")
    }
}

impl VersionlessStore {
    fn strip(&self, meta: &mut ObjectMeta) {
        meta.e_tag = None;
        meta.version = None;
        if self.drop_last_modified {
            // chrono's default timestamp is the epoch.
            meta.last_modified = Default::default();
        }
    }

    /// After a GET: count it, and replace the object once the count runs out.
    async fn after_get(&self) {
        let due = {
            let mut slot = self.replace_after.lock().unwrap();
            match slot.as_mut() {
                Some((0, ..)) => slot.take(),
                Some((n, ..)) => {
                    *n -= 1;
                    if *n == 0 { slot.take() } else { None }
                }
                None => None,
            }
        };
        if let Some((_, path, bytes)) = due {
            self.inner.inner.put(&path, bytes.into()).await.unwrap();
        }
    }
}

impl ObjectStore for VersionlessStore {
    delegate_to_inner!();
    fn get_opts<'a, 'b, 'c>(&'a self, l: &'b ObjectPath, o: GetOptions) -> BoxFut<'c, object_store::GetResult>
    where
        'a: 'c,
        'b: 'c,
        Self: 'c,
    {
        Box::pin(async move {
            let head = o.head;
            // Preconditions ignored, as by a server that does not implement them.
            let o = GetOptions {
                if_match: None,
                if_none_match: None,
                if_modified_since: None,
                if_unmodified_since: None,
                ..o
            };
            let mut result = self.inner.get_opts(l, o).await?;
            self.strip(&mut result.meta);
            if !head {
                // Served: the bytes of this response are read; a replacement now is "mid-load".
                let GetResultPayload::Stream(body) = result.payload;
                let pieces: Vec<object_store::Result<bytes::Bytes>> = body.collect().await;
                self.after_get().await;
                result.payload = GetResultPayload::Stream(futures::stream::iter(pieces).boxed());
            }
            Ok(result)
        })
    }
    fn list(&self, prefix: Option<&ObjectPath>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let drop_last_modified = self.drop_last_modified;
        self.inner
            .list(prefix)
            .map_ok(move |mut meta| {
                meta.e_tag = None;
                if drop_last_modified {
                    meta.last_modified = Default::default();
                }
                meta
            })
            .boxed()
    }
}
