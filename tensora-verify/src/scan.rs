//! The integrity scan: every checkpoint file read once, front to back, with every tensor's digest
//! computed from the same bytes as they stream past.
//!
//! This is `tensora verify`'s own read path. It proves what a load cannot: that each file is
//! readable *to its end* (header and padding included, not only the tensor ranges), that it is as
//! long as when it was parsed, that it has no sparse regions and that it did not change during the
//! scan. Memory is bounded by one chunk buffer per worker ([`ScanConfig::chunk_bytes`]).
//!
//! Reads go through [`ReadAt`], so tests can put a fault-injecting layer between the scan and the
//! file (see [`scan_with`]).

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use tensora_format::{Checkpoint, FileChanged, FileId, FileStamp};

use crate::digest::{Algo, Digest, Hasher};

/// Positional reads, as `pread(2)`: read up to `buf.len()` bytes at `offset_bytes`, returning how
/// many were read (0 at end of file).
pub trait ReadAt: Send + Sync {
    /// Read up to `buf.len()` bytes at `offset_bytes`; how many were read (0 at end of file).
    fn read_at(&self, buf: &mut [u8], offset_bytes: u64) -> io::Result<usize>;
    /// Size, mtime and inode now (to compare with the parse-time stamp).
    fn stamp(&self) -> io::Result<FileStamp>;
    /// Bytes of storage allocated to the file (`st_blocks × 512`), when the platform says.
    fn allocated_bytes(&self) -> io::Result<Option<u64>>;
}

impl ReadAt for File {
    fn read_at(&self, buf: &mut [u8], offset_bytes: u64) -> io::Result<usize> {
        std::os::unix::fs::FileExt::read_at(self, buf, offset_bytes)
    }
    fn stamp(&self) -> io::Result<FileStamp> {
        Ok(FileStamp::from_metadata(&self.metadata()?))
    }
    fn allocated_bytes(&self) -> io::Result<Option<u64>> {
        use std::os::unix::fs::MetadataExt;
        Ok(Some(self.metadata()?.blocks().saturating_mul(512)))
    }
}

/// Opens a checkpoint file (its index in [`Checkpoint::files`] and its path) for the scan.
pub type Opener<'a> = &'a (dyn Fn(FileId, &Path) -> io::Result<Box<dyn ReadAt>> + Sync);

/// Told the number of bytes each successful read added (from any worker thread).
pub type Progress<'a> = &'a (dyn Fn(u64) + Sync);

/// Scan knobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScanConfig {
    /// The digest algorithm for every tensor.
    pub algo: Algo,
    /// Size of one read and of each worker's buffer.
    pub chunk_bytes: usize,
    /// Worker threads. At least 1.
    pub threads: usize,
    /// Target length of one unit of work (a run of whole tensors of one file); a file larger than
    /// this is read by several threads at once.
    pub segment_bytes: u64,
    /// Bound on retries of `EINTR`/`EAGAIN` for one read. A short read is not an error: the scan
    /// continues from where it ended.
    pub retries_max: u32,
}

impl Default for ScanConfig {
    fn default() -> ScanConfig {
        ScanConfig {
            algo: Algo::default(),
            chunk_bytes: 8 << 20,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()).min(4),
            segment_bytes: 256 << 20,
            retries_max: 8,
        }
    }
}

/// What went wrong with one file. At most one per file: the scan of a file stops at its first
/// problem (anything after it would be noise).
#[derive(Debug)]
pub enum FileProblem {
    /// The file could not be opened.
    Open(io::Error),
    /// The file is shorter than when it was parsed (or than its tensors need).
    Truncated {
        /// The size at parse time.
        expected_len_bytes: u64,
        /// The size now, or where reading hit end of file.
        actual_len_bytes: u64,
    },
    /// A read failed (after retries, for transient errors).
    Read {
        /// Where the failed read started.
        offset_bytes: u64,
        /// The last error.
        error: io::Error,
    },
    /// Size, mtime or inode differ from the parse-time stamp: the file was modified or replaced.
    Changed(FileChanged),
}

impl std::fmt::Display for FileProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FileProblem::Open(e) => write!(f, "cannot open: {e}"),
            FileProblem::Truncated { expected_len_bytes, actual_len_bytes } => write!(
                f,
                "truncated: {actual_len_bytes} bytes, expected {expected_len_bytes} ({} missing)",
                expected_len_bytes - actual_len_bytes
            ),
            FileProblem::Read { offset_bytes, error } => {
                write!(f, "read error at offset {offset_bytes}: {error}")
            }
            FileProblem::Changed(change) => {
                write!(f, "modified or replaced during the check: {}", change.what())
            }
        }
    }
}

/// The scan of one file.
#[derive(Debug)]
pub struct FileScan {
    /// The file's index in [`Checkpoint::files`].
    pub file: FileId,
    /// The file's path.
    pub path: PathBuf,
    /// Size at parse time.
    pub expected_len_bytes: u64,
    /// Bytes read, from offset 0.
    pub read_bytes: u64,
    /// `st_blocks × 512`, when known.
    pub allocated_bytes: Option<u64>,
    /// Reads retried after `EINTR` or `EAGAIN`.
    pub retries: u64,
    /// The first problem found, if any.
    pub problem: Option<FileProblem>,
}

impl FileScan {
    /// The file has fewer allocated bytes than its length needs: it has holes (sparse regions),
    /// which read back as zeros, or a compressing filesystem (ZFS, btrfs) stores it in fewer
    /// blocks. `st_blocks` cannot tell the two apart (finding the holes takes
    /// `lseek(SEEK_HOLE)`, and this crate forbids `unsafe`), so the finding built from this is an
    /// error only below half allocation ([`crate::check::FindingKind::severity`]). Files under one
    /// block are never flagged (they may be stored inline).
    pub fn sparse_bytes(&self) -> Option<u64> {
        /// A hole is at least one filesystem block; allow one block of slack for inline tails.
        const BLOCK_BYTES: u64 = 4096;
        let allocated = self.allocated_bytes?;
        let needed = self.expected_len_bytes / BLOCK_BYTES * BLOCK_BYTES;
        (allocated + BLOCK_BYTES <= needed).then(|| needed - allocated)
    }
}

/// The result of [`scan`]: one entry per file, one optional digest per tensor.
#[derive(Debug)]
pub struct Scan {
    /// The algorithm of every digest.
    pub algo: Algo,
    /// One per file, indexed like [`Checkpoint::files`].
    pub files: Vec<FileScan>,
    /// Indexed like [`Checkpoint::tensors`]. `None` when a problem in the tensor's file stopped
    /// the scan before the tensor was read whole.
    pub digests: Vec<Option<Digest>>,
}

impl Scan {
    /// Whether every file was read to its end without a problem.
    pub fn is_clean(&self) -> bool {
        self.files.iter().all(|f| f.problem.is_none() && f.sparse_bytes().is_none())
    }
}

/// Scan every file of `ckpt` with the real filesystem.
///
/// ```no_run
/// use tensora_verify::{scan, ScanConfig};
///
/// let ckpt = tensora_format::open("model.safetensors")?;
/// let result = scan(&ckpt, &ScanConfig::default());
/// for (t, d) in ckpt.tensors().iter().zip(&result.digests) {
///     println!("{} {}", t.name(), d.map(|d| d.to_hex()).unwrap_or_default());
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn scan(ckpt: &Checkpoint, config: &ScanConfig) -> Scan {
    // Opened as the parser opens: a name replaced by a FIFO since the parse is refused at once
    // (opening one for reading waits for a writer).
    let open = |_: FileId, p: &Path| -> io::Result<Box<dyn ReadAt>> {
        let (file, _) = tensora_format::open_regular(p).map_err(|e| io_error(e.into_kind()))?;
        Ok(Box::new(file))
    };
    scan_with(ckpt, config, &open, None)
}

/// A failed open or read of `tensora_format`'s as an `io::Error` (the caller names the file): its
/// own I/O error, or `InvalidInput` for a FIFO, device or directory ([`tensora_format::open_regular`]).
pub(crate) fn io_error(kind: tensora_format::ErrorKind) -> io::Error {
    match kind {
        tensora_format::ErrorKind::Io(source) => source,
        kind @ tensora_format::ErrorKind::NotRegularFile { .. } => {
            io::Error::new(io::ErrorKind::InvalidInput, kind.to_string())
        }
        other => io::Error::other(other.to_string()),
    }
}

/// [`scan`] through a caller-chosen opener (e.g. a fault-injecting layer), reporting progress.
///
/// Work is split into segments: runs of whole tensors of about [`ScanConfig::segment_bytes`]
/// (never splitting a tensor, whose digest is a stream), together covering every byte of every
/// file. Workers take segments from a shared queue, so one large file is read and hashed by
/// several threads.
pub fn scan_with(
    ckpt: &Checkpoint,
    config: &ScanConfig,
    open: Opener<'_>,
    progress: Option<Progress<'_>>,
) -> Scan {
    let chunk_bytes = config.chunk_bytes.max(1);
    let mut digests = vec![None; ckpt.tensors().len()];
    let mut segments = Vec::new();
    for id in 0..ckpt.files().len() {
        segments.extend(plan_segments(ckpt, FileId(id as u32), config, &mut digests));
    }
    let threads = config.threads.clamp(1, segments.len().max(1));
    let next = Mutex::new(0usize);
    let results: Mutex<Vec<SegmentResult>> = Mutex::new(Vec::with_capacity(segments.len()));
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                let mut buf = vec![0u8; chunk_bytes];
                loop {
                    let i = {
                        let mut next = next.lock().unwrap_or_else(|e| e.into_inner());
                        let i = *next;
                        *next += 1;
                        i
                    };
                    let Some(segment) = segments.get(i) else { break };
                    let r = scan_segment(ckpt, segment, config, open, progress, &mut buf);
                    results.lock().unwrap_or_else(|e| e.into_inner()).push(r);
                }
            });
        }
    });
    let mut results = results.into_inner().unwrap_or_else(|e| e.into_inner());
    results.sort_by_key(|r| (r.file, r.start));

    let mut files: Vec<FileScan> = ckpt
        .files()
        .iter()
        .enumerate()
        .map(|(i, f)| FileScan {
            file: FileId(i as u32),
            path: f.path().to_path_buf(),
            expected_len_bytes: f.len_bytes(),
            read_bytes: 0,
            allocated_bytes: None,
            retries: 0,
            problem: None,
        })
        .collect();
    let mut file_digests: Vec<Vec<(usize, Digest)>> = vec![Vec::new(); files.len()];
    for r in results {
        let f = &mut files[r.file.index()];
        f.read_bytes += r.read_bytes;
        f.retries += r.retries;
        f.allocated_bytes = f.allocated_bytes.or(r.allocated_bytes);
        if let Some(p) = r.problem
            && f.problem.as_ref().is_none_or(|old| p.rank() < old.rank())
        {
            f.problem = Some(p);
        }
        file_digests[r.file.index()].extend(r.digests);
    }
    for (f, ds) in files.iter().zip(file_digests) {
        // Digests of tensors in a file that changed under us mean nothing; tensors read whole
        // before a read error or the end of a truncated file keep theirs.
        if matches!(f.problem, Some(FileProblem::Changed(_))) {
            continue;
        }
        for (i, d) in ds {
            digests[i] = Some(d);
        }
    }
    Scan { algo: config.algo, files, digests }
}

impl FileProblem {
    /// Which problem a file reports when its segments found several: the most basic one, then
    /// the one nearest the start of the file.
    fn rank(&self) -> (u8, u64) {
        match self {
            FileProblem::Open(_) => (0, 0),
            FileProblem::Changed(_) => (1, 0),
            FileProblem::Truncated { actual_len_bytes, .. } => (2, *actual_len_bytes),
            FileProblem::Read { offset_bytes, .. } => (3, *offset_bytes),
        }
    }
}

/// A byte range of one file and the tensors that start in it, `(index, start, end)` by start.
#[derive(Debug)]
struct Segment {
    file: FileId,
    start: u64,
    end: u64,
    tensors: Vec<(usize, u64, u64)>,
}

/// What one segment's scan found.
struct SegmentResult {
    file: FileId,
    start: u64,
    read_bytes: u64,
    retries: u64,
    allocated_bytes: Option<u64>,
    problem: Option<FileProblem>,
    digests: Vec<(usize, Digest)>,
}

/// Cut `[0, len)` of a file into segments at tensor starts that no earlier tensor spans, each at
/// least `segment_bytes` long (the last takes the rest). Empty tensors are digested here.
fn plan_segments(
    ckpt: &Checkpoint,
    id: FileId,
    config: &ScanConfig,
    digests: &mut [Option<Digest>],
) -> Vec<Segment> {
    let len = ckpt.file(id).len_bytes();
    let mut tensors: Vec<(usize, u64, u64)> = Vec::new();
    for (i, t) in ckpt.tensors().iter().enumerate().filter(|(_, t)| t.file() == id) {
        if t.nbytes() == 0 {
            digests[i] = Some(config.algo.digest(&[]));
        } else {
            tensors.push((i, t.offset_bytes(), t.offset_bytes() + t.nbytes()));
        }
    }
    tensors.sort_by_key(|&(_, start, end)| (start, end));
    let segment_bytes = config.segment_bytes.max(1);
    let mut segments = Vec::new();
    let mut current = Segment { file: id, start: 0, end: len, tensors: Vec::new() };
    let mut spanned_to = 0u64;
    for &(i, start, end) in &tensors {
        if start >= spanned_to && start - current.start >= segment_bytes {
            let rest = Segment { file: id, start, end: len, tensors: Vec::new() };
            let mut done = std::mem::replace(&mut current, rest);
            done.end = start;
            segments.push(done);
        }
        current.tensors.push((i, start, end));
        spanned_to = spanned_to.max(end);
    }
    segments.push(current);
    segments
}

/// One tensor being hashed as the file streams past.
struct Active {
    index: usize,
    start: u64,
    end: u64,
    hasher: Hasher,
}

fn scan_segment(
    ckpt: &Checkpoint,
    seg: &Segment,
    config: &ScanConfig,
    open: Opener<'_>,
    progress: Option<Progress<'_>>,
    buf: &mut [u8],
) -> SegmentResult {
    let entry = ckpt.file(seg.file);
    let mut out = SegmentResult {
        file: seg.file,
        start: seg.start,
        read_bytes: 0,
        retries: 0,
        allocated_bytes: None,
        problem: None,
        digests: Vec::with_capacity(seg.tensors.len()),
    };
    let file = match open(seg.file, entry.path()) {
        Ok(f) => f,
        Err(e) => {
            out.problem = Some(FileProblem::Open(e));
            return out;
        }
    };
    let before = entry.stamp();
    match file.stamp() {
        Ok(now) if now.len_bytes < before.len_bytes => {
            out.problem = Some(FileProblem::Truncated {
                expected_len_bytes: before.len_bytes,
                actual_len_bytes: now.len_bytes,
            });
            return out;
        }
        Ok(now) => {
            if let Err(change) = before.check(&now) {
                out.problem = Some(FileProblem::Changed(change));
                return out;
            }
        }
        Err(e) => {
            out.problem = Some(FileProblem::Read { offset_bytes: seg.start, error: e });
            return out;
        }
    }
    out.allocated_bytes = file.allocated_bytes().ok().flatten();

    let mut active: Vec<Active> = Vec::new();
    let mut next_pending = 0;
    let mut pos = seg.start;
    while pos < seg.end {
        let want = (seg.end - pos).min(buf.len() as u64) as usize;
        let got = match read_retrying(&*file, &mut buf[..want], pos, config.retries_max, &mut out.retries) {
            Ok(0) => {
                out.problem = Some(FileProblem::Truncated {
                    expected_len_bytes: before.len_bytes,
                    actual_len_bytes: pos,
                });
                break;
            }
            Ok(n) => n,
            Err(error) => {
                out.problem = Some(FileProblem::Read { offset_bytes: pos, error });
                break;
            }
        };
        let chunk_end = pos + got as u64;
        if let Some(p) = progress {
            p(got as u64);
        }
        while next_pending < seg.tensors.len() && seg.tensors[next_pending].1 < chunk_end {
            let (index, start, end) = seg.tensors[next_pending];
            active.push(Active { index, start, end, hasher: config.algo.hasher() });
            next_pending += 1;
        }
        for a in &mut active {
            let from = a.start + a.hasher.len_bytes();
            let to = a.end.min(chunk_end);
            if from < to {
                a.hasher.update(&buf[(from - pos) as usize..(to - pos) as usize]);
            }
        }
        let mut k = 0;
        while k < active.len() {
            if active[k].end <= chunk_end {
                let a = active.swap_remove(k);
                out.digests.push((a.index, a.hasher.finish()));
            } else {
                k += 1;
            }
        }
        pos = chunk_end;
    }
    out.read_bytes = pos - seg.start;
    if out.problem.is_none() {
        // The file must still be the one that was parsed: same inode, size and mtime through
        // our handle (modified in place) and at its path (replaced by a rename).
        let after = file.stamp().and_then(|h| std::fs::metadata(entry.path()).map(|m| (h, m)));
        match after {
            Ok((handle, meta)) => {
                if let Err(change) = before.check(&handle).and_then(|()| entry.check_unchanged(&meta)) {
                    out.problem = Some(FileProblem::Changed(change));
                }
            }
            Err(error) => out.problem = Some(FileProblem::Read { offset_bytes: pos, error }),
        }
    }
    out
}

/// One positional read, retrying `EINTR`/`EAGAIN` at most `retries_max` times.
fn read_retrying(
    file: &dyn ReadAt,
    buf: &mut [u8],
    offset_bytes: u64,
    retries_max: u32,
    retries: &mut u64,
) -> io::Result<usize> {
    let mut attempt = 0;
    loop {
        match file.read_at(buf, offset_bytes) {
            Ok(n) => return Ok(n),
            Err(e)
                if matches!(e.kind(), io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock)
                    && attempt < retries_max =>
            {
                attempt += 1;
                *retries += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    const TINY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/serverlessllm/tiny");
    const TINY_EXPECTED: &str =
        concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/serverlessllm/tiny.expected.json");

    fn expected_sha256(path: &str) -> BTreeMap<String, String> {
        let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        doc["tensors"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), v["sha256"].as_str().unwrap().to_owned()))
            .collect()
    }

    #[test]
    fn sha256_of_every_tensor_matches_the_independent_implementation() {
        let ckpt = tensora_format::sllm::open_dir(Path::new(TINY)).unwrap();
        let expected = expected_sha256(TINY_EXPECTED);
        // Small chunks so tensors straddle chunk boundaries; one thread and several.
        for (chunk_bytes, threads, segment_bytes) in
            [(1000, 1, 1 << 30), (4096, 3, 1), (1 << 20, 2, 5000), (7, 2, 20000)]
        {
            let config =
                ScanConfig { algo: Algo::Sha256, chunk_bytes, threads, segment_bytes, retries_max: 0 };
            let result = scan(&ckpt, &config);
            assert!(result.is_clean(), "{:?}", result.files);
            assert_eq!(result.files.len(), ckpt.files().len());
            for f in &result.files {
                assert_eq!(f.read_bytes, f.expected_len_bytes);
            }
            let got: BTreeMap<String, String> = ckpt
                .tensors()
                .iter()
                .zip(&result.digests)
                .map(|(t, d)| (t.name().to_owned(), d.expect("digest").to_hex()))
                .collect();
            assert_eq!(got, expected, "chunk_bytes {chunk_bytes}");
        }
    }

    /// Copy the fixture into a temporary directory the test may damage.
    fn tiny_copy() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for e in std::fs::read_dir(TINY).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), dir.path().join(e.file_name())).unwrap();
        }
        dir
    }

    /// A file replaced by a FIFO after parsing cannot be opened (refused, not waited on for a
    /// writer); the other files are scanned.
    #[test]
    fn a_file_replaced_by_a_fifo_is_refused_without_waiting() {
        let dir = tiny_copy();
        let ckpt = tensora_format::sllm::open_dir(dir.path()).unwrap();
        let victim = dir.path().join("tensor.data_1");
        std::fs::remove_file(&victim).unwrap();
        assert!(std::process::Command::new("mkfifo").arg(&victim).status().unwrap().success());
        let (done, result) = std::sync::mpsc::channel();
        // Detached: were an open to block, the test fails at the timeout below, not hangs.
        std::thread::spawn(move || {
            let result = scan(&ckpt, &ScanConfig { algo: Algo::Crc32c, ..ScanConfig::default() });
            done.send(result.files.into_iter().map(|f| f.problem).collect::<Vec<_>>())
        });
        let problems =
            result.recv_timeout(std::time::Duration::from_secs(10)).expect("scan waited on a FIFO");
        match &problems[1] {
            Some(FileProblem::Open(e)) => {
                assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
                assert!(e.to_string().contains("not a regular file"), "{e}");
            }
            other => panic!("expected Open, got {other:?}"),
        }
        assert!(problems[0].is_none() && problems[2].is_none(), "{problems:?}");
    }

    #[test]
    fn a_file_truncated_after_parsing_is_truncated_and_keeps_earlier_digests() {
        let dir = tiny_copy();
        let ckpt = tensora_format::sllm::open_dir(dir.path()).unwrap();
        let victim = dir.path().join("tensor.data_1");
        let len = std::fs::metadata(&victim).unwrap().len();
        std::fs::OpenOptions::new().write(true).open(&victim).unwrap().set_len(len - 100).unwrap();
        let result = scan(&ckpt, &ScanConfig { algo: Algo::Crc32c, ..ScanConfig::default() });
        let f = &result.files[1];
        match &f.problem {
            Some(FileProblem::Truncated { expected_len_bytes, actual_len_bytes }) => {
                assert_eq!((*expected_len_bytes, *actual_len_bytes), (len, len - 100));
            }
            other => panic!("expected Truncated, got {other:?}"),
        }
        assert!(!result.is_clean());
        // Files 0 and 2 are untouched: all their tensors have digests.
        for (t, d) in ckpt.tensors().iter().zip(&result.digests) {
            if t.file() != FileId(1) {
                assert!(d.is_some(), "{}", t.name());
            }
        }
    }

    #[test]
    fn a_file_replaced_after_parsing_is_reported_as_changed() {
        let dir = tiny_copy();
        let ckpt = tensora_format::sllm::open_dir(dir.path()).unwrap();
        let victim = dir.path().join("tensor.data_2");
        let bytes = std::fs::read(&victim).unwrap();
        let tmp = dir.path().join("replacement");
        std::fs::write(&tmp, &bytes).unwrap();
        std::fs::rename(&tmp, &victim).unwrap(); // same size and content, new inode
        let result = scan(&ckpt, &ScanConfig::default());
        assert!(
            matches!(result.files[2].problem, Some(FileProblem::Changed { .. })),
            "{:?}",
            result.files[2]
        );
        let message = result.files[2].problem.as_ref().map(ToString::to_string).unwrap_or_default();
        assert!(message.starts_with("modified or replaced during the check: inode "), "{message}");
        for (t, d) in ckpt.tensors().iter().zip(&result.digests) {
            // Empty tensors need no bytes, so they keep their digest.
            assert_eq!(d.is_none(), t.file() == FileId(2) && t.nbytes() > 0, "{}", t.name());
        }
    }

    #[test]
    fn sparse_files_are_flagged() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("holes");
        let f = File::create(&p).unwrap();
        f.set_len(1 << 20).unwrap();
        let fs = FileScan {
            file: FileId(0),
            path: p.clone(),
            expected_len_bytes: 1 << 20,
            read_bytes: 0,
            allocated_bytes: ReadAt::allocated_bytes(&f).unwrap(),
            retries: 0,
            problem: None,
        };
        assert_eq!(fs.sparse_bytes(), Some(1 << 20));
        let dense = FileScan { allocated_bytes: Some(1 << 20), ..fs };
        assert_eq!(dense.sparse_bytes(), None);
    }

    /// A reader that fails the first `eintr` reads, returns at most `short_max` bytes, and flips a
    /// bit at `flip_at`.
    struct Flaky {
        inner: File,
        eintr: std::sync::atomic::AtomicU32,
        short_max: usize,
        flip_at: Option<u64>,
        eio_at: Option<u64>,
    }

    impl ReadAt for Flaky {
        fn read_at(&self, buf: &mut [u8], offset_bytes: u64) -> io::Result<usize> {
            use std::sync::atomic::Ordering;
            if self.eintr.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1)).is_ok() {
                return Err(io::Error::from(io::ErrorKind::Interrupted));
            }
            let end = offset_bytes + buf.len() as u64;
            if let Some(at) = self.eio_at
                && (offset_bytes..end).contains(&at)
            {
                return Err(io::Error::other("injected EIO"));
            }
            let want = buf.len().min(self.short_max);
            let n = ReadAt::read_at(&self.inner, &mut buf[..want], offset_bytes)?;
            if let Some(at) = self.flip_at
                && (offset_bytes..offset_bytes + n as u64).contains(&at)
            {
                buf[(at - offset_bytes) as usize] ^= 0x10;
            }
            Ok(n)
        }
        fn stamp(&self) -> io::Result<FileStamp> {
            self.inner.stamp()
        }
        fn allocated_bytes(&self) -> io::Result<Option<u64>> {
            self.inner.allocated_bytes()
        }
    }

    #[test]
    fn transient_errors_and_short_reads_are_retried_and_flips_change_one_digest() {
        let ckpt = tensora_format::sllm::open_dir(Path::new(TINY)).unwrap();
        let clean = scan(&ckpt, &ScanConfig { algo: Algo::Xxh3, ..ScanConfig::default() });
        let target = ckpt.tensor("layers.0.norm.weight").unwrap().clone();
        let flaky_open = |id: FileId, p: &Path| -> io::Result<Box<dyn ReadAt>> {
            Ok(Box::new(Flaky {
                inner: File::open(p)?,
                eintr: std::sync::atomic::AtomicU32::new(3),
                short_max: 333,
                flip_at: (id == target.file()).then(|| target.offset_bytes() + 5),
                eio_at: None,
            }))
        };
        let config = ScanConfig {
            algo: Algo::Xxh3,
            chunk_bytes: 4096,
            threads: 2,
            retries_max: 3,
            ..ScanConfig::default()
        };
        let result = scan_with(&ckpt, &config, &flaky_open, None);
        assert!(result.is_clean(), "{:?}", result.files);
        assert!(result.files.iter().all(|f| f.retries == 3));
        for (t, (a, b)) in ckpt.tensors().iter().zip(clean.digests.iter().zip(&result.digests)) {
            assert_eq!(a == b, t.name() != target.name(), "{}", t.name());
        }

        // More EINTRs than retries: the read fails and says where.
        let config = ScanConfig { retries_max: 2, ..config };
        let result = scan_with(&ckpt, &config, &flaky_open, None);
        assert!(
            result.files.iter().all(|f| matches!(f.problem, Some(FileProblem::Read { offset_bytes: 0, .. })))
        );
        assert!(result.digests.iter().zip(ckpt.tensors()).all(|(d, t)| d.is_some() == (t.nbytes() == 0)));
    }

    #[test]
    fn a_permanent_error_names_its_offset() {
        let ckpt = tensora_format::sllm::open_dir(Path::new(TINY)).unwrap();
        let open = |_: FileId, p: &Path| -> io::Result<Box<dyn ReadAt>> {
            Ok(Box::new(Flaky {
                inner: File::open(p)?,
                eintr: std::sync::atomic::AtomicU32::new(0),
                short_max: usize::MAX,
                flip_at: None,
                eio_at: Some(5000),
            }))
        };
        let config = ScanConfig {
            algo: Algo::Crc32c,
            chunk_bytes: 4096,
            threads: 1,
            retries_max: 3,
            ..ScanConfig::default()
        };
        let result = scan_with(&ckpt, &config, &open, None);
        for f in &result.files {
            match &f.problem {
                Some(FileProblem::Read { offset_bytes, .. }) => assert_eq!(*offset_bytes, 4096),
                other => panic!("{other:?}"),
            }
            assert_eq!(f.read_bytes, 4096);
        }
    }
}
