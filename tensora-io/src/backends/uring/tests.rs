//! Ring-level tests: a real ring driven CQE by CQE, with injected results.

use super::*;
use std::sync::atomic::AtomicBool;

use crate::seam::{JobConfig, Reading};

#[test]
fn the_cached_probe_says_what_a_fresh_probe_says_and_matches_available() {
    // The cached answer against one taken now (a new ring and opcode probe), not against itself.
    assert_eq!(probe(), probe_uncached());
    assert_eq!(UringBackend::default().available(), probe_uncached());
    // Where io_uring is required (CI), the fresh probe must find it.
    tensora_testkit::check(tensora_testkit::Capability::IoUring, probe_uncached(), "uring probe test");
}

#[test]
fn setup_errors_name_the_cause() {
    let eperm = describe_setup_error(&io::Error::from_raw_os_error(libc::EPERM));
    assert!(eperm.contains("container"), "{eperm}");
    let enosys = describe_setup_error(&io::Error::from_raw_os_error(libc::ENOSYS));
    assert!(enosys.contains("without io_uring"), "{enosys}");
}

#[test]
fn default_config_registers_files_only() {
    let config = UringBackend::default().config();
    assert!(config.register_files);
    assert!(!config.register_buffers);
}

/// A real ring, a 64 KiB file and a one-read plan, driven CQE by CQE so that tests can
/// replace a real completion's result with an injected one.
struct Harness {
    _tmp: tempfile::NamedTempFile,
    files: Vec<SourceFile>,
    plan: tensora_plan::Plan,
    arena: crate::arena::Arena,
    budget: crate::seam::Budget,
    cancel: AtomicBool,
    data: Vec<u8>,
}

const LEN: usize = 64 << 10;

fn harness(claimed_len_bytes: u64) -> Harness {
    use std::io::Write;
    let data: Vec<u8> = (0..LEN).map(|i| (i * 31 % 253) as u8).collect();
    let mut tmp = tempfile::NamedTempFile::new().unwrap();
    tmp.write_all(&data).unwrap();
    let files = vec![SourceFile {
        path: tmp.path().to_path_buf(),
        len_bytes: claimed_len_bytes,
        buffered: std::fs::File::open(tmp.path()).unwrap(),
        direct: None,
    }];
    let extents = [tensora_plan::Extent { file: 0, offset_bytes: 0, len_bytes: LEN as u64, tag: 0 }];
    let config = tensora_plan::PlanConfig { chunk_bytes: 1 << 20, ..tensora_plan::PlanConfig::default() };
    let plan = tensora_plan::Plan::build(&extents, &config, &tensora_plan::Order::File).unwrap();
    assert_eq!(plan.reads().len(), 1);
    let arena = crate::arena::Arena::with_len(plan.arena_len_bytes()).unwrap();
    let budget = crate::seam::Budget::new(1 << 20);
    Harness { _tmp: tmp, files, plan, arena, budget, cancel: AtomicBool::new(false), data }
}

impl Harness {
    fn job(&self, retries_max: u32) -> Job<'_> {
        // SAFETY: nothing else reads or writes the destination while this job runs.
        unsafe {
            Job::new(
                &self.plan,
                &self.files,
                &self.arena,
                &self.budget,
                &self.cancel,
                JobConfig {
                    threads: 1,
                    queue_depth: 4,
                    reading: Reading::ReadAhead { device_cost: None },
                    retries_max,
                },
            )
        }
    }
}

/// Starts read 0 in slot 0.
fn start(ring: &mut Ring, job: &Job<'_>, state: &RunState) {
    let slot_index = ring.free_slots.pop().unwrap();
    assert_eq!(slot_index, 0);
    let permit = job.budget.acquire(LEN as u64);
    state.begin_inflight(permit.bytes());
    let progress = ReadProgress::new(&job.plan.reads()[0], job.files[0].len_bytes, job.config.retries_max);
    ring.slots[0] = Some(Slot { read: 0, progress, submitted_bytes: 0, direct: false, permit });
    ring.push(job, state, DestPtr::new(job), 0).unwrap();
}

/// Waits for the real CQE of slot 0 and returns its result.
fn next_result(ring: &mut Ring) -> i32 {
    ring.wait(1).unwrap();
    assert_eq!(ring.reaped.len(), 1);
    assert_eq!(ring.reaped[0].0, 0);
    ring.reaped[0].1
}

fn slot(ring: &Ring) -> &Slot {
    ring.slots[0].as_ref().unwrap()
}

#[test]
fn eintr_and_eagain_resubmit_until_the_retry_bound() {
    let h = harness(LEN as u64);
    let job = h.job(2);
    let state = RunState::new(&job);
    let base = DestPtr::new(&job);
    let mut ring = Ring::new(4).unwrap();
    let mut stats = IoStats::default();
    start(&mut ring, &job, &state);
    for (injected, retries) in [(-libc::EINTR, 1), (-libc::EAGAIN, 2)] {
        next_result(&mut ring);
        let outcome = complete(&mut ring, &job, &state, base, 0, injected, &mut stats);
        assert!(matches!(outcome, Outcome::Pending));
        assert_eq!(ring.in_flight, 1, "the same read is in flight again");
        assert_eq!(slot(&ring).progress.stalls(), retries);
        assert_eq!(slot(&ring).progress.done_bytes(), 0);
    }
    next_result(&mut ring);
    let outcome = complete(&mut ring, &job, &state, base, 0, -libc::EINTR, &mut stats);
    assert!(matches!(outcome, Outcome::Pending));
    assert!(ring.slots[0].is_none(), "retries ran out: the slot is released");
    assert_eq!(job.budget.in_use_bytes(), 0);
    assert_eq!(stats.retries, 3);
    let err = state.finish(vec![stats]).unwrap_err();
    // The same kind and message as every backend (`read_progress`): the last errno's kind.
    assert!(matches!(err.kind, ReadErrorKind::Io(ref e) if e.kind() == io::ErrorKind::Interrupted
        && e.to_string().contains("gave up after 2 retries")));
}

#[test]
fn a_short_read_resubmits_only_its_remainder() {
    let mut h = harness(LEN as u64);
    {
        let job = h.job(4);
        let state = RunState::new(&job);
        let base = DestPtr::new(&job);
        let mut ring = Ring::new(4).unwrap();
        let mut stats = IoStats::default();
        start(&mut ring, &job, &state);
        assert_eq!(next_result(&mut ring), LEN as i32);
        // SAFETY: the read's CQE was reaped, so nothing writes the arena; the range lies inside
        // it. Zeroing shows below which bytes the resubmission wrote.
        unsafe { std::ptr::write_bytes(base.at(h.plan.reads()[0].arena_offset_bytes), 0, LEN) };
        // Pretend only 1000 bytes arrived.
        let outcome = complete(&mut ring, &job, &state, base, 0, 1000, &mut stats);
        assert!(matches!(outcome, Outcome::Pending));
        assert_eq!(slot(&ring).progress.done_bytes(), 1000);
        assert_eq!(slot(&ring).submitted_bytes, LEN as u64 - 1000);
        let result = next_result(&mut ring);
        assert_eq!(result, LEN as i32 - 1000);
        let outcome = complete(&mut ring, &job, &state, base, 0, result, &mut stats);
        assert!(matches!(outcome, Outcome::Landed));
        assert_eq!(stats.retries, 1);
        release(&mut ring, &state, 0);
    }
    let at = h.plan.reads()[0].arena_offset_bytes as usize;
    let data = h.data.clone();
    let arena = h.arena.as_slice();
    assert!(arena[at..at + 1000].iter().all(|&b| b == 0), "the landed head was not read again");
    assert_eq!(&arena[at + 1000..at + LEN], &data[1000..]);
}

#[test]
fn eof_before_the_planned_end_is_unexpected_eof() {
    // The file claims twice what it holds.
    let h = harness(2 * LEN as u64);
    let job = h.job(4);
    let state = RunState::new(&job);
    let base = DestPtr::new(&job);
    let mut ring = Ring::new(4).unwrap();
    let mut stats = IoStats::default();
    start(&mut ring, &job, &state);
    next_result(&mut ring);
    let outcome = complete(&mut ring, &job, &state, base, 0, 0, &mut stats);
    assert!(matches!(outcome, Outcome::Pending));
    assert!(ring.slots[0].is_none());
    let err = state.finish(vec![stats]).unwrap_err();
    assert!(matches!(err.kind, ReadErrorKind::UnexpectedEof { read_bytes: 0, expected_bytes }
            if expected_bytes == LEN as u64));
}

#[test]
fn einval_on_a_direct_read_falls_back_to_buffered() {
    let h = harness(LEN as u64);
    let job = h.job(0);
    let state = RunState::new(&job);
    let base = DestPtr::new(&job);
    let mut ring = Ring::new(4).unwrap();
    let mut stats = IoStats::default();
    start(&mut ring, &job, &state);
    next_result(&mut ring);
    ring.slots[0].as_mut().unwrap().direct = true;
    let outcome = complete(&mut ring, &job, &state, base, 0, -libc::EINVAL, &mut stats);
    assert!(matches!(outcome, Outcome::Pending));
    assert_eq!(stats.direct_fallbacks, 1);
    assert_eq!(stats.retries, 0);
    assert!(!state.direct_allowed(0));
    assert!(!slot(&ring).direct);
    let result = next_result(&mut ring);
    assert!(matches!(complete(&mut ring, &job, &state, base, 0, result, &mut stats), Outcome::Landed));
    release(&mut ring, &state, 0);
    assert!(state.finish(vec![stats]).is_ok());
}

#[test]
fn workers_claim_round_robin_across_file_queues() {
    let h = harness(LEN as u64);
    let files = [h.files[0].buffered.try_clone().unwrap(), h.files[0].buffered.try_clone().unwrap()].map(
        |buffered| SourceFile {
            path: h.files[0].path.clone(),
            len_bytes: LEN as u64,
            buffered,
            direct: None,
        },
    );
    // Two files, four 16 KiB reads each.
    let extents: Vec<tensora_plan::Extent> = (0..2)
        .map(|f| tensora_plan::Extent { file: f, offset_bytes: 0, len_bytes: LEN as u64, tag: f })
        .collect();
    let config = tensora_plan::PlanConfig { chunk_bytes: 16 << 10, ..tensora_plan::PlanConfig::default() };
    for (order, homes) in [
        (tensora_plan::Order::File, [0u32, 1, 0, 1]),
        (tensora_plan::Order::Priority(vec![1, 0]), [1, 1, 1, 1]),
    ] {
        let plan = tensora_plan::Plan::build(&extents, &config, &order).unwrap();
        assert_eq!(plan.reads().len(), 8);
        // SAFETY: the job only feeds `RunState`; nothing runs it.
        let job = unsafe {
            Job::new(
                &plan,
                &files,
                &h.arena,
                &h.budget,
                &h.cancel,
                JobConfig {
                    threads: 2,
                    queue_depth: 1,
                    reading: Reading::ReadAhead { device_cost: None },
                    retries_max: 0,
                },
            )
        };
        let state = RunState::new(&job);
        // Workers 0 and 1 claim in turn: under a file order both files are busy at once;
        // under a priority order both start on the most urgent queue (file 1's tensor).
        let claimed: Vec<u32> =
            (0..4).map(|i| plan.reads()[state.claim(state.home(i % 2)).unwrap() as usize].file).collect();
        assert_eq!(claimed, homes, "{order:?}");
        let mut rest = 0;
        while state.claim(0).is_some() {
            rest += 1;
        }
        assert_eq!(rest, 4);
        assert!(state.all_claimed());
    }
}

#[test]
fn dropping_a_ring_waits_for_reads_in_flight() {
    let h = harness(LEN as u64);
    let job = h.job(0);
    let state = RunState::new(&job);
    let mut ring = Ring::new(4).unwrap();
    start(&mut ring, &job, &state);
    assert_eq!(ring.in_flight, 1);
    assert_eq!(job.budget.in_use_bytes(), LEN as u64);
    drop(ring);
    // The guard reaped the CQE and released the slot (and its permit).
    assert_eq!(job.budget.in_use_bytes(), 0);
}
