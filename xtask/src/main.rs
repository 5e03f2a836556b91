//! `cargo xtask <command>`: the project's automation, in Rust so it runs wherever cargo does.
#![forbid(unsafe_code)]

use std::process::{Command, ExitCode};

use anyhow::{Context, Result, bail};

const USAGE: &str = "usage: cargo xtask <test|bench|fixtures|fuzz> [options]

  test       fmt check, clippy -D warnings, every test (unit, integration, doc), quick bench
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("test") => test(&args[1..]),
        Some("-h" | "--help") | None => {
            print!("{USAGE}");
            Ok(())
        }
        Some(other) => Err(anyhow::anyhow!("unknown command {other:?}\n{USAGE}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Run a command from the workspace root, echoing it first; fail if it fails.
fn run(program: &str, args: &[&str]) -> Result<()> {
    eprintln!("$ {program} {}", args.join(" "));
    let status = Command::new(program)
        .args(args)
        .current_dir(workspace_root())
        .status()
        .with_context(|| format!("cannot start {program}"))?;
    if !status.success() {
        bail!("`{program} {}` failed with {status}", args.join(" "));
    }
    Ok(())
}

fn workspace_root() -> std::path::PathBuf {
    let manifest_dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest_dir.parent().unwrap_or(manifest_dir).to_path_buf()
}

fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string())
}

fn test(args: &[String]) -> Result<()> {
    if let Some(extra) = args.first() {
        bail!("`cargo xtask test` takes no arguments, got {extra:?}");
    }
    let cargo = cargo();
    run(&cargo, &["fmt", "--all", "--", "--check"])?;
    run(&cargo, &["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"])?;
    run(&cargo, &["test", "--workspace", "--all-targets"])?;
    run(&cargo, &["test", "--workspace", "--doc"])?;
    Ok(())
}
