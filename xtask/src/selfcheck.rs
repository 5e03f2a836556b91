//! `cargo xtask selfcheck`, the first step of `cargo xtask test`: the repository is self-contained,
//! ARCHITECTURE.md is true to the code (the crates, files and folders it names exist, its crate
//! graph is the manifests': [`map`]), and the prose that lists what the provisioning installs names
//! exactly the tools it installs ([`tools`]).
//!
//! Every tracked code, script and config file (`*.rs`, `*.py`, `*.pyi`, `*.sh`, `*.toml`, and
//! everything under `.ci/`, as `git ls-files` lists them) is scanned line by line, comments and doc
//! comments included (doctests run). A line fails the check when it refers to a path outside the
//! repository:
//!
//! 1. **Climbing out**: a relative path whose `..` components climb above the repository root,
//!    resolved from the directory of the file (`#[path]`, `include_str!`, a script's
//!    `"$(dirname "$0")/.."`, a manifest's `path = "../x"`) or, on a line that names
//!    `CARGO_MANIFEST_DIR` (or within the two lines after one, for a `concat!` that rustfmt split),
//!    from the crate's directory: `concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures")` stays
//!    inside, one more `..` does not.
//! 2. **The old shared directory**: a `..` component followed by one named `shared`, wherever it
//!    resolves: fixtures live in `fixtures/` now.
//! 3. **A machine's own files**: an absolute path (or a `file://` URL) whose first component is a
//!    user or machine location that no other checkout has ([`MACHINE_ROOTS`]: home directories,
//!    mounts, `opt`, `srv`, `var` other than `var/tmp`, working trees such as `work`), and a path
//!    in a home directory (a tilde and a slash).
//!
//! Allowed absolute paths, the system locations tests use legitimately ([`SYSTEM_ROOTS`]): the
//! temp directories (`tmp`, `var/tmp`), the kernel's interfaces (`dev`, `proc`, `sys`), installed
//! programs and libraries (`usr`, `bin`, `sbin`, `lib`, `lib64`), system configuration (`etc`), and
//! `nonexistent`, the conventional path of not-found tests. Any other absolute path (`"/m/a"`,
//! `"/x.safetensors"`) names no real location: it is a label in a test of messages or parsing, and
//! is allowed.
//!
//! Fix an offence by copying what the file reads into `fixtures/` (see `fixtures/README.md`) and
//! referring to it from inside the repository; generated files belong in the system temp
//! directory or `target/`. The scan has no opt-out: its own tests build their bad paths at run
//! time.

/// A path into the user's home directory (spelled in two parts so this file does not flag itself).
const HOME_PREFIX: &str = concat!("~", "/");

use std::collections::HashSet;
use std::fmt;
use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};

mod map;
mod tools;

/// First components of absolute paths that tests use legitimately: temp directories, kernel
/// interfaces, installed programs and system configuration (`var` only as `var/tmp`).
pub const SYSTEM_ROOTS: &[&str] =
    &["tmp", "dev", "proc", "sys", "usr", "bin", "sbin", "lib", "lib64", "etc", "nonexistent"];

/// First components of absolute paths that name one machine's or one user's files: never part of a
/// checkout, so a reference to them passes here and fails everywhere else.
pub const MACHINE_ROOTS: &[&str] = &[
    "home",
    "root",
    "Users",
    "Volumes",
    "work",
    "workspace",
    "shared",
    "scratch",
    "mnt",
    "media",
    "opt",
    "srv",
    "run",
    "boot",
    "var",
    "nix",
    "snap",
];

/// Lines after a `CARGO_MANIFEST_DIR` that still belong to its `concat!`.
const MANIFEST_DIR_REACH_LINES: usize = 2;

/// Why a path leaves the repository.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// Its `..` components climb above the repository root.
    ClimbsAboveRoot,
    /// It names the old `shared` directory beside the repository.
    SharedDir,
    /// An absolute path into one machine's or one user's files.
    MachinePath,
}

impl fmt::Display for Why {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Why::ClimbsAboveRoot => "climbs above the repository root",
            Why::SharedDir => "names the shared directory outside the repository",
            Why::MachinePath => "is an absolute path into this machine's own files",
        })
    }
}

/// One reference to a path outside the repository.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Offence {
    /// The file, relative to the repository root.
    pub file: String,
    /// 1-based line number.
    pub line: usize,
    /// The path as written.
    pub path: String,
    /// What is wrong with it.
    pub why: Why,
    /// The whole line, trimmed.
    pub text: String,
}

impl fmt::Display for Offence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: `{}` {}\n    {}", self.file, self.line, self.path, self.why, self.text)
    }
}

/// Whether the check reads `file` (a path relative to the repository root).
pub fn is_checked(file: &str) -> bool {
    let name = file.rsplit('/').next().unwrap_or(file);
    let code = [".rs", ".py", ".pyi", ".sh", ".toml"].iter().any(|ext| name.ends_with(ext));
    code || file.starts_with(".ci/")
}

/// The paths `git ls-files -z ARGS` lists under `root` (the one home of that call in xtask).
pub fn git_files(root: &Path, args: &[&str]) -> Result<Vec<String>> {
    let out = Command::new("git")
        .args(["ls-files", "-z"])
        .args(args)
        .current_dir(root)
        .output()
        .context("cannot run git ls-files")?;
    if !out.status.success() {
        bail!("git ls-files failed: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(out
        .stdout
        .split(|&b| b == 0)
        .filter(|f| !f.is_empty())
        .map(|f| String::from_utf8_lossy(f).into_owned())
        .collect())
}

/// The check on the repository at `root`: every offence found, or an error when git cannot list
/// the files.
pub fn check(root: &Path) -> Result<Vec<Offence>> {
    let files = git_files(root, &[])?;
    let crates: HashSet<String> = files
        .iter()
        .filter_map(|f| f.strip_suffix("Cargo.toml"))
        .map(|dir| dir.trim_end_matches('/').to_owned())
        .collect();
    let mut offences = Vec::new();
    for file in files.iter().filter(|f| is_checked(f)) {
        let text = match std::fs::read(root.join(file)) {
            Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
            // Deleted in the working tree but not yet in the index: nothing to read.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e).with_context(|| format!("cannot read {file}")),
        };
        offences.extend(scan(file, &crate_dir(file, &crates), &text));
    }
    Ok(offences)
}

/// `cargo xtask selfcheck`: fail with every offence, each with its file, line and text, and what
/// to do about it; with every mistake in ARCHITECTURE.md ([`map`]) and in the prose listing the
/// provisioned tools ([`tools`]).
pub fn run(root: &Path) -> Result<()> {
    let offences = check(root)?;
    let map_errors = map::check(root)?;
    let mut failures = Vec::new();
    if offences.is_empty() {
        eprintln!("selfcheck: no tracked file refers to a path outside the repository");
    } else {
        let list: Vec<String> = offences.iter().map(ToString::to_string).collect();
        failures.push(format!(
            "the repository must be self-contained, but {} line(s) refer to a path outside it:\n{}\n\
             Copy what they read into fixtures/ (see fixtures/README.md) and refer to it from inside the \
             repository, e.g. concat!(env!(\"CARGO_MANIFEST_DIR\"), \"/../fixtures/...\"); write \
             generated files to the system temp directory or target/.",
            offences.len(),
            list.join("\n")
        ));
    }
    if map_errors.is_empty() {
        eprintln!(
            "selfcheck: {} names only crates, files and folders that exist, and its crate graph is the manifests'",
            map::MAP_FILE
        );
    } else {
        let list: Vec<String> = map_errors.iter().map(ToString::to_string).collect();
        failures.push(format!(
            "{} is not true to the code in {} place(s) (rules: xtask/src/selfcheck/map.rs):\n{}",
            map::MAP_FILE,
            map_errors.len(),
            list.join("\n")
        ));
    }
    let prose_errors = tools::check(root)?;
    if prose_errors.is_empty() {
        eprintln!(
            "selfcheck: the prose that lists the provisioned tools names every tool of TOOLS and no other"
        );
    } else {
        let list: Vec<String> = prose_errors.iter().map(ToString::to_string).collect();
        failures.push(format!(
            "the prose does not list the provisioned tools in {} place(s) (rules: xtask/src/selfcheck/tools.rs):\n{}",
            prose_errors.len(),
            list.join("\n")
        ));
    }
    if failures.is_empty() { Ok(()) } else { bail!("{}", failures.join("\n")) }
}

/// The directory of the crate holding `file`: the deepest directory with a tracked `Cargo.toml`
/// above it (`""` is the repository root).
pub fn crate_dir(file: &str, crates: &HashSet<String>) -> String {
    let mut dir = parent(file);
    loop {
        if crates.contains(dir) || dir.is_empty() {
            return dir.to_owned();
        }
        dir = parent(dir);
    }
}

/// `a/b/c` -> `a/b`; `c` -> ``.
fn parent(path: &str) -> &str {
    path.rfind('/').map_or("", |i| &path[..i])
}

/// Every offence in `text`, the contents of `file` (relative to the repository root) in the crate
/// at `crate_dir`.
pub fn scan(file: &str, crate_dir: &str, text: &str) -> Vec<Offence> {
    let lines: Vec<&str> = text.lines().collect();
    let mut offences = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let from_manifest_dir = lines[i.saturating_sub(MANIFEST_DIR_REACH_LINES)..=i]
            .iter()
            .any(|l| l.contains("CARGO_MANIFEST_DIR"));
        let base = if from_manifest_dir { crate_dir } else { parent(file) };
        for token in tokens(line) {
            if let Some(why) = judge(&token, base, from_manifest_dir) {
                offences.push(Offence {
                    file: file.to_owned(),
                    line: i + 1,
                    path: token.text.to_owned(),
                    why,
                    text: line.trim().to_owned(),
                });
            }
        }
    }
    offences
}

/// A run of path characters in a line, and the character before it.
#[derive(Debug)]
struct Token<'a> {
    text: &'a str,
    before: Option<char>,
    /// The text of the line before the token (to recognise `file://`).
    prefix: &'a str,
}

fn is_path_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '/' | '~' | '$')
}

/// The maximal runs of path characters of `line`.
fn tokens(line: &str) -> Vec<Token<'_>> {
    let mut out = Vec::new();
    let mut start = None;
    for (i, c) in line.char_indices().chain([(line.len(), ' ')]) {
        match (start, is_path_char(c)) {
            (None, true) => start = Some(i),
            (Some(s), false) => {
                let before = line[..s].chars().next_back();
                out.push(Token { text: &line[s..i], before, prefix: &line[..s] });
                start = None;
            }
            _ => {}
        }
    }
    out
}

/// Where a path may start: the line's start, blank space, a quote or an opening bracket, `=` or
/// `,` (not after `}` of a format argument, `)` of a shell substitution or `:` of a URL).
fn starts_a_path(before: Option<char>) -> bool {
    before.is_none_or(|c| c.is_whitespace() || matches!(c, '"' | '\'' | '`' | '(' | '[' | '=' | ','))
}

/// What, if anything, is wrong with `token`, read relative to `base` (a directory relative to the
/// repository root). `from_manifest_dir`: the line builds on `CARGO_MANIFEST_DIR`, so a token
/// starting with `/` continues that directory.
fn judge(token: &Token<'_>, base: &str, from_manifest_dir: bool) -> Option<Why> {
    let text = token.text;
    let parts: Vec<&str> = text.split('/').collect();
    if parts.contains(&"..") {
        return climb(base, &parts);
    }
    if text.starts_with(HOME_PREFIX) && starts_a_path(token.before) {
        return Some(Why::MachinePath);
    }
    let absolute = if token.prefix.ends_with("file:") && text.starts_with("///") {
        &text[2..]
    } else if text.starts_with('/') && !text.starts_with("//") && starts_a_path(token.before) {
        if from_manifest_dir && token.before == Some('"') {
            // `concat!(env!("CARGO_MANIFEST_DIR"), "/tests/x")`: inside the crate.
            return None;
        }
        text
    } else {
        return None;
    };
    machine_path(absolute).then_some(Why::MachinePath)
}

/// Resolve the components `parts` from `base`: whether they climb above the root or through the
/// old shared directory.
fn climb(base: &str, parts: &[&str]) -> Option<Why> {
    if parts.windows(2).any(|w| w[0] == ".." && w[1] == "shared") {
        return Some(Why::SharedDir);
    }
    let mut depth = base.split('/').filter(|c| !c.is_empty()).count();
    for part in parts {
        match *part {
            "" | "." => {}
            ".." if depth == 0 => return Some(Why::ClimbsAboveRoot),
            ".." => depth -= 1,
            _ => depth += 1,
        }
    }
    None
}

/// Whether the absolute path `path` lies in one machine's own files (see the module docs).
fn machine_path(path: &str) -> bool {
    let mut parts = path.split('/').filter(|c| !c.is_empty());
    let Some(first) = parts.next() else { return false };
    if first == "var" && parts.next() == Some("tmp") {
        return false;
    }
    !SYSTEM_ROOTS.contains(&first) && MACHINE_ROOTS.contains(&first)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A parent directory, kept apart from the slashes around it so that this file, which the
    /// real-tree test scans too, holds no bad path itself.
    const UP: &str = "..";

    /// `/<root>/<rest>`, built at run time for the same reason.
    fn abs(root: &str, rest: &str) -> String {
        format!("/{root}/{rest}")
    }

    fn whys(file: &str, crate_dir: &str, text: &str) -> Vec<(usize, Why)> {
        scan(file, crate_dir, text).into_iter().map(|o| (o.line, o.why)).collect()
    }

    #[test]
    fn a_manifest_dir_path_may_reach_the_root_but_not_climb_above_it() {
        let manifest_dir =
            |rel: &str| format!(r#"const F: &str = concat!(env!("CARGO_MANIFEST_DIR"), "{rel}");"#);
        assert_eq!(whys("c/tests/t.rs", "c", &manifest_dir(&format!("/{UP}/fixtures/real"))), []);
        let above = manifest_dir(&format!("/{UP}/{UP}/fixtures"));
        assert_eq!(whys("c/tests/t.rs", "c", &above), [(1, Why::ClimbsAboveRoot)]);
        // rustfmt splits a long `concat!`: the path on a later line still starts at the crate.
        let split = format!("let p = concat!(\n    env!(\"CARGO_MANIFEST_DIR\"),\n    \"/{UP}/{UP}/x\"\n);");
        assert_eq!(whys("c/src/deep/m.rs", "c", &split), [(3, Why::ClimbsAboveRoot)]);
        // A crate-relative continuation is no absolute path.
        assert_eq!(whys("c/tests/t.rs", "c", &manifest_dir(&abs("work", "x"))), []);
    }

    #[test]
    fn relative_paths_climb_from_the_file() {
        let support = format!("#[path = \"{UP}/{UP}/other/tests/support/mod.rs\"]");
        assert_eq!(whys("c/tests/remote.rs", "c", &support), []);
        assert_eq!(whys("c/remote.rs", "c", &support), [(1, Why::ClimbsAboveRoot)]);
        let readme = format!("#[doc = include_str!(\"{UP}/{UP}/README.md\")]");
        assert_eq!(whys("c/src/lib.rs", "c", &readme), []);
        assert_eq!(whys("c/lib.rs", "c", &readme), [(1, Why::ClimbsAboveRoot)]);
        let cd_up = format!("cd \"$(dirname \"$0\")/{UP}\"");
        assert_eq!(whys(".ci/run", "", &cd_up), []);
        assert_eq!(whys("run.sh", "", &cd_up), [(1, Why::ClimbsAboveRoot)]);
        let dependency = format!("a = {{ path = \"{UP}/a\" }}");
        assert_eq!(whys("c/Cargo.toml", "c", &dependency), []);
        assert_eq!(whys("Cargo.toml", "", &dependency), [(1, Why::ClimbsAboveRoot)]);
        // Ranges and rest patterns are not paths.
        let code = "let x = &buf[..n]; let y = 1..=9; let Foo { a, .. } = f; np.s_[..., 1]";
        assert_eq!(whys("c/src/lib.rs", "c", code), []);
    }

    #[test]
    fn the_old_shared_directory_fails_even_where_it_resolves_inside() {
        let text = format!("let f = \"{UP}/shared/fixtures\";");
        assert_eq!(whys("a/b/c/d.rs", "a", &text), [(1, Why::SharedDir)]);
    }

    #[test]
    fn machine_paths_fail_and_system_paths_and_labels_pass() {
        for root in ["work", "home", "root", "mnt", "opt", "var"] {
            let text = format!("let p = Path::new(\"{}\");", abs(root, "shared/fixtures/x"));
            assert_eq!(whys("c/src/lib.rs", "c", &text), [(1, Why::MachinePath)], "{text}");
        }
        let url = format!("let u = \"file://{}\";", abs("home", "me/m.safetensors"));
        assert_eq!(whys("c/src/lib.rs", "c", &url), [(1, Why::MachinePath)]);
        let home = format!("cp {}/model.safetensors x", "~");
        assert_eq!(whys("run.sh", "", &home), [(1, Why::MachinePath)]);
        let allowed = [
            "std::fs::read_to_string(\"/proc/self/status\")",
            "echo 3 > /proc/sys/vm/drop_caches",
            "for p in [\"/usr/sbin/nginx\", \"/usr/bin/nginx\"] {}",
            "Path::new(\"/tmp/x\"); Path::new(\"/var/tmp/y\"); Path::new(\"/dev/null\");",
            "open(\"/nonexistent/m.json\")",
            // Labels in tests of messages and parsing name no real location.
            "Error::new(\"/m/a.safetensors\", kind); Path::new(\"/x\");",
            // Format arguments, URLs and division are not absolute paths.
            "format!(\"{REAL}/fracast-0.safetensors\"); \"http://127.0.0.1:1/m\"; a / b; K/M/G",
            "\"file:///tmp/x.safetensors\"",
        ];
        for text in allowed {
            assert_eq!(whys("c/src/lib.rs", "c", text), [], "{text}");
        }
    }

    #[test]
    fn an_offence_names_its_file_line_and_text() {
        let bad = abs("work", "shared/fixtures");
        let text = format!("fn main() {{}}\n    let d = \"{bad}\";\n");
        let offences = scan("c/tests/t.rs", "c", &text);
        assert_eq!(offences.len(), 1);
        let shown = offences[0].to_string();
        let want = format!("c/tests/t.rs:2: `{bad}` is an absolute path into this machine's own files");
        assert!(shown.starts_with(&want), "{shown}");
        assert!(shown.ends_with(&format!("\n    let d = \"{bad}\";")), "{shown}");
    }

    #[test]
    fn only_code_scripts_and_configs_are_checked_in_their_crates() {
        for f in ["a/src/lib.rs", "a/t.py", "a/t.pyi", "a/run-tests.sh", "Cargo.toml", ".ci/run"] {
            assert!(is_checked(f), "{f}");
        }
        for f in ["README.md", "fixtures/real/LICENSE", "fixtures/x.json", "Cargo.lock"] {
            assert!(!is_checked(f), "{f}");
        }
        let crates: HashSet<String> = ["", "a", "a/fuzz"].map(String::from).into();
        assert_eq!(crate_dir("a/src/x/y.rs", &crates), "a");
        assert_eq!(crate_dir("a/fuzz/t/h.rs", &crates), "a/fuzz");
        assert_eq!(crate_dir("b/x.rs", &crates), "");
        assert_eq!(crate_dir("x.rs", &crates), "");
    }

    #[test]
    fn the_real_tree_passes_and_a_path_planted_in_it_fails() {
        let root = crate::workspace_root();
        let offences = check(&root).unwrap();
        let shown: Vec<String> = offences.iter().map(ToString::to_string).collect();
        assert!(offences.is_empty(), "{}", shown.join("\n"));
        // The same scan of a real file, with one bad line planted at its end.
        let real = std::fs::read_to_string(root.join("xtask/src/main.rs")).unwrap();
        let bad = format!("const F: &str = concat!(env!(\"CARGO_MANIFEST_DIR\"), \"/{UP}/{UP}/fixtures\");");
        let found = scan("xtask/src/main.rs", "xtask", &format!("{real}\n{bad}\n"));
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!((found[0].line, found[0].why), (real.lines().count() + 2, Why::ClimbsAboveRoot));
    }
}
