//! Digest throughput, alone and fused into a warm load.
//!
//! `raw/<algo>`: one-shot digest of a 64 MiB buffer.
//! `warm_load/none/chunk_<N>MiB` vs `warm_load/<algo>/chunk_<N>MiB`: `tensora_io::load` of a
//! generated checkpoint (in a temporary directory, deleted afterwards) with `N` MiB reads, without
//! digests and with a `DigestCollector` installed (crc32c digests each read's pieces as they land;
//! `crc32c_tensor_hook_only` digests whole tensors after they complete, the path before the read
//! hook). The goal is crc32c >= 0.8x the throughput of `warm_load/none/chunk_8MiB` (the default
//! load).
//! `scan/<algo>`: the `verify` integrity scan of the same checkpoint (warm page cache).
//!
//! `TENSORA_VERIFY_BENCH_AB_ROUNDS=N` first runs `N` interleaved rounds of the main variants and
//! prints per-round ratios: on a machine shared with other work, both sides of each ratio then
//! see the same background load. Those times stop when the load returns; criterion's also include
//! dropping the `Loaded` (unmapping its arena), the same cost with and without digests.
//!
//! Size of the generated checkpoint: `TENSORA_VERIFY_BENCH_BYTES` (default 256 MiB; the issue's
//! measurement uses 1.5 GiB: `TENSORA_VERIFY_BENCH_BYTES=1610612736 cargo bench -p tensora-verify`).

use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use tensora_format::Dtype;
use tensora_format::write::{SafetensorsLayout, TensorSpec, write_safetensors};
use tensora_io::LoadOptions;
use tensora_verify::Algo;
use tensora_verify::DigestCollector;
use tensora_verify::{ScanConfig, scan};

const RAW_BYTES: usize = 64 << 20;
const CHECKPOINT_BYTES_DEFAULT: u64 = 256 << 20;
/// Tensor sizes cycle through these (a mix of large matrices and small vectors, as in a model).
const TENSOR_BYTES: [u64; 4] = [64 << 20, 16 << 20, 4 << 20, 64 << 10];
/// Read sizes (`LoadOptions::chunk_bytes`) of the loads without digests: the default 8 MiB and the
/// L2-sized reads the digest runs use.
const CHUNKS_MIB: [u64; 3] = [8, 2, 1];

/// Which collector hooks a digest run installs.
#[derive(Debug, Clone, Copy)]
enum Hooks {
    /// `DigestCollector::install`: crc32c digests each read's pieces as they land.
    Installed,
    /// Only `on_tensor`: each tensor digested once complete, re-read from memory (the old path).
    TensorOnly,
}

/// An interleaved variant: (name, chunk MiB, digest algorithm and hooks, or none).
type Variant = (&'static str, u64, Option<(Algo, Hooks)>);

/// The digest runs: (algorithm, chunk MiB, hooks). XXH3 and SHA-256 digest whole tensors whatever
/// the read size, so they run at the default size only.
const DIGEST_RUNS: [(Algo, u64, Hooks); 6] = [
    (Algo::Crc32c, 8, Hooks::Installed),
    (Algo::Crc32c, 2, Hooks::Installed),
    (Algo::Crc32c, 1, Hooks::Installed),
    (Algo::Crc32c, 8, Hooks::TensorOnly),
    (Algo::Xxh3, 8, Hooks::Installed),
    (Algo::Sha256, 8, Hooks::Installed),
];

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

    if let Some(rounds) = std::env::var("TENSORA_VERIFY_BENCH_AB_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n: &usize| n > 0)
    {
        interleaved(&ckpt, bytes, rounds);
    }

    let mut g = c.benchmark_group("warm_load");
    g.throughput(Throughput::Bytes(bytes));
    g.sample_size(10).measurement_time(Duration::from_secs(8));
    for chunk_mib in CHUNKS_MIB {
        let opts = LoadOptions { chunk_bytes: chunk_mib << 20, ..LoadOptions::default() };
        g.bench_function(format!("none/chunk_{chunk_mib}MiB"), |b| {
            b.iter(|| black_box(tensora_io::load(&ckpt, &opts).expect("load")));
        });
    }
    for (algo, chunk_mib, hooks) in DIGEST_RUNS {
        let name = match hooks {
            Hooks::Installed => format!("{algo}/chunk_{chunk_mib}MiB"),
            Hooks::TensorOnly => format!("{algo}_tensor_hook_only/chunk_{chunk_mib}MiB"),
        };
        g.bench_function(name, |b| {
            b.iter(|| {
                let collector = DigestCollector::new(&ckpt, algo);
                let mut opts = LoadOptions { chunk_bytes: chunk_mib << 20, ..LoadOptions::default() };
                match hooks {
                    Hooks::Installed => collector.install(&mut opts),
                    Hooks::TensorOnly => opts.on_tensor = Some(collector.hook()),
                }
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

/// CPU time (user, system) of this process so far, in clock ticks (`/proc/self/stat`).
fn cpu_ticks() -> [u64; 2] {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    // Fields after the command name (which ends with the last ')'): utime and stime are 12 and 13.
    let fields: Vec<&str> = stat[stat.rfind(')').expect("stat format") + 2..].split(' ').collect();
    [fields[11].parse().expect("utime"), fields[12].parse().expect("stime")]
}

/// Load `ckpt` once with `chunk_mib` MiB reads, with a collector for `algo` installed when given;
/// returns (wall seconds, [user, system] CPU clock ticks).
fn timed_load(
    ckpt: &tensora_format::Checkpoint,
    chunk_mib: u64,
    digest: Option<(Algo, Hooks)>,
) -> (f64, [u64; 2]) {
    let mut opts = LoadOptions { chunk_bytes: chunk_mib << 20, ..LoadOptions::default() };
    let ticks = cpu_ticks();
    let start = Instant::now();
    let collector = digest.map(|(algo, hooks)| {
        let c = DigestCollector::new(ckpt, algo);
        match hooks {
            Hooks::Installed => c.install(&mut opts),
            Hooks::TensorOnly => opts.on_tensor = Some(c.hook()),
        }
        c
    });
    let loaded = tensora_io::load(ckpt, &opts).expect("load");
    if let Some(c) = &collector {
        black_box(c.finish(ckpt).expect("digests"));
    }
    let seconds = start.elapsed().as_secs_f64();
    let now = cpu_ticks();
    let ticks = [now[0] - ticks[0], now[1] - ticks[1]];
    drop(loaded);
    (seconds, ticks)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// A/B measurement for a machine shared with other work (`TENSORA_VERIFY_BENCH_AB_ROUNDS=N`):
/// each round loads once per variant (the order rotating from round to round), so both sides of
/// every ratio see the same background load. Prints the median throughput of each variant and
/// the median of the per-round ratios to the load without digests, and the ratio of total CPU
/// time (the throughput ratio a quiet machine would show when the loads are CPU-bound).
fn interleaved(ckpt: &tensora_format::Checkpoint, bytes: u64, rounds: usize) {
    let variants: [Variant; 6] = [
        ("none/chunk_8MiB", 8, None),
        ("none/chunk_2MiB", 2, None),
        ("crc32c/chunk_8MiB", 8, Some((Algo::Crc32c, Hooks::Installed))),
        ("crc32c/chunk_2MiB", 2, Some((Algo::Crc32c, Hooks::Installed))),
        ("crc32c_tensor_hook_only/chunk_8MiB", 8, Some((Algo::Crc32c, Hooks::TensorOnly))),
        ("xxh3/chunk_8MiB", 8, Some((Algo::Xxh3, Hooks::Installed))),
    ];
    let mut seconds = vec![Vec::with_capacity(rounds); variants.len()];
    let mut ticks = vec![[0u64; 2]; variants.len()];
    for round in 0..rounds {
        // Rotate the order each round, so no variant always runs right after the same one.
        for step in 0..variants.len() {
            let k = (round + step) % variants.len();
            let (_, chunk_mib, digest) = variants[k];
            let (s, t) = timed_load(ckpt, chunk_mib, digest);
            seconds[k].push(s);
            ticks[k][0] += t[0];
            ticks[k][1] += t[1];
        }
    }
    let gib = bytes as f64 / f64::from(1u32 << 30);
    for (k, (name, _, _)) in variants.iter().enumerate() {
        let ratios: Vec<f64> = seconds[0].iter().zip(&seconds[k]).map(|(base, s)| base / s).collect();
        let cpu = |k: usize| (ticks[k][0] + ticks[k][1]).max(1) as f64;
        println!(
            "interleaved {name:<34} median {:5.2} GiB/s, ratio to none/chunk_8MiB: median {:.3} \
             (min {:.3}, max {:.3}); CPU time ratio {:.3} (user {} + system {} ticks); {rounds} rounds",
            gib / median(seconds[k].clone()),
            median(ratios.clone()),
            ratios.iter().copied().fold(f64::INFINITY, f64::min),
            ratios.iter().copied().fold(0.0, f64::max),
            cpu(0) / cpu(k),
            ticks[k][0],
            ticks[k][1],
        );
    }
}

criterion_group!(benches, raw, warm_load);
criterion_main!(benches);
