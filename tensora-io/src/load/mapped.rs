//! The mapped load: zero-copy views into private copy-on-write mappings of the files, every
//! selected page read in before the load returns.

use std::sync::atomic::AtomicBool;
use std::time::Instant;

use super::files::{Descriptors, FileSet};
use super::loaded::{Entry, Storage};
use super::session::{Session, Tally, touched_files};
use super::{ArenaReuse, Loaded, PieceRef, Residence};
use crate::error::LoadError;
use crate::map::populate::{PopulateConfig, PopulateError, ReadAhead, Span, populate};
use crate::map::{FileRange, MapMode, MappedFiles};
use crate::report::{Faults, LoadReport, Phases};
use crate::seam::{ReadErrorKind, Reading};

/// Zero-copy load of `part` (tensor indexes): map every touched file privately, read every
/// selected page in, and hand out views.
pub(super) fn load_mapped(
    session: &Session<'_>,
    part: &[usize],
    mut phases: Phases,
    faults_before: Faults,
) -> Result<Loaded, LoadError> {
    let ckpt = session.ckpt;
    let t = Instant::now();
    let ids = touched_files(ckpt, part);
    let mut files = FileSet::new(ids.len().max(1));
    let sources = files.take(ckpt, &ids, Descriptors::Buffered, session.sparse())?;
    // Copy-on-write, so `Loaded::tensor_mut_ptr` can hand out writable views that never reach
    // the files.
    // Only a mapped session comes here, and only the caller's promise makes one.
    let Residence::Mapped(_promise) = session.residence else {
        return Err(LoadError::Map(std::io::Error::other(
            "internal: a mapped load without the files-unchanged promise",
        )));
    };
    // SAFETY: the caller promised, with `FilesUnchanged::promise`, that the files stay unchanged
    // while the views live (the contract of `MappedFiles::map`).
    let mapped = unsafe { MappedFiles::map_with(&sources, MapMode::CopyOnWrite) }.map_err(LoadError::Map);
    files.give_back(&ids, sources);
    let mapped = mapped?;
    // Mapped index of each checkpoint file, by checkpoint file id.
    let mut local: Vec<u32> = vec![0; ckpt.files().len()];
    for (i, &f) in ids.iter().enumerate() {
        local[f as usize] = i as u32;
    }
    let entries: Vec<Entry> = part
        .iter()
        .map(|&ti| {
            let info = ckpt.tensors()[ti].clone();
            Entry { offset_bytes: info.offset_bytes(), file: local[info.file().index()], info }
        })
        .collect();
    read_in(session, &entries, &mapped)?;
    let storage = Storage::Mapped(mapped);
    let mut loaded = Loaded {
        storage,
        arena_reuse: ArenaReuse::Fresh,
        entries,
        by_name: Default::default(),
        report: LoadReport::default(),
    };
    run_hooks(session, &loaded, part)?;
    phases.io += t.elapsed().as_secs_f64();
    files.bill_open(&mut phases);
    let t = Instant::now();
    files.close_and_check(ckpt)?;
    phases.finish += t.elapsed().as_secs_f64();
    let tally =
        Tally { tensors: loaded.entries.len(), bytes_selected: ckpt.distinct_bytes(part), windows: 1 };
    loaded.report = session.report(phases, &[], tally, faults_before);
    Ok(loaded)
}

/// Read in the pages of every tensor (`MADV_POPULATE_READ`, [`crate::map::populate`]) with
/// `threads` workers, reporting progress and honouring the cancel flag. A failure names the file,
/// the file offset of the failing piece and the tensor.
fn read_in(session: &Session<'_>, entries: &[Entry], mapped: &MappedFiles) -> Result<(), LoadError> {
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
fn run_hooks(session: &Session<'_>, loaded: &Loaded, part: &[usize]) -> Result<(), LoadError> {
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
