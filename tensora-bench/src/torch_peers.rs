//! The Python peers' bench of the bindings, inside `cargo xtask bench`.
//!
//! `tensora-py/bench/bench_load.py` measures, interleaved in one run, warm and cold: HF numpy and
//! torch, Run:ai's streamer, fastsafetensors (CPU), `tensora.load_file` owned and
//! `residence="auto"`, and `weights_iterator`, all ending with the same touched torch tensors,
//! beside its own roofline. It runs in the provisioned venv ([`crate::python::venv_dir`]: torch,
//! every peer and tensora, which `cargo xtask bench` provisions before it starts the bench); its
//! hook `run_python_peers.sh` runs it there, or says in one line why it cannot (exit 3). The bench
//! runs the hook on the main fixture and keeps its JSON and Markdown in the report; a skip is
//! reported with its reason, never as a failure.
//!
//! The same hook runs `bench_restarts.py` (issue 40's situation (c): the checkpoint's pages
//! dropped once, then a cold start and restarts, each a fresh process; `tensora.load_file`
//! `residence="auto"`, the `tensora load` CLI built beside the bench, HF torch and the ideal):
//! a short sequence in `--quick`, four restarts and four processes together by default, and with
//! `--full` three sequences of every subject, four together and the memory-limited case.
//!
//! ```text
//! cargo xtask bench                # the peers' table appears under "Python peers", then "Restarts"
//! ```

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::bench::{BenchConfig, PlanKind};

/// Bound on the whole hook run (every subject, warm and cold).
pub const HOOK_SECONDS_MAX: u64 = 900;
/// Bound on the hook's output kept (its JSON goes to a file; stdout carries the table).
const HOOK_OUTPUT_BYTES_MAX: usize = 1 << 20;
/// The hook's exit status for "skipped" (see `run_python_peers.sh`).
const HOOK_SKIPPED: i32 = 3;

/// What became of the Python peers in this run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TorchPeers {
    /// `ran`, `skipped` or `failed`.
    pub status: String,
    /// Why it was skipped or failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
    /// The bench's own table (`bench_load.py`'s `markdown`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub markdown: Option<String>,
    /// `bench_load.py --json` (schema 2: `temps.{warm,cold}.results.SUBJECT`, `acceptance`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub results: Option<serde_json::Value>,
    /// Wall time of the hook.
    pub seconds: f64,
}

impl TorchPeers {
    fn not_run(status: &str, why: String, seconds: f64) -> TorchPeers {
        TorchPeers { status: status.to_owned(), why: Some(why), markdown: None, results: None, seconds }
    }

    /// The Markdown section of the report, under `title`.
    pub fn markdown_section(&self, title: &str) -> String {
        let mut s = format!("\n## {title}\n\n");
        match (&self.markdown, &self.why) {
            (Some(table), _) => s.push_str(table.trim_end()),
            (None, Some(why)) => s.push_str(&format!("{}: {why}", self.status)),
            (None, None) => s.push_str(&self.status),
        }
        s.push_str("\n\n");
        s
    }
}

/// The hook's `bench_load.py` options for `plan`, or `None` when the plan leaves the peers out.
fn hook_options(plan: PlanKind, runs: usize) -> Option<Vec<String>> {
    match plan {
        // The quick bench runs in `cargo xtask test`, where tensora-py's own tests run the hook.
        PlanKind::Quick => None,
        // One timed warm load per subject keeps the default bench short (cold: `--full`, or
        // bench_load.py itself). The main fixture is Llama-shaped, so transformers'
        // `from_pretrained` is measured too, without and with `tensora.patch()`.
        PlanKind::Default => Some(
            ["--runs", "1", "--warmups", "0", "--temps", "warm", "--with-models"].map(String::from).to_vec(),
        ),
        PlanKind::Full => Some(vec!["--runs".into(), runs.to_string(), "--with-models".into()]),
    }
}

/// The hook's `bench_restarts.py` options for `plan` (`cli`: the `tensora` binary).
fn restarts_options(plan: PlanKind, cli: &Path) -> Vec<String> {
    let (sequences, restarts, subjects, together) = match plan {
        // A small sequence keeps the quick bench short: one cold start and one restart.
        PlanKind::Quick => ("1", "1", "auto,cli", "0"),
        PlanKind::Default => ("1", "4", "auto,hf_torch,cli", "4"),
        PlanKind::Full => ("3", "4", "auto,owned,hf_torch,hf_numpy,runai,fastsafetensors,cli", "4"),
    };
    let mut out = ["--restarts", "--sequences", sequences, "--restarts", restarts, "--subjects", subjects]
        .map(String::from)
        .to_vec();
    out.extend(["--together".into(), together.into(), "--cli".into(), cli.display().to_string()]);
    if plan != PlanKind::Full {
        out.push("--no-limited".into());
    }
    out
}

/// The restarts section's title in the report.
pub const RESTARTS_TITLE: &str = "Restarts (tensora-py/bench/bench_restarts.py)";
/// The Python peers section's title in the report.
pub const PEERS_TITLE: &str = "Python peers (tensora-py/bench/bench_load.py)";

/// Run the hook on `fixture` (a checkpoint directory or file) for `config`'s plan.
pub fn run(config: &BenchConfig, fixture: &Path, log: &mut dyn FnMut(&str)) -> TorchPeers {
    let started = Instant::now();
    let Some(options) = hook_options(config.plan, config.runs) else {
        return TorchPeers::not_run(
            "skipped",
            "not in --quick (tensora-py's tests run the hook)".into(),
            0.0,
        );
    };
    match run_hook(config, fixture, &options, "python-peers.json", log) {
        Ok(peers) => peers,
        Err(e) => TorchPeers::not_run("failed", format!("{e:#}"), started.elapsed().as_secs_f64()),
    }
}

/// Run the restarts bench through the hook on `fixture` for `config`'s plan, with the `tensora`
/// binary built beside the bench (`cargo xtask bench` builds it).
pub fn run_restarts(config: &BenchConfig, fixture: &Path, log: &mut dyn FnMut(&str)) -> TorchPeers {
    let started = Instant::now();
    let cli = std::env::current_exe().ok().and_then(|e| e.parent().map(|d| d.join("tensora")));
    let Some(cli) = cli.filter(|p| p.is_file()) else {
        return TorchPeers::not_run("skipped", "no tensora binary beside the bench".into(), 0.0);
    };
    match run_hook(config, fixture, &restarts_options(config.plan, &cli), "restarts.json", log) {
        Ok(peers) => peers,
        Err(e) => TorchPeers::not_run("failed", format!("{e:#}"), started.elapsed().as_secs_f64()),
    }
}

fn run_hook(
    config: &BenchConfig,
    fixture: &Path,
    options: &[String],
    out_name: &str,
    log: &mut dyn FnMut(&str),
) -> Result<TorchPeers> {
    let started = Instant::now();
    let hook = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tensora-py/bench/run_python_peers.sh");
    let out = config.report_dir().join(out_name);
    std::fs::create_dir_all(config.report_dir())?;
    let _ = std::fs::remove_file(&out);
    log(&format!("python peers: {} {} ...", hook.display(), options.join(" ")));
    let mut cmd = Command::new("bash");
    // The venv the bench's own peers use: one rule for both (the hook's fallback is for its
    // standalone use).
    cmd.arg(&hook)
        .arg(fixture)
        .arg(&out)
        .args(options)
        .env(crate::python::VENV_VAR, crate::python::venv_dir());
    let mut stdout = String::new();
    let run = crate::child::run_lines(
        &mut cmd,
        Duration::from_secs(HOOK_SECONDS_MAX),
        HOOK_OUTPUT_BYTES_MAX,
        &mut |line| {
            stdout.push_str(line);
            stdout.push('\n');
        },
    )?;
    let seconds = started.elapsed().as_secs_f64();
    if !run.success {
        let skipped = run.code == Some(HOOK_SKIPPED);
        let why = if skipped { stdout.trim().to_owned() } else { last_lines(&run.stderr, 5) };
        log(&format!("python peers: {}", why.lines().last().unwrap_or("")));
        let status = if skipped { "skipped" } else { "failed" };
        return Ok(TorchPeers::not_run(status, format!("{why} ({})", run.status), seconds));
    }
    let text = std::fs::read_to_string(&out).with_context(|| format!("read {}", out.display()))?;
    let results: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("parse {}", out.display()))?;
    let markdown = results.get("markdown").and_then(|m| m.as_str()).map(str::to_owned);
    log(&format!("python peers: ran in {seconds:.1} s"));
    Ok(TorchPeers { status: "ran".into(), why: None, markdown, results: Some(results), seconds })
}

/// The last `n` lines of `text`, joined.
fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quick_leaves_the_peers_out_and_the_others_bound_their_runs() {
        assert_eq!(hook_options(PlanKind::Quick, 3), None);
        assert_eq!(
            hook_options(PlanKind::Default, 3).unwrap(),
            ["--runs", "1", "--warmups", "0", "--temps", "warm", "--with-models"]
        );
        assert_eq!(hook_options(PlanKind::Full, 5).unwrap(), ["--runs", "5", "--with-models"]);
    }

    #[test]
    fn a_skip_is_reported_with_its_reason() {
        let p = TorchPeers::not_run("skipped", "python peers skipped: no venv".into(), 0.1);
        let md = p.markdown_section(PEERS_TITLE);
        assert!(md.starts_with("\n## Python peers"), "{md}");
        assert!(md.contains("skipped: python peers skipped: no venv"), "{md}");
        assert_eq!(last_lines("a\nb\nc", 2), "b\nc");
    }

    #[test]
    fn restarts_are_short_in_quick_and_complete_in_full() {
        let cli = Path::new("/x/tensora");
        let quick = restarts_options(PlanKind::Quick, cli).join(" ");
        assert_eq!(
            quick,
            "--restarts --sequences 1 --restarts 1 --subjects auto,cli --together 0 --cli /x/tensora --no-limited"
        );
        let full = restarts_options(PlanKind::Full, cli).join(" ");
        assert!(
            full.starts_with("--restarts --sequences 3 --restarts 4 --subjects auto,owned,hf_torch"),
            "{full}"
        );
        assert!(full.contains("--together 4") && !full.contains("--no-limited"), "{full}");
        assert!(restarts_options(PlanKind::Default, cli).join(" ").contains("--together 4"));
    }
}
