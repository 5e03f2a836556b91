//! The marker of a complete copy checked whole (`verified` in its directory): written when every
//! record of the copy was read back and matched its CRC-32C (at promotion, or the first time an
//! unmarked complete copy is loaded), bound to the data file's identity (device, inode, size),
//! its modification time and its change time (`ctime`), with a CRC-32C of its own.
//!
//! A load of a complete copy reads it as a plain local file (through `tensora_io`), so it cannot
//! check each range as it lands; it checks the marker instead: one `fstat` of the data file it
//! holds open and one 64-byte read. Any write to the data file through the file system (a flipped
//! byte, a truncation, a copy over it) moves its `ctime`, which no unprivileged process can set
//! back, so the marker no longer holds and the copy is checked whole again before it is used
//! (and demoted to a partial copy, its damaged ranges fetched again, if that fails). What the
//! marker cannot see is the disk changing a block under the file system (as for any local file);
//! `tensora cache verify` reads every byte.

use std::fs::File;
use std::os::unix::fs::MetadataExt as _;
use std::path::Path;

use super::files::{self, Durable};

/// The marker's name in a copy's directory.
pub const MARKER_NAME: &str = "verified";
/// What a marker starts with.
const MAGIC: &[u8; 8] = b"tnsrvrf1";
/// Bytes of a marker.
pub const MARKER_BYTES: usize = 8 + 7 * 8 + 4;

/// The marker of `data` as it is now.
fn marker_of(data: &File) -> std::io::Result<[u8; MARKER_BYTES]> {
    let meta = data.metadata()?;
    let fields = [
        meta.dev(),
        meta.ino(),
        meta.len(),
        meta.mtime() as u64,
        meta.mtime_nsec() as u64,
        meta.ctime() as u64,
        meta.ctime_nsec() as u64,
    ];
    let mut out = [0u8; MARKER_BYTES];
    out[..8].copy_from_slice(MAGIC);
    for (i, field) in fields.iter().enumerate() {
        out[8 + 8 * i..16 + 8 * i].copy_from_slice(&field.to_le_bytes());
    }
    let own = crate::crc::crc32c(&out[..MARKER_BYTES - 4]);
    out[MARKER_BYTES - 4..].copy_from_slice(&own.to_le_bytes());
    Ok(out)
}

/// Mark `dir`'s copy (whose data file is `data`) as checked whole, durably.
pub fn mark(dir: &Path, data: &File) -> std::io::Result<()> {
    files::replace(&dir.join(MARKER_NAME), &marker_of(data)?, Durable::Synced)
}

/// Whether `dir`'s marker holds for `data` as it is now (a missing, damaged or planted marker
/// does not).
pub fn holds(dir: &Path, data: &File) -> bool {
    let Ok(now) = marker_of(data) else { return false };
    files::read_capped(&dir.join(MARKER_NAME), MARKER_BYTES as u64).is_ok_and(|found| found == now)
}

/// Remove `dir`'s marker (a copy demoted to partial).
pub fn unmark(dir: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(dir.join(MARKER_NAME)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::FileExt as _;

    use super::*;

    /// A marker holds until the data file is written to, even with its mtime put back.
    #[test]
    fn a_marker_holds_until_the_data_changes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data");
        std::fs::write(&path, vec![7u8; 10_000]).unwrap();
        let data = File::open(&path).unwrap();
        assert!(!holds(dir.path(), &data), "no marker yet");
        mark(dir.path(), &data).unwrap();
        assert!(holds(dir.path(), &data));
        let mtime = data.metadata().unwrap().modified().unwrap();
        // The change time moves on a later tick than the marker's.
        std::thread::sleep(std::time::Duration::from_millis(20));
        let writer = File::options().write(true).open(&path).unwrap();
        writer.write_all_at(&[8], 500).unwrap();
        writer.set_modified(mtime).unwrap();
        assert!(!holds(dir.path(), &data), "a byte written, mtime put back");
        mark(dir.path(), &data).unwrap();
        assert!(holds(dir.path(), &data));
        // A damaged marker does not hold.
        let marker = dir.path().join(MARKER_NAME);
        let mut bytes = std::fs::read(&marker).unwrap();
        bytes[20] ^= 1;
        std::fs::write(&marker, bytes).unwrap();
        assert!(!holds(dir.path(), &data));
        unmark(dir.path()).unwrap();
        unmark(dir.path()).unwrap();
    }
}
