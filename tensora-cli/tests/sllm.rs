//! `tensora inspect --json` on the repository ServerlessLLM fixture.

use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;
use std::process::Command;

use serde_json::Value;
use sha2::{Digest, Sha256};

const TINY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/serverlessllm/tiny");
const TINY_EXPECTED: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/serverlessllm/tiny.expected.json");

fn inspect_json(path: &str) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_tensora")).args(["inspect", "--json", path]).output().unwrap();
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn expected() -> BTreeMap<String, Value> {
    let v: Value = serde_json::from_slice(&std::fs::read(TINY_EXPECTED).unwrap()).unwrap();
    v["tensors"].as_object().unwrap().iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

#[test]
fn inspect_json_matches_tiny_expected_names_dtypes_shapes() {
    let got = inspect_json(TINY);
    assert_eq!(got["format"], "serverlessllm");
    assert_eq!(got["files"].as_array().unwrap().len(), 3);
    let expected = expected();
    let tensors = got["tensors"].as_array().unwrap();
    let by_name: BTreeMap<&str, &Value> = tensors.iter().map(|t| (t["name"].as_str().unwrap(), t)).collect();
    assert_eq!(by_name.len(), tensors.len(), "names are unique");
    assert_eq!(
        by_name.keys().copied().collect::<Vec<_>>(),
        expected.keys().map(String::as_str).collect::<Vec<_>>()
    );
    for (name, e) in &expected {
        let t = by_name[name.as_str()];
        assert_eq!(t["dtype"], e["dtype"], "{name}");
        assert_eq!(t["shape"], e["shape"], "{name}");
    }
}

#[test]
fn inspect_json_offsets_give_the_expected_digests() {
    // SHA-256 of numel × itemsize bytes at each reported (file, offset) matches the fixture.
    let got = inspect_json(TINY);
    let files: Vec<String> =
        got["files"].as_array().unwrap().iter().map(|f| f["path"].as_str().unwrap().to_owned()).collect();
    let expected = expected();
    for t in got["tensors"].as_array().unwrap() {
        let name = t["name"].as_str().unwrap();
        let file = std::fs::File::open(&files[t["file"].as_u64().unwrap() as usize]).unwrap();
        let mut buf = vec![0u8; t["nbytes"].as_u64().unwrap() as usize];
        file.read_exact_at(&mut buf, t["offset_bytes"].as_u64().unwrap()).unwrap();
        assert_eq!(hex::encode(Sha256::digest(&buf)), expected[name]["sha256"].as_str().unwrap(), "{name}");
    }
    // The tied pair points at the same bytes.
    let find = |n: &str| got["tensors"].as_array().unwrap().iter().find(|t| t["name"] == n).unwrap().clone();
    let (embed, head) = (find("embed.weight"), find("lm_head.weight"));
    assert_eq!((&embed["file"], &embed["offset_bytes"]), (&head["file"], &head["offset_bytes"]));
}

#[test]
fn inspect_accepts_the_index_file_path_too() {
    let got = inspect_json(&format!("{TINY}/tensor_index.json"));
    assert_eq!(got["format"], "serverlessllm");
    assert_eq!(got["tensors"].as_array().unwrap().len(), 14);
}

#[test]
fn inspect_reports_a_broken_index_with_error_and_exit_1() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tensor_index.json"), r#"{"w": [0, 8, [2], [3, 1], "torch.float32"]}"#)
        .unwrap();
    std::fs::write(dir.path().join("tensor.data_0"), [0u8; 8]).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tensora"))
        .args(["inspect", "--json"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.starts_with("error:"), "{stderr}");
    assert!(stderr.contains("stride rank"), "{stderr}");
    assert!(out.stdout.is_empty());
}
