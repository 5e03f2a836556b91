//! ServerlessLLM reader and writer against the repository fixture, plus property tests of the index
//! parser.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::FileExt;
use std::path::Path;

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use sha2::{Digest, Sha256};
use tensora_format::sllm::write::{SllmLayout, SllmLayoutConfig, SllmTensorSpec, index_json};
use tensora_format::sllm::{self, IndexEntry, IndexLayout, SllmIndex};
use tensora_format::{Checkpoint, Dtype, ErrorKind, Format};

const TINY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/serverlessllm/tiny");
const TINY_EXPECTED: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/serverlessllm/tiny.expected.json");

struct Expected {
    dtype: String,
    shape: Vec<u64>,
    sha256: String,
}

fn expected() -> BTreeMap<String, Expected> {
    let v: serde_json::Value = serde_json::from_slice(&fs::read(TINY_EXPECTED).unwrap()).unwrap();
    v["tensors"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(name, t)| {
            let e = Expected {
                dtype: t["dtype"].as_str().unwrap().to_owned(),
                shape: t["shape"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap()).collect(),
                sha256: t["sha256"].as_str().unwrap().to_owned(),
            };
            (name.clone(), e)
        })
        .collect()
}

fn tensor_bytes(ckpt: &Checkpoint, name: &str) -> Vec<u8> {
    let t = ckpt.tensor(name).unwrap();
    let file = fs::File::open(ckpt.file(t.file()).path()).unwrap();
    let mut buf = vec![0u8; t.nbytes() as usize];
    file.read_exact_at(&mut buf, t.offset_bytes()).unwrap();
    buf
}

#[test]
fn tiny_fixture_matches_expected_names_dtypes_shapes_and_digests() {
    let ckpt = sllm::open_dir(Path::new(TINY)).unwrap();
    assert_eq!(ckpt.format(), Format::ServerlessLlm);
    assert_eq!(ckpt.files().len(), 3);
    let expected = expected();
    assert_eq!(ckpt.tensors().len(), expected.len());
    for (name, e) in &expected {
        let t = ckpt.tensor(name).unwrap_or_else(|| panic!("missing {name}"));
        assert_eq!(t.dtype().as_str(), e.dtype, "{name}");
        assert_eq!(t.shape(), &e.shape[..], "{name}");
        let digest = hex::encode(Sha256::digest(tensor_bytes(&ckpt, name)));
        assert_eq!(digest, e.sha256, "{name}");
    }
}

#[test]
fn tiny_fixture_tied_weight_is_one_storage() {
    let ckpt = sllm::open_dir(Path::new(TINY)).unwrap();
    let embed = ckpt.tensor("embed.weight").unwrap();
    let head = ckpt.tensor("lm_head.weight").unwrap();
    assert_eq!((embed.file(), embed.range()), (head.file(), head.range()));
}

#[test]
fn tiny_fixture_padding_is_not_part_of_any_tensor() {
    let ckpt = sllm::open_dir(Path::new(TINY)).unwrap();
    // The fixture fills its padding with 0xAA; no tensor range may include it.
    let odd = ckpt.tensor("layers.0.odd.bias").unwrap();
    assert_eq!(odd.len_bytes(), 6);
    let q8 = ckpt.tensor("q8").unwrap();
    for t in [odd, q8] {
        let file = fs::File::open(ckpt.file(t.file()).path()).unwrap();
        let pad_len = (8 - t.len_bytes() % 8) % 8;
        let mut pad = vec![0u8; pad_len as usize];
        file.read_exact_at(&mut pad, t.range().end).unwrap();
        assert!(pad.iter().all(|&b| b == 0xAA), "{}: {pad:?}", t.name());
        assert_ne!(tensor_bytes(&ckpt, t.name()).last(), None);
    }
    // The next record starts at the padded offset.
    let next = ckpt.tensor("layers.0.attn.qkv.weight").unwrap();
    assert_eq!(next.offset_bytes() % 8, 0);
    let scale = ckpt.tensor("scale").unwrap();
    assert_eq!((scale.shape(), scale.strides()), (&[][..], Some(&[][..])));
    let empty = ckpt.tensor("empty").unwrap();
    assert_eq!((empty.len_bytes(), empty.file().index()), (0, 2));
}

#[test]
fn tiny_fixture_tensors_are_ordered_by_file_and_offset() {
    let ckpt = sllm::open_dir(Path::new(TINY)).unwrap();
    let keys: Vec<_> = ckpt.tensors().iter().map(|t| (t.file(), t.offset_bytes())).collect();
    assert!(keys.windows(2).all(|w| w[0] <= w[1]));
}

// ---- property tests ----

fn dtype_strategy() -> impl Strategy<Value = Dtype> {
    prop::sample::select(vec![
        Dtype::F16,
        Dtype::BF16,
        Dtype::F32,
        Dtype::F64,
        Dtype::I8,
        Dtype::I16,
        Dtype::I32,
        Dtype::I64,
        Dtype::U8,
        Dtype::Bool,
        Dtype::F8E4M3,
        Dtype::F8E5M2,
    ])
}

fn name_strategy() -> impl Strategy<Value = String> {
    // Includes quotes, backslashes, control and non-ASCII characters to exercise escaping.
    "[a-z0-9._\"\\\\\u{1}\u{7f}é😀]{1,12}"
}

fn specs_strategy() -> impl Strategy<Value = Vec<SllmTensorSpec>> {
    let one =
        (name_strategy(), dtype_strategy(), prop::collection::vec(0u64..6, 0..4), 0u64..3, any::<bool>());
    prop::collection::vec(one, 0..24).prop_map(|raw| {
        let mut specs: Vec<SllmTensorSpec> = Vec::new();
        for (i, (name, dtype, shape, slack, tie)) in raw.into_iter().enumerate() {
            let name = format!("{i}#{name}");
            if tie && !specs.is_empty() {
                let target = i % specs.len();
                let target = specs[target].tied_to.unwrap_or(target);
                let mut s = specs[target].clone();
                s.name = name;
                s.tied_to = Some(target);
                specs.push(s);
                continue;
            }
            let mut s = SllmTensorSpec::dense(name, dtype, shape).unwrap();
            // Storage may be larger than the view.
            s.size_bytes += slack * dtype.size_bytes().unwrap();
            specs.push(s);
        }
        specs
    })
}

fn to_legacy(layout: &SllmLayout) -> Vec<IndexEntry> {
    let starts: Vec<u64> = layout
        .partition_lens_bytes()
        .iter()
        .scan(0u64, |acc, &len| {
            let s = *acc;
            *acc += len;
            Some(s)
        })
        .collect();
    layout
        .entries()
        .iter()
        .map(|e| {
            let p = starts.partition_point(|&s| s <= e.offset_bytes) - 1;
            let mut l = e.clone();
            l.offset_bytes -= starts[p];
            l.partition = Some(p as u32);
            l
        })
        .collect()
}

/// The kinds a `tensor_index.json` parse can fail with.
fn is_index_rule(kind: &ErrorKind) -> bool {
    use ErrorKind as K;
    matches!(
        kind,
        K::BadIndex { .. }
            | K::BadSllmEntry { .. }
            | K::BadTensorName { .. }
            | K::UnknownTorchDtype { .. }
            | K::BadShape { .. }
            | K::RankTooLarge { .. }
            | K::BadOffsets { .. }
            | K::StrideRankMismatch { .. }
            | K::StrideOutOfBounds { .. }
            | K::SizeOverflow
            | K::SizeMismatch { .. }
            | K::DuplicateTensor
            | K::SllmOverlap { .. }
    )
}

/// What every result of `parse_index(bytes)` must satisfy. An accepted index is what serde_json
/// reads (one object, as many members as entries), its entries keep the rules (one layout, ranks
/// equal and bounded, unique names, no untied overlap), and it re-serialises to an index that
/// parses the same. A refusal is one of the index rules' kinds: `BadIndex` exactly when the text
/// is not one JSON object, or an entry rule before any JSON error.
fn check_result(bytes: &[u8], result: &Result<SllmIndex, ErrorKind>) -> Result<(), TestCaseError> {
    let generic = serde_json::from_slice::<serde_json::Value>(bytes);
    let Ok(parsed) = result else {
        let kind = result.as_ref().unwrap_err();
        prop_assert!(is_index_rule(kind), "not an index rule: {:?}", kind);
        match &generic {
            Ok(v) if v.is_object() => prop_assert!(!matches!(kind, ErrorKind::BadIndex { .. }), "{:?}", kind),
            Ok(_) => prop_assert!(matches!(kind, ErrorKind::BadIndex { .. }), "{:?}", kind),
            Err(_) => {} // BadIndex, or an entry rule broken before the JSON error.
        }
        return Ok(());
    };
    let Ok(serde_json::Value::Object(object)) = generic else {
        return Err(TestCaseError::fail(format!(
            "accepted what serde_json does not read as an object: {generic:?}"
        )));
    };
    prop_assert_eq!(object.len(), parsed.len());
    let legacy = parsed.layout == IndexLayout::Legacy;
    let entries: Vec<_> = parsed.entries().collect();
    for (i, e) in entries.iter().enumerate() {
        prop_assert!(object.contains_key(e.name), "{} is not a key", e.name);
        prop_assert_eq!(e.partition.is_some(), legacy);
        prop_assert!(e.shape.len() == e.strides.len() && e.shape.len() <= sllm::RANK_MAX);
        for o in &entries[..i] {
            prop_assert_ne!(o.name, e.name);
            let overlap = e.size_bytes > 0
                && o.size_bytes > 0
                && o.partition == e.partition
                && e.offset_bytes < o.end_bytes()
                && o.offset_bytes < e.end_bytes();
            let tied = (o.offset_bytes, o.size_bytes) == (e.offset_bytes, e.size_bytes);
            prop_assert!(!overlap || tied, "{} overlaps {}", e.name, o.name);
        }
    }
    let again = sllm::parse_index(index_json(&parsed.to_entries()).as_bytes());
    prop_assert_eq!(again.as_ref().ok(), Some(parsed));
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn valid_indexes_round_trip(specs in specs_strategy(), cap in 1u64..200) {
        let layout = SllmLayout::new(specs, &SllmLayoutConfig { partition_bytes_max: cap }).unwrap();
        let json = layout.index_json();
        let parsed = sllm::parse_index(json.as_bytes()).unwrap();
        prop_assert_eq!(parsed.layout, IndexLayout::Upstream);
        prop_assert_eq!(&parsed.to_entries()[..], layout.entries());
        // Python-style JSON is also plain JSON.
        let generic: serde_json::Value = serde_json::from_str(&json).unwrap();
        prop_assert_eq!(generic.as_object().unwrap().len(), layout.entries().len());
        // Every record fits its partition and partitions hold at most the cap unless one record
        // alone is bigger.
        for r in layout.records() {
            let len = layout.partition_lens_bytes()[r.partition as usize];
            prop_assert!(r.offset_in_partition_bytes + r.size_bytes + r.padding_bytes <= len);
            prop_assert_eq!((r.offset_in_partition_bytes) % 8, 0);
        }
    }

    #[test]
    fn legacy_indexes_round_trip(specs in specs_strategy(), cap in 1u64..200) {
        let layout = SllmLayout::new(specs, &SllmLayoutConfig { partition_bytes_max: cap }).unwrap();
        let legacy = to_legacy(&layout);
        let parsed = sllm::parse_index(index_json(&legacy).as_bytes()).unwrap();
        let expected_layout = if legacy.is_empty() { IndexLayout::Upstream } else { IndexLayout::Legacy };
        prop_assert_eq!(parsed.layout, expected_layout);
        prop_assert_eq!(parsed.to_entries(), legacy);
    }

    /// Insertions, deletions and replacements in a valid index: every result is checked.
    #[test]
    fn mutated_indexes_give_checked_results(
        specs in specs_strategy(),
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..3), 1..8),
    ) {
        let layout = SllmLayout::new(specs, &SllmLayoutConfig::default()).unwrap();
        let mut bytes = layout.index_json().into_bytes();
        for (at, byte, op) in edits {
            if bytes.is_empty() {
                bytes.push(byte);
                continue;
            }
            let i = at.index(bytes.len());
            match op {
                0 => bytes[i] = byte,
                1 => { bytes.remove(i); }
                _ => bytes.insert(i, byte),
            }
        }
        check_result(&bytes, &sllm::parse_index(&bytes))?;
    }

    #[test]
    fn arbitrary_bytes_give_checked_results(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        check_result(&bytes, &sllm::parse_index(&bytes))?;
    }

    /// JSON-like text inside an otherwise valid entry (the stride), and as a whole index.
    #[test]
    fn json_like_text_gives_checked_results(text in "[\\[\\]{}\",:0-9a-z .\\-]{0,40}") {
        let inside = format!(r#"{{"w": [0, 8, [2], {text}, "torch.float32"]}}"#);
        check_result(inside.as_bytes(), &sllm::parse_index(inside.as_bytes()))?;
        check_result(text.as_bytes(), &sllm::parse_index(text.as_bytes()))?;
    }
}

#[test]
fn writer_output_reopens_with_identical_tensors() {
    let specs = vec![
        SllmTensorSpec::dense("a", Dtype::BF16, vec![3, 5]).unwrap(),
        SllmTensorSpec::dense("b", Dtype::F8E4M3, vec![7]).unwrap(),
        SllmTensorSpec::dense("c", Dtype::I64, vec![2]).unwrap(),
    ];
    let layout = SllmLayout::new(specs, &SllmLayoutConfig { partition_bytes_max: 24 }).unwrap();
    let dir = tempfile::tempdir().unwrap();
    sllm::write::write_dir(dir.path(), &layout, |r, out| {
        let rec = layout.records()[r];
        let data: Vec<u8> =
            (0..rec.size_bytes).map(|i| (i as u8).wrapping_mul(31).wrapping_add(r as u8)).collect();
        out.write_all(&data)
    })
    .unwrap();
    let ckpt = sllm::open_dir(dir.path()).unwrap();
    // a (30 + 2 padding) alone passes the cap; b (7 + 1) and c (16) share the second partition.
    assert_eq!(layout.partition_lens_bytes(), [32, 24]);
    assert_eq!(ckpt.files().len(), 2);
    for (r, rec) in layout.records().iter().enumerate() {
        let spec = &layout.specs()[rec.spec];
        let got = tensor_bytes(&ckpt, &spec.name);
        let want: Vec<u8> =
            (0..rec.size_bytes).map(|i| (i as u8).wrapping_mul(31).wrapping_add(r as u8)).collect();
        assert_eq!(got, want);
        assert_eq!(ckpt.tensor(&spec.name).unwrap().dtype(), spec.dtype);
    }
}

#[test]
fn generic_open_recognises_the_directory_and_its_index_file() {
    let by_dir = tensora_format::open(TINY).unwrap();
    assert_eq!(by_dir.format(), Format::ServerlessLlm);
    let by_index = tensora_format::open(Path::new(TINY).join(sllm::INDEX_FILE_NAME)).unwrap();
    assert_eq!(by_index.tensors(), by_dir.tensors());
}

#[test]
fn a_truncated_tiny_partition_is_named_with_its_lengths() {
    let dir = tempfile::tempdir().unwrap();
    for entry in fs::read_dir(TINY).unwrap() {
        let from = entry.unwrap().path();
        fs::write(dir.path().join(from.file_name().unwrap()), fs::read(&from).unwrap()).unwrap();
    }
    let part = sllm::partition_path(dir.path(), 2);
    let full_len = fs::metadata(&part).unwrap().len();
    fs::OpenOptions::new().write(true).open(&part).unwrap().set_len(full_len - 100).unwrap();
    let err = sllm::open_dir(dir.path()).unwrap_err();
    assert_eq!(err.path(), part);
    assert!(matches!(err.kind(), tensora_format::ErrorKind::OutsidePartition { .. }), "{err}");
    assert!(err.tensor().is_some());
    let short = sllm::partition_shortfalls(dir.path()).unwrap();
    assert_eq!(
        short,
        [sllm::PartitionShortfall {
            path: part,
            expected_len_bytes: full_len,
            actual_len_bytes: full_len - 100
        }]
    );
}

/// `Checkpoint::distinct_bytes` counts bytes shared by tied tensors once, and agrees with a
/// byte-by-byte union for any subset of the fixture's tensors (which holds ties, an empty tensor
/// and tensors spread over three partitions).
mod distinct_bytes {
    use super::TINY;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn equals_the_union_of_the_selected_ranges(mask in proptest::collection::vec(any::<bool>(), 14)) {
            let ckpt = tensora_format::open(TINY).unwrap();
            let selected: Vec<usize> = (0..ckpt.tensors().len()).filter(|&i| mask[i % mask.len()]).collect();
            let mut bytes = BTreeSet::new();
            for &i in &selected {
                let t = &ckpt.tensors()[i];
                bytes.extend(t.range().map(|b| (t.file().0, b)));
            }
            prop_assert_eq!(ckpt.distinct_bytes(&selected), bytes.len() as u64);
            // Out-of-range indexes are ignored; a repeated index counts once.
            let mut twice = selected.clone();
            twice.extend(&selected);
            twice.push(usize::MAX);
            prop_assert_eq!(ckpt.distinct_bytes(&twice), bytes.len() as u64);
        }
    }
}
