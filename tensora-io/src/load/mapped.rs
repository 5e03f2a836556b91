//! The mapped load: zero-copy views into private copy-on-write mappings of the files.

use std::time::Instant;

use tensora_format::{Checkpoint, FileId};

use super::files::{Descriptors, FileSet};
use super::loaded::{Entry, Storage};
use super::session::{Session, touched_files};
use super::{ArenaReuse, Loaded, PieceRef};
use crate::error::LoadError;
use crate::report::{Faults, LoadReport, Phases};

/// Zero-copy load: map every touched file privately and hand out views.
pub(super) fn load_mapped(
    session: Session<'_>,
    selected: Vec<usize>,
    mut phases: Phases,
    faults_before: Faults,
) -> Result<Loaded, LoadError> {
    let ckpt = session.ckpt;
    let t = Instant::now();
    let ids = touched_files(ckpt, &selected);
    let mut files = FileSet::new(ids.len().max(1));
    let sources = files.take(ckpt, &ids, Descriptors::Buffered, session.sparse())?;
    // Copy-on-write, so `Loaded::tensor_mut_ptr` can hand out writable views that never reach
    // the files.
    let mapped =
        crate::map::MappedFiles::map_with(&sources, crate::map::MapMode::CopyOnWrite).map_err(LoadError::Map);
    files.give_back(&ids, sources);
    let mapped = mapped?;
    // Mapped index of each checkpoint file, by checkpoint file id.
    let mut local: Vec<u32> = vec![0; ckpt.files().len()];
    for (i, &f) in ids.iter().enumerate() {
        local[f as usize] = i as u32;
    }
    let mut entries = Vec::with_capacity(selected.len());
    for &ti in &selected {
        let info = ckpt.tensors()[ti].clone();
        let file = local[info.file().index()];
        entries.push(Entry { offset_bytes: info.offset_bytes(), file, info });
    }
    prewarm_remote(ckpt, &ids, &entries, &mapped, session.opts.threads)?;
    let by_name = entries.iter().enumerate().map(|(i, e)| (e.info.name().to_owned(), i)).collect();
    let storage = Storage::Mapped(mapped);
    let mut loaded =
        Loaded { storage, arena_reuse: ArenaReuse::Fresh, entries, by_name, report: LoadReport::default() };
    if let Some(hook) = &session.opts.on_read {
        for (t, &ti) in loaded.tensors().zip(&selected) {
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
    phases.io += t.elapsed().as_secs_f64();
    files.bill_open(&mut phases);
    let t = Instant::now();
    files.close_and_check(ckpt)?;
    phases.finish += t.elapsed().as_secs_f64();
    loaded.report = session.report(phases, &[], loaded.entries.len(), 1, faults_before);
    loaded.report.io_mode = "mapped".to_owned();
    Ok(loaded)
}

/// On a network or FUSE filesystem, mapped views are never faulted in lazily: every selected
/// range is read in (`MADV_POPULATE_READ`) before the views are handed out, so a slow or failing
/// remote read is a typed error now rather than a stall or a `SIGBUS` on first touch.
pub(super) fn prewarm_remote(
    ckpt: &Checkpoint,
    ids: &[u32],
    entries: &[Entry],
    mapped: &crate::map::MappedFiles,
    threads: usize,
) -> Result<(), LoadError> {
    let remote: Vec<bool> = ids
        .iter()
        .map(|&f| crate::auto::probe::filesystem(ckpt.file(FileId(f)).path()).is_ok_and(|fs| fs.remote))
        .collect();
    let ranges: Vec<crate::map::FileRange> = entries
        .iter()
        .filter(|e| remote[e.file as usize] && e.info.len_bytes() > 0)
        .map(|e| crate::map::FileRange {
            file: e.file,
            offset_bytes: e.offset_bytes,
            len_bytes: e.info.len_bytes(),
        })
        .collect();
    if ranges.is_empty() {
        return Ok(());
    }
    mapped.prewarm(&ranges, threads.max(1)).map(|_| ()).map_err(LoadError::Map)
}
