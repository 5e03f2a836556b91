//! `tensora convert` end to end: round trips checked against the fixtures' expected digests, the
//! output contract (`--json`, nothing extra when piped) and failures that leave no destination.

use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;
use sha2::{Digest, Sha256};

const SHARED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures");

fn tensora(args: &[&str], paths: &[&Path]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tensora"));
    cmd.args(args);
    for p in paths {
        cmd.arg(p);
    }
    cmd.output().unwrap()
}

fn convert(src: &Path, dst: &Path, extra: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tensora"));
    cmd.arg("convert").arg(src).arg(dst).args(extra);
    cmd.output().unwrap()
}

fn ok(out: &Output) -> String {
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout.clone()).unwrap()
}

/// name -> (dtype, shape, sha256 of the tensor's bytes), via `tensora inspect --json`.
fn digests(path: &Path) -> BTreeMap<String, (Value, Value, String)> {
    let got: Value = serde_json::from_str(&ok(&tensora(&["inspect", "--json"], &[path]))).unwrap();
    let files: Vec<String> =
        got["files"].as_array().unwrap().iter().map(|f| f["path"].as_str().unwrap().to_owned()).collect();
    got["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            let file = std::fs::File::open(&files[t["file"].as_u64().unwrap() as usize]).unwrap();
            let mut buf = vec![0u8; t["nbytes"].as_u64().unwrap() as usize];
            file.read_exact_at(&mut buf, t["offset_bytes"].as_u64().unwrap()).unwrap();
            let name = t["name"].as_str().unwrap().to_owned();
            (name, (t["dtype"].clone(), t["shape"].clone(), hex::encode(Sha256::digest(&buf))))
        })
        .collect()
}

fn expected(path: &str) -> BTreeMap<String, (Value, Value, String)> {
    let v: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    v["tensors"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, t)| {
            (k.clone(), (t["dtype"].clone(), t["shape"].clone(), t["sha256"].as_str().unwrap().to_owned()))
        })
        .collect()
}

fn entries(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    v.sort();
    v
}

#[test]
fn real_fixtures_round_trip_through_many_partitions_and_shards() {
    for stem in ["fracast-0", "fracast-0.int8"] {
        let src = PathBuf::from(format!("{SHARED}/real/{stem}.safetensors"));
        let want = expected(&format!("{SHARED}/real/{stem}.expected.json"));
        assert_eq!(digests(&src), want, "{stem}: the fixture itself");
        let work = tempfile::tempdir().unwrap();
        let sllm = work.path().join("sllm");
        ok(&convert(&src, &sllm, &["--to", "serverlessllm", "--partition-bytes", "16KiB"]));
        assert!(sllm.join("tensor.data_3").is_file(), "{stem}: several partitions");
        assert_eq!(digests(&sllm), want, "{stem}: serverlessllm");
        let back = work.path().join("back");
        ok(&convert(&sllm, &back, &["--to", "safetensors", "--shard-bytes", "64K"]));
        assert!(back.join("model.safetensors.index.json").is_file());
        assert_eq!(digests(&back), want, "{stem}: sharded safetensors");
        let single = work.path().join("single.safetensors");
        ok(&convert(&sllm, &single, &["--to", "safetensors"]));
        assert_eq!(digests(&single), want, "{stem}: single file");
    }
}

#[test]
fn tiny_serverlessllm_converts_to_safetensors_with_expected_digests() {
    let tiny = PathBuf::from(format!("{SHARED}/serverlessllm/tiny"));
    let want = expected(&format!("{SHARED}/serverlessllm/tiny.expected.json"));
    let work = tempfile::tempdir().unwrap();
    let st = work.path().join("st");
    let stdout = ok(&convert(&tiny, &st, &["--to", "safetensors", "--json"]));
    let report: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(report["from"], "serverlessllm");
    assert_eq!(report["to"], "safetensors");
    assert_eq!(report["tensors"], 14);
    assert!(report["peak_rss_bytes"].as_u64().is_some());
    assert_eq!(digests(&st), want);
    // And back: tied weights come out as two safetensors tensors and go back in as two storages.
    let again = work.path().join("again");
    ok(&convert(&st, &again, &["--to", "serverlessllm"]));
    assert_eq!(digests(&again), want);
}

#[test]
fn piped_output_is_one_summary_line_and_no_progress() {
    let work = tempfile::tempdir().unwrap();
    let out = convert(
        Path::new(&format!("{SHARED}/serverlessllm/tiny")),
        &work.path().join("o"),
        &["--to", "safetensors"],
    );
    let stdout = ok(&out);
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    assert!(stdout.starts_with("converted 14 tensors"), "{stdout}");
    assert!(out.stderr.is_empty(), "{}", String::from_utf8_lossy(&out.stderr));
}

fn assert_failed(out: &Output) -> String {
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8(out.stderr.clone()).unwrap();
    assert!(stderr.starts_with("error:"), "{stderr}");
    stderr
}

#[test]
fn existing_destination_is_an_error_and_untouched() {
    let work = tempfile::tempdir().unwrap();
    let dst = work.path().join("taken");
    std::fs::create_dir(&dst).unwrap();
    std::fs::write(dst.join("keep"), b"x").unwrap();
    let out =
        convert(Path::new(&format!("{SHARED}/real/fracast-0.safetensors")), &dst, &["--to", "serverlessllm"]);
    let stderr = assert_failed(&out);
    assert!(stderr.contains("already exists"), "{stderr}");
    assert_eq!(entries(&dst), [dst.join("keep")]);
    assert_eq!(entries(work.path()), [dst]);
}

#[test]
fn broken_source_leaves_no_destination() {
    let work = tempfile::tempdir().unwrap();
    // A truncated copy of a real fixture: the header promises more data than the file holds.
    let bytes = std::fs::read(format!("{SHARED}/real/fracast-0.safetensors")).unwrap();
    let src = work.path().join("truncated.safetensors");
    std::fs::write(&src, &bytes[..bytes.len() - 100]).unwrap();
    let dst = work.path().join("out");
    assert_failed(&convert(&src, &dst, &["--to", "serverlessllm"]));
    // A ServerlessLLM directory whose last partition is cut short.
    let sllm = work.path().join("sllm");
    std::fs::create_dir(&sllm).unwrap();
    for f in entries(Path::new(&format!("{SHARED}/serverlessllm/tiny"))) {
        std::fs::copy(&f, sllm.join(f.file_name().unwrap())).unwrap();
    }
    std::fs::OpenOptions::new().write(true).open(sllm.join("tensor.data_2")).unwrap().set_len(100).unwrap();
    let stderr = assert_failed(&convert(&sllm, &dst, &["--to", "safetensors"]));
    assert!(stderr.contains("partition"), "{stderr}");
    assert_eq!(entries(work.path()), [sllm, src]);
}

#[test]
fn bad_arguments_are_errors() {
    let work = tempfile::tempdir().unwrap();
    let src = PathBuf::from(format!("{SHARED}/real/fracast-0.safetensors"));
    let dst = work.path().join("o");
    assert_failed(&convert(&src, &dst, &["--to", "onnx"]));
    assert_failed(&convert(&src, &dst, &["--to", "serverlessllm", "--shard-bytes", "1M"]));
    assert_failed(&convert(&src, &dst, &["--to", "safetensors", "--partition-bytes", "1M"]));
    assert_failed(&convert(&src, &dst, &["--to", "serverlessllm", "--partition-bytes", "0"]));
    assert_failed(&convert(&src, &dst, &["--to", "serverlessllm", "--buffer-bytes", "1GiB"]));
    assert_failed(&convert(&src, &dst, &["--to", "serverlessllm", "--partition-bytes", "12 parsecs"]));
    assert_failed(&convert(&work.path().join("missing"), &dst, &["--to", "serverlessllm"]));
    assert!(entries(work.path()).is_empty());
}

#[test]
fn json_reports_the_write_mode_and_why_and_the_manifest_written_verifies() {
    let work = tempfile::tempdir().unwrap();
    let tiny = PathBuf::from(format!("{SHARED}/serverlessllm/tiny"));
    for (flag, dst, algo) in [("--direct", "st", "xxh3"), ("--buffered", "one.safetensors", "sha256")] {
        let dst = work.path().join(dst);
        let manifest = work.path().join(format!("{algo}.json"));
        let args =
            ["--to", "safetensors", "--json", flag, "--threads", "3", "--algo", algo, "--write-manifest"];
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_tensora"));
        cmd.arg("convert").arg(&tiny).arg(&dst).args(args).arg(&manifest);
        let report: Value = serde_json::from_str(&ok(&cmd.output().unwrap())).unwrap();
        assert!(report["seconds"].as_f64().unwrap() > 0.0 && report["gbps"].as_f64().is_some(), "{report}");
        let (mode, reason) = (report["mode"].as_str().unwrap(), report["reason"].as_str().unwrap());
        match flag {
            "--buffered" => {
                assert!(mode == "buffered" && reason.starts_with("buffered: asked for"), "{reason}")
            }
            _ => assert!(mode == "direct" || reason.contains("O_DIRECT open refused"), "{mode}: {reason}"),
        }
        assert_eq!((report["threads"].as_u64(), report["digest_algo"].as_str()), (Some(3), Some(algo)));
        assert_eq!(report["manifest"].as_str(), Some(manifest.to_str().unwrap()));
        let verified = tensora(&["verify", "--manifest", manifest.to_str().unwrap()], &[&dst]);
        assert!(ok(&verified).starts_with("OK"), "{}", String::from_utf8_lossy(&verified.stdout));
    }
    // --algo needs --write-manifest.
    let out = convert(&tiny, &work.path().join("x"), &["--to", "safetensors", "--algo", "sha256"]);
    assert_failed(&out);
}
