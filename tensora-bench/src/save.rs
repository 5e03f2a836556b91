//! The save cells: Tensora writing the TinyLlama-shaped model from memory, and converting it to
//! ServerlessLLM and back, each paired run by run with a write roofline of the same size
//! ([`write_roofline`]: sequential writes then `fsync`, buffered and `O_DIRECT`, the better of
//! the two), as [`crate::paired`] pairs loads with their rooflines; and the Python save bench
//! (`tensora-py/bench/bench_save.py`: `tensora.save_file` against HF's `save_file` on the same
//! tensors), when a Python with `tensora`, `safetensors` and `torch` is found.
//!
//! Every run writes a new file (the previous one is removed and the removal synced, untimed),
//! times it to durability (`fsync`; the save also names the file and syncs the directory), and
//! the order of the three runs of a pair rotates. The sources are warm: the model is in memory
//! for the save, and the files a conversion reads are read through the page cache before it.

use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use serde::Deserialize;
use tensora_convert::{ConvertConfig, TargetFormat};
use tensora_convert::{MemoryTensors, SaveOptions, save_safetensors};

use crate::bench::{BenchConfig, PlanKind, WARMUP_RUNS};
use crate::fixtures::{self, Fixture};
use crate::paired::Pair;
use crate::report::Cache;
use crate::rng::SplitMix64;
use crate::roofline::{self, ReadBuffers};
use crate::stats::{gbps, ratio};

/// Goal of the save pair (issue #17): at least this fraction of the write roofline.
pub const SAVE_GOAL: f64 = 0.9;
/// Goal of the conversion pairs (issue #17).
pub const CONVERT_GOAL: f64 = 0.8;
/// Goal of the Python pairs: `tensora.save_file` at least this many times HF's `save_file`.
pub const PYTHON_GOAL: f64 = 3.0;
/// Bytes of one roofline write: 4 MiB, the piece a direct save writes, which measured faster on
/// this machine's virtual disk than 8 MiB (8 x 4 MiB 2.01 GB/s against 4 x 8 MiB 1.72, see
/// docs/design.md, "Saving"); a roofline of 8 MiB writes was beaten by the save it anchors.
pub const ROOFLINE_BLOCK_BYTES: usize = 4 << 20;
/// Writes in flight for the `O_DIRECT` roofline (threads of `pwrite`; as many as a direct save
/// keeps).
pub const ROOFLINE_DIRECT_THREADS: usize = 8;
/// `O_DIRECT` alignment of the roofline's buffers, offsets and lengths.
const ALIGN_BYTES: usize = 4096;
/// The anchor of every save pair.
pub const WRITE_ROOFLINE: &str = "write roofline (best of buffered and O_DIRECT, + fsync)";

/// How the write roofline writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteProbe {
    /// One thread of sequential [`ROOFLINE_BLOCK_BYTES`] `pwrite`s through the page cache
    /// (`fio --rw=write --bs=4M --end_fsync=1`).
    Buffered,
    /// [`ROOFLINE_DIRECT_THREADS`] threads of `O_DIRECT` `pwrite`s of consecutive blocks
    /// (`fio --direct=1 --iodepth=8`).
    Direct,
}

/// Aligned blocks of pseudo-random bytes for the roofline writers, made once outside the timing.
#[derive(Debug)]
pub struct WriteBuffers {
    raw: Vec<Vec<u8>>,
}

impl WriteBuffers {
    /// One block per writer thread.
    pub fn new() -> WriteBuffers {
        let mut rng = SplitMix64::new(0x5A7E);
        let raw = (0..ROOFLINE_DIRECT_THREADS)
            .map(|_| {
                let mut v = vec![0u8; ROOFLINE_BLOCK_BYTES + ALIGN_BYTES];
                rng.fill(&mut v);
                v
            })
            .collect();
        WriteBuffers { raw }
    }

    fn blocks(&mut self) -> Vec<&mut [u8]> {
        self.raw
            .iter_mut()
            .map(|raw| {
                let skip = raw.as_ptr().align_offset(ALIGN_BYTES);
                &mut raw[skip..skip + ROOFLINE_BLOCK_BYTES]
            })
            .collect()
    }
}

impl Default for WriteBuffers {
    fn default() -> Self {
        WriteBuffers::new()
    }
}

/// Write `len_bytes` to a new file at `path` and `fsync` it; returns the seconds the writes and
/// the `fsync` took. As fio lays its files out before a job, the file is created and its blocks
/// reserved (`fallocate`) before the clock starts (a save does both inside its time). Each
/// block's pages are stamped with the block number first, so no two blocks are alike (a virtual
/// disk that deduplicates would flatter repeated blocks). The caller removes the file.
pub fn write_roofline(
    path: &Path,
    len_bytes: u64,
    probe: WriteProbe,
    bufs: &mut WriteBuffers,
) -> Result<f64> {
    let _ = fs::remove_file(path);
    let mut options = OpenOptions::new();
    options.write(true).create_new(true);
    if probe == WriteProbe::Direct {
        options.custom_flags(libc::O_DIRECT);
    }
    let file = options.open(path).with_context(|| format!("create {} ({probe:?})", path.display()))?;
    tensora_sys::preallocate(&file, len_bytes).with_context(|| format!("fallocate {}", path.display()))?;
    let started = Instant::now();
    let blocks_total = len_bytes.div_ceil(ROOFLINE_BLOCK_BYTES as u64);
    let next = AtomicU64::new(0);
    let threads = if probe == WriteProbe::Direct { ROOFLINE_DIRECT_THREADS } else { 1 };
    let errors: std::sync::Mutex<Vec<std::io::Error>> = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for buf in bufs.blocks().into_iter().take(threads) {
            let (file, next, errors) = (&file, &next, &errors);
            s.spawn(move || {
                loop {
                    let k = next.fetch_add(1, Ordering::Relaxed);
                    if k >= blocks_total {
                        break;
                    }
                    let offset = k * ROOFLINE_BLOCK_BYTES as u64;
                    let want = (len_bytes - offset).min(ROOFLINE_BLOCK_BYTES as u64) as usize;
                    let len =
                        if probe == WriteProbe::Direct { want.next_multiple_of(ALIGN_BYTES) } else { want };
                    for page in buf[..len].chunks_mut(ALIGN_BYTES) {
                        page[..8].copy_from_slice(&k.to_le_bytes());
                    }
                    if let Err(e) = file.write_all_at(&buf[..len], offset) {
                        errors.lock().map(|mut v| v.push(e)).unwrap_or(());
                        break;
                    }
                }
            });
        }
    });
    if let Some(e) = errors.into_inner().unwrap_or_default().into_iter().next() {
        return Err(e).with_context(|| format!("write {} ({probe:?})", path.display()));
    }
    if probe == WriteProbe::Direct {
        file.set_len(len_bytes)?;
    }
    file.sync_all().with_context(|| format!("fsync {}", path.display()))?;
    drop(file);
    Ok(started.elapsed().as_secs_f64())
}

/// Make the removal of the previous run's output durable before the next run starts (untimed):
/// on a filesystem mounted with `discard`, freeing gigabytes issues discards at the next journal
/// commit, which the next timed run's `fsync` would otherwise wait for.
fn settle(dir: &Path) -> Result<()> {
    File::open(dir).and_then(|d| d.sync_all()).with_context(|| format!("fsync {}", dir.display()))
}

/// Runs pairs of one subject against the two roofline probes.
struct PairRunner<'a> {
    scratch: &'a Path,
    bufs: WriteBuffers,
    /// Untimed rounds before the timed ones (the subject's first, untimed, run always comes first).
    warmups: usize,
    runs: usize,
}

impl PairRunner<'_> {
    /// `warm-up + runs` pairs: each the direct probe, the buffered probe and `subject` (which
    /// returns seconds and bytes written, and removes what it wrote), rotated. The probes write
    /// as many bytes as the subject's last run.
    fn pair(&mut self, mut pair: Pair, mut subject: impl FnMut() -> Result<(f64, u64)>) -> Result<Pair> {
        let (_, mut len_bytes) = subject()?;
        let probe_path = self.scratch.join("roofline.bin");
        for i in 0..self.warmups + self.runs {
            let mut speeds = [0.0f64; 3];
            for k in 0..3 {
                let which = (i + k) % 3;
                speeds[which] = match which {
                    0 | 1 => {
                        let probe = if which == 0 { WriteProbe::Direct } else { WriteProbe::Buffered };
                        let seconds = match write_roofline(&probe_path, len_bytes, probe, &mut self.bufs) {
                            Ok(s) => s,
                            // tmpfs and some overlays refuse O_DIRECT: the buffered probe remains.
                            Err(_) if probe == WriteProbe::Direct => f64::INFINITY,
                            Err(e) => return Err(e),
                        };
                        let _ = fs::remove_file(&probe_path);
                        settle(self.scratch)?;
                        gbps(len_bytes, seconds)
                    }
                    _ => {
                        let (seconds, bytes) = subject()?;
                        settle(self.scratch)?;
                        len_bytes = bytes;
                        gbps(bytes, seconds)
                    }
                };
            }
            if i >= self.warmups {
                let anchor = speeds[0].max(speeds[1]);
                pair.subject_gbps.push(speeds[2]);
                pair.anchor_gbps.push(anchor);
                pair.ratios.extend(ratio(speeds[2], anchor));
            }
        }
        Ok(pair)
    }
}

fn new_pair(fixture: &str, subject: &str, anchor: &str, goal: f64) -> Pair {
    Pair { subject: subject.to_owned(), ..Pair::new(fixture, Cache::Warm, anchor.to_owned(), goal) }
}

/// The save pairs of the bench run: save from memory, conversion to ServerlessLLM and back (when
/// the ServerlessLLM fixture exists), and the Python pairs (when a Python can run them). A pair
/// that fails is logged and reported without data, never dropped.
pub fn measure_save_pairs(
    config: &BenchConfig,
    fixtures: &[Fixture],
    log: &mut dyn FnMut(&str),
) -> Result<Vec<Pair>> {
    let Some(main) = fixtures.iter().find(|f| f.name == fixtures::TINYLLAMA) else { return Ok(Vec::new()) };
    let scratch = config.out_dir.join("save-scratch");
    if scratch.exists() {
        fs::remove_dir_all(&scratch).with_context(|| format!("remove {}", scratch.display()))?;
    }
    fs::create_dir_all(&scratch)?;
    // The default plan keeps to its few minutes: the subject's first, untimed, run is the warm-up
    // (the probes write the same files every round, so their first round is warm enough).
    let warmups = if config.plan == PlanKind::Full { WARMUP_RUNS } else { 0 };
    let mut runner = PairRunner { scratch: &scratch, bufs: WriteBuffers::new(), warmups, runs: config.runs };
    let mut out = Vec::new();
    let mut keep = |name: &str, result: Result<Pair>, log: &mut dyn FnMut(&str)| match result {
        Ok(p) => {
            log(&p.line());
            out.push(p);
        }
        Err(e) => {
            log(&format!("{name}: failed: {e:#}"));
            out.push(new_pair(&main.name, &format!("{name} (failed: {e:#})"), WRITE_ROOFLINE, SAVE_GOAL));
        }
    };
    keep("tensora save_safetensors", save_pair(&mut runner, main), log);
    keep(
        "tensora convert to serverlessllm",
        convert_pair(&mut runner, main, TargetFormat::ServerlessLlm),
        log,
    );
    match fixtures.iter().find(|f| f.name == fixtures::TINYLLAMA_SLLM) {
        Some(sllm) => keep(
            "tensora convert to safetensors",
            convert_pair(&mut runner, sllm, TargetFormat::Safetensors),
            log,
        ),
        // The fixture step says why it could not make the fixture (bench::prepare_fixtures).
        None => {
            let name = "tensora convert tinyllama-sllm -> safetensors (skipped: no ServerlessLLM fixture)";
            log(name);
            out.push(new_pair(fixtures::TINYLLAMA_SLLM, name, WRITE_ROOFLINE, CONVERT_GOAL));
        }
    }
    match python_pairs(config, main, log) {
        Ok(pairs) => out.extend(pairs),
        // Only where the provisioned venv cannot run them; the report keeps the reason.
        Err(e) => {
            let name = format!("tensora.save_file (python save pairs skipped: {e:#})");
            log(&name);
            out.push(new_pair(&main.name, &name, "HF save_file", PYTHON_GOAL));
        }
    }
    let _ = fs::remove_dir_all(&scratch);
    Ok(out)
}

/// The model loaded into memory once, then saved from there, run after run.
fn save_pair(runner: &mut PairRunner<'_>, main: &Fixture) -> Result<Pair> {
    let ckpt = tensora_format::open(&main.open_path)?;
    let loaded = tensora_io::load(&ckpt, &tensora_io::LoadOptions::default())?;
    let tensors = MemoryTensors::from_loaded(&loaded)?;
    let path = runner.scratch.join("model.safetensors");
    let mut mode = String::new();
    let pair = new_pair(&main.name, "tensora save_safetensors", WRITE_ROOFLINE, SAVE_GOAL);
    let mut pair = runner.pair(pair, || {
        let t = Instant::now();
        let report = save_safetensors(&path, &tensors, ckpt.metadata(), &SaveOptions::default())?;
        let seconds = t.elapsed().as_secs_f64();
        fs::remove_file(&path)?;
        mode = format!("{}, {} threads", report.mode, report.threads);
        Ok((seconds, report.bytes_written))
    })?;
    pair.subject = format!("tensora save_safetensors ({mode})");
    Ok(pair)
}

/// `src` converted to `to`, its files read through the page cache before every run.
fn convert_pair(runner: &mut PairRunner<'_>, src: &Fixture, to: TargetFormat) -> Result<Pair> {
    let ckpt = tensora_format::open(&src.open_path)?;
    let dst = match to {
        TargetFormat::ServerlessLlm => runner.scratch.join("converted-sllm"),
        TargetFormat::Safetensors => runner.scratch.join("converted.safetensors"),
    };
    let mut cache_bufs = ReadBuffers::new(1);
    let mut mode = String::new();
    let name = format!("tensora convert {} -> {}", src.name, to.as_str());
    let pair = new_pair(&src.name, &name, WRITE_ROOFLINE, CONVERT_GOAL);
    let mut pair = runner.pair(pair, || {
        roofline::read_through_cache(&src.data_files, &mut cache_bufs)?;
        let t = Instant::now();
        let report =
            tensora_convert::convert(&ckpt, &dst, &ConvertConfig { to, ..ConvertConfig::default() })?;
        let seconds = t.elapsed().as_secs_f64();
        if dst.is_dir() {
            fs::remove_dir_all(&dst)?
        } else {
            fs::remove_file(&dst)?
        }
        mode = format!("{}, {} threads", report.mode, report.threads);
        Ok((seconds, report.bytes_written))
    })?;
    pair.subject = format!("{name} ({mode})");
    Ok(pair)
}

/// What `bench_save.py --json` writes.
#[derive(Debug, Deserialize)]
struct PythonReport {
    pairs: Vec<PythonPair>,
}

#[derive(Debug, Deserialize)]
struct PythonPair {
    subject: String,
    anchor: String,
    subject_gbps: Vec<f64>,
    anchor_gbps: Vec<f64>,
    /// Context for the other pairs (HF writing only to the page cache), measured with no goal.
    #[serde(default)]
    context: bool,
}

/// The interpreter of the provisioned venv ([`crate::python::venv_python`]), when it imports what
/// the Python save bench needs.
fn python() -> Result<PathBuf> {
    let python = crate::python::venv_python().map_err(|u| anyhow::anyhow!("{u}"))?;
    crate::python::importable(&python, &["tensora", "safetensors", "numpy", "torch"]).map_err(|why| {
        anyhow::anyhow!("{}: {why}; enable with: `{}`", python.display(), crate::python::ENABLE)
    })?;
    Ok(python)
}

/// `tensora.save_file` against HF's `save_file` (torch and numpy), alternately, on the model's
/// tensors loaded once in the Python process.
fn python_pairs(config: &BenchConfig, main: &Fixture, log: &mut dyn FnMut(&str)) -> Result<Vec<Pair>> {
    let python = python()?;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tensora-py/bench/bench_save.py");
    let scratch = config.out_dir.join("save-scratch");
    let json = scratch.join("python-save.json");
    let status = Command::new(&python)
        .arg(&script)
        .arg(&main.open_path)
        .args(["--runs", &config.runs.to_string()])
        // HF without the fsync (page cache only) is context, not the goal: in the full plan only.
        .args(["--cases", if config.plan == PlanKind::Full { "all" } else { "durable" }])
        .args(["--warmups", if config.plan == PlanKind::Full { "1" } else { "0" }])
        .arg("--json")
        .arg(&json)
        .arg("--out")
        .arg(&scratch)
        .stdin(Stdio::null())
        .status()
        .with_context(|| format!("run {}", script.display()))?;
    if !status.success() {
        bail!("{} failed with {status}", script.display());
    }
    let report: PythonReport = serde_json::from_reader(File::open(&json)?)?;
    let mut pairs = Vec::new();
    for p in report.pairs {
        let mut pair = new_pair(&main.name, &p.subject, &p.anchor, PYTHON_GOAL);
        for (s, a) in p.subject_gbps.iter().zip(&p.anchor_gbps) {
            pair.subject_gbps.push(*s);
            pair.anchor_gbps.push(*a);
            pair.ratios.extend(ratio(*s, *a));
        }
        if p.context {
            log(&pair.context_line());
            continue;
        }
        log(&pair.line());
        pairs.push(pair);
    }
    Ok(pairs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_roofline_writes_every_byte_with_distinct_blocks() {
        let dir = tempfile::tempdir().unwrap();
        let mut bufs = WriteBuffers::new();
        let len = (ROOFLINE_BLOCK_BYTES * 2 + 12_345) as u64;
        let path = dir.path().join("r");
        let seconds = write_roofline(&path, len, WriteProbe::Buffered, &mut bufs).unwrap();
        assert!(seconds > 0.0);
        let bytes = fs::read(&path).unwrap();
        assert_eq!(bytes.len() as u64, len);
        assert_eq!(&bytes[ROOFLINE_BLOCK_BYTES..ROOFLINE_BLOCK_BYTES + 8], &1u64.to_le_bytes());
        let direct = tensora_testkit::direct_io_or_skip(&path, "write roofline");
        fs::remove_file(&path).unwrap();
        // Direct where the filesystem takes it (not on tmpfs): the same length, the tail cut.
        if direct {
            write_roofline(&path, len, WriteProbe::Direct, &mut bufs).unwrap();
            assert_eq!(fs::metadata(&path).unwrap().len(), len);
        }
    }
}
