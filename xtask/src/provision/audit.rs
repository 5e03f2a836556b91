//! The provisioning's own check, run by `cargo xtask test` before anything is built: every program
//! the code starts and every tool a test looks up comes from a place the provisioning fills, so a
//! test that needs a new server fails CI (naming the table to extend) instead of a new user.
//!
//! In every tracked `*.rs` and `*.py` file, each program started by its literal name (Rust's
//! `Command::new`, Python's `subprocess` calls and `shutil.which`) must be a base program
//! ([`BASE_PROGRAMS`]: on every Debian or Ubuntu machine), python3, or the program of a provisioned
//! system package ([`super::system::PACKAGES`]); each call of the remote tests' `tool_dir` (its
//! variable and directory name, how they find a server) must name a provisioned tool
//! ([`super::TOOLS`]) with that variable and that directory, and a `TENSORA_…_DIR` variable named in
//! a test must be a provisioned tool's.

use std::fmt;
use std::path::Path;

use anyhow::{Context, Result, bail};

use super::system::{PACKAGES, Probe};
use super::{TOOLS, step::say};

/// Programs every Debian or Ubuntu machine has (coreutils, util-linux, bash, procps) and git,
/// which made the checkout.
pub const BASE_PROGRAMS: &[&str] =
    &["bash", "sh", "id", "mkfifo", "mount", "umount", "fincore", "git", "python3"];

/// Programs that only a manual script starts, never `cargo xtask test` or `bench`: `(file,
/// program)`, each with the reason in its comment.
const MANUAL_ONLY: &[(&str, &str)] = &[
    // The collective bench caps the loopback's bandwidth with `tc` (iproute2); it runs as root, by
    // hand (its docstring), and says so and stops where `tc` is missing.
    ("tensora-py/bench/bench_collective.py", "tc"),
];

/// How a program is started in Python, followed by its name as a string literal.
const PY_STARTS: &[&str] = &[
    "subprocess.run([\"",
    "subprocess.Popen([\"",
    "subprocess.call([\"",
    "subprocess.check_call([\"",
    "subprocess.check_output([\"",
    "shutil.which(\"",
];

/// Something a test or tool starts that the provisioning does not install.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// The file, relative to the workspace root.
    pub file: String,
    /// 1-based line.
    pub line: usize,
    /// What is wrong.
    pub what: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.file, self.line, self.what)
    }
}

/// Whether `program` is installed by the provisioning or present on every machine.
fn provisioned_program(program: &str) -> bool {
    BASE_PROGRAMS.contains(&program)
        || PACKAGES.iter().any(|p| matches!(p.probe, Probe::Program(name) if name == program))
        // A path the code computes (a test's own binary, a probe of a missing one) is not a
        // system program.
        || program.contains('/')
}

/// The findings in one file's text.
pub fn scan(file: &str, text: &str) -> Vec<Finding> {
    let mut out = Vec::new();
    let is_rust = file.ends_with(".rs");
    let in_tests = file.split('/').any(|c| c == "tests");
    for (i, line) in text.lines().enumerate() {
        let mut add = |what: String| out.push(Finding { file: file.to_owned(), line: i + 1, what });
        let starts: &[&str] = if is_rust { &["Command::new(\""] } else { PY_STARTS };
        for program in starts.iter().flat_map(|s| literals_after(line, s)) {
            if !provisioned_program(program) && !MANUAL_ONLY.contains(&(file, program)) {
                add(format!(
                    "starts `{program}`, which `cargo xtask provision` does not install: add its package to \
                     xtask/src/provision/system.rs (PACKAGES) or its tool to xtask/src/provision/mod.rs (TOOLS)"
                ));
            }
        }
        if !is_rust {
            continue;
        }
        for call in line.match_indices("tool_dir(\"").map(|(at, _)| &line[at..]) {
            let mut args =
                literals_after(call, "tool_dir(\"").into_iter().chain(literals_after(call, "\", \""));
            let (var, dir) = (args.next().unwrap_or(""), args.next().unwrap_or(""));
            if !TOOLS.iter().any(|t| t.var == var && t.dir == dir) {
                add(format!(
                    "looks up the tool {var}={dir:?}, which no entry of TOOLS in xtask/src/provision/mod.rs \
                     provisions (same variable and directory)"
                ));
            }
        }
        for var in tool_variables(line).filter(|_| in_tests) {
            if !TOOLS.iter().any(|t| t.var == var) {
                add(format!("reads {var}, which no entry of TOOLS in xtask/src/provision/mod.rs sets"));
            }
        }
    }
    out
}

/// The string literal that starts right after each `needle` (which ends with its opening quote).
fn literals_after<'a>(line: &'a str, needle: &str) -> Vec<&'a str> {
    line.match_indices(needle)
        .filter_map(|(at, _)| {
            let rest = &line[at + needle.len()..];
            rest.find('"').map(|end| &rest[..end])
        })
        .collect()
}

/// Every `"TENSORA_…_DIR"` literal on `line`.
fn tool_variables(line: &str) -> impl Iterator<Item = &str> {
    line.split('"').skip(1).step_by(2).filter(|s| {
        s.starts_with("TENSORA_")
            && s.ends_with("_DIR")
            && s.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
    })
}

/// The check on the repository at `root`: fails listing every finding.
pub fn run(root: &Path) -> Result<()> {
    let mut findings = Vec::new();
    let mut files = 0usize;
    for file in crate::selfcheck::git_files(root, &["--", "*.rs", "*.py"])? {
        let text = match std::fs::read(root.join(&file)) {
            Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e).with_context(|| format!("cannot read {file}")),
        };
        files += 1;
        findings.extend(scan(&file, &text));
    }
    if !findings.is_empty() {
        let list: Vec<String> = findings.iter().map(|f| format!("  {f}")).collect();
        bail!(
            "{} program(s) or tool(s) the provisioning does not install:\n{}",
            findings.len(),
            list.join("\n")
        );
    }
    say("audit", &format!("every program and tool started in {files} files is provisioned"));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unprovisioned_program_or_tool_is_a_finding() {
        let rust = "let c = Command::new(\"minio\").arg(x);\n\
                    let n = Command::new(\"node\");\n\
                    let d = tool_dir(\"TENSORA_MINIO_DIR\", \"tensora-remote-minio\");\n\
                    let s = tool_dir(\"TENSORA_S3RVER_DIR\", \"tensora-remote-s3rver\");\n\
                    let w = tool_dir(\"TENSORA_S3RVER_DIR\", \"elsewhere\");\n\
                    let e = std::env::var_os(\"TENSORA_MINIO_DIR\");\n\
                    let b = Command::new(env!(\"CARGO_BIN_EXE_tensora\"));\n";
        let found = scan("tensora-remote/tests/support/mod.rs", rust);
        let lines: Vec<usize> = found.iter().map(|f| f.line).collect();
        // tool_dir lines also name their variable: the minio one twice, the s3rver ones once.
        assert_eq!(lines, [1, 3, 3, 5, 6], "{found:#?}");
        assert!(found[0].what.starts_with("starts `minio`, which `cargo xtask provision` does not install"));
        assert!(found[1].what.contains("TENSORA_MINIO_DIR=\"tensora-remote-minio\""), "{}", found[1]);
        assert!(found[3].what.contains("TENSORA_S3RVER_DIR=\"elsewhere\""), "{}", found[3]);
        assert_eq!(
            found[0].to_string().split(':').take(2).collect::<Vec<_>>(),
            ["tensora-remote/tests/support/mod.rs", "1"]
        );
    }

    #[test]
    fn python_starts_are_checked_and_variables_only_in_tests() {
        let py = "if shutil.which(\"nginx\") is None:\n\
                  p = subprocess.Popen([\"minio\", \"server\"])\n\
                  r = subprocess.run([sys.executable, \"-c\", x])\n\
                  subprocess.run([\"bash\", str(HOOK)])\n";
        let found = scan("tensora-py/tests/test_x.py", py);
        assert_eq!(found.iter().map(|f| f.line).collect::<Vec<_>>(), [2], "{found:#?}");
        assert!(scan("tensora-remote/src/lib.rs", "let v = \"TENSORA_OTHER_DIR\";").is_empty());
        assert_eq!(scan("tensora-remote/tests/x.rs", "let v = \"TENSORA_OTHER_DIR\";").len(), 1);
        assert_eq!(literals_after("a(\"x\") b(\"y\")", "(\""), ["x", "y"]);
    }

    #[test]
    fn the_repository_passes() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        run(root).unwrap();
    }
}
