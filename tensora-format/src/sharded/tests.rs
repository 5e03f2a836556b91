use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;
use crate::write::{SafetensorsLayout, TensorSpec, write_safetensors};
use crate::{Dtype, ErrorKind};

fn write_shard(dir: &Path, file: &str, names: &[&str]) {
    let specs =
        names.iter().map(|n| TensorSpec { name: (*n).into(), dtype: Dtype::F32, shape: vec![2] }).collect();
    let layout = SafetensorsLayout::new(specs, BTreeMap::from([("format".into(), "pt".into())])).unwrap();
    write_safetensors(&dir.join(file), &layout, |_, out| out.write_all(&[7u8; 8])).unwrap();
}

fn write_index(dir: &Path, text: &str) {
    std::fs::write(dir.join("model.safetensors.index.json"), text).unwrap();
}

/// Two shards: a = {x, y}, b = {z}.
fn two_shards() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write_shard(dir.path(), "a.safetensors", &["x", "y"]);
    write_shard(dir.path(), "b.safetensors", &["z"]);
    dir
}

fn open_err(dir: &Path) -> ErrorKind {
    match crate::open(dir) {
        Ok(c) => panic!("expected an error, got {:?}", c.tensors()),
        Err(e) => e.into_kind(),
    }
}

const GOOD: &str = r#"{"metadata": {"total_size": 24, "extra": {"nested": [1, "two", null]}, "s": "v"},
  "weight_map": {"x": "a.safetensors", "y": "a.safetensors", "z": "b.safetensors"}}"#;

#[test]
fn index_opens_with_files_in_order_and_extra_metadata() {
    let dir = two_shards();
    write_index(dir.path(), GOOD);
    let ckpt = crate::open(dir.path()).unwrap();
    assert_eq!(ckpt.format(), crate::Format::SafetensorsSharded);
    assert_eq!(ckpt.files().len(), 2);
    assert!(ckpt.files()[0].path().ends_with("a.safetensors"));
    let names: Vec<&str> = ckpt.tensors().iter().map(|t| t.name()).collect();
    assert_eq!(names, ["x", "y", "z"]);
    assert_eq!(ckpt.tensor("z").unwrap().file(), crate::FileId(1));
    assert_eq!(ckpt.metadata()["extra"], r#"{"nested":[1,"two",null]}"#);
    assert_eq!(ckpt.metadata()["s"], "v");
    assert_eq!(ckpt.metadata()["format"], "pt");
    assert!(ckpt.warnings().is_empty());
    // Opening the index file directly is the same.
    let direct = crate::open(dir.path().join("model.safetensors.index.json")).unwrap();
    assert_eq!(direct.tensors(), ckpt.tensors());
}

#[test]
fn total_size_mismatch_is_a_warning() {
    let dir = two_shards();
    write_index(dir.path(), &GOOD.replace("24", "25"));
    let ckpt = crate::open(dir.path()).unwrap();
    assert_eq!(ckpt.warnings().len(), 1);
    assert!(ckpt.warnings()[0].message.contains("total_size"));
    write_index(dir.path(), &GOOD.replace("24", "\"24\""));
    assert_eq!(crate::open(dir.path()).unwrap().warnings().len(), 1);
}

#[test]
fn shard_names_must_be_plain() {
    for bad in ["../a.safetensors", "/abs/a.safetensors", "sub/a.safetensors", "..", ".", "", "a\\\\b"] {
        let index = GOOD.replace("\"b.safetensors\"", &format!("\"{bad}\""));
        let dir = two_shards();
        write_index(dir.path(), &index);
        assert!(matches!(open_err(dir.path()), ErrorKind::BadShardName { .. }), "{bad}");
    }
}

#[test]
fn missing_shard() {
    let dir = two_shards();
    write_index(dir.path(), &GOOD.replace("\"b.safetensors\"", "\"c.safetensors\""));
    assert!(matches!(open_err(dir.path()), ErrorKind::MissingShard { shard } if shard == "c.safetensors"));
}

#[test]
fn tensor_mapped_to_a_shard_that_lacks_it() {
    let dir = two_shards();
    write_index(
        dir.path(),
        &GOOD.replace(r#""y": "a.safetensors""#, r#""y": "a.safetensors", "w": "b.safetensors""#),
    );
    assert!(
        matches!(open_err(dir.path()), ErrorKind::TensorNotInShard { shard } if shard == "b.safetensors")
    );
    // Mapped to the wrong shard: the mapped one lacks it.
    let dir = two_shards();
    write_index(dir.path(), &GOOD.replace(r#""y": "a.safetensors""#, r#""y": "b.safetensors""#));
    assert!(matches!(open_err(dir.path()), ErrorKind::TensorNotInShard { .. }));
}

#[test]
fn tensor_in_a_shard_but_not_in_the_map() {
    let dir = two_shards();
    write_index(dir.path(), &GOOD.replace(r#""y": "a.safetensors", "#, ""));
    let e = crate::open(dir.path()).unwrap_err();
    assert_eq!(e.tensor(), Some("y"));
    assert!(matches!(e.into_kind(), ErrorKind::TensorNotInIndex { .. }));
}

#[test]
fn tensor_in_two_shards() {
    let dir = two_shards();
    write_shard(dir.path(), "b.safetensors", &["z", "x"]);
    write_index(dir.path(), GOOD);
    assert!(matches!(open_err(dir.path()), ErrorKind::TensorInTwoShards { .. }));
    // Without an index too.
    std::fs::remove_file(dir.path().join("model.safetensors.index.json")).unwrap();
    assert!(matches!(open_err(dir.path()), ErrorKind::TensorInTwoShards { .. }));
}

#[test]
fn directory_without_index() {
    let dir = two_shards();
    let ckpt = crate::open(dir.path()).unwrap();
    assert_eq!(ckpt.format(), crate::Format::SafetensorsSharded);
    assert_eq!(ckpt.tensors().len(), 3);
    let single = tempfile::tempdir().unwrap();
    write_shard(single.path(), "m.safetensors", &["x"]);
    assert_eq!(crate::open(single.path()).unwrap().format(), crate::Format::Safetensors);
    let empty = tempfile::tempdir().unwrap();
    assert!(matches!(open_err(empty.path()), ErrorKind::NotACheckpoint { .. }));
}

#[test]
fn several_indexes_are_ambiguous() {
    let dir = two_shards();
    write_index(dir.path(), GOOD);
    std::fs::write(dir.path().join("other.safetensors.index.json"), GOOD).unwrap();
    assert!(matches!(open_err(dir.path()), ErrorKind::NotACheckpoint { .. }));
}

#[test]
fn a_bad_shard_header_names_the_shard() {
    let dir = two_shards();
    std::fs::write(dir.path().join("b.safetensors"), [0u8; 4]).unwrap();
    write_index(dir.path(), GOOD);
    let e = crate::open(dir.path()).unwrap_err();
    assert!(e.path().ends_with("b.safetensors"));
    assert!(matches!(e.into_kind(), ErrorKind::FileTooShort { .. }));
}

#[test]
fn index_parse_errors() {
    let cases = [
        "",
        "[]",
        "{}",
        r#"{"weight_map": []}"#,
        r#"{"weight_map": {"x": 1}}"#,
        r#"{"weight_map": {"x": "a", "x": "a"}}"#,
        r#"{"weight_map": {}, "weight_map": {}}"#,
        r#"{"metadata": 3, "weight_map": {}}"#,
        r#"{"metadata": {"a": 1, "a": 2}, "weight_map": {}}"#,
        r#"{"metadata": {}, "metadata": {}, "weight_map": {}}"#,
        r#"{"weight_map": {},}"#,
        r#"{"weight_map": {}} x"#,
    ];
    for text in cases {
        assert!(matches!(parse_index(text.as_bytes()), Err(ErrorKind::BadIndex { .. })), "{text}");
    }
    assert!(matches!(parse_index(br#"{"weight_map": {"x": "../a"}}"#), Err(ErrorKind::BadShardName { .. })));
    let ok = parse_index(br#"{"metadata": null, "weight_map": {}, "other": [1]}"#).unwrap();
    assert!(ok.weight_map().is_empty() && ok.metadata().is_empty() && ok.total_size_bytes().is_none());
}

#[test]
fn oversized_index_is_rejected_without_reading_it_all() {
    let dir = two_shards();
    let f = std::fs::File::create(dir.path().join("model.safetensors.index.json")).unwrap();
    f.set_len(INDEX_BYTES_MAX + 1).unwrap();
    assert!(matches!(open_err(dir.path()), ErrorKind::IndexTooLarge { .. }));
}

#[test]
fn tape_to_json_handles_deep_and_mixed_values() {
    let deep = format!("{}{}", "[".repeat(5000), "]".repeat(5000));
    let text = format!(
        r#"{{"metadata": {{"d": {deep}, "m": {{"a": {{}}, "b": [[], {{"c": -1.5}}], "e": true}}}}, "weight_map": {{}}}}"#
    );
    let idx = parse_index(text.as_bytes()).unwrap();
    assert_eq!(idx.metadata()["d"], deep);
    assert_eq!(idx.metadata()["m"], r#"{"a":{},"b":[[],{"c":-1.5}],"e":true}"#);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn index_parser_never_panics(
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..6),
    ) {
        let mut bytes = GOOD.as_bytes().to_vec();
        for (at, b) in edits {
            let k = at.index(bytes.len());
            bytes[k] = b;
        }
        let _ = parse_index(&bytes);
    }

    #[test]
    fn flattened_metadata_is_valid_json(v in "[\\[\\]{}0-9,:\"a ]{0,40}") {
        let text = format!(r#"{{"metadata": {{"k": {v}}}, "weight_map": {{}}}}"#);
        if let Ok(idx) = parse_index(text.as_bytes()) {
            let flat = &idx.metadata()["k"];
            if !v.trim_start().starts_with('"') {
                let reparsed: serde_json::Value = serde_json::from_str(flat).unwrap();
                let original: serde_json::Value = serde_json::from_str(&v).unwrap();
                prop_assert_eq!(reparsed, original);
            }
        }
    }
}
