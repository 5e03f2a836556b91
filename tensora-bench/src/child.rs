//! Each subject measured in a process of its own.
//!
//! Situation (a) is the first load of a fresh process, so every timed load of a Rust subject runs
//! in a child: the bench re-executes its own binary with [`CHILD_SPEC_ARG`] and a JSON
//! [`ChildSpec`]. The child prints [`READY_LINE`] as soon as it starts (the parent times the
//! process start up to that line, apart from the load), then runs the load(s) and prints one JSON
//! [`ChildResult`] line. Situation (b) runs one untimed load in the same child first and drops its
//! result. Python peers follow the same protocol ([`crate::python::RUNNER_SCRIPT`]).
//!
//! The parent never waits unboundedly: a child has [`CHILD_SECONDS_MAX`] to finish, and at most
//! [`CHILD_OUTPUT_BYTES_MAX`] of its output is read.

use std::any::Any;
use std::collections::HashSet;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use crate::cache::{CacheDropper, DropMethod};
use crate::cells::Subject;
use crate::report::{Mode, Sample, Scope, Situation};

/// The argument that makes `tensora-bench` a child running one subject.
pub const CHILD_SPEC_ARG: &str = "--child-spec";
/// What a child prints once it has started, before any work.
pub const READY_LINE: &str = "ready";
/// Bound on one child run, from spawn to exit.
pub const CHILD_SECONDS_MAX: u64 = 900;
/// Bound on the stdout (and, apart, the stderr) bytes read from one child.
pub const CHILD_OUTPUT_BYTES_MAX: usize = 1 << 20;
/// Interval at which the parent polls an exiting child (bounded by the deadline).
const EXIT_POLL: Duration = Duration::from_millis(5);

/// What a child measures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChildSpec {
    /// Who is measured.
    pub subject: Subject,
    /// What to open (file or directory).
    pub open_path: PathBuf,
    /// The data files (rooflines and peers read these).
    pub data_files: Vec<PathBuf>,
    /// Which tensors.
    pub scope: Scope,
    /// Owned, streaming or mapped.
    pub mode: Mode,
    /// First load of the process, or a repeat load.
    pub situation: Situation,
    /// Drop the page cache this way right before the timed load (cold cells).
    pub drop: Option<DropMethod>,
    /// Budget of streaming loads.
    pub streaming_budget_bytes: u64,
}

/// What a child prints after its timed load.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChildResult {
    /// Seconds of the timed load.
    pub seconds: f64,
    /// Bytes it loaded.
    pub bytes: u64,
    /// Subject-specific details (a Tensora load report).
    #[serde(default)]
    pub details: Option<serde_json::Value>,
}

/// A finished child: its sample (with the process start) and details.
#[derive(Debug, Clone, PartialEq)]
pub struct Measured {
    /// The timed load.
    pub sample: Sample,
    /// Subject-specific details.
    pub details: Option<serde_json::Value>,
}

/// How a bounded run of a command ended.
#[derive(Debug, Clone)]
pub struct LinesRun {
    /// Exit status 0.
    pub success: bool,
    /// The exit status in words.
    pub status: String,
    /// The exit code (`None` when a signal ended it).
    pub code: Option<i32>,
    /// Its stderr (at most [`CHILD_OUTPUT_BYTES_MAX`] bytes).
    pub stderr: String,
}

/// Run `cmd`, handing each stdout line to `on_line` as it arrives, within `timeout` (the child is
/// killed past it) and reading at most `output_max` bytes of each stream.
pub fn run_lines(
    cmd: &mut Command,
    timeout: Duration,
    output_max: usize,
    on_line: &mut dyn FnMut(&str),
) -> Result<LinesRun> {
    let deadline = Instant::now() + timeout;
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().context("spawn")?;
    let stdout = child.stdout.take().context("no stdout pipe")?;
    let stderr = child.stderr.take().context("no stderr pipe")?;
    let limit = output_max as u64;
    // Lines go through a channel so that the wait for them is bounded by the deadline.
    let (tx, rx) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout.take(limit)).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    // The readers are never joined: a grandchild that inherited a pipe could keep one open past
    // the deadline. Each ends when its pipe closes or its bound is read.
    let (err_tx, err_rx) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.take(limit).read_to_string(&mut text);
        let _ = err_tx.send(text);
    });
    let mut timed_out = false;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => on_line(&line),
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                timed_out = true;
                break;
            }
        }
    }
    let status = loop {
        if let Some(status) = child.try_wait().context("wait for the child")? {
            break Some(status);
        }
        if timed_out || Instant::now() >= deadline {
            break None;
        }
        std::thread::sleep(EXIT_POLL);
    };
    let Some(status) = status else {
        let _ = child.kill();
        let _ = child.wait();
        bail!("did not finish within {} s (killed)", timeout.as_secs_f64());
    };
    let stderr = err_rx.recv_timeout(deadline.saturating_duration_since(Instant::now())).unwrap_or_default();
    Ok(LinesRun { success: status.success(), status: status.to_string(), code: status.code(), stderr })
}

/// Run one child (a `tensora-bench` child or a Python peer) to completion and read its sample: the
/// process start is the time from spawn to its [`READY_LINE`], the load's figures come from its
/// last JSON line.
pub fn measure_child(cmd: &mut Command) -> Result<Measured> {
    let spawned = Instant::now();
    let mut ready: Option<f64> = None;
    let mut result: Option<String> = None;
    let run = run_lines(
        cmd.stdin(Stdio::null()),
        Duration::from_secs(CHILD_SECONDS_MAX),
        CHILD_OUTPUT_BYTES_MAX,
        &mut |line| {
            if line.trim() == READY_LINE && ready.is_none() {
                ready = Some(spawned.elapsed().as_secs_f64());
            } else if line.trim_start().starts_with('{') {
                result = Some(line.to_owned());
            }
        },
    )?;
    if !run.success {
        let tail: Vec<&str> = run.stderr.lines().rev().take(4).collect();
        bail!("child {}: {}", run.status, tail.into_iter().rev().collect::<Vec<_>>().join(" / "));
    }
    let start_seconds = ready.context("the child never said it was ready")?;
    let line = result.context("the child printed no result")?;
    let parsed: ChildResult =
        serde_json::from_str(&line).with_context(|| format!("child result {line:?}"))?;
    if !(parsed.seconds.is_finite() && parsed.seconds > 0.0) {
        bail!("child reported {} seconds", parsed.seconds);
    }
    let mut sample = Sample::new(parsed.seconds, parsed.bytes);
    sample.start_seconds = Some(start_seconds);
    Ok(Measured { sample, details: parsed.details })
}

/// The command that runs `spec` in a child of `exe` (the `tensora-bench` binary).
pub fn command(exe: &Path, spec: &ChildSpec) -> Result<Command> {
    let mut cmd = Command::new(exe);
    cmd.arg(CHILD_SPEC_ARG).arg(serde_json::to_string(spec)?);
    Ok(cmd)
}

/// The child's side: say ready, run `spec_json`'s loads, print the result line.
pub fn child_main(spec_json: &str) -> Result<()> {
    use std::io::Write as _;
    println!("{READY_LINE}");
    std::io::stdout().flush()?;
    let spec: ChildSpec = serde_json::from_str(spec_json).context("parse the child spec")?;
    let result = run_spec(&spec)?;
    println!("{}", serde_json::to_string(&result)?);
    std::io::stdout().flush()?;
    Ok(())
}

/// What one load keeps alive until the next is about to start (its memory is freed untimed).
type Held = Box<dyn Any>;

/// One load of `spec`'s subject: (seconds, bytes, details, what it holds).
type Once = (f64, u64, Option<serde_json::Value>, Held);

fn run_spec(spec: &ChildSpec) -> Result<ChildResult> {
    let selected: Option<Vec<String>> = match spec.scope {
        Scope::Full => None,
        Scope::Partial => {
            let ckpt = crate::loaders::open(&spec.open_path)?;
            let names: Vec<String> = ckpt.tensors().iter().map(|t| t.name().to_owned()).collect();
            Some(crate::bench::partial_names(&names))
        }
    };
    let mut held: Option<Held> = None;
    if spec.situation == Situation::RepeatLoad {
        held = Some(load_once(spec, selected.as_deref(), None)?.3);
    } else if spec.situation != Situation::FirstLoad {
        bail!("a child measures a first or a repeat load, not {}", spec.situation.as_str());
    }
    if let Some(method) = spec.drop {
        CacheDropper::with_method(method).drop_files(&spec.data_files)?;
    }
    let (seconds, bytes, details, last) = load_once(spec, selected.as_deref(), held.take())?;
    drop(last);
    Ok(ChildResult { seconds, bytes, details })
}

/// One load of the subject. `previous` (a first load's result, in situation (b)) is freed before
/// the clock starts, except by the warm roofline, which reads into the same arena again.
fn load_once(spec: &ChildSpec, selected: Option<&[String]>, previous: Option<Held>) -> Result<Once> {
    let files = &spec.data_files;
    let names: Option<HashSet<String>> = selected.map(|s| s.iter().cloned().collect());
    match &spec.subject {
        Subject::RooflineWarm { pages, .. } => {
            let arena = previous.and_then(|p| p.downcast::<tensora_io::Arena>().ok());
            let (seconds, bytes, arena) = match arena {
                Some(mut reused) => {
                    let t = Instant::now();
                    let bytes = crate::roofline::warm_pread(files, &mut reused)?;
                    let len = usize::try_from(bytes).context("arena length")?;
                    std::hint::black_box(crate::peers::touch(&reused.as_mut_slice()[..len]));
                    (t.elapsed().as_secs_f64(), bytes, *reused)
                }
                None => crate::roofline::warm_pread_fresh(files, *pages)?,
            };
            let details = serde_json::json!({ "huge_pages_advised": arena.huge_pages_advised() });
            Ok((seconds, bytes, Some(details), Box::new(arena)))
        }
        Subject::Tensora(_) | Subject::Cast(_) => {
            drop(previous);
            let backend = match &spec.subject {
                Subject::Tensora(name) => name.as_str(),
                _ => crate::bench::AUTO,
            };
            let cell = crate::loaders::TensoraCell {
                open_path: &spec.open_path,
                backend,
                selection: selected,
                streaming: spec.mode == Mode::Streaming,
                mapped: spec.mode == Mode::Mapped,
                streaming_budget_bytes: spec.streaming_budget_bytes,
            };
            let mut opts = cell.options();
            if spec.situation == Situation::RepeatLoad {
                opts.arena_reuse = tensora_io::ArenaReuse::Recycle;
            }
            if let Subject::Cast(to) = spec.subject {
                // Python's default for torch: `Residence::Auto`, which converts straight from
                // views of warm local files.
                opts.residence = tensora_io::Residence::Auto(crate::loaders::fixtures_unchanged());
                opts.dtype = to.target();
            }
            let mut loaded = None;
            let (seconds, bytes, report) = crate::loaders::run_tensora_once(&cell, &opts, &mut loaded)?;
            Ok((seconds, bytes, Some(serde_json::to_value(report)?), Box::new(loaded)))
        }
        Subject::PreadOnly => {
            drop(previous);
            let t = Instant::now();
            let bytes = tensora_testkit::pread_only(files, tensora_testkit::PreadOnly::TWO_THREADS_1_MIB)?;
            Ok((t.elapsed().as_secs_f64(), bytes, None, Box::new(())))
        }
        Subject::PeerRead => {
            drop(previous);
            let t = Instant::now();
            let (loaded, buffers) = crate::peers::st_read(files, names.as_ref())?;
            Ok((t.elapsed().as_secs_f64(), loaded.bytes, None, Box::new(buffers)))
        }
        Subject::PeerMmap => {
            drop(previous);
            let t = Instant::now();
            let (loaded, tensors) = crate::loaders::peer_mmap_once(files, names.as_ref())?;
            Ok((t.elapsed().as_secs_f64(), loaded.bytes, None, Box::new(tensors)))
        }
        other => bail!("{} is not measured in a tensora-bench child", other.name()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Command {
        let mut c = Command::new("sh");
        c.arg("-c").arg(script);
        c
    }

    #[test]
    fn a_child_that_follows_the_protocol_gives_a_sample_with_its_start() {
        // The child takes at least 0.2 s to say it is ready (a sleep lasts at least its time), and
        // the start is measured inside the call: both bounds hold however busy the machine is.
        let script = r#"sleep 0.2; echo ready; echo noise; echo '{"seconds": 0.5, "bytes": 1000000000}'"#;
        let called = Instant::now();
        let m = measure_child(&mut sh(script)).unwrap();
        let call_seconds = called.elapsed().as_secs_f64();
        assert_eq!((m.sample.seconds, m.sample.bytes), (0.5, 1_000_000_000));
        assert_eq!(m.sample.gbps, m.sample.bytes as f64 / m.sample.seconds / 1e9);
        let start = m.sample.start_seconds.expect("a start");
        assert!((0.2..=call_seconds).contains(&start), "started after {start} s of a {call_seconds} s call");
        assert_eq!(m.details, None);
    }

    #[test]
    fn broken_children_are_errors_that_say_why() {
        let cases = [
            ("echo ready; echo oops >&2; exit 3", "exit status: 3"),
            ("echo '{\"seconds\": 1, \"bytes\": 1}'", "never said it was ready"),
            ("echo ready", "printed no result"),
            ("echo ready; echo '{\"seconds\": 0, \"bytes\": 1}'", "0 seconds"),
            ("echo ready; echo '{\"bytes\": 1}'", "child result"),
        ];
        for (script, want) in cases {
            let e = format!("{:#}", measure_child(&mut sh(script)).unwrap_err());
            assert!(e.contains(want), "{script}: {e}");
        }
        let e = format!("{:#}", measure_child(&mut Command::new("/nonexistent/child")).unwrap_err());
        assert!(e.contains("spawn"), "{e}");
    }

    #[test]
    fn a_child_that_never_ends_is_killed_at_the_bound() {
        // The child blocks on its stdin, which stays open; only the bound can end the wait. Every
        // try must end killed, no sooner than its bound, with at most the child's one line read.
        // The bound doubles until a try reads that line before it (a child slow to start on a busy
        // machine is not a failure), so the test asks for the order of events, not their speed.
        const BOUND_FIRST: Duration = Duration::from_millis(200);
        const TRIES_MAX: u32 = 8; // the last bound: 25.6 s
        let mut read_in_time = false;
        for attempt in 0..TRIES_MAX {
            let bound = BOUND_FIRST * 2u32.pow(attempt);
            let mut cmd = sh("echo ready; read x");
            cmd.stdin(Stdio::piped());
            let mut lines = Vec::new();
            let started = Instant::now();
            let e = run_lines(&mut cmd, bound, 1 << 10, &mut |l| lines.push(l.to_owned())).unwrap_err();
            assert!(e.to_string().contains("killed"), "{e}");
            assert!(
                started.elapsed() >= bound,
                "killed after {:?}, before its bound {bound:?}",
                started.elapsed()
            );
            assert!(lines.is_empty() || lines == ["ready"], "{lines:?}");
            if lines == ["ready"] {
                read_in_time = true;
                break;
            }
        }
        assert!(read_in_time, "no try read the child's line before the bound killed it");
    }

    #[test]
    fn output_past_the_bound_is_not_read() {
        let mut n = 0usize;
        // The child may or may not outlive the closed pipe (SIGPIPE): only the lines read count.
        let script = "for i in 1 2 3 4 5 6 7 8; do echo 0123456789; done";
        let _ = run_lines(&mut sh(script), Duration::from_secs(60), 25, &mut |_| n += 1);
        // 25 bytes: two whole lines and a partial third.
        assert_eq!(n, 3);
    }

    #[test]
    fn specs_round_trip_and_a_device_situation_is_refused() {
        let spec = ChildSpec {
            subject: Subject::Tensora("auto".into()),
            open_path: "/nonexistent".into(),
            data_files: vec![],
            scope: Scope::Full,
            mode: Mode::Owned,
            situation: Situation::Device,
            drop: Some(DropMethod::FadviseDontneed),
            streaming_budget_bytes: 1,
        };
        let json = serde_json::to_string(&spec).unwrap();
        assert_eq!(serde_json::from_str::<ChildSpec>(&json).unwrap(), spec);
        let e = run_spec(&spec).unwrap_err();
        assert!(e.to_string().contains("not device"), "{e}");
    }
}
