//! The two steps of a mapped load (`Session::load_mapped`: zero-copy views into private
//! copy-on-write mappings of the files) after the files are mapped: every selected page read in
//! before the load returns ([`read_in`]), then the hooks ([`run_hooks`]).

use std::sync::atomic::AtomicBool;

use super::loaded::Entry;
use super::session::Session;
use super::{Loaded, PieceRef};
use crate::error::LoadError;
use crate::map::FileRange;
use crate::map::MappedFiles;
use crate::map::populate::{PopulateConfig, PopulateError, ReadAhead, Span, populate};
use crate::seam::{ReadErrorKind, Reading};

/// Read in the pages of every tensor (`MADV_POPULATE_READ`, [`crate::map::populate`]) with
/// `threads` workers, reporting progress and honouring the cancel flag. A failure names the file,
/// the file offset of the failing piece and the tensor.
pub(super) fn read_in(
    session: &Session<'_>,
    entries: &[Entry],
    mapped: &MappedFiles,
) -> Result<(), LoadError> {
    let opts = session.opts;
    let spans = entries
        .iter()
        .map(|e| {
            let range =
                FileRange { file: e.file, offset_bytes: e.offset_bytes, len_bytes: e.info.len_bytes() };
            mapped.span_of(&range)
        })
        .collect::<std::io::Result<Vec<Span>>>()
        .map_err(LoadError::Map)?;
    let never = AtomicBool::new(false);
    let cfg = PopulateConfig {
        threads: opts.threads,
        cancel: opts.cancel.as_deref().unwrap_or(&never),
        progress: opts.progress.as_ref(),
        // Cold pages are read with a deep queue; warm ones need no advice.
        ahead: if session.reading == Reading::Cached { ReadAhead::Off } else { ReadAhead::Ahead },
    };
    // SAFETY: every span lies inside one of `mapped`'s live, page-aligned mappings (checked by
    // `span_of`), which stay mapped for the call (`mapped` is borrowed).
    match unsafe { populate(&spans, &cfg) } {
        Ok(_) => Ok(()),
        Err(PopulateError::Cancelled) => Err(LoadError::Cancelled),
        Err(PopulateError::Io { span, piece_addr, piece_len_bytes, source }) => {
            let e = &entries[span];
            let into_bytes = (piece_addr - spans[span].addr) as u64;
            Err(LoadError::Read {
                path: session.ckpt.file(e.info.file()).path().to_owned(),
                offset_bytes: e.info.offset_bytes() + into_bytes,
                len_bytes: piece_len_bytes as u64,
                tensor: e.info.name().to_owned(),
                kind: ReadErrorKind::Io(source),
            })
        }
    }
}

/// The `on_read` hook (once per tensor, the whole tensor as one piece), then `on_tensor`.
pub(super) fn run_hooks(session: &Session<'_>, loaded: &Loaded, part: &[usize]) -> Result<(), LoadError> {
    if let Some(hook) = &session.opts.on_read {
        for (t, &ti) in loaded.tensors().zip(part) {
            let piece =
                PieceRef { info: t.info(), tensor_index: ti, offset_in_tensor_bytes: 0, bytes: t.bytes() };
            hook(&piece).map_err(|source| LoadError::Callback { tensor: t.name().to_owned(), source })?;
        }
    }
    if let Some(hook) = &session.opts.on_tensor {
        for t in loaded.tensors() {
            hook(&t).map_err(|source| LoadError::Callback { tensor: t.name().to_owned(), source })?;
        }
    }
    Ok(())
}
