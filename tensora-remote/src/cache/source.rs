//! The cache behind the crate's one door (`crate::fetch::open_front`): the cache directory
//! ([`Cache`]) is the checkpoint's `Front`, and each open's or load's session a [`Caching`], the
//! `Layer` the fetcher asks (record-mode HEADs and listings, ranges read from copies, ranges
//! written through) and whose runs wrap the store's fetcher into [`CachedRanges`], a source of
//! ranges like the fetcher itself. Per range it takes one of four ways:
//!
//! - **a hit**: every byte of the range is in a copy and matches its records (`Entry::read`):
//!   read from there (offline, a miss is [`RemoteError::NotCached`]);
//! - **behind the load** (the run's memory outlives the load, [`CacheWrites::Behind`]): fetched,
//!   handed back to land at once, its pieces held for the session's writers;
//! - **in a lane** (a streamed window, or [`CacheWrites::BeforeLanding`]): fetched piece by piece
//!   to one of the run's lane threads, which writes the pieces and then lands the range;
//! - **copied** (no lane thread could start): fetched, copied into the writers' buffers, landed.
//!
//! An object this session does not write (another process holds it, or it has no version) is
//! read from the store only.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use object_store::ObjectMeta;
use object_store::path::Path as ObjectPath;
use tensora_io::{Permit, ReadTarget};

use super::session::{WriteLocks, describe, describe_meta, meta_of};
use super::{
    Cache, CacheReport, CacheSession, CacheSync, CacheWrites, DIRECT_ALIGN_BYTES, LANE_THREADS, LaneFill,
    LaneWork, LocationRecord, PiecesTo,
};
use crate::RemoteError;
use crate::fetch::{Fetcher, Footprint, Front, Land, Layer, RangeSource, RemoteObject, Source, ToLand};

/// The cache directory in front of a checkpoint's store.
impl Front for Cache {
    fn offline(&self) -> bool {
        self.options().offline
    }

    fn record(&self, url: &str) -> Option<Vec<RemoteObject>> {
        let record = self.location(url)?;
        Some(record.objects.iter().map(|d| RemoteObject { url: d.url.clone(), meta: meta_of(d) }).collect())
    }

    /// As the cache describes both (path, size, ETag, last-modified).
    fn unchanged(&self, recorded: &RemoteObject, found: &ObjectMeta) -> bool {
        describe_meta(&recorded.url, found) == describe(recorded)
    }

    /// Its objects are written when their locks are free (another process writing one leaves it
    /// to that process).
    fn open_layer(&self, url: &str, record: Option<Vec<RemoteObject>>) -> Arc<dyn Layer> {
        let record = record.map(|objects| LocationRecord {
            url: url.to_owned(),
            objects: objects.iter().map(describe).collect(),
        });
        let session = CacheSession::new(self.clone(), record, WriteLocks::WhenFree);
        Arc::new(Caching { session, opened: Some(url.to_owned()) })
    }

    /// Every object locked up front ([`CacheSession::hold`]): those it writes, exclusive.
    fn load_layer(
        &self,
        objects: &[RemoteObject],
        footprint: Footprint,
    ) -> (Arc<dyn Layer>, Option<Vec<PathBuf>>) {
        let session = CacheSession::new(self.clone(), None, WriteLocks::HeldOnly);
        let files = if session.hold(objects, footprint) { session.local_files(objects) } else { None };
        (Arc::new(Caching { session, opened: None }), files)
    }
}

/// The cache in front of the store for one operation: its session.
#[derive(Debug)]
pub(crate) struct Caching {
    session: CacheSession,
    /// An open's URL, whose objects are recorded when it finishes (unless opened from the record).
    opened: Option<String>,
}

impl Layer for Caching {
    fn offline(&self) -> bool {
        self.session.cache.options().offline
    }

    fn recorded_head(&self, path: &ObjectPath) -> Option<Option<ObjectMeta>> {
        self.session.head(path)
    }

    fn recorded_list(&self, prefix: &ObjectPath) -> Option<Vec<ObjectMeta>> {
        self.session.list(prefix)
    }

    fn saw(&self, url: &str, meta: &ObjectMeta) {
        self.session.saw(url, meta);
    }

    fn read(&self, object: &RemoteObject, offset_bytes: u64, dest: &mut [u8]) -> bool {
        self.session.read(object, offset_bytes, dest)
    }

    fn write<'a>(
        &'a self,
        object: &'a RemoteObject,
        offset_bytes: u64,
        bytes: &'a [u8],
        crc32c: u32,
    ) -> BoxFuture<'a, ()> {
        Box::pin(self.session.write(object, offset_bytes, bytes, crc32c))
    }

    fn note(&self, why: String) {
        self.session.note(why);
    }

    fn add_local(&self, objects: u64, bytes: u64) {
        self.session.add_local(objects, bytes);
    }

    fn finish(&self) -> CacheReport {
        let session = &self.session;
        let Some(url) = self.opened.as_ref().filter(|_| session.record.is_none()) else {
            return session.finish();
        };
        let record = LocationRecord { url: url.clone(), objects: session.seen() };
        let recorded = session.cache.record_location(&record);
        let mut report = session.finish();
        if let Err(e) = recorded {
            report.skipped.push(format!("{url}: cannot record the location: {e}"));
        }
        report
    }

    fn finish_behind(&self) -> (CacheReport, Option<CacheSync>) {
        self.session.finish_behind()
    }

    /// Whole blocks: each fetched range then goes into its copy with `O_DIRECT` from where it
    /// landed (`super::lane`).
    fn read_align_bytes(&self) -> u64 {
        DIRECT_ALIGN_BYTES as u64
    }

    /// The lane threads (none when the ranges are written behind the load) run in a scope around
    /// `issue`; once it has returned they write what is queued and land it, then end: the tail.
    fn run<'s, 'r: 's>(
        &'s self,
        fetcher: Fetcher<'s>,
        keeps_mapping: bool,
        land: Land<'s, 'r>,
        issue: &mut dyn FnMut(&(dyn RangeSource<'r> + 's)),
    ) -> Option<Duration> {
        let session = &self.session;
        let behind = keeps_mapping && session.cache.options().writes == CacheWrites::Behind;
        let arrived = std::thread::scope(|scope| {
            let lanes = if behind { Vec::new() } else { start_lanes(scope, session, land) };
            let started = !lanes.is_empty();
            let source = CachedRanges {
                fetcher: fetcher.with_layer(Some(self)),
                session,
                behind,
                lanes,
                next_lane: AtomicUsize::new(0),
            };
            issue(&source);
            // The senders go with the source: each lane thread ends once its queue is empty.
            drop(source);
            started.then(Instant::now)
        });
        arrived.map(|at| at.elapsed())
    }
}

/// Start the lane threads (at most [`LANE_THREADS`]) in `scope`: the queues of those that
/// started.
fn start_lanes<'scope, 'r: 'scope>(
    scope: &'scope std::thread::Scope<'scope, '_>,
    session: &'scope CacheSession,
    land: Land<'scope, 'r>,
) -> Vec<Sender<LaneWork<'r>>> {
    let mut lanes = Vec::with_capacity(LANE_THREADS);
    for k in 0..LANE_THREADS {
        let (lane, work) = std::sync::mpsc::channel::<LaneWork<'r>>();
        let thread = std::thread::Builder::new().name(format!("tensora-cache-lane-{k}"));
        if thread.spawn_scoped(scope, move || lane_loop(work, session, land)).is_ok() {
            lanes.push(lane);
        }
    }
    lanes
}

/// One lane thread: write each piece into its copy, and land each range (after its pieces,
/// which came first), giving back its permit. Returns once every sender is gone and the queue
/// is empty.
fn lane_loop<'r>(work: Receiver<LaneWork<'r>>, session: &CacheSession, land: Land<'_, 'r>) {
    for item in work {
        let Some((target, permit)) = item.run(session) else { continue };
        land(target);
        drop(permit);
    }
}

/// One run's ranges through the cache (see the module docs).
struct CachedRanges<'s, 'r> {
    /// The store's fetcher, reading copies first.
    fetcher: Fetcher<'s>,
    session: &'s CacheSession,
    /// Whether the pieces are written behind the load.
    behind: bool,
    /// The lane threads' queues (a range's pieces and landing go to one, in order).
    lanes: Vec<Sender<LaneWork<'r>>>,
    /// The lane the next range goes to (round robin).
    next_lane: AtomicUsize,
}

impl<'r> RangeSource<'r> for CachedRanges<'_, 'r> {
    fn fill<'a>(
        &'a self,
        object: &'a RemoteObject,
        offset_bytes: u64,
        mut target: ReadTarget<'r>,
        permit: Permit,
    ) -> BoxFuture<'a, Result<ToLand<'r>, RemoteError>>
    where
        'r: 'a,
    {
        Box::pin(async move {
            let lane = match self.lanes.len() {
                0 => None,
                n => Some(&self.lanes[self.next_lane.fetch_add(1, Ordering::Relaxed) % n]),
            };
            if !self.behind && lane.is_none() {
                // No lane thread could start: the copying writers take the range.
                let source = self.fetcher.fetch_unwritten(object, offset_bytes, target.buf()).await?;
                if let Source::Store { crc32c: Some(crc32c) } = source {
                    self.session.write(object, offset_bytes, target.buf(), crc32c).await;
                }
                return Ok(Some((target, permit)));
            }
            if self.fetcher.read_cached(object, offset_bytes, target.buf())? {
                return Ok(Some((target, permit)));
            }
            let Some(entry) = self.session.writer_entry(object) else {
                self.fetcher.fetch_store(object, offset_bytes, target.buf()).await?;
                return Ok(Some((target, permit)));
            };
            let Some(lane) = lane else {
                let to = PiecesTo::Behind(self.session);
                let mut fill = LaneFill::new(&mut target, entry, offset_bytes, to);
                self.fetcher.fetch_filling(object, offset_bytes, &mut fill).await?;
                return Ok(Some((target, permit)));
            };
            let mut fill = LaneFill::new(&mut target, entry, offset_bytes, PiecesTo::Lane(lane));
            self.fetcher.fetch_filling(object, offset_bytes, &mut fill).await?;
            // The lane lands the range after its pieces. Its receiver outlives every issuer,
            // so a send fails only if its thread is gone.
            lane.send(LaneWork::Land { target, permit }).map_err(|_| RemoteError::Cache {
                dir: self.session.cache.options().dir.clone(),
                what: "writing a range into its copy",
                source: std::io::Error::other("the cache's writing threads are gone"),
            })?;
            Ok(None)
        })
    }
}
