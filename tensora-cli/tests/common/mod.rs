//! What the CLI's integration tests share: the fixture paths, running the built binary, and the
//! one-error-line check every failing command must pass. Each test binary uses part of it.
#![allow(dead_code)]

use std::process::{Command, Output};

/// The real HF-written checkpoints (with `*.expected.json`).
pub const REAL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/real");
/// The upstream-layout ServerlessLLM checkpoint.
pub const SLLM_TINY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/serverlessllm/tiny");

/// Runs `tensora ARGS...` and collects its output.
pub fn tensora(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tensora")).args(args).output().expect("run tensora")
}

/// Exit status 1 and exactly one stderr line, starting `error: `. Returns that line.
pub fn assert_one_error_line(out: &Output) -> String {
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(lines[0].starts_with("error: "), "{stderr}");
    lines[0].to_owned()
}
