//! Fuzz the safetensors header parser: arbitrary bytes as a file image, and the same bytes behind a
//! valid length prefix (so the JSON itself gets explored). It must return Ok or Err, never panic,
//! and an accepted header must be internally consistent.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tensora_format::safetensors::parse_header;

fn check(bytes: &[u8], file_len_bytes: u64) {
    if let Ok(h) = parse_header(bytes, file_len_bytes) {
        let mut end = 0u64;
        for t in h.tensors() {
            let (start, stop) = t.data_offsets();
            assert_eq!(start, end, "accepted header does not tile its data");
            assert_eq!(t.dtype().bytes_for(t.shape().iter().product()), Some(stop - start));
            end = stop;
        }
        assert_eq!(end, h.data_len_bytes());
    }
}

fuzz_target!(|data: &[u8]| {
    check(data, data.len() as u64);
    // The same bytes as a header of exactly that length, with a data section of up to 255 bytes.
    let extra = u64::from(data.first().copied().unwrap_or(0));
    let mut file = (data.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(data);
    check(&file, file.len() as u64 + extra);
});
