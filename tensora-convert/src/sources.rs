//! The source files of a conversion: opened once, and checked against their parse-time stamps
//! at open and again after the copy.

use std::fs::{self, File};

use tensora_format::FileEntry;

use crate::{ConvertError, io_err};

/// Open every source file and check it still looks as it did when parsed.
pub(crate) fn open_sources(files: &[FileEntry]) -> Result<Vec<File>, ConvertError> {
    files
        .iter()
        .map(|f| {
            let file = File::open(f.path()).map_err(io_err(f.path(), "opening source"))?;
            let meta = file.metadata().map_err(io_err(f.path(), "stat of source"))?;
            compare_source_stamp(f, &meta)?;
            Ok(file)
        })
        .collect()
}

/// After the copy: `fstat` every source descriptor and `stat` every source path against the
/// parse-time stamp (size, mtime, inode), like the load path's close check. A source rewritten or
/// replaced during the conversion fails it.
pub(crate) fn check_sources(files: &[FileEntry], sources: &[File]) -> Result<(), ConvertError> {
    for (f, file) in files.iter().zip(sources) {
        let meta = file.metadata().map_err(io_err(f.path(), "stat of source"))?;
        compare_source_stamp(f, &meta)?;
        let meta = fs::metadata(f.path()).map_err(io_err(f.path(), "stat of source"))?;
        compare_source_stamp(f, &meta)?;
    }
    Ok(())
}

/// `meta` (taken now) against `f`'s parse-time stamp.
fn compare_source_stamp(f: &FileEntry, meta: &fs::Metadata) -> Result<(), ConvertError> {
    f.check_unchanged(meta)
        .map_err(|change| ConvertError::SourceChanged { path: f.path().to_path_buf(), change })
}
