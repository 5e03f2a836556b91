//! What the backend reads ranges from: a [`RangeSource`]. The store's [`Fetcher`] is one; a
//! [`Layer`] in front of the store (the cache) wraps a fetcher into another for each run, so the
//! backend knows only "a source of ranges" and never which layer, if any, is in front.

use futures::future::BoxFuture;
use tensora_io::{Permit, ReadTarget};

use super::{Fetcher, RemoteObject};
use crate::RemoteError;

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

/// Something in front of the store for a backend's runs (the cache: `crate::cache::Caching`).
pub(crate) trait Layer: std::fmt::Debug + Send + Sync {
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
    ) -> Option<std::time::Duration>;
}
