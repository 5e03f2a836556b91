use std::collections::BTreeMap;
use std::io::Write;

use proptest::prelude::*;

use super::*;
use crate::safetensors::parse_header;

/// Deterministic content for tensor `i`: byte k is `(i * 31 + k) % 251`.
fn fill_pattern(i: usize, len: u64, out: &mut dyn Write) -> io::Result<()> {
    let bytes: Vec<u8> = (0..len).map(|k| ((i as u64 * 31 + k) % 251) as u8).collect();
    // Several writes, so the bound is exercised on partial writes too.
    for piece in bytes.chunks(7) {
        out.write_all(piece)?;
    }
    Ok(())
}

fn spec(name: &str, dtype: Dtype, shape: &[u64]) -> TensorSpec {
    TensorSpec { name: name.into(), dtype, shape: shape.to_vec() }
}

#[test]
fn header_is_padded_to_8_and_tensors_aligned() {
    let specs = vec![
        spec("u8", Dtype::U8, &[3]),
        spec("f64", Dtype::F64, &[2]),
        spec("f16", Dtype::F16, &[5]),
        spec("f4", Dtype::F4, &[2]),
        spec("f32", Dtype::F32, &[1]),
        spec("c64", Dtype::C64, &[1]),
        spec("scalar", Dtype::I32, &[]),
        spec("empty", Dtype::F64, &[0, 4]),
    ];
    let layout = SafetensorsLayout::new(specs.clone(), BTreeMap::new()).unwrap();
    let header = layout.header_bytes();
    let n = u64::from_le_bytes(header[..8].try_into().unwrap());
    assert_eq!(n as usize + 8, header.len());
    assert_eq!(n % 8, 0);
    for (i, s) in specs.iter().enumerate() {
        let r = layout.tensor_range(i);
        assert_eq!(r.start % s.dtype.align_bytes(), 0, "{}", s.name);
        assert_eq!(r.end - r.start, s.nbytes().unwrap());
    }
    // File order is by decreasing alignment, spec order within a class.
    let order: Vec<&str> = layout.file_order().iter().map(|&i| specs[i].name.as_str()).collect();
    assert_eq!(order, ["f64", "c64", "empty", "f32", "scalar", "f16", "u8", "f4"]);
}

#[test]
fn written_file_parses_back_to_the_layout() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.safetensors");
    let specs = vec![spec("a", Dtype::BF16, &[3, 2]), spec("b", Dtype::U8, &[5]), spec("c", Dtype::F64, &[])];
    let meta =
        BTreeMap::from([("format".to_string(), "pt".to_string()), ("q\"\n".to_string(), "é".to_string())]);
    let layout = SafetensorsLayout::new(specs.clone(), meta.clone()).unwrap();
    write_safetensors(&path, &layout, |i, out| fill_pattern(i, specs[i].nbytes().unwrap(), out)).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(bytes.len() as u64, layout.file_len_bytes());
    let header = parse_header(&bytes, bytes.len() as u64).unwrap();
    assert_eq!(header.metadata(), Some(&meta));
    for (i, s) in specs.iter().enumerate() {
        let t = header.tensors().find(|t| t.name() == s.name).unwrap();
        let r = layout.tensor_range(i);
        assert_eq!(header.data_start_bytes() + t.data_offsets().0, r.start);
        assert_eq!((t.dtype(), t.shape()), (s.dtype, &s.shape[..]));
        let mut want = Vec::new();
        fill_pattern(i, s.nbytes().unwrap(), &mut want).unwrap();
        assert_eq!(&bytes[r.start as usize..r.end as usize], &want[..]);
    }
    // No temp file left behind.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}

#[test]
fn fill_writing_too_much_or_too_little_fails_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.safetensors");
    let layout = SafetensorsLayout::new(vec![spec("a", Dtype::F32, &[2])], BTreeMap::new()).unwrap();
    let e = write_safetensors(&path, &layout, |_, out| out.write_all(&[0u8; 9])).unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::Io(_)));
    assert_eq!(e.tensor(), Some("a"));
    let e = write_safetensors(&path, &layout, |_, out| out.write_all(&[0u8; 7])).unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::Write { .. }));
    let e = write_safetensors(&path, &layout, |_, _| Err(io::Error::other("source failed"))).unwrap_err();
    assert!(e.to_string().contains("source failed"));
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "temp files must be removed");
}

#[test]
fn failed_write_keeps_the_old_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.safetensors");
    std::fs::write(&path, b"old").unwrap();
    let layout = SafetensorsLayout::new(vec![spec("a", Dtype::U8, &[2])], BTreeMap::new()).unwrap();
    write_safetensors(&path, &layout, |_, out| out.write_all(&[1])).unwrap_err();
    assert_eq!(std::fs::read(&path).unwrap(), b"old");
    write_safetensors(&path, &layout, |_, out| out.write_all(&[1, 2])).unwrap();
    assert_eq!(std::fs::read(&path).unwrap().len() as u64, layout.file_len_bytes());
}

#[test]
fn atomic_file_removed_on_drop_and_renamed_on_commit() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.bin");
    let mut a = AtomicFile::create(&path).unwrap();
    a.write_all(b"x").unwrap();
    let temp = a.temp_path().to_path_buf();
    assert!(temp.exists() && temp.parent() == Some(dir.path()));
    drop(a);
    assert!(!temp.exists() && !path.exists());
    let mut a = AtomicFile::create(&path).unwrap();
    a.write_all(b"done").unwrap();
    a.commit().unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), b"done");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}

#[test]
fn layout_rejects_bad_specs() {
    type Check = fn(&ErrorKind) -> bool;
    let cases: Vec<(Vec<TensorSpec>, Check)> = vec![
        (vec![spec("", Dtype::U8, &[1])], |k| matches!(k, ErrorKind::BadTensorName { .. })),
        (vec![spec("a\0", Dtype::U8, &[1])], |k| matches!(k, ErrorKind::BadTensorName { .. })),
        (vec![spec("__metadata__", Dtype::U8, &[1])], |k| matches!(k, ErrorKind::BadTensorName { .. })),
        (vec![spec("a", Dtype::U8, &[1]), spec("a", Dtype::F32, &[1])], |k| {
            matches!(k, ErrorKind::DuplicateTensor)
        }),
        (vec![spec("a", Dtype::U8, &[1; 65])], |k| matches!(k, ErrorKind::RankTooLarge { .. })),
        (vec![spec("a", Dtype::F32, &[u64::MAX, 2])], |k| matches!(k, ErrorKind::SizeOverflow)),
        (vec![spec("a", Dtype::F4, &[3])], |k| matches!(k, ErrorKind::PartialByte { .. })),
        (vec![spec("a", Dtype::U8, &[u64::MAX / 2]), spec("b", Dtype::U8, &[u64::MAX / 2 + 2])], |k| {
            matches!(k, ErrorKind::SizeOverflow)
        }),
    ];
    for (specs, check) in cases {
        let e = SafetensorsLayout::new(specs.clone(), BTreeMap::new()).unwrap_err();
        assert!(check(e.kind()), "{specs:?}: {e}");
    }
}

#[test]
fn hf_reads_what_we_write_including_escapes_and_zero_sized_tensors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.safetensors");
    let specs = vec![
        spec("we\"ird\\name\u{e9}", Dtype::F16, &[2, 2]),
        spec("zero", Dtype::F32, &[0]),
        spec("s", Dtype::I64, &[]),
    ];
    let layout = SafetensorsLayout::new(specs.clone(), BTreeMap::new()).unwrap();
    write_safetensors(&path, &layout, |i, out| fill_pattern(i, specs[i].nbytes().unwrap(), out)).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let hf = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    assert_eq!(hf.len(), 3);
    let t = hf.tensor("we\"ird\\name\u{e9}").unwrap();
    assert_eq!(t.shape(), &[2, 2]);
    let r = layout.tensor_range(0);
    assert_eq!(t.data(), &bytes[r.start as usize..r.end as usize]);
}

#[test]
fn sharded_output_respects_the_cap_and_reopens() {
    let dir = tempfile::tempdir().unwrap();
    let specs: Vec<TensorSpec> = (0..10).map(|i| spec(&format!("t{i}"), Dtype::F32, &[10 + i])).collect();
    let meta = BTreeMap::from([("format".to_string(), "pt".to_string())]);
    let sharded = ShardedLayout::new(specs.clone(), meta, 120).unwrap();
    assert!(sharded.shards().len() > 1);
    for shard in sharded.shards() {
        let data: u64 = shard.spec_indices.iter().map(|&i| specs[i].nbytes().unwrap()).sum();
        assert!(data <= 120 || shard.spec_indices.len() == 1, "{data}");
    }
    write_sharded(dir.path(), &sharded, |i, out| fill_pattern(i, specs[i].nbytes().unwrap(), out)).unwrap();
    let ckpt = crate::open(dir.path()).unwrap();
    assert_eq!(ckpt.format(), crate::Format::SafetensorsSharded);
    assert_eq!(ckpt.files().len(), sharded.shards().len());
    assert_eq!(ckpt.tensors().len(), 10);
    assert!(ckpt.warnings().is_empty(), "{:?}", ckpt.warnings());
    assert_eq!(ckpt.metadata()["format"], "pt");
    assert_eq!(ckpt.metadata()["total_size"], sharded.total_size_bytes().to_string());
    for (i, s) in specs.iter().enumerate() {
        let t = ckpt.tensor(&s.name).unwrap();
        let file = &ckpt.file(t.file());
        let bytes = std::fs::read(file.path()).unwrap();
        let mut want = Vec::new();
        fill_pattern(i, s.nbytes().unwrap(), &mut want).unwrap();
        assert_eq!(&bytes[t.range().start as usize..t.range().end as usize], &want[..]);
    }
    // An oversized tensor gets a shard of its own.
    let big = ShardedLayout::new(
        vec![spec("big", Dtype::U8, &[1000]), spec("s", Dtype::U8, &[1])],
        BTreeMap::new(),
        10,
    )
    .unwrap();
    assert_eq!(big.shards().len(), 2);
    assert!(ShardedLayout::new(vec![], BTreeMap::new(), 0).is_err());
}

fn arb_dtype() -> impl Strategy<Value = Dtype> {
    prop::sample::select(Dtype::ALL.to_vec())
}

fn arb_specs() -> impl Strategy<Value = Vec<TensorSpec>> {
    proptest::collection::vec((arb_dtype(), proptest::collection::vec(0u64..5, 0..4)), 0..12).prop_map(|v| {
        v.into_iter()
            .enumerate()
            .map(|(i, (dtype, mut shape))| {
                // Make sub-byte tensors whole bytes: append a dimension of 8 (8 x 4 or 6 bits).
                if dtype.size_bytes().is_none() {
                    shape.push(8);
                }
                spec(&format!("layer.{i}.w"), dtype, &shape)
            })
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn random_layouts_round_trip(specs in arb_specs(), meta in proptest::collection::btree_map("[a-z\"\\\\é]{1,6}", "[ -~]{0,8}", 0..3)) {
        let layout = SafetensorsLayout::new(specs.clone(), meta.clone()).unwrap();
        let mut file = layout.header_bytes().to_vec();
        for &i in layout.file_order() {
            prop_assert_eq!(file.len() as u64, layout.tensor_range(i).start);
            fill_pattern(i, specs[i].nbytes().unwrap(), &mut file).unwrap();
        }
        prop_assert_eq!(file.len() as u64, layout.file_len_bytes());
        let header = parse_header(&file, file.len() as u64).unwrap();
        prop_assert_eq!(header.tensors().len(), specs.len());
        prop_assert_eq!(header.metadata().cloned().unwrap_or_default(), meta);
        for (i, s) in specs.iter().enumerate() {
            let t = header.tensors().find(|t| t.name() == s.name).unwrap();
            prop_assert_eq!(t.dtype(), s.dtype);
            prop_assert_eq!(t.shape(), &s.shape[..]);
            prop_assert_eq!(header.data_start_bytes() + t.data_offsets().0, layout.tensor_range(i).start);
            prop_assert_eq!(layout.tensor_range(i).start % s.dtype.align_bytes(), 0);
        }
        // And HF agrees.
        let hf = safetensors::SafeTensors::deserialize(&file).unwrap();
        prop_assert_eq!(hf.len(), specs.len());
    }

    /// Edits of a written file: every result is checked (an `Ok` against serde_json's reading of
    /// the header, an `Err` for its kind); edits confined to the data section change nothing.
    #[test]
    fn mutations_of_a_written_file_give_checked_results(
        specs in arb_specs(),
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
    ) {
        let layout = SafetensorsLayout::new(specs.clone(), BTreeMap::new()).unwrap();
        let mut file = layout.header_bytes().to_vec();
        for &i in layout.file_order() {
            fill_pattern(i, specs[i].nbytes().unwrap(), &mut file).unwrap();
        }
        let original = file.clone();
        let data_start = layout.header_bytes().len();
        for (at, b) in &edits {
            let k = at.index(file.len());
            file[k] = *b;
        }
        let result = parse_header(&file, file.len() as u64);
        crate::safetensors::tests::check_parse_result(&file, file.len() as u64, &result)?;
        if edits.iter().all(|(at, _)| at.index(file.len()) >= data_start) {
            prop_assert_eq!(result.unwrap(), parse_header(&original, original.len() as u64).unwrap());
        }
    }
}

#[test]
fn sharded_output_never_mixes_and_leaves_nothing_on_failure() {
    let dir = tempfile::tempdir().unwrap();
    let specs: Vec<TensorSpec> = (0..6).map(|i| spec(&format!("t{i}"), Dtype::F32, &[16])).collect();
    let sharded = ShardedLayout::new(specs.clone(), BTreeMap::new(), 64).unwrap();
    assert!(sharded.shards().len() >= 3);

    // A failure in the last shard removes the shards already written, and writes no index.
    let last = *sharded.shards().last().unwrap().spec_indices.last().unwrap();
    let err = write_sharded(dir.path(), &sharded, |i, out| {
        if i == last { Err(std::io::Error::other("injected")) } else { fill_pattern(i, 64, out) }
    })
    .unwrap_err();
    assert!(err.to_string().contains("injected") || matches!(err.kind(), ErrorKind::Write { .. }), "{err}");
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(left.is_empty(), "left behind: {left:?}");

    // A complete write succeeds; a second write into the same directory is refused untouched.
    write_sharded(dir.path(), &sharded, |i, out| fill_pattern(i, 64, out)).unwrap();
    let before = std::fs::read(dir.path().join(crate::write::SHARD_INDEX_FILE_NAME)).unwrap();
    let err = write_sharded(dir.path(), &sharded, |i, out| fill_pattern(i, 64, out)).unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::Write { .. }), "{err}");
    assert_eq!(std::fs::read(dir.path().join(crate::write::SHARD_INDEX_FILE_NAME)).unwrap(), before);
    assert_eq!(crate::open(dir.path()).unwrap().tensors().len(), 6);
}

/// A sharded layout whose only metadata value is `len` bytes of `x`, over one one-byte tensor.
fn layout_with_metadata_value(len: usize) -> Result<ShardedLayout> {
    let metadata = BTreeMap::from([("big".to_owned(), "x".repeat(len))]);
    ShardedLayout::new(vec![spec("w", Dtype::U8, &[1])], metadata, 8)
}

#[test]
fn the_writer_refuses_an_index_its_reader_would_refuse_and_accepts_the_largest_it_reads() {
    use crate::sharded::{INDEX_BYTES_MAX, parse_index};
    // The index grows byte for byte with the metadata value (plain ASCII needs no escape).
    let base = layout_with_metadata_value(0).unwrap().index_json().len() as u64;
    let largest = (INDEX_BYTES_MAX - base) as usize;
    let at_limit = layout_with_metadata_value(largest).unwrap();
    assert_eq!(at_limit.index_json().len() as u64, INDEX_BYTES_MAX);
    let read_back = parse_index(at_limit.index_json().to_vec()).expect("the reader takes the largest index");
    assert_eq!(read_back.metadata()["big"].len(), largest);
    drop((at_limit, read_back));
    let e = layout_with_metadata_value(largest + 1).unwrap_err();
    assert!(
        matches!(e.kind(), ErrorKind::IndexTooLarge { len_bytes, limit_bytes }
            if *len_bytes == INDEX_BYTES_MAX + 1 && *limit_bytes == INDEX_BYTES_MAX),
        "{e}"
    );
    assert!(e.to_string().contains(SHARD_INDEX_FILE_NAME), "{e}");
}

#[test]
fn the_writer_refuses_more_index_metadata_keys_than_its_reader_takes() {
    use crate::sharded::{INDEX_METADATA_KEYS_MAX, parse_index};
    let keys = |n: usize| (0..n).map(|k| (format!("k{k}"), "v".to_owned())).collect::<BTreeMap<_, _>>();
    let specs = || vec![spec("w", Dtype::U8, &[1])];
    // `total_size` is one of the keys the reader counts.
    let most = ShardedLayout::new(specs(), keys(INDEX_METADATA_KEYS_MAX - 1), 8).unwrap();
    parse_index(most.index_json().to_vec()).expect("the reader takes as many keys as the writer writes");
    let e = ShardedLayout::new(specs(), keys(INDEX_METADATA_KEYS_MAX), 8).unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::Write { reason } if reason.contains("keys")), "{e}");
}
