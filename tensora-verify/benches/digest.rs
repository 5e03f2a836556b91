//! Digest throughput, alone and fused into a warm load.
//!
//! `raw/<algo>`: one-shot digest of a 64 MiB buffer.
//! `warm_load/none` vs `warm_load/<algo>`: `tensora_io::load` of a generated checkpoint (in a
//! temporary directory, deleted afterwards) with and without digests fused through `on_tensor`.
//! The goal is `warm_load/crc32c` >= 0.8x the throughput of `warm_load/none`.
//! `scan/<algo>`: the `verify` integrity scan of the same checkpoint (warm page cache).
//!
//! Size of the generated checkpoint: `TENSORA_VERIFY_BENCH_BYTES` (default 256 MiB; the issue's
//! measurement uses 1.5 GiB: `TENSORA_VERIFY_BENCH_BYTES=1610612736 cargo bench -p tensora-verify`).

use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use tensora_format::Dtype;
use tensora_format::write::{SafetensorsLayout, TensorSpec, write_safetensors};
use tensora_io::LoadOptions;
use tensora_verify::Algo;
use tensora_verify::fused::DigestCollector;
use tensora_verify::scan::{ScanConfig, scan};

const RAW_BYTES: usize = 64 << 20;
const CHECKPOINT_BYTES_DEFAULT: u64 = 256 << 20;
/// Tensor sizes cycle through these (a mix of large matrices and small vectors, as in a model).
const TENSOR_BYTES: [u64; 4] = [64 << 20, 16 << 20, 4 << 20, 64 << 10];

fn raw(c: &mut Criterion) {
    let data: Vec<u8> = (0..RAW_BYTES).map(|i| (i as u8).wrapping_mul(167)).collect();
    let mut g = c.benchmark_group("raw");
    g.throughput(Throughput::Bytes(RAW_BYTES as u64));
    g.sample_size(10).measurement_time(Duration::from_secs(3));
    for algo in Algo::ALL {
        g.bench_function(algo.as_str(), |b| b.iter(|| black_box(algo.digest(black_box(&data)))));
    }
    g.finish();
}

fn warm_load(c: &mut Criterion) {
    let total_bytes: u64 = std::env::var("TENSORA_VERIFY_BENCH_BYTES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(CHECKPOINT_BYTES_DEFAULT);
    let dir = tempfile::tempdir_in(std::env::temp_dir()).expect("temporary directory");
    let path = dir.path().join("bench.safetensors");
    let mut specs = Vec::new();
    let mut left = total_bytes;
    while left > 0 {
        let nbytes = TENSOR_BYTES[specs.len() % TENSOR_BYTES.len()].min(left);
        let numel = nbytes / 2;
        if numel == 0 {
            break;
        }
        specs.push(TensorSpec {
            name: format!("layers.{}.weight", specs.len()),
            dtype: Dtype::BF16,
            shape: vec![numel],
        });
        left -= numel * 2;
    }
    let layout = SafetensorsLayout::new(specs, BTreeMap::new()).expect("layout");
    let chunk: Vec<u8> = (0..1usize << 20).map(|i| (i as u8).wrapping_mul(31)).collect();
    write_safetensors(&path, &layout, |i, out| {
        let mut left = layout.tensor_range(i).end - layout.tensor_range(i).start;
        while left > 0 {
            let n = left.min(chunk.len() as u64) as usize;
            out.write_all(&chunk[..n])?;
            left -= n as u64;
        }
        Ok(())
    })
    .expect("write checkpoint");
    let ckpt = tensora_format::open(&path).expect("open");
    let bytes = ckpt.total_tensor_bytes();
    // Warm the page cache.
    drop(tensora_io::load(&ckpt, &LoadOptions::default()).expect("load"));

    let mut g = c.benchmark_group("warm_load");
    g.throughput(Throughput::Bytes(bytes));
    g.sample_size(10).measurement_time(Duration::from_secs(8));
    g.bench_function("none", |b| {
        b.iter(|| black_box(tensora_io::load(&ckpt, &LoadOptions::default()).expect("load")));
    });
    for algo in Algo::ALL {
        g.bench_function(algo.as_str(), |b| {
            b.iter(|| {
                let collector = DigestCollector::new(&ckpt, algo);
                let opts = LoadOptions { on_tensor: Some(collector.hook()), ..LoadOptions::default() };
                let loaded = tensora_io::load(&ckpt, &opts).expect("load");
                black_box(collector.finish(&ckpt).expect("digests"));
                loaded
            });
        });
    }
    g.finish();

    let mut g = c.benchmark_group("scan");
    g.throughput(Throughput::Bytes(ckpt.files()[0].len_bytes()));
    g.sample_size(10).measurement_time(Duration::from_secs(8));
    for algo in [Algo::Crc32c, Algo::Sha256] {
        g.bench_function(algo.as_str(), |b| {
            b.iter(|| {
                let result = scan(&ckpt, &ScanConfig { algo, ..ScanConfig::default() });
                assert!(result.is_clean());
                black_box(result)
            });
        });
    }
    g.finish();
    drop(ckpt);
    dir.close().expect("remove the generated checkpoint");
}

criterion_group!(benches, raw, warm_load);
criterion_main!(benches);
