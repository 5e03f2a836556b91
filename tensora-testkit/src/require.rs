//! What a test may treat as optional. Some machines have no io_uring (seccomp, old kernels) or no
//! `O_DIRECT` (tmpfs); a test there logs what it skipped. On a machine that has them, their absence
//! is a failure: `TENSORA_TEST_REQUIRE` lists what must be there (comma-separated: `io-uring`,
//! `o-direct`, `mount`; CI sets them), and a required capability that is missing fails the test.
//!
//! ```
//! // Without the variable (or without `io-uring` in it) this only logs when io_uring is missing.
//! let available = tensora_testkit::io_uring_or_skip("doc example");
//! assert_eq!(available, tensora_io::uring_probe().is_ok());
//! ```

use std::path::Path;

/// The environment variable listing the required capabilities.
pub const REQUIRE_VAR: &str = "TENSORA_TEST_REQUIRE";

/// A capability a test may need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Capability {
    /// io_uring rings can be created here.
    IoUring,
    /// `O_DIRECT` reads work on the filesystem a test writes to.
    ODirect,
    /// A small tmpfs can be mounted (root): the full-disk tests.
    Mount,
}

impl Capability {
    /// Its spelling in [`REQUIRE_VAR`].
    pub const fn name(self) -> &'static str {
        match self {
            Capability::IoUring => "io-uring",
            Capability::ODirect => "o-direct",
            Capability::Mount => "mount",
        }
    }
}

/// Whether `cap` is listed in `required` (the value of [`REQUIRE_VAR`]).
pub fn listed(required: &str, cap: Capability) -> bool {
    required.split(',').map(str::trim).any(|c| c == cap.name())
}

/// What [`check`] does about a capability.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// It is there: the test runs.
    Available,
    /// It is missing and optional: the test skips it, logging this line.
    Skip(String),
    /// It is missing and required: the test fails with this message.
    RequiredButMissing(String),
}

/// The verdict on `cap` for `context`, given whether it is `available` and the value of
/// [`REQUIRE_VAR`] (`required`).
pub fn verdict(cap: Capability, available: Result<(), String>, required: &str, context: &str) -> Verdict {
    match available {
        Ok(()) => Verdict::Available,
        Err(why) if listed(required, cap) => Verdict::RequiredButMissing(format!(
            "{context}: {} is required here ({REQUIRE_VAR}={required}) but unavailable: {why}",
            cap.name()
        )),
        Err(why) => Verdict::Skip(format!(
            "{context}: skipping {} ({why}); set {REQUIRE_VAR}={} to fail instead",
            cap.name(),
            cap.name()
        )),
    }
}

/// `available`, when true; when false, fails if [`REQUIRE_VAR`] lists `cap`, else logs that
/// `context` skipped it and why, and returns false (see [`verdict`]).
///
/// # Panics
///
/// When `cap` is required and not available: that is the test failing.
pub fn check(cap: Capability, available: Result<(), String>, context: &str) -> bool {
    check_with(cap, available, &std::env::var(REQUIRE_VAR).unwrap_or_default(), context)
}

/// [`check`] with the value of [`REQUIRE_VAR`] given.
fn check_with(cap: Capability, available: Result<(), String>, required: &str, context: &str) -> bool {
    match verdict(cap, available, required, context) {
        Verdict::Available => true,
        Verdict::Skip(line) => {
            eprintln!("{line}");
            false
        }
        Verdict::RequiredButMissing(message) => panic!("{message}"),
    }
}

/// Whether io_uring works here (see [`check`]).
pub fn io_uring_or_skip(context: &str) -> bool {
    check(Capability::IoUring, tensora_io::uring_probe(), context)
}

/// Whether `O_DIRECT` reads work on `path` (see [`check`]).
pub fn direct_io_or_skip(path: &Path, context: &str) -> bool {
    check(Capability::ODirect, tensora_sys::direct_io_supported(path), context)
}

/// A tmpfs of `size_bytes` mounted on a fresh temporary directory, unmounted on drop: a disk that
/// fills up, for `ENOSPC` tests. `Err` says why it could not be mounted (not root, no `mount`).
#[derive(Debug)]
pub struct SmallTmpfs {
    dir: tempfile::TempDir,
}

impl SmallTmpfs {
    /// Mount it.
    pub fn mount(size_bytes: u64) -> Result<SmallTmpfs, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size_bytes}"), "tmpfs"])
            .arg(dir.path())
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !out.status.success() {
            return Err(format!("mount: {}", String::from_utf8_lossy(&out.stderr).trim()));
        }
        Ok(SmallTmpfs { dir })
    }

    /// Where it is mounted.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for SmallTmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(self.dir.path()).status();
    }
}

/// A [`SmallTmpfs`], or `None` where it cannot be mounted and `mount` is not required (see
/// [`check`]).
pub fn small_tmpfs_or_skip(size_bytes: u64, context: &str) -> Option<SmallTmpfs> {
    match SmallTmpfs::mount(size_bytes) {
        Ok(fs) => Some(fs),
        Err(why) => {
            check(Capability::Mount, Err(why), context);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_matched_exactly_in_the_list() {
        assert!(listed("io-uring,o-direct", Capability::ODirect));
        assert!(listed(" io-uring ", Capability::IoUring));
        assert!(!listed("io-uringx", Capability::IoUring));
        assert!(!listed("", Capability::ODirect));
    }

    #[test]
    fn an_available_capability_passes_and_a_missing_optional_one_is_skipped() {
        assert!(check(Capability::IoUring, Ok(()), "test"));
        assert_eq!(verdict(Capability::ODirect, Ok(()), "o-direct", "t"), Verdict::Available);
        assert_eq!(
            verdict(Capability::ODirect, Err("tmpfs".into()), "io-uring", "t"),
            Verdict::Skip(
                "t: skipping o-direct (tmpfs); set TENSORA_TEST_REQUIRE=o-direct to fail instead".into()
            )
        );
        assert!(matches!(verdict(Capability::Mount, Err("no".into()), "", "t"), Verdict::Skip(_)));
        // A missing capability that is not required: skipped, not failed.
        assert!(!check_with(Capability::Mount, Err("no".into()), "io-uring,o-direct", "test"));
    }

    #[test]
    fn a_missing_required_capability_fails_whatever_this_run_requires() {
        // CI lists io-uring and o-direct: the failing path is decided here from the list given,
        // not from the environment, so it runs on every machine.
        assert_eq!(
            verdict(Capability::ODirect, Err("EINVAL on tmpfs".into()), "io-uring,o-direct", "direct test"),
            Verdict::RequiredButMissing(
                "direct test: o-direct is required here (TENSORA_TEST_REQUIRE=io-uring,o-direct) but \
                 unavailable: EINVAL on tmpfs"
                    .into()
            )
        );
        assert!(matches!(
            verdict(Capability::IoUring, Err("EPERM".into()), " io-uring ", "t"),
            Verdict::RequiredButMissing(m) if m.contains("io-uring is required here") && m.ends_with("EPERM")
        ));
        // And `check` turns it into the test's failure, a panic with that message.
        let caught = std::panic::catch_unwind(|| {
            check_with(Capability::Mount, Err("not root".into()), "mount,io-uring", "tmpfs test")
        });
        let message = caught.unwrap_err();
        let message = message.downcast_ref::<String>().map(String::as_str).unwrap_or("");
        assert!(message.contains("mount is required here") && message.ends_with("not root"), "{message}");
    }
}
