//! Plan building for 1,000, 100,000 and 1,000,000 extents (goal: linear, < 100 ms at 1,000,000).
//!
//! Inputs model real checkpoints: tensors packed back to back in 8 files, sizes from 64 bytes to
//! 1 MiB, handed to the planner in name order (so offsets arrive shuffled). Variants:
//! - `packed/default`: everything, default config (buffered I/O);
//! - `sparse/direct_priority`: every third tensor, `align_bytes` 4096 with file lengths, and a
//!   priority order naming a tenth of the tensors (the streaming / partial-load path).
//!
//! Run: `cargo bench -p tensora-bench --bench plan`. Under `cargo test --all-targets` criterion
//! runs each case once, in a debug build where `Plan::build` also runs its full self-check; the
//! 1,000,000 case is then skipped to keep the test suite fast.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use tensora_plan::{Extent, Order, Plan, PlanConfig};

const FILES: u32 = 8;
const SIZES: [usize; 3] = [1_000, 100_000, 1_000_000];
/// Largest case run when not benchmarking (debug builds under `cargo test`).
const TEST_MODE_EXTENTS_MAX: usize = 100_000;

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

/// `n` packed tensors over `FILES` files, returned in a shuffled ("name") order, plus file lengths.
fn packed(n: usize) -> (Vec<Extent>, Vec<u64>) {
    let mut rng = Rng(0x5EED_0000 + n as u64);
    let mut cursors = vec![4096u64; FILES as usize];
    let mut extents: Vec<Extent> = (0..n)
        .map(|i| {
            let file = (i as u64 * u64::from(FILES) / n as u64) as u32;
            let len = 64u64 << (rng.next() % 15); // 64 B .. 1 MiB
            let e = Extent { file, offset_bytes: cursors[file as usize], len_bytes: len, tag: i as u32 };
            cursors[file as usize] += len;
            e
        })
        .collect();
    for i in (1..extents.len()).rev() {
        let j = (rng.next() % (i as u64 + 1)) as usize;
        extents.swap(i, j);
    }
    (extents, cursors)
}

fn bench_plan(c: &mut Criterion) {
    let bench_mode = std::env::args().any(|a| a == "--bench");
    let mut group = c.benchmark_group("plan_build");
    group.sample_size(10);
    for &n in SIZES.iter().filter(|&&n| bench_mode || n <= TEST_MODE_EXTENTS_MAX) {
        let (extents, file_lens) = packed(n);
        group.throughput(Throughput::Elements(n as u64));
        let config = PlanConfig::default();
        group.bench_with_input(BenchmarkId::new("packed/default", n), &extents, |b, extents| {
            b.iter(|| Plan::build(black_box(extents), &config, &Order::File).unwrap())
        });

        let sparse: Vec<Extent> = extents.iter().filter(|e| e.tag % 3 == 0).copied().collect();
        let urgent = Order::Priority(sparse.iter().filter(|e| e.tag % 10 == 0).map(|e| e.tag).collect());
        let direct = PlanConfig { align_bytes: 4096, ..PlanConfig::default() };
        group.bench_with_input(BenchmarkId::new("sparse/direct_priority", n), &sparse, |b, sparse| {
            b.iter(|| Plan::build_with_file_lens(black_box(sparse), &direct, &urgent, &file_lens).unwrap())
        });
    }
    group.finish();
}

criterion_group!(benches, bench_plan);
criterion_main!(benches);
