//! Issue 39, finding 9: a conversion whose shard index its own loader would refuse (the metadata
//! makes it longer than `INDEX_BYTES_MAX`) fails with the typed error, before writing anything;
//! before, it succeeded and `tensora inspect` then failed on the index.

use std::collections::BTreeMap;
use std::io::Write;

use tensora_convert::{ConvertConfig, ConvertError, TargetFormat};
use tensora_format::sharded::INDEX_BYTES_MAX;
use tensora_format::write::{SafetensorsLayout, TensorSpec, write_safetensors};
use tensora_format::{Dtype, ErrorKind};

#[test]
fn a_conversion_whose_index_the_loader_would_refuse_fails_before_writing() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("big-metadata.safetensors");
    // One metadata value as long as the index may be: with `total_size` and the weight map, the
    // index is longer (the header, whose limit is higher, still holds it).
    let metadata = BTreeMap::from([("notes".to_owned(), "x".repeat(INDEX_BYTES_MAX as usize))]);
    let specs = ["a", "b"].map(|n| TensorSpec { name: n.to_owned(), dtype: Dtype::U8, shape: vec![8] });
    let layout = SafetensorsLayout::new(specs.to_vec(), metadata).unwrap();
    write_safetensors(&src, &layout, |i, out: &mut dyn Write| out.write_all(&[i as u8; 8])).unwrap();
    let ckpt = tensora_format::open(&src).unwrap();

    let dst = dir.path().join("sharded");
    let cfg =
        ConvertConfig { to: TargetFormat::Safetensors, shard_bytes_max: Some(8), ..ConvertConfig::default() };
    let err = tensora_convert::convert(&ckpt, &dst, &cfg).unwrap_err();
    let ConvertError::Format(e) = &err else { panic!("{err}") };
    assert!(
        matches!(e.kind(), ErrorKind::IndexTooLarge { len_bytes, limit_bytes }
            if *len_bytes > INDEX_BYTES_MAX && *limit_bytes == INDEX_BYTES_MAX),
        "{err}"
    );
    // Nothing written: no destination, no temporary directory beside it.
    let mut left: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, ["big-metadata.safetensors"]);
}
