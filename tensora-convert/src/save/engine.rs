//! The writer: worker threads take pieces of the output files in file order from one queue, fill
//! them from the source, digest their tensor bytes while they are hot in cache, and `pwrite` them
//! at their offsets. Direct writes go from an aligned staging buffer per worker; buffered writes
//! go straight from the tensors where they are in memory. The worker that writes a file's last
//! data piece writes its head (header first in the file, prepared before the workers start),
//! truncates a direct file's rounded-up tail and `fsync`s it. Nothing is renamed here: the caller
//! commits once every file is synced.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tensora_verify::PieceDigests;

use super::output::{Output, direct_refused, write_err};
use super::plan::{ALIGN_BYTES, Content, FilePlan, Piece, Region};
use super::source::{SaveSource, gather, slice};
use super::{Durability, SaveStage, StageHook};
use crate::{ConvertError, ConvertProgress};

/// Bytes copied (or written) and digested in one step, so the digest reads them from cache.
pub(crate) const FUSE_CHUNK_BYTES: usize = 1 << 20;

/// Zeros for padding written straight from memory.
static ZEROS: [u8; 64 << 10] = [0; 64 << 10];

/// Everything one run of the writer needs.
pub(crate) struct Job<'a> {
    pub(crate) source: &'a dyn SaveSource,
    pub(crate) plans: &'a [FilePlan],
    pub(crate) outputs: &'a [Output],
    pub(crate) digests: Option<&'a PieceDigests>,
    pub(crate) threads: usize,
    pub(crate) piece_bytes: u64,
    pub(crate) progress: Option<ConvertProgress>,
    pub(crate) stage: Option<StageHook>,
    pub(crate) cancel: Option<&'a AtomicBool>,
    /// Whether each file is `fsync`ed when written.
    pub(crate) durability: Durability,
    /// Largest storage of a non-contiguous tensor read whole to be gathered.
    pub(crate) gather_bytes_max: u64,
}

/// What the writer counted.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct WriteStats {
    /// Files whose direct writes were refused part-way (then written buffered).
    pub(crate) direct_fallbacks: usize,
    /// Staging memory the workers allocated.
    pub(crate) staging_bytes: u64,
}

/// A buffer aligned to [`ALIGN_BYTES`], allocated on first use.
struct Staging {
    raw: Vec<u8>,
    skip: usize,
    len: usize,
}

impl Staging {
    fn new(len: usize) -> Staging {
        let raw = vec![0u8; len + ALIGN_BYTES as usize];
        let skip = raw.as_ptr().align_offset(ALIGN_BYTES as usize);
        Staging { raw, skip, len }
    }

    fn buf(&mut self) -> &mut [u8] {
        &mut self.raw[self.skip..self.skip + self.len]
    }
}

/// The writer's shared state.
struct Shared<'a> {
    job: &'a Job<'a>,
    /// Index of each file's first data piece in the one queue of pieces (files in order), and
    /// the queue's length last: piece `k` is computed when taken, never stored.
    first_piece: Vec<u64>,
    next: AtomicU64,
    /// Data pieces not yet written, per file; the worker that takes it to zero finishes the file.
    remaining: Vec<AtomicU64>,
    /// Each file's head (header and the data up to the first aligned boundary) and its length.
    heads: Vec<Mutex<(Staging, usize)>>,
    failed: AtomicBool,
    error: Mutex<Option<ConvertError>>,
    done_bytes: AtomicU64,
    /// The most progress reported: calls are serialised and never go backwards.
    reported_bytes: Mutex<u64>,
    total_bytes: u64,
    fallbacks: AtomicUsize,
    staging_bytes: AtomicU64,
    /// The storage of the last strided tensor read from a source not in memory.
    strided: Mutex<Option<(usize, Arc<Vec<u8>>)>>,
}

/// Write every file of `job`, each synced; the caller commits them.
pub(crate) fn run(job: &Job<'_>) -> Result<WriteStats, ConvertError> {
    let mut first_piece = Vec::with_capacity(job.plans.len() + 1);
    let mut remaining = Vec::with_capacity(job.plans.len());
    let mut queued = 0u64;
    for plan in job.plans {
        let count = plan.data_piece_count(job.piece_bytes);
        first_piece.push(queued);
        queued += count;
        remaining.push(AtomicU64::new(count));
    }
    first_piece.push(queued);
    let total_bytes = job.plans.iter().map(FilePlan::tensor_bytes).sum();
    let mut shared = Shared {
        job,
        first_piece,
        next: AtomicU64::new(0),
        remaining,
        heads: Vec::new(),
        failed: AtomicBool::new(false),
        error: Mutex::new(None),
        done_bytes: AtomicU64::new(0),
        reported_bytes: Mutex::new(0),
        total_bytes,
        fallbacks: AtomicUsize::new(0),
        staging_bytes: AtomicU64::new(0),
        strided: Mutex::new(None),
    };
    if let Some(p) = &job.progress {
        p(0, total_bytes);
    }
    // Heads first: their tensor bytes are digested before any later byte of the same tensor.
    shared.heads =
        (0..job.plans.len()).map(|f| shared.prepare_head(f).map(Mutex::new)).collect::<Result<_, _>>()?;
    for (f, left) in shared.remaining.iter().enumerate() {
        if left.load(Ordering::Relaxed) == 0 {
            shared.finish_file(f)?;
        }
    }
    std::thread::scope(|s| {
        let helpers: Vec<_> = (1..job.threads.max(1)).map(|_| s.spawn(|| shared.worker())).collect();
        shared.worker();
        // Joined, not left to the scope, so no writer thread outlives the save.
        for h in helpers {
            if let Err(payload) = h.join() {
                std::panic::resume_unwind(payload);
            }
        }
    });
    if let Some(e) = shared.error.into_inner().unwrap_or_else(|p| p.into_inner()) {
        return Err(e);
    }
    Ok(WriteStats {
        direct_fallbacks: shared.fallbacks.into_inner(),
        staging_bytes: shared.staging_bytes.into_inner(),
    })
}

impl Shared<'_> {
    fn worker(&self) {
        let mut staging: Option<Staging> = None;
        while !self.failed.load(Ordering::Acquire) {
            let k = self.next.fetch_add(1, Ordering::Relaxed);
            let Some(piece) = self.piece_at(k) else { break };
            if let Err(e) = self.piece(piece, &mut staging) {
                self.fail(e);
                break;
            }
        }
    }

    /// Piece `k` of the queue: data piece `k - first_piece[f]` of the file `f` it falls in.
    fn piece_at(&self, k: u64) -> Option<Piece> {
        let queued = *self.first_piece.last()?;
        if k >= queued {
            return None;
        }
        // The last file whose first piece is at or before k (files without pieces share indices).
        let f = self.first_piece.partition_point(|&first| first <= k) - 1;
        Some(self.job.plans[f].data_piece(f, k - self.first_piece[f], self.job.piece_bytes))
    }

    fn fail(&self, e: ConvertError) {
        let mut slot = self.error.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            *slot = Some(e);
        }
        self.failed.store(true, Ordering::Release);
        if let Some(d) = self.job.digests {
            d.abort();
        }
    }

    fn piece(&self, piece: Piece, staging: &mut Option<Staging>) -> Result<(), ConvertError> {
        if self.job.cancel.is_some_and(|c| c.load(Ordering::Acquire)) {
            return Err(ConvertError::Cancelled);
        }
        let out = &self.job.outputs[piece.file];
        if out.direct_file().is_some() {
            let buf = self.staging(staging);
            let len = piece.len_bytes() as usize;
            self.fill(piece.file, piece.start_bytes, &mut buf[..len])?;
            self.write_direct(piece.file, piece.start_bytes, buf, len)?;
        } else {
            self.write_buffered(piece, staging)?;
        }
        self.advance(self.job.plans[piece.file].tensor_bytes_in(piece.start_bytes, piece.end_bytes));
        self.stage(SaveStage::PieceWritten, piece.file);
        if self.remaining[piece.file].fetch_sub(1, Ordering::AcqRel) == 1 {
            self.finish_file(piece.file)?;
        }
        Ok(())
    }

    fn advance(&self, bytes: u64) {
        let done = self.done_bytes.fetch_add(bytes, Ordering::Relaxed) + bytes;
        if let Some(p) = &self.job.progress {
            let mut reported = self.reported_bytes.lock().unwrap_or_else(|e| e.into_inner());
            if done > *reported {
                *reported = done;
                p(done, self.total_bytes);
            }
        }
    }

    fn stage(&self, stage: SaveStage, file: usize) {
        if let Some(hook) = &self.job.stage {
            hook(stage, &self.job.plans[file].path);
        }
    }

    fn staging<'s>(&self, staging: &'s mut Option<Staging>) -> &'s mut [u8] {
        staging
            .get_or_insert_with(|| {
                let len = self.job.piece_bytes as usize;
                self.staging_bytes.fetch_add((len as u64) + ALIGN_BYTES, Ordering::Relaxed);
                Staging::new(len)
            })
            .buf()
    }

    /// `len` bytes of `buf` (aligned) at `offset` through `O_DIRECT`, the tail rounded up to the
    /// alignment with zeros (the file is cut to its length when finished). A refused direct write
    /// (`EINVAL`) is written buffered, and the rest of the file too.
    fn write_direct(&self, file: usize, offset: u64, buf: &mut [u8], len: usize) -> Result<(), ConvertError> {
        let out = &self.job.outputs[file];
        let Some(direct) = out.direct_file() else {
            return write_at(out, &buf[..len], offset);
        };
        let padded = (len as u64).next_multiple_of(ALIGN_BYTES) as usize;
        buf[len..padded].fill(0);
        match std::os::unix::fs::FileExt::write_all_at(direct, &buf[..padded], offset) {
            Ok(()) => Ok(()),
            Err(e) if direct_refused(&e) => {
                if out.refuse_direct() {
                    self.fallbacks.fetch_add(1, Ordering::Relaxed);
                }
                write_at(out, &buf[..len], offset)
            }
            Err(e) => Err(write_err(out.path_now(), "writing (O_DIRECT)", e)),
        }
    }

    /// A piece through the page cache: regions in memory straight from their bytes, the others
    /// (strided, streamed) through the staging buffer.
    fn write_buffered(&self, piece: Piece, staging: &mut Option<Staging>) -> Result<(), ConvertError> {
        let plan = &self.job.plans[piece.file];
        let out = &self.job.outputs[piece.file];
        for r in plan.regions_in(piece.start_bytes, piece.end_bytes) {
            let start = r.offset_bytes.max(piece.start_bytes);
            let end = (r.offset_bytes + r.len_bytes).min(piece.end_bytes);
            if let Some(bytes) = self.in_memory(r, start, end) {
                for (k, chunk) in bytes.chunks(FUSE_CHUNK_BYTES).enumerate() {
                    let at = start + (k * FUSE_CHUNK_BYTES) as u64;
                    self.digest(r, at, chunk)?;
                    write_at(out, chunk, at)?;
                }
            } else if r.content == Content::Zeros {
                let mut at = start;
                while at < end {
                    let n = (end - at).min(ZEROS.len() as u64) as usize;
                    write_at(out, &ZEROS[..n], at)?;
                    at += n as u64;
                }
            } else {
                let buf = &mut self.staging(staging)[..(end - start) as usize];
                self.copy_region(r, start, buf)?;
                write_at(out, buf, start)?;
            }
        }
        Ok(())
    }

    /// The bytes of region `r` between file offsets `start .. end` when they lie in memory as
    /// they are written (contiguous tensors, storage).
    fn in_memory(&self, r: &Region, start: u64, end: u64) -> Option<&[u8]> {
        let len = usize::try_from(end - start).ok()?;
        let (tensor, from) = match r.content_at(start) {
            Content::Dense { tensor, from_bytes } if self.job.source.tensors()[tensor].is_contiguous() => {
                (tensor, from_bytes)
            }
            Content::Storage { tensor, from_bytes } => (tensor, from_bytes),
            Content::Dense { .. } | Content::Zeros => return None,
        };
        slice(self.job.source.storage(tensor)?, from, len)
    }

    /// Fill `dst` with file `file`'s bytes from `start` (data regions only).
    fn fill(&self, file: usize, start: u64, dst: &mut [u8]) -> Result<(), ConvertError> {
        let end = start + dst.len() as u64;
        for r in self.job.plans[file].regions_in(start, end) {
            let s = r.offset_bytes.max(start);
            let e = (r.offset_bytes + r.len_bytes).min(end);
            self.copy_region(r, s, &mut dst[(s - start) as usize..(e - start) as usize])?;
        }
        Ok(())
    }

    /// Copy region `r`'s bytes from file offset `at` into `dst`, digesting them chunk by chunk.
    fn copy_region(&self, r: &Region, at: u64, dst: &mut [u8]) -> Result<(), ConvertError> {
        for (k, chunk) in dst.chunks_mut(FUSE_CHUNK_BYTES).enumerate() {
            let at = at + (k * FUSE_CHUNK_BYTES) as u64;
            match r.content_at(at) {
                Content::Zeros => chunk.fill(0),
                Content::Storage { tensor, from_bytes } => self.storage_bytes(tensor, from_bytes, chunk)?,
                Content::Dense { tensor, from_bytes } => {
                    let t = &self.job.source.tensors()[tensor];
                    if t.is_contiguous() {
                        self.storage_bytes(tensor, from_bytes, chunk)?;
                    } else {
                        let storage = self.strided_storage(tensor)?;
                        gather(t, &storage, from_bytes, chunk)?;
                    }
                }
            }
            self.digest(r, at, chunk)?;
        }
        Ok(())
    }

    fn storage_bytes(&self, tensor: usize, from: u64, dst: &mut [u8]) -> Result<(), ConvertError> {
        match self.job.source.storage(tensor) {
            Some(mem) => {
                let src = slice(mem, from, dst.len()).ok_or_else(|| {
                    super::source::out_of_range(self.job.source.tensors(), tensor, from, dst.len())
                })?;
                dst.copy_from_slice(src);
                Ok(())
            }
            None => self.job.source.read_storage(tensor, from, dst),
        }
    }

    /// A strided tensor's whole storage: borrowed when in memory, else read once (at most
    /// [`COPY_BUFFER_BYTES_MAX`]) and kept for the pieces that follow.
    fn strided_storage(&self, tensor: usize) -> Result<StorageRef<'_>, ConvertError> {
        if let Some(mem) = self.job.source.storage(tensor) {
            return Ok(StorageRef::Borrowed(mem));
        }
        let mut slot = self.strided.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((i, bytes)) = &*slot
            && *i == tensor
        {
            return Ok(StorageRef::Shared(Arc::clone(bytes)));
        }
        let t = &self.job.source.tensors()[tensor];
        if t.storage_len_bytes > self.job.gather_bytes_max {
            return Err(ConvertError::Unsupported {
                tensor: t.name.clone(),
                reason: format!(
                    "non-contiguous tensor with {} bytes of storage does not fit the {}-byte gather bound",
                    t.storage_len_bytes, self.job.gather_bytes_max
                ),
            });
        }
        let mut bytes = vec![0u8; t.storage_len_bytes as usize];
        self.job.source.read_storage(tensor, 0, &mut bytes)?;
        let bytes = Arc::new(bytes);
        *slot = Some((tensor, Arc::clone(&bytes)));
        Ok(StorageRef::Shared(bytes))
    }

    fn digest(&self, r: &Region, at: u64, bytes: &[u8]) -> Result<(), ConvertError> {
        let Some(d) = self.job.digests else { return Ok(()) };
        let offset = match r.content_at(at) {
            Content::Dense { from_bytes, .. } | Content::Storage { from_bytes, .. } => from_bytes,
            Content::Zeros => return Ok(()),
        };
        for &t in &r.digest_as {
            d.add(t, offset, bytes).map_err(|e| ConvertError::Digest { reason: e.to_string() })?;
        }
        Ok(())
    }

    /// File `f`'s head: the header then the data bytes up to the first aligned boundary,
    /// digested; the buffer is rounded up to the alignment for a direct write.
    fn prepare_head(&self, f: usize) -> Result<(Staging, usize), ConvertError> {
        let plan = &self.job.plans[f];
        let head_end = plan.head_end_bytes() as usize;
        let header_len = plan.header.len();
        let mut head = Staging::new(head_end.next_multiple_of(ALIGN_BYTES as usize));
        let buf = head.buf();
        buf[..header_len].copy_from_slice(&plan.header);
        self.fill(f, header_len as u64, &mut buf[header_len..head_end])?;
        Ok((head, head_end))
    }

    /// Write file `f`'s head last, cut a direct file to its length, `fsync` it (when
    /// [`Durability::Synced`]).
    fn finish_file(&self, f: usize) -> Result<(), ConvertError> {
        {
            let mut head = self.heads[f].lock().unwrap_or_else(|p| p.into_inner());
            let (buf, len) = &mut *head;
            if *len > 0 {
                self.write_direct(f, 0, buf.buf(), *len)?;
                self.advance(self.job.plans[f].tensor_bytes_in(0, *len as u64));
                self.stage(SaveStage::HeaderWritten, f);
            }
        }
        self.job.outputs[f].finish(self.job.durability)?;
        if self.job.durability == Durability::Synced {
            self.stage(SaveStage::Synced, f);
        }
        Ok(())
    }
}

/// A strided tensor's storage, borrowed or read.
enum StorageRef<'a> {
    Borrowed(&'a [u8]),
    Shared(Arc<Vec<u8>>),
}

impl std::ops::Deref for StorageRef<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            StorageRef::Borrowed(b) => b,
            StorageRef::Shared(v) => v,
        }
    }
}

fn write_at(out: &Output, bytes: &[u8], offset: u64) -> Result<(), ConvertError> {
    std::os::unix::fs::FileExt::write_all_at(&out.file, bytes, offset)
        .map_err(|e| write_err(out.path_now(), "writing", e))
}
