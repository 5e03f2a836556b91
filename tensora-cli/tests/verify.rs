//! `tensora verify`, run as a binary, on real fixtures and on copies damaged on purpose.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

mod common;
use common::{assert_one_error_line, tensora};

use serde_json::Value;

const REAL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/real");
const SLLM_TINY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/serverlessllm/tiny");

fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn last_line(out: &Output) -> String {
    text(out).lines().last().unwrap_or_default().to_owned()
}

/// The JSON document of `verify --json`, and the summary line that must follow it.
fn json_report(out: &Output) -> Value {
    let mut docs = serde_json::Deserializer::from_slice(&out.stdout).into_iter::<Value>();
    let report = docs.next().expect("a JSON document").expect("valid JSON");
    let rest = &text(out)[docs.byte_offset()..];
    assert_eq!(rest.trim(), report["summary"].as_str().unwrap(), "the summary line must follow the JSON");
    assert_eq!(last_line(out), report["summary"].as_str().unwrap());
    report
}

/// A writable copy of a fixture (a file or a directory) in a temporary directory.
fn copy_fixture(src: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let src = Path::new(src);
    let dst = dir.path().join(src.file_name().unwrap());
    if src.is_dir() {
        std::fs::create_dir(&dst).unwrap();
        for e in std::fs::read_dir(src).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
        }
    } else {
        std::fs::copy(src, &dst).unwrap();
    }
    (dir, dst)
}

fn write_manifest(ckpt: &Path, manifest: &Path, algo: &str) {
    let out = tensora(&[
        "hash",
        "--algo",
        algo,
        "--write-manifest",
        manifest.to_str().unwrap(),
        ckpt.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// `(name, file, offset, nbytes)` of every tensor, from the parser.
fn tensors(ckpt: &Path) -> Vec<(String, PathBuf, u64, u64)> {
    let c = tensora_format::open(ckpt).unwrap();
    c.tensors()
        .iter()
        .map(|t| (t.name().to_owned(), c.file(t.file()).path().to_path_buf(), t.offset_bytes(), t.nbytes()))
        .collect()
}

fn flip_byte(path: &Path, offset: u64) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[offset as usize] ^= 0x01;
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn clean_fixtures_pass_with_a_summary_last() {
    for ckpt in [
        format!("{REAL}/fracast-0.safetensors"),
        format!("{REAL}/fracast-0.int8.safetensors"),
        SLLM_TINY.into(),
    ] {
        let out = tensora(&["verify", &ckpt]);
        assert_eq!(out.status.code(), Some(0), "{ckpt}: {}", text(&out));
        assert!(last_line(&out).starts_with("OK: 0 errors"), "{}", text(&out));
    }
}

#[test]
fn the_expected_json_fixtures_work_as_manifests() {
    let out = tensora(&[
        "verify",
        "--manifest",
        &format!("{REAL}/fracast-0.expected.json"),
        &format!("{REAL}/fracast-0.safetensors"),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(last_line(&out).contains("(sha256)"), "{}", text(&out));
    let sllm_expected = format!("{SLLM_TINY}.expected.json");
    let out = tensora(&["verify", "--manifest", &sllm_expected, SLLM_TINY]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}

#[test]
fn a_flipped_byte_in_any_tensor_is_named_with_its_offset() {
    for (fixture, algo) in
        [(format!("{REAL}/fracast-0.int8.safetensors"), "crc32c"), (SLLM_TINY.to_owned(), "xxh3")]
    {
        let (dir, ckpt) = copy_fixture(&fixture);
        let manifest = dir.path().join("m.json");
        write_manifest(&ckpt, &manifest, algo);
        for (name, file, offset, nbytes) in tensors(&ckpt) {
            if nbytes == 0 {
                continue;
            }
            let at = offset + nbytes / 2;
            flip_byte(&file, at);
            let out = tensora(&["verify", "--manifest", manifest.to_str().unwrap(), ckpt.to_str().unwrap()]);
            flip_byte(&file, at);
            assert_eq!(out.status.code(), Some(1), "{name}: {}", text(&out));
            let t = text(&out);
            let mismatches: Vec<&str> =
                t.lines().filter(|l| l.contains("differs from the manifest")).collect();
            // Tied tensors (same bytes) are both named; every named tensor covers the flipped byte.
            assert!(!mismatches.is_empty(), "{name}: {t}");
            assert!(
                mismatches
                    .iter()
                    .any(|l| l.contains(&format!("tensor {name:?}"))
                        && l.contains(&format!("offset {offset}"))),
                "{name}: {t}"
            );
            assert!(last_line(&out).starts_with("FAILED"), "{t}");
        }
    }
}

#[test]
fn a_truncated_file_is_reported_as_truncated_not_as_a_mismatch() {
    // Single file: the header now claims more than the file holds.
    let (dir, ckpt) = copy_fixture(&format!("{REAL}/fracast-0.safetensors"));
    let manifest = dir.path().join("m.json");
    write_manifest(&ckpt, &manifest, "crc32c");
    let len = std::fs::metadata(&ckpt).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&ckpt).unwrap().set_len(len - 1000).unwrap();
    let out = tensora(&["verify", "--manifest", manifest.to_str().unwrap(), ckpt.to_str().unwrap()]);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    assert!(t.contains("truncated"), "{t}");
    assert!(t.contains(&format!("expected {len}")), "{t}");
    assert!(!t.contains("differs from the manifest"), "{t}");

    // ServerlessLLM: one partition cut short.
    let (dir, ckpt) = copy_fixture(SLLM_TINY);
    let manifest = dir.path().join("m.json");
    write_manifest(&ckpt, &manifest, "sha256");
    let part = ckpt.join("tensor.data_1");
    let len = std::fs::metadata(&part).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&part).unwrap().set_len(len - 8).unwrap();
    let out = tensora(&["verify", "--manifest", manifest.to_str().unwrap(), ckpt.to_str().unwrap()]);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    assert!(t.contains("tensor.data_1") && t.contains("truncated"), "{t}");
    assert!(!t.contains("differs from the manifest"), "{t}");
}

/// Write a safetensors file by hand: `header` JSON, padded with spaces to `pad_to`, then `data`.
fn raw_safetensors(path: &Path, header: &str, pad_to: usize, data: &[u8]) {
    let mut json = header.as_bytes().to_vec();
    while json.len() < pad_to {
        json.push(b' ');
    }
    let mut bytes = (json.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(&json);
    bytes.extend_from_slice(data);
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn every_broken_shard_is_reported_not_only_the_first() {
    let dir = tempfile::tempdir().unwrap();
    let good = r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}"#;
    raw_safetensors(&dir.path().join("m-1.safetensors"), good, 0, &[1, 2, 3, 4]);
    // Broken in two different ways.
    raw_safetensors(
        &dir.path().join("m-2.safetensors"),
        r#"{"b":{"dtype":"Q9","shape":[4],"data_offsets":[0,4]}}"#,
        0,
        &[0; 4],
    );
    raw_safetensors(
        &dir.path().join("m-3.safetensors"),
        r#"{"c":{"dtype":"U8","shape":[4],"data_offsets":[0,9]}}"#,
        0,
        &[0; 4],
    );
    let out = tensora(&["verify", dir.path().to_str().unwrap()]);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    assert!(t.contains("m-2.safetensors"), "{t}");
    assert!(t.contains("m-3.safetensors"), "{t}");
    assert!(!t.contains("m-1.safetensors"), "{t}");
    assert!(last_line(&out).starts_with("FAILED: 2 errors"), "{t}");
}

#[test]
fn warnings_do_not_fail_the_check() {
    let dir = tempfile::tempdir().unwrap();
    // An unknown field, and an F32 tensor at an odd absolute offset (header length 9 + 8 = 17).
    let path = dir.path().join("odd.safetensors");
    let header = r#"{"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"quant":"int4"},"y":{"dtype":"F32","shape":[1],"data_offsets":[1,5]}}"#;
    raw_safetensors(&path, header, 0, &[7, 0, 0, 128, 63]);
    let out = tensora(&["verify", path.to_str().unwrap()]);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(0), "{t}");
    assert!(t.lines().any(|l| l.starts_with("warning:") && l.contains("\"quant\"")), "{t}");
    assert!(
        t.lines().any(|l| l.starts_with("warning:") && l.contains("\"y\"") && l.contains("aligned")),
        "{t}"
    );
    assert!(last_line(&out).starts_with("OK: 0 errors, 2 warnings"), "{t}");
}

#[test]
fn a_sparse_file_fails() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("holey.safetensors");
    let header = r#"{"z":{"dtype":"U8","shape":[1048576],"data_offsets":[0,1048576]}}"#;
    raw_safetensors(&path, header, 0, &[]);
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(8 + header.len() as u64 + (1 << 20)).unwrap(); // the data is one big hole
    let out = tensora(&["verify", path.to_str().unwrap()]);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    assert!(t.contains("sparse"), "{t}");
}

#[test]
fn manifest_disagreements_are_each_reported() {
    let (dir, ckpt) = copy_fixture(SLLM_TINY);
    let manifest = dir.path().join("m.json");
    write_manifest(&ckpt, &manifest, "crc32c");
    let mut doc: Value = serde_json::from_slice(&std::fs::read(&manifest).unwrap()).unwrap();
    let tensors = doc["tensors"].as_object_mut().unwrap();
    let moved = tensors.remove("q8").unwrap();
    tensors.insert("ghost".into(), moved);
    tensors.get_mut("scale").unwrap()["shape"] = serde_json::json!([1]);
    doc["files"]["tensor.data_2"]["len_bytes"] = Value::from(1u64 << 40);
    std::fs::write(&manifest, serde_json::to_vec(&doc).unwrap()).unwrap();
    let out =
        tensora(&["verify", "--json", "--manifest", manifest.to_str().unwrap(), ckpt.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let report = json_report(&out);
    let codes: BTreeMap<String, Vec<String>> =
        report["findings"].as_array().unwrap().iter().fold(BTreeMap::new(), |mut acc, f| {
            acc.entry(f["code"].as_str().unwrap().to_owned())
                .or_default()
                .push(f["tensor"].as_str().unwrap_or("").to_owned());
            acc
        });
    assert_eq!(codes["tensor-missing"], ["ghost"]);
    assert_eq!(codes["tensor-not-in-manifest"], ["q8"]);
    assert_eq!(codes["meta-mismatch"], ["scale"]);
    assert_eq!(codes["truncated"].len(), 1, "{codes:?}");
    assert_eq!(report["ok"], false);
    assert_eq!(report["errors"], 4);
}

#[test]
fn a_bad_manifest_is_an_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = dir.path().join("m.json");
    std::fs::write(
        &manifest,
        b"{\"algo\":\"crc32c\",\"tensors\":{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"crc32c\":\"zz\"}}}",
    )
    .unwrap();
    let out = tensora(&["verify", "--manifest", manifest.to_str().unwrap(), SLLM_TINY]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with("error:") && err.contains("\"x\""), "{err}");
    // `load --manifest` and `verify --manifest` name the file once.
    let out = tensora(&["load", SLLM_TINY, "--manifest", manifest.to_str().unwrap()]);
    for out in [out, tensora(&["verify", "--manifest", manifest.to_str().unwrap(), SLLM_TINY])] {
        let err = assert_one_error_line(&out);
        assert_eq!(err.matches(manifest.to_str().unwrap()).count(), 1, "{err}");
    }
}

#[test]
fn cross_check_compares_every_available_backend() {
    let out = tensora(&["verify", "--cross-check", "--json", SLLM_TINY]);
    let report = json_report(&out);
    assert_eq!(out.status.code(), Some(0), "{report:#}");
    let checked: Vec<&str> =
        report["backends_checked"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    let available: Vec<&str> =
        tensora_io::registry::backends().iter().filter(|b| b.available().is_ok()).map(|b| b.name()).collect();
    assert_eq!(checked, available);
    assert!(checked.contains(&"sync"));
}

#[test]
fn a_failed_verify_has_one_error_line_and_the_summary_last() {
    let out = tensora(&["verify", "/nonexistent/model.safetensors"]);
    assert_eq!(out.status.code(), Some(1));
    let err = assert_one_error_line(&out);
    assert!(err.contains("/nonexistent/model.safetensors") && err.contains("1 errors"), "{err}");
    assert!(last_line(&out).starts_with("FAILED: 1 errors"), "{}", text(&out));
    let out = tensora(&["verify", "--json", "/nonexistent/model.safetensors"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(json_report(&out)["ok"], false);
}

#[test]
fn a_missing_manifest_names_its_path_once() {
    let out = tensora(&["verify", "--manifest", "/nonexistent/m.json", SLLM_TINY]);
    assert_eq!(out.status.code(), Some(1));
    let err = assert_one_error_line(&out);
    assert_eq!(err.matches("/nonexistent/m.json").count(), 1, "{err}");
    assert_eq!(err.matches("os error 2").count(), 1, "{err}");
}

#[cfg(unix)]
#[test]
fn a_fifo_as_manifest_is_refused_without_hanging() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("m.json");
    let made = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
    assert!(made.success());
    let out = tensora(&["verify", "--manifest", fifo.to_str().unwrap(), SLLM_TINY]);
    assert_eq!(out.status.code(), Some(1));
    let err = assert_one_error_line(&out);
    assert!(err.contains("not a regular file"), "{err}");
}

#[test]
fn a_truncated_partition_is_reported_as_truncated() {
    let (dir, ckpt) = copy_fixture(SLLM_TINY);
    let part = ckpt.join("tensor.data_2");
    let full = std::fs::metadata(&part).unwrap().len();
    let mut perms = std::fs::metadata(&part).unwrap().permissions();
    #[allow(clippy::permissions_set_readonly_false)]
    perms.set_readonly(false);
    std::fs::set_permissions(&part, perms).unwrap();
    std::fs::OpenOptions::new().write(true).open(&part).unwrap().set_len(100).unwrap();
    let out = tensora(&["verify", ckpt.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let t = text(&out);
    let line = t.lines().find(|l| l.contains("truncated")).unwrap_or_else(|| panic!("{t}"));
    assert!(line.contains("tensor.data_2") && line.contains(&format!("expected {full}")), "{line}");
    assert!(line.contains("100 bytes"), "{line}");
    drop(dir);
}
