//! The Python peers and the environment they run in.
//!
//! The bench prepares its own virtual environment under the output directory
//! (`target/tensora-bench/py-venv`): `python3 -m venv`, then `pip install` of the packages every
//! default peer needs (safetensors and numpy, from PyPI), so a fresh machine measures the loader
//! most users run today instead of skipping it. A peer whose packages are not installed by default
//! (torch) is measured when they are importable in that environment, and otherwise skipped with the
//! exact command that installs them. Every skip names its enabling command.
//!
//! Each peer runs in a fresh interpreter ([`RUNNER_SCRIPT`]): imports, then a `ready` line (the
//! process start, timed apart by the caller), then the load(s) and one JSON result line, the same
//! protocol as the Rust subjects' child processes ([`crate::child`]).
//!
//! To add a Python peer: one entry in [`PEERS`] (its key, report name, modules and pip packages)
//! and one branch in [`RUNNER_SCRIPT`]'s `loader` function; the cell plan picks up every entry.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, bail};

/// Name of the venv directory under the bench's output directory.
pub const VENV_DIR: &str = "py-venv";
/// The interpreter that creates the venv, unless `PYTHON` names another.
pub const PYTHON_DEFAULT: &str = "python3";
/// Bound on one `python -m venv` or `pip install` run.
pub const SETUP_SECONDS_MAX: u64 = 900;
/// pip's own timeout per network request, seconds.
pub const PIP_REQUEST_TIMEOUT_SECONDS: u32 = 60;
/// pip's retries per request.
pub const PIP_RETRIES_MAX: u32 = 3;
/// Bound on the output kept from a setup command (its last lines go into errors).
const SETUP_OUTPUT_BYTES_MAX: usize = 1 << 20;

/// A Python peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PyPeer {
    /// Key passed to [`RUNNER_SCRIPT`] and kept in [`crate::cells::Subject::PeerPython`].
    pub key: &'static str,
    /// Name in reports.
    pub name: &'static str,
    /// Modules it imports (checked before it is planned as runnable).
    pub modules: &'static [&'static str],
    /// What `pip install` needs for it.
    pub pip: &'static [&'static str],
    /// Extra `pip install` arguments (an index URL).
    pub pip_extra: &'static [&'static str],
    /// Whether the bench installs its packages itself (then a skip of it is a failure in CI).
    pub installed_by_default: bool,
}

/// Hugging Face's `safetensors.numpy.load_file`.
pub const HF_NUMPY: PyPeer = PyPeer {
    key: "hf-numpy",
    name: "hf-python load_file (numpy)",
    modules: &["safetensors", "numpy"],
    pip: &["safetensors", "numpy"],
    pip_extra: &[],
    installed_by_default: true,
};

/// Hugging Face's `safetensors.torch.load_file` (what `transformers` calls).
pub const HF_TORCH: PyPeer = PyPeer {
    key: "hf-torch",
    name: "hf-python load_file (torch)",
    modules: &["safetensors", "torch"],
    pip: &["torch"],
    pip_extra: &["--index-url", "https://download.pytorch.org/whl/cpu"],
    installed_by_default: false,
};

/// Every Python peer, in report order.
pub const PEERS: [PyPeer; 2] = [HF_NUMPY, HF_TORCH];

/// The peer with `key`.
pub fn peer(key: &str) -> Option<&'static PyPeer> {
    PEERS.iter().find(|p| p.key == key)
}

/// The peer runner: `python runner.py KEY SITUATION DROP FILE...`, where SITUATION is `first-load`
/// or `repeat-load` and DROP is `none`, `fadvise-dontneed` or `proc-drop-caches` (the page cache is
/// dropped right before the timed load). Prints `ready` after its imports, then one JSON line.
pub const RUNNER_SCRIPT: &str = r#"import gc, json, os, sys, time
key, situation, drop, files = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]

def loader(key):
    if key == "hf-numpy":
        import numpy as np
        from safetensors.numpy import load_file
        def touch(t):
            return int(t.reshape(-1).view(np.uint8)[::4096].sum()) if t.size else 0
        return load_file, touch
    if key == "hf-torch":
        import torch
        from safetensors.torch import load_file
        def touch(t):
            return int(t.reshape(-1).view(torch.uint8)[::4096].sum()) if t.numel() else 0
        return load_file, touch
    raise SystemExit("unknown peer " + key)

load_file, touch = loader(key)
print("ready", flush=True)

def drop_cache():
    if drop == "fadvise-dontneed":
        for path in files:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
    elif drop == "proc-drop-caches":
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")

def one_load():
    t0 = time.perf_counter()
    nbytes, count, checksum = 0, 0, 0
    for path in files:
        tensors = load_file(path)
        for t in tensors.values():
            nbytes += t.nbytes
            count += 1
            checksum += touch(t)
    seconds = time.perf_counter() - t0
    return tensors, seconds, nbytes, count, checksum

if situation == "repeat-load":
    held = one_load()
    del held
    gc.collect()
elif situation != "first-load":
    raise SystemExit("unknown situation " + situation)
drop_cache()
held, seconds, nbytes, count, checksum = one_load()
print(json.dumps({"seconds": seconds, "bytes": nbytes, "details": {"tensors": count, "checksum": checksum}}), flush=True)
"#;

/// Why a Python peer does not run, and the exact command that would let it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unavailable {
    /// What went wrong.
    pub why: String,
    /// The command that enables the peer.
    pub enable: String,
}

impl std::fmt::Display for Unavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}; enable with: `{}`", self.why, self.enable)
    }
}

/// The bench's Python environment: where it is and which peers can run in it.
#[derive(Debug, Clone)]
pub struct PythonEnv {
    /// The venv's interpreter, or why there is none.
    pub python: Result<PathBuf, Unavailable>,
    /// The runner script, written beside the venv.
    pub script: PathBuf,
    /// Per peer of [`PEERS`]: runnable, or why not.
    pub peers: Vec<(&'static PyPeer, Result<(), Unavailable>)>,
}

impl PythonEnv {
    /// Whether `peer` can run here (`Err` says why not and how to enable it).
    pub fn status(&self, key: &str) -> Result<(), Unavailable> {
        match self.peers.iter().find(|(p, _)| p.key == key) {
            Some((_, status)) => status.clone(),
            None => Err(Unavailable { why: format!("no Python peer {key:?}"), enable: "none".to_owned() }),
        }
    }

    /// Keys of every peer the plan should list (all of [`PEERS`]: the unavailable ones as skipped).
    pub fn keys(&self) -> Vec<&'static str> {
        self.peers.iter().map(|(p, _)| p.key).collect()
    }

    /// An environment that is not prepared (every peer skipped with `why`), for runs that must not
    /// touch the network.
    pub fn not_prepared(out_dir: &Path, why: &str) -> PythonEnv {
        let venv = out_dir.join(VENV_DIR);
        let unavailable = Unavailable { why: why.to_owned(), enable: setup_command(&venv, &HF_NUMPY) };
        PythonEnv {
            python: Err(unavailable.clone()),
            script: out_dir.join("py_peer.py"),
            peers: PEERS.iter().map(|p| (p, Err(unavailable.clone()))).collect(),
        }
    }
}

/// The command that creates the venv and installs `peer`'s packages into it.
fn setup_command(venv: &Path, peer: &PyPeer) -> String {
    format!(
        "{PYTHON_DEFAULT} -m venv {v} && {v}/bin/python -m pip install {}",
        pip_args(peer).join(" "),
        v = venv.display()
    )
}

/// The `pip install` arguments for `peer`.
fn pip_args(peer: &PyPeer) -> Vec<&'static str> {
    peer.pip.iter().chain(peer.pip_extra).copied().collect()
}

/// Make sure the venv under `out_dir` exists and holds the default peers' packages (creating and
/// installing as needed, with a progress line per step through `log`), write the runner script,
/// and say which peers can run.
pub fn prepare(out_dir: &Path, log: &mut dyn FnMut(&str)) -> Result<PythonEnv> {
    std::fs::create_dir_all(out_dir).with_context(|| format!("create {}", out_dir.display()))?;
    let script = out_dir.join("py_peer.py");
    crate::writer::write_text(&script, RUNNER_SCRIPT)?;
    let venv = out_dir.join(VENV_DIR);
    let python = ensure_venv(&venv, log);
    let peers = PEERS
        .iter()
        .map(|p| {
            let status = match &python {
                Err(e) => Err(Unavailable { why: e.why.clone(), enable: setup_command(&venv, p) }),
                Ok(py) => importable(py, p.modules).map_err(|why| Unavailable {
                    why,
                    enable: format!("{}/bin/python -m pip install {}", venv.display(), pip_args(p).join(" ")),
                }),
            };
            (p, status)
        })
        .collect();
    Ok(PythonEnv { python, script, peers })
}

/// The venv's interpreter, created and filled with the default peers' packages when needed.
fn ensure_venv(venv: &Path, log: &mut dyn FnMut(&str)) -> Result<PathBuf, Unavailable> {
    let python = venv.join("bin").join("python");
    let default_modules: Vec<&str> =
        PEERS.iter().filter(|p| p.installed_by_default).flat_map(|p| p.modules.iter().copied()).collect();
    if python.is_file() && importable(&python, &default_modules).is_ok() {
        log(&format!("python peers: reusing {}", venv.display()));
        return Ok(python);
    }
    let fail = |why: String| Unavailable { why, enable: setup_command(venv, &HF_NUMPY) };
    if !python.is_file() {
        let base = std::env::var("PYTHON").unwrap_or_else(|_| PYTHON_DEFAULT.to_owned());
        log(&format!("python peers: creating a venv at {} with {base}", venv.display()));
        let mut cmd = Command::new(&base);
        cmd.arg("-m").arg("venv").arg(venv);
        run_setup(cmd, log).map_err(|e| fail(format!("cannot create the venv: {e:#}")))?;
    }
    let packages: Vec<&str> =
        PEERS.iter().filter(|p| p.installed_by_default).flat_map(|p| pip_args(p)).collect();
    log(&format!("python peers: pip install {} (from PyPI) ...", packages.join(" ")));
    let t = Instant::now();
    let mut cmd = Command::new(&python);
    cmd.args(["-m", "pip", "install", "--disable-pip-version-check", "--progress-bar", "off"])
        .arg("--timeout")
        .arg(PIP_REQUEST_TIMEOUT_SECONDS.to_string())
        .arg("--retries")
        .arg(PIP_RETRIES_MAX.to_string())
        .args(&packages);
    run_setup(cmd, log).map_err(|e| fail(format!("pip install failed: {e:#}")))?;
    log(&format!("python peers: installed in {:.1} s", t.elapsed().as_secs_f64()));
    importable(&python, &default_modules).map_err(fail)?;
    Ok(python)
}

/// Whether `python` can import every module of `modules`; `Err` carries the last error line.
pub fn importable(python: &Path, modules: &[&str]) -> Result<(), String> {
    let out = Command::new(python)
        .arg("-c")
        .arg(format!("import {}", modules.join(", ")))
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", python.display()))?;
    if out.status.success() {
        return Ok(());
    }
    let err = String::from_utf8_lossy(&out.stderr);
    Err(err.lines().last().unwrap_or("import failed").trim().to_owned())
}

/// Run a setup command under [`SETUP_SECONDS_MAX`], passing its progress lines (pip's
/// `Collecting`, `Downloading`, `Installing`, `Successfully`) to `log`.
fn run_setup(mut cmd: Command, log: &mut dyn FnMut(&str)) -> Result<()> {
    let shown = |line: &str| {
        ["Collecting", "Downloading", "Installing", "Successfully"]
            .iter()
            .any(|p| line.trim_start().starts_with(p))
    };
    let run = crate::child::run_lines(
        cmd.stdin(Stdio::null()),
        std::time::Duration::from_secs(SETUP_SECONDS_MAX),
        SETUP_OUTPUT_BYTES_MAX,
        &mut |line| {
            if shown(line) {
                log(&format!("python peers:   {}", line.trim()));
            }
        },
    )?;
    if !run.success {
        let tail: Vec<&str> = run.stderr.lines().rev().take(3).collect();
        bail!("{} ({})", run.status, tail.into_iter().rev().collect::<Vec<_>>().join(" / "));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_peer_is_listed_once_and_skips_name_their_command() {
        for (i, p) in PEERS.iter().enumerate() {
            assert!(PEERS[i + 1..].iter().all(|q| q.key != p.key && q.name != p.name));
            assert_eq!(peer(p.key), Some(p));
            assert!(RUNNER_SCRIPT.contains(&format!("\"{}\"", p.key)), "{} has no runner branch", p.key);
        }
        assert!(peer("nope").is_none());
        let env = PythonEnv::not_prepared(Path::new("/x"), "offline");
        let why = env.status(HF_NUMPY.key).unwrap_err().to_string();
        assert!(why.starts_with("offline; enable with: `python3 -m venv /x/py-venv && "), "{why}");
        assert!(why.contains("pip install safetensors numpy`"), "{why}");
        assert!(env.status("nope").is_err());
        assert_eq!(env.keys(), vec!["hf-numpy", "hf-torch"]);
    }

    #[test]
    fn the_torch_peer_is_enabled_from_the_cpu_index() {
        let cmd = setup_command(Path::new("/v"), &HF_TORCH);
        assert!(cmd.ends_with("pip install torch --index-url https://download.pytorch.org/whl/cpu"), "{cmd}");
        let installed: Vec<&str> = PEERS.iter().filter(|p| p.installed_by_default).map(|p| p.key).collect();
        assert_eq!(installed, vec![HF_NUMPY.key]);
    }

    #[test]
    fn a_missing_interpreter_is_an_error_not_a_panic() {
        let e = importable(Path::new("/nonexistent/python"), &["os"]).unwrap_err();
        assert!(e.contains("cannot run"), "{e}");
    }
}
