//! What the remote bench runs besides tensora: the curl anchors (`curl --parallel` over the same
//! 8 MiB ranges) and Run:ai's model streamer (`runai-model-streamer` from PyPI, in a venv under
//! the target directory), each timed in a child process.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// Range size of the curl anchors (and of tensora's reads).
pub const CHUNK_BYTES: u64 = 8 << 20;
/// Transfers curl keeps in flight.
pub const CURL_PARALLEL: &str = "8";
/// Per-transfer curl config lines for the S3 anchor (options reset at every `next`). curl 7.88
/// does not add `x-amz-content-sha256`, which S3 servers require.
pub const SIGV4: &str = "aws-sigv4 = \"aws:amz:us-east-1:s3\"\nuser = \"S3RVER:S3RVER\"\n\
                         header = \"x-amz-content-sha256: UNSIGNED-PAYLOAD\"";

/// The shard files of a checkpoint directory, sorted, with their sizes.
pub fn shard_files(dir: &Path) -> Vec<(String, u64)> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut out: Vec<(String, u64)> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let len = e.metadata().ok()?.len();
            name.ends_with(".safetensors").then_some((name, len))
        })
        .collect();
    out.sort();
    out
}

/// A curl config with one transfer per 8 MiB range of every shard.
pub fn curl_config(base_url: &str, files: &[(String, u64)], per_transfer: &str) -> String {
    let mut cfg = String::new();
    for (name, len) in files {
        let mut start = 0;
        while start < *len {
            let end = (start + CHUNK_BYTES).min(*len) - 1;
            if !cfg.is_empty() {
                cfg.push_str("next\n");
            }
            let _ = writeln!(
                cfg,
                "url = \"{base_url}{name}\"\nrange = \"{start}-{end}\"\noutput = \"/dev/null\"\nsilent\nfail\n{per_transfer}"
            );
            start = end + 1;
        }
    }
    cfg
}

/// Seconds for one `curl --parallel --parallel-max 8` run over `config`.
pub fn curl_run(config: &Path) -> Result<f64, String> {
    let t = Instant::now();
    let status = Command::new("curl")
        .args(["-s", "--fail", "--parallel", "--parallel-max", CURL_PARALLEL, "-K"])
        .arg(config)
        .stderr(std::process::Stdio::null())
        .status()
        .map_err(|e| format!("cannot run curl: {e}"))?;
    if !status.success() {
        return Err(format!("curl failed: {status}"));
    }
    Ok(t.elapsed().as_secs_f64())
}

/// The venv Run:ai's streamer is installed in, and the command that installs it.
pub fn runai_venv(target_dir: &Path) -> (PathBuf, String) {
    let venv = target_dir.join("tensora-remote-runai");
    let install = format!(
        "python3 -m venv {v} && {v}/bin/pip install runai-model-streamer runai-model-streamer-s3",
        v = venv.display()
    );
    (venv, install)
}

/// The Python side of the Run:ai peer: stream every file, keep every tensor as an owned buffer
/// (`owned=True`, the streamer's default), print the seconds and the bytes.
const RUNAI_SCRIPT: &str = r#"
import sys, time
from runai_model_streamer import SafetensorsStreamer
t = time.perf_counter()
total, kept = 0, []
with SafetensorsStreamer() as streamer:
    streamer.stream_files(sys.argv[1:], device="cpu", owned=True)
    for name, tensor in streamer.get_tensors():
        kept.append(tensor)
        total += tensor.numel() * tensor.element_size()
print(time.perf_counter() - t, total)
"#;

/// One Run:ai streamer load of `urls` (s3://) from `endpoint`: `(seconds, bytes)`, timed inside
/// the child (interpreter start-up and imports not counted, as tensora's process start is not).
pub fn runai_run(venv: &Path, endpoint: &str, urls: &[String]) -> Result<(f64, u64), String> {
    let out = Command::new(venv.join("bin/python3"))
        .arg("-c")
        .arg(RUNAI_SCRIPT)
        .args(urls)
        .env("AWS_ENDPOINT_URL", endpoint)
        .env("AWS_ACCESS_KEY_ID", "S3RVER")
        .env("AWS_SECRET_ACCESS_KEY", "S3RVER")
        .env("AWS_REGION", "us-east-1")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env("RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING", "0")
        .output()
        .map_err(|e| format!("cannot run the Run:ai streamer: {e}"))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(5).collect();
        return Err(format!("Run:ai streamer failed: {}", tail.join(" | ")));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let mut fields = text.split_whitespace();
    let seconds = fields.next().and_then(|s| s.parse().ok()).ok_or("no time from the Run:ai streamer")?;
    let bytes = fields.next().and_then(|s| s.parse().ok()).ok_or("no byte count from the Run:ai streamer")?;
    Ok((seconds, bytes))
}
