//! One install command of the provisioning, run with progress: the lines of its output that say
//! what it is doing (filtered by the caller), a line every [`HEARTBEAT`] while it is quiet, its
//! time at the end, and its last lines when it fails. Every wait is bounded ([`STEP_SECONDS_MAX`]).

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError, SyncSender};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// Bound on one install command: torch's CUDA wheels (about 3 GB) on a slow link fit in it.
pub const STEP_SECONDS_MAX: u64 = 3600;
/// A quiet command says it is still running this often.
pub const HEARTBEAT: Duration = Duration::from_secs(30);
/// Output lines kept for the message of a failed command.
const TAIL_LINES_MAX: usize = 12;
/// Bound on the lines queued between the output readers and the printer.
const LINE_QUEUE_MAX: usize = 256;
/// Longest piece of an output line handled at once; a longer line arrives in pieces.
const LINE_BYTES_MAX: u64 = 512;
/// How often the step checks whether the command has exited while its output is quiet.
const EXIT_POLL: Duration = Duration::from_millis(200);
/// After the command exits, its last lines are read for at most this long: a process it left
/// behind (a daemon a package started) may hold the output pipes open for ever.
const DRAIN_AFTER_EXIT: Duration = Duration::from_secs(2);

/// Which output lines of a command are shown while it runs (all are kept for a failure's message).
#[derive(Debug, Clone, Copy)]
pub enum Show {
    /// Lines that start (after leading spaces) with one of these.
    Starting(&'static [&'static str]),
    /// None: only the heartbeat and the final time.
    Nothing,
}

impl Show {
    fn shows(self, line: &str) -> bool {
        match self {
            Show::Starting(prefixes) => prefixes.iter().any(|p| line.trim_start().starts_with(p)),
            Show::Nothing => false,
        }
    }
}

/// `provision: LABEL: TEXT` on stderr: every line the provisioning prints has this form.
pub fn say(label: &str, text: &str) {
    eprintln!("provision: {label}: {text}");
}

/// Run `cmd` as the step `label` (`what` says what it does), showing its progress; fails with the
/// last lines of its output when it fails or runs past [`STEP_SECONDS_MAX`]. Returns its time.
pub fn run(label: &str, what: &str, cmd: &mut Command, show: Show) -> Result<Duration> {
    say(label, &format!("{what} ..."));
    let started = Instant::now();
    let program = cmd.get_program().to_string_lossy().into_owned();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("{label}: cannot start {program}"))?;
    let (tx, rx) = mpsc::sync_channel(LINE_QUEUE_MAX);
    let readers = [
        child.stdout.take().map(|out| forward(out, tx.clone())),
        child.stderr.take().map(|err| forward(err, tx.clone())),
    ];
    drop(tx);
    let deadline = started + Duration::from_secs(STEP_SECONDS_MAX);
    let mut tail = VecDeque::with_capacity(TAIL_LINES_MAX);
    let mut next_heartbeat = started + HEARTBEAT;
    let mut exited = None;
    let outputs = loop {
        let now = Instant::now();
        if now >= deadline {
            kill(&mut child);
            bail!("{label}: {what} ran past {STEP_SECONDS_MAX} s; its last lines:\n{}", joined(&tail));
        }
        if exited.is_none() {
            let polled = child.try_wait().with_context(|| format!("{label}: wait for {program}"))?;
            exited = polled.map(|status| (status, now));
        }
        if exited.is_some_and(|(_, at)| now >= at + DRAIN_AFTER_EXIT) {
            break Outputs::HeldOpen;
        }
        let wait = next_heartbeat.min(deadline).min(now + EXIT_POLL).saturating_duration_since(now);
        match rx.recv_timeout(wait) {
            Ok(line) => {
                if show.shows(&line) {
                    say(label, line.trim());
                }
                if tail.len() == TAIL_LINES_MAX {
                    tail.pop_front();
                }
                tail.push_back(line);
            }
            Err(RecvTimeoutError::Timeout) => {}
            // Both outputs closed: the command is exiting.
            Err(RecvTimeoutError::Disconnected) => break Outputs::Closed,
        }
        // Quiet or not, a long step says what it is at.
        if Instant::now() >= next_heartbeat {
            let last = tail.back().map_or(String::new(), |l| format!("; last: {}", l.trim()));
            say(label, &format!("still running ({} s{last})", started.elapsed().as_secs()));
            next_heartbeat += HEARTBEAT;
        }
    };
    // Readers of pipes that a leftover process holds open stay blocked: they are left to end
    // with it (or with this process) rather than joined.
    if outputs == Outputs::Closed {
        for reader in readers.into_iter().flatten() {
            let _ = reader.join();
        }
    }
    let status = match exited {
        Some((status, _)) => status,
        None => child.wait().with_context(|| format!("{label}: wait for {program}"))?,
    };
    let took = started.elapsed();
    if !status.success() {
        bail!(
            "{label}: {what} failed ({status}) after {:.1} s; its last lines:\n{}",
            took.as_secs_f64(),
            joined(&tail)
        );
    }
    say(label, &format!("done in {:.1} s", took.as_secs_f64()));
    Ok(took)
}

/// How the output of a step's command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outputs {
    /// Both pipes closed.
    Closed,
    /// The command exited [`DRAIN_AFTER_EXIT`] ago and something still holds a pipe open.
    HeldOpen,
}

/// Run `cmd` to ask a question (a version, an import): its stdout when it succeeds, `None` when it
/// cannot start or fails. For quick probes only (no progress, no bound beyond the command's own).
pub fn probe(cmd: &mut Command) -> Option<String> {
    let out = cmd.stdin(Stdio::null()).stderr(Stdio::null()).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// A thread that sends `reader`'s lines (in pieces of at most [`LINE_BYTES_MAX`]) to `tx`.
fn forward(reader: impl Read + Send + 'static, tx: SyncSender<String>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(reader);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match (&mut reader).take(LINE_BYTES_MAX).read_until(b'\n', &mut buf) {
                Ok(0) | Err(_) => return,
                Ok(_) => {
                    let line = String::from_utf8_lossy(&buf).trim_end().to_owned();
                    if tx.send(line).is_err() {
                        return;
                    }
                }
            }
        }
    })
}

fn kill(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

fn joined(tail: &VecDeque<String>) -> String {
    tail.iter().map(|l| format!("  {l}")).collect::<Vec<_>>().join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_succeeds_and_a_failing_one_names_its_last_lines() {
        let ok =
            run("t", "echo", Command::new("sh").args(["-c", "echo Installed x; echo hidden"]), Show::Nothing);
        assert!(ok.is_ok(), "{ok:?}");
        // stdout and stderr are read apart: the pause orders the last line.
        let script = "for i in $(seq 1 40); do echo line$i; done; sleep 0.3; echo oops >&2; exit 3";
        let e = run("t", "fail", Command::new("sh").args(["-c", script]), Show::Starting(&["line1"]))
            .unwrap_err();
        let e = format!("{e:#}");
        assert!(e.starts_with("t: fail failed (exit status: 3)"), "{e}");
        assert!(e.contains("  oops") && e.contains("  line40") && !e.contains("line20\n"), "{e}");
        let e = run("t", "nothing", &mut Command::new("/nonexistent/program"), Show::Nothing).unwrap_err();
        assert!(format!("{e:#}").contains("cannot start /nonexistent/program"), "{e:#}");
    }

    #[test]
    fn a_long_line_arrives_in_bounded_pieces() {
        let script = "head -c 2000 /dev/zero | tr '\\0' a; echo";
        let (tx, rx) = mpsc::sync_channel(LINE_QUEUE_MAX);
        let out = Command::new("sh").args(["-c", script]).stdout(Stdio::piped()).spawn().unwrap();
        let mut out = out;
        forward(out.stdout.take().unwrap(), tx).join().unwrap();
        let _ = out.wait();
        let pieces: Vec<String> = rx.iter().collect();
        assert_eq!(pieces.iter().map(String::len).sum::<usize>(), 2000);
        assert!(pieces.iter().all(|p| p.len() as u64 <= LINE_BYTES_MAX), "{:?}", pieces.len());
    }

    #[test]
    fn a_step_ends_when_its_command_exits_even_if_a_leftover_process_holds_the_output() {
        // The background sleep keeps stdout open for 60 s after `sh` exits: the step must end
        // about DRAIN_AFTER_EXIT after the exit, not when the pipe closes.
        let started = Instant::now();
        let took = run(
            "test",
            "leave a process behind",
            Command::new("sh").args(["-c", "sleep 60 & echo started"]),
            Show::Nothing,
        )
        .expect("the command itself succeeds");
        assert!(took < Duration::from_secs(30), "waited {took:?} for a pipe the leftover held");
        assert!(started.elapsed() >= DRAIN_AFTER_EXIT);
        let failing = run(
            "test",
            "fail and leave a process behind",
            Command::new("sh").args(["-c", "sleep 60 & exit 3"]),
            Show::Nothing,
        );
        let message = format!("{:#}", failing.expect_err("exit 3 is a failure"));
        assert!(message.contains("failed"), "{message}");
    }

    #[test]
    fn shown_lines_match_their_prefixes() {
        let show = Show::Starting(&["Installed", "added"]);
        assert!(show.shows("  Installed 3 packages"));
        assert!(show.shows("added 120 packages in 9s"));
        assert!(!show.shows("Resolving"));
        assert!(!Show::Nothing.shows("Installed"));
        assert_eq!(probe(Command::new("sh").args(["-c", "echo 1.2"])), Some("1.2".to_owned()));
        assert_eq!(probe(Command::new("sh").args(["-c", "exit 1"])), None);
        assert_eq!(probe(&mut Command::new("/nonexistent/program")), None);
    }
}
