//! Test-only object stores: an in-memory store whose GETs can break mid-body, be refused, or
//! hang, to drive the retry, cancellation and error paths without a server.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use object_store::memory::InMemory;
use object_store::path::Path as ObjectPath;
use object_store::{
    GetOptions, GetResultPayload, ListResult, MultipartUpload, ObjectMeta, ObjectStore, PutMultipartOptions,
    PutOptions, PutPayload, PutResult,
};

/// How long a hanging GET waits before it answers: longer than any test runs.
pub const HANG: Duration = Duration::from_secs(120);

type BoxFut<'a, T> = Pin<Box<dyn Future<Output = object_store::Result<T>> + Send + 'a>>;

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
}

pub const BODY_CHUNK_BYTES: usize = 1000;

impl std::fmt::Display for BreakingStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BreakingStore")
    }
}

impl ObjectStore for BreakingStore {
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
                tokio::time::sleep(HANG).await;
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
    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<ObjectPath>>,
    ) -> BoxStream<'static, object_store::Result<ObjectPath>> {
        self.inner.delete_stream(locations)
    }
    fn list(&self, prefix: Option<&ObjectPath>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list(prefix)
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
}
