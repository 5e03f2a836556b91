//! Fuzz the ServerlessLLM `tensor_index.json` parser: any input gives `Ok` or a typed error, never
//! a panic; peak heap at most 4× the input (plus a small constant); an accepted index is one
//! JSON object with as many members as entries and re-serialises to one that parses the same.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tensora_format::sllm::{parse_index, write::index_json};
use tensora_testkit::CountingAlloc;

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc::new();

/// Issue 14, finding 5: peak heap while parsing at most this many times the index bytes…
const PEAK_PER_INDEX_BYTE_MAX: usize = 4;
/// …plus this much for fixed costs (tables' minimum sizes, error messages) on tiny inputs.
const PEAK_SLACK_BYTES: usize = 64 << 10;

fuzz_target!(|data: &[u8]| {
    let (result, peak_bytes) = ALLOC.peak_during(|| parse_index(data));
    assert!(
        peak_bytes <= PEAK_PER_INDEX_BYTE_MAX * data.len() + PEAK_SLACK_BYTES,
        "peak {peak_bytes} bytes for a {}-byte index",
        data.len()
    );
    if let Ok(index) = result {
        let generic = serde_json::from_slice::<serde_json::Value>(data).expect("accepted, so it is JSON");
        assert_eq!(generic.as_object().map(|o| o.len()), Some(index.len()));
        let again = parse_index(index_json(&index.to_entries()).as_bytes())
            .expect("a re-serialised valid index must parse");
        assert_eq!(again.to_entries(), index.to_entries());
    }
});
