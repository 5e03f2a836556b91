//! The verified local cache (`--cache DIR`, [`CacheOptions`]).
//!
//! A remote load writes every range it fetches into a local copy of its object from where it
//! landed (no second download; an owned load's pieces behind it, each recorded with the CRC-32C
//! its writer took from the memory before the caller could change it, see `lane.rs` and
//! `seal.rs`) and records what it wrote
//! (each range, or each 1 MiB piece of a load's ranges, with its CRC-32C) in the object's range
//! log; a load that
//! finds ranges already there reads them from the copy. A copy whose ranges cover the
//! whole object is promoted atomically (one rename) and keyed by URL + version (ETag, else
//! Last-Modified) + size, so a changed object is a new key and never mixes with the old one. An
//! open records which objects a location resolved to (`locations/`); the next open of that URL
//! confirms each with one HEAD (none at all with [`CacheOptions::offline`]) and, when every object
//! is complete here, reads the index and headers from the copies and loads through `tensora_io`
//! from local files.
//!
//! The rest of the crate reaches the cache through one door, `crate::fetch`'s `open_front`: the
//! cache directory is a `Front` and each open's or load's session a `Layer` (`source.rs`), whose
//! runs wrap the store's fetcher into a source of ranges, which decides per range whether it is
//! read from a copy, written behind the load, through a lane thread, or copied to the writers. A load's
//! copies are written through the page cache when they fit in it (the page cache's rule,
//! `tensora_io::pages_fit`, over the load's selection and destination), so a load right
//! after the fill reads memory, as a warm local load does; otherwise with `O_DIRECT`, around it,
//! leaving the node's other cached pages where they are ([`CacheReport::pages`] says which).
//!
//! Every byte served from a copy equals the CRC-32C recorded when it arrived: a partial copy's
//! ranges are checked as they are read, a complete copy whole before its promotion, with a
//! marker checked before each load (`entry.rs`, `check.rs`); a damaged record or range is
//! dropped and fetched again (`CacheReport::damaged_records`), never served. The directory is
//! private (`0700` folders, `0600` files, nothing followed through a symlink, no FIFO waited
//! on, a directory another user owns or may write refused: `files.rs`), and an object's lock
//! belongs to the process that took it, not to a child it forks (`lock.rs`).
//!
//! Layout of `DIR`: `objects/<key>/` (complete: `data`, `ranges`, `object.json`, `verified`),
//! `partial/<key>/` (the same but `verified`, in progress), `locks/<key>` (one lock file per object: a loader holds it exclusive
//! while it writes the object, shared while it reads a complete one), `locations/<hash>.json`.
//! Two processes loading one URL at once: the second waits (at most [`LOCK_WAIT_MAX`]) for the
//! first to finish an object, then reads it from the cache; past the bound it loads that object
//! from the network without writing it. A size cap evicts the least recently used complete
//! objects that nobody holds.

mod check;
mod entry;
mod files;
mod lane;
mod lock;
mod ranges;
mod seal;
mod session;
mod source;
mod sync;
mod writer;

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};
use sha2::Digest as _;

pub use entry::{DIRECT_ALIGN_BYTES, Description, Entry};
pub use lane::{LANE_THREADS, PIECE_BYTES};
pub(crate) use lane::{LaneFill, LaneWork, PiecesTo};
pub use lock::LOCKS_HELD_MAX;
pub use ranges::{RECORDS_MAX, RangeRecord};
pub(crate) use session::CacheSession;
pub use sync::CacheSync;
pub use writer::{WRITE_BEHIND_BYTES, WRITER_THREADS};

use crate::RemoteError;
use lock::{Mode, ObjectLock};

/// How long a loader waits for another process that holds an object's lock.
pub const LOCK_WAIT_MAX: Duration = Duration::from_secs(600);
/// How often a waiting loader tries the lock again.
pub const LOCK_POLL_INTERVAL: Duration = Duration::from_millis(20);
/// Objects a location record may list.
pub const RECORD_OBJECTS_MAX: usize = 65_536 + 2;
/// Bytes of a location record read back.
pub const RECORD_BYTES_MAX: u64 = 64 << 20;

/// Where the cache lives and how it is used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheOptions {
    /// The cache directory (created if missing).
    pub dir: PathBuf,
    /// Evict least recently used complete objects while the cache holds more than this.
    pub size_max_bytes: Option<u64>,
    /// Send no request at all: open and load from the cache only (a location never opened
    /// with this cache, or an object not complete in it, is [`RemoteError::NotCached`]).
    pub offline: bool,
    /// When an owned load's ranges are written into the copies.
    pub writes: CacheWrites,
}

/// When an owned load's fetched ranges are written into the cache's copies (a streamed load,
/// whose window is reused, always writes each range before it lands).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CacheWrites {
    /// Behind the load: each range lands as soon as it has arrived and its pieces are written
    /// after (or while) the load returns, each with the CRC-32C taken from the memory while the
    /// caller could not change it yet (a piece sealed first is read back and kept only if the
    /// disk holds what arrived). The fastest load; a caller that rewrites the tensors in place before the copies
    /// are written ([`crate::RemoteLoaded::wait_cache`]) leaves those pieces out of the cache,
    /// and the next load fetches them again.
    #[default]
    Behind,
    /// Before each range lands: the load returns with every range on disk (only the `fsync`s
    /// and renames run behind it), whatever the caller does with the tensors next. About a
    /// quarter slower than no cache where the CPU bounds the load (docs/design.md).
    BeforeLanding,
}

/// What the cache did for one open or load.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct CacheReport {
    /// The cache directory.
    pub dir: String,
    /// Bytes read from cached copies.
    pub hit_bytes: u64,
    /// Bytes fetched from the network and written into the cache.
    pub written_bytes: u64,
    /// Where this load's copies keep their pages, and why (the page cache's rule,
    /// `tensora_io::pages_fit`): through the page cache, so that the next load of them
    /// reads memory, when the load fits; else around it, with `O_DIRECT`. Empty when nothing
    /// was to be written.
    pub pages: String,
    /// Bytes written behind the load that the disk, read back, did not hold as they were sealed
    /// (see `sealed_bytes`): the caller changed them in memory first (an engine rewriting weights
    /// in place). They are left out of the copy, and the next load fetches them again.
    pub changed_bytes: u64,
    /// Bytes written behind the load that were not written yet when the caller reached the
    /// tensors for writing before the copies were done (`RemoteLoaded::loaded`,
    /// `RemoteLoaded::take_cache_sync`, the Python binding's `cache_writes="behind"`): their
    /// CRC-32C was taken from memory then, and each piece is recorded only if the disk holds
    /// those bytes. 0 otherwise: the bytes cannot change before they are written, and a piece is
    /// recorded with the CRC of what the disk holds.
    pub sealed_bytes: u64,
    /// Objects completed (made durable and promoted) by this operation.
    pub promoted: u64,
    /// Objects this load wrote whose copies are being finished behind it (queued ranges written,
    /// then made durable and promoted, see [`CacheSync`]); 0 once that is done, when the ones
    /// completed are counted in `promoted`.
    pub promoting: u64,
    /// Seconds the write-behind took after the load returned (queued writes, `fsync` of the
    /// copies, renames, eviction), once done.
    pub sync_seconds: f64,
    /// Seconds the load still waited for the disk after its last range had arrived (the lane
    /// threads writing the pieces queued behind the network), summed over its runs: part of the
    /// load's time that a load without a cache does not have. 0 for an owned load, whose ranges
    /// are written behind it.
    pub disk_tail_seconds: f64,
    /// Objects loaded through `tensora_io` from complete local copies.
    pub local_objects: u64,
    /// Time spent waiting for another process's lock.
    pub lock_wait_seconds: f64,
    /// Objects not cached by this operation, and why (another process held them past the
    /// bound, an unversioned object, a write that failed).
    pub skipped: Vec<String>,
    /// Objects evicted to stay under the size cap.
    pub evicted: u64,
    /// Range records found not to hold what they claim (a torn or damaged log record, or
    /// cached bytes that differ from the CRC-32C recorded when they arrived): dropped, never
    /// served; their ranges are fetched again (or, offline, the load fails).
    pub damaged_records: u64,
    /// Bytes of the cached ranges found to differ from their CRC-32C (fetched again).
    pub damaged_bytes: u64,
}

/// A cache directory.
#[derive(Debug, Clone)]
pub struct Cache {
    opts: CacheOptions,
}

/// One object found in a cache directory, for `tensora cache ls|verify`.
#[derive(Debug, Clone, Serialize)]
pub struct CachedObject {
    /// Its key (directory name).
    pub key: String,
    /// Complete (promoted) or partial.
    pub complete: bool,
    /// What it is a copy of.
    pub url: String,
    /// Its version: ETag, else Last-Modified.
    pub version: String,
    /// Object size.
    pub size_bytes: u64,
    /// Bytes of it in the cache.
    pub cached_bytes: u64,
    /// When it was last used (seconds since the Unix epoch).
    pub used_unix_seconds: u64,
}

/// One object checked by [`Cache::verify`].
#[derive(Debug, Clone)]
pub struct VerifiedObject {
    /// The object.
    pub object: CachedObject,
    /// Its recorded ranges whose bytes differ from their CRC-32C.
    pub bad_ranges: Vec<RangeRecord>,
    /// Records of its range log that fail their own checksum, lie outside the object, or are
    /// torn (all ignored by loads: their ranges are fetched again).
    pub bad_log_records: u64,
}

impl VerifiedObject {
    /// Whether anything in it is damaged.
    pub fn is_damaged(&self) -> bool {
        !self.bad_ranges.is_empty() || self.bad_log_records > 0
    }
}

/// Which objects a location resolved to when it was last opened.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct LocationRecord {
    /// The location's URL (credentials redacted).
    pub url: String,
    /// Each object the open found, as the store described it.
    pub objects: Vec<Description>,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The key of one version of one object: URL, version and size, hashed.
pub fn object_key(description: &Description) -> String {
    let version = match &description.etag {
        Some(tag) => format!("etag {tag}"),
        None => format!("last-modified {}", description.last_modified_ns),
    };
    let text = format!("{}\n{version}\n{}", description.url, description.size_bytes);
    hex(&sha2::Sha256::digest(text.as_bytes())[..16])
}

impl Cache {
    /// The cache at `opts.dir`, its folders created if missing.
    /// The cache directory must be this user's and writable by nobody else; its folders are
    /// made private (`0700`).
    pub fn open(opts: &CacheOptions) -> Result<Cache, RemoteError> {
        let refused =
            |source| RemoteError::Cache { dir: opts.dir.clone(), what: "cannot use the cache", source };
        files::private_dir(&opts.dir, files::Symlink::Followed).map_err(refused)?;
        for sub in ["objects", "partial", "locks", "locations"] {
            files::private_dir(&opts.dir.join(sub), files::Symlink::Refused).map_err(refused)?;
        }
        Ok(Cache { opts: opts.clone() })
    }

    /// The options it was opened with.
    pub fn options(&self) -> &CacheOptions {
        &self.opts
    }

    /// Where the complete copy of `key` lives.
    pub fn complete_dir(&self, key: &str) -> PathBuf {
        self.opts.dir.join("objects").join(key)
    }

    /// Where the copy of `key` in progress lives.
    pub fn partial_dir(&self, key: &str) -> PathBuf {
        self.opts.dir.join("partial").join(key)
    }

    fn record_path(&self, url: &str) -> PathBuf {
        let name = hex(&sha2::Sha256::digest(url.as_bytes())[..16]);
        self.opts.dir.join("locations").join(format!("{name}.json"))
    }

    /// The record of what `url` resolved to, if it was opened with this cache before.
    pub fn location(&self, url: &str) -> Option<LocationRecord> {
        let text = files::read_capped(&self.record_path(url), RECORD_BYTES_MAX).ok()?;
        let record: LocationRecord = serde_json::from_slice(&text).ok()?;
        (record.url == url && record.objects.len() <= RECORD_OBJECTS_MAX).then_some(record)
    }

    /// Record what `record.url` resolved to (atomically replacing an older record).
    pub fn record_location(&self, record: &LocationRecord) -> std::io::Result<()> {
        let bytes = serde_json::to_vec(record).map_err(std::io::Error::other)?;
        files::replace(&self.record_path(&record.url), &bytes, files::Durable::Buffered)
    }

    /// The lock of `key`, its file opened (created if missing), not taken yet.
    pub(crate) fn lock_file(&self, key: &str) -> std::io::Result<ObjectLock> {
        ObjectLock::open(&self.opts.dir.join("locks").join(key))
    }

    /// Every object in the cache, complete and partial.
    pub fn list(&self) -> Vec<CachedObject> {
        let mut out = Vec::new();
        for (sub, complete) in [("objects", true), ("partial", false)] {
            let Ok(dirs) = std::fs::read_dir(self.opts.dir.join(sub)) else { continue };
            for dir in dirs.flatten() {
                let Ok(entry) = Entry::open(&dir.path()) else { continue };
                let d = &entry.description;
                let used = std::fs::symlink_metadata(dir.path().join("ranges"))
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
                    .map_or(0, |t| t.as_secs());
                out.push(CachedObject {
                    key: dir.file_name().to_string_lossy().into_owned(),
                    complete,
                    url: d.url.clone(),
                    version: d.etag.clone().map_or_else(
                        || format!("last-modified {}", d.last_modified_ns),
                        |t| format!("etag {t}"),
                    ),
                    size_bytes: d.size_bytes,
                    cached_bytes: entry.covered_bytes(),
                    used_unix_seconds: used,
                });
            }
        }
        out.sort_by(|a, b| a.url.cmp(&b.url).then(a.key.cmp(&b.key)));
        out
    }

    /// Remove the objects whose URL starts with `url_prefix` (all with `None`) that no process
    /// holds; the keys removed, and the keys skipped because a process holds them.
    pub fn remove(&self, url_prefix: Option<&str>) -> (Vec<String>, Vec<String>) {
        let (mut removed, mut busy) = (Vec::new(), Vec::new());
        for object in self.list() {
            if url_prefix.is_some_and(|p| !object.url.starts_with(p)) {
                continue;
            }
            match self.remove_key(&object.key, object.complete) {
                Ok(true) => removed.push(object.key),
                Ok(false) | Err(_) => busy.push(object.key),
            }
        }
        (removed, busy)
    }

    /// Remove one object if nobody holds its lock; whether it was removed.
    fn remove_key(&self, key: &str, complete: bool) -> std::io::Result<bool> {
        let mut lock = self.lock_file(key)?;
        if !lock.try_take(Mode::Exclusive)? {
            return Ok(false);
        }
        let dir = if complete { self.complete_dir(key) } else { self.partial_dir(key) };
        files::remove_dir(&dir)?;
        Ok(true)
    }

    /// Evict the least recently used objects nobody holds while the cache holds more than its
    /// cap; the number evicted.
    pub fn evict(&self) -> u64 {
        let Some(cap) = self.opts.size_max_bytes else { return 0 };
        let mut objects = self.list();
        let mut total: u64 = objects.iter().map(|o| o.cached_bytes).sum();
        objects.sort_by_key(|o| o.used_unix_seconds);
        let mut evicted = 0;
        for o in objects {
            if total <= cap {
                break;
            }
            if self.remove_key(&o.key, o.complete).unwrap_or(false) {
                total = total.saturating_sub(o.cached_bytes);
                evicted += 1;
            }
        }
        evicted
    }

    /// Each object's recorded ranges checked against their CRC-32C, and its range log's records
    /// against their own checksums, for every object (an unreadable object is one bad range
    /// covering it).
    pub fn verify(&self) -> Vec<VerifiedObject> {
        let mut out = Vec::new();
        for object in self.list() {
            let dir =
                if object.complete { self.complete_dir(&object.key) } else { self.partial_dir(&object.key) };
            let whole = RangeRecord { offset_bytes: 0, len_bytes: object.size_bytes, crc32c: 0 };
            let (bad_ranges, bad_log_records) = match Entry::open(&dir) {
                Ok(e) => (
                    e.verify().unwrap_or_else(|_| vec![whole]),
                    e.found.damaged_records.load(std::sync::atomic::Ordering::Relaxed),
                ),
                Err(_) => (vec![whole], 0),
            };
            out.push(VerifiedObject { object, bad_ranges, bad_log_records });
        }
        out
    }
}

/// Touch an entry's range log so that eviction sees it used now.
pub(crate) fn touch(dir: &Path) {
    if let Ok(f) = files::open(&dir.join("ranges"), files::Open::ReadWrite) {
        let _ = f.set_modified(SystemTime::now());
    }
}

/// The readers of what a cache directory holds, for the fuzz targets in `fuzz/` (not an API:
/// hidden from the docs, and free to change).
#[doc(hidden)]
pub mod fuzzing {
    pub use super::entry::Description;
    pub use super::ranges::{LogDamage, RECORD_BYTES, Ranges, TooManyRecords};

    /// The bytes of a range log holding `records`.
    pub fn encode(records: &[super::RangeRecord]) -> Vec<u8> {
        records.iter().flat_map(super::RangeRecord::encode).collect()
    }
}
