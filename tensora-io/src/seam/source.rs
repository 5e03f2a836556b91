//! [`SourceFile`]: one checkpoint file as the backends see it.

use std::fs::File;
use std::path::{Path, PathBuf};

/// One checkpoint file, opened once and shared by every worker (positional reads only, so no
/// shared cursor). `direct` is a second descriptor opened with `O_DIRECT`, when asked for and
/// supported by the filesystem.
#[derive(Debug)]
pub struct SourceFile {
    /// The path it was opened at.
    pub path: PathBuf,
    /// Its size (checked against the parse-time stamp when opened).
    pub len_bytes: u64,
    /// The buffered descriptor.
    pub buffered: File,
    /// The `O_DIRECT` descriptor, when asked for and supported.
    pub direct: Option<File>,
}

impl SourceFile {
    /// The path it was opened at.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Test support: a temporary file holding `bytes`, opened as a [`SourceFile`].
#[cfg(test)]
pub(crate) fn temp_source(bytes: &[u8]) -> (tempfile::NamedTempFile, SourceFile) {
    use std::io::Write;
    let mut tmp = tempfile::NamedTempFile::new().expect("temp file");
    tmp.write_all(bytes).expect("write temp file");
    tmp.flush().expect("flush temp file");
    let f = SourceFile {
        path: tmp.path().to_path_buf(),
        len_bytes: bytes.len() as u64,
        buffered: File::open(tmp.path()).expect("reopen temp file"),
        direct: None,
    };
    (tmp, f)
}
