//! [`CacheSession`]: the cache as one operation (an open or a load) uses it, behind its layer
//! (`source.rs`): ranges read from copies, fetched ranges written through, HEADs and listings
//! answered from a location record, and the locks the operation holds until
//! [`CacheSession::finish`].

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

use object_store::ObjectMeta;
use object_store::path::Path as ObjectPath;

use super::entry::{Pages, Served};
use super::lock::{Mode, ObjectLock};
use super::writer::Writers;
use super::{Cache, CacheReport, CacheSync, Description, Entry, LOCK_WAIT_MAX, LocationRecord, object_key};
use crate::fetch::{Footprint, RemoteObject, Versioning};

/// How a session gets the right to write an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WriteLocks {
    /// Take the object's lock when a range of it first needs writing, if it is free (an open:
    /// headers and indexes; a busy object is not written).
    WhenFree,
    /// Only objects locked up front by [`CacheSession::hold`] are written (a load).
    HeldOnly,
}

/// One object this session holds a lock on: exclusive to write it, shared to read a complete one.
#[derive(Debug)]
pub(crate) struct Held {
    pub entry: Arc<Entry>,
    pub complete: bool,
    key: String,
    _lock: ObjectLock,
}

/// What checking a complete copy found.
enum Complete {
    /// It may be loaded as a local file.
    Checked(Box<Entry>),
    /// Some records' bytes differ (dropped from the entry): to be demoted to partial.
    Damaged(Box<Entry>),
    /// It cannot be opened or read (a file missing, cut short, or not the cache's).
    Unreadable,
}

/// Times one object's lock is taken again because what is on disk changed while this process
/// waited for it (a complete copy evicted, or found damaged), before the object is loaded from
/// the network without being written.
const HOLD_ATTEMPTS_MAX: u32 = 4;

impl Held {
    /// The object's key.
    pub fn key(&self) -> &str {
        &self.key
    }
}

#[derive(Debug)]
pub(crate) struct CacheSession {
    pub cache: Cache,
    /// Record mode: HEADs and listings are answered from this record, nothing is sent.
    pub record: Option<LocationRecord>,
    write_locks: WriteLocks,
    held: Mutex<HashMap<String, Held>>,
    /// Entries opened for reading (complete or partial), `None` when there is none.
    readers: Mutex<HashMap<String, Option<Arc<Entry>>>>,
    /// What the open's HEADs and listing found, for the location record.
    seen: Mutex<Vec<Description>>,
    report: Mutex<CacheReport>,
    /// The threads writing landed ranges into the copies (and the tally of the in-place lane's).
    pub(crate) writers: Writers,
    /// Where the copies this session writes keep their pages ([`CacheSession::hold`] decides;
    /// an open's headers and indexes, a few KiB, go through the page cache).
    pages: Mutex<Pages>,
}

/// Where a load's copies keep their pages under the page cache's rule
/// ([`tensora_io::pages_fit`] over the memory the page cache can be given now), and the
/// rule's sum, for the report.
fn place_pages(footprint: Footprint, memory: Option<tensora_sys::MemoryRoom>) -> (Pages, String) {
    use tensora_io::PageCache;
    match tensora_io::pages_fit(footprint.to_cache_bytes, footprint.destination_bytes, memory) {
        PageCache::Keep(why) => {
            (Pages::Kept, format!("copies written through the page cache, kept for the next load ({why})"))
        }
        PageCache::Around(why) => {
            (Pages::Around, format!("copies written with O_DIRECT, around the page cache ({why})"))
        }
    }
}

/// `object` as the cache describes it.
pub(crate) fn describe(object: &RemoteObject) -> Description {
    describe_meta(&object.url, &object.meta)
}

pub(crate) fn describe_meta(url: &str, meta: &ObjectMeta) -> Description {
    let ns = SystemTime::from(meta.last_modified)
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i128);
    Description {
        url: url.to_owned(),
        path: meta.location.to_string(),
        size_bytes: meta.size,
        etag: meta.e_tag.clone(),
        last_modified_ns: ns,
    }
}

/// The store's description of a recorded object.
pub(crate) fn meta_of(d: &Description) -> ObjectMeta {
    let nanos = u64::try_from(d.last_modified_ns).unwrap_or(0);
    ObjectMeta {
        location: ObjectPath::from(d.path.as_str()),
        last_modified: (SystemTime::UNIX_EPOCH + std::time::Duration::from_nanos(nanos)).into(),
        size: d.size_bytes,
        e_tag: d.etag.clone(),
        version: None,
    }
}

impl CacheSession {
    pub fn new(cache: Cache, record: Option<LocationRecord>, write_locks: WriteLocks) -> CacheSession {
        let report = CacheReport { dir: cache.options().dir.display().to_string(), ..CacheReport::default() };
        CacheSession {
            cache,
            record,
            write_locks,
            held: Mutex::new(HashMap::new()),
            readers: Mutex::new(HashMap::new()),
            seen: Mutex::new(Vec::new()),
            report: Mutex::new(report),
            writers: Writers::default(),
            pages: Mutex::new(Pages::Kept),
        }
    }

    /// Where the copies written now keep their pages.
    fn pages(&self) -> Pages {
        *self.pages.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn skip(&self, object: &RemoteObject, why: &str) {
        self.report.lock().unwrap_or_else(|p| p.into_inner()).skipped.push(format!("{}: {why}", object.url));
    }

    /// In record mode, the recorded object at `path` (or `None` when the record has none: not
    /// found). Outside record mode, `None` of the outer option: ask the store.
    pub fn head(&self, path: &ObjectPath) -> Option<Option<ObjectMeta>> {
        let record = self.record.as_ref()?;
        Some(record.objects.iter().find(|d| d.path == path.as_ref()).map(meta_of))
    }

    /// In record mode, the recorded objects under `prefix`.
    pub fn list(&self, prefix: &ObjectPath) -> Option<Vec<ObjectMeta>> {
        let record = self.record.as_ref()?;
        Some(
            record
                .objects
                .iter()
                .map(meta_of)
                .filter(|m| m.location.prefix_match(prefix).is_some())
                .collect(),
        )
    }

    /// An object an open found (HEAD or listing), for the location record.
    pub fn saw(&self, url: &str, meta: &ObjectMeta) {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).push(describe_meta(url, meta));
    }

    /// Fill `dest` from a cached copy if every byte of the range is there.
    pub fn read(&self, object: &RemoteObject, offset_bytes: u64, dest: &mut [u8]) -> bool {
        if object.versioning() == Versioning::None {
            return false;
        }
        let key = object_key(&describe(object));
        let Some(entry) = self.reader(&key) else { return false };
        // A damaged record is dropped (and counted) by the entry: the range is fetched again. A
        // copy that cannot be read (cut short under this process) is fetched again too.
        let hit = matches!(entry.read(offset_bytes, dest), Ok(Served::Hit));
        if hit {
            self.report.lock().unwrap_or_else(|p| p.into_inner()).hit_bytes += dest.len() as u64;
        }
        hit
    }

    fn reader(&self, key: &str) -> Option<Arc<Entry>> {
        if let Some(h) = self.held.lock().unwrap_or_else(|p| p.into_inner()).get(key) {
            return Some(Arc::clone(&h.entry));
        }
        let mut readers = self.readers.lock().unwrap_or_else(|p| p.into_inner());
        readers
            .entry(key.to_owned())
            .or_insert_with(|| {
                Entry::open(&self.cache.complete_dir(key))
                    .or_else(|_| Entry::open(&self.cache.partial_dir(key)))
                    .ok()
                    .map(Arc::new)
            })
            .clone()
    }

    /// Write a fetched range (`crc32c` its CRC-32C, computed as it was fetched) into the object's
    /// copy, through the writer threads (a failure is reported, never fatal): returns once the
    /// range is copied and queued.
    pub async fn write(&self, object: &RemoteObject, offset_bytes: u64, bytes: &[u8], crc32c: u32) {
        if let Some(entry) = self.writer_entry(object) {
            self.writers.queue(entry, &object.url, offset_bytes, bytes, crc32c).await;
        }
    }

    /// The copy of `object` this session writes, if it writes one.
    pub(crate) fn writer_entry(&self, object: &RemoteObject) -> Option<Arc<Entry>> {
        if object.versioning() == Versioning::None {
            return None;
        }
        let description = describe(object);
        let key = object_key(&description);
        let writer = {
            let held = self.held.lock().unwrap_or_else(|p| p.into_inner());
            held.get(&key).filter(|h| !h.complete).map(|h| Arc::clone(&h.entry))
        };
        match (writer, self.write_locks) {
            (Some(w), _) => Some(w),
            (None, WriteLocks::HeldOnly) => None,
            (None, WriteLocks::WhenFree) => self.take_free(&key, &description),
        }
    }

    /// The object's lock if it is free right now, and its partial entry (an open's headers).
    fn take_free(&self, key: &str, description: &Description) -> Option<Arc<Entry>> {
        let complete = self.cache.complete_dir(key);
        if complete.exists() {
            return None;
        }
        let mut lock = self.cache.lock_file(key).ok()?;
        // Decided again with the lock held: another process may have promoted it meanwhile.
        if !lock.try_take(Mode::Exclusive).ok()? || complete.exists() {
            return None;
        }
        let entry = Arc::new(Entry::create(&self.cache.partial_dir(key), description, self.pages()).ok()?);
        let held = Held { entry: Arc::clone(&entry), complete: false, key: key.to_owned(), _lock: lock };
        self.held.lock().unwrap_or_else(|p| p.into_inner()).insert(key.to_owned(), held);
        Some(entry)
    }

    /// Lock every object of a load, in key order (so two processes never wait on each other
    /// in a cycle): shared for a complete copy, exclusive (and its partial entry open for
    /// writing) for the rest. All waits share one [`LOCK_WAIT_MAX`]; an object still held by
    /// another process past it is loaded from the network without being written. Whether every
    /// object is complete here (the load can read local files only). The copies it writes keep
    /// their pages cached when the load's `footprint` fits the page cache's rule, else they are
    /// written around it (the report's `pages` says which and why).
    pub fn hold(&self, objects: &[RemoteObject], footprint: Footprint) -> bool {
        let (pages, why) = place_pages(footprint, tensora_sys::memory_room());
        *self.pages.lock().unwrap_or_else(|p| p.into_inner()) = pages;
        self.report.lock().unwrap_or_else(|p| p.into_inner()).pages = why;
        let deadline = Instant::now() + LOCK_WAIT_MAX;
        let waited = Instant::now();
        let mut keyed: Vec<(String, &RemoteObject)> =
            objects.iter().map(|o| (object_key(&describe(o)), o)).collect();
        keyed.sort_by(|a, b| a.0.cmp(&b.0));
        keyed.dedup_by(|a, b| a.0 == b.0);
        let mut all_complete = true;
        for (key, object) in keyed {
            if object.versioning() == Versioning::None {
                self.skip(object, "the server gives it no version");
                all_complete = false;
                continue;
            }
            match self.hold_one(&key, object, deadline) {
                Ok(Some(complete)) => all_complete &= complete,
                Ok(None) => {
                    self.skip(object, "another process held it past the lock wait bound");
                    all_complete = false;
                }
                Err(e) => {
                    self.skip(object, &format!("cache error: {e}"));
                    all_complete = false;
                }
            }
        }
        self.report.lock().unwrap_or_else(|p| p.into_inner()).lock_wait_seconds +=
            waited.elapsed().as_secs_f64();
        all_complete
    }

    /// Lock one object: `Some(complete)`, or `None` when the wait ran out. The mode is chosen
    /// from what is on disk, then decided again once the lock is held (the complete copy may
    /// have been promoted, evicted or found damaged meanwhile): shared to read a complete copy
    /// whose check holds, exclusive to write a partial one (a damaged complete copy is demoted
    /// to partial first).
    fn hold_one(&self, key: &str, object: &RemoteObject, deadline: Instant) -> std::io::Result<Option<bool>> {
        if let Some(h) = self.held.lock().unwrap_or_else(|p| p.into_inner()).get(key) {
            return Ok(Some(h.complete || h.entry.is_complete()));
        }
        let complete_dir = self.cache.complete_dir(key);
        let mut mode = if complete_dir.exists() { Mode::Shared } else { Mode::Exclusive };
        for _ in 0..HOLD_ATTEMPTS_MAX {
            let mut lock = self.cache.lock_file(key)?;
            if !lock.wait(mode, deadline)? {
                return Ok(None);
            }
            let complete_here = std::fs::symlink_metadata(&complete_dir).is_ok();
            let (entry, complete) = match (mode, complete_here) {
                // Evicted (or demoted) while this process waited: write it instead.
                (Mode::Shared, false) => {
                    mode = Mode::Exclusive;
                    continue;
                }
                (Mode::Shared, true) => match self.checked_complete(&complete_dir) {
                    Complete::Checked(entry) => (*entry, true),
                    Complete::Damaged(_) | Complete::Unreadable => {
                        mode = Mode::Exclusive;
                        continue;
                    }
                },
                (Mode::Exclusive, true) => match self.checked_complete(&complete_dir) {
                    // Completed by another process while this one waited: read it, shared.
                    Complete::Checked(entry) => {
                        if !lock.try_take(Mode::Shared)? {
                            mode = Mode::Shared;
                            continue;
                        }
                        (*entry, true)
                    }
                    damaged => {
                        let partial = self.cache.partial_dir(key);
                        let demoted = match damaged {
                            Complete::Damaged(entry) => entry.demote(&partial).is_ok(),
                            _ => false,
                        };
                        if !demoted {
                            super::files::remove_dir(&complete_dir)?;
                        }
                        (Entry::create(&partial, &describe(object), self.pages())?, false)
                    }
                },
                (Mode::Exclusive, false) => {
                    (Entry::create(&self.cache.partial_dir(key), &describe(object), self.pages())?, false)
                }
            };
            super::touch(&entry.dir);
            let held = Held { entry: Arc::new(entry), complete, key: key.to_owned(), _lock: lock };
            self.held.lock().unwrap_or_else(|p| p.into_inner()).insert(key.to_owned(), held);
            return Ok(Some(complete));
        }
        Err(std::io::Error::other("its cached copy kept changing while this process waited for it"))
    }

    /// The complete copy in `dir`, checked (`Entry::check_complete`); damage found is counted.
    fn checked_complete(&self, dir: &Path) -> Complete {
        let Ok(entry) = Entry::open(dir) else {
            self.count_damage(1, 0);
            return Complete::Unreadable;
        };
        let checked = entry.check_complete();
        let found = &entry.found;
        self.count_damage(
            found.damaged_records.swap(0, Ordering::Relaxed),
            found.damaged_bytes.swap(0, Ordering::Relaxed),
        );
        match checked {
            Ok(true) => Complete::Checked(Box::new(entry)),
            Ok(false) => Complete::Damaged(Box::new(entry)),
            Err(_) => Complete::Unreadable,
        }
    }

    fn count_damage(&self, records: u64, bytes: u64) {
        let mut report = self.report.lock().unwrap_or_else(|p| p.into_inner());
        report.damaged_records += records;
        report.damaged_bytes += bytes;
    }

    /// The local data file of each object, when every one is held complete.
    pub fn local_files(&self, objects: &[RemoteObject]) -> Option<Vec<std::path::PathBuf>> {
        let held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        objects
            .iter()
            .map(|o| {
                let h = held.get(&object_key(&describe(o)))?;
                let data = h.entry.dir.join("data");
                (h.complete && h.entry.data_is(&data)).then_some(data)
            })
            .collect()
    }

    /// Objects the open found, for [`Cache::record_location`].
    pub fn seen(&self) -> Vec<Description> {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner()).clone();
        seen.sort_by(|a, b| a.path.cmp(&b.path));
        seen.dedup_by(|a, b| a.path == b.path);
        seen
    }

    /// Note why the cache was not used for something.
    pub fn note(&self, why: String) {
        self.report.lock().unwrap_or_else(|p| p.into_inner()).skipped.push(why);
    }

    /// Note objects loaded through local files.
    pub fn add_local(&self, n: u64, bytes: u64) {
        let mut report = self.report.lock().unwrap_or_else(|p| p.into_inner());
        report.local_objects += n;
        report.hit_bytes += bytes;
    }

    /// Promote every written object that is now complete, release every lock, and evict down to
    /// the size cap. What the cache did.
    pub fn finish(&self) -> CacheReport {
        let (mut report, sync) = self.finish_behind();
        if let Some(sync) = sync {
            sync.wait(&mut report);
        }
        report
    }

    /// [`CacheSession::finish`], with the objects this load completed made durable and promoted
    /// behind it ([`CacheSync`]), with the ranges still queued for the writers: the locks travel
    /// with them.
    pub fn finish_behind(&self) -> (CacheReport, Option<CacheSync>) {
        let writers = self.writers.close();
        let held: Vec<Held> =
            self.held.lock().unwrap_or_else(|p| p.into_inner()).drain().map(|(_, h)| h).collect();
        let readers: Vec<Arc<Entry>> =
            self.readers.lock().unwrap_or_else(|p| p.into_inner()).drain().filter_map(|(_, e)| e).collect();
        for entry in held.iter().map(|h| &h.entry).chain(&readers) {
            self.count_damage(
                entry.found.damaged_records.swap(0, Ordering::Relaxed),
                entry.found.damaged_bytes.swap(0, Ordering::Relaxed),
            );
        }
        let mut report = self.report.lock().unwrap_or_else(|p| p.into_inner()).clone();
        report.written_bytes = self.writers.written_bytes();
        let sync = CacheSync::start(self.cache.clone(), writers, held, &mut report);
        (report, sync)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::entry::Promoted;
    use crate::cache::{CacheOptions, LOCK_POLL_INTERVAL};

    /// A small load's footprint.
    const FOOTPRINT: Footprint = Footprint { to_cache_bytes: 100, destination_bytes: 100 };

    fn room(available_gb: u64) -> tensora_sys::MemoryRoom {
        tensora_sys::MemoryRoom {
            total_bytes: 24 << 30,
            available_bytes: available_gb << 30,
            cgroup_limit_bytes: None,
        }
    }

    /// Issue 40 item 2: a load's copies stay in the page cache exactly when the copies, the
    /// load's own memory and the margin (3 GiB of 24) fit in what is available; else, or with the
    /// memory unknown, they are written around it, and the reason says which.
    #[test]
    fn copies_keep_their_pages_only_when_the_load_fits_the_page_cache() {
        let load = Footprint { to_cache_bytes: 2 << 30, destination_bytes: 2 << 30 };
        let (kept, why) = place_pages(load, Some(room(8)));
        assert_eq!(kept, Pages::Kept, "{why}");
        assert!(why.contains("through the page cache") && why.contains("<="), "{why}");
        let (around, why) = place_pages(load, Some(room(6)));
        assert_eq!(around, Pages::Around, "2 + 2 + 3 GiB do not fit in 6: {why}");
        assert!(why.contains("O_DIRECT") && why.contains('>'), "{why}");
        assert_eq!(place_pages(load, None).0, Pages::Around);
        let streamed = Footprint { destination_bytes: 256 << 20, ..load };
        assert_eq!(place_pages(streamed, Some(room(6))).0, Pages::Kept, "a window instead of an arena fits");
    }

    fn object(size: u64) -> RemoteObject {
        let meta = ObjectMeta {
            location: ObjectPath::from("x"),
            last_modified: SystemTime::UNIX_EPOCH.into(),
            size,
            e_tag: Some("e".into()),
            version: None,
        };
        RemoteObject { url: "http://h/x".into(), meta }
    }

    /// Finding 5 (issue 39): a load that saw a complete copy and waits for a shared lock, while
    /// another process evicts that copy, writes the partial copy it then needs under an exclusive
    /// lock (it wrote it under the shared one, beside another writer).
    #[test]
    fn finding_5_the_lock_mode_is_decided_again_once_the_lock_is_held() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::open(&CacheOptions {
            dir: dir.path().to_path_buf(),
            size_max_bytes: None,
            offline: false,
            writes: super::super::CacheWrites::default(),
        })
        .unwrap();
        let o = object(100);
        let key = object_key(&describe(&o));
        let entry = Entry::create(&cache.partial_dir(&key), &describe(&o), Pages::Around).unwrap();
        entry.write(0, &[9u8; 100], crate::crc::crc32c(&[9u8; 100])).unwrap();
        assert_eq!(entry.promote(&cache.complete_dir(&key)).unwrap(), Promoted::Done);
        // An evictor holds the object's lock; the load sees the complete copy and waits, shared.
        let mut evictor = cache.lock_file(&key).unwrap();
        assert!(evictor.try_take(Mode::Exclusive).unwrap());
        let session = CacheSession::new(cache.clone(), None, WriteLocks::HeldOnly);
        std::thread::scope(|s| {
            let holding = s.spawn(|| session.hold(std::slice::from_ref(&o), FOOTPRINT));
            std::thread::sleep(15 * LOCK_POLL_INTERVAL);
            std::fs::remove_dir_all(cache.complete_dir(&key)).unwrap();
            drop(evictor);
            assert!(!holding.join().unwrap(), "the copy is no longer complete");
        });
        assert!(session.writer_entry(&o).is_some(), "the load writes the partial copy");
        let mut other = cache.lock_file(&key).unwrap();
        assert!(!other.try_take(Mode::Shared).unwrap(), "under an exclusive lock");
    }
}
