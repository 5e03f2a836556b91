//! [`SourceFile`]: one checkpoint file as the backends see it.

use std::fs::File;
use std::path::{Path, PathBuf};

/// Which descriptor of a [`SourceFile`] a read goes through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// The buffered descriptor: through the page cache.
    Buffered,
    /// The `O_DIRECT` descriptor: straight from the device (block-aligned offset, length and
    /// address).
    Direct,
}

impl Access {
    /// `Direct` when `direct` holds, else `Buffered`.
    pub fn direct_if(direct: bool) -> Access {
        if direct { Access::Direct } else { Access::Buffered }
    }
}

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
