//! One test (at least) per header rule, plus property tests.

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

use super::chunks::speculative_segments;
use super::*;

/// A file image: `n`, the header text, then `data_len` data bytes.
fn image(json: &str, data_len: usize) -> Vec<u8> {
    let mut f = (json.len() as u64).to_le_bytes().to_vec();
    f.extend_from_slice(json.as_bytes());
    f.resize(f.len() + data_len, 0xAB);
    f
}

fn parse(json: &str, data_len: usize) -> Result<Header> {
    let f = image(json, data_len);
    parse_header(&f, f.len() as u64)
}

fn kind(json: &str, data_len: usize) -> ErrorKind {
    match parse(json, data_len) {
        Ok(h) => panic!("expected an error for {json:?}, got {h:?}"),
        Err(e) => e.into_kind(),
    }
}

const ONE: &str = r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;

fn entry(name: &str, dtype: &str, shape: &str, start: u64, end: u64) -> String {
    format!(r#""{name}":{{"dtype":"{dtype}","shape":{shape},"data_offsets":[{start},{end}]}}"#)
}

// ---- rule 1: length prefix ----

#[test]
fn rule1_file_shorter_than_8_bytes() {
    for len in 0..8usize {
        let bytes = vec![1u8; len];
        let e = parse_header(&bytes, len as u64).unwrap_err();
        assert!(matches!(e.kind(), ErrorKind::FileTooShort { len_bytes } if *len_bytes == len as u64));
    }
}

#[test]
fn rule1_header_len_zero() {
    let f = 0u64.to_le_bytes();
    assert!(matches!(parse_header(&f, 8).unwrap_err().kind(), ErrorKind::HeaderLenZero));
}

#[test]
fn rule1_header_len_over_limit_is_rejected_before_allocating() {
    for n in [HEADER_LEN_BYTES_MAX + 1, u64::MAX, u64::MAX - 7, 1 << 63] {
        let f = n.to_le_bytes();
        // The file claims to be huge, but only 8 bytes are present: nothing may be allocated.
        let e = parse_header(&f, u64::MAX).unwrap_err();
        assert!(
            matches!(e.kind(), ErrorKind::HeaderTooLarge { header_len_bytes, .. } if *header_len_bytes == n)
        );
    }
}

#[test]
fn rule1_header_beyond_file() {
    let mut f = image(ONE, 8);
    let file_len = f.len() as u64;
    f[..8].copy_from_slice(&(file_len - 7).to_le_bytes());
    let e = parse_header(&f, file_len).unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::HeaderBeyondFile { .. }));
    // Exactly at the limit is fine as far as rule 1 goes (then the JSON is judged).
    let n = HEADER_LEN_BYTES_MAX;
    let e = parse_header(&n.to_le_bytes(), n + 7).unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::HeaderBeyondFile { .. }));
}

#[test]
fn rule1_too_few_bytes_given() {
    let f = image(ONE, 8);
    let e = parse_header(&f[..20], f.len() as u64).unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::BytesTooShort { have_bytes: 20, .. }));
    assert_eq!(header_span_bytes(&f, f.len() as u64).unwrap(), 8 + ONE.len() as u64);
}

#[test]
fn read_header_reads_a_real_file_and_rejects_a_huge_claim() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("x.safetensors");
    std::fs::write(&p, image(ONE, 8)).unwrap();
    let h = read_header(&p).unwrap();
    assert_eq!(h.tensors().len(), 1);
    let mut huge = (u64::MAX - 3).to_le_bytes().to_vec();
    huge.extend_from_slice(b"{}");
    std::fs::write(&p, huge).unwrap();
    assert!(matches!(read_header(&p).unwrap_err().kind(), ErrorKind::HeaderTooLarge { .. }));
    std::fs::write(&p, [1u8, 2, 3]).unwrap();
    assert!(matches!(read_header(&p).unwrap_err().kind(), ErrorKind::FileTooShort { len_bytes: 3 }));
}

// ---- rule 2: one JSON object, UTF-8 ----

#[test]
fn rule2_invalid_utf8() {
    let mut f = image(r#"{"__metadata__":{"k":"vv"}}"#, 0);
    let pos = f.iter().position(|&b| b == b'v').unwrap();
    f[pos] = 0xFF;
    let e = parse_header(&f, f.len() as u64).unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::HeaderNotUtf8 { .. }), "{e}");
}

#[test]
fn rule2_whitespace_around_is_allowed() {
    let json = format!(" \t\r\n{ONE}\n \t\r");
    assert_eq!(parse(&json, 8).unwrap().tensors().len(), 1);
    // HF pads with spaces.
    assert_eq!(parse(&format!("{ONE}        "), 8).unwrap().tensors().len(), 1);
}

#[test]
fn rule2_not_an_object() {
    for json in ["[]", "\"x\"", "1", "null", "true"] {
        assert!(matches!(kind(json, 0), ErrorKind::HeaderNotObject { .. }), "{json}");
    }
    assert!(matches!(kind("   ", 0), ErrorKind::HeaderNotJson { .. }));
}

#[test]
fn rule2_nul_padding_is_rejected() {
    let json = format!("{ONE}\0\0\0");
    assert!(matches!(kind(&json, 8), ErrorKind::TrailingBytes { .. }));
    let json = format!("\0{ONE}");
    assert!(matches!(kind(&json, 8), ErrorKind::HeaderNotObject { .. }));
}

#[test]
fn rule2_bom_is_rejected() {
    let json = format!("\u{feff}{ONE}");
    assert!(matches!(kind(&json, 8), ErrorKind::HeaderNotObject { .. }));
}

#[test]
fn rule2_comments_are_rejected() {
    assert!(matches!(kind(&format!("/* c */{ONE}"), 8), ErrorKind::HeaderNotObject { .. }));
    assert!(matches!(kind(&format!("{ONE}// c"), 8), ErrorKind::TrailingBytes { .. }));
    let inside = r#"{"w":{"dtype":"F32", /* c */ "shape":[2],"data_offsets":[0,8]}}"#;
    assert!(matches!(kind(inside, 8), ErrorKind::HeaderNotJson { .. }));
}

#[test]
fn rule2_nan_and_infinity_are_rejected() {
    for v in ["NaN", "Infinity", "-Infinity", "nan"] {
        let json = format!(r#"{{"w":{{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":{v}}}}}"#);
        assert!(matches!(kind(&json, 8), ErrorKind::HeaderNotJson { .. }), "{v}");
    }
}

#[test]
fn rule2_trailing_commas_are_rejected() {
    let top = r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},}"#;
    let inner = r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8],}}"#;
    let arr = r#"{"w":{"dtype":"F32","shape":[2,],"data_offsets":[0,8]}}"#;
    for json in [top, inner, arr, "{,}", r#"{"__metadata__":null,,"x":1}"#] {
        assert!(matches!(kind(json, 8), ErrorKind::HeaderNotJson { .. }), "{json}");
    }
}

#[test]
fn rule2_second_value_is_rejected() {
    assert!(matches!(kind(&format!("{ONE}{{}}"), 8), ErrorKind::TrailingBytes { .. }));
    assert!(matches!(kind(&format!("{ONE} 1"), 8), ErrorKind::TrailingBytes { .. }));
    assert!(matches!(kind("{}}", 0), ErrorKind::TrailingBytes { .. }));
}

#[test]
fn rule2_unterminated_or_mismatched() {
    assert!(matches!(kind(r#"{"w":{"dtype":"F32""#, 0), ErrorKind::HeaderNotJson { .. }));
    assert!(matches!(kind(r#"{"a":[1]]"#, 0), ErrorKind::HeaderNotJson { .. }));
    assert!(matches!(kind(r#"{"a":"x\"}"#, 0), ErrorKind::HeaderNotJson { .. }));
}

// ---- rule 3: __metadata__ ----

#[test]
fn rule3_metadata_optional_null_or_strings() {
    assert_eq!(parse("{}", 0).unwrap().metadata(), None);
    assert_eq!(parse(r#"{"__metadata__":null}"#, 0).unwrap().metadata(), None);
    let h = parse(r#"{"__metadata__":{"format":"pt","a\"b":"c\u00e9"}}"#, 0).unwrap();
    let m = h.metadata().unwrap();
    assert_eq!(m["format"], "pt");
    assert_eq!(m["a\"b"], "c\u{e9}");
}

#[test]
fn rule3_metadata_values_must_be_strings() {
    for v in [r#"{"a":1}"#, r#"{"a":null}"#, r#"{"a":["x"]}"#, r#"{"a":{"b":"c"}}"#, "[]", "\"x\"", "1"] {
        let json = format!(r#"{{"__metadata__":{v}}}"#);
        assert!(matches!(kind(&json, 0), ErrorKind::BadMetadata { .. }), "{v}");
    }
}

#[test]
fn rule3_duplicate_metadata_keys_after_unescaping() {
    let plain = r#"{"__metadata__":{"a":"1","a":"1"}}"#;
    let escaped = r#"{"__metadata__":{"a":"1","\u0061":"2"}}"#;
    for json in [plain, escaped] {
        assert!(matches!(kind(json, 0), ErrorKind::DuplicateMetadataKey { key } if key == "a"), "{json}");
    }
    let twice = r#"{"__metadata__":{"a":"1"},"__metadata__":null}"#;
    assert!(matches!(kind(twice, 0), ErrorKind::BadMetadata { .. }));
}

// ---- rule 4: tensor names and entries ----

#[test]
fn rule4_tensor_names() {
    let empty = format!("{{{}}}", entry("", "F32", "[2]", 0, 8));
    assert!(matches!(kind(&empty, 8), ErrorKind::BadTensorName { .. }));
    for name in [r"a\u0000b", r"a\nb", r"\u007f", r"x\u0085", r"\t"] {
        let json = format!("{{{}}}", entry(name, "F32", "[2]", 0, 8));
        assert!(matches!(kind(&json, 8), ErrorKind::BadTensorName { .. }), "{name}");
    }
    // Unicode and escaped quotes are fine.
    let json = format!("{{{}}}", entry(r#"é.\"q\"/ü"#, "F32", "[2]", 0, 8));
    assert_eq!(parse(&json, 8).unwrap().tensor(0).unwrap().name(), "é.\"q\"/ü");
}

#[test]
fn rule4_error_names_the_tensor_and_file() {
    let json = format!("{{{}}}", entry("layer.0", "X9", "[2]", 0, 8));
    let f = image(&json, 8);
    let e = parse_header_with_path(&f, f.len() as u64, Path::new("/m/a.safetensors")).unwrap_err();
    assert_eq!(e.tensor(), Some("layer.0"));
    assert_eq!(e.path(), Path::new("/m/a.safetensors"));
    let shown = e.to_string();
    assert!(shown.contains("/m/a.safetensors") && shown.contains("layer.0"), "{shown}");
}

#[test]
fn rule4_entry_must_be_an_object() {
    for v in [r#"["F32",[2],[0,8]]"#, "null", "\"F32\"", "3"] {
        let json = format!(r#"{{"w":{v}}}"#);
        assert!(matches!(kind(&json, 8), ErrorKind::BadTensorEntry { .. }), "{v}");
    }
    let map_dtype = r#"{"w":{"dtype":{"F32":true},"shape":[2],"data_offsets":[0,8]}}"#;
    assert!(matches!(kind(map_dtype, 8), ErrorKind::BadTensorEntry { .. }));
}

#[test]
fn rule4_missing_and_duplicate_fields() {
    let missing = [
        (r#"{"w":{"shape":[2],"data_offsets":[0,8]}}"#, "dtype"),
        (r#"{"w":{"dtype":"F32","data_offsets":[0,8]}}"#, "shape"),
        (r#"{"w":{"dtype":"F32","shape":[2]}}"#, "data_offsets"),
    ];
    for (json, f) in missing {
        assert!(matches!(kind(json, 8), ErrorKind::MissingField { field } if field == f), "{json}");
    }
    let dups = [
        (r#"{"w":{"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#, "dtype"),
        (r#"{"w":{"dtype":"F32","shape":[2],"shape":[2],"data_offsets":[0,8]}}"#, "shape"),
        (r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"data_offsets":[0,8]}}"#, "data_offsets"),
        (r#"{"w":{"dtype":"F32","\u0064type":"F32","shape":[2],"data_offsets":[0,8]}}"#, "dtype"),
    ];
    for (json, f) in dups {
        assert!(matches!(kind(json, 8), ErrorKind::DuplicateField { field } if field == f), "{json}");
    }
}

#[test]
fn rule4_unknown_fields_are_ignored() {
    let json = r#"{"w":{"x":{"a":[1,{"b":null}],"c":-1.5e3},"dtype":"F32","y":"F16","shape":[2],"data_offsets":[0,8],"z":[]}}"#;
    let h = parse(json, 8).unwrap();
    assert_eq!(h.tensor(0).unwrap().dtype(), Dtype::F32);
}

#[test]
fn rule4_deeply_nested_unknown_field_does_not_overflow_the_stack() {
    const DEPTH: usize = 10_000;
    for (open, close) in [("[", "]"), ("{\"k\":", "}")] {
        let nested = format!("{}1{}", open.repeat(DEPTH), close.repeat(DEPTH));
        let json = format!(r#"{{"w":{{"dtype":"F32","shape":[2],"data_offsets":[0,8],"extra":{nested}}}}}"#);
        let h = parse(&json, 8).unwrap();
        assert_eq!(h.tensors().len(), 1);
    }
    // Deep nesting in a top-level value that is not a tensor entry is still an error, not a crash.
    let json = format!(r#"{{"w":{}1{}}}"#, "[".repeat(DEPTH), "]".repeat(DEPTH));
    assert!(matches!(kind(&json, 0), ErrorKind::BadTensorEntry { .. }));
}

// ---- rule 5: duplicate tensor names ----

#[test]
fn rule5_duplicate_tensor_names_even_if_identical() {
    let e = entry("w", "F32", "[2]", 0, 8);
    let json = format!("{{{e},{e}}}");
    assert!(matches!(kind(&json, 8), ErrorKind::DuplicateTensor));
    let escaped = format!("{{{e},{}}}", entry(r"\u0077", "F32", "[2]", 8, 16));
    assert!(matches!(kind(&escaped, 16), ErrorKind::DuplicateTensor));
}

#[test]
fn rule5_duplicates_are_found_across_parse_chunks() {
    let count = 3 * CHUNK_BYTES_TARGET / 40;
    let mut parts: Vec<String> =
        (0..count).map(|i| entry(&format!("t{i}"), "U8", "[1]", i as u64, i as u64 + 1)).collect();
    let json = format!("{{{}}}", parts.join(","));
    assert!(json.len() > 2 * CHUNK_BYTES_TARGET);
    let h = parse(&json, count).unwrap();
    assert_eq!(h.tensors().len(), count);
    assert_eq!(h.tensor(count - 1).unwrap().name(), format!("t{}", count - 1));
    parts.push(entry("t0", "U8", "[1]", count as u64, count as u64 + 1));
    let json = format!("{{{}}}", parts.join(","));
    let e = parse(&json, count + 1).unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::DuplicateTensor));
    assert_eq!(e.tensor(), Some("t0"));
}

#[test]
fn chunk_boundaries_do_not_hide_errors() {
    let count = 3 * CHUNK_BYTES_TARGET / 40;
    let parts: Vec<String> =
        (0..count).map(|i| entry(&format!("t{i}"), "U8", "[1]", i as u64, i as u64 + 1)).collect();
    // An empty member in the middle (",,") is invalid wherever the split falls.
    for at in [1, count / 3, count / 2, count - 1] {
        let mut p = parts.clone();
        p.insert(at, String::new());
        let json = format!("{{{}}}", p.join(","));
        assert!(matches!(kind(&json, count), ErrorKind::HeaderNotJson { .. }), "at {at}");
    }
}

// ---- rule 6: dtypes ----

#[test]
fn rule6_every_dtype_is_accepted() {
    for d in Dtype::ALL {
        // 8 elements is a whole number of bytes for every dtype.
        let nbytes = d.bytes_for(8).unwrap();
        let json = format!("{{{}}}", entry("t", d.as_str(), "[8]", 0, nbytes));
        let h = parse(&json, nbytes as usize).unwrap();
        assert_eq!(h.tensor(0).unwrap().dtype(), d);
    }
}

#[test]
fn rule6_unknown_or_wrong_case_dtype() {
    for d in ["f32", "F8_E4M3FN", "float32", "", "BF16 ", "Bool", "F6"] {
        let json = format!("{{{}}}", entry("t", d, "[2]", 0, 8));
        assert!(matches!(kind(&json, 8), ErrorKind::UnknownDtype { .. }), "{d}");
    }
}

#[test]
fn rule6_sub_byte_totals_must_be_whole_bytes() {
    let odd_f4 = format!("{{{}}}", entry("t", "F4", "[3]", 0, 2));
    assert!(matches!(kind(&odd_f4, 2), ErrorKind::PartialByte { numel: 3, .. }));
    let f6 = format!("{{{}}}", entry("t", "F6_E2M3", "[5]", 0, 4));
    assert!(matches!(kind(&f6, 4), ErrorKind::PartialByte { numel: 5, .. }));
    let ok = format!("{{{}}}", entry("t", "F6_E3M2", "[2,2]", 0, 3));
    assert_eq!(parse(&ok, 3).unwrap().tensor(0).unwrap().nbytes(), 3);
}

// ---- rule 7: shape and data_offsets are plain non-negative integers ----

#[test]
fn rule7_shape_values() {
    for s in [
        "[-1]", "[-0]", "[1.0]", "[1e2]", "[2E0]", "[\"2\"]", "[true]", "[null]", "[[2]]", "{}", "2", "\"2\"",
    ] {
        let json = format!("{{{}}}", entry("t", "U8", s, 0, 2));
        assert!(matches!(kind(&json, 2), ErrorKind::BadShape { .. }), "{s}");
    }
    for s in ["[+2]", "[02]", "[0x2]"] {
        let json = format!("{{{}}}", entry("t", "U8", s, 0, 2));
        assert!(matches!(kind(&json, 2), ErrorKind::HeaderNotJson { .. }), "{s}");
    }
}

#[test]
fn rule7_rank_limit() {
    let ok = format!("[{}]", vec!["1"; 64].join(","));
    assert_eq!(
        parse(&format!("{{{}}}", entry("t", "U8", &ok, 0, 1)), 1).unwrap().tensor(0).unwrap().shape().len(),
        64
    );
    let too_deep = format!("[{}]", vec!["1"; 65].join(","));
    let json = format!("{{{}}}", entry("t", "U8", &too_deep, 0, 1));
    assert!(matches!(kind(&json, 1), ErrorKind::RankTooLarge { rank: 65, limit: 64 }));
}

#[test]
fn rule7_integers_must_fit_u64() {
    let max = format!("{{{}}}", entry("t", "U8", &format!("[{}]", u64::MAX), 0, 1));
    assert!(matches!(kind(&max, 1), ErrorKind::SizeOverflow));
    let max_offsets = format!("{{{}}}", entry("t", "U8", "[0]", u64::MAX, u64::MAX));
    assert!(matches!(kind(&max_offsets, 0), ErrorKind::DataHole { start: u64::MAX, expected: 0 }));
    let over = format!("{{{}}}", entry("t", "U8", "[18446744073709551616]", 0, 1));
    assert!(matches!(kind(&over, 1), ErrorKind::IntegerOutOfRange { .. }), "{:?}", kind(&over, 1));
    let off = r#"{"t":{"dtype":"U8","shape":[1],"data_offsets":[0,99999999999999999999999]}}"#;
    assert!(matches!(kind(off, 1), ErrorKind::IntegerOutOfRange { .. }));
}

#[test]
fn rule7_data_offsets_shape() {
    let cases = [
        r#"{"t":{"dtype":"U8","shape":[1],"data_offsets":[0]}}"#,
        r#"{"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1,1]}}"#,
        r#"{"t":{"dtype":"U8","shape":[1],"data_offsets":[-0,1]}}"#,
        r#"{"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1.0]}}"#,
        r#"{"t":{"dtype":"U8","shape":[1],"data_offsets":[0,"1"]}}"#,
        r#"{"t":{"dtype":"U8","shape":[1],"data_offsets":[[0],[1]]}}"#,
        r#"{"t":{"dtype":"U8","shape":[1],"data_offsets":{"start":0,"end":1}}}"#,
        r#"{"t":{"dtype":"U8","shape":[0],"data_offsets":[1,0]}}"#,
    ];
    for json in cases {
        assert!(matches!(kind(json, 1), ErrorKind::BadOffsets { .. }), "{json}");
    }
}

// ---- rule 8: size agrees with dtype and shape ----

#[test]
fn rule8_size_mismatch_and_overflow() {
    let short = format!("{{{}}}", entry("t", "F32", "[3]", 0, 8));
    assert!(matches!(kind(&short, 8), ErrorKind::SizeMismatch { expected_bytes: 12, actual_bytes: 8 }));
    let overflow = format!("{{{}}}", entry("t", "F32", "[4294967296,4294967296]", 0, 8));
    assert!(matches!(kind(&overflow, 8), ErrorKind::SizeOverflow));
    let bits_overflow = format!("{{{}}}", entry("t", "F64", "[4611686018427387904]", 0, 8));
    assert!(matches!(kind(&bits_overflow, 8), ErrorKind::SizeOverflow));
}

#[test]
fn rule8_scalar_and_zero_dims() {
    let json = format!(
        "{{{},{},{}}}",
        entry("s", "F64", "[]", 0, 8),
        entry("z", "F32", "[0,7]", 8, 8),
        entry("z2", "BF16", "[3,0]", 8, 8)
    );
    let h = parse(&json, 8).unwrap();
    assert_eq!(h.tensors().len(), 3);
    assert_eq!(h.tensor(0).unwrap().shape(), &[] as &[u64]);
    // A zero dimension with a non-empty range is a mismatch.
    let bad = format!("{{{}}}", entry("z", "F32", "[0]", 0, 4));
    assert!(matches!(kind(&bad, 4), ErrorKind::SizeMismatch { expected_bytes: 0, actual_bytes: 4 }));
}

// ---- rule 9: tiling ----

#[test]
fn rule9_tiling() {
    let hole_at_start = format!("{{{}}}", entry("a", "U8", "[4]", 4, 8));
    assert!(matches!(kind(&hole_at_start, 8), ErrorKind::DataHole { start: 4, expected: 0 }));
    let gap = format!("{{{},{}}}", entry("a", "U8", "[4]", 0, 4), entry("b", "U8", "[2]", 6, 8));
    assert!(matches!(kind(&gap, 8), ErrorKind::DataHole { start: 6, expected: 4 }));
    let overlap = format!("{{{},{}}}", entry("a", "U8", "[4]", 0, 4), entry("b", "U8", "[4]", 2, 6));
    assert!(matches!(kind(&overlap, 6), ErrorKind::DataOverlap { start: 2, previous_end: 4 }));
    let trailing = format!("{{{}}}", entry("a", "U8", "[4]", 0, 4));
    assert!(matches!(kind(&trailing, 5), ErrorKind::DataLenMismatch { end: 4, data_len_bytes: 5 }));
    let beyond = format!("{{{}}}", entry("a", "U8", "[4]", 0, 4));
    assert!(matches!(kind(&beyond, 3), ErrorKind::DataLenMismatch { end: 4, data_len_bytes: 3 }));
    assert!(matches!(kind("{}", 1), ErrorKind::DataLenMismatch { end: 0, data_len_bytes: 1 }));
    let inside = format!("{{{},{}}}", entry("a", "U8", "[4]", 0, 4), entry("z", "U8", "[0]", 2, 2));
    assert!(matches!(kind(&inside, 4), ErrorKind::DataOverlap { start: 2, .. }));
}

#[test]
fn rule9_zero_sized_tensors_anywhere_consistent_and_sorted_by_offset() {
    let json = format!(
        "{{{},{},{},{},{}}}",
        entry("b", "U8", "[4]", 4, 8),
        entry("end", "U8", "[0]", 8, 8),
        entry("a", "U8", "[4]", 0, 4),
        entry("mid", "U8", "[0]", 4, 4),
        entry("start", "U8", "[0]", 0, 0)
    );
    let h = parse(&json, 8).unwrap();
    let names: Vec<&str> = h.tensors().map(|t| t.name()).collect();
    assert_eq!(names, ["start", "a", "mid", "b", "end"]);
    assert_eq!(parse("{}", 0).unwrap().tensors().len(), 0);
}

// ---- rule 10: misalignment and BOOL ----

#[test]
fn rule10_misaligned_data_and_bool_bytes_are_valid() {
    // n = 61: the data section starts at 69, aligned to nothing.
    let json = format!("{{{}}}", entry("b", "BOOL", "[3]", 0, 3));
    let json = format!("{json}{}", " ".repeat(61 - json.len()));
    let mut f = image(&json, 0);
    f.extend_from_slice(&[0x02, 0xFF, 0x7F]);
    let h = parse_header(&f, f.len() as u64).unwrap();
    assert_eq!(h.data_start_bytes(), 69);
    assert_eq!(h.tensor(0).unwrap().dtype(), Dtype::Bool);
}

// ---- properties ----

/// The kinds a header parse can fail with: the rules of the format, never I/O or an index rule.
fn is_header_rule(kind: &ErrorKind) -> bool {
    use ErrorKind as K;
    matches!(
        kind,
        K::FileTooShort { .. }
            | K::HeaderLenZero
            | K::HeaderTooLarge { .. }
            | K::HeaderBeyondFile { .. }
            | K::BytesTooShort { .. }
            | K::HeaderNotUtf8 { .. }
            | K::HeaderNotJson { .. }
            | K::HeaderNotObject { .. }
            | K::TrailingBytes { .. }
            | K::BadMetadata { .. }
            | K::DuplicateMetadataKey { .. }
            | K::IntegerOutOfRange { .. }
            | K::DataLenMismatch { .. }
    ) || names_a_tensor(kind)
}

/// The kinds about one tensor entry: the error must name the tensor.
fn names_a_tensor(kind: &ErrorKind) -> bool {
    use ErrorKind as K;
    matches!(
        kind,
        K::BadTensorName { .. }
            | K::DuplicateTensor
            | K::BadTensorEntry { .. }
            | K::MissingField { .. }
            | K::DuplicateField { .. }
            | K::UnknownDtype { .. }
            | K::BadShape { .. }
            | K::RankTooLarge { .. }
            | K::BadOffsets { .. }
            | K::SizeOverflow
            | K::PartialByte { .. }
            | K::SizeMismatch { .. }
            | K::DataHole { .. }
            | K::DataOverlap { .. }
    )
}

/// The kinds that say "this is not one strict JSON object" (or that the prefix is wrong).
fn is_json_or_prefix_rule(kind: &ErrorKind) -> bool {
    use ErrorKind as K;
    matches!(
        kind,
        K::HeaderLenZero
            | K::HeaderNotUtf8 { .. }
            | K::HeaderNotJson { .. }
            | K::HeaderNotObject { .. }
            | K::TrailingBytes { .. }
            | K::IntegerOutOfRange { .. }
    )
}

/// What every result of [`parse_header`] over `bytes` (a file image of `file_len_bytes`) must
/// satisfy. An `Ok` header is what an independent JSON reader (serde_json) finds in the same
/// header text, entry for entry, and its tensors tile the data section; an `Err` is one of the
/// header rules' kinds, names the tensor when the rule is about one, and is a JSON-level kind
/// whenever serde_json refuses the text (for headers of one parse chunk, where the JSON is
/// validated before any entry).
pub(crate) fn check_parse_result(
    bytes: &[u8],
    file_len_bytes: u64,
    result: &Result<Header>,
) -> std::result::Result<(), TestCaseError> {
    let json = bytes.get(..8).and_then(|prefix| {
        let n = u64::from_le_bytes(prefix.try_into().ok()?);
        bytes.get(8..usize::try_from(n.checked_add(8)?).ok()?)
    });
    match result {
        Ok(header) => {
            let Some(json) = json else {
                return Err(TestCaseError::fail("a header was accepted without its bytes"));
            };
            check_accepted(json, file_len_bytes, header)
        }
        Err(e) => {
            prop_assert_eq!(e.path(), Path::new(MEMORY_PATH));
            prop_assert!(is_header_rule(e.kind()), "not a header rule: {:?}", e.kind());
            if names_a_tensor(e.kind()) {
                prop_assert!(e.tensor().is_some(), "{} names no tensor", e);
            }
            if let Some(json) = json
                && json.len() < CHUNK_BYTES_TARGET
                && serde_json::from_slice::<serde::de::IgnoredAny>(json).is_err()
            {
                prop_assert!(is_json_or_prefix_rule(e.kind()), "invalid JSON refused as {:?}", e.kind());
            }
            Ok(())
        }
    }
}

fn check_accepted(json: &[u8], file_len_bytes: u64, h: &Header) -> std::result::Result<(), TestCaseError> {
    prop_assert_eq!(h.header_len_bytes(), json.len() as u64);
    prop_assert_eq!(h.file_len_bytes(), file_len_bytes);
    let value: serde_json::Value = match serde_json::from_slice(json) {
        Ok(v) => v,
        Err(e) => return Err(TestCaseError::fail(format!("accepted, but serde_json refuses it: {e}"))),
    };
    let Some(object) = value.as_object() else {
        return Err(TestCaseError::fail("accepted a header that is not an object"));
    };
    let metadata = object.get(METADATA_KEY).filter(|m| !m.is_null());
    let expected_metadata: Option<BTreeMap<String, String>> = metadata.map(|m| {
        m.as_object()
            .map(|m| m.iter().map(|(k, v)| (k.clone(), v.as_str().unwrap_or("<not a string>").to_owned())))
            .into_iter()
            .flatten()
            .collect()
    });
    prop_assert_eq!(h.metadata(), expected_metadata.as_ref());
    prop_assert_eq!(h.len(), object.len() - usize::from(object.contains_key(METADATA_KEY)));
    let mut end = 0u64;
    for t in h.tensors() {
        let entry = &object[t.name()];
        prop_assert_eq!(entry["dtype"].as_str(), Some(t.dtype().as_str()));
        let shape: Vec<u64> = t.shape().to_vec();
        prop_assert_eq!(
            entry["shape"].as_array().map(|a| a.iter().filter_map(|d| d.as_u64()).collect()),
            Some(shape)
        );
        let (start, stop) = t.data_offsets();
        prop_assert_eq!(&entry["data_offsets"], &serde_json::json!([start, stop]));
        prop_assert_eq!(start, end, "tensors do not tile the data section");
        prop_assert_eq!(t.dtype().bytes_for(t.shape().iter().product()), Some(t.nbytes()));
        prop_assert!(!t.name().is_empty() && !has_control(t.name()));
        end = stop;
    }
    prop_assert_eq!(end, h.data_len_bytes());
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Random edits of a valid file: every result satisfies [`check_parse_result`], and edits that
    /// only touch the data section change nothing (the parser never reads tensor data).
    #[test]
    fn random_mutations_give_checked_results(
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        truncate in proptest::option::of(any::<prop::sample::Index>()),
    ) {
        let json = format!(
            r#"{{"__metadata__":{{"k":"v"}},{},{},{}}}"#,
            entry("a.w", "F32", "[2,2]", 0, 16),
            entry("b", "F4", "[4]", 16, 18),
            entry("c", "BOOL", "[]", 18, 19)
        );
        let original = image(&json, 19);
        let data_start = original.len() - 19;
        let mut f = original.clone();
        for (at, byte) in &edits {
            let i = at.index(f.len());
            f[i] = *byte;
        }
        let len = match truncate {
            Some(at) => at.index(f.len() + 1),
            None => f.len(),
        };
        check_parse_result(&f[..len], len as u64, &parse_header(&f[..len], len as u64))?;
        let longer = parse_header(&f, f.len() as u64 + 3);
        check_parse_result(&f, f.len() as u64 + 3, &longer)?;
        let whole = parse_header(&f, f.len() as u64);
        check_parse_result(&f, f.len() as u64, &whole)?;
        if edits.iter().all(|(at, _)| at.index(f.len()) >= data_start) {
            let expected = parse_header(&original, original.len() as u64).unwrap();
            prop_assert_eq!(whole.unwrap(), expected);
        }
    }

    #[test]
    fn random_json_like_text_gives_checked_results(s in "[{}\\[\\]\",:0-9a-z\\\\ \\-.eE]{0,200}") {
        let f = image(&s, 0);
        check_parse_result(&f, f.len() as u64, &parse_header(&f, f.len() as u64))?;
        let inner = format!("{{\"t\":{{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"x\":{s}}}}}");
        let f = image(&inner, 1);
        let result = parse_header(&f, f.len() as u64);
        check_parse_result(&f, f.len() as u64, &result)?;
        // The unknown field "x" is skipped whatever it holds: valid JSON there means the entry is
        // accepted (serde_json reads integers past u64 as floats; rule 7 refuses them).
        let big_integer = s.as_bytes().windows(20).any(|w| w.iter().all(u8::is_ascii_digit));
        if !big_integer && serde_json::from_str::<serde_json::Value>(&s).is_ok() {
            prop_assert!(result.is_ok(), "{:?}", result);
        }
    }
}

/// Names that contain the `},"` split marker, placed so that the fast path splits inside a
/// string: the exact path must take over and accept the header.
#[test]
fn split_guesses_inside_strings_fall_back_to_the_exact_scan() {
    let count = 3 * CHUNK_BYTES_TARGET / 40;
    let parts: Vec<String> =
        (0..count).map(|i| entry(&format!("t{i}}},"), "U8", "[1]", i as u64, i as u64 + 1)).collect();
    let json = format!("{{{}}}", parts.join(","));
    let h = parse(&json, count).unwrap();
    assert_eq!(h.tensors().len(), count);
    assert_eq!(h.tensor(5).unwrap().name(), "t5},");
    assert!(speculative_segments(json.as_bytes(), 0).unwrap().len() > 1, "the fast path did split");
    // And an unknown field whose nested objects end in `},"` at depth > 1.
    let parts: Vec<String> = (0..count)
        .map(|i| {
            format!(
                r#""t{i}":{{"x":{{"a":{{}},"b":1}},"dtype":"U8","shape":[1],"data_offsets":[{i},{}]}}"#,
                i + 1
            )
        })
        .collect();
    let h = parse(&format!("{{{}}}", parts.join(",")), count).unwrap();
    assert_eq!(h.tensors().len(), count);
}

/// The fast path and the exact path report the same error for a bad header.
#[test]
fn errors_are_the_same_whichever_path_finds_them() {
    let count = 3 * CHUNK_BYTES_TARGET / 40;
    let mut parts: Vec<String> =
        (0..count).map(|i| entry(&format!("t{i}"), "U8", "[1]", i as u64, i as u64 + 1)).collect();
    parts[count - 3] = entry("bad", "U8", "[-1]", (count - 3) as u64, (count - 2) as u64);
    let json = format!("{{{}}}", parts.join(","));
    let e = parse(&json, count).unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::BadShape { .. }));
    assert_eq!(e.tensor(), Some("bad"));
    // A trailing second value after a header that ends in '}' is still TrailingBytes.
    let json = format!("{{{}}}{{}}", parts[..10].join(","));
    assert!(matches!(kind(&json, 10), ErrorKind::TrailingBytes { .. }));
}

proptest! {
    /// The word-at-a-time control check agrees with the char-wise definition.
    #[test]
    fn has_control_is_any_control_char(s in "[a-z.\u{0}-\u{1f}\u{7f}\u{80}-\u{9f}é😀]{0,40}") {
        prop_assert_eq!(has_control(&s), s.chars().any(char::is_control));
    }
}

mod parts;
