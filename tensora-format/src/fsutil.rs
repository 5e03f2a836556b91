//! Small filesystem helpers shared by the parsers: open only regular files (a FIFO or device
//! would block or stream forever), and read small files (indexes, manifests) under a hard cap.

use std::fs::{File, Metadata};
use std::io::Read;
use std::path::Path;

use crate::{Error, ErrorKind, Result};

/// Open `path` for reading only if it is a regular file. The path is checked with `stat` before
/// the open (so opening a FIFO cannot block) and the open handle with `fstat` after it (so a path
/// swapped in between is still refused). Returns the handle and its metadata.
pub fn open_regular(path: &Path) -> Result<(File, Metadata)> {
    let io = |e| Error::new(path, ErrorKind::Io(e));
    let not_regular =
        || Error::new(path, ErrorKind::NotACheckpoint { reason: "not a regular file".to_string() });
    if !std::fs::metadata(path).map_err(io)?.is_file() {
        return Err(not_regular());
    }
    let file = File::open(path).map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    if !meta.is_file() {
        return Err(not_regular());
    }
    Ok((file, meta))
}

/// Read the whole regular file at `path`, refusing it with [`ErrorKind::IndexTooLarge`] if it is
/// (or grows to be) larger than `limit_bytes`. Never allocates more than `limit_bytes + 1`.
///
/// ```
/// let dir = tempfile::tempdir().unwrap();
/// let path = dir.path().join("index.json");
/// std::fs::write(&path, b"{}").unwrap();
/// assert_eq!(tensora_format::read_capped(&path, 16).unwrap(), b"{}");
/// let err = tensora_format::read_capped(&path, 1).unwrap_err();
/// assert!(matches!(err.kind(), tensora_format::ErrorKind::IndexTooLarge { .. }));
/// ```
pub fn read_capped(path: &Path, limit_bytes: u64) -> Result<Vec<u8>> {
    let io = |e| Error::new(path, ErrorKind::Io(e));
    let too_large = |len_bytes| Error::new(path, ErrorKind::IndexTooLarge { len_bytes, limit_bytes });
    let (file, meta) = open_regular(path)?;
    if meta.len() > limit_bytes {
        return Err(too_large(meta.len()));
    }
    // `meta.len() <= limit_bytes` here, so the reservation is bounded by the cap.
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    file.take(limit_bytes.saturating_add(1)).read_to_end(&mut bytes).map_err(io)?;
    if bytes.len() as u64 > limit_bytes {
        return Err(too_large(bytes.len() as u64));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_is_not_a_regular_file() {
        let dir = tempfile::tempdir().unwrap();
        let err = open_regular(dir.path()).unwrap_err();
        assert!(matches!(err.kind(), ErrorKind::NotACheckpoint { .. }), "{err}");
    }

    #[cfg(unix)]
    #[test]
    fn a_fifo_is_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("m.safetensors");
        let status = std::process::Command::new("mkfifo").arg(&fifo).status().unwrap();
        assert!(status.success());
        let err = read_capped(&fifo, 1 << 20).unwrap_err();
        assert!(matches!(err.kind(), ErrorKind::NotACheckpoint { .. }), "{err}");
        let err = crate::open(&fifo).unwrap_err();
        assert!(err.to_string().contains("not a regular file"), "{err}");
    }

    #[test]
    fn missing_files_are_io_errors_naming_the_path() {
        let err = read_capped(Path::new("/nonexistent/tensora/index.json"), 10).unwrap_err();
        assert!(matches!(err.kind(), ErrorKind::Io(_)));
        assert!(err.to_string().contains("/nonexistent/tensora/index.json"));
    }
}
