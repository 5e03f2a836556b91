//! The cache's one door for the backend: [`Caching`], a `Layer` whose runs wrap the store's
//! fetcher into [`CachedRanges`], a source of ranges like the fetcher itself. Per range it takes
//! one of four ways:
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

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use tensora_io::{Permit, ReadTarget};

use super::{CacheSession, CacheWrites, DIRECT_ALIGN_BYTES, LANE_THREADS, LaneFill, LaneWork, PiecesTo};
use crate::RemoteError;
use crate::fetch::{Fetcher, Land, Layer, RangeSource, RemoteObject, Source, ToLand};

/// The cache in front of the store, as a backend holds it: one load's session.
#[derive(Debug)]
pub(crate) struct Caching {
    session: Arc<CacheSession>,
}

impl Caching {
    /// The layer of `session`'s load.
    pub fn new(session: Arc<CacheSession>) -> Caching {
        Caching { session }
    }
}

impl Layer for Caching {
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
        let session = &*self.session;
        let behind = keeps_mapping && session.cache.options().writes == CacheWrites::Behind;
        let arrived = std::thread::scope(|scope| {
            let lanes = if behind { Vec::new() } else { start_lanes(scope, session, land) };
            let started = !lanes.is_empty();
            let source = CachedRanges {
                fetcher: fetcher.with_cache(Some(session)),
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
