//! Fuzz the ServerlessLLM `tensor_index.json` parser: any input gives `Ok` or a typed error, never
//! a panic, and an accepted index re-serialises to one that parses to the same entries.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tensora_format::sllm::{parse_index, write::index_json};

fuzz_target!(|data: &[u8]| {
    if let Ok(index) = parse_index(data) {
        let again = parse_index(index_json(&index.entries).as_bytes())
            .expect("a re-serialised valid index must parse");
        assert_eq!(again.entries, index.entries);
    }
});
