//! Shared harness of the backend tests (`uring.rs`, `mmap.rs`, `async_load.rs`): temp files with
//! known contents, a closure sink, one backend run into an arena, the byte-exact check and the
//! random-extents strategy. Each test binary uses a different subset, hence `dead_code`.
#![allow(dead_code)]

use std::io::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use proptest::prelude::*;
use tensora_io::Arena;
use tensora_io::Budget;
use tensora_io::{
    CompletionSink, IoBackend, IoStats, Job, JobConfig, ReadError, ReadErrorKind, Reading, SourceFile,
    StopReason,
};
use tensora_plan::{Extent, Order, Plan, PlanConfig};

/// A completion sink made of a closure.
pub struct FnSink<F>(pub F);

impl<F: Fn(u32) -> Result<(), StopReason> + Sync> CompletionSink for FnSink<F> {
    fn read_done(&self, landed: tensora_io::Landed<'_>) -> Result<(), StopReason> {
        (self.0)(landed.read())
    }
}

pub struct TestFile {
    pub _tmp: tempfile::NamedTempFile,
    pub data: Vec<u8>,
    pub source: SourceFile,
}

pub fn test_file(data: Vec<u8>, claimed_len_bytes: u64, direct: bool) -> TestFile {
    let mut tmp = tempfile::NamedTempFile::new().unwrap();
    tmp.write_all(&data).unwrap();
    tmp.as_file().sync_all().unwrap();
    let path = tmp.path().to_path_buf();
    let source = SourceFile {
        len_bytes: claimed_len_bytes,
        buffered: std::fs::File::open(&path).unwrap(),
        direct: if direct { Some(tensora_sys::open_direct(&path).unwrap()) } else { None },
        path,
    };
    TestFile { _tmp: tmp, data, source }
}

pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

pub struct Run {
    pub result: Result<IoStats, ReadError>,
    pub arena: Arena,
    pub reported: Vec<u32>,
    pub budget: Budget,
}

#[derive(Clone, Copy)]
pub struct Knobs {
    pub threads: usize,
    pub queue_depth: u32,
    pub direct: bool,
    pub budget_bytes: u64,
}

pub fn run(backend: &dyn IoBackend, plan: &Plan, files: &[SourceFile], knobs: Knobs) -> Run {
    let arena = Arena::with_len(plan.arena_len_bytes()).unwrap();
    let budget = Budget::new(knobs.budget_bytes);
    let cancel = AtomicBool::new(false);
    let reported = Mutex::new(Vec::new());
    let sink = FnSink(|read| {
        reported.lock().unwrap().push(read);
        Ok(())
    });
    // SAFETY: nothing else reads or writes the destination while this job runs.
    let job = unsafe {
        Job::new(
            plan,
            files,
            &arena,
            &budget,
            &cancel,
            JobConfig {
                threads: knobs.threads,
                queue_depth: knobs.queue_depth,
                reading: Reading::direct_or_ahead(knobs.direct),
                retries_max: 4,
            },
        )
    };
    let result = backend.execute(&job, &sink);
    Run { result, arena, reported: reported.into_inner().unwrap(), budget }
}

/// Every extent's bytes landed where the plan says, and every read was reported exactly once.
pub fn check_bytes(run: &mut Run, plan: &Plan, extents: &[Extent], files: &[TestFile]) {
    let stats = run.result.as_ref().expect("run failed");
    assert_eq!(stats.reads, plan.reads().len() as u64);
    assert!(stats.peak_inflight_bytes <= run.budget.capacity_bytes());
    assert_eq!(run.budget.in_use_bytes(), 0);
    let mut reported = run.reported.clone();
    reported.sort_unstable();
    assert_eq!(reported, (0..plan.reads().len() as u32).collect::<Vec<_>>());
    let arena = run.arena.as_slice();
    for (extent, loc) in extents.iter().zip(plan.locations()) {
        let want = &files[extent.file as usize].data
            [extent.offset_bytes as usize..(extent.offset_bytes + extent.len_bytes) as usize];
        let at = loc.arena_offset_bytes as usize;
        assert_eq!(&arena[at..at + want.len()], want, "extent {extent:?}");
    }
}

pub fn extents_strategy() -> impl Strategy<Value = (Vec<usize>, Vec<(usize, u64, u64)>)> {
    prop::collection::vec(1usize..120_000, 1..3).prop_flat_map(|lens| {
        let n = lens.len();
        let raw = prop::collection::vec((0..n, 0.0f64..1.0, 0.0f64..1.0), 1..12);
        (Just(lens), raw).prop_map(|(lens, raw)| {
            let picked = raw
                .into_iter()
                .map(|(f, a, b)| {
                    let len = lens[f] as u64;
                    let off = ((len as f64) * a) as u64 % len;
                    let ext = (((len - off) as f64) * b) as u64;
                    (f, off, ext.max(1).min(len - off))
                })
                .collect();
            (lens, picked)
        })
    })
}

pub fn clone_source(s: &SourceFile) -> SourceFile {
    SourceFile {
        path: s.path.clone(),
        len_bytes: s.len_bytes,
        buffered: s.buffered.try_clone().unwrap(),
        direct: s.direct.as_ref().map(|d| d.try_clone().unwrap()),
    }
}

/// Temp files of `lens` bytes (contents from `seed`) and the extents `picked` over them, tagged in
/// order: the inputs of every backend's random-plan property.
pub fn random_files_and_extents(
    lens: &[usize],
    picked: &[(usize, u64, u64)],
    seed: u64,
    direct: bool,
) -> (Vec<TestFile>, Vec<Extent>) {
    let files = lens
        .iter()
        .enumerate()
        .map(|(i, &len)| test_file(pattern(len, seed ^ i as u64), len as u64, direct))
        .collect();
    let extents = picked
        .iter()
        .enumerate()
        .map(|(tag, &(file, offset_bytes, len_bytes))| Extent {
            file: file as u32,
            offset_bytes,
            len_bytes,
            tag: tag as u32,
        })
        .collect();
    (files, extents)
}

/// The plan configuration of the random-plan properties: 4 KiB-aligned when `direct`.
pub fn random_plan_config(direct: bool, chunk_kib: u64) -> PlanConfig {
    PlanConfig {
        align_bytes: if direct { 4096 } else { 1 },
        chunk_bytes: chunk_kib * 4096,
        coalesce_gap_bytes: 8192,
        budget_bytes: 1 << 20,
    }
}

/// A plan reading all `len_bytes` of file 0 as one extent, in reads of `chunk_bytes`.
pub fn whole_file_plan(len_bytes: u64, align_bytes: u64, chunk_bytes: u64) -> (Vec<Extent>, Plan) {
    let extents = vec![Extent { file: 0, offset_bytes: 0, len_bytes, tag: 0 }];
    let config = PlanConfig { align_bytes, chunk_bytes, coalesce_gap_bytes: 0, budget_bytes: 64 << 10 };
    let plan = Plan::build(&extents, &config, &Order::File).unwrap();
    (extents, plan)
}

/// Run `backend` over `plan` (2 workers, buffered) into a fresh arena, reporting to `sink`.
pub fn run_with_sink(
    backend: &dyn IoBackend,
    queue_depth: u32,
    sink: &dyn CompletionSink,
    cancel: &AtomicBool,
    plan: &Plan,
    file: &TestFile,
    budget: &Budget,
) -> Result<IoStats, ReadError> {
    let arena = Arena::with_len(plan.arena_len_bytes()).unwrap();
    // SAFETY: nothing else reads or writes the destination while this job runs.
    let job = unsafe {
        Job::new(
            plan,
            std::slice::from_ref(&file.source),
            &arena,
            budget,
            cancel,
            JobConfig {
                threads: 2,
                queue_depth,
                reading: Reading::ReadAhead { device_cost: None },
                retries_max: 4,
            },
        )
    };
    backend.execute(&job, sink)
}

/// Setting the cancel flag from the sink stops the run with `Cancelled`, before every read was
/// reported, with every budget permit returned (nothing left in flight).
pub fn check_cancel_flag_stops_the_run(backend: &dyn IoBackend, queue_depth: u32) {
    let file = test_file(pattern(1 << 20, 3), 1 << 20, false);
    let (_, plan) = whole_file_plan(1 << 20, 1, 16 << 10);
    let cancel = AtomicBool::new(false);
    let done = AtomicUsize::new(0);
    let sink = FnSink(|_| {
        if done.fetch_add(1, Ordering::SeqCst) == 2 {
            cancel.store(true, Ordering::SeqCst);
        }
        Ok(())
    });
    let budget = Budget::new(64 << 10);
    let result = run_with_sink(backend, queue_depth, &sink, &cancel, &plan, &file, &budget);
    assert!(matches!(result.unwrap_err().kind, ReadErrorKind::Cancelled));
    assert!(done.load(Ordering::SeqCst) < plan.reads().len());
    assert_eq!(budget.in_use_bytes(), 0);
}

/// A sink returning `StopReason` stops the run with `Stopped`: the 4th call stopped it, so no sink
/// call follows from that worker and the other worker stops before its next one.
pub fn check_sink_stop_returns_stopped(backend: &dyn IoBackend, queue_depth: u32) {
    let file = test_file(pattern(1 << 20, 4), 1 << 20, false);
    let (_, plan) = whole_file_plan(1 << 20, 1, 16 << 10);
    let done = AtomicUsize::new(0);
    let sink = FnSink(|_| if done.fetch_add(1, Ordering::SeqCst) >= 3 { Err(StopReason) } else { Ok(()) });
    let budget = Budget::new(64 << 10);
    let result = run_with_sink(backend, queue_depth, &sink, &AtomicBool::new(false), &plan, &file, &budget);
    assert!(matches!(result.unwrap_err().kind, ReadErrorKind::Stopped));
    assert!(done.load(Ordering::SeqCst) <= 5, "{}", done.load(Ordering::SeqCst));
    assert_eq!(budget.in_use_bytes(), 0);
}
