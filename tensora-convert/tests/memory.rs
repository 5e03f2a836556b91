//! Peak extra heap of a save stays within 64 MiB beyond the tensors, whatever their size: from
//! memory (direct writes through the staging buffers, buffered writes straight from the tensors)
//! and streamed from a checkpoint on disk (a conversion's source), measured with the counting
//! allocator over 128 MiB of tensors.

use std::collections::BTreeMap;

use tensora_convert::CheckpointSource;
use tensora_convert::{MemoryTensors, SaveOptions, SourceTensor, WriteChoice};
use tensora_format::Dtype;
use tensora_testkit::CountingAlloc;

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc::new();

/// The bound on a save's memory beyond the tensors.
const EXTRA_BYTES_MAX: usize = 64 << 20;
const TENSORS: usize = 8;
const TENSOR_BYTES: usize = 16 << 20;

#[test]
fn a_save_holds_at_most_64_mib_beyond_the_tensors() {
    let data: Vec<Vec<u8>> = (0..TENSORS).map(|i| vec![i as u8 + 1; TENSOR_BYTES]).collect();
    let mut tensors = MemoryTensors::new();
    for (i, d) in data.iter().enumerate() {
        let t = SourceTensor::dense(format!("w{i}"), Dtype::F32, vec![(TENSOR_BYTES / 4) as u64]).unwrap();
        tensors.push(t, d).unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let meta = BTreeMap::new();
    let saved = dir.path().join("a.safetensors");
    for mode in [WriteChoice::Auto, WriteChoice::Buffered, WriteChoice::Direct] {
        let opts =
            SaveOptions { mode, manifest: Some(tensora_verify::Algo::Crc32c), ..SaveOptions::default() };
        let (report, peak) =
            ALLOC.peak_during(|| tensora_convert::save_safetensors(&saved, &tensors, &meta, &opts).unwrap());
        assert!(peak <= EXTRA_BYTES_MAX, "{mode:?} ({}): peak {peak} bytes", report.mode);
    }
    // Streamed from the file just written: every byte passes through the staging buffers.
    let ckpt = tensora_format::open(&saved).unwrap();
    let source = CheckpointSource::open(&ckpt).unwrap();
    let copy = dir.path().join("b.safetensors");
    let (_, peak) = ALLOC.peak_during(|| {
        tensora_convert::save_safetensors(&copy, &source, &meta, &SaveOptions::default()).unwrap()
    });
    assert!(
        peak <= EXTRA_BYTES_MAX,
        "streamed: peak {peak} bytes for {} bytes of tensors",
        TENSORS * TENSOR_BYTES
    );
    assert_eq!(std::fs::read(&copy).unwrap(), std::fs::read(&saved).unwrap());
}
