//! `Entry`: writes, reads checked on the way out, torn logs, promotion.

use std::io::Write as _;
use std::os::unix::fs::FileExt as _;

use proptest::prelude::*;

use std::path::PathBuf;
use std::sync::atomic::Ordering;

use super::*;

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
        let entry = Entry::create(&place.join("entry"), &description, Pages::Around).unwrap();
        let meta = entry.data.metadata().unwrap();
        assert_eq!(meta.len(), 8 << 20);
        let in_memory = tensora_sys::in_memory_filesystem(&entry.data).unwrap();
        if in_memory {
            assert_eq!(meta.blocks(), 0, "{}: nothing committed", place.display());
        }
        let name = tensora_sys::filesystem(place).unwrap().name;
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
        let entry = Entry::create(dir.path(), &description, Pages::Around).unwrap();
        if !direct {
            *entry.direct.lock().unwrap() = None;
        }
        let mut arena = tensora_io::Arena::with_len(2 << 20).unwrap();
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
        assert_eq!(entry.read(offset, &mut back).unwrap(), Served::Hit);
        assert!(back == arrived);
        // Sealed with what arrived, and unchanged: the disk's CRC matches.
        let sealed = offset + 30_000;
        let compared = entry.write_held(sealed, &piece, &mut scratch, || AfterWrite::Compare(crc));
        assert_eq!(compared.unwrap(), Checked::Recorded);
        assert_eq!(entry.read(sealed, &mut back).unwrap(), Served::Hit);
        // Sealed, then the caller changes one byte before the write: left out.
        arena.as_mut_slice()[at + 7] ^= 0x40;
        let next = offset + 60_000;
        let changed = entry.write_held(next, &piece, &mut scratch, || AfterWrite::Compare(crc));
        assert_eq!(changed.unwrap(), Checked::Changed);
        assert_eq!(entry.read(next, &mut back).unwrap(), Served::Miss, "a changed piece is not recorded");
        let dropped = entry.write_held(next, &piece, &mut scratch, || AfterWrite::Drop);
        assert_eq!(dropped.unwrap(), Checked::Changed);
        assert_eq!(entry.covered_bytes(), 2 * arrived.len() as u64);
        assert!(entry.verify().unwrap().is_empty());
        // Past the object's end: refused before anything is written.
        let past = entry.write_held(size_bytes - 10, &piece, &mut scratch, || AfterWrite::Record(crc));
        assert!(past.is_err());
    }
}

fn small(size_bytes: u64) -> Description {
    Description {
        url: "http://h/x".into(),
        path: "x".into(),
        size_bytes,
        etag: Some("e".into()),
        last_modified_ns: 0,
    }
}

fn crc(bytes: &[u8]) -> u32 {
    crc32c::crc32c(bytes)
}

/// Finding 1 (issue 39): a log torn 16 bytes into a record (what a full disk leaves) is cut back
/// to its whole records before the next writer appends, so what is appended after is read in
/// step; a torn tail is ignored and counted, the rest read back.
#[test]
fn finding_1_a_torn_log_is_cut_back_before_anything_is_appended() {
    let dir = tempfile::tempdir().unwrap();
    let entry = Entry::create(dir.path(), &small(100), Pages::Around).unwrap();
    entry.write(10, &[7u8; 20], crc(&[7u8; 20])).unwrap();
    entry.write(0, &[1u8; 10], crc(&[1u8; 10])).unwrap();
    drop(entry);
    let mut log = File::options().append(true).open(dir.path().join("ranges")).unwrap();
    log.write_all(&[9u8; 16]).unwrap();
    let entry = Entry::open(dir.path()).unwrap();
    assert_eq!(entry.found.damaged_records.load(Ordering::Relaxed), 1, "the torn tail");
    let mut out = [0u8; 30];
    assert_eq!(entry.read(0, &mut out).unwrap(), Served::Hit);
    assert_eq!(&out[..10], &[1u8; 10]);
    assert_eq!(entry.read(25, &mut [0u8; 10]).unwrap(), Served::Miss);
    drop(entry);
    // A writer appends after the whole records only: everything it records reads back.
    let entry = Entry::create(dir.path(), &small(100), Pages::Around).unwrap();
    assert_eq!(std::fs::metadata(dir.path().join("ranges")).unwrap().len(), 2 * 24);
    entry.write(60, &[3u8; 40], crc(&[3u8; 40])).unwrap();
    drop(entry);
    let entry = Entry::open(dir.path()).unwrap();
    assert_eq!(entry.found.damaged_records.load(Ordering::Relaxed), 0);
    assert_eq!(entry.covered_bytes(), 70);
    let mut back = [0u8; 40];
    assert_eq!(entry.read(60, &mut back).unwrap(), Served::Hit);
    assert_eq!(back, [3u8; 40]);
    // The bytes never written (30..60) are claimed by no record.
    assert_eq!(entry.read(30, &mut [0u8; 30]).unwrap(), Served::Miss);
}

/// Finding 1 (issue 39): a flipped byte on disk is never served: the read that covers it finds
/// its record's CRC-32C differs (inside the read, or in the part of the record beyond it), drops
/// the record and serves nothing; `verify` names it.
#[test]
fn finding_1_a_flipped_byte_is_not_served() {
    let dir = tempfile::tempdir().unwrap();
    let entry = Entry::create(dir.path(), &small(100), Pages::Around).unwrap();
    entry.write(0, &[1u8; 50], crc(&[1u8; 50])).unwrap();
    entry.write(50, &[2u8; 50], crc(&[2u8; 50])).unwrap();
    File::options().write(true).open(dir.path().join("data")).unwrap().write_all_at(&[0], 45).unwrap();
    assert_eq!(
        entry.verify().unwrap(),
        vec![RangeRecord { offset_bytes: 0, len_bytes: 50, crc32c: crc(&[1u8; 50]) }]
    );
    // The read covers 10..20 only; the flipped byte at 45 is in the rest of its record.
    assert_eq!(entry.read(10, &mut [0u8; 10]).unwrap(), Served::Damaged);
    assert_eq!(entry.found.damaged_bytes.load(Ordering::Relaxed), 50);
    assert_eq!(entry.read(10, &mut [0u8; 10]).unwrap(), Served::Miss, "dropped");
    let mut back = [0u8; 50];
    assert_eq!(entry.read(50, &mut back).unwrap(), Served::Hit);
    assert_eq!(back, [2u8; 50]);
    // Promotion checks the whole copy: the damaged record is left out of the log.
    entry.write(0, &[1u8; 50], crc(&[1u8; 50])).unwrap();
    File::options().write(true).open(dir.path().join("data")).unwrap().write_all_at(&[0], 99).unwrap();
    let to = dir.path().with_extension("promoted");
    assert_eq!(entry.promote(&to).unwrap(), Promoted::Damaged);
    assert!(!to.exists());
    drop(entry);
    let entry = Entry::open(dir.path()).unwrap();
    assert_eq!(entry.covered_bytes(), 50);
}

/// A copy promoted whole carries a marker that holds while nothing writes its data; a byte
/// written after promotion is found by the whole check the broken marker calls for.
#[test]
fn a_promoted_copy_is_marked_and_rechecked_after_a_write() {
    let root = tempfile::tempdir().unwrap();
    let (partial, complete) = (root.path().join("partial"), root.path().join("complete"));
    let entry = Entry::create(&partial, &small(100), Pages::Around).unwrap();
    entry.write(0, &[5u8; 100], crc(&[5u8; 100])).unwrap();
    assert_eq!(entry.promote(&complete).unwrap(), Promoted::Done);
    drop(entry);
    let entry = Entry::open(&complete).unwrap();
    assert!(entry.check_complete().unwrap());
    std::thread::sleep(std::time::Duration::from_millis(20));
    File::options().write(true).open(complete.join("data")).unwrap().write_all_at(&[0], 3).unwrap();
    let entry = Entry::open(&complete).unwrap();
    assert!(!entry.check_complete().unwrap());
    assert_eq!(entry.covered_bytes(), 0);
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
        let entry = Entry::create(dir.path(), &description, Pages::Around).unwrap();
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
        prop_assert_eq!(entry.read(0, &mut back).unwrap(), Served::Hit);
        prop_assert!(back == object);
        prop_assert!(entry.verify().unwrap().is_empty());
    }
}

/// Fill the file system holding `dir` until a write fails with `ENOSPC`: the filler's path.
fn fill_up(dir: &Path) -> PathBuf {
    let filler = dir.join("filler");
    let mut file = File::create(&filler).unwrap();
    let page = [0u8; 4096];
    // A tmpfs of a few pages fills within this many.
    for _ in 0..4096 {
        if let Err(e) = file.write_all(&page) {
            assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
            return filler;
        }
    }
    panic!("the file system did not fill up");
}

/// The fault matrix (issue 39): the disk fills up in the middle of a range log record (4096
/// bytes of log are 170 records and 16 bytes of the 171st): the append fails, is cut back off, and
/// the next one (once there is room) is read back in step with every record before it.
#[test]
fn enospc_in_the_middle_of_a_log_record_is_cut_back_off() {
    let Some(fs) = tensora_testkit::small_tmpfs_or_skip(64 << 10, "enospc_in_the_log") else {
        return;
    };
    let dir = fs.path().join("entry");
    let entry = Entry::create(&dir, &small(1000), Pages::Around).unwrap();
    for k in 0..170u64 {
        entry.write(k, &[k as u8], crc(&[k as u8])).unwrap();
    }
    assert_eq!(std::fs::metadata(dir.join("ranges")).unwrap().len(), 4080);
    let filler = fill_up(fs.path());
    let err = entry.write(500, &[1], crc(&[1])).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
    assert_eq!(std::fs::metadata(dir.join("ranges")).unwrap().len(), 4080, "cut back to whole records");
    std::fs::remove_file(filler).unwrap();
    entry.write(600, &[2], crc(&[2])).unwrap();
    drop(entry);
    let entry = Entry::open(&dir).unwrap();
    assert_eq!(entry.found.damaged_records.load(Ordering::Relaxed), 0);
    assert_eq!(entry.covered_bytes(), 171);
    let mut b = [0u8];
    assert_eq!(entry.read(600, &mut b).unwrap(), Served::Hit);
    assert_eq!(b, [2]);
    assert_eq!(entry.read(500, &mut b).unwrap(), Served::Miss);
}

/// Issue 40 item 2: a copy written [`Pages::Kept`] is in the page cache after its writes and
/// after its promotion (whose whole check reads it there), so the next load of it reads memory;
/// one written [`Pages::Around`] is written and checked with `O_DIRECT`, and leaves no page of
/// itself cached, promotion included.
#[test]
fn kept_copies_stay_in_the_page_cache_and_copies_around_it_do_not() {
    let dir = tempfile::tempdir().unwrap();
    let probe = dir.path().join("probe");
    std::fs::write(&probe, [0u8; 4096]).unwrap();
    if !tensora_testkit::direct_io_or_skip(&probe, "copies around the page cache") {
        return;
    }
    let size_bytes: u64 = 4 << 20;
    let mut arena = tensora_io::Arena::with_len(size_bytes).unwrap();
    for (i, b) in arena.as_mut_slice().iter_mut().enumerate() {
        *b = (i % 241) as u8;
    }
    for (pages, cached) in [(Pages::Kept, 1.0), (Pages::Around, 0.0)] {
        let description = Description {
            url: format!("http://h/{pages:?}"),
            path: "x".into(),
            size_bytes,
            etag: Some("e".into()),
            last_modified_ns: 0,
        };
        let partial = dir.path().join(format!("{pages:?}-partial"));
        let entry = Entry::create(&partial, &description, pages).unwrap();
        for piece in arena.as_slice().chunks(1 << 20).enumerate() {
            let (k, bytes) = piece;
            entry.write((k as u64) << 20, bytes, crc32c::crc32c(bytes)).unwrap();
        }
        let residency = |file: &File| tensora_sys::residency_sample(file, size_bytes).unwrap().fraction();
        assert_eq!(residency(&entry.data), cached, "{pages:?}: after the writes");
        let complete = dir.path().join(format!("{pages:?}-complete"));
        assert_eq!(entry.promote(&complete).unwrap(), Promoted::Done);
        assert_eq!(residency(&entry.data), cached, "{pages:?}: after the promotion's check");
        let mut back = vec![0u8; size_bytes as usize];
        std::fs::File::open(complete.join("data")).unwrap().read_exact_at(&mut back, 0).unwrap();
        assert!(back == arena.as_slice(), "{pages:?}: the copy holds what was written");
    }
}
