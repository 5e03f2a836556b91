//! The io_uring backend against random plans over random files, buffered and O_DIRECT, plus EOF,
//! cancellation, sink stops and panics (the drain guard).

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use proptest::prelude::*;
use tensora_io::Arena;
use tensora_io::Budget;
use tensora_io::{IoBackend, Job, JobConfig, ReadErrorKind, Reading, SourceFile};
use tensora_io::{UringBackend, UringConfig};
use tensora_plan::{Extent, Order, Plan, PlanConfig};

mod harness;

use harness::*;

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
        let (files, extents) = random_files_and_extents(&lens, &picked, seed, direct);
        let config = random_plan_config(direct, chunk_kib);
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

const KNOBS: Knobs = Knobs { threads: 2, queue_depth: 4, direct: false, budget_bytes: 64 << 10 };

#[test]
fn probe_works_here() {
    tensora_io::uring_probe().unwrap();
    UringBackend::default().available().unwrap();
}

#[test]
fn read_past_a_truncated_file_is_unexpected_eof() {
    for direct in [false, true] {
        // The file claims 100 KiB (what the header said) but only 10_000 bytes are left.
        let file = test_file(pattern(10_000, 1), 100 << 10, direct);
        let (_, plan) = whole_file_plan(100 << 10, if direct { 4096 } else { 1 }, 16 << 10);
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
    let (extents, plan) = whole_file_plan(5000, 4096, 16 << 10);
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
#[test]
fn cancel_flag_stops_the_run_with_nothing_in_flight() {
    check_cancel_flag_stops_the_run(&UringBackend::default(), 4);
}

#[test]
fn sink_stop_returns_stopped_with_nothing_in_flight() {
    check_sink_stop_returns_stopped(&UringBackend::default(), 4);
}

#[test]
fn a_panicking_sink_drains_the_ring_before_unwinding() {
    let file = test_file(pattern(1 << 20, 5), 1 << 20, false);
    let (_, plan) = whole_file_plan(1 << 20, 1, 16 << 10);
    let done = AtomicUsize::new(0);
    let sink = FnSink(|_| {
        if done.fetch_add(1, Ordering::SeqCst) == 1 {
            panic!("sink failure");
        }
        Ok(())
    });
    let budget = Budget::new(64 << 10);
    let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
        run_with_sink(&UringBackend::default(), 4, &sink, &AtomicBool::new(false), &plan, &file, &budget)
    }));
    // The panic surfaced, and every permit was returned: the guard waited for the CQEs.
    let payload = outcome.expect_err("the sink's panic must propagate");
    assert_eq!(payload.downcast_ref::<&str>(), Some(&"sink failure"));
    assert_eq!(budget.in_use_bytes(), 0);
}

#[test]
fn a_plan_larger_than_the_destination_is_an_error_not_a_write() {
    let file = test_file(pattern(100_000, 6), 100_000, false);
    let (_, plan) = whole_file_plan(100_000, 1, 16 << 10);
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
            JobConfig {
                threads: 1,
                queue_depth: 2,
                reading: Reading::ReadAhead { device_cost: None },
                retries_max: 1,
            },
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
    let (_, plan) = whole_file_plan(1 << 20, 1, 16 << 10);
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
            JobConfig {
                threads: 2,
                queue_depth: 4,
                reading: Reading::ReadAhead { device_cost: None },
                retries_max: 4,
            },
        )
    };
    let err = UringBackend::default().execute(&job, &sink).unwrap_err();
    assert!(matches!(err.kind, ReadErrorKind::Io(ref e) if e.to_string() == "device copy failed"), "{err}");
    // Only reads whose landing succeeded were reported.
    assert!(reported.load(Ordering::SeqCst) <= 3, "{}", reported.load(Ordering::SeqCst));
    assert_eq!(budget.in_use_bytes(), 0);
}
