//! The bounded copy loop: tensor bytes from the sources through one buffer to a writer, gathered
//! into row-major order where the source is strided.

use std::fs::File;
use std::io::{self, Write};
use std::os::unix::fs::FileExt;

use tensora_format::sllm::write::contiguous_strides;
use tensora_format::{Checkpoint, TensorInfo};

use crate::sources::check_sources;
use crate::{ConvertConfig, ConvertError, ConvertProgress};

/// Output chunk used when gathering a non-contiguous tensor into row-major order.
const GATHER_OUT_BYTES: usize = 1 << 20;

/// Bytes one tensor needs in the copy buffer for safetensors output: its logical bytes when
/// contiguous, its whole storage when it must be gathered.
pub(crate) fn safetensors_copy_len_bytes(t: &TensorInfo) -> u64 {
    if is_contiguous(t) { t.nbytes() } else { t.len_bytes() }
}

/// Copies tensor bytes from the sources through one bounded buffer, reporting progress.
pub(crate) struct Copier<'a> {
    ckpt: &'a Checkpoint,
    sources: &'a [File],
    buffer_bytes_max: usize,
    pub(crate) buf: Vec<u8>,
    pub(crate) done_bytes: u64,
    total_bytes: u64,
    progress: Option<ConvertProgress>,
    /// The detailed error behind the last `io::Error` handed to a writer.
    failure: Option<ConvertError>,
    /// When non-zero: after this many [`Copier::dense`] calls, check the source stamps (the
    /// single-file writer commits right after its last tensor, so the check runs inside it).
    pub(crate) check_sources_after: usize,
    dense_done: usize,
}

impl<'a> Copier<'a> {
    pub(crate) fn new(ckpt: &'a Checkpoint, sources: &'a [File], cfg: &ConvertConfig) -> Copier<'a> {
        Copier {
            ckpt,
            sources,
            buffer_bytes_max: cfg.buffer_bytes,
            buf: Vec::new(),
            done_bytes: 0,
            total_bytes: 0,
            progress: cfg.progress.clone(),
            failure: None,
            check_sources_after: 0,
            dense_done: 0,
        }
    }

    pub(crate) fn set_total(&mut self, total_bytes: u64) {
        self.total_bytes = total_bytes;
        if let Some(p) = &self.progress {
            p(0, total_bytes);
        }
    }

    /// Allocate the buffer once: as big as the largest copy needs, never above the bound.
    pub(crate) fn prepare_buffer(&mut self, copy_lens_bytes: impl Iterator<Item = u64>) {
        let largest = copy_lens_bytes.max().unwrap_or(0);
        let len = usize::try_from(largest).unwrap_or(usize::MAX).clamp(1, self.buffer_bytes_max);
        self.buf = vec![0u8; len];
    }

    /// Turn a writer result into ours, preferring the detailed error stashed by a fill.
    pub(crate) fn finish(&mut self, result: tensora_format::Result<()>) -> Result<(), ConvertError> {
        match (result, self.failure.take()) {
            (Ok(()), _) => Ok(()),
            (Err(_), Some(detail)) => Err(detail),
            (Err(e), None) => Err(ConvertError::Format(e)),
        }
    }

    pub(crate) fn stash(&mut self, err: ConvertError) -> io::Error {
        let message = err.to_string();
        self.failure = Some(err);
        io::Error::other(message)
    }

    /// Copy `len_bytes` of tensor `t` starting at its offset.
    pub(crate) fn copy_raw(&mut self, t: &TensorInfo, len_bytes: u64, out: &mut dyn Write) -> io::Result<()> {
        let file = &self.sources[t.file().index()];
        let path = self.ckpt.file(t.file()).path();
        let mut offset = t.offset_bytes();
        let end = offset + len_bytes;
        while offset < end {
            let chunk = (end - offset).min(self.buf.len() as u64) as usize;
            if let Err(source) = file.read_exact_at(&mut self.buf[..chunk], offset) {
                let err = ConvertError::Read {
                    path: path.to_path_buf(),
                    offset_bytes: offset,
                    len_bytes: chunk as u64,
                    tensor: t.name().to_owned(),
                    source,
                };
                return Err(self.stash(err));
            }
            out.write_all(&self.buf[..chunk])?;
            offset += chunk as u64;
            self.advance(chunk as u64);
        }
        Ok(())
    }

    pub(crate) fn advance(&mut self, bytes: u64) {
        self.done_bytes += bytes;
        if let Some(p) = &self.progress {
            p(self.done_bytes, self.total_bytes);
        }
    }

    /// Write tensor `i`'s logical bytes in row-major order (`numel × itemsize` bytes).
    pub(crate) fn dense(&mut self, i: usize, out: &mut dyn Write) -> io::Result<()> {
        let t = &self.ckpt.tensors()[i];
        if is_contiguous(t) {
            self.copy_raw(t, t.nbytes(), out)?;
        } else {
            self.gather(t, out)?;
        }
        self.dense_done += 1;
        if self.check_sources_after > 0 && self.dense_done == self.check_sources_after {
            check_sources(self.ckpt.files(), self.sources).map_err(|e| self.stash(e))?;
        }
        Ok(())
    }

    /// Gather a strided tensor: read its storage (which must fit in the buffer), then emit the
    /// elements in row-major order.
    pub(crate) fn gather(&mut self, t: &TensorInfo, out: &mut dyn Write) -> io::Result<()> {
        let item = t.dtype().size_bytes().unwrap_or(1) as usize;
        let strides = t.strides().unwrap_or(&[]);
        let storage = t.len_bytes();
        if storage > self.buf.len() as u64 {
            let err = ConvertError::Unsupported {
                tensor: t.name().to_owned(),
                reason: format!(
                    "non-contiguous tensor with {storage} bytes of storage does not fit the {}-byte copy buffer",
                    self.buf.len()
                ),
            };
            return Err(self.stash(err));
        }
        let storage = storage as usize;
        let file = &self.sources[t.file().index()];
        if let Err(source) = file.read_exact_at(&mut self.buf[..storage], t.offset_bytes()) {
            let err = ConvertError::Read {
                path: self.ckpt.file(t.file()).path().to_path_buf(),
                offset_bytes: t.offset_bytes(),
                len_bytes: storage as u64,
                tensor: t.name().to_owned(),
                source,
            };
            return Err(self.stash(err));
        }
        let shape = t.shape();
        let numel = t.numel();
        let mut index = vec![0u64; shape.len()];
        let mut chunk = Vec::with_capacity(GATHER_OUT_BYTES.max(item));
        for _ in 0..numel {
            // In bounds: the parser checked the highest reachable element fits the storage.
            let elem = index.iter().zip(strides).map(|(&i, &s)| i * s).sum::<u64>() as usize;
            chunk.extend_from_slice(&self.buf[elem * item..(elem + 1) * item]);
            if chunk.len() + item > GATHER_OUT_BYTES {
                out.write_all(&chunk)?;
                chunk.clear();
            }
            for d in (0..shape.len()).rev() {
                index[d] += 1;
                if index[d] < shape[d] {
                    break;
                }
                index[d] = 0;
            }
        }
        out.write_all(&chunk)?;
        self.advance(t.nbytes());
        Ok(())
    }
}

/// Row-major contiguous (dimensions of size 1 may have any stride; empty tensors always are).
pub(crate) fn is_contiguous(t: &TensorInfo) -> bool {
    let Some(strides) = t.strides() else { return true };
    if t.numel() == 0 {
        return true;
    }
    let expected = contiguous_strides(t.shape());
    t.shape().iter().zip(strides.iter().zip(&expected)).all(|(&d, (&s, &e))| d == 1 || s == e)
}
