//! `tensora hash`, run as a binary: interop with independently computed SHA-256 digests, manifests,
//! every backend.

use std::path::Path;
use std::process::{Command, Output};

mod common;
use common::tensora;

use serde_json::Value;

const REAL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/real");
const SLLM: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/serverlessllm");

fn stdout_json(out: &Output) -> Value {
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("stdout is one JSON document")
}

fn read_json(path: &str) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// Every fixture and its expected digests.
fn fixtures() -> Vec<(String, String)> {
    vec![
        (format!("{REAL}/fracast-0.safetensors"), format!("{REAL}/fracast-0.expected.json")),
        (format!("{REAL}/fracast-0.int8.safetensors"), format!("{REAL}/fracast-0.int8.expected.json")),
        (format!("{SLLM}/tiny"), format!("{SLLM}/tiny.expected.json")),
    ]
}

#[test]
fn sha256_json_reproduces_every_expected_json_exactly() {
    for (ckpt, expected) in fixtures() {
        let doc = stdout_json(&tensora(&["hash", "--algo", "sha256", "--json", &ckpt]));
        let expected = read_json(&expected);
        assert_eq!(doc["algo"], "sha256", "{ckpt}");
        assert_eq!(doc["tensors"], expected["tensors"], "{ckpt}");
        assert_eq!(doc.as_object().unwrap().len(), 2, "only algo and tensors: {ckpt}");
    }
}

#[test]
fn every_backend_gives_the_same_digests() {
    let ckpt = format!("{SLLM}/tiny");
    let reference = stdout_json(&tensora(&["hash", "--algo", "xxh3", "--json", &ckpt]));
    for backend in tensora_io::registry::backends() {
        if backend.name() == "io-uring"
            && !tensora_testkit::io_uring_or_skip("tensora hash --backend io-uring")
        {
            continue;
        }
        let name = backend.name();
        let doc = stdout_json(&tensora(&["hash", "--algo", "xxh3", "--backend", name, "--json", &ckpt]));
        assert_eq!(doc, reference, "backend {name}");
    }
}

#[test]
fn text_output_has_one_line_per_tensor() {
    let ckpt = format!("{REAL}/fracast-0.int8.safetensors");
    let out = tensora(&["hash", &ckpt]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let expected = read_json(&format!("{REAL}/fracast-0.int8.expected.json"));
    let names = expected["tensors"].as_object().unwrap();
    assert_eq!(text.lines().count(), names.len());
    for line in text.lines() {
        let mut parts = line.split("  ");
        let digest = parts.next().unwrap();
        assert_eq!(digest.len(), 8, "crc32c by default: {line}");
        assert!(names.contains_key(parts.next().unwrap()), "{line}");
    }
}

#[test]
fn write_manifest_records_sizes_and_format_and_verifies_clean() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = dir.path().join("m.json");
    let ckpt = format!("{REAL}/fracast-0.safetensors");
    let m = manifest.to_str().unwrap();
    let doc = stdout_json(&tensora(&["hash", "--json", "--write-manifest", m, &ckpt]));
    let written = read_json(m);
    assert_eq!(written["tensors"], doc["tensors"]);
    assert_eq!(written["algo"], "crc32c");
    assert_eq!(written["format"], "safetensors");
    let len = std::fs::metadata(&ckpt).unwrap().len();
    assert_eq!(written["files"]["fracast-0.safetensors"]["len_bytes"], len);
    // Only the manifest is in the directory: no temporary file was left behind.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);

    let out = tensora(&["verify", "--manifest", m, &ckpt]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.lines().last().unwrap().starts_with("OK"), "{text}");
}

#[test]
fn bad_arguments_fail_with_exit_1() {
    let ckpt = format!("{SLLM}/tiny");
    let out = tensora(&["hash", "--algo", "md5", &ckpt]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("md5"));

    let out = tensora(&["hash", "--backend", "no-such-backend", &ckpt]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with("error:") && err.contains("no-such-backend"), "{err}");

    let missing = Path::new(env!("CARGO_MANIFEST_DIR")).join("no/such/checkpoint.safetensors");
    let out = tensora(&["hash", missing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
}

#[test]
fn a_fifo_or_directory_as_manifest_target_is_refused_not_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("m.json");
    assert!(Command::new("mkfifo").arg(&fifo).status().expect("mkfifo").success());
    let ckpt = format!("{SLLM}/tiny");
    for target in [fifo.as_path(), dir.path()] {
        let out = tensora(&["hash", "--write-manifest", target.to_str().unwrap(), &ckpt]);
        assert_eq!(out.status.code(), Some(1));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.starts_with("error:") && err.contains("not a regular file"), "{err}");
    }
    use std::os::unix::fs::FileTypeExt;
    assert!(std::fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo());
}
