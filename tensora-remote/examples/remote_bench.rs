//! Remote loads at real size against real local servers, each beside its anchors in the same run
//! (medians of `--runs`, with min–max, each cell stamped with the time it was measured):
//!
//! - `tinyllama` (2 × 1.1 GB), `shards8` (8 × 128 MiB), `one1g` (1 × 1 GB) from nginx: `curl
//!   --parallel --parallel-max 8` over the same 8 MiB ranges, tensora with the default (self-tuned)
//!   settings, and tensora at fixed depths (8, 32, 64 and 128: the default's start is 64, its
//!   most 128; a fixed 256 would be 128 here, as the load's 1 GiB budget holds 128 ranges), so
//!   that the default is compared with the best fixed one;
//! - `limited`: 8 × 128 MiB at 50 MB/s per connection (nginx `limit_rate`), the same cells (fixed
//!   32, 64 and 128);
//! - `cache`: 8 × 128 MiB without a cache, into a cold cache, from a warm cache, and a local load
//!   of the same files; the disk's write roofline for the same bytes, alone and beside the
//!   no-cache load (what a cold cache must do at least: load and write at once); and the
//!   no-cache / cold-cache pair again from the `limited` server, where the network bounds the load;
//! - `s3`: s3rver (8 × 32 MiB: s3rver holds PUT bodies in memory): curl `--aws-sigv4`, tensora, and
//!   Run:ai's model streamer (every tensor an owned buffer on both sides);
//! - `rss`: the peak RSS of a streamed load in a fresh process, against its in-flight cap.
//!
//! Every tensora load is a fresh `open_remote` + `load` with default `LoadOptions` (a fresh arena,
//! as `tensora load URL` has): the first-touch cost of the arena is part of every cell, on memory
//! freed a moment before (`relay`, the state `cargo xtask bench` gives its children; on a VM that
//! hands free memory back to its host, an idle machine's first touch costs several times more:
//! a fresh `tensora load` of the 2.2 GB checkpoint spent 70 % of its CPU zeroing pages there).
//!
//! Run: `cargo xtask bench --remote [--runs N] [--only GROUP,...]`, or `cargo run --release -p
//! tensora-remote --example remote_bench -- [--runs 5] [--only tinyllama,limited] [--out DIR]`,
//! which writes `DIR/report.{md,json}`. Needs nginx, s3rver and curl (see `tests/support/mod.rs`
//! for the install lines); the Run:ai cell needs its venv (the report names the install command
//! when it is missing).

#[path = "remote_bench/machine.rs"]
mod machine;
#[path = "remote_bench/peers.rs"]
mod peers;
#[path = "remote_bench/roofline.rs"]
mod roofline;
#[path = "remote_bench/spread.rs"]
mod spread;
#[path = "../tests/support/mod.rs"]
mod support;

use std::path::{Path, PathBuf};
use std::time::Instant;

use roofline::WriteRoofline;
use tensora_io::LoadOptions;
use tensora_remote::{CacheOptions, Location, RemoteOptions, Tuning, open_remote};

/// Cold-cache directories the cache group keeps before it reuses one (each holds about 1 GB).
const COLD_DIRS: usize = 4;
/// Runs per cell unless `--runs` says otherwise: single loads on the 2-core reference VM differ
/// by up to 3× within a cell, and a median of 3 moved by about ±20 % from run to run (docs/design.md,
/// "Measuring remote loads").
const RUNS_DEFAULT: usize = 5;
/// Upper bound on `--runs`.
const RUNS_MAX: usize = 99;
/// Every cell group, in the order they run.
const GROUPS: [&str; 7] = ["tinyllama", "shards8", "one1g", "limited", "cache", "s3", "rss"];

struct Args {
    runs: usize,
    only: Vec<String>,
    out: Option<PathBuf>,
    /// Child mode: stream-load this URL and print `peak_rss_bytes inflight_bytes_max`.
    rss_probe: Option<String>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        runs: RUNS_DEFAULT,
        only: GROUPS.iter().map(|g| (*g).to_owned()).collect(),
        out: None,
        rss_probe: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--runs" => args.runs = value()?.parse().map_err(|e| format!("--runs: {e}"))?,
            "--only" => args.only = value()?.split(',').map(str::to_owned).collect(),
            "--out" => args.out = Some(PathBuf::from(value()?)),
            "--rss-probe" => args.rss_probe = Some(value()?),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if !(1..=RUNS_MAX).contains(&args.runs) {
        return Err(format!("--runs must be 1..={RUNS_MAX}"));
    }
    if let Some(bad) = args.only.iter().find(|g| !GROUPS.contains(&g.as_str())) {
        return Err(format!("--only: unknown group {bad:?} (groups: {})", GROUPS.join(", ")));
    }
    Ok(args)
}

fn median(xs: &[f64]) -> f64 {
    let mut xs = xs.to_vec();
    xs.sort_by(f64::total_cmp);
    xs.get(xs.len() / 2).copied().unwrap_or(f64::NAN)
}

fn clock() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    format!("{:02}:{:02}:{:02} UTC", secs / 3600 % 24, secs / 60 % 60, secs % 60)
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// One measured configuration.
#[derive(Debug, Default)]
struct Cell {
    group: &'static str,
    name: String,
    bytes: u64,
    seconds: Vec<f64>,
    /// When its first and last run started, and the load average then.
    when: Vec<String>,
    /// Per run: its seconds and what the machine did meanwhile ([`machine::Counters`]), after
    /// what the run itself noted (the depth a self-tuned load settled on and the windows it
    /// measured; a cache's write-behind).
    notes: Vec<String>,
    error: Option<String>,
}

impl Cell {
    fn new(group: &'static str, name: &str) -> Cell {
        Cell { group, name: name.to_owned(), ..Cell::default() }
    }
    fn gbps(&self) -> f64 {
        spread::gbps(self.bytes, median(&self.seconds))
    }
    fn gbps_range(&self) -> (f64, f64) {
        let max_s = self.seconds.iter().copied().fold(f64::MIN, f64::max);
        let min_s = self.seconds.iter().copied().fold(f64::MAX, f64::min);
        (spread::gbps(self.bytes, max_s), spread::gbps(self.bytes, min_s))
    }
    /// Run `f` (returning seconds, bytes and a note), recording it or the first error.
    fn measure(&mut self, f: impl FnOnce() -> Result<(f64, u64, String), String>) {
        if self.error.is_some() {
            return;
        }
        self.when.push(format!("{} (load {})", clock(), loadavg()));
        let before = machine::Counters::now();
        match f() {
            Ok((seconds, bytes, note)) => {
                let machine = machine::Counters::now().since(&before);
                self.seconds.push(seconds);
                self.bytes = bytes;
                let note = if note.is_empty() { note } else { format!("{note} ") };
                self.notes.push(format!("{note}[{seconds:.3} s: {machine}]"));
            }
            Err(e) => self.error = Some(e),
        }
    }
}

/// One timed `open_remote` + `load` of `url` with default `LoadOptions`: seconds, bytes and the
/// depth the controller settled on, with the windows it measured.
fn tensora_load(url: &str, opts: &RemoteOptions) -> Result<(f64, u64, String), String> {
    let location = Location::parse(url).map_err(|e| e.to_string())?;
    let t = Instant::now();
    let mut loaded = open_remote(&location, opts)
        .and_then(|c| c.load(&LoadOptions::default()))
        .map_err(|e| e.to_string())?;
    let seconds = t.elapsed().as_secs_f64();
    // The model is ready at `seconds`; a cache's write-behind is waited for (and shown) before
    // the next cell starts.
    let r = loaded.wait_cache();
    // Opening (probes, listing, HEADs, header reads) is part of `seconds`, as in `tensora load`.
    let p = &r.load.phases;
    let mut notes = vec![format!(
        "opened in {:.3} s ({} requests), {} GETs",
        p.open + p.parse,
        r.open_requests,
        r.requests
    )];
    if let Some(c) = r.concurrency.as_ref().filter(|c| c.mode == "auto") {
        // The depth it ended at, and each window it measured (depth: GB/s).
        let probes: Vec<String> = c.probes.iter().map(|p| format!("{}: {:.2}", p.depth, p.gbps)).collect();
        notes.push(format!("depth {} ({})", c.depth, probes.join(", ")));
    }
    if let Some(c) = r.cache.as_ref().filter(|c| c.promoted > 0) {
        notes.push(format!("+{:.2} s written and durable behind", c.sync_seconds));
    }
    Ok((seconds, r.load.bytes_selected, notes.join(" ")))
}

/// Fault in `bytes` of huge-page memory and free it, so that the load timed next starts on 2 MiB
/// blocks freed a moment ago, as every child of `cargo xtask bench` does (tensora-bench's
/// relay). On a VM that hands free memory back to its host, a load's first-touch cost otherwise
/// depends on what the cell before it freed: the warm-cache load measured 0.54 s right after the
/// local load had freed its arena and 0.73-0.78 s after a remote cell, the local load 0.50-0.54 s
/// right after dropping the 1 GB of page cache it then read.
fn relay(bytes: u64) -> Result<(), String> {
    use tensora_io::{Arena, ArenaConfig, Prefault};
    let len_bytes = bytes.next_multiple_of(Arena::ALIGN_BYTES);
    let config = ArenaConfig { len_bytes, prefault: Prefault::PopulateWrite };
    Arena::new(&config).map(drop).map_err(|e| format!("relay memory: {e}"))
}

/// What [`page_cache`] does to a tree of files.
#[derive(Clone, Copy)]
enum Page {
    /// Evict every file's pages.
    Drop,
    /// Read every file once, so its pages are cached.
    Fill,
}

/// Evict or fill the page cache of every file under `dir` (at most 4 levels down).
fn page_cache(dir: &Path, what: Page) -> Result<(), String> {
    fn walk(dir: &Path, what: Page, depth: usize) -> std::io::Result<()> {
        for entry in std::fs::read_dir(dir)? {
            let path = entry?.path();
            if path.is_dir() && depth < 4 {
                walk(&path, what, depth + 1)?;
            } else if path.is_file() {
                let mut file = std::fs::File::open(&path)?;
                match what {
                    Page::Drop => tensora_sys::evict_file_cache(&file)?,
                    Page::Fill => {
                        std::io::copy(&mut file, &mut std::io::sink())?;
                    }
                }
            }
        }
        Ok(())
    }
    walk(dir, what, 0).map_err(|e| format!("page cache of {}: {e}", dir.display()))
}

/// A checkpoint shape of the bench.
struct Shape {
    group: &'static str,
    label: &'static str,
    shards: usize,
    tensors_per_shard: usize,
    tensor_bytes: u64,
    limited: bool,
    depths: &'static [usize],
}

const SHAPES: [Shape; 4] = [
    Shape {
        group: "tinyllama",
        label: "2 × 1.1 GB",
        shards: 2,
        tensors_per_shard: 22,
        tensor_bytes: 50_000_000,
        limited: false,
        depths: &[8, 32, 64, 128],
    },
    Shape {
        group: "shards8",
        label: "8 × 128 MiB",
        shards: 8,
        tensors_per_shard: 4,
        tensor_bytes: 32 << 20,
        limited: false,
        depths: &[8, 32, 64, 128],
    },
    Shape {
        group: "one1g",
        label: "1 × 1 GB",
        shards: 1,
        tensors_per_shard: 8,
        tensor_bytes: 125_000_000,
        limited: false,
        depths: &[8, 32, 64, 128],
    },
    Shape {
        group: "limited",
        label: "8 × 128 MiB, 50 MB/s per connection",
        shards: 8,
        tensors_per_shard: 4,
        tensor_bytes: 32 << 20,
        limited: true,
        depths: &[32, 64, 128],
    },
];

struct Bench {
    runs: usize,
    work: PathBuf,
    target_dir: PathBuf,
    nginx: support::Nginx,
    cells: Vec<Cell>,
}

impl Bench {
    /// The checkpoint directory of a shape (written unless an earlier run left it), its name
    /// under the nginx root.
    fn checkpoint(
        &self,
        shards: usize,
        tensors: usize,
        tensor_bytes: u64,
    ) -> Result<(PathBuf, String), String> {
        let name = format!("ckpt-{shards}x{tensors}x{tensor_bytes}");
        let dir = self.work.join(&name);
        if peers::shard_files(&dir).len() != shards {
            std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
            eprintln!("writing {shards} shards of {tensors} × {tensor_bytes} bytes into {}", dir.display());
            support::write_checkpoint(&dir, shards, tensors, tensor_bytes);
        }
        Ok((dir, name))
    }

    /// One shape: curl, the default and each fixed depth, interleaved run by run.
    fn shape(&mut self, shape: &Shape) -> Result<(), String> {
        let (dir, name) = self.checkpoint(shape.shards, shape.tensors_per_shard, shape.tensor_bytes)?;
        let url = if shape.limited {
            self.nginx.slow_url(&format!("{name}/"))
        } else {
            self.nginx.url(&format!("{name}/"))
        };
        let files = peers::shard_files(&dir);
        let cfg = self.work.join(format!("curl-{}.cfg", shape.group));
        std::fs::write(&cfg, peers::curl_config(&url, &files, "")).map_err(|e| e.to_string())?;
        let total: u64 = files.iter().map(|f| f.1).sum();
        let mut curl =
            Cell::new(shape.group, &format!("{}: curl --parallel-max 8, 8 MiB ranges", shape.label));
        // The default, then each fixed depth.
        let mut tensora: Vec<(Cell, RemoteOptions)> =
            vec![(Cell::new(shape.group, &format!("{}: tensora, default (self-tuned)", shape.label)), {
                RemoteOptions::default()
            })];
        tensora.extend(shape.depths.iter().map(|&d| {
            let cell = Cell::new(shape.group, &format!("{}: tensora, --queue-depth {d}", shape.label));
            (cell, RemoteOptions { reads_inflight_max: d, tuning: Tuning::Fixed, ..RemoteOptions::default() })
        }));
        // Warm-up: the page cache holds the files, the servers have their workers.
        peers::curl_run(&cfg)?;
        for round in 0..self.runs {
            curl.measure(|| peers::curl_run(&cfg).map(|s| (s, total, String::new())));
            // Each load starts on memory freed a moment ago (`relay`), in an order rotated each
            // round (no cell always follows curl or the same other cell).
            let n = tensora.len();
            for k in 0..n {
                let (cell, opts) = &mut tensora[(k + round) % n];
                relay(total)?;
                cell.measure(|| tensora_load(&url, opts));
            }
        }
        self.cells.push(curl);
        self.cells.extend(tensora.into_iter().map(|(cell, _)| cell));
        Ok(())
    }

    /// The cache cells on 8 × 128 MiB: no cache, a cold cache (emptied before each run), a warm
    /// cache, and a local load of the same files.
    fn cache(&mut self) -> Result<(), String> {
        let (dir, name) = self.checkpoint(8, 4, 32 << 20)?;
        let url = self.nginx.url(&format!("{name}/"));
        let cache_dir = self.work.join("cache");
        let with_cache = |dir: &Path| RemoteOptions {
            cache: Some(CacheOptions {
                dir: dir.to_path_buf(),
                size_max_bytes: None,
                offline: false,
                writes: tensora_remote::CacheWrites::default(),
            }),
            ..RemoteOptions::default()
        };
        let cold_dir = self.work.join("cache-cold");
        let _ = std::fs::remove_dir_all(&cold_dir);
        let mut none = Cell::new("cache", "8 × 128 MiB: no cache");
        let mut cold = Cell::new(
            "cache",
            "8 × 128 MiB: cold cache (written behind the load from where the ranges landed)",
        );
        // The same pair where the network, not the CPU, bounds the load (the `limited` shape's
        // server): what a cold cache costs on a link slower than the disk.
        let slow_url = self.nginx.slow_url(&format!("{name}/"));
        let mut slow_none = Cell::new("cache", "8 × 128 MiB, 50 MB/s per connection: no cache");
        let mut slow_cold = Cell::new("cache", "8 × 128 MiB, 50 MB/s per connection: cold cache");
        let mut warm = Cell::new(
            "cache",
            "8 × 128 MiB: warm cache, page cache dropped (one HEAD per object, local files)",
        );
        let mut local = Cell::new("cache", "8 × 128 MiB: local load of the same files, page cache dropped");
        let mut write = Cell::new(
            "cache",
            "8 × 128 MiB: the disk's write roofline (the same bytes, O_DIRECT, 8 MiB pieces, into new preallocated files)",
        );
        let mut both = Cell::new(
            "cache",
            "8 × 128 MiB: no cache and the write roofline side by side (until both are done)",
        );
        let _ = std::fs::remove_dir_all(&cache_dir);
        let (_, bytes, _) = tensora_load(&url, &with_cache(&cache_dir))?;
        for round in 0..self.runs {
            // Each cold load writes into a directory of a ring of COLD_DIRS (about 1 GB each on a
            // nearly full disk), emptied right before it is used again and all removed after the
            // group. Two cold loads a round: from the third round on, each follows the removal of
            // a 1 GB copy, whose discards the disk may still run during the load.
            let fresh = |k: usize| {
                let dir = cold_dir.join(((2 * round + k) % COLD_DIRS).to_string());
                let _ = std::fs::remove_dir_all(&dir);
                dir
            };
            // No cache and a cold cache, in alternating order, each on memory freed a moment ago
            // (`relay`): neither always follows the other's disk writes or page-cache fills.
            for (k, (u, none, cold)) in
                [(&url, &mut none, &mut cold), (&slow_url, &mut slow_none, &mut slow_cold)]
                    .into_iter()
                    .enumerate()
            {
                for order in 0..2 {
                    if (order + round) % 2 == 0 {
                        relay(bytes)?;
                        none.measure(|| tensora_load(u, &RemoteOptions::default()));
                    } else {
                        let dir = fresh(k);
                        relay(bytes)?;
                        cold.measure(|| tensora_load(u, &with_cache(&dir)));
                    }
                }
            }
            let roofline_dir = cold_dir.join("roofline");
            write.measure(|| {
                let mut writes = WriteRoofline::prepare(&roofline_dir, bytes)?;
                Ok((writes.run()?, writes.bytes(), String::new()))
            });
            // What a cold cache must do at least: the same load and the same writes at once.
            both.measure(|| {
                let mut writes = WriteRoofline::prepare(&roofline_dir, bytes)?;
                relay(bytes)?;
                let t = Instant::now();
                let (loaded, written) = std::thread::scope(|s| {
                    let written = s.spawn(|| writes.run());
                    let loaded = tensora_load(&url, &RemoteOptions::default());
                    (loaded, written.join().unwrap_or_else(|_| Err("the writing thread panicked".into())))
                });
                let seconds = t.elapsed().as_secs_f64();
                let ((load_s, _, _), write_s) = (loaded?, written?);
                Ok((seconds, bytes, format!("load {load_s:.3} s, writes {write_s:.3} s")))
            });
            // The copies' pages and the local files' are both dropped (a cache whose copies fit
            // keeps them in the page cache), so both are read from the disk here: the same state
            // on both sides, in alternating order and each on memory freed a moment ago. Without
            // the relay the warm cell, always right after a remote cell, faulted its arena into
            // memory the VM had handed back (warm / local 0.58), while the local cell came right
            // after dropping the 1 GB of page cache it then read.
            for k in 0..2 {
                if (k + round) % 2 == 0 {
                    page_cache(&cache_dir.join("objects"), Page::Drop)?;
                    relay(bytes)?;
                    warm.measure(|| tensora_load(&url, &with_cache(&cache_dir)));
                } else {
                    page_cache(&dir, Page::Drop)?;
                    relay(bytes)?;
                    local.measure(|| {
                        let t = Instant::now();
                        let loaded = tensora_io::load_path(&dir, &LoadOptions::default())
                            .map_err(|e| e.to_string())?;
                        Ok((t.elapsed().as_secs_f64(), loaded.report().bytes_selected, String::new()))
                    });
                }
            }
            // nginx serves these files to the next round's cells from the page cache.
            page_cache(&dir, Page::Fill)?;
        }
        let _ = std::fs::remove_dir_all(&cold_dir);
        self.cells.extend([none, cold, write, both, slow_none, slow_cold, warm, local]);
        Ok(())
    }

    /// s3rver: curl SigV4, tensora and Run:ai's streamer over the same objects.
    fn s3(&mut self) -> Result<(), String> {
        let (dir, _) = self.checkpoint(8, 4, 8 << 20)?;
        let files = peers::shard_files(&dir);
        let total: u64 = files.iter().map(|f| f.1).sum();
        let s3 = support::S3rver::start()?;
        s3.upload_dir(&dir, "bench")?;
        let cfg = self.work.join("curl-s3.cfg");
        let base = format!("{}/{}/bench/", s3.endpoint(), support::BUCKET);
        std::fs::write(&cfg, peers::curl_config(&base, &files, peers::SIGV4)).map_err(|e| e.to_string())?;
        let opts = RemoteOptions { store: s3.store_config(), ..RemoteOptions::default() };
        let url = format!("s3://{}/bench/", support::BUCKET);
        let urls: Vec<String> =
            files.iter().map(|(n, _)| format!("s3://{}/bench/{n}", support::BUCKET)).collect();
        let (venv, install) = peers::runai_venv(&self.target_dir);
        let mut curl = Cell::new("s3", "8 × 32 MiB s3rver: curl --aws-sigv4 --parallel-max 8");
        let mut tensora = Cell::new("s3", "8 × 32 MiB s3rver: tensora, default");
        let mut runai = Cell::new("s3", "8 × 32 MiB s3rver: Run:ai model streamer (owned tensors)");
        if !venv.join("bin/python3").exists() {
            runai.error = Some(format!("not installed: enable it with `{install}`"));
        }
        peers::curl_run(&cfg)?;
        for _ in 0..self.runs {
            curl.measure(|| peers::curl_run(&cfg).map(|s| (s, total, String::new())));
            tensora.measure(|| tensora_load(&url, &opts));
            runai.measure(|| {
                peers::runai_run(&venv, &s3.endpoint(), &urls).map(|(s, b)| (s, b, String::new()))
            });
        }
        self.cells.extend([curl, tensora, runai]);
        Ok(())
    }

    /// The peak RSS of a streamed load in a fresh process: `(peak RSS, in-flight cap)` as a cell.
    fn rss(&mut self) -> Result<(), String> {
        let (_, name) = self.checkpoint(8, 4, 32 << 20)?;
        let url = self.nginx.url(&format!("{name}/"));
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let probe = std::process::Command::new(exe)
            .args(["--rss-probe", &url])
            .output()
            .map_err(|e| e.to_string())?;
        if !probe.status.success() {
            return Err(format!("RSS probe failed: {}", String::from_utf8_lossy(&probe.stderr)));
        }
        let text = String::from_utf8_lossy(&probe.stdout);
        let mut fields = text.split_whitespace().map(|f| f.parse::<u64>().unwrap_or(0));
        let mut cell = Cell::new("rss", "streamed load: peak RSS (bytes) vs in-flight cap (bytes)");
        cell.seconds = vec![fields.next().unwrap_or(0) as f64];
        cell.bytes = fields.next().unwrap_or(0);
        cell.when.push(format!("{} (load {})", clock(), loadavg()));
        self.cells.push(cell);
        Ok(())
    }
}

/// Child mode: a streamed load of `url`, printing its peak RSS and in-flight cap.
fn rss_probe(url: &str) -> Result<(), String> {
    let location = Location::parse(url).map_err(|e| e.to_string())?;
    let checkpoint = open_remote(&location, &RemoteOptions::default()).map_err(|e| e.to_string())?;
    let mut sum = 0u64;
    let report = checkpoint
        .load_streaming(&LoadOptions { budget_bytes: 256 << 20, ..LoadOptions::default() }, |t| {
            sum = sum.wrapping_add(t.bytes().iter().step_by(4096).map(|&b| u64::from(b)).sum::<u64>());
            Ok(())
        })
        .map_err(|e| e.to_string())?;
    println!("{} {} {sum}", report.load.peak_rss_bytes, report.inflight_bytes_max);
    Ok(())
}

#[path = "remote_bench/report.rs"]
mod report;

fn main() -> Result<(), String> {
    let args = parse_args()?;
    if let Some(url) = &args.rss_probe {
        return rss_probe(url);
    }
    // The build's target directory (CARGO_TARGET_DIR when set, as cargo itself does).
    let target_dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let work = target_dir.join("tensora-remote-bench");
    let out_dir = args.out.clone().unwrap_or_else(|| work.join("report"));
    std::fs::create_dir_all(&out_dir).map_err(|e| e.to_string())?;
    let before = format!("{} (load {})", clock(), loadavg());
    let nginx = support::Nginx::start(&work, "50m")?;
    let mut bench = Bench { runs: args.runs, work, target_dir, nginx, cells: Vec::new() };
    for group in GROUPS.iter().filter(|g| args.only.iter().any(|o| o == *g)) {
        let result = match *group {
            "cache" => bench.cache(),
            "s3" => bench.s3(),
            "rss" => bench.rss(),
            _ => match SHAPES.iter().find(|s| s.group == *group) {
                Some(shape) => bench.shape(shape),
                None => Err(format!("no shape {group}")),
            },
        };
        if let Err(e) = result {
            let mut cell = Cell::new(group, &format!("{group}: setup"));
            cell.error = Some(e);
            bench.cells.push(cell);
        }
    }
    let after = format!("{} (load {})", clock(), loadavg());
    let checks = report::acceptance(&bench.cells);
    let md = report::markdown(args.runs, &bench.cells, &checks, (&before, &after));
    print!("{md}");
    std::fs::write(out_dir.join("report.md"), &md).map_err(|e| e.to_string())?;
    let doc = report::json(args.runs, &bench.cells, &checks, (&before, &after));
    std::fs::write(out_dir.join("report.json"), serde_json::to_vec_pretty(&doc).map_err(|e| e.to_string())?)
        .map_err(|e| e.to_string())?;
    eprintln!("wrote {}", out_dir.join("report.{md,json}").display());
    Ok(())
}
