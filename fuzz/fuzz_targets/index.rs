//! Fuzz the sharded-checkpoint index parser: Ok or Err, never a panic, and an accepted index has
//! unique tensor names and plain shard names.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tensora_format::sharded::{check_shard_name, parse_index};

fuzz_target!(|data: &[u8]| {
    if let Ok(index) = parse_index(data) {
        let mut names = std::collections::HashSet::new();
        for (tensor, shard) in index.weight_map() {
            assert!(names.insert(tensor.as_str()), "duplicate tensor accepted");
            assert!(check_shard_name(shard).is_ok(), "bad shard name accepted");
        }
    }
});
