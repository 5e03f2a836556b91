use std::collections::BTreeMap;

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

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
    // A control character in the text (a terminal escape) is shown escaped.
    write_index(dir.path(), &GOOD.replace("24", r#""\u001b]0;x\u0007\n""#));
    let ckpt = crate::open(dir.path()).unwrap();
    let message = &ckpt.warnings()[0].message;
    assert!(!message.chars().any(char::is_control), "{message:?}");
    assert!(message.contains(r"total_size \u{1b}]0;x\u{7}\n is not"), "{message:?}");
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
        assert!(matches!(parse_index(text.as_bytes().to_vec()), Err(ErrorKind::BadIndex { .. })), "{text}");
    }
    assert!(matches!(
        parse_index(br#"{"weight_map": {"x": "../a"}}"#.to_vec()),
        Err(ErrorKind::BadShardName { .. })
    ));
    let ok = parse_index(br#"{"metadata": null, "weight_map": {}, "other": [1]}"#.to_vec()).unwrap();
    assert!(ok.is_empty() && ok.metadata().is_empty() && ok.total_size_bytes().is_none());
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
    let idx = parse_index(text.as_bytes().to_vec()).unwrap();
    assert_eq!(idx.metadata()["d"], deep);
    assert_eq!(idx.metadata()["m"], r#"{"a":{},"b":[[],{"c":-1.5}],"e":true}"#);
}

/// What every result of [`parse_index`] must satisfy. An accepted index is what serde_json reads
/// (same weight map, same metadata: strings as they are, other values as equivalent JSON text,
/// `total_size` when an integer), its shard names are plain, sorted and distinct, and it
/// re-serialises to an index that parses the same. A refusal is an index rule's kind: `BadIndex`
/// whenever the text is not JSON (JSON errors come first), `BadShardName` only for a shard name
/// that is not plain, in a weight map.
fn check_index_result(
    bytes: &[u8],
    result: &std::result::Result<ShardIndex, ErrorKind>,
) -> Result<(), TestCaseError> {
    let generic = serde_json::from_slice::<serde_json::Value>(bytes);
    // serde_json also refuses numbers whose f64 would be infinite, which JSON allows.
    prop_assume!(!generic.as_ref().is_err_and(|e| e.to_string().contains("number out of range")));
    let weight_map = generic.as_ref().ok().and_then(|v| v.get("weight_map")).and_then(|w| w.as_object());
    let Ok(index) = result else {
        let kind = result.as_ref().unwrap_err();
        match kind {
            ErrorKind::BadIndex { .. } => {}
            ErrorKind::BadShardName { shard } => {
                prop_assert!(generic.is_ok(), "a shard name judged before the JSON");
                prop_assert!(check_shard_name(shard).is_err());
                prop_assert!(weight_map.is_some(), "a shard name refused without a weight_map");
            }
            other => prop_assert!(false, "not an index rule: {:?}", other),
        }
        if generic.is_err() {
            prop_assert!(matches!(kind, ErrorKind::BadIndex { .. }), "invalid JSON refused as {:?}", kind);
        }
        return Ok(());
    };
    let Some(weight_map) = weight_map else {
        return Err(TestCaseError::fail(format!("accepted without a weight_map object: {generic:?}")));
    };
    prop_assert_eq!(weight_map.len(), index.len());
    for (name, shard) in index.weight_map() {
        prop_assert_eq!(weight_map[name].as_str(), Some(shard));
        prop_assert_eq!(index.shard_of(name), Some(shard));
        prop_assert!(check_shard_name(shard).is_ok());
    }
    let shards: Vec<&str> = index.shard_names().collect();
    let mut expected: Vec<&str> = weight_map.values().filter_map(|v| v.as_str()).collect();
    expected.sort_unstable();
    expected.dedup();
    prop_assert_eq!(shards, expected);
    let metadata = generic.as_ref().ok().and_then(|v| v.get("metadata")).and_then(|m| m.as_object());
    prop_assert_eq!(index.metadata().len(), metadata.map_or(0, |m| m.len()));
    for (key, flat) in index.metadata() {
        let value = &metadata.unwrap()[key.as_str()];
        match value.as_str() {
            Some(text) => prop_assert_eq!(flat.as_str(), text),
            None => prop_assert_eq!(&serde_json::from_str::<serde_json::Value>(flat).unwrap(), value),
        }
    }
    let total_size = metadata.and_then(|m| m.get("total_size")).and_then(|t| t.as_u64());
    prop_assert_eq!(index.total_size_bytes(), total_size);
    // Round trip: metadata values as strings, total_size as the integer it was.
    let mut meta = serde_json::Map::new();
    for (k, v) in index.metadata() {
        meta.insert(k.clone(), serde_json::Value::from(v.as_str()));
    }
    if let Some(n) = index.total_size_bytes() {
        meta.insert("total_size".into(), n.into());
    }
    let map: serde_json::Map<String, serde_json::Value> =
        index.weight_map().map(|(t, s)| (t.to_owned(), serde_json::Value::from(s))).collect();
    let text = serde_json::json!({"metadata": meta, "weight_map": map}).to_string();
    let again = parse_index(text.as_bytes().to_vec()).unwrap();
    // serde_json's map reorders the members: compare as sets.
    let sorted = |i: &ShardIndex| {
        let mut pairs: Vec<(String, String)> =
            i.weight_map().map(|(t, s)| (t.to_owned(), s.to_owned())).collect();
        pairs.sort();
        pairs
    };
    prop_assert_eq!(sorted(&again), sorted(index));
    prop_assert_eq!(again.metadata(), index.metadata());
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Byte edits of a valid index: every result is checked.
    #[test]
    fn index_parser_results_are_checked(
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..6),
    ) {
        let mut bytes = GOOD.as_bytes().to_vec();
        for (at, b) in edits {
            let k = at.index(bytes.len());
            bytes[k] = b;
        }
        check_index_result(&bytes, &parse_index(bytes.clone()))?;
    }

    /// Generated indexes, valid JSON by construction, with any values in the metadata, in an
    /// ignored key and (sometimes) in the weight map; names repeat and shard names may not be
    /// plain. Most parse; every result is checked.
    #[test]
    fn generated_indexes_are_read_as_serde_json_reads_them(
        metadata in proptest::collection::btree_map("[a-z_]{1,4}", crate::json::tests::arb_value(), 0..4),
        total_size in proptest::option::of(prop_oneof![any::<u64>().prop_map(serde_json::Value::from), crate::json::tests::arb_value()]),
        junk in crate::json::tests::arb_value(),
        entries in proptest::collection::vec(("[a-c.é\"]{1,3}", "[a-c/.]{0,3}\\.safetensors|\\.\\.|\\.|", 0u8..20), 0..12),
        pretty in any::<bool>(),
    ) {
        let mut meta: serde_json::Map<String, serde_json::Value> = metadata.into_iter().collect();
        if let Some(t) = total_size {
            meta.insert("total_size".into(), t);
        }
        let mut text = String::from("{");
        text.push_str(&format!("\"metadata\": {}, \"junk\": {junk}, \"weight_map\": {{", serde_json::Value::Object(meta)));
        for (i, (name, shard, odd)) in entries.iter().enumerate() {
            let value = if *odd == 0 { "[1]".to_owned() } else { serde_json::Value::from(shard.as_str()).to_string() };
            let sep = if i == 0 { "" } else { "," };
            text.push_str(&format!("{sep}{}: {value}", serde_json::Value::from(name.as_str())));
        }
        text.push_str("}}");
        let text = if pretty {
            serde_json::from_str::<serde_json::Value>(&text).map_or(text.clone(), |v| serde_json::to_string_pretty(&v).unwrap())
        } else {
            text
        };
        check_index_result(text.as_bytes(), &parse_index(text.as_bytes().to_vec()))?;
    }

    /// JSON-like text as a metadata value: parsed exactly when it is JSON, flattened to
    /// equivalent JSON text.
    #[test]
    fn metadata_values_are_flattened_to_equivalent_json(v in "[\\[\\]{}0-9,:\" a.eE\\-]{0,40}") {
        let text = format!(r#"{{"metadata": {{"k": {v}}}, "weight_map": {{}}}}"#);
        let result = parse_index(text.as_bytes().to_vec());
        check_index_result(text.as_bytes(), &result)?;
        let valid = serde_json::from_str::<serde_json::Value>(&v);
        prop_assume!(!valid.as_ref().is_err_and(|e| e.to_string().contains("number out of range")));
        prop_assert_eq!(result.is_ok(), valid.is_ok());
    }
}

/// Four shards of three tensors each: `s{k}.safetensors` holds `l{k}.a`, `l{k}.b`, `l{k}.c`.
fn four_shards_indexed() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let mut map = Vec::new();
    for k in 0..4 {
        let names: Vec<String> = ["a", "b", "c"].iter().map(|t| format!("l{k}.{t}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        write_shard(dir.path(), &format!("s{k}.safetensors"), &refs);
        map.extend(names.iter().map(|n| format!("\"{n}\": \"s{k}.safetensors\"")));
    }
    write_index(
        dir.path(),
        &format!(r#"{{"metadata": {{"total_size": 96}}, "weight_map": {{{}}}}}"#, map.join(", ")),
    );
    dir
}

fn lazy(glob: &str) -> crate::OpenOptions {
    crate::OpenOptions {
        shards: crate::Shards::Selected(crate::Selection::Glob(vec![glob.into()])),
        ..Default::default()
    }
}

#[test]
fn a_lazy_open_parses_only_the_shards_holding_selected_tensors() {
    let dir = four_shards_indexed();
    // Shards the selection does not touch are never opened: corrupt ones go unnoticed.
    std::fs::write(dir.path().join("s0.safetensors"), b"not a safetensors file").unwrap();
    std::fs::remove_file(dir.path().join("s3.safetensors")).unwrap();
    let ckpt = crate::open_with(dir.path(), &lazy("l2.*")).unwrap();
    let names: Vec<&str> = ckpt.tensors().iter().map(|t| t.name()).collect();
    assert_eq!(names, ["l2.a", "l2.b", "l2.c"]);
    assert_eq!(ckpt.files().len(), 1);
    assert!(ckpt.files()[0].path().ends_with("s2.safetensors"));
    assert_eq!(ckpt.warnings().len(), 1, "{:?}", ckpt.warnings());
    let message = &ckpt.warnings()[0].message;
    assert!(
        message.contains("lazy open: parsed 1 of 4 shards") && message.contains("9 tensors"),
        "{message}"
    );
    // Every tensor of a parsed shard comes, selected or not; two shards when two are touched.
    let two = crate::open_with(dir.path(), &lazy("l[12].b")).unwrap();
    assert_eq!(two.tensors().len(), 6);
    // The strict open of the same directory sees the damage.
    assert!(matches!(
        open_err(dir.path()),
        ErrorKind::HeaderTooLarge { .. } | ErrorKind::HeaderBeyondFile { .. }
    ));
}

#[test]
fn a_lazy_open_keeps_the_rules_for_the_shards_it_parses() {
    let dir = four_shards_indexed();
    // s1 also holds l2.a: a tensor in two shards, both parsed for this selection.
    write_shard(dir.path(), "s1.safetensors", &["l1.a", "l1.b", "l1.c", "l2.a"]);
    let err = crate::open_with(dir.path(), &lazy("l[12].*")).unwrap_err();
    assert!(
        matches!(err.kind(), ErrorKind::TensorNotInIndex { .. } | ErrorKind::TensorInTwoShards { .. }),
        "{err}"
    );
    // A parsed shard lacking a tensor the index places there.
    let dir = four_shards_indexed();
    write_shard(dir.path(), "s2.safetensors", &["l2.a", "l2.b"]);
    let err = crate::open_with(dir.path(), &lazy("l2.a")).unwrap_err();
    assert!(
        matches!(err.kind(), ErrorKind::TensorNotInShard { shard } if shard == "s2.safetensors"),
        "{err}"
    );
    assert_eq!(err.tensor(), Some("l2.c"));
}

#[test]
fn lazy_with_nothing_selected_or_a_bad_glob_or_no_index() {
    let dir = four_shards_indexed();
    let none = crate::open_with(dir.path(), &lazy("nothing.*")).unwrap();
    assert!(none.tensors().is_empty() && none.files().is_empty());
    // A glob that does not compile parses every shard (the load reports the pattern).
    assert_eq!(crate::open_with(dir.path(), &lazy("[")).unwrap().tensors().len(), 12);
    // Without an index, lazy is strict.
    std::fs::remove_file(dir.path().join("model.safetensors.index.json")).unwrap();
    assert_eq!(crate::open_with(dir.path(), &lazy("l2.*")).unwrap().tensors().len(), 12);
}

/// Whatever the number of header threads, the same checkpoint or the same first error.
#[test]
fn threads_change_nothing_but_speed() {
    let open = |dir: &Path, threads: usize| {
        crate::open_with(dir, &crate::OpenOptions { header_threads: threads, ..Default::default() })
            .map(|c| (c.tensors().to_vec(), c.files().to_vec(), c.metadata().clone(), c.warnings().to_vec()))
            .map_err(|e| e.to_string())
    };
    let good = four_shards_indexed();
    let broken = four_shards_indexed();
    write_shard(broken.path(), "s1.safetensors", &["l1.a", "l1.b", "l1.c", "l3.a"]);
    std::fs::write(broken.path().join("s3.safetensors"), b"short").unwrap();
    let unindexed = four_shards_indexed();
    std::fs::remove_file(unindexed.path().join("model.safetensors.index.json")).unwrap();
    for dir in [good.path(), broken.path(), unindexed.path()] {
        let one = open(dir, 1);
        for threads in [2, 3, 8] {
            assert_eq!(open(dir, threads), one, "{threads} threads on {}", dir.display());
        }
    }
    assert!(open(good.path(), 1).is_ok());
    assert!(open(broken.path(), 1).unwrap_err().contains("s3.safetensors: file is 5 bytes"));
}

#[test]
fn listed_files_the_index_does_not_name_are_ignored_and_hidden_shards_read() {
    let dir = four_shards_indexed();
    // A stray file sorted between the shards, which the index does not name: ignored even broken.
    std::fs::write(dir.path().join("s1x.safetensors"), b"junk").unwrap();
    // A shard under a hidden name (not listed): read after the listed ones.
    std::fs::rename(dir.path().join("s3.safetensors"), dir.path().join(".s3.safetensors")).unwrap();
    let index = std::fs::read_to_string(dir.path().join("model.safetensors.index.json")).unwrap();
    write_index(dir.path(), &index.replace("\"s3.safetensors\"", "\".s3.safetensors\""));
    let ckpt = crate::open(dir.path()).unwrap();
    assert_eq!(ckpt.tensors().len(), 12);
    let files: Vec<_> = ckpt.files().iter().map(|f| f.path().file_name().unwrap().to_owned()).collect();
    assert_eq!(files, [".s3.safetensors", "s0.safetensors", "s1.safetensors", "s2.safetensors"]);
    assert_eq!(ckpt.tensor("l3.a").unwrap().file(), crate::FileId(0));
    assert_eq!(ckpt.tensor("l0.a").unwrap().file(), crate::FileId(1));
}
