//! The bench's results: every sample, the machine it ran on, and three renderings (Markdown in
//! `markdown`, JSON here, the SVG chart in `chart`).

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::stats::{Summary, ratio};

/// Bump when the JSON shape changes (2: every cell and roofline names its [`Situation`]; samples
/// carry the process start).
pub const SCHEMA_VERSION: u32 = 2;

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

/// Which situation a figure describes. Every subject is measured in the same situations, and a
/// cell is only ever compared with a roofline of its own situation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Situation {
    /// (a) The first load of a fresh process, as a server or a job starts: the subject runs in a
    /// child process of its own, and the process start (exec, runtime, imports) is timed apart.
    FirstLoad,
    /// (b) A repeat load in a process that already loaded once and dropped the result: what the
    /// reuse of freed memory buys (Tensora with `ArenaReuse::Recycle`; the peers with whatever
    /// their allocator kept).
    RepeatLoad,
    /// Device rooflines: memory faulted in before the clock starts, so the figure is the disk's
    /// alone, whatever the process.
    Device,
}

impl Situation {
    /// Lower-case name, as in the JSON.
    pub const fn as_str(self) -> &'static str {
        match self {
            Situation::FirstLoad => "first-load",
            Situation::RepeatLoad => "repeat-load",
            Situation::Device => "device",
        }
    }

    /// The label of the situation in tables and charts.
    pub const fn label(self) -> &'static str {
        match self {
            Situation::FirstLoad => "(a) first load in a fresh process",
            Situation::RepeatLoad => "(b) repeat load in the same process",
            Situation::Device => "device only (memory ready before the clock starts)",
        }
    }

    /// The situation whose roofline a cell of this situation is compared with (device rooflines
    /// count with the first loads).
    pub const fn compared_as(self) -> Situation {
        match self {
            Situation::RepeatLoad => Situation::RepeatLoad,
            Situation::FirstLoad | Situation::Device => Situation::FirstLoad,
        }
    }
}

/// One timed run.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// Wall-clock seconds of the run (the load, from opening the checkpoint to the last page
    /// touched; never the process start).
    pub seconds: f64,
    /// Bytes of tensor data loaded (rooflines: file bytes read).
    pub bytes: u64,
    /// `bytes` over `seconds`, in GB/s (10^9 bytes).
    pub gbps: f64,
    /// Seconds from spawning the subject's process until it was ready to load (exec, runtime,
    /// interpreter and imports), timed apart; `None` for subjects measured in the bench's process.
    #[serde(default)]
    pub start_seconds: Option<f64>,
}

impl Sample {
    /// A sample of `bytes` loaded in `seconds`, with no process start.
    pub fn new(seconds: f64, bytes: u64) -> Sample {
        Sample { seconds, bytes, gbps: crate::stats::gbps(bytes, seconds), start_seconds: None }
    }
}

/// Everything measured for one (fixture, subject, situation, cache, scope, mode).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cell {
    /// The fixture's name.
    pub fixture: String,
    /// Who was measured: a backend name, `auto`, a peer or a roofline.
    pub subject: String,
    /// What kind of subject that is.
    pub kind: Kind,
    /// The situation of every sample of the cell.
    pub situation: Situation,
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
    /// The roofline this cell is compared with (warm roofline of the same situation, or device),
    /// GB/s.
    pub roofline_gbps: Option<f64>,
    /// Median GB/s divided by `roofline_gbps`.
    pub ratio: Option<f64>,
    /// Subject-specific details of the last run (e.g. a Tensora load report).
    pub details: Option<serde_json::Value>,
}

impl Cell {
    /// A cell that has not run yet.
    pub fn new(
        fixture: &str,
        subject: &str,
        kind: Kind,
        at: (Situation, Cache),
        scope: Scope,
        mode: Mode,
    ) -> Cell {
        let (situation, cache) = at;
        Cell {
            fixture: fixture.to_string(),
            subject: subject.to_string(),
            kind,
            situation,
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

    /// `fixture | subject | situation cache scope mode`, the cell's identity in logs.
    pub fn key(&self) -> String {
        format!(
            "{} | {} | {} {} {} {}",
            self.fixture,
            self.subject,
            self.situation.as_str(),
            self.cache.as_str(),
            self.scope.as_str(),
            self.mode.as_str()
        )
    }

    /// Median process start of the samples (subjects measured in a child process).
    pub fn start_seconds(&self) -> Option<Summary> {
        let starts: Vec<f64> = self.samples.iter().filter_map(|s| s.start_seconds).collect();
        Summary::of(&starts)
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

/// The limits of one fixture in one situation ([`Situation::FirstLoad`] or
/// [`Situation::RepeatLoad`]; the device figures are the same in both).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rooflines {
    /// The fixture's name.
    pub fixture: String,
    /// The situation of the warm roofline, and of the cells compared with these figures.
    pub situation: Situation,
    /// Best median of the warm rooflines of this situation (pread into hugepages).
    pub warm_gbps: Option<f64>,
    /// Best median of the cold rooflines.
    pub device_gbps: Option<f64>,
    /// Which cold roofline won.
    pub device_subject: Option<String>,
}

/// How the run was configured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunFacts {
    /// Fixture size (`small` or `full`).
    pub size: String,
    /// Timed runs per cell (one per round, rounds interleaved).
    pub runs: usize,
    /// Timed pairs of each paired acceptance run.
    #[serde(default)]
    pub pair_runs: usize,
    /// Whether the cold cells ran.
    pub cold: bool,
    /// Which plan ran: `quick`, `default` or `full`.
    pub plan: String,
    /// Seed of the fixture data.
    pub seed: u64,
    /// In-flight budget of the streaming cells.
    pub streaming_budget_bytes: u64,
    /// How cold runs dropped the page cache (`None` when no cold cell ran).
    pub cache_drop: Option<String>,
    /// The memory state each child process started in ([`crate::memory`]).
    #[serde(default)]
    pub memory: String,
    /// Wall-clock seconds from the start of the run (fixtures, Python environment, cells, pairs)
    /// until the report was built.
    #[serde(default)]
    pub seconds: f64,
    /// `/proc/loadavg`'s 1, 5 and 15 minute figures when the measuring started and ended (other
    /// work on the machine disturbs the figures).
    #[serde(default)]
    pub load_average: [String; 2],
}

/// The 1, 5 and 15 minute load averages (`/proc/loadavg`), or `unknown`.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".to_owned())
}

/// The whole result of a bench run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// `SCHEMA_VERSION` of this document.
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
    /// Paired acceptance runs (see `crate::paired`).
    #[serde(default)]
    pub pairs: Vec<crate::paired::Pair>,
    /// `auto` against the best peer of the same run, situation (a) (see `crate::versus`).
    #[serde(default)]
    pub versus: Vec<crate::versus::Versus>,
    /// The bindings' Python peers on the main fixture (see `crate::torch_peers`), when run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub python_peers: Option<crate::torch_peers::TorchPeers>,
    /// The restarts sequences on the main fixture (`torch_peers.rs`, `bench_restarts.py`), when run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restarts: Option<crate::torch_peers::TorchPeers>,
}

/// Warm roofline: 2 `pread` threads into a fresh arena, as a load gets it (huge pages unless they
/// fault in slowly).
pub const ROOFLINE_WARM: &str = "roofline: pread 2 threads -> fresh arena";
/// Warm roofline: 2 `pread` threads into fresh base pages.
pub const ROOFLINE_WARM_BASE: &str = "roofline: pread 2 threads -> base pages";
/// Cold O_DIRECT roofline.
pub const ROOFLINE_DIRECT: &str = "roofline: O_DIRECT QD32 8MiB";
/// Cold buffered roofline.
pub const ROOFLINE_BUFFERED: &str = "roofline: buffered pread 2 threads";
/// The same rooflines measured again after the loaders of a fixture (a virtual disk's speed drifts
/// within a run; the better of the two passes is the roofline).
pub const ROOFLINE_WARM_AGAIN: &str = "roofline (again): pread 2 threads -> fresh arena";
/// See [`ROOFLINE_WARM_AGAIN`].
pub const ROOFLINE_WARM_BASE_AGAIN: &str = "roofline (again): pread 2 threads -> base pages";
/// See [`ROOFLINE_WARM_AGAIN`].
pub const ROOFLINE_DIRECT_AGAIN: &str = "roofline (again): O_DIRECT QD32 8MiB";
/// See [`ROOFLINE_WARM_AGAIN`].
pub const ROOFLINE_BUFFERED_AGAIN: &str = "roofline (again): buffered pread 2 threads";

impl Report {
    /// Compute each fixture's rooflines from its roofline cells (per situation, the best median
    /// of each cache state) and fill every cell's ratio: warm cells against the warm roofline of
    /// their own situation, cold cells against the device roofline; then `auto` against the peers.
    pub fn compute_rooflines(&mut self) {
        let mut keys: Vec<(String, Situation)> = Vec::new();
        for c in &self.cells {
            let key = (c.fixture.clone(), c.situation.compared_as());
            if !keys.contains(&key) {
                keys.push(key);
            }
        }
        let cells = &self.cells;
        // The best median among a fixture's roofline cells of a cache state and situation.
        let best = |f: &str, cache: Cache, situation: Situation| {
            cells
                .iter()
                .filter(|c| c.fixture == f && c.kind == Kind::Roofline && c.cache == cache)
                .filter(|c| c.situation == situation)
                .filter_map(|c| c.median().map(|m| (c.subject.as_str(), m)))
                .max_by(|a, b| a.1.total_cmp(&b.1))
        };
        self.rooflines = keys
            .iter()
            .map(|(f, situation)| {
                let device = best(f, Cache::Cold, Situation::Device);
                Rooflines {
                    fixture: f.clone(),
                    situation: *situation,
                    warm_gbps: best(f, Cache::Warm, *situation).map(|w| w.1),
                    device_gbps: device.map(|d| d.1),
                    device_subject: device.map(|d| d.0.to_string()),
                }
            })
            .collect();
        for c in &mut self.cells {
            let want = c.situation.compared_as();
            let Some(r) = self.rooflines.iter().find(|r| r.fixture == c.fixture && r.situation == want)
            else {
                continue;
            };
            c.roofline_gbps = match c.cache {
                Cache::Warm => r.warm_gbps,
                Cache::Cold => r.device_gbps,
            };
            c.ratio = match (c.median(), c.roofline_gbps) {
                (Some(m), Some(r)) => ratio(m, r),
                _ => None,
            };
        }
        self.versus = crate::versus::compare(&self.cells);
    }

    /// The rooflines of `fixture` in `situation`.
    pub fn rooflines_of(&self, fixture: &str, situation: Situation) -> Option<&Rooflines> {
        self.rooflines.iter().find(|r| r.fixture == fixture && r.situation == situation)
    }

    /// Cells that ran and failed (a bug, never a missed goal), as `subject: reason` lines.
    pub fn failures(&self) -> Vec<String> {
        self.cells
            .iter()
            .filter(|c| c.status == Status::Failed)
            .map(|c| format!("{}: {}", c.key(), c.reason.as_deref().unwrap_or("")))
            .collect()
    }

    /// Pretty JSON.
    pub fn to_json(&self) -> Result<String> {
        serde_json::to_string_pretty(self).context("serialise the report")
    }
}

#[cfg(test)]
mod tests;
