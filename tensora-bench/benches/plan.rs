//! Plan building for 1,000, 100,000 and 1,000,000 extents (goal: linear, < 100 ms at 1,000,000).
//!
//! Inputs model real checkpoints: tensors packed back to back in 8 files, sizes from 64 bytes to
//! 1 MiB. Variants:
//! - `sorted/default`: every tensor in `(file, offset)` order — what `Checkpoint::tensors()` yields,
//!   so the common case — default config (buffered I/O);
//! - `shuffled/default`: the same extents in random order (worst case: a caller's own order);
//! - `two_runs/priority`: a tenth of the tensors first, then the rest, each part in file order,
//!   with those first tensors as the priority order (how a prioritised load hands them over);
//! - `sparse/direct_priority`: every third tensor (in file order), `align_bytes` 4096 with file
//!   lengths, and a priority order naming a tenth of them (the partial / streaming load).
//!
//! Each case is measured twice: `plan_build` in wall time (criterion's default) and
//! `plan_build_cpu` in the benchmark thread's CPU time (`/proc/thread-self/schedstat`), which
//! stays meaningful when other processes compete for the cores (`Plan::build` is single-threaded).
//!
//! Run: `cargo bench -p tensora-bench --bench plan`. Under `cargo test --all-targets` criterion
//! runs each case once, in a debug build where `Plan::build` also runs its full self-check; the
//! 1,000,000 case is then skipped to keep the test suite fast.

use std::hint::black_box;
use std::time::Duration;

use criterion::measurement::{Measurement, ValueFormatter, WallTime};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use tensora_plan::{Extent, Order, Plan, PlanConfig};

const FILES: u32 = 8;
const SIZES: [usize; 3] = [1_000, 100_000, 1_000_000];
/// Largest case run when not benchmarking (debug builds under `cargo test`).
const TEST_MODE_EXTENTS_MAX: usize = 100_000;
const SCHEDSTAT: &str = "/proc/thread-self/schedstat";

/// xorshift64*: deterministic inputs without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// `n` packed tensors over `FILES` files in file order, plus the file lengths.
fn packed(n: usize) -> (Vec<Extent>, Vec<u64>) {
    let mut rng = Rng(0x5EED_0000 + n as u64);
    let mut cursors = vec![4096u64; FILES as usize];
    let extents = (0..n)
        .map(|i| {
            let file = (i as u64 * u64::from(FILES) / n as u64) as u32;
            let len = 64u64 << (rng.next() % 15); // 64 B .. 1 MiB
            let e = Extent { file, offset_bytes: cursors[file as usize], len_bytes: len, tag: i as u32 };
            cursors[file as usize] += len;
            e
        })
        .collect();
    (extents, cursors)
}

fn shuffled(extents: &[Extent]) -> Vec<Extent> {
    let mut rng = Rng(0xD1CE);
    let mut out = extents.to_vec();
    for i in (1..out.len()).rev() {
        out.swap(i, (rng.next() % (i as u64 + 1)) as usize);
    }
    out
}

fn bench_plan<M: Measurement>(c: &mut Criterion<M>, group_name: &str) {
    let bench_mode = std::env::args().any(|a| a == "--bench");
    let mut group = c.benchmark_group(group_name);
    group.sample_size(10).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    for &n in SIZES.iter().filter(|&&n| bench_mode || n <= TEST_MODE_EXTENTS_MAX) {
        let (extents, file_lens) = packed(n);
        group.throughput(Throughput::Elements(n as u64));
        let config = PlanConfig::default();
        group.bench_with_input(BenchmarkId::new("sorted/default", n), &extents, |b, extents| {
            b.iter(|| Plan::build(black_box(extents), &config, &Order::File).unwrap())
        });
        let mixed = shuffled(&extents);
        group.bench_with_input(BenchmarkId::new("shuffled/default", n), &mixed, |b, mixed| {
            b.iter(|| Plan::build(black_box(mixed), &config, &Order::File).unwrap())
        });

        // Priority tensors first, then the rest: two sorted runs, as `tensora-io` builds them.
        let (urgent_first, rest): (Vec<Extent>, Vec<Extent>) = extents.iter().partition(|e| e.tag % 10 == 0);
        let urgent_order = Order::Priority(urgent_first.iter().map(|e| e.tag).collect());
        let two_runs: Vec<Extent> = urgent_first.into_iter().chain(rest).collect();
        group.bench_with_input(BenchmarkId::new("two_runs/priority", n), &two_runs, |b, two_runs| {
            b.iter(|| Plan::build(black_box(two_runs), &config, &urgent_order).unwrap())
        });

        let sparse: Vec<Extent> = extents.iter().filter(|e| e.tag % 3 == 0).copied().collect();
        let urgent = Order::Priority(sparse.iter().filter(|e| e.tag % 10 == 0).map(|e| e.tag).collect());
        let direct = PlanConfig { align_bytes: 4096, ..PlanConfig::default() };
        group.throughput(Throughput::Elements(sparse.len() as u64));
        group.bench_with_input(BenchmarkId::new("sparse/direct_priority", n), &sparse, |b, sparse| {
            b.iter(|| Plan::build_with_file_lens(black_box(sparse), &direct, &urgent, &file_lens).unwrap())
        });
    }
    group.finish();
}

fn wall(c: &mut Criterion) {
    bench_plan(c, "plan_build");
}

/// The calling thread's time on a CPU, in nanoseconds (first field of its schedstat).
fn thread_cpu_ns() -> Option<u64> {
    std::fs::read_to_string(SCHEDSTAT).ok()?.split_whitespace().next()?.parse().ok()
}

/// Thread CPU time as a criterion measurement (values in nanoseconds, formatted like wall time).
struct ThreadCpuTime;

impl Measurement for ThreadCpuTime {
    type Intermediate = u64;
    type Value = u64;

    fn start(&self) -> u64 {
        thread_cpu_ns().unwrap_or(0)
    }
    fn end(&self, start: u64) -> u64 {
        thread_cpu_ns().unwrap_or(start).saturating_sub(start)
    }
    fn add(&self, a: &u64, b: &u64) -> u64 {
        a + b
    }
    fn zero(&self) -> u64 {
        0
    }
    fn to_f64(&self, ns: &u64) -> f64 {
        *ns as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        static WALL: WallTime = WallTime;
        WALL.formatter()
    }
}

fn cpu(c: &mut Criterion<ThreadCpuTime>) {
    if thread_cpu_ns().is_some() {
        bench_plan(c, "plan_build_cpu");
    } else {
        eprintln!("{SCHEDSTAT} is unreadable here: skipping the CPU-time measurements");
    }
}

criterion_group!(wall_time, wall);
criterion_group! {
    name = cpu_time;
    config = Criterion::default().with_measurement(ThreadCpuTime);
    targets = cpu
}
criterion_main!(wall_time, cpu_time);
