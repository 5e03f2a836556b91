//! Header parsing: a 100,000-tensor safetensors header (about 8 MB), tensora's strict parser
//! (`tensora_format::safetensors::parse_header`) against HF's `safetensors::SafeTensors::read_metadata`
//! on the same bytes. Goal: at least 3x faster, with peak heap at most 3x the header size.
//!
//! Peak heap is measured once per parser, before the timed runs, with a counting global allocator
//! in this bench binary, and printed to stderr. Both parsers get the same buffer (the header plus a
//! small data section, since HF's parser insists on the whole file); the buffer itself is not
//! counted.
//!
//! Run: `cargo bench -p tensora-bench --bench header`. Under `cargo test --all-targets` (a debug
//! build) the header has 10,000 tensors so the run stays short.
#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::Instant;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use tensora_format::Dtype;
use tensora_format::write::{SafetensorsLayout, TensorSpec};
use tensora_testkit::CountingAlloc;

/// Tensors in the benchmark header (release builds).
const TENSORS_BENCH: usize = 100_000;
/// Tensors when run as a test in a debug build.
const TENSORS_TEST: usize = 10_000;
/// Interleaved timing rounds (release builds).
const INTERLEAVED_ROUNDS: usize = 40;

/// Counts heap bytes while a parser runs (the `unsafe impl GlobalAlloc` lives in tensora-io).
#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc::new();

/// A whole file image (header plus data) with `count` tensors of assorted dtypes and small shapes,
/// named like a mixture-of-experts transformer. Returns (file bytes, header length n).
fn file_image(count: usize) -> (Vec<u8>, usize) {
    const DTYPES: [Dtype; 4] = [Dtype::BF16, Dtype::F32, Dtype::F16, Dtype::U8];
    const PARTS: [&str; 5] = ["down", "gate", "up", "q_proj", "norm"];
    let specs: Vec<TensorSpec> = (0..count)
        .map(|i| TensorSpec {
            name: format!("layers.{}.e{}.{}.weight", i / 320, (i / 5) % 64, PARTS[i % 5]),
            dtype: DTYPES[i % DTYPES.len()],
            shape: vec![1 + (i % 3) as u64, 2],
        })
        .collect();
    let layout = SafetensorsLayout::new(specs, BTreeMap::from([("format".into(), "pt".into())]))
        .expect("generated specs are valid");
    let mut file = layout.header_bytes().to_vec();
    file.resize(layout.file_len_bytes() as usize, 0);
    let n = layout.header_bytes().len() - 8;
    (file, n)
}

fn bench_header(c: &mut Criterion) {
    let count = if cfg!(debug_assertions) { TENSORS_TEST } else { TENSORS_BENCH };
    let (file, n) = file_image(count);
    let file_len = file.len() as u64;

    // Peak heap, measured once each, outside the timed loop.
    let (ours, ours_peak) = ALLOC.peak_during(|| tensora_format::safetensors::parse_header(&file, file_len));
    let ours = ours.expect("our parser accepts the generated header");
    assert_eq!(ours.tensors().len(), count);
    drop(ours);
    let (hf, hf_peak) = ALLOC.peak_during(|| safetensors::SafeTensors::read_metadata(&file));
    let (hf_n, hf_meta) = hf.expect("HF accepts the generated header");
    assert_eq!((hf_n, hf_meta.tensors().len()), (n, count));
    drop(hf_meta);
    eprintln!(
        "header: {count} tensors, {n} bytes; peak heap: tensora {ours_peak} bytes ({:.2}x header), \
         HF {hf_peak} bytes ({:.2}x header)",
        ours_peak as f64 / n as f64,
        hf_peak as f64 / n as f64
    );

    // On a shared machine the two criterion groups run minutes apart under different load, so
    // also time them interleaved, run by run, and compare the minimum and median of each.
    let rounds = if cfg!(debug_assertions) { 2 } else { INTERLEAVED_ROUNDS };
    let mut ours_s = Vec::with_capacity(rounds);
    let mut hf_s = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let t = Instant::now();
        black_box(tensora_format::safetensors::parse_header(black_box(&file), file_len).is_ok());
        ours_s.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        black_box(safetensors::SafeTensors::read_metadata(black_box(&file)).is_ok());
        hf_s.push(t.elapsed().as_secs_f64());
    }
    ours_s.sort_by(f64::total_cmp);
    hf_s.sort_by(f64::total_cmp);
    let (ours_min, hf_min) = (ours_s[0], hf_s[0]);
    let (ours_med, hf_med) = (ours_s[rounds / 2], hf_s[rounds / 2]);
    eprintln!(
        "header: interleaved x{rounds}: tensora min {:.1} ms, median {:.1} ms; HF min {:.1} ms, median \
         {:.1} ms; HF/tensora {:.2}x (min), {:.2}x (median)",
        ours_min * 1e3,
        ours_med * 1e3,
        hf_min * 1e3,
        hf_med * 1e3,
        hf_min / ours_min,
        hf_med / ours_med
    );

    let mut group = c.benchmark_group(format!("header_{count}"));
    group.throughput(Throughput::Bytes(n as u64));
    group.sample_size(if cfg!(debug_assertions) { 10 } else { 30 });
    group.bench_function("tensora_parse_header", |b| {
        b.iter(|| tensora_format::safetensors::parse_header(black_box(&file), file_len))
    });
    group.bench_function("hf_read_metadata", |b| {
        b.iter(|| safetensors::SafeTensors::read_metadata(black_box(&file)))
    });
    group.finish();
}

criterion_group!(benches, bench_header);
criterion_main!(benches);
