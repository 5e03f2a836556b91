use super::*;

fn kind(index: &str) -> ErrorKind {
    parse_index(index.as_bytes()).expect_err("index must be refused")
}

fn entry(fields: &str) -> String {
    format!(r#"{{"t": {fields}}}"#)
}

#[test]
fn accepts_upstream_entry_and_keeps_order() {
    let idx = r#"{"b": [0, 8, [2], [1], "torch.float32"], "a": [8, 2, [], [], "torch.bfloat16"]}"#;
    let parsed = parse_index(idx.as_bytes()).unwrap();
    assert_eq!(parsed.layout, IndexLayout::Upstream);
    let names: Vec<_> = parsed.entries().map(|e| e.name).collect();
    assert_eq!(names, ["b", "a"]);
    assert_eq!(parsed.entry(1).unwrap().dtype, Dtype::BF16);
    assert_eq!(parsed.entry(1).unwrap().shape, &[] as &[u64]);
    assert_eq!(parsed.entry(0).unwrap().partition, None);
}

#[test]
fn accepts_legacy_entry() {
    let idx = r#"{"a": [0, 8, [2], [1], "f32", 1], "b": [0, 8, [4], [1], "bf16", 0]}"#;
    let parsed = parse_index(idx.as_bytes()).unwrap();
    assert_eq!(parsed.layout, IndexLayout::Legacy);
    assert_eq!(parsed.entry(0).unwrap().partition, Some(1));
    assert_eq!(parsed.entry(1).unwrap().dtype, Dtype::BF16);
}

#[test]
fn empty_object_is_an_empty_upstream_index() {
    let parsed = parse_index(b"{}").unwrap();
    assert_eq!((parsed.layout, parsed.len()), (IndexLayout::Upstream, 0));
}

#[test]
fn rejects_invalid_json() {
    assert!(matches!(kind("{\"t\": [0, 8"), ErrorKind::BadIndex { .. }));
    assert!(matches!(kind(""), ErrorKind::BadIndex { .. }));
}

#[test]
fn rejects_trailing_bytes() {
    assert!(matches!(kind("{} x"), ErrorKind::BadIndex { .. }));
}

#[test]
fn rejects_non_object_top_level() {
    assert!(matches!(kind("[1, 2]"), ErrorKind::BadIndex { .. }));
    assert!(matches!(kind("null"), ErrorKind::BadIndex { .. }));
}

#[test]
fn rejects_value_that_is_not_an_array() {
    assert!(matches!(kind(&entry(r#"{"offset": 0}"#)), ErrorKind::BadSllmEntry { .. }));
}

#[test]
fn rejects_wrong_element_count() {
    assert!(matches!(kind(&entry(r#"[0, 8, [2], [1]]"#)), ErrorKind::BadSllmEntry { .. }));
    assert!(matches!(kind(&entry(r#"[0, 8, [2], [1], "f32", 0, 1]"#)), ErrorKind::BadSllmEntry { .. }));
}

#[test]
fn rejects_wrong_field_types() {
    let cases = [
        r#"["0", 8, [2], [1], "torch.float32"]"#,
        r#"[0, null, [2], [1], "torch.float32"]"#,
        r#"[0, 8, 2, [1], "torch.float32"]"#,
        r#"[0, 8, [2], {"0": 1}, "torch.float32"]"#,
        r#"[0, 8, ["2"], [1], "torch.float32"]"#,
        r#"[0, 8, [2], [1], 32]"#,
        r#"[0, 8, [2], [1], "f32", "0"]"#,
    ];
    for c in cases {
        assert!(matches!(kind(&entry(c)), ErrorKind::BadSllmEntry { .. }), "{c}");
    }
}

#[test]
fn rejects_negative_or_oversized_offsets_and_sizes() {
    let cases = [
        r#"[-8, 8, [2], [1], "torch.float32"]"#,
        r#"[0, -8, [2], [1], "torch.float32"]"#,
        r#"[1.5, 8, [2], [1], "torch.float32"]"#,
        r#"[18446744073709551616, 8, [2], [1], "torch.float32"]"#,
        r#"[18446744073709551615, 8, [2], [1], "torch.float32"]"#,
        r#"[0, 8, [2], [1], "f32", -1]"#,
        r#"[0, 8, [2], [1], "f32", 4294967296]"#,
    ];
    for c in cases {
        assert!(matches!(kind(&entry(c)), ErrorKind::BadOffsets { .. }), "{c}");
    }
}

#[test]
fn rejects_negative_dims_and_strides() {
    assert!(matches!(kind(&entry(r#"[0, 8, [-2], [1], "torch.float32"]"#)), ErrorKind::BadShape { .. }));
    assert!(matches!(kind(&entry(r#"[0, 8, [2], [-1], "torch.float32"]"#)), ErrorKind::BadShape { .. }));
}

#[test]
fn rejects_rank_over_limit() {
    let dims = vec!["1"; RANK_MAX + 1].join(", ");
    let idx = entry(&format!(r#"[0, 4, [{dims}], [{dims}], "torch.float32"]"#));
    assert!(
        matches!(kind(&idx), ErrorKind::RankTooLarge { rank, limit } if rank == RANK_MAX + 1 && limit == RANK_MAX)
    );
}

#[test]
fn a_huge_shape_array_is_counted_not_built() {
    let dims = vec!["1"; 100_000].join(",");
    let idx = entry(&format!(r#"[0, 4, [{dims}], [1], "torch.float32"]"#));
    assert!(matches!(kind(&idx), ErrorKind::RankTooLarge { rank: 100_000, limit: RANK_MAX }));
    // Elements of any type, nested arrays and objects included, count one each.
    let idx = entry(&format!(r#"[0, 4, [1], [{dims},[1,[2]],{{"a":[3]}},"x",null], "torch.float32"]"#));
    assert!(matches!(kind(&idx), ErrorKind::RankTooLarge { rank: 100_004, limit: RANK_MAX }));
    // A long entry array is skipped past its sixth element without building anything.
    let idx = entry(&format!(r#"[0, 4, [1], [1], "f32", 0, {dims}]"#));
    assert!(matches!(kind(&idx), ErrorKind::BadSllmEntry { message } if message.contains("100006 elements")));
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
    /// Arrays of any length are counted, never built: a rank up to the limit parses, a longer one
    /// is `RankTooLarge` with the exact rank, for shape and stride alike.
    #[test]
    fn rank_is_counted_exactly(rank in 0usize..300, stride_side in proptest::bool::ANY) {
        let dims = vec!["1"; rank].join(",");
        let ok = vec!["1"; rank.min(RANK_MAX)].join(",");
        let (shape, stride) = if stride_side { (ok.clone(), dims) } else { (dims, ok.clone()) };
        let idx = entry(&format!(r#"[0, 4, [{shape}], [{stride}], "torch.float32"]"#));
        match parse_index(idx.as_bytes()) {
            Ok(parsed) => proptest::prop_assert!(rank <= RANK_MAX && parsed.entry(0).unwrap().shape.len() == rank),
            Err(ErrorKind::RankTooLarge { rank: got, limit }) => {
                proptest::prop_assert!(rank > RANK_MAX && got == rank && limit == RANK_MAX)
            }
            Err(other) => proptest::prop_assert!(false, "rank {rank}: {other:?}"),
        }
    }
}

#[test]
fn rejects_shape_stride_rank_mismatch() {
    let k = kind(&entry(r#"[0, 24, [2, 3], [3], "torch.float32"]"#));
    assert!(matches!(k, ErrorKind::StrideRankMismatch { shape_rank: 2, stride_rank: 1 }));
}

#[test]
fn rejects_highest_element_beyond_size() {
    // Contiguous [2, 3] f32 needs 24 bytes.
    let k = kind(&entry(r#"[0, 20, [2, 3], [3, 1], "torch.float32"]"#));
    assert!(matches!(k, ErrorKind::StrideOutOfBounds { needed_bytes: 24, size_bytes: 20 }));
    // Strided view: highest element index 3*1 + 2*5 = 13, so 14 elements (56 bytes) are needed.
    let k = kind(&entry(r#"[0, 48, [4, 3], [1, 5], "torch.float32"]"#));
    assert!(matches!(k, ErrorKind::StrideOutOfBounds { needed_bytes: 56, size_bytes: 48 }));
}

#[test]
fn accepts_non_contiguous_strides_inside_size() {
    let parsed = parse_index(entry(r#"[0, 48, [4, 3], [1, 4], "torch.float32"]"#).as_bytes()).unwrap();
    assert_eq!(parsed.entry(0).unwrap().strides, [1, 4]);
}

#[test]
fn rejects_extent_overflow() {
    let k = kind(&entry(r#"[0, 8, [4294967296, 4294967296, 2], [1, 1, 1], "torch.float32"]"#));
    assert!(matches!(k, ErrorKind::SizeOverflow));
}

#[test]
fn rejects_dense_bytes_beyond_size_with_broadcast_strides() {
    let k = kind(&entry(r#"[0, 4, [4], [0], "torch.float32"]"#));
    assert!(matches!(k, ErrorKind::SizeMismatch { expected_bytes: 16, actual_bytes: 4 }));
}

#[test]
fn rejects_unknown_dtypes() {
    let cases = [
        r#"[0, 8, [2], [1], "torch.float128"]"#,
        r#"[0, 8, [2], [1], "f32"]"#,
        r#"[0, 8, [2], [1], "torch.float32", 0]"#,
        r#"[0, 8, [2], [1], "F32", 0]"#,
        r#"[0, 8, [16], [1], "f4", 0]"#,
    ];
    for c in cases {
        assert!(matches!(kind(&entry(c)), ErrorKind::UnknownTorchDtype { .. }), "{c}");
    }
}

#[test]
fn maps_every_torch_dtype_both_ways() {
    for d in Dtype::ALL {
        if let Some(name) = dtype_to_torch(d) {
            assert_eq!(dtype_from_torch(name), Some(d));
        } else {
            assert!(d.size_bytes().is_none());
        }
    }
    assert_eq!(dtype_from_torch("torch.float8_e4m3fn"), Some(Dtype::F8E4M3));
    assert_eq!(dtype_from_short("bool"), Some(Dtype::Bool));
    assert_eq!(dtype_from_short("f8_e5m2"), Some(Dtype::F8E5M2));
}

#[test]
fn rejects_duplicate_names() {
    let idx = r#"{"t": [0, 8, [2], [1], "torch.float32"], "t": [8, 8, [2], [1], "torch.float32"]}"#;
    let err = parse_index_inner(idx.as_bytes()).unwrap_err();
    assert!(matches!(err.kind, ErrorKind::DuplicateTensor));
    assert_eq!(err.tensor.as_deref(), Some("t"));
}

#[test]
fn rejects_empty_name() {
    assert!(matches!(kind(r#"{"": [0, 8, [2], [1], "torch.float32"]}"#), ErrorKind::BadTensorName { .. }));
}

#[test]
fn rejects_mixed_layouts() {
    let idx = r#"{"a": [0, 8, [2], [1], "torch.float32"], "b": [8, 8, [2], [1], "f32", 0]}"#;
    assert!(matches!(kind(idx), ErrorKind::BadSllmEntry { .. }));
}

#[test]
fn rejects_overlap_but_accepts_exact_ties() {
    let overlap = r#"{"a": [0, 16, [4], [1], "torch.float32"], "b": [8, 16, [4], [1], "torch.float32"]}"#;
    let err = parse_index_inner(overlap.as_bytes()).unwrap_err();
    assert!(matches!(&err.kind, ErrorKind::SllmOverlap { other } if other == "a"));
    assert_eq!(err.tensor.as_deref(), Some("b"));
    // Same offset, different size: not a tie.
    let prefix = r#"{"a": [0, 16, [4], [1], "torch.float32"], "b": [0, 8, [2], [1], "torch.float32"]}"#;
    assert!(matches!(kind(prefix), ErrorKind::SllmOverlap { .. }));
    // A tie followed by an overlap with the tied pair is still caught.
    let later = r#"{"a": [0, 16, [4], [1], "torch.float32"], "b": [0, 16, [4], [1], "torch.float32"],
        "c": [12, 8, [2], [1], "torch.float32"]}"#;
    assert!(matches!(kind(later), ErrorKind::SllmOverlap { .. }));
    let tied = r#"{"a": [0, 16, [4], [1], "torch.float32"], "b": [0, 16, [4], [1], "torch.float32"],
        "z": [8, 0, [0], [1], "torch.float32"], "c": [16, 8, [2], [1], "torch.float32"]}"#;
    assert_eq!(parse_index(tied.as_bytes()).unwrap().len(), 4);
    // Legacy: the same local offsets in different partitions do not overlap.
    let legacy = r#"{"a": [0, 16, [4], [1], "f32", 0], "b": [0, 16, [4], [1], "f32", 1]}"#;
    assert!(parse_index(legacy.as_bytes()).is_ok());
}

// ---- directory-level rules ----

fn write_dir(index: &str, partitions: &[&[u8]]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join(INDEX_FILE_NAME), index).unwrap();
    for (i, p) in partitions.iter().enumerate() {
        fs::write(partition_path(dir.path(), i as u32), p).unwrap();
    }
    dir
}

fn open_kind(dir: &tempfile::TempDir) -> ErrorKind {
    open_dir(dir.path()).expect_err("directory must be refused").into_kind()
}

#[test]
fn open_maps_global_offsets_to_partitions() {
    let idx = r#"{"a": [0, 8, [2], [1], "torch.float32"], "b": [8, 6, [3], [1], "torch.float16"],
        "c": [16, 4, [], [], "torch.int32"], "tied": [8, 6, [3], [1], "torch.float16"]}"#;
    let dir = write_dir(idx, &[&[1u8; 16], &[2u8; 4]]);
    let ckpt = open_dir(dir.path()).unwrap();
    assert_eq!(ckpt.format(), Format::ServerlessLlm);
    assert_eq!(ckpt.files().len(), 2);
    let c = ckpt.tensor("c").unwrap();
    assert_eq!((c.file(), c.offset_bytes(), c.len_bytes()), (FileId(1), 0, 4));
    let b = ckpt.tensor("b").unwrap();
    let tied = ckpt.tensor("tied").unwrap();
    assert_eq!((b.file(), b.range()), (tied.file(), tied.range()));
    assert_eq!(b.strides(), Some(&[1u64][..]));
    assert!(ckpt.warnings().is_empty());
    assert!(ckpt.files().iter().all(|f| f.data_start_bytes() == 0));
}

#[test]
fn open_reads_legacy_layout_with_a_warning() {
    let idx = r#"{"a": [0, 8, [2], [1], "f32", 1], "b": [0, 16, [4], [1], "f32", 0]}"#;
    let dir = write_dir(idx, &[&[0u8; 16], &[0u8; 8]]);
    let ckpt = open_dir(dir.path()).unwrap();
    let a = ckpt.tensor("a").unwrap();
    assert_eq!((a.file(), a.offset_bytes()), (FileId(1), 0));
    assert_eq!(ckpt.warnings().len(), 1);
    // Sorted by (file, offset).
    assert_eq!(ckpt.tensors()[0].name(), "b");
}

#[test]
fn open_refuses_missing_partitions() {
    let dir = write_dir(r#"{"a": [0, 8, [2], [1], "torch.float32"]}"#, &[]);
    assert!(matches!(open_kind(&dir), ErrorKind::NoPartitions));
    // Partitions start at _0: a lone _1 is not found.
    fs::write(partition_path(dir.path(), 1), [0u8; 8]).unwrap();
    assert!(matches!(open_kind(&dir), ErrorKind::NoPartitions));
}

#[test]
fn open_refuses_a_tensor_outside_every_partition() {
    let beyond = write_dir(r#"{"a": [8, 16, [4], [1], "torch.float32"]}"#, &[&[0u8; 16]]);
    assert!(matches!(open_kind(&beyond), ErrorKind::OutsidePartition { offset: 8, end: 24 }));
    // Fits in the concatenation but spans two partitions.
    let spans = write_dir(r#"{"a": [8, 16, [4], [1], "torch.float32"]}"#, &[&[0u8; 16], &[0u8; 16]]);
    let err = open_dir(spans.path()).unwrap_err();
    assert_eq!(err.tensor(), Some("a"));
    assert!(matches!(err.kind(), ErrorKind::OutsidePartition { .. }));
    // Legacy: partition id that does not exist.
    let legacy = write_dir(r#"{"a": [0, 8, [2], [1], "f32", 1]}"#, &[&[0u8; 16]]);
    assert!(matches!(open_kind(&legacy), ErrorKind::OutsidePartition { .. }));
}

#[test]
fn outside_partition_names_the_partition_file() {
    let beyond = write_dir(r#"{"a": [8, 16, [4], [1], "torch.float32"]}"#, &[&[0u8; 16]]);
    assert_eq!(open_dir(beyond.path()).unwrap_err().path(), partition_path(beyond.path(), 0));
    // Starts in the second partition, runs past its end.
    let idx = r#"{"a": [0, 16, [4], [1], "torch.float32"], "b": [16, 16, [4], [1], "torch.float32"]}"#;
    let second = write_dir(idx, &[&[0u8; 16], &[0u8; 8]]);
    let err = open_dir(second.path()).unwrap_err();
    assert_eq!((err.path(), err.tensor()), (partition_path(second.path(), 1).as_path(), Some("b")));
    let legacy = write_dir(r#"{"a": [0, 8, [2], [1], "f32", 1]}"#, &[&[0u8; 16]]);
    assert_eq!(open_dir(legacy.path()).unwrap_err().path(), partition_path(legacy.path(), 1));
}

#[test]
fn partition_shortfalls_name_each_short_partition_with_its_needed_length() {
    let idx = r#"{"a": [0, 16, [4], [1], "torch.float32"], "b": [16, 8, [2], [1], "torch.float32"],
                  "c": [24, 8, [2], [1], "torch.float32"], "e": [32, 0, [0], [1], "torch.float32"]}"#;
    let whole = write_dir(idx, &[&[0u8; 16], &[0u8; 16]]);
    assert_eq!(partition_shortfalls(whole.path()).unwrap(), []);
    let short = write_dir(idx, &[&[0u8; 16], &[0u8; 5]]);
    assert_eq!(
        partition_shortfalls(short.path()).unwrap(),
        [PartitionShortfall {
            path: partition_path(short.path(), 1),
            expected_len_bytes: 16,
            actual_len_bytes: 5
        }]
    );
    let legacy = write_dir(
        r#"{"a": [0, 8, [2], [1], "f32", 0], "b": [0, 12, [3], [1], "f32", 1]}"#,
        &[&[0u8; 4], &[0u8; 12]],
    );
    let got = partition_shortfalls(legacy.path()).unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].expected_len_bytes, got[0].actual_len_bytes), (8, 4));
}

#[test]
fn open_accepts_an_empty_tensor_at_the_very_end() {
    let idx = r#"{"a": [0, 8, [2], [1], "torch.float32"], "e": [8, 0, [0, 4], [4, 1], "torch.float32"]}"#;
    let dir = write_dir(idx, &[&[0u8; 8]]);
    let ckpt = open_dir(dir.path()).unwrap();
    assert_eq!(ckpt.tensor("e").unwrap().range(), 8..8);
}

#[test]
fn open_refuses_an_index_over_the_cap_without_reading_it() {
    let dir = write_dir("{}", &[&[0u8; 8]]);
    let f = fs::OpenOptions::new().write(true).open(dir.path().join(INDEX_FILE_NAME)).unwrap();
    f.set_len(INDEX_LEN_BYTES_MAX + 1).unwrap(); // sparse: costs no disk
    let err = open_dir(dir.path()).unwrap_err();
    assert!(err.to_string().contains("over the limit"), "{err}");
    assert!(matches!(err.kind(), ErrorKind::IndexTooLarge { len_bytes, limit_bytes }
        if *len_bytes == INDEX_LEN_BYTES_MAX + 1 && *limit_bytes == INDEX_LEN_BYTES_MAX));
}

#[test]
fn open_names_the_tensor_in_parse_errors() {
    let dir = write_dir(r#"{"bad": [0, 8, [2], [1], "torch.float99"]}"#, &[&[0u8; 8]]);
    let err = open_dir(dir.path()).unwrap_err();
    assert_eq!(err.tensor(), Some("bad"));
    assert!(err.path().ends_with(INDEX_FILE_NAME));
    assert!(matches!(err.kind(), ErrorKind::UnknownTorchDtype { .. }));
}

#[test]
fn open_reports_a_missing_index_as_io() {
    let dir = tempfile::tempdir().unwrap();
    assert!(matches!(open_dir(dir.path()).unwrap_err().kind(), ErrorKind::Io(_)));
    assert!(!looks_like_sllm_dir(dir.path()));
}

#[test]
fn open_warns_when_a_partition_does_not_start_with_a_record() {
    // Partition 0 holds 16 bytes, so global offset 24 is byte 8 of partition 1, whose first 8
    // bytes no tensor uses.
    let idx = r#"{"a": [0, 8, [2], [1], "torch.float32"], "c": [24, 8, [2], [1], "torch.float32"]}"#;
    let dir = write_dir(idx, &[&[0u8; 16], &[0u8; 16]]);
    let ckpt = open_dir(dir.path()).unwrap();
    assert_eq!(ckpt.warnings().len(), 1);
    assert_eq!(ckpt.warnings()[0].path, partition_path(dir.path(), 1));
    assert!(ckpt.warnings()[0].message.contains("starts at byte 8"), "{:?}", ckpt.warnings());
}
