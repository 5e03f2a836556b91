//! Digest throughput per algorithm (`tensora_verify::Algo`): one-shot over a whole buffer, and
//! streaming through `Hasher::update` in the 8 MiB pieces a load delivers. Random data, so
//! nothing is special-cased.
//!
//! Run: `cargo bench -p tensora-bench --bench digest`. Under `cargo test --all-targets` (a debug
//! build) the buffer is 1 MiB so the run stays short.

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use tensora_bench::SplitMix64;
use tensora_verify::Algo;

/// Buffer digested per iteration in release builds: larger than the last-level cache.
const BUFFER_BYTES_BENCH: usize = 64 << 20;
/// Buffer size in debug (test) builds.
const BUFFER_BYTES_TEST: usize = 1 << 20;
/// Piece size for the streaming variant (the load's default read size).
const PIECE_BYTES: usize = 8 << 20;

fn buffer() -> Vec<u8> {
    let len = if cfg!(debug_assertions) { BUFFER_BYTES_TEST } else { BUFFER_BYTES_BENCH };
    let mut buf = vec![0u8; len];
    SplitMix64::new(0xD16E57).fill(&mut buf);
    buf
}

fn digests(c: &mut Criterion) {
    let buf = buffer();
    let mut group = c.benchmark_group("digest");
    group.throughput(Throughput::Bytes(buf.len() as u64));
    group.sample_size(10);
    for algo in Algo::ALL {
        group.bench_function(format!("{}/one-shot", algo.as_str()), |b| {
            b.iter(|| black_box(algo.digest(black_box(&buf))))
        });
        group.bench_function(format!("{}/streaming-8MiB", algo.as_str()), |b| {
            b.iter(|| {
                let mut h = algo.hasher();
                for piece in buf.chunks(PIECE_BYTES) {
                    h.update(black_box(piece));
                }
                black_box(h.finish())
            })
        });
    }
    group.finish();
    // The two ways must agree, or the numbers compare different work.
    for algo in Algo::ALL {
        let mut h = algo.hasher();
        for piece in buf.chunks(PIECE_BYTES) {
            h.update(piece);
        }
        assert_eq!(h.finish(), algo.digest(&buf), "{algo}: streaming and one-shot digests differ");
    }
}

criterion_group!(benches, digests);
criterion_main!(benches);
