//! What the backend reads ranges from: a [`RangeSource`]. The store's [`Fetcher`] is one; a
//! [`Layer`] in front of the store (the cache) wraps a fetcher into another for each run, so the
//! backend knows only "a source of ranges" and never which layer, if any, is in front.
//!
//! This file is the crate's one door to what stands in front of the store: [`open_front`] opens
//! it (the cache, `crate::cache`) once per checkpoint, and its [`Front`] makes the [`Layer`] of
//! each open and each load. The fetcher, the opening, the backend and the load API see only
//! these traits, never the cache's own types.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use object_store::ObjectMeta;
use object_store::path::Path as ObjectPath;
use tensora_io::{Permit, ReadTarget};

use super::{Fetcher, RemoteObject};
use crate::{CacheOptions, CacheReport, CacheSync, RemoteError};

/// What stands in front of the store for a checkpoint opened with `options` (the cache
/// directory, opened and made private here), `None` without one: the one constructor of every
/// [`Front`], and so of every [`Layer`].
pub(crate) fn open_front(options: Option<&CacheOptions>) -> Result<Option<Arc<dyn Front>>, RemoteError> {
    let Some(options) = options else { return Ok(None) };
    Ok(Some(Arc::new(crate::cache::Cache::open(options)?)))
}

/// What a load puts in memory: the bytes it may write into a layer's copies and its own
/// destination (its arena, or a streamed load's window), for the page cache's rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Footprint {
    /// Bytes the load fetches and writes into copies at most (its selection).
    pub to_cache_bytes: u64,
    /// The load's own memory beside the page cache.
    pub destination_bytes: u64,
}

/// What stands in front of the store for one checkpoint, opened once ([`open_front`]): it makes
/// the [`Layer`] of each open and each load.
pub(crate) trait Front: std::fmt::Debug + Send + Sync {
    /// Whether no request at all may be sent: opens and loads are answered from it alone.
    fn offline(&self) -> bool;

    /// What `url` resolved to when it was last opened through this front (each object as it
    /// was then), if it was.
    fn record(&self, url: &str) -> Option<Vec<RemoteObject>>;

    /// Whether `found` (what the store says now of an object of a [`Front::record`]) is still
    /// the version `recorded`.
    fn unchanged(&self, recorded: &RemoteObject, found: &ObjectMeta) -> bool;

    /// The layer of one open of `url`: with `record` (a record the opener confirmed), its HEADs
    /// and listings are answered from it without a request; the headers and indexes it reads are
    /// written through, and what `url` resolved to is recorded when it finishes.
    fn open_layer(&self, url: &str, record: Option<Vec<RemoteObject>>) -> Arc<dyn Layer>;

    /// The layer of one load of `objects` whose memory is `footprint`, holding them until it
    /// finishes; with each object's local file (indexed like `objects`) when every one is
    /// complete in front of the store, so that the load can read local files only.
    fn load_layer(
        &self,
        objects: &[RemoteObject],
        footprint: Footprint,
    ) -> (Arc<dyn Layer>, Option<Vec<PathBuf>>);
}

/// A range filled and handed back to be landed, with its budget permit (given back once it
/// has landed); `None` when the source took it and lands it itself.
pub(crate) type ToLand<'r> = Option<(ReadTarget<'r>, Permit)>;

/// Lands a range a source took (see [`ToLand`]); a range that cannot land stops the run.
pub(crate) type Land<'a, 'r> = &'a (dyn Fn(ReadTarget<'r>) + Sync);

/// A source of ranges for reads whose memory is `'r`.
pub(crate) trait RangeSource<'r>: Sync {
    /// Fill `target` with `object`'s bytes from `offset_bytes` (as long as the target's read),
    /// holding `permit` meanwhile.
    fn fill<'s>(
        &'s self,
        object: &'s RemoteObject,
        offset_bytes: u64,
        target: ReadTarget<'r>,
        permit: Permit,
    ) -> BoxFuture<'s, Result<ToLand<'r>, RemoteError>>
    where
        'r: 's;
}

impl<'r> RangeSource<'r> for Fetcher<'_> {
    /// From the store only, handed back to be landed.
    fn fill<'s>(
        &'s self,
        object: &'s RemoteObject,
        offset_bytes: u64,
        mut target: ReadTarget<'r>,
        permit: Permit,
    ) -> BoxFuture<'s, Result<ToLand<'r>, RemoteError>>
    where
        'r: 's,
    {
        Box::pin(async move {
            self.fetch_store(object, offset_bytes, target.buf()).await?;
            Ok(Some((target, permit)))
        })
    }
}

/// Something in front of the store for one operation (an open or a load: the cache's session,
/// `crate::cache::Caching`), made by a [`Front`]: what the fetcher asks before and after the
/// store, what a backend's runs read through, and what the operation did.
pub(crate) trait Layer: std::fmt::Debug + Send + Sync {
    /// Whether no request may be sent: a range it lacks is [`RemoteError::NotCached`].
    fn offline(&self) -> bool;

    /// In record mode, what the record says of the object at `path` (`Some(None)`: it has none,
    /// so there is none); `None` outside record mode: ask the store.
    fn recorded_head(&self, path: &ObjectPath) -> Option<Option<ObjectMeta>>;

    /// In record mode, the recorded objects under `prefix`; `None` outside it: ask the store.
    fn recorded_list(&self, prefix: &ObjectPath) -> Option<Vec<ObjectMeta>>;

    /// An object the store described (a HEAD, or the first read of a listed object), for an
    /// open's record.
    fn saw(&self, url: &str, meta: &ObjectMeta);

    /// Fill `dest` with `object`'s bytes from `offset_bytes` if every one of them is here
    /// (checked); whether it did.
    fn read(&self, object: &RemoteObject, offset_bytes: u64, dest: &mut [u8]) -> bool;

    /// Take `bytes` (`object`'s from `offset_bytes`, just fetched from the store; `crc32c` their
    /// CRC-32C, taken as they arrived): returns once they are copied and queued (a failure to
    /// write them is reported by [`Layer::finish`], never fatal).
    fn write<'a>(
        &'a self,
        object: &'a RemoteObject,
        offset_bytes: u64,
        bytes: &'a [u8],
        crc32c: u32,
    ) -> BoxFuture<'a, ()>;

    /// The alignment every read's file offset, length and destination offset should have for
    /// this layer (a power of two; 1 for none).
    fn read_align_bytes(&self) -> u64;

    /// Call `issue` once, on this thread, with this run's source of ranges: `fetcher` wrapped.
    /// `keeps_mapping` says whether the run's memory outlives the load; a range the source takes
    /// goes to `land`. Returns the time the layer's own work went on after `issue` had returned
    /// (its tail: writes still queued), `None` when it had none.
    fn run<'s, 'r: 's>(
        &'s self,
        fetcher: Fetcher<'s>,
        keeps_mapping: bool,
        land: Land<'s, 'r>,
        issue: &mut dyn FnMut(&(dyn RangeSource<'r> + 's)),
    ) -> Option<Duration>;

    /// Note why the layer was not used for something (the report's `skipped`).
    fn note(&self, why: String);

    /// Note `objects` loaded from the local files [`Front::load_layer`] gave, `bytes` of them.
    fn add_local(&self, objects: u64, bytes: u64);

    /// End the operation (an open's layer first records what its location resolved to, unless
    /// it was opened from that record): every lock released, the copies completed promoted;
    /// what the layer did.
    fn finish(&self) -> CacheReport;

    /// [`Layer::finish`] with the copies this operation completed made durable and promoted
    /// behind it ([`CacheSync`]).
    fn finish_behind(&self) -> (CacheReport, Option<CacheSync>);
}
