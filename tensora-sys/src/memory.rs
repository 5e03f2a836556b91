//! How much memory the page cache can be given: the fact behind `auto`'s placement rule (keep a
//! cold checkpoint's pages cached for the next process when they fit; `tensora_io`'s `auto`).
//!
//! [`memory_room`] reads `/proc/meminfo` (`MemTotal`, `MemAvailable`) and, when the process runs in
//! a memory-limited cgroup (v2 `memory.max`, or v1 `memory.limit_in_bytes`), what is left under
//! that limit: the limit minus the cgroup's usage, counting its inactive file pages as free (the
//! kernel reclaims them first, as `MemAvailable` does machine-wide). Each read is one small file;
//! the whole probe reads at most [`CGROUP_FILES_MAX`] files plus `/proc/meminfo`.

use std::path::{Path, PathBuf};

/// Files read under the cgroup's directory at most (limit, usage, stat).
pub const CGROUP_FILES_MAX: usize = 3;
/// A file of the probe is read only up to this many bytes (`/proc/meminfo` is about 1.5 KB,
/// `memory.stat` about 1 KB).
const PROBE_FILE_BYTES_MAX: u64 = 64 << 10;
/// A cgroup v1 limit at or above this is "no limit" (the kernel writes `PAGE_COUNTER_MAX` pages).
const CGROUP_V1_UNLIMITED_BYTES: u64 = 1 << 62;

/// Memory the page cache can be given now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryRoom {
    /// `MemTotal`.
    pub total_bytes: u64,
    /// `MemAvailable`, or what the cgroup's limit leaves when that is smaller.
    pub available_bytes: u64,
    /// The cgroup's memory limit, when there is one below `MemTotal`.
    pub cgroup_limit_bytes: Option<u64>,
}

/// Read the room (see the module docs); `None` when `/proc/meminfo` cannot be read or parsed.
pub fn memory_room() -> Option<MemoryRoom> {
    let meminfo = read_small(Path::new("/proc/meminfo"))?;
    let (total_bytes, machine_available_bytes) = parse_meminfo(&meminfo)?;
    let cgroup = read_small(Path::new("/proc/self/cgroup")).and_then(|text| cgroup_room(&text));
    Some(combine(total_bytes, machine_available_bytes, cgroup))
}

/// The room from the machine's figures and the cgroup's `(limit, room under it)`.
fn combine(total_bytes: u64, machine_available_bytes: u64, cgroup: Option<(u64, u64)>) -> MemoryRoom {
    match cgroup {
        Some((limit_bytes, room_bytes)) if limit_bytes < total_bytes => MemoryRoom {
            total_bytes,
            available_bytes: machine_available_bytes.min(room_bytes),
            cgroup_limit_bytes: Some(limit_bytes),
        },
        _ => MemoryRoom { total_bytes, available_bytes: machine_available_bytes, cgroup_limit_bytes: None },
    }
}

/// `(MemTotal, MemAvailable)` in bytes from the text of `/proc/meminfo`.
fn parse_meminfo(text: &str) -> Option<(u64, u64)> {
    let field = |name: &str| -> Option<u64> {
        let line = text.lines().find(|l| l.starts_with(name) && l[name.len()..].starts_with(':'))?;
        let mut words = line[name.len() + 1..].split_whitespace();
        let value: u64 = words.next()?.parse().ok()?;
        match words.next() {
            Some("kB") => value.checked_mul(1024),
            None => Some(value),
            Some(_) => None,
        }
    };
    Some((field("MemTotal")?, field("MemAvailable")?))
}

/// The cgroup's `(limit, room)` in bytes, from the text of `/proc/self/cgroup`; `None` without a
/// memory limit or when its files cannot be read.
fn cgroup_room(self_cgroup: &str) -> Option<(u64, u64)> {
    let (dirs, version) = cgroup_dirs(self_cgroup)?;
    // In a container the cgroup's own directory is often the mount point itself: try the path
    // /proc/self/cgroup names first, then the mount.
    dirs.iter().find_map(|dir| read_cgroup(dir, version))
}

/// Which cgroup interface a directory speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CgroupVersion {
    V1,
    V2,
}

/// Candidate directories of the process's memory cgroup, most specific first.
fn cgroup_dirs(self_cgroup: &str) -> Option<(Vec<PathBuf>, CgroupVersion)> {
    // v1: "N:memory:/path" (the controller list may hold several names); v2: "0::/path".
    for line in self_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        if controllers.split(',').any(|c| c == "memory") {
            let mount = Path::new("/sys/fs/cgroup/memory");
            return Some((
                vec![mount.join(path.trim_start_matches('/')), mount.to_path_buf()],
                CgroupVersion::V1,
            ));
        }
    }
    let path = self_cgroup.lines().find_map(|l| l.strip_prefix("0::"))?;
    let mount = Path::new("/sys/fs/cgroup");
    Some((vec![mount.join(path.trim_start_matches('/')), mount.to_path_buf()], CgroupVersion::V2))
}

/// `(limit, room)` from one cgroup directory; `None` without a limit there.
fn read_cgroup(dir: &Path, version: CgroupVersion) -> Option<(u64, u64)> {
    let (limit_file, usage_file, inactive_key) = match version {
        CgroupVersion::V1 => ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"),
        CgroupVersion::V2 => ("memory.max", "memory.current", "inactive_file"),
    };
    let limit_text = read_small(&dir.join(limit_file))?;
    let limit_bytes: u64 = limit_text.trim().parse().ok()?; // v2's "max" is no limit: None.
    if limit_bytes >= CGROUP_V1_UNLIMITED_BYTES {
        return None;
    }
    let usage_bytes: u64 = read_small(&dir.join(usage_file))?.trim().parse().ok()?;
    let inactive_bytes =
        read_small(&dir.join("memory.stat")).and_then(|s| stat_field(&s, inactive_key)).unwrap_or(0);
    Some((limit_bytes, limit_bytes.saturating_sub(usage_bytes.saturating_sub(inactive_bytes))))
}

/// The value of `key` in a `memory.stat` text.
fn stat_field(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse().ok())
}

/// A small kernel file as text, read up to [`PROBE_FILE_BYTES_MAX`].
pub(crate) fn read_small(path: &Path) -> Option<String> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(path).ok()?.take(PROBE_FILE_BYTES_MAX).read_to_string(&mut text).ok()?;
    Some(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_parses_kb_fields_and_refuses_what_it_does_not_know() {
        let text = "MemTotal:       24683772 kB\nMemFree:  100 kB\nMemAvailable:   22093564 kB\n";
        assert_eq!(parse_meminfo(text), Some((24_683_772 * 1024, 22_093_564 * 1024)));
        assert_eq!(parse_meminfo("MemTotal: 1 kB\n"), None, "no MemAvailable");
        assert_eq!(parse_meminfo("MemTotal: 1 MB\nMemAvailable: 1 kB\n"), None, "unknown unit");
        assert_eq!(parse_meminfo("MemTotalX: 5 kB\nMemTotal: 2 kB\nMemAvailable: 1 kB"), Some((2048, 1024)));
    }

    #[test]
    fn cgroup_lines_name_the_v1_memory_controller_or_the_v2_path() {
        let v1 = "4:cpu,memory:/job/7\n0::/\n";
        let (dirs, version) = cgroup_dirs(v1).unwrap();
        assert_eq!(version, CgroupVersion::V1);
        assert_eq!(dirs[0], Path::new("/sys/fs/cgroup/memory/job/7"));
        let (dirs, version) = cgroup_dirs("0::/user.slice/x.scope\n").unwrap();
        assert_eq!(version, CgroupVersion::V2);
        assert_eq!(dirs, [Path::new("/sys/fs/cgroup/user.slice/x.scope"), Path::new("/sys/fs/cgroup")]);
        assert!(cgroup_dirs("").is_none());
    }

    #[test]
    fn a_limited_cgroup_counts_inactive_files_as_room_and_never_goes_negative() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("memory.max"), "8589934592\n").unwrap();
        std::fs::write(dir.path().join("memory.current"), "6442450944\n").unwrap();
        std::fs::write(dir.path().join("memory.stat"), "anon 1\ninactive_file 1073741824\nfile 9\n").unwrap();
        // 8 GiB limit, 6 GiB used of which 1 GiB inactive file pages: 3 GiB of room.
        assert_eq!(read_cgroup(dir.path(), CgroupVersion::V2), Some((8 << 30, 3 << 30)));
        std::fs::write(dir.path().join("memory.current"), "99999999999\n").unwrap();
        assert_eq!(read_cgroup(dir.path(), CgroupVersion::V2), Some((8 << 30, 0)));
        std::fs::write(dir.path().join("memory.max"), "max\n").unwrap();
        assert_eq!(read_cgroup(dir.path(), CgroupVersion::V2), None, "no limit");
        std::fs::write(dir.path().join("memory.limit_in_bytes"), "9223372036854771712\n").unwrap();
        assert_eq!(read_cgroup(dir.path(), CgroupVersion::V1), None, "v1's no limit");
    }

    #[test]
    fn the_smaller_of_machine_and_cgroup_room_wins_and_a_limit_above_the_machine_is_none() {
        let total = 24 << 30;
        let r = combine(total, 20 << 30, Some((8 << 30, 3 << 30)));
        assert_eq!((r.available_bytes, r.cgroup_limit_bytes), (3 << 30, Some(8 << 30)));
        let r = combine(total, 20 << 30, Some((64 << 30, 60 << 30)));
        assert_eq!((r.available_bytes, r.cgroup_limit_bytes), (20 << 30, None));
        assert_eq!(combine(total, 5, None).available_bytes, 5);
    }

    #[test]
    fn this_machine_has_room() {
        let room = memory_room().expect("/proc/meminfo on Linux");
        assert!(room.total_bytes > 0 && room.available_bytes <= room.total_bytes, "{room:?}");
    }
}
