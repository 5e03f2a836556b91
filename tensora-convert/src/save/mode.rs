//! Choosing how a save writes, as `tensora_io::auto` chooses how a load reads: a few cheap facts
//! ([`WriteFacts`]: the destination's filesystem, the size, the CPUs, where the bytes come from)
//! and a pure rule table ([`choose`]), whose one-line reason goes into the report.
//!
//! | facts | mode | why |
//! |---|---|---|
//! | network/FUSE filesystem | buffered | `O_DIRECT` semantics vary there |
//! | under [`DIRECT_MIN_BYTES`] | buffered | the page cache absorbs it; the `fsync` is short |
//! | otherwise | direct | large aligned writes straight to the device from staging buffers: no page-cache copy, no dirty-page writeback burst at `fsync` |
//!
//! Direct writes also need the filesystem to take `O_DIRECT` (tmpfs does not): that is found when
//! the first output is opened, and the save goes buffered with the refusal as its reason. The
//! measurements behind the table are in `docs/design.md` ("Saving").

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use tensora_sys::Filesystem;

/// Below this many bytes a save writes through the page cache.
pub const DIRECT_MIN_BYTES: u64 = 64 << 20;
/// Writer threads of a direct save (each keeps one piece in flight: the device's queue depth;
/// with [`super::STAGING_BYTES_MAX`] they write 4 MiB pieces).
pub const DIRECT_THREADS_DEFAULT: usize = 8;
/// Most writer threads a save starts.
pub const THREADS_MAX: usize = 16;

/// How a save was asked to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WriteChoice {
    /// Decide from the facts (`choose`).
    #[default]
    Auto,
    /// Through the page cache.
    Buffered,
    /// `O_DIRECT` where the filesystem takes it (buffered, with the reason, where not).
    Direct,
}

impl FromStr for WriteChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<WriteChoice, String> {
        match s {
            "auto" => Ok(WriteChoice::Auto),
            "buffered" => Ok(WriteChoice::Buffered),
            "direct" => Ok(WriteChoice::Direct),
            other => Err(format!("unknown write mode {other:?} (expected auto, buffered or direct)")),
        }
    }
}

/// How a save writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteMode {
    /// `pwrite` through the page cache, straight from the tensors where they are in memory.
    Buffered,
    /// `O_DIRECT` `pwrite` of aligned pieces from staging buffers.
    Direct,
}

impl WriteMode {
    /// `"buffered"` or `"direct"`, as in reports.
    pub const fn as_str(self) -> &'static str {
        match self {
            WriteMode::Buffered => "buffered",
            WriteMode::Direct => "direct",
        }
    }
}

impl fmt::Display for WriteMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the choice looks at.
#[derive(Debug, Clone, PartialEq)]
pub struct WriteFacts {
    /// Bytes to write (every output file).
    pub bytes: u64,
    /// The destination directory's filesystem; `None` when `statfs` failed.
    pub filesystem: Option<Filesystem>,
    /// CPUs available to this process.
    pub cpus: usize,
    /// Whether every tensor's bytes are in memory (else some are read while writing).
    pub in_memory: bool,
}

impl WriteFacts {
    /// The facts of writing `bytes` into `dir`.
    pub fn gather(dir: &Path, bytes: u64, in_memory: bool) -> WriteFacts {
        WriteFacts {
            bytes,
            filesystem: tensora_sys::filesystem(dir).ok(),
            cpus: tensora_sys::cpu_count(),
            in_memory,
        }
    }
}

/// The mode and its one-line reason.
pub fn choose(f: &WriteFacts, asked: WriteChoice) -> (WriteMode, String) {
    let fs_name = f.filesystem.as_ref().map_or("unknown fs", |fs| fs.name.as_str());
    let facts = format!(
        "{:.2} GB to {fs_name}, {} CPU(s), tensors {}",
        f.bytes as f64 / 1e9,
        f.cpus,
        if f.in_memory { "in memory" } else { "read while writing" }
    );
    match asked {
        WriteChoice::Buffered => return (WriteMode::Buffered, format!("buffered: asked for; {facts}")),
        WriteChoice::Direct => return (WriteMode::Direct, format!("direct: asked for; {facts}")),
        WriteChoice::Auto => {}
    }
    if f.filesystem.as_ref().is_some_and(|fs| fs.remote) {
        return (WriteMode::Buffered, format!("buffered: {fs_name} is a network/FUSE filesystem; {facts}"));
    }
    if f.bytes < DIRECT_MIN_BYTES {
        return (
            WriteMode::Buffered,
            format!("buffered: under {} MiB, the page cache absorbs it; {facts}", DIRECT_MIN_BYTES >> 20),
        );
    }
    (
        WriteMode::Direct,
        format!(
            "direct: large aligned writes from staging buffers, no page-cache copy or writeback burst; {facts}"
        ),
    )
}

/// Writer threads for `mode` when the caller left it to us (`asked == 0`), at most
/// [`THREADS_MAX`]: direct writes keep [`DIRECT_THREADS_DEFAULT`] pieces in flight; buffered
/// writes are copies into the page cache, one thread per CPU (at least two).
pub fn threads(mode: WriteMode, cpus: usize, asked: usize) -> usize {
    let auto = match mode {
        WriteMode::Direct => DIRECT_THREADS_DEFAULT,
        WriteMode::Buffered => cpus.max(2),
    };
    if asked == 0 { auto.min(THREADS_MAX) } else { asked.min(THREADS_MAX) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(bytes: u64, fs: &str, remote: bool) -> WriteFacts {
        WriteFacts {
            bytes,
            filesystem: Some(Filesystem { magic: 0, name: fs.into(), remote }),
            cpus: 2,
            in_memory: true,
        }
    }

    #[test]
    fn the_rule_table() {
        let (m, why) = choose(&facts(1 << 30, "ext4", false), WriteChoice::Auto);
        assert_eq!(m, WriteMode::Direct);
        assert!(why.starts_with("direct: large aligned writes") && why.contains("ext4"), "{why}");
        let (m, why) = choose(&facts(1 << 30, "nfs", true), WriteChoice::Auto);
        assert_eq!((m, why.contains("network")), (WriteMode::Buffered, true));
        let (m, why) = choose(&facts(DIRECT_MIN_BYTES - 1, "ext4", false), WriteChoice::Auto);
        assert_eq!((m, why.contains("page cache")), (WriteMode::Buffered, true));
        let (m, why) = choose(&facts(1, "nfs", true), WriteChoice::Direct);
        assert_eq!((m, why.starts_with("direct: asked for")), (WriteMode::Direct, true));
        assert_eq!(choose(&facts(1 << 40, "ext4", false), WriteChoice::Buffered).0, WriteMode::Buffered);
    }

    #[test]
    fn names_parse_and_threads_are_bounded() {
        for (s, c) in [
            ("auto", WriteChoice::Auto),
            ("buffered", WriteChoice::Buffered),
            ("direct", WriteChoice::Direct),
        ] {
            assert_eq!(s.parse::<WriteChoice>(), Ok(c));
        }
        assert!("odirect".parse::<WriteChoice>().is_err());
        assert_eq!(threads(WriteMode::Direct, 2, 0), DIRECT_THREADS_DEFAULT);
        assert_eq!(threads(WriteMode::Buffered, 1, 0), 2);
        assert_eq!(threads(WriteMode::Buffered, 64, 0), THREADS_MAX);
        assert_eq!(threads(WriteMode::Buffered, 2, 1000), THREADS_MAX);
        assert_eq!(WriteMode::Direct.to_string(), "direct");
    }
}
