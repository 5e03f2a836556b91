//! The Python peers and the environment they run in.
//!
//! The peers run in the venv that `cargo xtask provision --python` fills (`cargo xtask bench` and
//! `cargo xtask test` run it first): `$TENSORA_PY_VENV`, else `py-venv` in the target directory
//! ([`venv_dir`]), with every peer's packages pinned in `tensora-py/requirements-test.txt` (torch
//! included) and tensora built from the checkout. The bench installs nothing itself: one venv, one
//! torch, shared with the bindings' tests. A peer is skipped only when that venv is missing or
//! cannot import it, and the skip names the command that provisions it ([`ENABLE`]).
//!
//! Each peer runs in a fresh interpreter ([`RUNNER_SCRIPT`]): imports, then a `ready` line (the
//! process start, timed apart by the caller), then the load(s) and one JSON result line, the same
//! protocol as the Rust subjects' child processes ([`crate::child`]).
//!
//! To add a Python peer: one entry in [`PEERS`] (its key, report name, modules and requirements,
//! pinned in `tensora-py/requirements-test.txt`) and one branch in [`RUNNER_SCRIPT`]'s `loader`
//! function; the cell plan picks up every entry.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result};

use crate::report::Mode;

/// The variable that names the venv (set by `cargo xtask`; the same one `tensora-py/run-tests.sh`
/// and `tensora-py/bench/run_python_peers.sh` read).
pub const VENV_VAR: &str = "TENSORA_PY_VENV";
/// The venv's directory under the target directory, when [`VENV_VAR`] is not set.
pub const VENV_DIR: &str = "py-venv";
/// The command that provisions the venv.
pub const ENABLE: &str = "cargo xtask provision --python";

/// A Python peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PyPeer {
    /// Key passed to [`RUNNER_SCRIPT`] and kept in [`crate::cells::Subject::PeerPython`].
    pub key: &'static str,
    /// Name in reports.
    pub name: &'static str,
    /// Modules it imports (checked before it is planned as runnable).
    pub modules: &'static [&'static str],
    /// The distributions it needs, each pinned in `tensora-py/requirements-test.txt`.
    pub requirements: &'static [&'static str],
    /// What its load returns: owned memory, or views of a file mapping (compared as such).
    pub mode: Mode,
}

/// Hugging Face's `safetensors.numpy.load_file`.
pub const HF_NUMPY: PyPeer = PyPeer {
    key: "hf-numpy",
    name: "hf-python load_file (numpy)",
    modules: &["safetensors", "numpy"],
    requirements: &["safetensors", "numpy"],
    mode: Mode::Owned,
};

/// Hugging Face's `safetensors.torch.load_file` (what `transformers` calls): its tensors are views
/// of a private mapping of the file (`torch.UntypedStorage.from_file`), so it is compared with the
/// mapped loads, not the owned ones.
pub const HF_TORCH: PyPeer = PyPeer {
    key: "hf-torch",
    name: "hf-python load_file (torch)",
    modules: &["safetensors", "torch"],
    requirements: &["safetensors", "torch"],
    mode: Mode::Mapped,
};

/// Every Python peer, in report order.
pub const PEERS: [PyPeer; 2] = [HF_NUMPY, HF_TORCH];

/// The peer with `key`.
pub fn peer(key: &str) -> Option<&'static PyPeer> {
    PEERS.iter().find(|p| p.key == key)
}

/// The provisioned venv: `$TENSORA_PY_VENV`, else `py-venv` under `$CARGO_TARGET_DIR` (relative to
/// the workspace root) or the workspace's `target/`: the rule `cargo xtask provision` follows.
pub fn venv_dir() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap_or(Path::new("."));
    match (std::env::var_os(VENV_VAR), std::env::var_os("CARGO_TARGET_DIR")) {
        (Some(venv), _) => root.join(venv),
        (None, Some(target)) => root.join(target).join(VENV_DIR),
        (None, None) => root.join("target").join(VENV_DIR),
    }
}

/// The venv's interpreter, or why there is none.
pub fn venv_python() -> Result<PathBuf, Unavailable> {
    let venv = venv_dir();
    let python = venv.join("bin").join("python");
    if python.is_file() {
        Ok(python)
    } else {
        Err(Unavailable { why: format!("no Python venv at {}", venv.display()), enable: ENABLE.to_owned() })
    }
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

    /// An environment that is not prepared (every peer skipped with `why`), for runs that do
    /// not measure the peers.
    pub fn not_prepared(out_dir: &Path, why: &str) -> PythonEnv {
        let unavailable = Unavailable { why: why.to_owned(), enable: ENABLE.to_owned() };
        PythonEnv {
            python: Err(unavailable.clone()),
            script: out_dir.join("py_peer.py"),
            peers: PEERS.iter().map(|p| (p, Err(unavailable.clone()))).collect(),
        }
    }
}

/// Write the runner script under `out_dir` and say which peers can run in the provisioned venv
/// (one line through `log`).
pub fn prepare(out_dir: &Path, log: &mut dyn FnMut(&str)) -> Result<PythonEnv> {
    std::fs::create_dir_all(out_dir).with_context(|| format!("create {}", out_dir.display()))?;
    let script = out_dir.join("py_peer.py");
    crate::writer::write_text(&script, RUNNER_SCRIPT)?;
    let python = venv_python();
    let peers: Vec<_> = PEERS
        .iter()
        .map(|p| {
            let status = match &python {
                Err(e) => Err(e.clone()),
                Ok(py) => {
                    importable(py, p.modules).map_err(|why| Unavailable { why, enable: ENABLE.to_owned() })
                }
            };
            (p, status)
        })
        .collect();
    match &python {
        Ok(py) => log(&format!(
            "python peers: {} ({} of {} peers importable)",
            py.display(),
            peers.iter().filter(|(_, s)| s.is_ok()).count(),
            peers.len()
        )),
        Err(e) => log(&format!("python peers: {e}")),
    }
    Ok(PythonEnv { python, script, peers })
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
        assert_eq!(why, "offline; enable with: `cargo xtask provision --python`");
        assert!(env.status("nope").is_err());
        assert_eq!(env.keys(), vec!["hf-numpy", "hf-torch"]);
    }

    #[test]
    fn every_peer_is_pinned_in_the_requirements_the_provisioning_installs() {
        let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tensora-py/requirements-test.txt");
        let text = std::fs::read_to_string(&file).unwrap();
        let pinned: Vec<&str> = text
            .lines()
            .map(|l| l.split('#').next().unwrap_or("").trim())
            .filter_map(|l| l.split_once("==").map(|(name, _)| name))
            .collect();
        for p in PEERS {
            for r in p.requirements {
                assert!(pinned.contains(r), "{}: {r} is not pinned in {}", p.key, file.display());
            }
        }
    }

    #[test]
    fn a_missing_interpreter_is_an_error_not_a_panic() {
        let e = importable(Path::new("/nonexistent/python"), &["os"]).unwrap_err();
        assert!(e.contains("cannot run"), "{e}");
    }
}
