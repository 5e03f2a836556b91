//! The machine's own packages: what the provisioning finds on it, installs with apt-get when it
//! may (root, apt-get present), or names in one line with the exact command ([`Refused`]).

use std::ffi::OsStr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Result, bail};

use super::step::{self, Show};
use super::{Refused, Scope};

/// How a system package is found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    /// A program on `PATH` or in [`SBIN_DIRS`].
    Program(&'static str),
    /// Python modules the base interpreter imports (comma-separated, as in an `import`).
    PythonModules(&'static str),
}

/// A Debian package the tests or the bench need.
#[derive(Debug, Clone, Copy)]
pub struct SystemPackage {
    /// Its Debian name.
    pub package: &'static str,
    /// How its presence is seen.
    pub probe: Probe,
    /// Which provisioning needs it.
    pub scope: Scope,
    /// Who needs it (for the messages).
    pub needed_by: &'static str,
}

/// Every system package, in install order.
pub const PACKAGES: [SystemPackage; 6] = [
    SystemPackage {
        package: "python3-venv",
        probe: Probe::PythonModules("venv, ensurepip"),
        scope: Scope::Python,
        needed_by: "the Python venv of the bindings' tests and the bench",
    },
    SystemPackage {
        package: "nginx-light",
        probe: Probe::Program("nginx"),
        scope: Scope::Everything,
        needed_by: "the HTTP tests",
    },
    SystemPackage {
        package: "curl",
        probe: Probe::Program("curl"),
        scope: Scope::Everything,
        needed_by: "the remote bench's anchor",
    },
    SystemPackage {
        package: "nodejs",
        probe: Probe::Program("node"),
        scope: Scope::Everything,
        needed_by: "s3rver and Azurite",
    },
    SystemPackage {
        package: "npm",
        probe: Probe::Program("npm"),
        scope: Scope::Everything,
        needed_by: "installing s3rver and Azurite",
    },
    SystemPackage {
        package: "iproute2",
        probe: Probe::Program("ip"),
        scope: Scope::Everything,
        needed_by: "the storage-bound tensor-parallel bench cell (`ip netns`, `tc`)",
    },
];

/// Where system daemons live, searched after `PATH` (a user's `PATH` often lacks them).
pub const SBIN_DIRS: [&str; 3] = ["/usr/sbin", "/usr/local/sbin", "/sbin"];

/// The interpreter the venvs are made from: `$PYTHON`, else `python3`.
pub fn base_python() -> String {
    std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_owned())
}

/// `name` on `path_var` (a `PATH` value) or in `extra_dirs`: the first executable file.
pub fn find_program(name: &str, path_var: Option<&OsStr>, extra_dirs: &[&str]) -> Option<PathBuf> {
    let on_path = path_var.map(|p| std::env::split_paths(p).collect::<Vec<_>>()).unwrap_or_default();
    on_path
        .into_iter()
        .chain(extra_dirs.iter().map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|p| p.metadata().is_ok_and(|m| m.is_file() && m.mode() & 0o111 != 0))
}

/// `name` on this process's `PATH` or in [`SBIN_DIRS`].
pub fn program(name: &str) -> Option<PathBuf> {
    find_program(name, std::env::var_os("PATH").as_deref(), &SBIN_DIRS)
}

fn present(probe: Probe) -> bool {
    match probe {
        Probe::Program(name) => program(name).is_some(),
        Probe::PythonModules(modules) => {
            step::probe(Command::new(base_python()).args(["-c", &format!("import {modules}")])).is_some()
        }
    }
}

/// The packages of `scope` that this machine lacks.
pub fn missing(scope: Scope) -> Vec<SystemPackage> {
    PACKAGES.iter().filter(|p| scope.includes(p.scope) && !present(p.probe)).copied().collect()
}

/// What to do about missing packages.
#[derive(Debug, PartialEq, Eq)]
pub enum Action {
    /// Nothing is missing.
    Nothing,
    /// Install them with this apt-get.
    Install(PathBuf),
    /// Stop: the line that names the command.
    Refuse(String),
}

/// Decide, from what is missing, whether we are root and where apt-get is.
pub fn decide(missing: &[SystemPackage], root: bool, apt_get: Option<PathBuf>) -> Action {
    if missing.is_empty() {
        return Action::Nothing;
    }
    let names: Vec<&str> = missing.iter().map(|p| p.package).collect();
    let needed_by: Vec<&str> = missing.iter().map(|p| p.needed_by).collect();
    match (root, apt_get) {
        (true, Some(apt)) => Action::Install(apt),
        (root, apt) => {
            let sudo = if root { "" } else { "sudo " };
            let apt_note =
                if apt.is_some() { "" } else { " (Debian and Ubuntu names; apt-get is not on this machine)" };
            Action::Refuse(format!(
                "missing system packages {} (for {}): install them with `{sudo}apt-get update && {sudo}apt-get install -y {}`{apt_note}, then run this again",
                names.join(" "),
                needed_by.join("; "),
                names.join(" ")
            ))
        }
    }
}

/// Whether this process runs as root: its effective user id is 0. Read as the owner of
/// `/proc/self`: Linux gives each process's world-readable directory under `/proc` the task's
/// effective user and group, dumpable or not (`task_dump_owner` in fs/proc/base.c), so this is
/// `geteuid()` without libc (xtask has neither libc nor rustix, and forbids `unsafe`).
fn is_root() -> bool {
    Path::new("/proc/self").metadata().is_ok_and(|m| m.uid() == 0)
}

/// Make sure the system packages of `scope` are present: install them (root with apt-get) or stop
/// with [`Refused`] before anything runs.
pub fn ensure(scope: Scope) -> Result<()> {
    let missing = missing(scope);
    match decide(&missing, is_root(), program("apt-get")) {
        Action::Nothing => Ok(()),
        Action::Refuse(line) => Err(Refused(line).into()),
        Action::Install(apt) => {
            let names: Vec<&str> = missing.iter().map(|p| p.package).collect();
            let label = "system packages";
            step::run(label, "apt-get update", Command::new(&apt).args(["update", "-qq"]), Show::Nothing)?;
            let mut install = Command::new(&apt);
            install.args(["install", "-y", "-qq"]).args(&names).env("DEBIAN_FRONTEND", "noninteractive");
            step::run(label, &format!("apt-get install {}", names.join(" ")), &mut install, Show::Nothing)?;
            let still = self::missing(scope);
            if !still.is_empty() {
                let names: Vec<&str> = still.iter().map(|p| p.package).collect();
                bail!("apt-get installed {} but they are still not found", names.join(" "));
            }
            Ok(())
        }
    }
}

/// Make sure `cargo fmt` and `cargo clippy` run (rustup adds them when it can), else [`Refused`].
pub fn ensure_rust_components(cargo: &str) -> Result<()> {
    let has = |sub: &str| step::probe(Command::new(cargo).args([sub, "--version"])).is_some();
    let lacking: Vec<&str> = [("fmt", "rustfmt"), ("clippy", "clippy")]
        .into_iter()
        .filter(|(sub, _)| !has(sub))
        .map(|(_, component)| component)
        .collect();
    if lacking.is_empty() {
        return Ok(());
    }
    let Some(rustup) = program("rustup") else {
        return Err(Refused(format!(
            "missing Rust components {}: install them with your toolchain's installer (with rustup: `rustup component add {}`), then run this again",
            lacking.join(" "),
            lacking.join(" ")
        ))
        .into());
    };
    let mut cmd = Command::new(rustup);
    cmd.args(["component", "add"]).args(&lacking);
    step::run(
        "rust components",
        &format!("rustup component add {}", lacking.join(" ")),
        &mut cmd,
        Show::Nothing,
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    /// `is_root` is the effective user's, as `id -u` prints it.
    #[test]
    fn root_is_the_effective_user() {
        let id = Command::new("id").arg("-u").output().unwrap();
        assert!(id.status.success());
        assert_eq!(is_root(), id.stdout.trim_ascii() == b"0");
    }

    #[test]
    fn programs_are_found_on_the_path_given_and_in_the_extra_dirs_only_when_executable() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        let sbin = dir.path().join("sbin");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::create_dir_all(&sbin).unwrap();
        std::fs::write(bin.join("node"), "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(bin.join("node"), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(bin.join("npm"), "not executable").unwrap();
        std::fs::write(sbin.join("nginx"), "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(sbin.join("nginx"), std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = std::env::join_paths([&bin]).unwrap();
        let sbin_str = sbin.to_str().unwrap();
        assert_eq!(find_program("node", Some(&path), &[]), Some(bin.join("node")));
        assert_eq!(find_program("npm", Some(&path), &[]), None);
        assert_eq!(find_program("nginx", Some(&path), &[]), None);
        assert_eq!(find_program("nginx", Some(&path), &[sbin_str]), Some(sbin.join("nginx")));
        assert_eq!(find_program("node", None, &[]), None);
    }

    #[test]
    fn missing_packages_are_installed_by_root_with_apt_get_else_named_in_one_line() {
        let nginx = PACKAGES[1];
        let node = PACKAGES[3];
        assert_eq!(decide(&[], false, None), Action::Nothing);
        let apt = PathBuf::from("/usr/bin/apt-get");
        assert_eq!(decide(&[nginx, node], true, Some(apt.clone())), Action::Install(apt.clone()));
        let Action::Refuse(line) = decide(&[nginx, node], false, Some(apt)) else { panic!("not refused") };
        assert_eq!(
            line,
            "missing system packages nginx-light nodejs (for the HTTP tests; s3rver and Azurite): install them \
             with `sudo apt-get update && sudo apt-get install -y nginx-light nodejs`, then run this again"
        );
        let Action::Refuse(line) = decide(&[node], true, None) else { panic!("not refused") };
        assert!(
            line.contains("`apt-get update && apt-get install -y nodejs` (Debian and Ubuntu names;"),
            "{line}"
        );
        assert!(!line.contains('\n'), "{line}");
    }

    #[test]
    fn the_python_scope_needs_only_the_venv_module() {
        let python: Vec<&str> =
            PACKAGES.iter().filter(|p| Scope::Python.includes(p.scope)).map(|p| p.package).collect();
        assert_eq!(python, ["python3-venv"]);
        assert_eq!(PACKAGES.iter().filter(|p| Scope::Everything.includes(p.scope)).count(), PACKAGES.len());
    }
}
