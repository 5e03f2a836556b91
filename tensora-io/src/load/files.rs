//! The files of one load: each opened once (at most `files_open_max` at a time), checked against
//! its parse-time stamp and for sparseness when opened, and checked again when closed.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Instant;

use tensora_format::{Checkpoint, FileEntry, FileId};

use super::{SPARSE_MIN_LEN_BYTES, SPARSE_RATIO};
use crate::error::LoadError;
use crate::report::Phases;
use crate::seam::SourceFile;

/// Open files of one load, keyed by checkpoint file id, at most `max` at once.
pub(super) struct FileSet {
    pub(super) open: HashMap<u32, SourceFile>,
    /// Every file opened during the load (checked again at the end).
    pub(super) used: Vec<u32>,
    pub(super) max: usize,
    /// Seconds spent opening files (open, fstat, sparse check): the `open` phase, not `io`.
    pub(super) open_secs: f64,
}

impl FileSet {
    pub(super) fn new(max: usize) -> FileSet {
        FileSet { open: HashMap::new(), used: Vec::new(), max: max.max(1), open_secs: 0.0 }
    }

    /// Moves the time spent opening files from the `io` phase (which includes it) to `open`.
    pub(super) fn bill_open(&mut self, phases: &mut Phases) {
        let secs = std::mem::take(&mut self.open_secs);
        phases.io = (phases.io - secs).max(0.0);
        phases.open += secs;
    }

    /// The files `ids` in that order, opening (and checking) the ones not open yet and closing
    /// others to stay within the bound.
    pub(super) fn take(
        &mut self,
        ckpt: &Checkpoint,
        ids: &[u32],
        descriptors: Descriptors,
        sparse: SparseFiles,
    ) -> Result<Vec<SourceFile>, LoadError> {
        let extra = ids.iter().filter(|f| !self.open.contains_key(f)).count();
        if self.open.len() + extra > self.max {
            let surplus: Vec<u32> = self.open.keys().copied().filter(|f| !ids.contains(f)).collect();
            for f in surplus {
                if let Some(s) = self.open.remove(&f) {
                    check_open(ckpt, f, &s)?;
                }
            }
        }
        let mut out = Vec::with_capacity(ids.len());
        for &f in ids {
            let source = match self.open.remove(&f) {
                Some(s) => s,
                None => {
                    let t = Instant::now();
                    let s = open_source(ckpt, f, descriptors, sparse);
                    self.open_secs += t.elapsed().as_secs_f64();
                    match s {
                        Ok(s) => {
                            if !self.used.contains(&f) {
                                self.used.push(f);
                            }
                            s
                        }
                        Err(e) => {
                            self.give_back(&ids[..out.len()], out);
                            return Err(e);
                        }
                    }
                }
            };
            out.push(source);
        }
        Ok(out)
    }

    pub(super) fn give_back(&mut self, ids: &[u32], sources: Vec<SourceFile>) {
        for (&f, s) in ids.iter().zip(sources) {
            self.open.insert(f, s);
        }
    }

    /// `fstat` every open descriptor and `stat` every used path: any change is an error.
    pub(super) fn close_and_check(&mut self, ckpt: &Checkpoint) -> Result<(), LoadError> {
        for (f, s) in std::mem::take(&mut self.open) {
            check_open(ckpt, f, &s)?;
        }
        for &f in &self.used {
            let entry = ckpt.file(FileId(f));
            let meta = std::fs::metadata(entry.path())
                .map_err(|source| LoadError::Open { path: entry.path().to_owned(), source })?;
            unchanged(entry, &meta)?;
        }
        Ok(())
    }
}

/// Whether a file is opened for buffered reads only, or with an `O_DIRECT` descriptor too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Descriptors {
    /// One buffered descriptor.
    Buffered,
    /// A buffered descriptor and, where the filesystem allows it, an `O_DIRECT` one.
    BufferedAndDirect,
}

/// What to do with a file that has far fewer allocated blocks than its size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SparseFiles {
    /// Refuse it ([`LoadError::Sparse`]): most likely an interrupted download.
    Refuse,
    /// Load it anyway (`LoadOptions::allow_sparse`).
    Allow,
}

impl SparseFiles {
    pub(super) fn from_allow(allow_sparse: bool) -> SparseFiles {
        if allow_sparse { SparseFiles::Allow } else { SparseFiles::Refuse }
    }
}

/// `fstat` of an open descriptor against the parse-time stamp.
pub(super) fn check_open(ckpt: &Checkpoint, f: u32, s: &SourceFile) -> Result<(), LoadError> {
    let entry = ckpt.file(FileId(f));
    let meta = s.buffered.metadata().map_err(|source| LoadError::Open { path: s.path.clone(), source })?;
    unchanged(entry, &meta)
}

/// Whether `meta` (taken now) still describes the file `entry` parsed.
pub(super) fn unchanged(entry: &FileEntry, meta: &std::fs::Metadata) -> Result<(), LoadError> {
    entry.check_unchanged(meta).map_err(|change| LoadError::Changed { path: entry.path().to_owned(), change })
}

/// Open checkpoint file `path` for reading through [`tensora_format::open_regular`], the
/// workspace's one regular-file open. The parse opened and checked every file that way, but by
/// the load the path may name something else: a FIFO would block a plain `open` until a writer
/// came and a device would stream bytes that are no checkpoint's, so the path is resolved and
/// checked again, once, and anything but a regular file is [`LoadError::Format`]
/// (`NotRegularFile`, naming the path); an OS error is [`LoadError::Open`]. The descriptor is
/// blocking (`open_regular` may return it `O_NONBLOCK`, which io_uring would answer with
/// `EAGAIN`). Returns it with its `fstat` metadata.
pub(crate) fn open_regular_file(path: &Path) -> Result<(File, std::fs::Metadata), LoadError> {
    let (file, meta) = tensora_format::open_regular(path).map_err(|e| match e.into_kind() {
        tensora_format::ErrorKind::Io(source) => LoadError::Open { path: path.to_owned(), source },
        kind => LoadError::Format(tensora_format::Error::new(path, kind)),
    })?;
    tensora_sys::clear_nonblocking(&file)
        .map_err(|source| LoadError::Open { path: path.to_owned(), source })?;
    Ok((file, meta))
}

/// Open one checkpoint file: buffered descriptor (and a direct one when asked and supported),
/// `fstat` against the parse-time stamp, sparse check.
pub(super) fn open_source(
    ckpt: &Checkpoint,
    f: u32,
    descriptors: Descriptors,
    sparse: SparseFiles,
) -> Result<SourceFile, LoadError> {
    let entry = ckpt.file(FileId(f));
    let path = entry.path();
    let open_err = |source| LoadError::Open { path: path.to_owned(), source };
    let (buffered, meta) = open_regular_file(path)?;
    unchanged(entry, &meta)?;
    let len_bytes = meta.len();
    let allocated_bytes = meta.blocks().saturating_mul(512);
    if sparse == SparseFiles::Refuse
        && len_bytes >= SPARSE_MIN_LEN_BYTES
        && allocated_bytes < len_bytes / SPARSE_RATIO
    {
        return Err(LoadError::Sparse { path: path.to_owned(), allocated_bytes, len_bytes });
    }
    // The direct descriptor reopens the checked inode through its `/proc/self/fd` link, never the
    // path again (which could name a FIFO by now); without `/proc` there is none and the reads
    // go through the page cache.
    let direct = match descriptors {
        Descriptors::BufferedAndDirect => tensora_sys::open_direct(&tensora_sys::fd_path(&buffered)).ok(),
        Descriptors::Buffered => None,
    };
    if let Some(d) = &direct {
        // Both descriptors must name the same file, or the direct reads would fetch another
        // file's bytes.
        let d_meta = d.metadata().map_err(open_err)?;
        unchanged(entry, &d_meta)?;
    }
    Ok(SourceFile { path: path.to_owned(), len_bytes, buffered, direct })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt as _;

    /// The direct descriptor reopens the checked file through its `/proc/self/fd` link: the same
    /// inode, with `O_DIRECT` on (an unaligned read is refused).
    #[test]
    fn the_direct_descriptor_is_the_checked_file_opened_direct() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/serverlessllm/tiny");
        let ckpt = tensora_format::sllm::open_dir(Path::new(dir)).unwrap();
        let context = "the_direct_descriptor_is_the_checked_file_opened_direct";
        if !tensora_testkit::direct_io_or_skip(ckpt.file(FileId(0)).path(), context) {
            return;
        }
        let s = open_source(&ckpt, 0, Descriptors::BufferedAndDirect, SparseFiles::Allow).unwrap();
        let direct = s.direct.as_ref().expect("a direct descriptor where O_DIRECT works");
        let (a, b) = (s.buffered.metadata().unwrap(), direct.metadata().unwrap());
        assert_eq!((a.dev(), a.ino()), (b.dev(), b.ino()));
        let mut three = [0u8; 3];
        let err = direct.read_at(&mut three, 1).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EINVAL), "{err}");
        s.buffered.read_at(&mut three, 1).unwrap();
    }
}
