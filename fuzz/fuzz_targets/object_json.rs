//! Fuzz the cache's `object.json` reader (issue 39): any bytes give a description or a typed
//! error, never a panic; peak heap at most a few times the input; an accepted description,
//! written again as the cache writes it, reads back equal.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tensora_remote::fuzzing::Description;
use tensora_testkit::CountingAlloc;

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc::new();

/// Peak heap while parsing at most this many times the input…
const PEAK_PER_INPUT_BYTE_MAX: usize = 4;
/// …plus this much for fixed costs on tiny inputs.
const PEAK_SLACK_BYTES: usize = 64 << 10;

fuzz_target!(|data: &[u8]| {
    let (result, peak_bytes) = ALLOC.peak_during(|| Description::parse(data));
    assert!(peak_bytes <= PEAK_PER_INPUT_BYTE_MAX * data.len() + PEAK_SLACK_BYTES, "peak {peak_bytes}");
    if let Ok(description) = result {
        let written = serde_json::to_vec_pretty(&description).expect("a description serialises");
        assert_eq!(Description::parse(&written).expect("what the cache writes reads back"), description);
    }
});
