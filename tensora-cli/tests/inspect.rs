//! `tensora inspect` run as a binary on the repository fixtures and on broken inputs.

mod common;

use std::process::Output;

use common::{REAL, SLLM_TINY as SLLM, assert_one_error_line};

fn inspect(args: &[&str]) -> Output {
    common::tensora(&[&["inspect"], args].concat())
}

fn json_of(path: &str) -> serde_json::Value {
    let out = inspect(&[path, "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn json_for_the_real_fixtures_matches_expected() {
    for (stem, count) in [("fracast-0", 47), ("fracast-0.int8", 67)] {
        let path = format!("{REAL}/{stem}.safetensors");
        let v = json_of(&path);
        let mut keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(keys, ["files", "format", "metadata", "path", "tensor_bytes", "tensors", "warnings"]);
        assert_eq!(v["format"], "safetensors");
        assert_eq!(v["path"], path.as_str());
        assert_eq!(v["warnings"], serde_json::json!([]));
        let files = v["files"].as_array().unwrap();
        assert_eq!(files.len(), 1);
        assert_eq!(files[0]["len_bytes"], std::fs::metadata(&path).unwrap().len());
        assert_eq!(files[0]["tensors"], count);
        assert!(files[0]["path"].as_str().unwrap().ends_with(&format!("{stem}.safetensors")));
        assert_eq!(v["metadata"]["model_name"], "fracast-0");
        let expected: serde_json::Value =
            serde_json::from_slice(&std::fs::read(format!("{REAL}/{stem}.expected.json")).unwrap()).unwrap();
        let tensors = v["tensors"].as_array().unwrap();
        assert_eq!(tensors.len(), count);
        let mut previous_end = None;
        for t in tensors {
            let e = &expected["tensors"][t["name"].as_str().unwrap()];
            assert_eq!(t["dtype"], e["dtype"]);
            assert_eq!(t["shape"], e["shape"]);
            assert_eq!(t["file"], 0);
            assert_eq!(t["strides"], serde_json::Value::Null);
            assert_eq!(t["len_bytes"], t["nbytes"], "safetensors stores tensors dense");
            let offset = t["offset_bytes"].as_u64().unwrap();
            if let Some(end) = previous_end {
                assert_eq!(offset, end, "tensors are listed in file order and tile the data");
            }
            previous_end = Some(offset + t["nbytes"].as_u64().unwrap());
        }
        assert_eq!(previous_end, Some(std::fs::metadata(&path).unwrap().len()));
        let header_end = tensors[0]["offset_bytes"].as_u64().unwrap();
        assert_eq!(v["tensor_bytes"], previous_end.unwrap() - header_end);
    }
}

#[test]
fn text_output_has_every_section() {
    let out = inspect(&[&format!("{REAL}/fracast-0.int8.safetensors")]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for needle in [
        "format:  safetensors",
        "files:   1",
        "tensors: 67",
        "bytes by dtype:",
        "F32",
        "I8",
        "metadata:",
        "model_name = fracast-0",
        "NAME",
        "core.block.dw_bias",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
    assert!(out.stderr.is_empty());
}

#[test]
fn sharded_directory_written_by_hand() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(format!("{REAL}/fracast-0.safetensors"), dir.path().join("a.safetensors")).unwrap();
    std::fs::copy(format!("{REAL}/fracast-0.int8.safetensors"), dir.path().join("b.safetensors")).unwrap();
    // The two fixtures share tensor names, so as two shards they conflict.
    let out = inspect(&[dir.path().to_str().unwrap()]);
    assert_one_error_line(&out);
    assert!(String::from_utf8_lossy(&out.stderr).contains("two shards"));
    std::fs::remove_file(dir.path().join("b.safetensors")).unwrap();
    let v = json_of(dir.path().to_str().unwrap());
    assert_eq!(v["tensors"].as_array().unwrap().len(), 47);
}

#[test]
fn serverlessllm_directory() {
    let v = json_of(SLLM);
    assert_eq!(v["format"], "serverlessllm");
    assert_eq!(v["files"].as_array().unwrap().len(), 3);
    assert_eq!(v["tensors"].as_array().unwrap().len(), 14);
    // The layout records strides; the JSON carries them.
    let pos_ids = v["tensors"].as_array().unwrap().iter().find(|t| t["name"] == "pos_ids").unwrap();
    assert_eq!(pos_ids["strides"], serde_json::json!([17, 1]));
}

#[test]
fn errors_exit_1_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let short = dir.path().join("short.safetensors");
    std::fs::write(&short, [1u8, 2, 3]).unwrap();
    let bad_json = dir.path().join("bad.safetensors");
    let mut f = 16u64.to_le_bytes().to_vec();
    f.extend_from_slice(b"{\"a\":\nNaN}      ");
    std::fs::write(&bad_json, f).unwrap();
    let missing = dir.path().join("missing.safetensors");
    let empty_dir = tempfile::tempdir().unwrap();
    for p in [&short, &bad_json, &missing, &empty_dir.path().to_path_buf()] {
        let out = inspect(&[p.to_str().unwrap()]);
        assert_one_error_line(&out);
        assert!(out.stdout.is_empty());
        let out = inspect(&[p.to_str().unwrap(), "--json"]);
        assert_one_error_line(&out);
    }
}
