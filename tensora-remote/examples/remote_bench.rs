//! Remote load measurements against real local servers, each beside its raw-transfer anchor in
//! the same run (medians of `--runs`):
//!
//! 1. nginx: `load_remote` of a sharded checkpoint vs `curl -s --parallel --parallel-max 8` over
//!    8 MiB ranges of the same bytes;
//! 2. s3rver: the same against `curl --aws-sigv4`;
//! 3. rate-limited nginx (`limit_rate 50m`): one queue across all shards with 32 in flight vs the
//!    shards loaded one after another (same options, one shard per load).
//!
//! 4. peak RSS of a streamed load (32 × 8 MiB in flight) in a fresh child process, against the
//!    in-flight cap + 64 MiB.
//!
//! Each cell reports the median, min and max of its runs; the ratios are of medians. Against the
//! curl anchors the loader runs with a recycled arena after one warm-up load (a service that loads
//! repeatedly has it; the anchors write to /dev/null and pay no page faults either), and, like a
//! service, reuses its HTTP client (kept by `open_remote`) across runs. The rate-limited cells
//! recycle arenas too (all one-queue runs first, then all shard-after-shard runs).
//!
//! Run: `cargo xtask bench --remote [--runs N]`, or `cargo run --release -p tensora-remote
//! --example remote_bench -- [--shards 8] [--shard-mib 128] [--runs 3] [--s3-shard-mib 32]
//! [--runtime-threads 2] [--out DIR]`, which writes `DIR/report.{md,json}`. Needs nginx and
//! s3rver (see `tests/support/mod.rs` for the install lines) and curl.

#[path = "../tests/support/mod.rs"]
mod support;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use tensora_io::{ArenaReuse, LoadOptions};
use tensora_remote::{Location, RemoteOptions, open_remote};

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
    out: Option<PathBuf>,
    /// Child mode: stream-load this URL and print `peak_rss_bytes inflight_bytes_max`.
    rss_probe: Option<String>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        shards: 8,
        shard_mib: 128,
        s3_shard_mib: 32,
        runs: 3,
        runtime_threads: 2,
        out: None,
        rss_probe: None,
    };
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
            "--out" => args.out = Some(PathBuf::from(value()?)),
            "--rss-probe" => args.rss_probe = Some(value()?),
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

fn median(xs: &[f64]) -> f64 {
    let mut xs = xs.to_vec();
    xs.sort_by(f64::total_cmp);
    xs.get(xs.len() / 2).copied().unwrap_or(f64::NAN)
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
fn curl_run(config: &Path, extra: &[&str]) -> Result<f64, String> {
    let t = Instant::now();
    let status = Command::new("curl")
        .args(["-s", "--fail", "--parallel", "--parallel-max", "8"])
        .args(extra)
        .arg("-K")
        .arg(config)
        .stderr(std::process::Stdio::null())
        .status()
        .map_err(|e| format!("cannot run curl: {e}"))?;
    if !status.success() {
        return Err(format!("curl failed: {status}"));
    }
    Ok(t.elapsed().as_secs_f64())
}

struct Cell {
    name: String,
    bytes: u64,
    seconds: Vec<f64>,
    peak_rss_bytes: u64,
    requests: u64,
}

impl Cell {
    fn new(name: &str, bytes: u64) -> Cell {
        Cell { name: name.to_owned(), bytes, seconds: Vec::new(), peak_rss_bytes: 0, requests: 0 }
    }
    /// GB/s of the median run.
    fn gbps(&self) -> f64 {
        self.bytes as f64 / median(&self.seconds) / 1e9
    }
    /// GB/s of the slowest and the fastest run.
    fn gbps_range(&self) -> (f64, f64) {
        let max_s = self.seconds.iter().copied().fold(f64::MIN, f64::max);
        let min_s = self.seconds.iter().copied().fold(f64::MAX, f64::min);
        (self.bytes as f64 / max_s / 1e9, self.bytes as f64 / min_s / 1e9)
    }
}

/// One timed `open_remote` + `load` of `url` into `cell`, into a recycled arena.
fn load_run(cell: &mut Cell, url: &str, opts: &RemoteOptions) -> Result<(), String> {
    let location = Location::parse(url).map_err(|e| e.to_string())?;
    let load = LoadOptions { arena_reuse: ArenaReuse::Recycle, ..LoadOptions::default() };
    let t = Instant::now();
    let loaded = open_remote(&location, opts)
        .and_then(|c| c.load(&load))
        .map_err(|e| format!("{}: {e}", cell.name))?;
    cell.seconds.push(t.elapsed().as_secs_f64());
    let r = loaded.report();
    cell.bytes = r.load.bytes_selected;
    cell.peak_rss_bytes = cell.peak_rss_bytes.max(r.load.peak_rss_bytes);
    cell.requests = r.requests;
    Ok(())
}

/// Child mode: a streamed load of `url`, printing its peak RSS and in-flight cap.
fn rss_probe(url: &str, opts: &RemoteOptions) -> Result<(), String> {
    let location = Location::parse(url).map_err(|e| e.to_string())?;
    let checkpoint = open_remote(&location, opts).map_err(|e| e.to_string())?;
    let mut sum = 0u64;
    let report = checkpoint
        .load_streaming(&LoadOptions::default(), |t| {
            sum = sum.wrapping_add(t.bytes().iter().step_by(4096).map(|&b| u64::from(b)).sum::<u64>());
            Ok(())
        })
        .map_err(|e| e.to_string())?;
    println!("{} {} {sum}", report.load.peak_rss_bytes, report.inflight_bytes_max);
    Ok(())
}

fn uptime() -> String {
    std::fs::read_to_string("/proc/loadavg").map(|s| s.trim().to_owned()).unwrap_or_default()
}

/// Which side of its target an acceptance value must be on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bound {
    /// Passes at or above the target (throughput, ratios).
    AtLeast,
    /// Passes at or below the target (memory).
    AtMost,
}

impl Bound {
    fn symbol(self) -> &'static str {
        match self {
            Bound::AtLeast => "≥",
            Bound::AtMost => "≤",
        }
    }
}

struct Check {
    name: &'static str,
    value: f64,
    target: f64,
    unit: &'static str,
    bound: Bound,
}

impl Check {
    fn pass(&self) -> bool {
        match self.bound {
            Bound::AtLeast => self.value >= self.target,
            Bound::AtMost => self.value <= self.target,
        }
    }
}

/// The options and directories every measurement shares.
struct Bench<'a> {
    args: &'a Args,
    /// Checkpoints, curl configs and server roots live here.
    work: PathBuf,
    /// 8 ranges of `CHUNK_BYTES` in flight, as the curl anchors.
    base_opts: RemoteOptions,
    /// 32 in flight, for the rate-limited port and the RSS probe.
    limited: RemoteOptions,
}

/// The four cells against the nginx anchors and the rate limit, and the streamed load's peak RSS.
struct NginxCells {
    curl: Cell,
    load: Cell,
    one_queue: Cell,
    sequential: Cell,
    stream_rss_bytes: u64,
    stream_cap_bytes: u64,
}

impl Bench<'_> {
    /// A checkpoint of `args.shards` shards of `shard_mib` MiB under the work directory, written
    /// unless an earlier run left it there.
    fn checkpoint(&self, shard_mib: u64) -> Result<PathBuf, String> {
        let shards = self.args.shards;
        let dir = self.work.join(format!("ckpt-{shards}x{shard_mib}m"));
        if shard_files(&dir).len() != shards {
            std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
            eprintln!("writing {shards} × {shard_mib} MiB into {}", dir.display());
            support::write_checkpoint(&dir, shards, 4, (shard_mib << 20) / 4);
        }
        Ok(dir)
    }

    /// 1, 3 and 4: nginx against curl, the rate-limited port (one queue against shard after
    /// shard), and the peak RSS of a streamed load.
    fn measure_nginx(&self) -> Result<NginxCells, String> {
        let dir = self.checkpoint(self.args.shard_mib)?;
        let files = shard_files(&dir);
        let total_bytes: u64 = files.iter().map(|f| f.1).sum();
        let ckpt_name = dir.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_owned();
        let nginx = support::Nginx::start(&self.work, "50m")?;
        let ckpt_url = nginx.url(&format!("{ckpt_name}/"));
        let (curl, load) = self.against_curl(&ckpt_url, &files, total_bytes)?;
        let (one_queue, sequential) = self.rate_limited(&nginx, &ckpt_name, &files, total_bytes)?;
        let (stream_rss_bytes, stream_cap_bytes) = self.stream_rss(&ckpt_url)?;
        Ok(NginxCells { curl, load, one_queue, sequential, stream_rss_bytes, stream_cap_bytes })
    }

    /// 1. nginx vs curl, interleaved so that both see the same machine state.
    fn against_curl(
        &self,
        ckpt_url: &str,
        files: &[(String, u64)],
        total_bytes: u64,
    ) -> Result<(Cell, Cell), String> {
        let cfg_path = self.work.join("curl-nginx.cfg");
        std::fs::write(&cfg_path, curl_config(ckpt_url, files, "")).map_err(|e| e.to_string())?;
        curl_run(&cfg_path, &[])?;
        load_run(&mut Cell::new("warm-up", 0), ckpt_url, &self.base_opts)?;
        let mut nginx_curl = Cell::new("nginx: curl --parallel-max 8, 8 MiB ranges", total_bytes);
        let mut nginx_load = Cell::new("nginx: open_remote + load, 8 in flight", 0);
        for _ in 0..self.args.runs {
            nginx_curl.seconds.push(curl_run(&cfg_path, &[])?);
            load_run(&mut nginx_load, ckpt_url, &self.base_opts)?;
        }
        Ok((nginx_curl, nginx_load))
    }

    /// 3. rate-limited nginx: one queue vs one shard after another.
    fn rate_limited(
        &self,
        nginx: &support::Nginx,
        ckpt_name: &str,
        files: &[(String, u64)],
        total_bytes: u64,
    ) -> Result<(Cell, Cell), String> {
        let slow_url = nginx.slow_url(&format!("{ckpt_name}/"));
        let mut one_queue = Cell::new("nginx 50 MB/s per connection: one queue, 32 in flight", 0);
        let mut sequential = Cell::new("nginx 50 MB/s per connection: shards one after another", total_bytes);
        // The client for the slow port (its connections and certificates), as for the fast one.
        let slow_location = Location::parse(&slow_url).map_err(|e| e.to_string())?;
        open_remote(&slow_location, &self.limited).map_err(|e| e.to_string())?;
        // All one-queue runs, then all shard-after-shard runs, each with a recycled arena (1 GiB for
        // the first, 128 MiB for the second): alternating the two sizes would defeat recycling and
        // bill page faults (and THP compaction stalls) to whichever came second.
        for _ in 0..self.args.runs {
            load_run(&mut one_queue, &slow_url, &self.limited)?;
        }
        for _ in 0..self.args.runs {
            let t = Instant::now();
            for (name, _) in files {
                let url = nginx.slow_url(&format!("{ckpt_name}/{name}"));
                let mut shard = Cell::new("shard", 0);
                load_run(&mut shard, &url, &self.limited)?;
            }
            sequential.seconds.push(t.elapsed().as_secs_f64());
        }
        Ok((one_queue, sequential))
    }

    /// Measurement 4, the peak RSS of a streamed load, in a fresh process so earlier arenas do
    /// not count: `(peak RSS, in-flight cap)`.
    fn stream_rss(&self, ckpt_url: &str) -> Result<(u64, u64), String> {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let probe = Command::new(exe)
            .args(["--rss-probe", ckpt_url, "--runtime-threads", &self.args.runtime_threads.to_string()])
            .output()
            .map_err(|e| format!("cannot start the RSS probe: {e}"))?;
        if !probe.status.success() {
            return Err(format!("RSS probe failed: {}", String::from_utf8_lossy(&probe.stderr)));
        }
        let probe_out = String::from_utf8_lossy(&probe.stdout);
        let mut fields = probe_out.split_whitespace().map(|f| f.parse::<u64>().unwrap_or(0));
        Ok((fields.next().unwrap_or(0), fields.next().unwrap_or(0)))
    }

    /// 2. s3rver vs curl --aws-sigv4 (smaller shards: s3rver keeps whole PUT bodies in memory).
    fn measure_s3rver(&self) -> Result<(Cell, Cell), String> {
        let s3_dir = self.checkpoint(self.args.s3_shard_mib)?;
        let s3_files = shard_files(&s3_dir);
        let s3_bytes: u64 = s3_files.iter().map(|f| f.1).sum();
        let s3 = support::S3rver::start()?;
        s3.upload_dir(&s3_dir, "bench")?;
        let s3_cfg = self.work.join("curl-s3.cfg");
        let base = format!("{}/{}/bench/", s3.endpoint(), support::BUCKET);
        std::fs::write(&s3_cfg, curl_config(&base, &s3_files, SIGV4)).map_err(|e| e.to_string())?;
        let s3_opts = RemoteOptions { store: s3.store_config(), ..self.base_opts.clone() };
        let s3_url = format!("s3://{}/bench/", support::BUCKET);
        let mut s3_curl = Cell::new("s3rver: curl --aws-sigv4 --parallel-max 8, 8 MiB ranges", s3_bytes);
        let mut s3_load = Cell::new("s3rver: open_remote + load, 8 in flight", 0);
        curl_run(&s3_cfg, &[])?;
        load_run(&mut Cell::new("warm-up", 0), &s3_url, &s3_opts)?;
        for _ in 0..self.args.runs {
            s3_curl.seconds.push(curl_run(&s3_cfg, &[])?);
            load_run(&mut s3_load, &s3_url, &s3_opts)?;
        }
        Ok((s3_curl, s3_load))
    }
}

/// The acceptance checks over the measured cells.
fn acceptance(n: &NginxCells, s3_curl: &Cell, s3_load: &Cell) -> [Check; 5] {
    let mib = |b: u64| b as f64 / 1048576.0;
    [
        Check {
            name: "nginx load / curl anchor",
            value: n.load.gbps() / n.curl.gbps(),
            target: 0.9,
            unit: "x",
            bound: Bound::AtLeast,
        },
        Check {
            name: "s3rver load / curl SigV4 anchor",
            value: s3_load.gbps() / s3_curl.gbps(),
            target: 0.9,
            unit: "x",
            bound: Bound::AtLeast,
        },
        Check {
            name: "rate-limited one queue, GB/s",
            value: n.one_queue.gbps(),
            target: 1.5,
            unit: "GB/s",
            bound: Bound::AtLeast,
        },
        Check {
            name: "rate-limited one queue / shards one after another",
            value: n.one_queue.gbps() / n.sequential.gbps(),
            target: 1.8,
            unit: "x",
            bound: Bound::AtLeast,
        },
        Check {
            name: "streamed load peak RSS (MiB) vs in-flight cap + 64 MiB",
            value: mib(n.stream_rss_bytes),
            target: mib(n.stream_cap_bytes + (64 << 20)),
            unit: "MiB",
            bound: Bound::AtMost,
        },
    ]
}

/// The report in Markdown: the cells, then the acceptance checks.
fn markdown_report(runs: usize, cells: &[&Cell], checks: &[Check], loadavg: (&str, &str)) -> String {
    let (load_before, load_after) = loadavg;
    let mut md = String::new();
    let _ = writeln!(md, "# tensora-remote bench\n");
    let _ = writeln!(
        md,
        "{runs} runs per cell, interleaved with their anchors; /proc/loadavg before: `{load_before}`, after: `{load_after}`.\n"
    );
    let _ = writeln!(
        md,
        "| cell | MB | median s | GB/s median | GB/s min–max | runs (s) |\n|---|---|---|---|---|---|"
    );
    for c in cells {
        let runs: Vec<String> = c.seconds.iter().map(|s| format!("{s:.3}")).collect();
        let (lo, hi) = c.gbps_range();
        let _ = writeln!(
            md,
            "| {} | {:.0} | {:.3} | {:.3} | {lo:.3}–{hi:.3} | {} |",
            c.name,
            c.bytes as f64 / 1e6,
            median(&c.seconds),
            c.gbps(),
            runs.join(" ")
        );
    }
    let _ = writeln!(md, "\n| acceptance | value | target | pass |\n|---|---|---|---|");
    for c in checks {
        let cmp = c.bound.symbol();
        let _ =
            writeln!(md, "| {} | {:.2} | {cmp} {:.2} {} | {} |", c.name, c.value, c.target, c.unit, c.pass());
    }
    md
}

/// The report as JSON: the cells, the acceptance checks and the streamed load's figures.
fn json_report(
    runs: usize,
    cells: &[&Cell],
    checks: &[Check],
    loadavg: (&str, &str),
    nginx: &NginxCells,
) -> serde_json::Value {
    let cells_json: Vec<_> = cells
        .iter()
        .map(|c| {
            let (lo, hi) = c.gbps_range();
            serde_json::json!({
                "name": c.name, "bytes": c.bytes, "seconds": c.seconds, "median_seconds": median(&c.seconds),
                "gbps_median": c.gbps(), "gbps_min": lo, "gbps_max": hi,
                "peak_rss_bytes": c.peak_rss_bytes, "requests": c.requests,
            })
        })
        .collect();
    let checks_json: Vec<_> = checks
        .iter()
        .map(|c| serde_json::json!({"name": c.name, "value": c.value, "target": c.target, "unit": c.unit, "pass": c.pass()}))
        .collect();
    serde_json::json!({
        "runs": runs, "loadavg_before": loadavg.0, "loadavg_after": loadavg.1,
        "cells": cells_json, "acceptance": checks_json,
        "stream_peak_rss_bytes": nginx.stream_rss_bytes, "stream_inflight_bytes_max": nginx.stream_cap_bytes,
    })
}

fn main() -> Result<(), String> {
    let args = parse_args()?;
    let base_opts = RemoteOptions {
        reads_inflight_max: 8,
        chunk_bytes: CHUNK_BYTES,
        runtime_threads: args.runtime_threads,
        ..RemoteOptions::default()
    };
    let limited = RemoteOptions { reads_inflight_max: 32, ..base_opts.clone() };
    if let Some(url) = &args.rss_probe {
        return rss_probe(url, &limited);
    }
    // The build's target directory (CARGO_TARGET_DIR when set, as cargo itself does).
    let target_dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let work = target_dir.join("tensora-remote-bench");
    let out_dir = args.out.clone().unwrap_or_else(|| work.join("report"));
    std::fs::create_dir_all(&out_dir).map_err(|e| e.to_string())?;
    let load_before = uptime();
    let bench = Bench { args: &args, work, base_opts, limited };
    let nginx = bench.measure_nginx()?;
    let (s3_curl, s3_load) = bench.measure_s3rver()?;

    let checks = acceptance(&nginx, &s3_curl, &s3_load);
    let cells = [&nginx.curl, &nginx.load, &nginx.one_queue, &nginx.sequential, &s3_curl, &s3_load];
    let load_after = uptime();
    let loadavg = (load_before.as_str(), load_after.as_str());
    let md = markdown_report(args.runs, &cells, &checks, loadavg);
    print!("{md}");
    std::fs::write(out_dir.join("report.md"), &md).map_err(|e| e.to_string())?;
    let doc = json_report(args.runs, &cells, &checks, loadavg, &nginx);
    std::fs::write(out_dir.join("report.json"), serde_json::to_vec_pretty(&doc).map_err(|e| e.to_string())?)
        .map_err(|e| e.to_string())?;
    eprintln!("wrote {}", out_dir.join("report.{md,json}").display());
    Ok(())
}
