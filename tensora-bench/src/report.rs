//! The bench's results: every sample, the machine it ran on, and three renderings (Markdown table,
//! JSON, SVG chart).

use std::fmt::Write as _;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::stats::{Summary, ratio};

/// Bump when the JSON shape changes.
pub const SCHEMA_VERSION: u32 = 1;

/// What is being measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// A machine limit (pread into a hugepage arena, O_DIRECT, buffered read).
    Roofline,
    /// A Tensora backend, or `auto`.
    Backend,
    /// Code users run today (safetensors-rs, HF Python).
    Peer,
}

/// Page cache state at the start of each run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Cache {
    /// Files in the page cache (read once before the timed runs).
    Warm,
    /// Dropped before every run (and before the warm-up).
    Cold,
}

impl Cache {
    /// Lower-case name.
    pub const fn as_str(self) -> &'static str {
        match self {
            Cache::Warm => "warm",
            Cache::Cold => "cold",
        }
    }
}

/// Which tensors are loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scope {
    /// Every tensor (rooflines: every byte of every file).
    Full,
    /// Every tenth tensor.
    Partial,
}

impl Scope {
    /// Lower-case name.
    pub const fn as_str(self) -> &'static str {
        match self {
            Scope::Full => "full",
            Scope::Partial => "partial",
        }
    }
}

/// Where the loaded bytes end up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// All selected tensors held at once.
    Owned,
    /// Tensors handed out one by one under an in-flight budget.
    Streaming,
    /// Rooflines: bytes read and discarded (or overwritten).
    Raw,
    /// Zero-copy views of private file mappings (`Residence::Mapped`): no fresh memory, no copy.
    Mapped,
}

impl Mode {
    /// Lower-case name.
    pub const fn as_str(self) -> &'static str {
        match self {
            Mode::Owned => "owned",
            Mode::Streaming => "streaming",
            Mode::Raw => "raw",
            Mode::Mapped => "mapped",
        }
    }
}

/// Outcome of a cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Status {
    /// Run, with samples.
    Ok,
    /// Not run, for the stated reason (e.g. Python without safetensors).
    Skipped,
    /// Run and failed, with the error as the reason.
    Failed,
}

/// One timed run.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// Wall-clock seconds of the run.
    pub seconds: f64,
    /// Bytes of tensor data loaded (rooflines: file bytes read).
    pub bytes: u64,
    /// `bytes` over `seconds`, in GB/s (10^9 bytes).
    pub gbps: f64,
}

/// Everything measured for one (fixture, subject, cache, scope, mode).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cell {
    /// The fixture's name.
    pub fixture: String,
    /// Who was measured: a backend name, `auto`, a peer or a roofline.
    pub subject: String,
    /// What kind of subject that is.
    pub kind: Kind,
    /// Page cache state at the start of each run.
    pub cache: Cache,
    /// Which tensors were loaded.
    pub scope: Scope,
    /// Where the loaded bytes ended up.
    pub mode: Mode,
    /// Whether it ran.
    pub status: Status,
    /// Why it was skipped or how it failed.
    pub reason: Option<String>,
    /// Timed runs, warm-up excluded.
    pub samples: Vec<Sample>,
    /// GB/s over `samples`.
    pub gbps: Option<Summary>,
    /// The roofline this cell is compared with (warm or device), GB/s.
    pub roofline_gbps: Option<f64>,
    /// Median GB/s divided by `roofline_gbps`.
    pub ratio: Option<f64>,
    /// Subject-specific details of the last run (e.g. a Tensora load report).
    pub details: Option<serde_json::Value>,
}

impl Cell {
    /// A cell that has not run yet.
    pub fn new(fixture: &str, subject: &str, kind: Kind, cache: Cache, scope: Scope, mode: Mode) -> Cell {
        Cell {
            fixture: fixture.to_string(),
            subject: subject.to_string(),
            kind,
            cache,
            scope,
            mode,
            status: Status::Ok,
            reason: None,
            samples: Vec::new(),
            gbps: None,
            roofline_gbps: None,
            ratio: None,
            details: None,
        }
    }

    /// Record the timed samples.
    pub fn with_samples(mut self, samples: Vec<Sample>) -> Cell {
        self.gbps = Summary::of(&samples.iter().map(|s| s.gbps).collect::<Vec<_>>());
        self.samples = samples;
        self.status = Status::Ok;
        self
    }

    /// Mark as skipped.
    pub fn skipped(mut self, reason: impl Into<String>) -> Cell {
        self.status = Status::Skipped;
        self.reason = Some(reason.into());
        self
    }

    /// Mark as failed.
    pub fn failed(mut self, error: &anyhow::Error) -> Cell {
        self.status = Status::Failed;
        self.reason = Some(format!("{error:#}"));
        self
    }

    /// Median GB/s of the samples.
    pub(crate) fn median(&self) -> Option<f64> {
        self.gbps.map(|s| s.median)
    }

    /// For `auto`: the backend and I/O mode its last run chose (from the load report in
    /// `details`), e.g. `"sync/buffered"`.
    pub fn chosen_backend(&self) -> Option<String> {
        if self.kind != Kind::Backend || self.subject != "auto" {
            return None;
        }
        let d = self.details.as_ref()?;
        let backend = d.get("backend")?.as_str()?;
        Some(match d.get("io_mode").and_then(|m| m.as_str()) {
            Some(mode) => format!("{backend}/{mode}"),
            None => backend.to_string(),
        })
    }
}

/// The machine the numbers came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Machine {
    /// Kernel release (`/proc/sys/kernel/osrelease`).
    pub kernel: String,
    /// CPU model name (`/proc/cpuinfo`).
    pub cpu_model: String,
    /// Logical CPUs available to the process.
    pub cores: usize,
    /// Physical memory (`MemTotal` of `/proc/meminfo`).
    pub mem_total_bytes: u64,
    /// `/sys/kernel/mm/transparent_hugepage/enabled`.
    pub transparent_hugepage: String,
    /// Filesystem type of the fixtures (from `/proc/mounts`).
    pub fixture_filesystem: String,
    /// Seconds since the Unix epoch when the run started.
    pub started_unix_seconds: u64,
}

impl Machine {
    /// Read the facts from `/proc` and `/sys`; unknown facts become `"unknown"` or 0.
    pub fn detect(fixture_dir: &std::path::Path) -> Machine {
        let read = |p: &str| std::fs::read_to_string(p).map(|s| s.trim().to_string()).ok();
        let cpu_model = read("/proc/cpuinfo")
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split(':').nth(1))
                    .map(str::trim)
                    .map(String::from)
            })
            .unwrap_or_else(|| "unknown".to_string());
        let mem_total_bytes = read("/proc/meminfo")
            .and_then(|s| {
                let line = s.lines().find(|l| l.starts_with("MemTotal:"))?.to_string();
                line.split_whitespace().nth(1)?.parse::<u64>().ok()
            })
            .map_or(0, |kib| kib * 1024);
        Machine {
            kernel: read("/proc/sys/kernel/osrelease").unwrap_or_else(|| "unknown".to_string()),
            cpu_model,
            cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
            mem_total_bytes,
            transparent_hugepage: read("/sys/kernel/mm/transparent_hugepage/enabled")
                .unwrap_or_else(|| "unknown".to_string()),
            fixture_filesystem: filesystem_of(fixture_dir).unwrap_or_else(|| "unknown".to_string()),
            started_unix_seconds: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        }
    }
}

/// Filesystem type of the longest mount point that is a prefix of `path`.
fn filesystem_of(path: &std::path::Path) -> Option<String> {
    let path = std::fs::canonicalize(path).ok()?;
    let mounts = std::fs::read_to_string("/proc/mounts").ok()?;
    mounts
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_dev, mount, fs) = (f.next()?, f.next()?, f.next()?);
            path.starts_with(mount).then(|| (mount.len(), fs.to_string()))
        })
        .max_by_key(|(len, _)| *len)
        .map(|(_, fs)| fs)
}

/// A generated (or reused) fixture.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FixtureFacts {
    /// Directory name, also the name in the tables.
    pub name: String,
    /// Where it lives.
    pub path: String,
    /// Number of data files.
    pub files: usize,
    /// Tensors over all files.
    pub tensors: u64,
    /// Sum of tensor data bytes.
    pub data_len_bytes: u64,
    /// Sum of file sizes (headers included).
    pub files_len_bytes: u64,
    /// Whether this run generated it (false: reused, manifest matched).
    pub generated: bool,
    /// Time spent generating it (0 when reused).
    pub generate_seconds: f64,
}

/// The limits of one fixture.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rooflines {
    /// The fixture's name.
    pub fixture: String,
    /// Best median of the warm rooflines (pread into hugepages).
    pub warm_gbps: Option<f64>,
    /// Best median of the cold rooflines.
    pub device_gbps: Option<f64>,
    /// Which cold roofline won.
    pub device_subject: Option<String>,
}

/// How the run was configured.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunFacts {
    /// Fixture size (`small` or `full`).
    pub size: String,
    /// Timed runs per cell.
    pub runs: usize,
    /// Untimed warm-up runs before them.
    pub warmup_runs: usize,
    /// Whether the cold cells ran.
    pub cold: bool,
    /// Whether only the `--quick` subset ran.
    pub quick: bool,
    /// Seed of the fixture data.
    pub seed: u64,
    /// In-flight budget of the streaming cells.
    pub streaming_budget_bytes: u64,
    /// How cold runs dropped the page cache (`None` when no cold cell ran).
    pub cache_drop: Option<String>,
}

/// The whole result of a bench run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// [`SCHEMA_VERSION`] of this document.
    pub schema_version: u32,
    /// How the run was configured.
    pub run: RunFacts,
    /// The machine it ran on.
    pub machine: Machine,
    /// The fixtures measured.
    pub fixtures: Vec<FixtureFacts>,
    /// Fixtures that could not be produced, with the reason.
    pub fixtures_skipped: Vec<(String, String)>,
    /// Each fixture's rooflines (from its roofline cells).
    pub rooflines: Vec<Rooflines>,
    /// Every measured (or skipped, or failed) cell.
    pub cells: Vec<Cell>,
    /// Paired acceptance runs (see [`crate::paired`]).
    #[serde(default)]
    pub pairs: Vec<crate::paired::Pair>,
}

/// Roofline subject names.
pub const ROOFLINE_WARM: &str = "roofline: pread 2 threads -> hugepages";
/// Cold O_DIRECT roofline.
pub const ROOFLINE_DIRECT: &str = "roofline: O_DIRECT QD32 8MiB";
/// Cold buffered roofline.
pub const ROOFLINE_BUFFERED: &str = "roofline: buffered pread 2 threads";
/// The same rooflines measured again after the loaders of a fixture (a virtual disk's speed drifts
/// within a run; the better of the two passes is the roofline).
pub const ROOFLINE_WARM_AGAIN: &str = "roofline (again): pread 2 threads -> hugepages";
/// See [`ROOFLINE_WARM_AGAIN`].
pub const ROOFLINE_DIRECT_AGAIN: &str = "roofline (again): O_DIRECT QD32 8MiB";
/// See [`ROOFLINE_WARM_AGAIN`].
pub const ROOFLINE_BUFFERED_AGAIN: &str = "roofline (again): buffered pread 2 threads";

impl Report {
    /// Compute each fixture's rooflines from its roofline cells (the best median of each cache
    /// state) and fill every cell's ratio: warm cells against the warm roofline, cold cells
    /// against the device roofline.
    pub fn compute_rooflines(&mut self) {
        let mut names: Vec<String> = Vec::new();
        for c in &self.cells {
            if !names.contains(&c.fixture) {
                names.push(c.fixture.clone());
            }
        }
        self.rooflines = names
            .iter()
            .map(|f| {
                // The best median among this fixture's roofline cells of a cache state.
                let best = |cache: Cache| {
                    self.cells
                        .iter()
                        .filter(|c| &c.fixture == f && c.kind == Kind::Roofline && c.cache == cache)
                        .filter_map(|c| c.median().map(|m| (c.subject.as_str(), m)))
                        .max_by(|a, b| a.1.total_cmp(&b.1))
                };
                let device = best(Cache::Cold);
                Rooflines {
                    fixture: f.clone(),
                    warm_gbps: best(Cache::Warm).map(|w| w.1),
                    device_gbps: device.map(|d| d.1),
                    device_subject: device.map(|d| d.0.to_string()),
                }
            })
            .collect();
        for c in &mut self.cells {
            let Some(r) = self.rooflines.iter().find(|r| r.fixture == c.fixture) else { continue };
            c.roofline_gbps = match c.cache {
                Cache::Warm => r.warm_gbps,
                Cache::Cold => r.device_gbps,
            };
            c.ratio = match (c.median(), c.roofline_gbps) {
                (Some(m), Some(r)) => ratio(m, r),
                _ => None,
            };
        }
    }

    /// The Markdown report: run facts, then one table per fixture.
    pub fn to_markdown(&self) -> String {
        let mut s = String::new();
        self.markdown_facts(&mut s);
        if !self.pairs.is_empty() {
            self.markdown_pairs(&mut s);
        }
        for f in &self.fixtures {
            self.markdown_fixture(f, &mut s);
        }
        s
    }

    /// The title, the machine, the run's configuration and the fixtures that were skipped.
    fn markdown_facts(&self, s: &mut String) {
        let m = &self.machine;
        let _ = writeln!(s, "# Tensora bench\n");
        let _ = writeln!(
            s,
            "Machine: {} cores ({}), {:.1} GiB RAM, Linux {}, THP `{}`, fixtures on {}.  ",
            m.cores,
            m.cpu_model,
            m.mem_total_bytes as f64 / f64::from(1u32 << 30),
            m.kernel,
            m.transparent_hugepage,
            m.fixture_filesystem
        );
        let r = &self.run;
        let _ = writeln!(
            s,
            "Run: size {}, {} timed runs per cell after {} warm-up, seed {:#x}{}. GB = 10^9 bytes.  ",
            r.size,
            r.runs,
            r.warmup_runs,
            r.seed,
            if r.quick { ", quick subset" } else { "" }
        );
        let _ =
            writeln!(s, "Cold cache: {}.\n", r.cache_drop.as_deref().unwrap_or("not measured (--no-cold)"));
        for (name, why) in &self.fixtures_skipped {
            let _ = writeln!(s, "Fixture `{name}` skipped: {why}.  ");
        }
    }

    /// The acceptance table of the paired runs.
    fn markdown_pairs(&self, s: &mut String) {
        s.push_str(
            "\n## Acceptance, paired runs\n\nThe loader and its roofline alternately, back to back, \
             order alternating; the ratio is taken per pair, so drift within the run cancels.\n\n",
        );
        s.push_str("| fixture | cache | loader | loader GB/s | anchor | anchor GB/s | ratio median (min..max) | goal |\n");
        s.push_str("|---|---|---|---:|---|---:|---:|---|\n");
        let fmt = |v: &[f64]| {
            crate::stats::Summary::of(v)
                .map_or("-".to_string(), |g| format!("{:.2} ({:.2}..{:.2})", g.median, g.min, g.max))
        };
        for p in &self.pairs {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} | {} | {:.2}: {} |",
                p.fixture,
                p.cache.as_str(),
                p.subject,
                fmt(&p.subject_gbps),
                p.anchor,
                fmt(&p.anchor_gbps),
                fmt(&p.ratios),
                p.goal,
                p.verdict()
            );
        }
    }

    /// One fixture's section: its size, its rooflines and a row per cell (nothing when it has no
    /// cells).
    fn markdown_fixture(&self, f: &FixtureFacts, s: &mut String) {
        let cells: Vec<&Cell> = self.cells.iter().filter(|c| c.fixture == f.name).collect();
        if cells.is_empty() {
            return;
        }
        let _ = writeln!(
            s,
            "\n## {} — {} tensors in {} file(s), {:.3} GB of tensor data\n",
            f.name,
            f.tensors,
            f.files,
            f.data_len_bytes as f64 / 1e9
        );
        if let Some(rl) = self.rooflines.iter().find(|r| r.fixture == f.name) {
            let _ = writeln!(
                s,
                "Warm roofline {}; device roofline {}{}.\n",
                fmt_gbps(rl.warm_gbps),
                fmt_gbps(rl.device_gbps),
                rl.device_subject.as_deref().map(|d| format!(" ({d})")).unwrap_or_default()
            );
        }
        s.push_str("| subject | cache | scope | mode | median GB/s | min | max | vs roofline | note |\n");
        s.push_str("|---|---|---|---|---:|---:|---:|---:|---|\n");
        for c in cells {
            let _ = writeln!(s, "{}", markdown_row(c));
        }
    }

    /// Pretty JSON.
    pub fn to_json(&self) -> Result<String> {
        serde_json::to_string_pretty(self).context("serialise the report")
    }
}

fn fmt_gbps(v: Option<f64>) -> String {
    v.map_or("not measured".to_string(), |v| format!("{v:.2} GB/s"))
}

/// A cell's row in its fixture's table (pipes and line breaks in the note made harmless).
fn markdown_row(c: &Cell) -> String {
    let (median, min, max) = match c.gbps {
        Some(g) => (format!("{:.2}", g.median), format!("{:.2}", g.min), format!("{:.2}", g.max)),
        None => ("-".to_string(), "-".to_string(), "-".to_string()),
    };
    let vs = c.ratio.map_or("-".to_string(), |r| format!("{:.0} %", r * 100.0));
    let note = match c.status {
        Status::Ok => c.chosen_backend().map(|b| format!("ran {b}")).unwrap_or_default(),
        Status::Skipped => format!("skipped: {}", c.reason.as_deref().unwrap_or("")),
        Status::Failed => format!("FAILED: {}", c.reason.as_deref().unwrap_or("")),
    };
    format!(
        "| {} | {} | {} | {} | {median} | {min} | {max} | {vs} | {} |",
        c.subject,
        c.cache.as_str(),
        c.scope.as_str(),
        c.mode.as_str(),
        note.replace('|', "/").replace('\n', " ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(gbps: f64) -> Sample {
        Sample { seconds: 1.0 / gbps, bytes: 1_000_000_000, gbps }
    }

    pub(crate) fn example() -> Report {
        let f = "m";
        let cells = vec![
            Cell::new(f, ROOFLINE_WARM, Kind::Roofline, Cache::Warm, Scope::Full, Mode::Raw)
                .with_samples(vec![sample(10.0), sample(8.0), sample(12.0)]),
            Cell::new(f, ROOFLINE_DIRECT, Kind::Roofline, Cache::Cold, Scope::Full, Mode::Raw)
                .with_samples(vec![sample(2.0)]),
            Cell::new(f, ROOFLINE_BUFFERED, Kind::Roofline, Cache::Cold, Scope::Full, Mode::Raw)
                .with_samples(vec![sample(1.0)]),
            Cell::new(f, "sync", Kind::Backend, Cache::Warm, Scope::Full, Mode::Owned)
                .with_samples(vec![sample(5.0), sample(6.0)]),
            Cell::new(f, "sync", Kind::Backend, Cache::Cold, Scope::Full, Mode::Owned)
                .with_samples(vec![sample(1.5)]),
            Cell::new(f, "hf-python", Kind::Peer, Cache::Warm, Scope::Full, Mode::Owned).skipped("no module"),
            Cell {
                details: Some(serde_json::json!({ "backend": "io-uring", "io_mode": "direct" })),
                ..Cell::new(f, "auto", Kind::Backend, Cache::Cold, Scope::Partial, Mode::Owned)
                    .with_samples(vec![sample(1.0)])
            },
            Cell::new(f, "x", Kind::Peer, Cache::Warm, Scope::Partial, Mode::Streaming)
                .failed(&anyhow::anyhow!("boom | pipe")),
            // Measured again later, faster: the device roofline is the better pass.
            Cell::new(f, ROOFLINE_DIRECT_AGAIN, Kind::Roofline, Cache::Cold, Scope::Full, Mode::Raw)
                .with_samples(vec![sample(2.5)]),
        ];
        let mut r = Report {
            schema_version: SCHEMA_VERSION,
            run: RunFacts {
                size: "small".into(),
                runs: 3,
                warmup_runs: 1,
                cold: true,
                quick: true,
                seed: 1,
                streaming_budget_bytes: 256 << 20,
                cache_drop: Some("test".into()),
            },
            machine: Machine::detect(std::path::Path::new(".")),
            fixtures: vec![FixtureFacts {
                name: f.into(),
                path: "/x".into(),
                files: 1,
                tensors: 2,
                data_len_bytes: 10,
                files_len_bytes: 20,
                generated: false,
                generate_seconds: 0.0,
            }],
            fixtures_skipped: vec![("sllm".into(), "converter missing".into())],
            rooflines: Vec::new(),
            cells,
            pairs: vec![crate::paired::Pair {
                fixture: f.into(),
                cache: Cache::Warm,
                subject: "auto (sync buffered)".into(),
                anchor: ROOFLINE_WARM.into(),
                subject_gbps: vec![8.0, 9.0],
                anchor_gbps: vec![10.0, 10.0],
                ratios: vec![0.8, 0.9],
                goal: 0.85,
            }],
        };
        r.compute_rooflines();
        r
    }

    #[test]
    fn paired_runs_get_their_own_table() {
        let md = example().to_markdown();
        assert!(md.contains("## Acceptance, paired runs"), "{md}");
        assert!(md.contains("| 0.85 (0.80..0.90) | 0.85: met |"), "{md}");
    }

    #[test]
    fn rooflines_and_ratios() {
        let r = example();
        assert_eq!(r.rooflines.len(), 1);
        assert_eq!(r.rooflines[0].warm_gbps, Some(10.0));
        assert_eq!(r.rooflines[0].device_gbps, Some(2.5));
        assert_eq!(r.rooflines[0].device_subject.as_deref(), Some(ROOFLINE_DIRECT_AGAIN));
        let sync_warm = &r.cells[3];
        assert_eq!(sync_warm.gbps.unwrap().median, 5.5);
        assert_eq!(sync_warm.ratio, Some(0.55));
        assert_eq!(r.cells[4].ratio, Some(0.6));
        assert_eq!(r.cells[2].ratio, Some(0.4));
        assert_eq!(r.cells[1].ratio, Some(0.8));
        assert_eq!(r.cells[5].ratio, None);
    }

    #[test]
    fn json_has_every_sample_and_round_trips() {
        let r = example();
        let json = r.to_json().unwrap();
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["schema_version"], SCHEMA_VERSION);
        assert!(v["machine"]["cores"].as_u64().unwrap() >= 1);
        let cells = v["cells"].as_array().unwrap();
        assert_eq!(cells.len(), 9);
        assert_eq!(cells[0]["samples"].as_array().unwrap().len(), 3);
        assert_eq!(cells[0]["kind"], "roofline");
        assert_eq!(cells[3]["gbps"]["median"], 5.5);
        assert_eq!(cells[3]["cache"], "warm");
        assert_eq!(cells[5]["status"], "skipped");
        assert_eq!(cells[7]["status"], "failed");
        assert_eq!(cells[6]["details"]["backend"], "io-uring");
        assert_eq!(v["rooflines"][0]["device_gbps"], 2.5);
        let back: Report = serde_json::from_str(&json).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn markdown_lists_every_cell_and_escapes_pipes() {
        let md = example().to_markdown();
        let rows = |header: &str| {
            md.lines()
                .skip_while(|l| !l.starts_with(header))
                .skip(2)
                .take_while(|l| l.starts_with("| "))
                .count()
        };
        assert_eq!(rows("| subject"), 9);
        assert_eq!(rows("| fixture"), 1);
        assert!(
            md.contains(
                "| auto | cold | partial | owned | 1.00 | 1.00 | 1.00 | 40 % | ran io-uring/direct |"
            )
        );
        assert!(md.contains("| sync | warm | full | owned | 5.50 | 5.00 | 6.00 | 55 % |"));
        assert!(md.contains("skipped: no module"));
        assert!(md.contains("FAILED: boom / pipe"));
        assert!(md.contains("Fixture `sllm` skipped: converter missing"));
    }

    #[test]
    fn svg_has_bars_and_roofline_lines() {
        let svg = example().to_svg("m").unwrap();
        assert!(svg.starts_with("<svg"));
        assert!(svg.contains("sync"));
        // A subject with no measurement (skipped) gets no empty slot.
        assert!(!svg.contains("hf-python"));
        assert!(svg.contains("warm roofline 10.00 GB/s"));
        assert!(svg.contains("device roofline 2.50 GB/s"));
        assert!(svg.matches("<rect").count() >= 3);
        // A fixture with no cells still renders an (empty) chart.
        assert!(example().to_svg("none").unwrap().starts_with("<svg"));
    }
}
