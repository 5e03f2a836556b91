//! One cached object: its bytes (`data`, as long as the object, holes where nothing landed yet),
//! its range log (`ranges`, see `super::ranges`: one self-checked record per landed range,
//! appended after the range's bytes were written, so a record never describes bytes that are not
//! there, even after `kill -9`), and its description (`object.json`). An entry lives in
//! `partial/<key>/` until its ranges cover the whole object, then is checked whole and promoted,
//! by one rename, to `objects/<key>/`, with a marker of that check (`super::check`).
//!
//! Every byte served from a copy is checked against the CRC-32C recorded when it arrived: a read
//! of a partial copy takes the CRC of the bytes it returns (and of the rest of each record they
//! belong to) before it returns them ([`Entry::read`]); a complete copy, loaded as a plain local
//! file, was checked whole before its promotion and carries a marker bound to its data file's
//! identity and change time, checked before every load (`super::check`). A record whose bytes
//! differ is dropped and its range fetched again, never served.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use tensora_io::HeldPiece;

use super::files::{self, Durable, Open};
use super::ranges::{LogDamage, RECORD_BYTES, RECORDS_MAX, RangeRecord, Ranges};
use super::seal::AfterWrite;

/// Alignment of direct writes: their file offsets, lengths and memory addresses are multiples of
/// it.
pub const DIRECT_ALIGN_BYTES: usize = 4096;
/// Bytes of `object.json` read back; a larger one is refused as damaged.
pub const DESCRIPTION_BYTES_MAX: u64 = 64 << 10;
/// The buffer that checks the parts of a record outside a read, and [`Entry::verify`]'s.
pub const CHECK_BUFFER_BYTES: usize = 1 << 20;
/// Bytes of a range log read back: [`RECORDS_MAX`] whole records and a torn one.
const LOG_BYTES_MAX: u64 = ((RECORDS_MAX + 1) * RECORD_BYTES - 1) as u64;

/// What `object.json` says: which object (and version) the entry holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Description {
    /// The object's URL (credentials redacted).
    pub url: String,
    /// Its path inside the store (how an open names it).
    pub path: String,
    /// Its size in bytes.
    pub size_bytes: u64,
    /// Its ETag, if the server sent one.
    pub etag: Option<String>,
    /// Its Last-Modified date, nanoseconds since the Unix epoch.
    pub last_modified_ns: i128,
}

impl Description {
    /// The description in `bytes` (an `object.json`), or why not.
    pub fn parse(bytes: &[u8]) -> std::io::Result<Description> {
        if bytes.len() as u64 > DESCRIPTION_BYTES_MAX {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "object.json is larger than any the cache writes",
            ));
        }
        serde_json::from_slice(bytes).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
    }

    /// The description in `dir/object.json`.
    pub fn read(dir: &Path) -> std::io::Result<Description> {
        Description::parse(&files::read_capped(&dir.join("object.json"), DESCRIPTION_BYTES_MAX)?)
    }

    fn write(&self, dir: &Path) -> std::io::Result<()> {
        let bytes = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
        // Synced: a promoted copy whose description a power loss emptied would be fetched again.
        files::replace(&dir.join("object.json"), &bytes, Durable::Synced)
    }
}

/// Read the range log at `path` of an object of `size_bytes` (none there: no ranges).
fn read_log(path: &Path, size_bytes: u64) -> std::io::Result<(Ranges, LogDamage)> {
    let bytes = match files::read_capped(path, LOG_BYTES_MAX) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e),
    };
    Ranges::parse(&bytes, size_bytes).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// What reading a range found ([`Entry::read`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    /// Every byte, checked against the CRC-32C recorded when it arrived.
    Hit,
    /// Not every byte is recorded here.
    Miss,
    /// Recorded, but some record's bytes differ from its CRC-32C: those records were dropped,
    /// nothing is served, and the range is to be fetched again.
    Damaged,
}

/// Records (and their bytes) found not to hold what they claim, since the entry was opened.
#[derive(Debug, Default)]
pub struct Found {
    /// Records dropped: torn or failing their own checksum in the log, outside the object, or
    /// whose bytes differ from their CRC-32C.
    pub damaged_records: AtomicU64,
    /// Bytes of the records dropped because their bytes differ (fetched again).
    pub damaged_bytes: AtomicU64,
}

impl Found {
    fn from_log(damage: LogDamage) -> Found {
        let found = Found::default();
        found.damaged_records.store(damage.bad_records + u64::from(damage.torn_bytes > 0), Ordering::Relaxed);
        found
    }
}

/// The range log open for appending: its length, and its good ranges.
#[derive(Debug, Default)]
struct Log {
    /// `None` when the entry is open for reading.
    file: Option<File>,
    /// Bytes of whole records in the file: where the next one goes.
    len_bytes: u64,
    /// A failed append could not be cut back off: nothing more is appended.
    broken: bool,
    ranges: Ranges,
}

impl Log {
    /// Replace the log at `path` with its good records only, and append from there.
    fn rewrite(&mut self, path: &Path) -> std::io::Result<()> {
        self.file = None;
        let bytes: Vec<u8> = self.ranges.records().iter().flat_map(RangeRecord::encode).collect();
        files::replace(path, &bytes, Durable::Synced)?;
        self.file = Some(files::open(path, Open::Create)?);
        self.len_bytes = bytes.len() as u64;
        self.broken = false;
        Ok(())
    }
}

/// Where a written copy's pages go: the page cache's rule ([`tensora_io::pages_fit`]),
/// decided once per load by its session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pages {
    /// Written and checked through the page cache: the copy's pages stay cached, so a load of
    /// it right after the fill reads memory, as a warm local load does.
    Kept,
    /// Written and checked with `O_DIRECT` (whole aligned pages; the ends, and every write where
    /// the file system refuses it, through the page cache): the node's other cached pages stay.
    Around,
}

/// What [`Entry::promote`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Promoted {
    /// Checked whole, durable, marked and renamed.
    Done,
    /// Some records' bytes differ from their CRC-32C: they were dropped from the log, and the
    /// copy stays partial (the next load fetches those ranges again).
    Damaged,
}
/// Make `data` `len_bytes` long with every block allocated (`fallocate`, where the file system
/// can): the direct writes into it then overwrite allocated blocks, which ext4 runs side by side
/// under a shared inode lock (a write into a hole takes it exclusively), and the copy lies in a
/// few extents (2-4 per 128 MiB copy here, against 16 for the 8 MiB ranges written into a sparse
/// file in landing order). It also claims the space up front: a disk too full for the copy fails
/// here, and the object is loaded without being cached, not mid-load. A copy on tmpfs or ramfs
/// (`tensora_sys::in_memory_filesystem`) is only grown to its length: reserving there zeroes the whole
/// copy in memory first, inside the open (0.29 s of a cold 1 GiB load here, against 0.009 s
/// without), for pages the writes fill anyway; a full tmpfs then fails the writes, and the
/// copy stays partial.
fn allocate(data: &File, len_bytes: u64) -> std::io::Result<()> {
    if !tensora_sys::in_memory_filesystem(data)? {
        tensora_sys::preallocate(data, len_bytes)?;
    }
    data.set_len(len_bytes)
}

/// What [`Entry::write_held`] found on the disk after writing a piece.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checked {
    /// The bytes that arrived: recorded.
    Recorded,
    /// Other bytes (the load's caller changed them in memory before they were written), or
    /// bytes nothing vouches for: not recorded, so the next load fetches the range again.
    Changed,
}

/// Where the bytes of a write come from.
#[derive(Clone, Copy)]
enum Bytes<'b> {
    /// Memory no one changes during the write (a writer's copy, a piece of a running load).
    Slice(&'b [u8]),
    /// A piece of an arena after its load returned (see [`HeldPiece`]).
    Held(&'b HeldPiece),
}

impl Bytes<'_> {
    fn len_bytes(&self) -> usize {
        match self {
            Bytes::Slice(s) => s.len(),
            Bytes::Held(p) => p.len_bytes(),
        }
    }

    fn addr(&self) -> usize {
        match self {
            Bytes::Slice(s) => s.as_ptr() as usize,
            Bytes::Held(p) => p.addr(),
        }
    }

    /// Write `range` of the bytes at `offset_bytes` of `file`.
    fn write_at(&self, file: &File, range: std::ops::Range<usize>, offset_bytes: u64) -> std::io::Result<()> {
        match self {
            Bytes::Slice(s) => file.write_all_at(&s[range], offset_bytes),
            Bytes::Held(p) => p.write_at(file, range, offset_bytes),
        }
    }
}

/// Reads interrupted by a signal that [`read_up_to`] retries before it gives up.
const INTERRUPTED_RETRIES_MAX: u32 = 64;

/// Read into `buf` at `offset_bytes` of `file` until it is full or the file ends: the bytes read.
fn read_up_to(file: &File, buf: &mut [u8], offset_bytes: u64) -> std::io::Result<usize> {
    let (mut done, mut interrupted) = (0, 0);
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset_bytes + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e)
                if e.kind() == std::io::ErrorKind::Interrupted && interrupted < INTERRUPTED_RETRIES_MAX =>
            {
                interrupted += 1;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// An entry open for reading or writing by this process.
#[derive(Debug)]
pub struct Entry {
    pub dir: PathBuf,
    pub description: Description,
    data: File,
    /// `data` opened again with `O_DIRECT` for writing and checking whole aligned pages without
    /// the page cache (`None` when reading, with [`Pages::Kept`], or where the file system
    /// refuses it; cleared after a refused write, which is then redone through `data`).
    direct: Mutex<Option<Arc<File>>>,
    /// The range log, appended under this lock; the ranges read or written so far.
    log: Mutex<Log>,
    /// Damage found since the entry was opened.
    pub found: Found,
}

impl Entry {
    /// Open the entry in `dir` (complete or partial) for reading.
    pub fn open(dir: &Path) -> std::io::Result<Entry> {
        if !files::is_real_dir(dir) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("{}: no cached copy (or not a directory)", dir.display()),
            ));
        }
        let description = Description::read(dir)?;
        let data = files::open(&dir.join("data"), Open::Read)?;
        Entry::with_data(dir, description, data, None)
    }

    /// The entry in `dir` over `data`, its log read (and open for appending from its last good
    /// record with `log`, its pages going where `log`'s [`Pages`] says).
    fn with_data(
        dir: &Path,
        description: Description,
        data: File,
        log: Option<(&Path, Pages)>,
    ) -> std::io::Result<Entry> {
        if data.metadata()?.len() != description.size_bytes {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{}: the cached data is not as long as the object", dir.display()),
            ));
        }
        let (ranges, damage) = read_log(&dir.join("ranges"), description.size_bytes)?;
        let mut state = Log { ranges, ..Log::default() };
        let direct = match log {
            None => None,
            Some((path, pages)) => {
                // Cut back to whole good records before anything is appended, so that nothing
                // appended is read out of step after a tear.
                if damage.any() {
                    state.rewrite(path)?;
                } else {
                    let file = files::open(path, Open::Create)?;
                    state.len_bytes = file.metadata()?.len();
                    state.file = Some(file);
                }
                match pages {
                    Pages::Around => files::open(&dir.join("data"), Open::Direct).ok().map(Arc::new),
                    Pages::Kept => None,
                }
            }
        };
        Ok(Entry {
            dir: dir.to_path_buf(),
            description,
            data,
            direct: Mutex::new(direct),
            log: Mutex::new(state),
            found: Found::from_log(damage),
        })
    }

    /// Open the entry in `dir` for writing, creating it (data as long as the object) if it is
    /// not there, or starting it over if it describes another object or is not the cache's
    /// (a symlink or other file planted in place of one of its files). Its pages go where
    /// `pages` says.
    pub fn create(dir: &Path, description: &Description, pages: Pages) -> std::io::Result<Entry> {
        if files::is_real_dir(dir) && Description::read(dir).ok().as_ref() == Some(description) {
            let reopened = files::open(&dir.join("data"), Open::ReadWrite).and_then(|data| {
                Entry::with_data(dir, description.clone(), data, Some((&dir.join("ranges"), pages)))
            });
            if let Ok(entry) = reopened {
                return Ok(entry);
            }
        }
        files::remove_dir(dir)?;
        files::private_dir(dir, files::Symlink::Refused)?;
        let data = files::open(&dir.join("data"), Open::Create)?;
        if let Err(e) = allocate(&data, description.size_bytes) {
            // No room for the copy: leave nothing of it behind.
            let _ = std::fs::remove_dir_all(dir);
            return Err(e);
        }
        description.write(dir)?;
        Entry::with_data(dir, description.clone(), data, Some((&dir.join("ranges"), pages)))
    }

    /// Whether the ranges cover the whole object.
    pub fn is_complete(&self) -> bool {
        let log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        log.ranges.covers(0, self.description.size_bytes)
    }

    /// Fill `dest` from the copy if every byte of it has landed before, each record it reads
    /// from checked against its CRC-32C: the bytes of `dest` themselves, and the rest of each
    /// record from the disk (see [`Served`]).
    pub fn read(&self, offset_bytes: u64, dest: &mut [u8]) -> std::io::Result<Served> {
        let cover =
            self.log.lock().unwrap_or_else(|p| p.into_inner()).ranges.cover(offset_bytes, dest.len() as u64);
        if cover.is_empty() {
            return Ok(Served::Miss);
        }
        self.data.read_exact_at(dest, offset_bytes)?;
        let mut scratch = Vec::new();
        let mut bad = Vec::new();
        for r in cover {
            if self.crc32c_around(&r, offset_bytes, dest, &mut scratch)? != r.crc32c {
                bad.push(r);
            }
        }
        if bad.is_empty() {
            return Ok(Served::Hit);
        }
        self.drop_records(&bad);
        Ok(Served::Damaged)
    }

    /// The CRC-32C of record `r`'s bytes: those inside `dest` (the copy's bytes from
    /// `offset_bytes`, just read) from there, the rest read from the disk through `scratch`.
    fn crc32c_around(
        &self,
        r: &RangeRecord,
        offset_bytes: u64,
        dest: &[u8],
        scratch: &mut Vec<u8>,
    ) -> std::io::Result<u32> {
        let end = offset_bytes + dest.len() as u64;
        let (inside_start, inside_end) = (r.offset_bytes.max(offset_bytes), r.end_bytes().min(end));
        let mut crc = crate::crc::Crc32c::new();
        self.crc32c_from_disk(r.offset_bytes..inside_start, &mut crc, scratch)?;
        crc.append(&dest[(inside_start - offset_bytes) as usize..(inside_end - offset_bytes) as usize]);
        self.crc32c_from_disk(inside_end..r.end_bytes(), &mut crc, scratch)?;
        Ok(crc.value())
    }

    /// Extend `crc` over the copy's bytes in `range`, read through `scratch` (grown to at most
    /// [`CHECK_BUFFER_BYTES`] and two pages) as [`Entry::read_on_disk`] reads them.
    fn crc32c_from_disk(
        &self,
        range: std::ops::Range<u64>,
        crc: &mut crate::crc::Crc32c,
        scratch: &mut Vec<u8>,
    ) -> std::io::Result<()> {
        let mut at = range.start;
        while at < range.end {
            let n = ((range.end - at) as usize).min(CHECK_BUFFER_BYTES);
            crc.append(self.read_on_disk(at, n, scratch)?);
            at += n as u64;
        }
        Ok(())
    }

    /// Forget `bad` records (their bytes differ from their CRC-32C), counting them.
    fn drop_records(&self, bad: &[RangeRecord]) {
        self.log.lock().unwrap_or_else(|p| p.into_inner()).ranges.remove(bad);
        self.found.damaged_records.fetch_add(bad.len() as u64, Ordering::Relaxed);
        let bytes: u64 = bad.iter().map(|r| r.len_bytes).sum();
        self.found.damaged_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Write a landed range, then record it with `crc32c`, its CRC-32C as the caller computed it
    /// when the bytes arrived (recorded as is). Only an entry opened with [`Entry::create`] writes.
    pub fn write(&self, offset_bytes: u64, bytes: &[u8], crc32c: u32) -> std::io::Result<()> {
        debug_assert_eq!(crc32c, crate::crc::crc32c(bytes), "the caller's CRC-32C of the range");
        self.check_bounds(offset_bytes, bytes.len())?;
        self.write_data(offset_bytes, Bytes::Slice(bytes))?;
        self.record(RangeRecord { offset_bytes, len_bytes: bytes.len() as u64, crc32c })
    }

    /// Write a piece of a load's arena behind the load, then do what `after_write` says (asked
    /// once the write has ended): record it with the CRC-32C its writer took from the memory
    /// before the write, or read it back and record it (with the CRC-32C of what the disk holds)
    /// only if that matches the piece's seal, or leave it out. The load's caller may change the
    /// bytes once it owns them (see `super::seal`). `scratch` is the read-back buffer, reused
    /// across calls.
    pub fn write_held(
        &self,
        offset_bytes: u64,
        piece: &HeldPiece,
        scratch: &mut Vec<u8>,
        after_write: impl FnOnce() -> AfterWrite,
    ) -> std::io::Result<Checked> {
        self.check_bounds(offset_bytes, piece.len_bytes())?;
        self.write_data(offset_bytes, Bytes::Held(piece))?;
        let crc32c = match after_write() {
            AfterWrite::Record(crc32c) => crc32c,
            AfterWrite::Compare(sealed) => {
                let on_disk = self.crc32c_on_disk(offset_bytes, piece.len_bytes(), scratch)?;
                if on_disk != sealed {
                    return Ok(Checked::Changed);
                }
                on_disk
            }
            AfterWrite::Drop => return Ok(Checked::Changed),
        };
        self.record(RangeRecord { offset_bytes, len_bytes: piece.len_bytes() as u64, crc32c })?;
        Ok(Checked::Recorded)
    }

    fn check_bounds(&self, offset_bytes: u64, len_bytes: usize) -> std::io::Result<()> {
        if offset_bytes.saturating_add(len_bytes as u64) > self.description.size_bytes {
            return Err(std::io::Error::other("a range beyond the object's end"));
        }
        Ok(())
    }

    /// Append `record` to the range log (its bytes are written) at the end of its whole records;
    /// a failed append (a full disk) is cut back off, so the log never holds a torn record
    /// followed by more.
    fn record(&self, record: RangeRecord) -> std::io::Result<()> {
        if record.len_bytes == 0 {
            return Ok(());
        }
        let mut log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        if log.broken {
            return Err(std::io::Error::other("the range log could not be cut back after a failed write"));
        }
        let file = log.file.as_ref().ok_or_else(|| std::io::Error::other("the entry is open for reading"))?;
        // A log longer than its reader takes would make the next open drop the whole copy: the
        // range is left out instead, as after a failed write.
        if log.len_bytes / RECORD_BYTES as u64 >= RECORDS_MAX as u64 {
            return Err(std::io::Error::other(format!(
                "the range log holds {RECORDS_MAX} records, the most it may"
            )));
        }
        if let Err(e) = file.write_all_at(&record.encode(), log.len_bytes) {
            if file.set_len(log.len_bytes).is_err() {
                log.broken = true;
            }
            return Err(e);
        }
        log.len_bytes += RECORD_BYTES as u64;
        log.ranges.add(record);
        Ok(())
    }

    /// Write `bytes` at `offset_bytes` of `data`. When the bytes sit in memory at the same offset
    /// within a page as they go in the file (the writers and the arena's 4 KiB-aligned reads
    /// arrange it), the whole pages in the middle go straight to the disk (`O_DIRECT`: no
    /// page-cache copy, no fresh page-cache memory), and only the partial pages at the ends
    /// through the page cache. Pages written directly are never written through the page cache:
    /// a partial page belongs to one range's ends only, and ranges do not overlap.
    fn write_data(&self, offset_bytes: u64, bytes: Bytes<'_>) -> std::io::Result<()> {
        let page = DIRECT_ALIGN_BYTES as u64;
        let congruent = (bytes.addr() as u64) % page == offset_bytes % page;
        let end_bytes = offset_bytes + bytes.len_bytes() as u64;
        let (first, last) = (offset_bytes.next_multiple_of(page), end_bytes / page * page);
        if !congruent || first >= last {
            return bytes.write_at(&self.data, 0..bytes.len_bytes(), offset_bytes);
        }
        let (head, middle) = ((first - offset_bytes) as usize, (last - offset_bytes) as usize);
        bytes.write_at(&self.data, 0..head, offset_bytes)?;
        // A shared handle, not a duplicated descriptor: no `dup` and `close` per piece.
        let direct = self.direct.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let wrote_direct = match direct {
            Some(file) => match bytes.write_at(&file, head..middle, first) {
                Ok(()) => true,
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    *self.direct.lock().unwrap_or_else(|p| p.into_inner()) = None;
                    false
                }
                Err(e) => return Err(e),
            },
            None => false,
        };
        if !wrote_direct {
            bytes.write_at(&self.data, head..middle, first)?;
        }
        bytes.write_at(&self.data, middle..bytes.len_bytes(), last)
    }

    /// The CRC-32C of `len_bytes` at `offset_bytes` as [`Entry::read_on_disk`] reads them.
    fn crc32c_on_disk(
        &self,
        offset_bytes: u64,
        len_bytes: usize,
        scratch: &mut Vec<u8>,
    ) -> std::io::Result<u32> {
        Ok(crate::crc::crc32c(self.read_on_disk(offset_bytes, len_bytes, scratch)?))
    }

    /// `len_bytes` at `offset_bytes` of the copy, read into `scratch` (grown to the whole pages
    /// around them and one more, and reused): with `O_DIRECT` where the entry writes that way
    /// ([`Pages::Around`]), so the page cache neither answers nor keeps them; through the page
    /// cache otherwise ([`Pages::Kept`], whose pages are the ones the disk is given, or where
    /// direct reads are refused).
    fn read_on_disk<'s>(
        &self,
        offset_bytes: u64,
        len_bytes: usize,
        scratch: &'s mut Vec<u8>,
    ) -> std::io::Result<&'s [u8]> {
        let page = DIRECT_ALIGN_BYTES as u64;
        let start = offset_bytes / page * page;
        let end = (offset_bytes + len_bytes as u64).next_multiple_of(page);
        let span = (end - start) as usize;
        // Grown once and reused: its old bytes are overwritten by the read.
        if scratch.len() < span + DIRECT_ALIGN_BYTES {
            scratch.resize(span + DIRECT_ALIGN_BYTES, 0);
        }
        let at = (DIRECT_ALIGN_BYTES - scratch.as_ptr() as usize % DIRECT_ALIGN_BYTES) % DIRECT_ALIGN_BYTES;
        let head = (offset_bytes - start) as usize;
        let (first, past) = (at + head, at + head + len_bytes);
        let direct = self.direct.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some(file) = direct {
            match read_up_to(&file, &mut scratch[at..at + span], start) {
                Ok(n) if n >= head + len_bytes => return Ok(&scratch[first..past]),
                Ok(_) => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "the copy is shorter than a range recorded in it",
                    ));
                }
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
                Err(e) => return Err(e),
            }
        }
        self.data.read_exact_at(&mut scratch[first..past], offset_bytes)?;
        Ok(&scratch[first..past])
    }

    /// Check the whole copy, make it durable, mark it checked (`super::check`) and move it to
    /// `to` (one rename of its directory). A copy with records whose bytes differ is not
    /// promoted: those records are dropped from its log ([`Promoted::Damaged`]).
    pub fn promote(&self, to: &Path) -> std::io::Result<Promoted> {
        self.data.sync_all()?;
        let bad = self.verify()?;
        let mut log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        if !bad.is_empty() {
            drop(log);
            self.drop_records(&bad);
            self.log.lock().unwrap_or_else(|p| p.into_inner()).rewrite(&self.dir.join("ranges"))?;
            return Ok(Promoted::Damaged);
        }
        match &log.file {
            Some(file) => file.sync_all()?,
            None => return Err(std::io::Error::other("the entry is open for reading")),
        }
        log.broken = true;
        drop(log);
        super::check::mark(&self.dir, &self.data)?;
        files::remove_dir(to)?;
        std::fs::rename(&self.dir, to)?;
        if let Some(parent) = to.parent() {
            File::open(parent)?.sync_all()?;
        }
        Ok(Promoted::Done)
    }

    /// Whether this complete copy may be loaded as a local file: its marker holds (one `fstat`
    /// and a 64-byte read), else every record is checked now (and the marker written when all
    /// hold). Records whose bytes differ are dropped; `false` then.
    pub fn check_complete(&self) -> std::io::Result<bool> {
        if super::check::holds(&self.dir, &self.data) {
            return Ok(true);
        }
        let bad = self.verify()?;
        if !bad.is_empty() {
            self.drop_records(&bad);
            return Ok(false);
        }
        if !self.is_complete() {
            return Ok(false);
        }
        // Another reader may write the same marker at once: each writes a whole one, by rename.
        super::check::mark(&self.dir, &self.data)?;
        Ok(true)
    }

    /// Move this complete copy, found damaged, back to partial at `to` (replacing what is
    /// there): its marker removed and its log holding only the records that were not dropped,
    /// so the next writer fetches the rest again. Only under the object's exclusive lock.
    pub fn demote(&self, to: &Path) -> std::io::Result<()> {
        files::remove_dir(to)?;
        std::fs::rename(&self.dir, to)?;
        super::check::unmark(to)?;
        self.log.lock().unwrap_or_else(|p| p.into_inner()).rewrite(&to.join("ranges"))
    }

    /// Every recorded range's bytes, checked against its CRC-32C: the ranges that differ.
    pub fn verify(&self) -> std::io::Result<Vec<RangeRecord>> {
        let records = self.log.lock().unwrap_or_else(|p| p.into_inner()).ranges.records().to_vec();
        let mut bad = Vec::new();
        let mut scratch = Vec::new();
        for r in records {
            let mut crc = crate::crc::Crc32c::new();
            self.crc32c_from_disk(r.offset_bytes..r.end_bytes(), &mut crc, &mut scratch)?;
            if crc.value() != r.crc32c {
                bad.push(r);
            }
        }
        Ok(bad)
    }

    /// Whether `path` names this entry's data file itself (not a symlink, not a file put in its
    /// place since it was opened and checked): what a load of the copy as a local file opens.
    pub fn data_is(&self, path: &Path) -> bool {
        use std::os::unix::fs::MetadataExt as _;
        match (std::fs::symlink_metadata(path), self.data.metadata()) {
            (Ok(named), Ok(held)) => {
                named.is_file() && (named.dev(), named.ino()) == (held.dev(), held.ino())
            }
            _ => false,
        }
    }

    /// Bytes of the object the ranges cover.
    pub fn covered_bytes(&self) -> u64 {
        self.log.lock().unwrap_or_else(|p| p.into_inner()).ranges.covered_bytes()
    }
}

#[cfg(test)]
mod tests;
