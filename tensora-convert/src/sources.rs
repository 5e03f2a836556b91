//! The source files of a conversion: opened once, checked against their parse-time stamps at
//! open and again after the copy, and read on demand by the writer ([`CheckpointSource`]).

use std::fs::{self, File};
use std::os::unix::fs::FileExt;

use tensora_format::{Checkpoint, FileEntry};

use crate::save::{SaveSource, SourceTensor};
use crate::{ConvertError, io_err};

/// Open every source file and check it still looks as it did when parsed. Opened through
/// [`tensora_format::open_regular`], as the parse opened them: a path that names no regular file
/// by now (a FIFO, which a plain `open` would wait on for a writer, or a device) is
/// [`ConvertError::Format`] (`NotRegularFile`). The writer reads the sources with `pread` only,
/// which ignores the `O_NONBLOCK` such a handle may carry.
pub(crate) fn open_sources(files: &[FileEntry]) -> Result<Vec<File>, ConvertError> {
    files
        .iter()
        .map(|f| {
            let (file, meta) = tensora_format::open_regular(f.path()).map_err(|e| match e.into_kind() {
                tensora_format::ErrorKind::Io(source) => io_err(f.path(), "opening source")(source),
                kind => ConvertError::Format(tensora_format::Error::new(f.path(), kind)),
            })?;
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

/// A parsed checkpoint as a [`SaveSource`]: each tensor's storage is read from its file with
/// positional reads when the writer asks for it, so a save or conversion from it holds only the
/// writer's staging buffers. Files are opened (and checked against their parse-time stamps) once.
///
/// ```
/// use tensora_convert::{SaveOptions, save_safetensors};
/// use tensora_convert::CheckpointSource;
///
/// let tiny = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/serverlessllm/tiny");
/// let ckpt = tensora_format::open(tiny)?;
/// let source = CheckpointSource::open(&ckpt)?;
/// let dir = tempfile::tempdir()?;
/// let out = dir.path().join("tiny.safetensors");
/// save_safetensors(&out, &source, ckpt.metadata(), &SaveOptions::default())?;
/// source.check_unchanged()?; // the sources did not change while they were read
/// assert_eq!(tensora_format::open(&out)?.tensors().len(), ckpt.tensors().len());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct CheckpointSource<'a> {
    ckpt: &'a Checkpoint,
    files: Vec<File>,
    tensors: Vec<SourceTensor>,
}

impl<'a> CheckpointSource<'a> {
    /// Open `ckpt`'s files, refusing any that changed since it was parsed.
    pub fn open(ckpt: &'a Checkpoint) -> Result<CheckpointSource<'a>, ConvertError> {
        let files = open_sources(ckpt.files())?;
        let tensors = ckpt.tensors().iter().map(SourceTensor::from_info).collect();
        Ok(CheckpointSource { ckpt, files, tensors })
    }

    /// Check every file against its parse-time stamp, through its descriptor and its path: a
    /// source rewritten or replaced while it was read is [`ConvertError::SourceChanged`].
    pub fn check_unchanged(&self) -> Result<(), ConvertError> {
        check_sources(self.ckpt.files(), &self.files)
    }

    /// The checkpoint read.
    pub fn checkpoint(&self) -> &'a Checkpoint {
        self.ckpt
    }
}

impl SaveSource for CheckpointSource<'_> {
    fn tensors(&self) -> &[SourceTensor] {
        &self.tensors
    }

    fn storage(&self, _i: usize) -> Option<&[u8]> {
        None
    }

    fn read_storage(&self, i: usize, offset_bytes: u64, dst: &mut [u8]) -> Result<(), ConvertError> {
        let t = &self.ckpt.tensors()[i];
        let end = offset_bytes.checked_add(dst.len() as u64).filter(|&e| e <= t.len_bytes());
        if end.is_none() {
            return Err(crate::save::source::out_of_range(&self.tensors, i, offset_bytes, dst.len()));
        }
        let at = t.offset_bytes() + offset_bytes;
        self.files[t.file().index()].read_exact_at(dst, at).map_err(|source| ConvertError::Read {
            path: self.ckpt.file(t.file()).path().to_path_buf(),
            offset_bytes: at,
            len_bytes: dst.len() as u64,
            tensor: t.name().to_owned(),
            source,
        })
    }
}
