//! Conversion throughput: a generated safetensors model to ServerlessLLM and back to safetensors.
//!
//! `cargo bench -p tensora-bench --bench convert` converts a 1 GiB model; when criterion runs the
//! bench in test mode (`cargo test --all-targets`, no `--bench` argument) the model is 4 MiB so
//! the run stays fast.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use tensora_convert::{ConvertConfig, TargetFormat, convert};
use tensora_format::Dtype;
use tensora_format::write::{SafetensorsLayout, TensorSpec, write_safetensors};

/// Model size under `cargo bench`.
const MODEL_BYTES_BENCH: u64 = 1 << 30;
/// Model size in criterion's test mode.
const MODEL_BYTES_TEST: u64 = 4 << 20;
/// Size of each generated tensor (bf16 rows of 4096 elements).
const TENSOR_BYTES: u64 = 32 << 20;
/// Bytes written per call while generating tensor data.
const GEN_CHUNK_BYTES: usize = 1 << 20;

fn model_bytes() -> u64 {
    if std::env::args().any(|a| a == "--bench") { MODEL_BYTES_BENCH } else { MODEL_BYTES_TEST }
}

/// Write a bf16 model of about `total_bytes` into `dir`: tensors of `TENSOR_BYTES` (smaller for a
/// small model) plus a few odd-sized ones so padding is exercised.
fn generate(dir: &Path, total_bytes: u64) -> PathBuf {
    let row_bytes = 4096 * 2;
    let tensor_bytes = TENSOR_BYTES.min(total_bytes / 8).max(row_bytes);
    let count = (total_bytes / tensor_bytes).max(1);
    let mut specs: Vec<TensorSpec> = (0..count)
        .map(|i| TensorSpec {
            name: format!("model.layers.{i}.weight"),
            dtype: Dtype::BF16,
            shape: vec![tensor_bytes / row_bytes, 4096],
        })
        .collect();
    for i in 0..3u64 {
        specs.push(TensorSpec {
            name: format!("model.norm.{i}.bias"),
            dtype: Dtype::F16,
            shape: vec![3 + i],
        });
    }
    let path = dir.join("model.safetensors");
    let layout = SafetensorsLayout::new(specs, BTreeMap::new()).expect("generated specs are valid");
    let mut chunk = vec![0u8; GEN_CHUNK_BYTES];
    write_safetensors(&path, &layout, |i, out| {
        let mut left = layout.specs()[i].nbytes().unwrap_or(0);
        let mut state = 0x9E37_79B9_7F4A_7C15u64 ^ i as u64;
        while left > 0 {
            let n = left.min(chunk.len() as u64) as usize;
            for word in chunk[..n].chunks_mut(8) {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                word.copy_from_slice(&state.to_le_bytes()[..word.len()]);
            }
            out.write_all(&chunk[..n])?;
            left -= n as u64;
        }
        Ok(())
    })
    .expect("writing the generated model");
    path
}

static RUN: AtomicU64 = AtomicU64::new(0);

fn fresh(dir: &Path, stem: &str) -> PathBuf {
    dir.join(format!("{stem}-{}", RUN.fetch_add(1, Ordering::Relaxed)))
}

/// A conversion output, removed when dropped (criterion drops outputs outside the timed region).
struct Output(PathBuf);

impl Drop for Output {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn bench_convert(c: &mut Criterion) {
    let total_bytes = model_bytes();
    let work = tempfile::tempdir().expect("temp dir");
    let src_path = generate(work.path(), total_bytes);
    let src = tensora_format::open(&src_path).expect("open generated model");
    let sllm_dir = work.path().join("reference-sllm");
    let to_sllm = ConvertConfig { to: TargetFormat::ServerlessLlm, ..ConvertConfig::default() };
    let first = convert(&src, &sllm_dir, &to_sllm).expect("convert to serverlessllm");
    eprintln!(
        "convert bench: {} bytes, first pass {:.2} GB/s, peak RSS {} MiB",
        first.bytes_copied,
        first.gbps,
        first.peak_rss_bytes >> 20
    );
    let sllm_ckpt = tensora_format::open(&sllm_dir).expect("open converted model");

    let mut group = c.benchmark_group("convert");
    group.sample_size(10);
    group.throughput(Throughput::Bytes(first.bytes_copied));
    let out = work.path().to_path_buf();
    group.bench_function("safetensors_to_serverlessllm", |b| {
        b.iter_batched(
            || fresh(&out, "sllm"),
            |dst| {
                let report = convert(&src, &dst, &to_sllm).expect("convert");
                (report, Output(dst))
            },
            BatchSize::PerIteration,
        )
    });
    let to_st = ConvertConfig { to: TargetFormat::Safetensors, ..ConvertConfig::default() };
    group.bench_function("serverlessllm_to_safetensors", |b| {
        b.iter_batched(
            || fresh(&out, "st"),
            |dst| {
                let report = convert(&sllm_ckpt, &dst, &to_st).expect("convert");
                (report, Output(dst))
            },
            BatchSize::PerIteration,
        )
    });
    group.finish();
}

criterion_group!(benches, bench_convert);
criterion_main!(benches);
