//! Remote load measurements against real local servers, each beside its raw-transfer anchor in
//! the same run (medians of `--runs`):
//!
//! 1. nginx: `load_remote` of a sharded checkpoint vs `curl -s --parallel --parallel-max 8` over
//!    8 MiB ranges of the same bytes;
//! 2. s3rver: the same against `curl --aws-sigv4`;
//! 3. rate-limited nginx (`limit_rate 50m`): one queue across all shards with 32 in flight vs the
//!    shards loaded one after another (same options, one shard per load).
//!
//! Run: `cargo run --release -p tensora-remote --example remote_bench -- [--shards 8]
//! [--shard-mib 128] [--runs 3] [--s3-shard-mib 32] [--runtime-threads 2] [--json PATH]`. Needs nginx and s3rver (see
//! `tests/support/mod.rs` for the install lines) and curl.

#[path = "../tests/support/mod.rs"]
mod support;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use tensora_remote::{Location, RemoteOptions, load_remote};

/// Range size of the curl anchors and of the loader's reads.
const CHUNK_BYTES: u64 = 8 << 20;
/// Per-transfer curl config lines for the S3 anchor (options reset at every `next`).
/// curl 7.88 does not add `x-amz-content-sha256`, which S3 servers require.
const SIGV4: &str = "aws-sigv4 = \"aws:amz:us-east-1:s3\"\nuser = \"S3RVER:S3RVER\"\n\
                     header = \"x-amz-content-sha256: UNSIGNED-PAYLOAD\"";
/// Upper bound on `--runs`.
const RUNS_MAX: usize = 99;

struct Args {
    shards: usize,
    shard_mib: u64,
    s3_shard_mib: u64,
    runs: usize,
    runtime_threads: usize,
    json: Option<PathBuf>,
}

fn parse_args() -> Result<Args, String> {
    let mut args =
        Args { shards: 8, shard_mib: 128, s3_shard_mib: 32, runs: 3, runtime_threads: 2, json: None };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--shards" => args.shards = value()?.parse().map_err(|e| format!("--shards: {e}"))?,
            "--shard-mib" => args.shard_mib = value()?.parse().map_err(|e| format!("--shard-mib: {e}"))?,
            "--s3-shard-mib" => {
                args.s3_shard_mib = value()?.parse().map_err(|e| format!("--s3-shard-mib: {e}"))?
            }
            "--runs" => args.runs = value()?.parse().map_err(|e| format!("--runs: {e}"))?,
            "--runtime-threads" => {
                args.runtime_threads = value()?.parse().map_err(|e| format!("--runtime-threads: {e}"))?
            }
            "--json" => args.json = Some(PathBuf::from(value()?)),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if args.shards == 0
        || args.shard_mib == 0
        || args.s3_shard_mib == 0
        || !(1..=RUNS_MAX).contains(&args.runs)
    {
        return Err(format!("--shards, --shard-mib, --s3-shard-mib must be > 0 and --runs 1..={RUNS_MAX}"));
    }
    Ok(args)
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// The shard files of a checkpoint directory, sorted, with their sizes.
fn shard_files(dir: &Path) -> Vec<(String, u64)> {
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
fn curl_config(base_url: &str, files: &[(String, u64)], per_transfer: &str) -> String {
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
fn curl_run(config: &Path, extra: &[&str]) -> f64 {
    let t = Instant::now();
    let status = Command::new("curl")
        .args(["-s", "--fail", "--parallel", "--parallel-max", "8"])
        .args(extra)
        .arg("-K")
        .arg(config)
        .stderr(std::process::Stdio::null())
        .status()
        .expect("run curl");
    assert!(status.success(), "curl failed: {status}");
    t.elapsed().as_secs_f64()
}

struct Cell {
    name: String,
    bytes: u64,
    seconds: Vec<f64>,
    peak_rss_bytes: u64,
    requests: u64,
}

impl Cell {
    fn gbps(&self) -> f64 {
        self.bytes as f64 / median(self.seconds.clone()) / 1e9
    }
}

fn load_cell(name: &str, url: &str, opts: &RemoteOptions, runs: usize) -> Cell {
    let location = Location::parse(url).expect("location");
    let mut cell =
        Cell { name: name.to_owned(), bytes: 0, seconds: Vec::new(), peak_rss_bytes: 0, requests: 0 };
    for _ in 0..runs {
        let t = Instant::now();
        let loaded = load_remote(&location, opts).unwrap_or_else(|e| panic!("{name}: {e}"));
        cell.seconds.push(t.elapsed().as_secs_f64());
        let r = loaded.report();
        cell.bytes = r.load.bytes_selected;
        cell.peak_rss_bytes = cell.peak_rss_bytes.max(r.load.peak_rss_bytes);
        cell.requests = r.requests;
    }
    cell
}

fn anchor_cell(name: &str, config: &Path, extra: &[&str], bytes: u64, runs: usize) -> Cell {
    let seconds = (0..runs).map(|_| curl_run(config, extra)).collect();
    Cell { name: name.to_owned(), bytes, seconds, peak_rss_bytes: 0, requests: 0 }
}

fn main() -> Result<(), String> {
    let args = parse_args()?;
    let work = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/tensora-remote-bench");
    let dir = work.join(format!("ckpt-{}x{}m", args.shards, args.shard_mib));
    if shard_files(&dir).len() != args.shards {
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        eprintln!("writing {} × {} MiB into {}", args.shards, args.shard_mib, dir.display());
        support::write_checkpoint(&dir, args.shards, 4, (args.shard_mib << 20) / 4);
    }
    let files = shard_files(&dir);
    let total_bytes: u64 = files.iter().map(|f| f.1).sum();
    let ckpt_name = dir.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_owned();
    let nginx = support::Nginx::start(&work, "50m")?;
    let mut cells = Vec::new();

    // 1. nginx vs curl.
    let cfg_path = work.join("curl-nginx.cfg");
    std::fs::write(&cfg_path, curl_config(&nginx.url(&format!("{ckpt_name}/")), &files, ""))
        .map_err(|e| e.to_string())?;
    let fast = RemoteOptions {
        reads_inflight_max: 8,
        chunk_bytes: CHUNK_BYTES,
        runtime_threads: args.runtime_threads,
        ..RemoteOptions::default()
    };
    // Warm-ups: the page cache for both, and the loader's recycled arena (as a service that loads
    // repeatedly would have it).
    curl_run(&cfg_path, &[]);
    load_cell("warm-up", &nginx.url(&format!("{ckpt_name}/")), &fast, 1);
    for _ in 0..args.runs {
        // Interleave anchor and loader runs so that both see the same machine state.
        cells.push(anchor_cell("nginx curl anchor", &cfg_path, &[], total_bytes, 1));
        cells.push(load_cell("nginx load_remote", &nginx.url(&format!("{ckpt_name}/")), &fast, 1));
    }

    // 3. rate-limited nginx: one queue vs one shard after another.
    let limited = RemoteOptions { reads_inflight_max: 32, ..fast.clone() };
    let slow_dir = nginx.slow_url(&format!("{ckpt_name}/"));
    cells.push(load_cell("nginx 50m/conn, one queue, 32 in flight", &slow_dir, &limited, args.runs));
    let mut seq = Cell {
        name: "nginx 50m/conn, shards one after another".into(),
        bytes: total_bytes,
        seconds: vec![],
        peak_rss_bytes: 0,
        requests: 0,
    };
    for _ in 0..args.runs {
        let t = Instant::now();
        for (name, _) in &files {
            let url = nginx.slow_url(&format!("{ckpt_name}/{name}"));
            load_remote(&Location::parse(&url).expect("url"), &limited).map_err(|e| e.to_string())?;
        }
        seq.seconds.push(t.elapsed().as_secs_f64());
    }
    cells.push(seq);

    // 2. s3rver vs curl --aws-sigv4 (smaller shards: s3rver stores whole PUT bodies in memory).
    let s3_dir = work.join(format!("ckpt-{}x{}m", args.shards, args.s3_shard_mib));
    if shard_files(&s3_dir).len() != args.shards {
        std::fs::create_dir_all(&s3_dir).map_err(|e| e.to_string())?;
        support::write_checkpoint(&s3_dir, args.shards, 4, (args.s3_shard_mib << 20) / 4);
    }
    let s3_files = shard_files(&s3_dir);
    let s3_bytes: u64 = s3_files.iter().map(|f| f.1).sum();
    let s3 = support::S3rver::start()?;
    s3.upload_dir(&s3_dir, "bench")?;
    let s3_cfg = work.join("curl-s3.cfg");
    let base = format!("{}/{}/bench/", s3.endpoint(), support::BUCKET);
    std::fs::write(&s3_cfg, curl_config(&base, &s3_files, SIGV4)).map_err(|e| e.to_string())?;
    let s3_opts = RemoteOptions { store: s3.store_config(), ..fast.clone() };
    let s3_url = format!("s3://{}/bench/", support::BUCKET);
    for _ in 0..args.runs {
        cells.push(anchor_cell("s3rver curl --aws-sigv4 anchor", &s3_cfg, &[], s3_bytes, 1));
        cells.push(load_cell("s3rver load_remote", &s3_url, &s3_opts, 1));
    }
    drop(s3);
    drop(nginx);

    // Merge the interleaved single-run cells by name.
    let mut merged: Vec<Cell> = Vec::new();
    for c in cells {
        match merged.iter_mut().find(|m| m.name == c.name) {
            Some(m) => {
                m.seconds.extend(c.seconds);
                m.peak_rss_bytes = m.peak_rss_bytes.max(c.peak_rss_bytes);
            }
            None => merged.push(c),
        }
    }
    let gbps = |name: &str| merged.iter().find(|c| c.name == name).map_or(0.0, Cell::gbps);
    let mut out = String::new();
    let _ = writeln!(out, "| cell | MB | median s | GB/s | runs (s) |\n|---|---|---|---|---|");
    for c in &merged {
        let runs: Vec<String> = c.seconds.iter().map(|s| format!("{s:.3}")).collect();
        let _ = writeln!(
            out,
            "| {} | {:.0} | {:.3} | {:.3} | {} |",
            c.name,
            c.bytes as f64 / 1e6,
            median(c.seconds.clone()),
            c.gbps(),
            runs.join(" ")
        );
    }
    let ratios = [
        ("nginx load / curl", gbps("nginx load_remote") / gbps("nginx curl anchor")),
        ("s3rver load / curl sigv4", gbps("s3rver load_remote") / gbps("s3rver curl --aws-sigv4 anchor")),
        (
            "rate-limited one queue / one shard after another",
            gbps("nginx 50m/conn, one queue, 32 in flight")
                / gbps("nginx 50m/conn, shards one after another"),
        ),
    ];
    for (name, r) in ratios {
        let _ = writeln!(out, "{name}: {r:.2}x");
    }
    let peak = merged.iter().map(|c| c.peak_rss_bytes).max().unwrap_or(0);
    let cap = limited.inflight_bytes_max().unwrap_or(0);
    let _ = writeln!(
        out,
        "peak RSS {:.0} MiB over all loads; largest arena {:.0} MiB + in-flight cap {:.0} MiB + 64 MiB = {:.0} MiB",
        peak as f64 / 1048576.0,
        total_bytes as f64 / 1048576.0,
        cap as f64 / 1048576.0,
        (total_bytes + cap + (64 << 20)) as f64 / 1048576.0
    );
    print!("{out}");
    if let Some(path) = args.json {
        let cells: Vec<_> = merged
            .iter()
            .map(|c| serde_json::json!({"name": c.name, "bytes": c.bytes, "seconds": c.seconds, "gbps": c.gbps(), "peak_rss_bytes": c.peak_rss_bytes, "requests": c.requests}))
            .collect();
        let ratios: serde_json::Map<_, _> =
            ratios.iter().map(|(n, r)| (n.to_string(), serde_json::json!(r))).collect();
        let doc = serde_json::json!({"cells": cells, "ratios": ratios, "runs": args.runs});
        std::fs::write(&path, serde_json::to_vec_pretty(&doc).map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}
