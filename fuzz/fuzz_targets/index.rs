//! Fuzz the sharded-checkpoint index parser: Ok or a typed error, never a panic; peak heap at most
//! 4× the input (plus a small constant) on every input; an accepted index is one JSON object
//! (serde_json agrees), has unique tensor names, plain shard names listed once each in order,
//! and answers `shard_of` for every tensor; invalid JSON is always `BadIndex`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tensora_format::ErrorKind;
use tensora_format::sharded::{check_shard_name, parse_index};
use tensora_testkit::CountingAlloc;

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc::new();

/// Issue 14, finding 5: peak heap while parsing at most this many times the index bytes…
const PEAK_PER_INDEX_BYTE_MAX: usize = 4;
/// …plus this much for fixed costs (tables' minimum sizes, error messages) on tiny inputs.
const PEAK_SLACK_BYTES: usize = 64 << 10;

fuzz_target!(|data: &[u8]| {
    let owned = data.to_vec(); // The parser takes its input; the copy is not its peak.
    let (result, peak_bytes) = ALLOC.peak_during(|| parse_index(owned));
    assert!(
        peak_bytes <= PEAK_PER_INDEX_BYTE_MAX * data.len() + PEAK_SLACK_BYTES,
        "peak {peak_bytes} bytes for a {}-byte index",
        data.len()
    );
    let generic = serde_json::from_slice::<serde_json::Value>(data);
    // serde_json also refuses numbers whose f64 would be infinite, which JSON allows.
    let out_of_range = generic.as_ref().is_err_and(|e| e.to_string().contains("number out of range"));
    match result {
        Ok(index) => {
            assert!(out_of_range || generic.as_ref().is_ok_and(|v| v.is_object()), "accepted: {generic:?}");
            let mut names = std::collections::HashSet::new();
            for (tensor, shard) in index.weight_map() {
                assert!(names.insert(tensor), "duplicate tensor accepted");
                assert!(check_shard_name(shard).is_ok(), "bad shard name accepted");
                assert_eq!(index.shard_of(tensor), Some(shard));
            }
            let shards: Vec<&str> = index.shard_names().collect();
            assert!(shards.windows(2).all(|w| w[0] < w[1]), "shard names not sorted and distinct");
            assert!(index.weight_map().all(|(_, s)| shards.binary_search(&s).is_ok()));
        }
        Err(kind) => {
            assert!(matches!(kind, ErrorKind::BadIndex { .. } | ErrorKind::BadShardName { .. }), "{kind:?}");
            if generic.is_err() && !out_of_range {
                assert!(matches!(kind, ErrorKind::BadIndex { .. }), "invalid JSON refused as {kind:?}");
            }
        }
    }
});
