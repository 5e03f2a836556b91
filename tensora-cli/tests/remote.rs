//! `tensora inspect|load|hash|verify` on remote locations: real nginx and s3rver processes on
//! 127.0.0.1 (the harness of tensora-remote's tests), compared with the same commands on the
//! local files.

#[path = "../../tensora-remote/tests/support/mod.rs"]
mod support;

use std::process::{Command, Output};

mod common;
use common::tensora;

use support::{Nginx, S3rver, write_checkpoint};

fn ok_json(args: &[&str]) -> serde_json::Value {
    let out = tensora(args);
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

fn started<T>(server: Result<T, String>) -> T {
    server.unwrap_or_else(|e| panic!("test server unavailable: {e}"))
}

/// A 3-shard checkpoint in `root/ckpt`, served by nginx.
fn served() -> (tempfile::TempDir, Nginx) {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("ckpt");
    std::fs::create_dir(&dir).unwrap();
    write_checkpoint(&dir, 3, 3, 64 << 10);
    let nginx = started(Nginx::start(root.path(), "50m"));
    (root, nginx)
}

fn assert_one_error_line(out: &Output, needle: &str) {
    let line = common::assert_one_error_line(out);
    assert!(line.contains(needle), "{line}");
}

#[test]
fn inspect_and_load_a_url_report_what_local_paths_do() {
    let (root, nginx) = served();
    let dir = root.path().join("ckpt");
    let url = nginx.url("ckpt/");
    let dir_s = dir.to_str().unwrap();

    let remote = ok_json(&["inspect", &url, "--json"]);
    let local = ok_json(&["inspect", dir_s, "--json"]);
    assert_eq!(remote["tensors"], local["tensors"]);
    assert_eq!(remote["format"], local["format"]);
    let files = remote["files"].as_array().unwrap();
    assert_eq!(files.len(), 3);
    assert!(files[0]["path"].as_str().unwrap().starts_with("http://127.0.0.1:"), "{files:?}");
    let out = tensora(&["inspect", &url]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("tensors: 9"));

    let remote = ok_json(&["load", &url, "--json"]);
    let local = ok_json(&["load", dir_s, "--json"]);
    for key in local.as_object().unwrap().keys() {
        assert!(remote.get(key).is_some(), "remote report lacks {key}: {remote}");
    }
    // The load's own GETs (3 shards at least), and what opening cost, each counted once.
    assert!(remote["requests"].as_u64().unwrap() >= 3, "{remote}");
    // A tensor_index.json probe, the index's probe and GET, and a HEAD and a GET per shard.
    assert!(remote["open_requests"].as_u64().unwrap() >= 1 + 2 + 6, "{remote}");
    assert_eq!(remote["retries"], 0);
    assert_eq!(remote["bytes_selected"], local["bytes_selected"]);
    assert_eq!(remote["tensors"], 9);

    // Partial and streamed.
    let partial = ok_json(&["load", &url, "--json", "--select", "layers.1.*", "--select", "layers.8.*"]);
    assert_eq!(partial["tensors"], 2);
    assert_eq!(partial["bytes_selected"], 2 * (64 << 10));
    let streamed = ok_json(&["load", &url, "--json", "--stream", "--budget", "128KiB", "--chunk", "64KiB"]);
    assert_eq!(streamed["tensors"], 9);
    assert!(streamed["windows"].as_u64().unwrap() > 1, "{streamed}");
    assert_eq!(streamed["inflight_bytes_max"], 128 << 10, "{streamed}");
    // A budget given is the stream's window, above the 256 MiB default of remote streams too.
    let wide = ok_json(&["load", &url, "--json", "--stream", "--budget", "300MiB"]);
    assert_eq!(wide["inflight_bytes_max"], 300 << 20, "{wide}");
    let text = tensora(&["load", &url]);
    assert!(text.status.success());
    assert!(String::from_utf8_lossy(&text.stdout).contains("requests"));

    // Local-only flags are refused with one line.
    assert_one_error_line(&tensora(&["load", &url, "--mapped"]), "--mapped does not apply");
    assert_one_error_line(&tensora(&["load", &url, "--backend", "sync"]), "--backend does not apply");
    assert_one_error_line(&tensora(&["load", &nginx.url("missing/")]), "no checkpoint found");
}

/// `load URL --tp` and `inspect URL --tp`: the remote load takes the share as a local one does
/// (the same `bytes_selected`, every tensor's narrowed shape), read as the store's per-request
/// cost decides (inspect's kinds and counts are the load's); the text report names the share.
#[test]
fn a_url_loads_and_inspects_a_tensor_parallel_share() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("llama");
    std::fs::create_dir(&dir).unwrap();
    common::write_llama(&dir, 1 << 20);
    let nginx = started(Nginx::start(root.path(), "50m"));
    let url = nginx.url("llama/");
    let dir_s = dir.to_str().unwrap();
    for tp in ["0/2", "1/2", "2/3"] {
        let remote = ok_json(&["load", &url, "--tp", tp, "--json"]);
        let local = ok_json(&["load", dir_s, "--tp", tp, "--json"]);
        assert_eq!(remote["bytes_selected"], local["bytes_selected"], "{tp}");
        assert_eq!(remote["tensors"], local["tensors"], "{tp}");
        let plan = ok_json(&["inspect", &url, "--tp", tp, "--json"]);
        assert_eq!(plan["slices"], remote["slices"], "{tp}: inspect decides as the remote load does");
        assert_eq!(plan["bytes_selected"], remote["bytes_selected"], "{tp}");
        let local_plan = ok_json(&["inspect", dir_s, "--tp", tp, "--json"]);
        let shapes = |v: &serde_json::Value| -> Vec<(String, serde_json::Value)> {
            v["tensors"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| (t["name"].to_string(), t["shape"].clone()))
                .collect()
        };
        assert_eq!(shapes(&plan), shapes(&local_plan), "{tp}");
        // A ranged GET costs megabytes of transfer: no row-parallel slice is read row by row,
        // where the page cache reads down_proj's share strided.
        assert_eq!(plan["slices"]["strided"], 0, "{tp}: {plan}");
        assert_ne!(local_plan["slices"]["strided"], 0, "{tp}: {local_plan}");
    }
    // Through a cache: the share's ranges are written through, then served from it.
    let cache = root.path().join("cache");
    let cache_s = cache.to_str().unwrap();
    let want = ok_json(&["load", dir_s, "--tp", "1/2", "--json"])["bytes_selected"].clone();
    for run in 0..2 {
        let cached = ok_json(&["load", &url, "--tp", "1/2", "--cache", cache_s, "--json"]);
        assert_eq!(cached["bytes_selected"], want, "{cached}");
        let hit = cached["cache"]["hit_bytes"].as_u64().unwrap();
        assert_eq!(hit > 0, run == 1, "run {run}: {cached}");
    }
    let text = tensora(&["load", &url, "--tp", "1/2"]);
    assert!(text.status.success(), "{}", String::from_utf8_lossy(&text.stderr));
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(
        text.contains("share        rank 1 of 2, llama rules\n") && text.contains("\nslices       "),
        "{text}"
    );
}

#[test]
fn hash_and_verify_a_url_against_a_manifest() {
    let (root, nginx) = served();
    let dir = root.path().join("ckpt");
    let url = nginx.url("ckpt/");
    for algo in ["crc32c", "sha256"] {
        let remote = ok_json(&["hash", &url, "--json", "--algo", algo]);
        let local = ok_json(&["hash", dir.to_str().unwrap(), "--json", "--algo", algo]);
        assert_eq!(remote, local, "{algo}");
    }
    // A manifest of the local files verifies the remote copy.
    let manifest = root.path().join("manifest.json");
    let out = tensora(&["hash", dir.to_str().unwrap(), "--write-manifest", manifest.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = tensora(&["verify", &url, "--manifest", manifest.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout} {}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.lines().last().unwrap().starts_with("OK: 0 errors"), "{stdout}");
    assert!(stdout.contains("9/9 tensors digested"), "{stdout}");

    // A manifest that disagrees: one digest changed, one tensor missing from the checkpoint.
    let mut doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&manifest).unwrap()).unwrap();
    let tensors = doc["tensors"].as_object_mut().unwrap();
    let first = tensors.keys().next().unwrap().clone();
    tensors[&first]["crc32c"] = serde_json::json!("00000000");
    tensors.insert("ghost".into(), tensors[&first].clone());
    std::fs::write(&manifest, serde_json::to_vec(&doc).unwrap()).unwrap();
    let out = tensora(&["verify", &url, "--manifest", manifest.to_str().unwrap(), "--json"]);
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let json_text = &stdout[..stdout.trim_end().rfind('\n').unwrap()];
    let report: serde_json::Value = serde_json::from_str(json_text).unwrap();
    let codes: Vec<&str> =
        report["findings"].as_array().unwrap().iter().map(|f| f["code"].as_str().unwrap()).collect();
    assert!(codes.contains(&"digest-mismatch") && codes.contains(&"tensor-missing"), "{codes:?}");

    // A broken object is a structure error; a missing one is a missing file.
    std::fs::write(root.path().join("bad.safetensors"), 1000u64.to_le_bytes()).unwrap();
    let out = tensora(&["verify", &nginx.url("bad.safetensors")]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stdout).contains("error:"));
    let out = tensora(&["verify", &nginx.url("gone.safetensors"), "--json"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stdout).contains("file-missing"));
    assert_one_error_line(&tensora(&["verify", &url, "--cross-check"]), "--cross-check does not apply");
}

#[test]
fn s3_locations_take_endpoint_flags_and_aws_environment() {
    let src = tempfile::tempdir().unwrap();
    write_checkpoint(src.path(), 2, 2, 32 << 10);
    let s3 = started(S3rver::start());
    s3.upload_dir(src.path(), "m").unwrap();
    let url = format!("s3://{}/m/", support::BUCKET);
    let endpoint = s3.endpoint();
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_tensora"))
            .args(args)
            .env("AWS_ACCESS_KEY_ID", support::S3RVER_KEY.0)
            .env("AWS_SECRET_ACCESS_KEY", support::S3RVER_KEY.1)
            .env("AWS_REGION", "us-east-1")
            .output()
            .unwrap()
    };
    let out = run(&["load", &url, "--json", "--endpoint", &endpoint, "--allow-http"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["tensors"], 4);
    assert_eq!(report["backend"], "remote-s3");
    let out = run(&["hash", &url, "--json", "--endpoint", &endpoint, "--allow-http"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let remote: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(remote, ok_json(&["hash", src.path().to_str().unwrap(), "--json"]));
    // Without --allow-http the plain-http endpoint is refused.
    let out = run(&["inspect", &url, "--endpoint", &endpoint]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--allow-http"), "{stderr}");
}

/// Finding 1 of issue 14: a password in the URL reaches the server (basic auth) but no output:
/// not `inspect --json`, not the `load --json` report, not `verify`'s findings, not an error line.
#[test]
fn passwords_in_http_urls_do_not_leak() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("private/ckpt");
    std::fs::create_dir_all(&dir).unwrap();
    write_checkpoint(&dir, 2, 2, 16 << 10);
    let nginx = started(Nginx::start(root.path(), "50m"));
    let url = format!("http://u:hunter2@127.0.0.1:{}/private/ckpt/", nginx.port);
    let manifest = root.path().join("manifest.json");
    let out = tensora(&["hash", dir.to_str().unwrap(), "--write-manifest", manifest.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // A manifest that disagrees, so that verify has findings naming objects.
    let mut doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&manifest).unwrap()).unwrap();
    let tensors = doc["tensors"].as_object_mut().unwrap();
    let first = tensors.keys().next().unwrap().clone();
    tensors[&first]["crc32c"] = serde_json::json!("00000000");
    std::fs::write(&manifest, serde_json::to_vec(&doc).unwrap()).unwrap();
    // One that lacks a tensor: `load --manifest` refuses it before loading, naming the location.
    let short = root.path().join("short.json");
    doc["tensors"].as_object_mut().unwrap().remove(&first);
    std::fs::write(&short, serde_json::to_vec(&doc).unwrap()).unwrap();
    let wrong = url.replace("hunter2", "not-hunter2");
    let runs: [(&[&str], bool); 7] = [
        (&["inspect", &url, "--json"], true),
        (&["load", &url, "--json"], true),
        (&["verify", &url, "--manifest", manifest.to_str().unwrap(), "--json"], false),
        (&["verify", &url, "--manifest", manifest.to_str().unwrap()], false),
        (&["load", &wrong], false),
        (&["load", &url, "--manifest", short.to_str().unwrap()], false),
        // A usage error: clap quotes the argument it refused.
        (&["load", &url, &url], false),
    ];
    for (args, ok) in runs {
        let out = tensora(args);
        assert_eq!(out.status.success(), ok, "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        let text =
            format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(!text.contains("hunter2"), "{args:?}: {text}");
        assert!(!text.is_empty());
    }
}

/// A 2-shard checkpoint of 8 × 64 KiB tensors in `root/ckpt`, served by nginx.
fn served_for_cache() -> (tempfile::TempDir, std::path::PathBuf, Nginx) {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("ckpt");
    std::fs::create_dir(&dir).unwrap();
    write_checkpoint(&dir, 2, 4, 64 << 10);
    let nginx = started(Nginx::start(root.path(), "50m"));
    (root, dir, nginx)
}

fn cache_objects(dir: &std::path::Path) -> Vec<tensora_remote::CachedObject> {
    let opts = tensora_remote::CacheOptions {
        dir: dir.to_path_buf(),
        size_max_bytes: None,
        offline: true,
        writes: tensora_remote::CacheWrites::default(),
    };
    tensora_remote::Cache::open(&opts).map(|c| c.list()).unwrap_or_default()
}

/// Which copies [`a_tensor_range_is_cached`] looks at.
#[derive(Clone, Copy)]
enum Copies {
    /// Only copies in progress.
    Partial,
    /// Copies in progress or complete.
    Any,
}

/// Whether some object in the cache has at least one tensor range (headers are far smaller).
fn a_tensor_range_is_cached(dir: &std::path::Path, copies: Copies) -> bool {
    cache_objects(dir)
        .iter()
        .any(|o| (matches!(copies, Copies::Any) || !o.complete) && o.cached_bytes >= 64 << 10)
}

fn load_json(args: &[&str]) -> serde_json::Value {
    ok_json(&[&["load"], args, &["--json", "--chunk", "64KiB", "--queue-depth", "2"]].concat())
}

/// Issue 16: a load killed with SIGKILL half-way leaves its ranges in the cache; the next load
/// reads them from there and fetches only the rest, and the digests equal the local files'.
/// Ordered by events: nginx is slowed until the cache holds a tensor range, then answers 503 to
/// everything (the first load can fetch nothing more) before the kill.
#[test]
fn a_load_killed_with_sigkill_resumes_from_the_cache() {
    let (root, dir, nginx) = served_for_cache();
    let cache = root.path().join("cache");
    let url = nginx.url("ckpt/");
    let cache_s = cache.to_str().unwrap();
    nginx.set_slow(true);
    let mut child = Command::new(env!("CARGO_BIN_EXE_tensora"))
        .args(["load", &url, "--cache", cache_s, "--chunk", "64KiB", "--queue-depth", "2"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    support::wait_for("a cached tensor range", || a_tensor_range_is_cached(&cache, Copies::Partial));
    nginx.fail_with(Some(503));
    child.kill().unwrap();
    child.wait().unwrap();
    nginx.fail_with(None);
    nginx.set_slow(false);
    let partial: u64 = cache_objects(&cache).iter().filter(|o| !o.complete).map(|o| o.cached_bytes).sum();
    assert!(partial >= 64 << 10, "{partial}");
    // The failed load finishes what it fetched behind it: an object it had whole before the
    // 503s may be complete already.
    let complete_before =
        cache_objects(&cache).iter().filter(|o| o.complete && o.url.ends_with(".safetensors")).count();

    let report = load_json(&[&url, "--cache", cache_s]);
    let c = &report["cache"];
    assert!(c["hit_bytes"].as_u64().unwrap() >= 64 << 10, "{report}");
    assert!(c["written_bytes"].as_u64().unwrap() < 8 * (64 << 10), "{report}");
    assert_eq!(c["promoted"].as_u64().unwrap() as usize, 2 - complete_before, "{report}");
    assert!(cache_objects(&cache).iter().all(|o| o.complete), "{report}");
    let remote = ok_json(&["hash", &url, "--json", "--cache", cache_s]);
    assert_eq!(remote, ok_json(&["hash", dir.to_str().unwrap(), "--json"]));
    let out = tensora(&["cache", "verify", cache_s]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
}

/// Issue 16: two processes load one URL at once with one cache: the second waits for the first
/// (file locks), then loads the local copies; neither fails, nothing is fetched twice, and the
/// cache checks clean. Ordered by events: the first is slowed until it has cached a tensor
/// range (in a copy in progress or complete); the second starts, and the server speeds up once nginx has logged the second's HEADs.
#[test]
fn two_processes_loading_one_url_share_the_cache() {
    let (root, dir, nginx) = served_for_cache();
    let cache = root.path().join("cache");
    let url = nginx.url("ckpt/");
    let cache_s = cache.to_str().unwrap();
    let spawn = || {
        Command::new(env!("CARGO_BIN_EXE_tensora"))
            .args(["load", &url, "--json", "--cache", cache_s, "--chunk", "64KiB", "--queue-depth", "2"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    nginx.set_slow(true);
    let first = spawn();
    // Its writers run at idle priority: on a busy machine they may write every range only as the
    // load ends, and promote the copies at once, so a complete copy counts too (the second then
    // reads it; what follows holds either way).
    support::wait_for("a cached tensor range", || a_tensor_range_is_cached(&cache, Copies::Any));
    let heads = nginx.count_logged("200 HEAD");
    let second = spawn();
    // The second confirms the recorded index and two shards with one HEAD each.
    support::wait_for("the second process's HEADs", || nginx.count_logged("200 HEAD") >= heads + 3);
    nginx.set_slow(false);
    let reports: Vec<serde_json::Value> = [first, second]
        .into_iter()
        .map(|child| {
            let out = child.wait_with_output().unwrap();
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            serde_json::from_slice(&out.stdout).unwrap()
        })
        .collect();
    let total_tensor_bytes = 8 * (64 << 10);
    assert!(reports[0]["cache"]["written_bytes"].as_u64().unwrap() >= total_tensor_bytes, "{}", reports[0]);
    assert_eq!(reports[1]["requests"], 0, "{}", reports[1]);
    assert_eq!(reports[1]["cache"]["local_objects"], 2, "{}", reports[1]);
    assert_eq!(reports[1]["cache"]["written_bytes"], 0, "{}", reports[1]);
    assert!(tensora(&["cache", "verify", cache_s]).status.success());
    let remote = ok_json(&["hash", &url, "--json", "--cache", cache_s, "--offline"]);
    assert_eq!(remote, ok_json(&["hash", dir.to_str().unwrap(), "--json"]));
}

/// Issue 16: `tensora cache ls|rm|verify`, and cached bytes checked against a manifest like
/// local ones; a damaged cached copy is found by `cache verify` and never served (issue 39).
#[test]
fn cache_ls_rm_verify_and_manifest_checks_of_cached_bytes() {
    let (root, dir, nginx) = served_for_cache();
    let cache = root.path().join("cache");
    let (url, cache_s) = (nginx.url("ckpt/"), cache.to_str().unwrap().to_owned());
    let manifest = root.path().join("manifest.json");
    let out = tensora(&["hash", dir.to_str().unwrap(), "--write-manifest", manifest.to_str().unwrap()]);
    assert!(out.status.success());
    load_json(&[&url, "--cache", &cache_s]);
    let listed = ok_json(&["cache", "ls", &cache_s, "--json"]);
    let listed = listed.as_array().unwrap();
    assert_eq!(listed.len(), 3);
    assert!(listed.iter().all(|o| o["complete"] == true), "{listed:?}");
    let verify = |offline: &[&str]| {
        tensora(
            &[&["verify", &url, "--cache", &cache_s, "--manifest", manifest.to_str().unwrap()], offline]
                .concat(),
        )
    };
    assert!(verify(&["--offline"]).status.success());
    // Damage one cached shard.
    let shard = listed.iter().max_by_key(|o| o["size_bytes"].as_u64().unwrap()).unwrap();
    let data = cache.join("objects").join(shard["key"].as_str().unwrap()).join("data");
    let mut bytes = std::fs::read(&data).unwrap();
    let n = bytes.len();
    bytes[n - 100] ^= 0xFF;
    std::fs::write(&data, &bytes).unwrap();
    // `cache verify` finds it: the damaged object on stdout, one `error:` line on stderr.
    let out = tensora(&["cache", "verify", &cache_s]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("3 objects checked, 1 damaged"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_one_error_line(&out, "1 of 3 cached objects damaged");
    // A load never serves it (issue 39, finding 1): offline, the damaged range is not cached
    // (a typed error); online, it is fetched again and the manifest holds.
    let out = verify(&["--offline"]);
    assert_one_error_line(&out, "verification failed");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("is not in the cache"), "{stdout}");
    assert!(verify(&[]).status.success());
    assert!(tensora(&["cache", "verify", &cache_s]).status.success());
    let out = tensora(&["cache", "rm", &cache_s]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("removed 3 objects"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(ok_json(&["cache", "ls", &cache_s, "--json"]), serde_json::json!([]));
    assert_one_error_line(&tensora(&["load", &url, "--offline"]), "required arguments");
}
