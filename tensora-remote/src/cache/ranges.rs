//! The range log of one cached object (`ranges`): one [`RECORD_BYTES`] record per landed range,
//! each carrying its own checksum, appended only after the range's bytes were written.
//!
//! Reading a log keeps only records that pass their own checksum and lie inside the object (a
//! torn or damaged record is dropped and counted, never believed), in O(n log n) for n records
//! and never more than [`RECORDS_MAX`] of them. A log is cut back to its whole good records
//! before anything is appended to it (`Entry::create`), so a record appended after a tear is
//! never read out of step.

use crate::crc::crc32c;

/// Bytes of one record of the range log, little-endian: offset (u64), length (u64), the range's
/// CRC-32C (u32), and the CRC-32C of those 20 bytes (u32), the record's own checksum.
pub const RECORD_BYTES: usize = 24;
/// Records read from one range log; a longer log is refused as damaged. A 1 TiB object written
/// in the lane's 1 MiB pieces is 2^20 records; the log of one that was fetched twice over in
/// pieces is still under this.
pub const RECORDS_MAX: usize = 1 << 22;

/// One landed range: where it is in the object, and the CRC-32C of its bytes (as they arrived:
/// taken from the load's memory before it could change, or read back from the disk and compared
/// with such a CRC).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RangeRecord {
    /// First byte in the object.
    pub offset_bytes: u64,
    /// Length of the range.
    pub len_bytes: u64,
    /// CRC-32C of the range's bytes when they were written.
    pub crc32c: u32,
}

impl RangeRecord {
    /// The record's bytes in the log, its own checksum last.
    pub(crate) fn encode(&self) -> [u8; RECORD_BYTES] {
        let mut out = [0u8; RECORD_BYTES];
        out[..8].copy_from_slice(&self.offset_bytes.to_le_bytes());
        out[8..16].copy_from_slice(&self.len_bytes.to_le_bytes());
        out[16..20].copy_from_slice(&self.crc32c.to_le_bytes());
        let own = crc32c(&out[..20]);
        out[20..].copy_from_slice(&own.to_le_bytes());
        out
    }

    /// The record in `bytes`, if its own checksum holds and it lies inside an object of
    /// `size_bytes` (and is not empty: the cache never records an empty range).
    pub(crate) fn decode(bytes: &[u8; RECORD_BYTES], size_bytes: u64) -> Option<RangeRecord> {
        let word = |at: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&bytes[at..at + 8]);
            u64::from_le_bytes(b)
        };
        let half = |at: usize| {
            let mut b = [0u8; 4];
            b.copy_from_slice(&bytes[at..at + 4]);
            u32::from_le_bytes(b)
        };
        if half(20) != crc32c(&bytes[..20]) {
            return None;
        }
        let record = RangeRecord { offset_bytes: word(0), len_bytes: word(8), crc32c: half(16) };
        let end = record.offset_bytes.checked_add(record.len_bytes)?;
        (record.len_bytes > 0 && end <= size_bytes).then_some(record)
    }

    /// One past its last byte.
    pub fn end_bytes(&self) -> u64 {
        self.offset_bytes.saturating_add(self.len_bytes)
    }
}

/// What reading a log found besides its good records.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct LogDamage {
    /// Whole records dropped: a failed checksum, outside the object, or empty.
    pub bad_records: u64,
    /// Bytes after the last whole record (a write cut short).
    pub torn_bytes: u64,
}

impl LogDamage {
    /// Whether the log holds anything but good records.
    pub fn any(&self) -> bool {
        self.bad_records > 0 || self.torn_bytes > 0
    }
}

/// Why a log could not be read at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooManyRecords;

impl std::fmt::Display for TooManyRecords {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the range log holds more than {RECORDS_MAX} records")
    }
}

impl std::error::Error for TooManyRecords {}

/// The good ranges of an entry: the records (sorted by offset, duplicates removed) and their
/// union as sorted disjoint intervals, with the longest record's length (for finding the records
/// that overlap a range by one binary search).
#[derive(Debug, Default, Clone)]
pub struct Ranges {
    records: Vec<RangeRecord>,
    covered: Vec<(u64, u64)>,
    len_max_bytes: u64,
}

impl Ranges {
    /// The ranges of `records` (any order), in O(n log n).
    pub fn from_records(mut records: Vec<RangeRecord>) -> Ranges {
        records.sort_unstable();
        records.dedup();
        let mut covered: Vec<(u64, u64)> = Vec::new();
        for r in &records {
            match covered.last_mut() {
                Some(last) if r.offset_bytes <= last.1 => last.1 = last.1.max(r.end_bytes()),
                _ => covered.push((r.offset_bytes, r.end_bytes())),
            }
        }
        let len_max_bytes = records.iter().map(|r| r.len_bytes).max().unwrap_or(0);
        Ranges { records, covered, len_max_bytes }
    }

    /// Parse a whole log of an object of `size_bytes`: its good records and what was dropped.
    pub fn parse(log: &[u8], size_bytes: u64) -> Result<(Ranges, LogDamage), TooManyRecords> {
        let whole = log.len() / RECORD_BYTES;
        if whole > RECORDS_MAX {
            return Err(TooManyRecords);
        }
        let mut damage = LogDamage { torn_bytes: (log.len() % RECORD_BYTES) as u64, ..LogDamage::default() };
        let mut records = Vec::with_capacity(whole);
        for chunk in log.chunks_exact(RECORD_BYTES) {
            let mut bytes = [0u8; RECORD_BYTES];
            bytes.copy_from_slice(chunk);
            match RangeRecord::decode(&bytes, size_bytes) {
                Some(r) => records.push(r),
                None => damage.bad_records += 1,
            }
        }
        Ok((Ranges::from_records(records), damage))
    }

    /// The good records, sorted by offset.
    pub fn records(&self) -> &[RangeRecord] {
        &self.records
    }

    /// Add one record: O(log n) to find its place, plus the moves of one insertion.
    pub fn add(&mut self, r: RangeRecord) {
        if r.len_bytes == 0 {
            return;
        }
        match self.records.binary_search(&r) {
            Ok(_) => return,
            Err(at) => self.records.insert(at, r),
        }
        self.len_max_bytes = self.len_max_bytes.max(r.len_bytes);
        // The intervals touching `r` are a run: merge them into one.
        let (start, end) = (r.offset_bytes, r.end_bytes());
        let first = self.covered.partition_point(|&(_, e)| e < start);
        let last = self.covered.partition_point(|&(s, _)| s <= end);
        let merged =
            self.covered[first..last].iter().fold((start, end), |(s, e), &(s2, e2)| (s.min(s2), e.max(e2)));
        self.covered.splice(first..last, std::iter::once(merged));
    }

    /// Drop `bad` records (found not to hold what they claim), recomputing the union.
    pub fn remove(&mut self, bad: &[RangeRecord]) {
        let mut records = std::mem::take(&mut self.records);
        records.retain(|r| !bad.contains(r));
        *self = Ranges::from_records(records);
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

    /// A few records whose union covers `offset..offset + len` (which [`Ranges::covers`]), chosen
    /// to read as little beyond it as they can: at each step, of the records that start at or
    /// before the first byte not yet covered, the shortest one that reaches the end if one does,
    /// else the one that reaches furthest. Empty if the range is not covered.
    pub fn cover(&self, offset_bytes: u64, len_bytes: u64) -> Vec<RangeRecord> {
        let end = offset_bytes.saturating_add(len_bytes);
        if len_bytes == 0 || !self.covers(offset_bytes, len_bytes) {
            return Vec::new();
        }
        // Every record overlapping the range starts after `offset - len_max`.
        let from = self
            .records
            .partition_point(|r| r.offset_bytes < offset_bytes.saturating_sub(self.len_max_bytes));
        let upto = self.records.partition_point(|r| r.offset_bytes < end);
        let candidates = &self.records[from..upto];
        let mut chosen = Vec::new();
        let mut at = offset_bytes;
        while at < end {
            let reaching = candidates.iter().filter(|r| r.offset_bytes <= at && r.end_bytes() > at);
            let finishing = reaching.clone().filter(|r| r.end_bytes() >= end).min_by_key(|r| r.len_bytes);
            let Some(next) = finishing.or_else(|| reaching.max_by_key(|r| r.end_bytes())) else {
                return Vec::new();
            };
            chosen.push(*next);
            at = next.end_bytes();
        }
        chosen
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn record(offset_bytes: u64, len_bytes: u64) -> RangeRecord {
        RangeRecord { offset_bytes, len_bytes, crc32c: offset_bytes as u32 }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]
        /// The union of recorded ranges covers exactly the bytes some range covers, built at once
        /// or one record at a time; a cover of a covered range is made of records and covers it.
        #[test]
        fn coverage_is_the_union_of_the_ranges(
            ranges in proptest::collection::vec((0u64..200, 1u64..40), 0..12),
            probe in (0u64..240, 1u64..40),
        ) {
            let mut one_by_one = Ranges::default();
            let mut bytes = [false; 240];
            for &(o, l) in &ranges {
                one_by_one.add(record(o, l));
                for b in o..o + l { bytes[b as usize] = true; }
            }
            let at_once = Ranges::from_records(ranges.iter().map(|&(o, l)| record(o, l)).collect());
            let (o, l) = probe;
            let want = (o..(o + l).min(240)).all(|b| bytes[b as usize]) && o + l <= 240;
            for set in [&one_by_one, &at_once] {
                prop_assert_eq!(set.covers(o, l), want);
                prop_assert_eq!(set.covered_bytes(), bytes.iter().filter(|&&b| b).count() as u64);
                let cover = set.cover(o, l);
                prop_assert_eq!(!cover.is_empty(), want);
                let mut at = o;
                for r in &cover {
                    prop_assert!(set.records().contains(r));
                    prop_assert!(r.offset_bytes <= at && r.end_bytes() > at);
                    at = r.end_bytes();
                }
                prop_assert!(cover.is_empty() || at >= o + l);
            }
            prop_assert_eq!(one_by_one.records(), at_once.records());
        }

        /// Any bytes parse without a panic into records that each pass their checksum and lie
        /// inside the object; a record's encoding parses back to it.
        #[test]
        fn any_log_parses_to_good_records_only(
            log in proptest::collection::vec(any::<u8>(), 0..400),
            size_bytes in 0u64..1000,
            r in (0u64..500, 1u64..500, any::<u32>()),
        ) {
            let (ranges, damage) = Ranges::parse(&log, size_bytes).unwrap();
            prop_assert_eq!(damage.torn_bytes, (log.len() % RECORD_BYTES) as u64);
            prop_assert!(ranges.records().iter().all(|r| r.end_bytes() <= size_bytes && r.len_bytes > 0));
            let r = RangeRecord { offset_bytes: r.0, len_bytes: r.1, crc32c: r.2 };
            let inside = r.end_bytes() <= size_bytes;
            prop_assert_eq!(RangeRecord::decode(&r.encode(), size_bytes), inside.then_some(r));
        }
    }

    /// Finding 1 (issue 39): a log torn 16 bytes into a record, with whole records appended after
    /// the tear, is read record by record out of step: every record after it fails its own
    /// checksum and is dropped, none claims bytes.
    #[test]
    fn finding_1_records_read_out_of_step_after_a_tear_are_dropped() {
        let mut log = Vec::new();
        log.extend_from_slice(&record(0, 100).encode());
        log.extend_from_slice(&[0u8; 16]);
        for k in 1..20 {
            log.extend_from_slice(&record(k * 100, 100).encode());
        }
        let (ranges, damage) = Ranges::parse(&log, 2000).unwrap();
        assert_eq!(ranges.records(), &[record(0, 100)]);
        assert_eq!(damage.bad_records, 19, "every whole slot after the tear");
        assert_eq!(damage.torn_bytes, 16);
        // A zeroed record, and one past the object's end, are bad too.
        let zero = [0u8; RECORD_BYTES];
        assert_eq!(RangeRecord::decode(&zero, 2000), None);
        assert_eq!(RangeRecord::decode(&record(1990, 11).encode(), 2000), None);
        assert_eq!(RangeRecord::decode(&record(u64::MAX, 2).encode(), u64::MAX), None);
    }

    /// Finding 7 (issue 39): a log of 1,000,000 disjoint records reads in O(n log n): well under
    /// a second here (it took minutes when each record re-sorted the union), and a log of more
    /// than `RECORDS_MAX` records is refused before anything is allocated for it.
    #[test]
    fn finding_7_a_million_records_read_in_n_log_n_and_the_count_is_bounded() {
        let n = 1_000_000u64;
        let mut log = Vec::with_capacity(n as usize * RECORD_BYTES);
        // Every other 10-byte slot, in a scrambled order: a million disjoint intervals.
        for k in 0..n {
            let slot = (k * 7_919) % n;
            log.extend_from_slice(&record(slot * 20, 10).encode());
        }
        let t = std::time::Instant::now();
        let (ranges, damage) = Ranges::parse(&log, n * 20).unwrap();
        let took = t.elapsed();
        assert!(!damage.any());
        assert_eq!(ranges.records().len(), n as usize);
        assert_eq!(ranges.covered_bytes(), n * 10);
        assert!(ranges.covers(20 * 999_999, 10) && !ranges.covers(10, 10));
        // Generous for a debug build on a shared 2-core machine; the quadratic union took hours.
        assert!(took < std::time::Duration::from_secs(20), "{took:?}");
        let too_long = vec![0u8; (RECORDS_MAX + 1) * RECORD_BYTES];
        assert_eq!(Ranges::parse(&too_long, u64::MAX).unwrap_err(), TooManyRecords);
    }
}
