//! Write-behind: after a load has its tensors, the ranges still queued are written, the copies the
//! load completed are made durable (`fsync` of data and range log) and promoted (one rename), on a
//! thread of their own, so that a cold-cache load does not wait for the disk. [`CacheSync`] owns
//! that thread: dropping it, or [`CacheSync::wait`], joins it. Until it is done the objects stay
//! locked (another process waits for them, at most [`super::LOCK_WAIT_MAX`], then reads the
//! complete copies); a process killed before it is done leaves partial copies with their range
//! logs, and the next load fetches only what is missing (nothing, if every range was written).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use super::entry::Promoted;
use super::seal::{Sealed, Seals};
use super::session::Held;
use super::writer::{Closed, Tally};
use super::{Cache, CacheReport};

/// What the write-behind did.
#[derive(Debug, Default)]
pub(crate) struct Synced {
    tally: Tally,
    promoted: u64,
    skipped: Vec<String>,
    evicted: u64,
    seconds: f64,
    damaged_records: u64,
    damaged_bytes: u64,
}

/// The thread finishing a load's cache work; joined on drop.
#[derive(Debug)]
pub struct CacheSync {
    handle: Option<JoinHandle<Synced>>,
    /// The seals of the held pieces still being written.
    seals: Arc<Seals>,
}

/// The work behind a load: wait for the writers, promote every held copy that is now complete
/// (each locked by this process; a lock is released once its copy is done), evict down to the
/// size cap.
fn finish_behind(cache: &Cache, writers: Closed, held: Vec<Held>) -> Synced {
    let t = Instant::now();
    let mut synced = Synced { tally: writers.join(), ..Synced::default() };
    for h in held {
        if h.complete || !h.entry.is_complete() {
            continue;
        }
        match h.entry.promote(&cache.complete_dir(h.key())) {
            Ok(Promoted::Done) => synced.promoted += 1,
            Ok(Promoted::Damaged) => {
                let found = &h.entry.found;
                synced.damaged_records += found.damaged_records.swap(0, Ordering::Relaxed);
                synced.damaged_bytes += found.damaged_bytes.swap(0, Ordering::Relaxed);
                let url = &h.entry.description.url;
                synced.skipped.push(format!("{url}: ranges that differ from their CRC-32C were left out"));
            }
            Err(e) => synced.skipped.push(format!("{}: promoting failed: {e}", h.entry.description.url)),
        }
    }
    synced.evicted = cache.evict();
    synced.seconds = t.elapsed().as_secs_f64();
    synced
}

impl CacheSync {
    /// Finish `writers` and `held` on a new thread (`report.promoting` says how many copies it may
    /// complete). `None`, with `report` complete, when there is nothing to wait for, or when no
    /// thread can be started (the work is then done on this one).
    pub(crate) fn start(
        cache: Cache,
        writers: Closed,
        held: Vec<Held>,
        report: &mut CacheReport,
    ) -> Option<CacheSync> {
        let completing = held.iter().filter(|h| !h.complete).count() as u64;
        if writers.is_idle() && !held.iter().any(|h| !h.complete && h.entry.is_complete()) {
            drop(held);
            report.evicted = cache.evict();
            return None;
        }
        let seals = writers.seals();
        // The thread takes the work from this slot; if it cannot be started, this one does.
        let slot = Arc::new(Mutex::new(Some((writers, held))));
        let theirs = Arc::clone(&slot);
        let behind_cache = cache.clone();
        let spawned = std::thread::Builder::new().name("tensora-cache-sync".into()).spawn(move || {
            let work = theirs.lock().unwrap_or_else(|p| p.into_inner()).take();
            work.map_or_else(Synced::default, |(writers, held)| finish_behind(&behind_cache, writers, held))
        });
        match spawned {
            Ok(handle) => {
                report.promoting = completing;
                Some(CacheSync { handle: Some(handle), seals })
            }
            Err(_) => {
                if let Some((writers, held)) = slot.lock().unwrap_or_else(|p| p.into_inner()).take() {
                    merge(report, finish_behind(&cache, writers, held));
                }
                None
            }
        }
    }

    /// Wait for the queued ranges to be written and the completed copies to be durable and
    /// promoted, and add what was done to `report`.
    pub fn wait(mut self, report: &mut CacheReport) {
        report.sealed_bytes = self.seals.sealed_bytes();
        if let Some(synced) = self.join() {
            merge(report, synced);
        }
    }

    /// Seal every held piece not written yet with the CRC-32C of its bytes in the load's memory
    /// (`bytes_of` an arena range), before the caller can change them: a piece is then recorded
    /// only if the disk holds those bytes (see `super::seal`).
    pub(crate) fn seal<'m>(&self, bytes_of: impl Fn(std::ops::Range<u64>) -> Option<&'m [u8]>) -> Sealed {
        self.seals.seal(bytes_of)
    }

    /// Bytes sealed before they were written, in all.
    pub(crate) fn sealed_bytes(&self) -> u64 {
        self.seals.sealed_bytes()
    }

    /// Whether the work is done (waiting for it then returns at once).
    pub fn is_finished(&self) -> bool {
        self.handle.as_ref().is_none_or(JoinHandle::is_finished)
    }

    fn join(&mut self) -> Option<Synced> {
        let handle = self.handle.take()?;
        Some(handle.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
    }
}

impl Drop for CacheSync {
    /// Joins the thread: no write-behind outlives its owner.
    fn drop(&mut self) {
        let _ = self.join();
    }
}

fn merge(report: &mut CacheReport, synced: Synced) {
    report.promoting = 0;
    report.written_bytes = synced.tally.written_bytes;
    report.changed_bytes = synced.tally.changed_bytes;
    report.skipped.extend(synced.tally.failed);
    report.promoted += synced.promoted;
    report.skipped.extend(synced.skipped);
    report.evicted = synced.evicted;
    report.sync_seconds = synced.seconds;
    report.damaged_records += synced.damaged_records;
    report.damaged_bytes += synced.damaged_bytes;
}
