//! Fuzz the cache's range log reader (issue 39): any log of any object size gives its good
//! records or a typed error, never a panic; peak heap at most a few times the log; every record
//! kept lies inside the object and is not empty; the union covers no more than the object; the
//! good records, written again, read back the same with no damage; covering answers agree with
//! the union.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tensora_remote::fuzzing::{RECORD_BYTES, Ranges, encode};
use tensora_testkit::CountingAlloc;

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc::new();

/// Peak heap while parsing at most this many times the log's bytes (records take 20 of its 24
/// bytes each, the union at most 16 more)…
const PEAK_PER_LOG_BYTE_MAX: usize = 4;
/// …plus this much for fixed costs on tiny inputs.
const PEAK_SLACK_BYTES: usize = 64 << 10;

fuzz_target!(|data: &[u8]| {
    if data.len() < 8 {
        return;
    }
    let (head, log) = data.split_at(8);
    let size_bytes = u64::from_le_bytes(head.try_into().unwrap()) >> (head[0] % 64);
    let (result, peak_bytes) = ALLOC.peak_during(|| Ranges::parse(log, size_bytes));
    assert!(peak_bytes <= PEAK_PER_LOG_BYTE_MAX * log.len() + PEAK_SLACK_BYTES, "peak {peak_bytes}");
    let Ok((ranges, damage)) = result else { return };
    assert_eq!(damage.torn_bytes, (log.len() % RECORD_BYTES) as u64);
    // Duplicates are kept once.
    assert!(ranges.records().len() as u64 + damage.bad_records <= (log.len() / RECORD_BYTES) as u64);
    for r in ranges.records() {
        assert!(r.len_bytes > 0 && r.offset_bytes.checked_add(r.len_bytes).is_some_and(|e| e <= size_bytes));
        assert!(ranges.covers(r.offset_bytes, r.len_bytes));
        assert!(!ranges.cover(r.offset_bytes, r.len_bytes).is_empty());
    }
    assert!(ranges.covered_bytes() <= size_bytes);
    let (again, clean) = Ranges::parse(&encode(ranges.records()), size_bytes).expect("as many records");
    assert!(!clean.any());
    assert_eq!(again.records(), ranges.records());
    assert_eq!(again.covered_bytes(), ranges.covered_bytes());
});
