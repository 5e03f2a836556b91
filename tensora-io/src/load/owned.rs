//! The owned load: every selected tensor in one hugepage arena.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use tensora_format::Checkpoint;

use super::files::FileSet;
use super::loaded::{Entry, Storage};
use super::mapped::load_mapped;
use super::run::SubDest;
use super::session::{WindowPlan, begin, touched_files};
use super::{ArenaReuse, LoadOptions, Loaded, Residence};
use crate::arena::Arena;
use crate::error::LoadError;

/// Load the selected tensors into one owned hugepage arena. See the module docs.
pub fn load(ckpt: &Checkpoint, opts: &LoadOptions) -> Result<Loaded, LoadError> {
    let (session, selected, mut phases, faults_before) = begin(ckpt, opts, false)?;

    if opts.residence == Residence::Mapped {
        return load_mapped(session, selected, phases, faults_before);
    }

    // Group files so that at most `files_open_max` are open at once; one plan per group, each in
    // its own part of the arena.
    let t = Instant::now();
    let groups = file_groups(ckpt, &selected, opts.files_open_max);
    let mut plans = Vec::with_capacity(groups.len());
    let mut arena_len_bytes: u64 = 0;
    for group in &groups {
        let wp = session.plan_window(group)?;
        let period = wp.plan.config().arena_period_bytes();
        let base = arena_len_bytes
            .checked_next_multiple_of(period)
            .ok_or(LoadError::Plan(tensora_plan::PlanError::ArenaOverflow))?;
        arena_len_bytes = base
            .checked_add(wp.plan.arena_len_bytes())
            .ok_or(LoadError::Plan(tensora_plan::PlanError::ArenaOverflow))?;
        plans.push((base, wp));
    }
    phases.plan += t.elapsed().as_secs_f64();

    let t = Instant::now();
    let arena = opts
        .arena_reuse
        .arena(arena_len_bytes)
        .map_err(|source| LoadError::Arena { len_bytes: arena_len_bytes, source })?;
    let mut files = FileSet::new(opts.files_open_max);
    let io_done = AtomicBool::new(false);
    let stats = std::thread::scope(|scope| {
        if session.direct && opts.arena_reuse == ArenaReuse::Fresh {
            // Direct reads are DMA into the arena: whoever submits them faults the fresh pages in
            // first, stalling the queue. Fault them in ahead of the queue on a helper thread while
            // the device works (I/O bound, so the CPU is idle anyway).
            scope.spawn(|| populate_ahead(&arena, &plans, &io_done));
        }
        let mut stats = Vec::with_capacity(plans.len());
        let mut run = || -> Result<(), LoadError> {
            for (base, wp) in &plans {
                let dest = SubDest::new(&arena, *base, wp.plan.arena_len_bytes());
                let no_stream = |_: u32| Ok(());
                stats.push(session.run_window(&mut files, wp, &dest, &no_stream)?);
            }
            Ok(())
        };
        let result = run();
        io_done.store(true, Ordering::Release);
        result.map(|()| stats)
    })?;
    phases.io += t.elapsed().as_secs_f64();
    files.bill_open(&mut phases);

    let t = Instant::now();
    files.close_and_check(ckpt)?;
    let mut entries = Vec::with_capacity(selected.len());
    for (base, wp) in &plans {
        for (tag, &ti) in wp.tensors.iter().enumerate() {
            let loc = wp.plan.location(tag as u32).copied();
            let info = ckpt.tensors()[ti].clone();
            let offset_bytes = match loc {
                Some(l) if info.len_bytes() > 0 => base + l.arena_offset_bytes,
                _ => 0,
            };
            entries.push(Entry { info, file: 0, offset_bytes });
        }
    }
    let by_name = entries.iter().enumerate().map(|(i, e)| (e.info.name().to_owned(), i)).collect();
    phases.finish += t.elapsed().as_secs_f64();
    let report = session.report(phases, &stats, entries.len(), plans.len(), faults_before);
    Ok(Loaded { storage: Storage::Arena(arena), arena_reuse: opts.arena_reuse, entries, by_name, report })
}

/// Faults in the arena's pages in the order the backends will fill them (the reads of every file
/// queue, round-robin across queues, plan after plan), until `done`. A hint: the first error
/// (e.g. no `MADV_POPULATE_WRITE` before Linux 5.14) ends it quietly. Bounded by one pass over the
/// reads.
pub(super) fn populate_ahead(arena: &Arena, plans: &[(u64, WindowPlan)], done: &AtomicBool) {
    for (base, wp) in plans {
        let plan = &wp.plan;
        let queues: Vec<&[tensora_plan::Read]> = plan.queues().iter().map(|q| plan.queue_reads(q)).collect();
        let longest = queues.iter().map(|q| q.len()).max().unwrap_or(0);
        for k in 0..longest {
            for q in &queues {
                let Some(read) = q.get(k) else { continue };
                if done.load(Ordering::Acquire) {
                    return;
                }
                if arena.populate_write(base + read.arena_offset_bytes, read.len_bytes).is_err() {
                    return;
                }
            }
        }
    }
}

/// Split the selection into groups touching at most `files_max` files each (order kept per group).
pub(super) fn file_groups(ckpt: &Checkpoint, selected: &[usize], files_max: usize) -> Vec<Vec<usize>> {
    let files_max = files_max.max(1);
    let order = touched_files(ckpt, selected);
    let mut group_of = vec![0usize; ckpt.files().len()];
    for (pos, &f) in order.iter().enumerate() {
        group_of[f as usize] = pos / files_max;
    }
    let mut groups = vec![Vec::new(); order.len().div_ceil(files_max).max(1)];
    for &i in selected {
        groups[group_of[ckpt.tensors()[i].file().index()]].push(i);
    }
    groups
}
