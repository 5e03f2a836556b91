//! The io_uring backend against random plans over random files, buffered and O_DIRECT, plus EOF,
//! cancellation, sink stops and panics (the drain guard).

use std::io::Write;
use std::panic::AssertUnwindSafe;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use proptest::prelude::*;
use tensora_io::arena::Arena;
use tensora_io::uring::{self, UringBackend, UringConfig};
use tensora_io::{
    CompletionSink, IoBackend, IoStats, Job, JobConfig, ReadError, ReadErrorKind, SourceFile, StopReason,
};
use tensora_plan::{Budget, Extent, Order, Plan, PlanConfig};

/// A completion sink made of a closure.
struct FnSink<F>(F);

impl<F: Fn(u32) -> Result<(), StopReason> + Sync> CompletionSink for FnSink<F> {
    fn read_done(&self, read: u32) -> Result<(), StopReason> {
        (self.0)(read)
    }
}

struct TestFile {
    _tmp: tempfile::NamedTempFile,
    data: Vec<u8>,
    source: SourceFile,
}

fn test_file(data: Vec<u8>, claimed_len_bytes: u64, direct: bool) -> TestFile {
    let mut tmp = tempfile::NamedTempFile::new().unwrap();
    tmp.write_all(&data).unwrap();
    tmp.as_file().sync_all().unwrap();
    let path = tmp.path().to_path_buf();
    let source = SourceFile {
        len_bytes: claimed_len_bytes,
        buffered: std::fs::File::open(&path).unwrap(),
        direct: if direct { Some(tensora_io::probe::open_direct(&path).unwrap()) } else { None },
        path,
    };
    TestFile { _tmp: tmp, data, source }
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
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

struct Run {
    result: Result<IoStats, ReadError>,
    arena: Arena,
    reported: Vec<u32>,
    budget: Budget,
}

#[derive(Clone, Copy)]
struct Knobs {
    threads: usize,
    queue_depth: u32,
    direct: bool,
    budget_bytes: u64,
}

fn run(backend: &dyn IoBackend, plan: &Plan, files: &[SourceFile], knobs: Knobs) -> Run {
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
                direct: knobs.direct,
                retries_max: 4,
            },
        )
    };
    let result = backend.execute(&job, &sink);
    Run { result, arena, reported: reported.into_inner().unwrap(), budget }
}

/// Every extent's bytes landed where the plan says, and every read was reported exactly once.
fn check_bytes(run: &mut Run, plan: &Plan, extents: &[Extent], files: &[TestFile]) {
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

fn extents_strategy() -> impl Strategy<Value = (Vec<usize>, Vec<(usize, u64, u64)>)> {
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

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn random_plans_land_the_right_bytes(
        (lens, picked) in extents_strategy(),
        direct in any::<bool>(),
        threads in 1usize..4,
        queue_depth in 1u32..9,
        chunk_kib in 4u64..64,
        register_files in any::<bool>(),
        register_buffers in any::<bool>(),
        seed in any::<u64>(),
        budget_kib in 4u64..256,
    ) {
        let files: Vec<TestFile> = lens
            .iter()
            .enumerate()
            .map(|(i, &len)| test_file(pattern(len, seed ^ i as u64), len as u64, direct))
            .collect();
        let extents: Vec<Extent> = picked
            .iter()
            .enumerate()
            .map(|(tag, &(file, offset_bytes, len_bytes))| Extent {
                file: file as u32,
                offset_bytes,
                len_bytes,
                tag: tag as u32,
            })
            .collect();
        let align_bytes = if direct { 4096 } else { 1 };
        let config = PlanConfig {
            align_bytes,
            chunk_bytes: chunk_kib * 4096,
            coalesce_gap_bytes: 8192,
            budget_bytes: 1 << 20,
        };
        let file_lens: Vec<u64> = lens.iter().map(|&l| l as u64).collect();
        let plan = Plan::build_with_file_lens(&extents, &config, &Order::File, &file_lens).unwrap();
        let sources: Vec<SourceFile> = files.iter().map(|f| clone_source(&f.source)).collect();
        let backend = UringBackend::new(UringConfig { register_files, register_buffers });
        let knobs = Knobs { threads, queue_depth, direct, budget_bytes: budget_kib << 10 };
        let mut run = run(&backend, &plan, &sources, knobs);
        check_bytes(&mut run, &plan, &extents, &files);
        prop_assert_eq!(run.result.unwrap().direct_fallbacks, 0);
    }
}

fn clone_source(s: &SourceFile) -> SourceFile {
    SourceFile {
        path: s.path.clone(),
        len_bytes: s.len_bytes,
        buffered: s.buffered.try_clone().unwrap(),
        direct: s.direct.as_ref().map(|d| d.try_clone().unwrap()),
    }
}

fn one_extent_plan(len_bytes: u64, align_bytes: u64) -> (Vec<Extent>, Plan) {
    let extents = vec![Extent { file: 0, offset_bytes: 0, len_bytes, tag: 0 }];
    let config =
        PlanConfig { align_bytes, chunk_bytes: 16 << 10, coalesce_gap_bytes: 0, budget_bytes: 64 << 10 };
    let plan = Plan::build(&extents, &config, &Order::File).unwrap();
    (extents, plan)
}

const KNOBS: Knobs = Knobs { threads: 2, queue_depth: 4, direct: false, budget_bytes: 64 << 10 };

#[test]
fn probe_works_here() {
    uring::probe().unwrap();
    UringBackend::default().available().unwrap();
}

#[test]
fn read_past_a_truncated_file_is_unexpected_eof() {
    for direct in [false, true] {
        // The file claims 100 KiB (what the header said) but only 10_000 bytes are left.
        let file = test_file(pattern(10_000, 1), 100 << 10, direct);
        let (_, plan) = one_extent_plan(100 << 10, if direct { 4096 } else { 1 });
        let knobs = Knobs { direct, ..KNOBS };
        let run = run(&UringBackend::default(), &plan, std::slice::from_ref(&file.source), knobs);
        let err = run.result.unwrap_err();
        assert!(matches!(err.kind, ReadErrorKind::UnexpectedEof { .. }), "{err}");
        assert_eq!(err.file, 0);
        assert_eq!(run.budget.in_use_bytes(), 0);
    }
}

#[test]
fn aligned_plan_without_file_lengths_accepts_padding_past_eof() {
    // Plan::build rounds the last read up to 8192 bytes; the file has 5000.
    let file = test_file(pattern(5000, 2), 5000, true);
    let (extents, plan) = one_extent_plan(5000, 4096);
    assert!(plan.reads()[0].len_bytes > 5000);
    for direct in [false, true] {
        let mut run = run(
            &UringBackend::default(),
            &plan,
            std::slice::from_ref(&file.source),
            Knobs { direct, ..KNOBS },
        );
        check_bytes(&mut run, &plan, &extents, std::slice::from_ref(&file));
    }
}

/// Runs a 1 MiB plan of 16 KiB reads with a custom sink.
fn run_with_sink(
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
            JobConfig { threads: 2, queue_depth: 4, direct: false, retries_max: 4 },
        )
    };
    UringBackend::default().execute(&job, sink)
}

#[test]
fn cancel_flag_stops_the_run_with_nothing_in_flight() {
    let file = test_file(pattern(1 << 20, 3), 1 << 20, false);
    let (_, plan) = one_extent_plan(1 << 20, 1);
    let cancel = AtomicBool::new(false);
    let done = AtomicUsize::new(0);
    let sink = FnSink(|_| {
        if done.fetch_add(1, Ordering::SeqCst) == 2 {
            cancel.store(true, Ordering::SeqCst);
        }
        Ok(())
    });
    let budget = Budget::new(64 << 10);
    let result = run_with_sink(&sink, &cancel, &plan, &file, &budget);
    assert!(matches!(result.unwrap_err().kind, ReadErrorKind::Cancelled));
    assert!(done.load(Ordering::SeqCst) < plan.reads().len());
    assert_eq!(budget.in_use_bytes(), 0);
}

#[test]
fn sink_stop_returns_stopped_with_nothing_in_flight() {
    let file = test_file(pattern(1 << 20, 4), 1 << 20, false);
    let (_, plan) = one_extent_plan(1 << 20, 1);
    let done = AtomicUsize::new(0);
    let sink = FnSink(|_| if done.fetch_add(1, Ordering::SeqCst) >= 3 { Err(StopReason) } else { Ok(()) });
    let budget = Budget::new(64 << 10);
    let result = run_with_sink(&sink, &AtomicBool::new(false), &plan, &file, &budget);
    assert!(matches!(result.unwrap_err().kind, ReadErrorKind::Stopped));
    // The 4th call stopped the run: no sink call after it from this worker, and the other worker
    // stops before its next one.
    assert!(done.load(Ordering::SeqCst) <= 5, "{}", done.load(Ordering::SeqCst));
    assert_eq!(budget.in_use_bytes(), 0);
}

#[test]
fn a_panicking_sink_drains_the_ring_before_unwinding() {
    let file = test_file(pattern(1 << 20, 5), 1 << 20, false);
    let (_, plan) = one_extent_plan(1 << 20, 1);
    let done = AtomicUsize::new(0);
    let sink = FnSink(|_| {
        if done.fetch_add(1, Ordering::SeqCst) == 1 {
            panic!("sink failure");
        }
        Ok(())
    });
    let budget = Budget::new(64 << 10);
    let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
        run_with_sink(&sink, &AtomicBool::new(false), &plan, &file, &budget)
    }));
    // The panic surfaced, and every permit was returned: the guard waited for the CQEs.
    let payload = outcome.expect_err("the sink's panic must propagate");
    assert_eq!(payload.downcast_ref::<&str>(), Some(&"sink failure"));
    assert_eq!(budget.in_use_bytes(), 0);
}

#[test]
fn a_plan_larger_than_the_destination_is_an_error_not_a_write() {
    let file = test_file(pattern(100_000, 6), 100_000, false);
    let (_, plan) = one_extent_plan(100_000, 1);
    let small = Arena::with_len(4096).unwrap();
    let budget = Budget::new(1 << 20);
    let cancel = AtomicBool::new(false);
    // SAFETY: nothing else reads or writes the destination while this job runs.
    let job = unsafe {
        Job::new(
            &plan,
            std::slice::from_ref(&file.source),
            &small,
            &budget,
            &cancel,
            JobConfig { threads: 1, queue_depth: 2, direct: false, retries_max: 1 },
        )
    };
    let err = UringBackend::default().execute(&job, &FnSink(|_| Ok(()))).unwrap_err();
    assert!(
        matches!(err.kind, ReadErrorKind::Io(ref e) if e.kind() == std::io::ErrorKind::InvalidInput),
        "{err}"
    );
}

#[test]
fn deep_queue_large_file_many_reads() {
    let file = test_file(pattern(3 << 20, 7), 3 << 20, true);
    let extents = vec![Extent { file: 0, offset_bytes: 0, len_bytes: 3 << 20, tag: 0 }];
    let config =
        PlanConfig { align_bytes: 4096, chunk_bytes: 64 << 10, coalesce_gap_bytes: 0, budget_bytes: 1 << 20 };
    let plan = Plan::build_with_file_lens(&extents, &config, &Order::File, &[3 << 20]).unwrap();
    for direct in [false, true] {
        let knobs = Knobs { threads: 2, queue_depth: 32, direct, budget_bytes: 1 << 20 };
        let mut run = run(&UringBackend::default(), &plan, std::slice::from_ref(&file.source), knobs);
        check_bytes(&mut run, &plan, &extents, std::slice::from_ref(&file));
        assert!(run.budget.peak_bytes() <= 1 << 20);
    }
}

/// An arena whose `on_landed` fails after a number of reads (a device sink whose copy failed).
struct FailingSink {
    arena: Arena,
    landed: AtomicUsize,
    fail_after: usize,
}

// SAFETY: every method delegates to the arena, which upholds the `Destination` contract.
unsafe impl tensora_io::Destination for FailingSink {
    fn len_bytes(&self) -> u64 {
        tensora_io::Destination::len_bytes(&self.arena)
    }
    fn host_ptr(&self) -> std::ptr::NonNull<u8> {
        self.arena.host_ptr()
    }
    fn align_bytes(&self) -> u64 {
        self.arena.align_bytes()
    }
    fn on_landed(&self, _offset_bytes: u64, _len_bytes: u64) -> std::io::Result<()> {
        if self.landed.fetch_add(1, Ordering::SeqCst) >= self.fail_after {
            return Err(std::io::Error::other("device copy failed"));
        }
        Ok(())
    }
}

#[test]
fn a_failing_destination_stops_the_run_before_the_sink_hears_of_the_read() {
    let file = test_file(pattern(1 << 20, 12), 1 << 20, false);
    let (_, plan) = one_extent_plan(1 << 20, 1);
    let dest = FailingSink {
        arena: Arena::with_len(plan.arena_len_bytes()).unwrap(),
        landed: AtomicUsize::new(0),
        fail_after: 2,
    };
    let budget = Budget::new(64 << 10);
    let cancel = AtomicBool::new(false);
    let reported = AtomicUsize::new(0);
    let sink = FnSink(|_| {
        reported.fetch_add(1, Ordering::SeqCst);
        Ok(())
    });
    // SAFETY: nothing else reads or writes the destination while this job runs.
    let job = unsafe {
        Job::new(
            &plan,
            std::slice::from_ref(&file.source),
            &dest,
            &budget,
            &cancel,
            JobConfig { threads: 2, queue_depth: 4, direct: false, retries_max: 4 },
        )
    };
    let err = UringBackend::default().execute(&job, &sink).unwrap_err();
    assert!(matches!(err.kind, ReadErrorKind::Io(ref e) if e.to_string() == "device copy failed"), "{err}");
    // Only reads whose landing succeeded were reported.
    assert!(reported.load(Ordering::SeqCst) <= 3, "{}", reported.load(Ordering::SeqCst));
    assert_eq!(budget.in_use_bytes(), 0);
}
