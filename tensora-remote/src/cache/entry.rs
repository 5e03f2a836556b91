//! One cached object: its bytes (`data`, as long as the object, holes where nothing landed yet),
//! its range log (`ranges`: one 24-byte record per landed range, appended after the range's bytes
//! were written, so a record never describes bytes that are not there, even after `kill -9`), and
//! its description (`object.json`). An entry lives in `partial/<key>/` until its ranges cover the
//! whole object, then is promoted whole, by one rename, to `objects/<key>/`.

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use tensora_io::HeldPiece;

use super::seal::AfterWrite;

/// Bytes of one record of the range log: offset (u64), length (u64), CRC-32C (u32), 4 zero bytes,
/// little-endian.
pub const RECORD_BYTES: usize = 24;
/// Records read from one range log; a longer log is refused as damaged (a whole object in 4 KiB
/// ranges of a 1 TiB object is 2^28 records, far more than the loader ever writes).
pub const RECORDS_MAX: usize = 1 << 24;
/// Alignment of direct writes: their file offsets, lengths and memory addresses are multiples of
/// it.
pub const DIRECT_ALIGN_BYTES: usize = 4096;
/// Bytes of `object.json` read back; a larger one is refused as damaged.
pub const DESCRIPTION_BYTES_MAX: u64 = 64 << 10;

/// One landed range: where it is in the object, and the CRC-32C of its bytes (as they arrived:
/// taken from the load's memory before it could change, or read back from the disk and compared
/// with such a CRC).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RangeRecord {
    /// First byte in the object.
    pub offset_bytes: u64,
    /// Length of the range.
    pub len_bytes: u64,
    /// CRC-32C of the range's bytes when they were written.
    pub crc32c: u32,
}

impl RangeRecord {
    fn encode(&self) -> [u8; RECORD_BYTES] {
        let mut out = [0u8; RECORD_BYTES];
        out[..8].copy_from_slice(&self.offset_bytes.to_le_bytes());
        out[8..16].copy_from_slice(&self.len_bytes.to_le_bytes());
        out[16..20].copy_from_slice(&self.crc32c.to_le_bytes());
        out
    }

    fn decode(bytes: &[u8; RECORD_BYTES]) -> RangeRecord {
        let word = |r: std::ops::Range<usize>| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&bytes[r]);
            u64::from_le_bytes(b)
        };
        let mut crc = [0u8; 4];
        crc.copy_from_slice(&bytes[16..20]);
        RangeRecord { offset_bytes: word(0..8), len_bytes: word(8..16), crc32c: u32::from_le_bytes(crc) }
    }

    fn end_bytes(&self) -> u64 {
        self.offset_bytes.saturating_add(self.len_bytes)
    }
}

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
    pub fn read(dir: &Path) -> std::io::Result<Description> {
        let file = File::open(dir.join("object.json"))?;
        let mut text = Vec::new();
        file.take(DESCRIPTION_BYTES_MAX + 1).read_to_end(&mut text)?;
        if text.len() as u64 > DESCRIPTION_BYTES_MAX {
            return Err(std::io::Error::other("object.json is larger than any the cache writes"));
        }
        serde_json::from_slice(&text).map_err(std::io::Error::other)
    }

    fn write(&self, dir: &Path) -> std::io::Result<()> {
        let tmp = dir.join("object.json.tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?)?;
        std::fs::rename(tmp, dir.join("object.json"))
    }
}

/// The ranges of an entry, read from its log: the records, and their union as sorted disjoint
/// intervals.
#[derive(Debug, Default, Clone)]
pub struct Ranges {
    pub records: Vec<RangeRecord>,
    covered: Vec<(u64, u64)>,
}

impl Ranges {
    fn add(&mut self, r: RangeRecord) {
        self.records.push(r);
        if r.len_bytes == 0 {
            return;
        }
        let (mut start, mut end) = (r.offset_bytes, r.end_bytes());
        let mut kept = Vec::with_capacity(self.covered.len() + 1);
        for &(s, e) in &self.covered {
            if e < start || s > end {
                kept.push((s, e));
            } else {
                start = start.min(s);
                end = end.max(e);
            }
        }
        kept.push((start, end));
        kept.sort_unstable();
        self.covered = kept;
    }

    /// Whether every byte of `offset..offset + len` is covered.
    pub fn covers(&self, offset_bytes: u64, len_bytes: u64) -> bool {
        let end = offset_bytes.saturating_add(len_bytes);
        let i = self.covered.partition_point(|&(_, e)| e <= offset_bytes);
        self.covered.get(i).is_some_and(|&(s, e)| s <= offset_bytes && e >= end)
    }

    /// Bytes covered.
    pub fn covered_bytes(&self) -> u64 {
        self.covered.iter().map(|(s, e)| e - s).sum()
    }

    /// Read a range log, ignoring a torn last record (a write cut short by a kill).
    pub fn read(path: &Path) -> std::io::Result<Ranges> {
        let mut ranges = Ranges::default();
        let file = match File::open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(ranges),
            Err(e) => return Err(e),
        };
        let mut reader = std::io::BufReader::new(file.take((RECORDS_MAX * RECORD_BYTES) as u64 + 1));
        let mut record = [0u8; RECORD_BYTES];
        loop {
            match reader.read_exact(&mut record) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(ranges),
                Err(e) => return Err(e),
            }
            if ranges.records.len() >= RECORDS_MAX {
                return Err(std::io::Error::other(format!("more than {RECORDS_MAX} range records")));
            }
            ranges.add(RangeRecord::decode(&record));
        }
    }
}

/// Make `data` `len_bytes` long with every block allocated (`fallocate`, where the file system
/// can): the direct writes into it then overwrite allocated blocks, which ext4 runs side by side
/// under a shared inode lock (a write into a hole takes it exclusively), and the copy lies in a
/// few extents (2-4 per 128 MiB copy here, against 16 for the 8 MiB ranges written into a sparse
/// file in landing order). It also claims the space up front: a disk too full for the copy fails
/// here, and the object is loaded without being cached, not mid-load. A copy on tmpfs or ramfs
/// (`tensora_io::fs::in_memory`) is only grown to its length: reserving there zeroes the whole
/// copy in memory first, inside the open (0.29 s of a cold 1 GiB load here, against 0.009 s
/// without), for pages the writes fill anyway; a full tmpfs then fails the writes, and the
/// copy stays partial.
fn allocate(data: &File, len_bytes: u64) -> std::io::Result<()> {
    if !tensora_io::fs::in_memory(data)? {
        tensora_io::fs::preallocate(data, len_bytes)?;
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
    /// `data` opened again with `O_DIRECT` for writing whole aligned pages from the writers'
    /// buffers without the page cache (`None` when reading, or where the file system refuses it;
    /// cleared after a refused write, which is then redone through `data`).
    direct: Mutex<Option<Arc<File>>>,
    /// The range log, appended under this lock; the ranges read or written so far.
    log: Mutex<(Option<File>, Ranges)>,
}

impl Entry {
    /// Open the entry in `dir` (complete or partial) for reading.
    pub fn open(dir: &Path) -> std::io::Result<Entry> {
        let description = Description::read(dir)?;
        let data = File::open(dir.join("data"))?;
        if data.metadata()?.len() != description.size_bytes {
            return Err(std::io::Error::other("the cached data is not as long as the object"));
        }
        let ranges = Ranges::read(&dir.join("ranges"))?;
        Ok(Entry {
            dir: dir.to_path_buf(),
            description,
            data,
            direct: Mutex::new(None),
            log: Mutex::new((None, ranges)),
        })
    }

    /// Open the entry in `dir` for writing, creating it (data as long as the object) if it is
    /// not there, or starting it over if it describes another object.
    pub fn create(dir: &Path, description: &Description) -> std::io::Result<Entry> {
        if Description::read(dir).ok().as_ref() != Some(description) {
            let _ = std::fs::remove_dir_all(dir);
            std::fs::create_dir_all(dir)?;
            let data = File::create(dir.join("data"))?;
            if let Err(e) = allocate(&data, description.size_bytes) {
                // No room for the copy: leave nothing of it behind.
                let _ = std::fs::remove_dir_all(dir);
                return Err(e);
            }
            description.write(dir)?;
        }
        let data = File::options().read(true).write(true).open(dir.join("data"))?;
        let ranges = Ranges::read(&dir.join("ranges"))?;
        let log = File::options().create(true).append(true).open(dir.join("ranges"))?;
        let direct = File::options()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(dir.join("data"))
            .ok()
            .map(Arc::new);
        Ok(Entry {
            dir: dir.to_path_buf(),
            description: description.clone(),
            data,
            direct: Mutex::new(direct),
            log: Mutex::new((Some(log), ranges)),
        })
    }

    /// Whether the ranges cover the whole object.
    pub fn is_complete(&self) -> bool {
        let log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        log.1.covers(0, self.description.size_bytes)
    }

    /// Fill `dest` from the cache if every byte of it has landed before; `Ok(false)` if not.
    pub fn read(&self, offset_bytes: u64, dest: &mut [u8]) -> std::io::Result<bool> {
        let covered = {
            let log = self.log.lock().unwrap_or_else(|p| p.into_inner());
            log.1.covers(offset_bytes, dest.len() as u64)
        };
        if !covered {
            return Ok(false);
        }
        self.data.read_exact_at(dest, offset_bytes)?;
        Ok(true)
    }

    /// Write a landed range, then record it with `crc32c`, its CRC-32C as the caller computed it
    /// when the bytes arrived (recorded as is). Only an entry opened with [`Entry::create`] writes.
    pub fn write(&self, offset_bytes: u64, bytes: &[u8], crc32c: u32) -> std::io::Result<()> {
        debug_assert_eq!(crc32c, super::crc::crc32c(bytes), "the caller's CRC-32C of the range");
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

    /// Append `record` to the range log (its bytes are written).
    fn record(&self, record: RangeRecord) -> std::io::Result<()> {
        let mut log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        let (file, ranges) = &mut *log;
        let file = file.as_mut().ok_or_else(|| std::io::Error::other("the entry is open for reading"))?;
        file.write_all(&record.encode())?;
        ranges.add(record);
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

    /// The CRC-32C of `len_bytes` at `offset_bytes` as the disk holds them: read with `O_DIRECT`
    /// (whole pages around the range, into an aligned part of `scratch`), so the page cache
    /// neither answers nor keeps them; through the page cache where direct reads are refused.
    fn crc32c_on_disk(
        &self,
        offset_bytes: u64,
        len_bytes: usize,
        scratch: &mut Vec<u8>,
    ) -> std::io::Result<u32> {
        let page = DIRECT_ALIGN_BYTES as u64;
        let start = offset_bytes / page * page;
        let end = (offset_bytes + len_bytes as u64).next_multiple_of(page);
        let span = (end - start) as usize;
        // Grown once and reused: its old bytes are overwritten by the read.
        if scratch.len() < span + DIRECT_ALIGN_BYTES {
            scratch.resize(span + DIRECT_ALIGN_BYTES, 0);
        }
        let at = (DIRECT_ALIGN_BYTES - scratch.as_ptr() as usize % DIRECT_ALIGN_BYTES) % DIRECT_ALIGN_BYTES;
        let buf = &mut scratch[at..at + span];
        let head = (offset_bytes - start) as usize;
        let direct = self.direct.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some(file) = direct {
            match read_up_to(&file, buf, start) {
                Ok(n) if n >= head + len_bytes => {
                    return Ok(super::crc::crc32c(&buf[head..head + len_bytes]));
                }
                Ok(_) => {
                    return Err(std::io::Error::other("the copy is shorter than a range written into it"));
                }
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
                Err(e) => return Err(e),
            }
        }
        let range = &mut buf[head..head + len_bytes];
        self.data.read_exact_at(range, offset_bytes)?;
        Ok(super::crc::crc32c(range))
    }

    /// Make a complete entry durable and move it to `to` (one rename of its directory).
    pub fn promote(&self, to: &Path) -> std::io::Result<()> {
        self.data.sync_all()?;
        if let Some(log) = &self.log.lock().unwrap_or_else(|p| p.into_inner()).0 {
            log.sync_all()?;
        }
        let _ = std::fs::remove_dir_all(to);
        std::fs::rename(&self.dir, to)?;
        if let Some(parent) = to.parent() {
            File::open(parent)?.sync_all()?;
        }
        Ok(())
    }

    /// Every recorded range's bytes, checked against its CRC-32C: the ranges that differ.
    pub fn verify(&self) -> std::io::Result<Vec<RangeRecord>> {
        let records = self.log.lock().unwrap_or_else(|p| p.into_inner()).1.records.clone();
        let mut bad = Vec::new();
        let mut buf = vec![0u8; VERIFY_BUFFER_BYTES];
        for r in records {
            let mut crc = super::Crc32c::new();
            let mut at = r.offset_bytes;
            while at < r.end_bytes() {
                let n = ((r.end_bytes() - at) as usize).min(buf.len());
                self.data.read_exact_at(&mut buf[..n], at)?;
                crc.append(&buf[..n]);
                at += n as u64;
            }
            if crc.value() != r.crc32c {
                bad.push(r);
            }
        }
        Ok(bad)
    }

    /// Bytes of the object the ranges cover.
    pub fn covered_bytes(&self) -> u64 {
        self.log.lock().unwrap_or_else(|p| p.into_inner()).1.covered_bytes()
    }
}

/// The buffer `Entry::verify` reads through.
pub const VERIFY_BUFFER_BYTES: usize = 8 << 20;

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]
        /// The union of recorded ranges covers exactly the bytes some range covers.
        #[test]
        fn coverage_is_the_union_of_the_ranges(
            ranges in proptest::collection::vec((0u64..200, 0u64..40), 0..12),
            probe in (0u64..240, 1u64..40),
        ) {
            let mut set = Ranges::default();
            let mut bytes = [false; 240];
            for &(o, l) in &ranges {
                set.add(RangeRecord { offset_bytes: o, len_bytes: l, crc32c: 0 });
                for b in o..o + l { bytes[b as usize] = true; }
            }
            let (o, l) = probe;
            let want = (o..(o + l).min(240)).all(|b| bytes[b as usize]) && o + l <= 240;
            prop_assert_eq!(set.covers(o, l), want);
            prop_assert_eq!(set.covered_bytes(), bytes.iter().filter(|&&b| b).count() as u64);
        }
    }

    /// A copy on a disk is preallocated; one on tmpfs (`/dev/shm` on Linux) only grown to its
    /// length, with no page committed before the writes.
    #[test]
    fn a_copy_in_memory_is_not_preallocated() {
        use std::os::unix::fs::MetadataExt as _;
        let disk = tempfile::tempdir().unwrap();
        let shm = tempfile::tempdir_in("/dev/shm").ok();
        let places = std::iter::once(disk.path()).chain(shm.as_ref().map(|d| d.path()));
        for place in places {
            let description = Description {
                url: "http://h/x".into(),
                path: "x".into(),
                size_bytes: 8 << 20,
                etag: Some("e".into()),
                last_modified_ns: 0,
            };
            let entry = Entry::create(&place.join("entry"), &description).unwrap();
            let meta = entry.data.metadata().unwrap();
            assert_eq!(meta.len(), 8 << 20);
            let in_memory = tensora_io::fs::in_memory(&entry.data).unwrap();
            if in_memory {
                assert_eq!(meta.blocks(), 0, "{}: nothing committed", place.display());
            }
            let name = tensora_io::auto::probe::filesystem(place).unwrap().name;
            assert_eq!(in_memory, matches!(name.as_str(), "tmpfs" | "ramfs"), "{}: {name}", place.display());
        }
    }

    /// A piece of an arena written behind its load is recorded with its writer's CRC without a
    /// read-back; a sealed one is read back and recorded only if the disk holds what arrived, and
    /// left out when the memory changed first; direct or buffered, aligned or not.
    #[test]
    fn a_held_piece_is_recorded_only_if_the_disk_holds_what_arrived() {
        for (direct, offset) in [(true, 0u64), (true, 4096 + 100), (false, 8192)] {
            let dir = tempfile::tempdir().unwrap();
            let size_bytes = 128 << 10;
            let description = Description {
                url: "http://h/x".into(),
                path: "x".into(),
                size_bytes,
                etag: Some("e".into()),
                last_modified_ns: 0,
            };
            let entry = Entry::create(dir.path(), &description).unwrap();
            if !direct {
                *entry.direct.lock().unwrap() = None;
            }
            let mut arena = tensora_io::arena::Arena::with_len(2 << 20).unwrap();
            let at = (offset % 4096) as usize;
            let arrived: Vec<u8> = (0..20_000u32).map(|i| (i % 251) as u8).collect();
            arena.as_mut_slice()[at..at + arrived.len()].copy_from_slice(&arrived);
            let keep = arena.keep_mapped();
            let crc = crc32c::crc32c(&arrived);
            let mut scratch = Vec::new();
            let piece = keep.piece(at, arrived.len()).unwrap();
            let mut back = vec![0u8; arrived.len()];
            // Unsealed: recorded with the writer's CRC, as given (no read-back to check it).
            let recorded = entry.write_held(offset, &piece, &mut scratch, || AfterWrite::Record(crc));
            assert_eq!(recorded.unwrap(), Checked::Recorded);
            assert!(entry.read(offset, &mut back).unwrap());
            assert!(back == arrived);
            // Sealed with what arrived, and unchanged: the disk's CRC matches.
            let sealed = offset + 30_000;
            let compared = entry.write_held(sealed, &piece, &mut scratch, || AfterWrite::Compare(crc));
            assert_eq!(compared.unwrap(), Checked::Recorded);
            assert!(entry.read(sealed, &mut back).unwrap());
            // Sealed, then the caller changes one byte before the write: left out.
            arena.as_mut_slice()[at + 7] ^= 0x40;
            let next = offset + 60_000;
            let changed = entry.write_held(next, &piece, &mut scratch, || AfterWrite::Compare(crc));
            assert_eq!(changed.unwrap(), Checked::Changed);
            assert!(!entry.read(next, &mut back).unwrap(), "a changed piece is not recorded");
            let dropped = entry.write_held(next, &piece, &mut scratch, || AfterWrite::Drop);
            assert_eq!(dropped.unwrap(), Checked::Changed);
            assert_eq!(entry.covered_bytes(), 2 * arrived.len() as u64);
            assert!(entry.verify().unwrap().is_empty());
            // Past the object's end: refused before anything is written.
            let past = entry.write_held(size_bytes - 10, &piece, &mut scratch, || AfterWrite::Record(crc));
            assert!(past.is_err());
        }
    }

    #[test]
    fn a_torn_last_record_is_ignored_and_the_rest_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let description = Description {
            url: "http://h/x".into(),
            path: "x".into(),
            size_bytes: 100,
            etag: Some("e".into()),
            last_modified_ns: 0,
        };
        let entry = Entry::create(dir.path(), &description).unwrap();
        entry.write(10, &[7u8; 20], crc32c::crc32c(&[7u8; 20])).unwrap();
        entry.write(0, &[1u8; 10], crc32c::crc32c(&[1u8; 10])).unwrap();
        drop(entry);
        let mut log = File::options().append(true).open(dir.path().join("ranges")).unwrap();
        log.write_all(&[9u8; 5]).unwrap();
        let entry = Entry::open(dir.path()).unwrap();
        let mut out = [0u8; 30];
        assert!(entry.read(0, &mut out).unwrap());
        assert_eq!(&out[..10], &[1u8; 10]);
        assert!(!entry.read(25, &mut [0u8; 10]).unwrap());
        assert!(entry.verify().unwrap().is_empty());
        // A flipped byte on disk is a range that fails its CRC.
        File::options().write(true).open(dir.path().join("data")).unwrap().write_all_at(&[0], 15).unwrap();
        assert_eq!(entry.verify().unwrap().len(), 1);
    }

    /// A buffer of `len` bytes placed like the writers place copies: its first byte sits at
    /// `offset % 4096` within a page (or one byte off that, when `congruent` is false).
    fn placed(fill: &[u8], offset: u64, congruent: bool) -> (Vec<u8>, usize) {
        let mut buf = Vec::with_capacity(fill.len() + 2 * DIRECT_ALIGN_BYTES);
        let page = DIRECT_ALIGN_BYTES;
        let want = (offset % page as u64) as usize + usize::from(!congruent);
        let start = (want + page - buf.as_ptr() as usize % page) % page;
        buf.resize(start, 0);
        buf.extend_from_slice(fill);
        (buf, start)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        /// Ranges written in any order, each split into direct whole pages and buffered ends (or
        /// all buffered when the memory is not placed for it, or when direct writes are off),
        /// read back as written; their CRCs verify.
        #[test]
        fn ranges_read_back_however_they_were_written(
            cuts in proptest::collection::btree_set(1u64..60_000, 0..8),
            order in any::<prop::sample::Index>(),
            congruent in any::<bool>(),
            direct in any::<bool>(),
        ) {
            let size_bytes = 60_000u64;
            let dir = tempfile::tempdir().unwrap();
            let description = Description {
                url: "http://h/x".into(), path: "x".into(), size_bytes, etag: Some("e".into()), last_modified_ns: 0,
            };
            let entry = Entry::create(dir.path(), &description).unwrap();
            if !direct {
                *entry.direct.lock().unwrap() = None;
            }
            let object: Vec<u8> = (0..size_bytes).map(|i| (i * 31 % 251) as u8).collect();
            let mut bounds: Vec<u64> = std::iter::once(0).chain(cuts).chain(std::iter::once(size_bytes)).collect();
            bounds.dedup();
            let mut ranges: Vec<(u64, u64)> = bounds.windows(2).map(|w| (w[0], w[1])).collect();
            let k = order.index(ranges.len());
            ranges.rotate_left(k);
            for (start, end) in ranges {
                let (buf, at) = placed(&object[start as usize..end as usize], start, congruent);
                entry.write(start, &buf[at..], crc32c::crc32c(&buf[at..])).unwrap();
            }
            prop_assert!(entry.is_complete());
            let mut back = vec![0u8; size_bytes as usize];
            prop_assert!(entry.read(0, &mut back).unwrap());
            prop_assert!(back == object);
            prop_assert!(entry.verify().unwrap().is_empty());
        }
    }
}
