//! Spot measurements of the load path (the full benchmark suite is `cargo xtask bench`).
//!
//! ```text
//! cargo run --release -p tensora-io --example load_bench -- gen /tmp/tl      # TinyLlama-shaped, 2.2 GB, 2 shards
//! cargo run --release -p tensora-io --example load_bench -- warm /tmp/tl     # each backend vs the pread roofline
//! cargo run --release -p tensora-io --example load_bench -- cold /tmp/tl     # same, caches dropped before each (root)
//! cargo run --release -p tensora-io --example load_bench -- stream /tmp/tl 256MiB
//! cargo run --release -p tensora-io --example load_bench -- runs /tmp/tl 85MiB  # load_runs, every run kept
//! cargo run --release -p tensora-io --example load_bench -- once /tmp/tl recycle # one load, ArenaReuse::Recycle
//! ```

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Instant;

use tensora_format::Dtype;
use tensora_format::write::{ShardedLayout, TensorSpec, write_sharded};
use tensora_io::Arena;
use tensora_io::{ArenaReuse, BackendChoice, IoMode, LoadOptions, load, load_runs, load_streaming};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// Runs per measurement; the best is reported (warm), or each run (cold).
const RUNS: usize = 3;
/// Read size of the roofline.
const ROOFLINE_CHUNK_BYTES: usize = 8 << 20;

fn tinyllama_specs() -> Vec<TensorSpec> {
    let (hidden, inter, vocab, kv) = (2048u64, 5632u64, 32000u64, 256u64);
    let mut specs = vec![TensorSpec {
        name: "model.embed_tokens.weight".into(),
        dtype: Dtype::F16,
        shape: vec![vocab, hidden],
    }];
    for l in 0..22 {
        let p = format!("model.layers.{l}");
        for (n, shape) in [
            ("self_attn.q_proj.weight", vec![hidden, hidden]),
            ("self_attn.k_proj.weight", vec![kv, hidden]),
            ("self_attn.v_proj.weight", vec![kv, hidden]),
            ("self_attn.o_proj.weight", vec![hidden, hidden]),
            ("mlp.gate_proj.weight", vec![inter, hidden]),
            ("mlp.up_proj.weight", vec![inter, hidden]),
            ("mlp.down_proj.weight", vec![hidden, inter]),
            ("input_layernorm.weight", vec![hidden]),
            ("post_attention_layernorm.weight", vec![hidden]),
        ] {
            specs.push(TensorSpec { name: format!("{p}.{n}"), dtype: Dtype::F16, shape });
        }
    }
    specs.push(TensorSpec { name: "model.norm.weight".into(), dtype: Dtype::F16, shape: vec![hidden] });
    specs.push(TensorSpec { name: "lm_head.weight".into(), dtype: Dtype::F16, shape: vec![vocab, hidden] });
    specs
}

fn generate(dir: &Path) -> Res<()> {
    std::fs::create_dir_all(dir)?;
    let specs = tinyllama_specs();
    let total: u64 = specs.iter().filter_map(TensorSpec::nbytes).sum();
    let layout = ShardedLayout::new(specs, BTreeMap::new(), total / 2 + 1)?;
    let mut block = vec![0u8; 1 << 20];
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    for b in block.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    let specs = tinyllama_specs();
    write_sharded(dir, &layout, |i, out: &mut dyn Write| {
        let mut left = specs[i].nbytes().unwrap_or(0) as usize;
        let mut k = i;
        while left > 0 {
            let start = k % 4096;
            let n = left.min(block.len() - start);
            out.write_all(&block[start..start + n])?;
            left -= n;
            k += 1;
        }
        Ok(())
    })?;
    println!(
        "wrote {} tensors, {:.2} GB, into {}",
        tinyllama_specs().len(),
        total as f64 / 1e9,
        dir.display()
    );
    Ok(())
}

/// Two threads `pread` every file, in 8 MiB reads, into one hugepage arena: the warm roofline.
fn roofline(dir: &Path, threads: usize) -> Res<f64> {
    let ckpt = tensora_format::open(dir)?;
    let files: Vec<(std::fs::File, u64)> = ckpt
        .files()
        .iter()
        .map(|f| Ok((std::fs::File::open(f.path())?, f.len_bytes())))
        .collect::<Res<_>>()?;
    let total: u64 = files.iter().map(|f| f.1).sum();
    let t = Instant::now();
    // Reused across runs (like the loads' recycled arenas), so runs measure the copy.
    let mut arena = Arena::recycled(total)?;
    let buf = arena.as_mut_slice();
    // Split the arena into per-file parts, then each part into 8 MiB chunks dealt round-robin.
    let mut jobs: Vec<(usize, u64, &mut [u8])> = Vec::new();
    let mut rest = buf;
    for (i, (_, len)) in files.iter().enumerate() {
        let (mine, tail) = rest.split_at_mut(*len as usize);
        rest = tail;
        for (c, chunk) in mine.chunks_mut(ROOFLINE_CHUNK_BYTES).enumerate() {
            jobs.push((i, (c * ROOFLINE_CHUNK_BYTES) as u64, chunk));
        }
    }
    let mut per_thread: Vec<Vec<(usize, u64, &mut [u8])>> = (0..threads).map(|_| Vec::new()).collect();
    for (n, j) in jobs.into_iter().enumerate() {
        per_thread[n % threads].push(j);
    }
    std::thread::scope(|s| {
        for work in per_thread {
            let files = &files;
            s.spawn(move || {
                for (f, off, chunk) in work {
                    files[f].0.read_exact_at(chunk, off).expect("roofline read");
                }
            });
        }
    });
    let gbps = total as f64 / t.elapsed().as_secs_f64() / 1e9;
    arena.recycle();
    Ok(gbps)
}

fn drop_caches(cold: bool) -> Res<()> {
    if cold {
        tensora_sys::drop_caches_global()?;
    }
    Ok(())
}

fn compare(dir: &Path, cold: bool) -> Res<()> {
    let ckpt = tensora_format::open(dir)?;
    if !cold {
        // Warm the page cache.
        let _ = roofline(dir, 2)?;
    }
    let mut results: Vec<(String, f64)> = Vec::new();
    let mut best = |label: String, f: &mut dyn FnMut() -> Res<f64>| -> Res<()> {
        let mut runs = Vec::new();
        for _ in 0..RUNS {
            drop_caches(cold)?;
            runs.push(f()?);
        }
        let top = runs.iter().cloned().fold(0.0, f64::max);
        println!("{label:<34} best {top:6.2} GB/s   runs {runs:.2?}");
        results.push((label, top));
        Ok(())
    };
    best("roofline: 2-thread pread, hugepages".into(), &mut || roofline(dir, 2))?;
    for backend in ["auto", "sync", "mmap", "io-uring", "async"] {
        for mode in [IoMode::Buffered, IoMode::Direct] {
            if backend == "auto" && mode == IoMode::Direct {
                continue;
            }
            let opts = LoadOptions {
                backend: if backend == "auto" {
                    BackendChoice::Auto
                } else {
                    BackendChoice::Named(backend.into())
                },
                io_mode: if backend == "auto" { IoMode::Auto } else { mode },
                threads: 2,
                ..LoadOptions::default()
            };
            let label = format!(
                "{backend} {}",
                if backend == "auto" {
                    "auto"
                } else if mode == IoMode::Direct {
                    "direct"
                } else {
                    "buffered"
                }
            );
            best(label, &mut || {
                let loaded = load(&ckpt, &opts)?;
                let r = loaded.report();
                if backend == "auto" {
                    eprintln!("  auto -> {} ({}): {}", r.backend, r.io_mode, r.reason);
                }
                Ok(r.gbps)
            })?;
        }
    }
    Ok(())
}

fn stream(dir: &Path, budget_bytes: u64) -> Res<()> {
    let ckpt = tensora_format::open(dir)?;
    let opts = LoadOptions { budget_bytes, threads: 2, ..LoadOptions::default() };
    let mut n = 0usize;
    let report = load_streaming(&ckpt, &opts, |t| {
        n += usize::from(!t.bytes().is_empty());
        Ok(())
    })?;
    println!(
        "streaming budget {budget_bytes}: {n} tensors, {:.2} GB/s, {} windows, peak RSS {:.0} MiB, via {} ({})",
        report.gbps,
        report.windows,
        report.peak_rss_bytes as f64 / (1 << 20) as f64,
        report.backend,
        report.reason
    );
    Ok(())
}

fn parse_bytes(s: &str) -> Res<u64> {
    let (n, mult) = if let Some(n) = s.strip_suffix("MiB") {
        (n, 1u64 << 20)
    } else if let Some(n) = s.strip_suffix("GiB") {
        (n, 1 << 30)
    } else {
        (s, 1)
    };
    Ok(n.parse::<u64>()? * mult)
}

/// `load_runs` with runs of at most `budget_bytes`, every run kept (as `weights_iterator`'s caller
/// keeping every tensor does): its rate and what the runs' reports add up to.
fn runs(dir: &Path, budget_bytes: u64) -> Res<()> {
    let ckpt = tensora_format::open(dir)?;
    let opts = LoadOptions { budget_bytes, ..LoadOptions::default() };
    let t = Instant::now();
    let mut kept = Vec::new();
    for run in load_runs(&ckpt, &opts)? {
        kept.push(run?);
    }
    let seconds = t.elapsed().as_secs_f64();
    let bytes: u64 = kept.iter().map(|r| r.report().bytes_selected).sum();
    let io_seconds: f64 = kept.iter().map(|r| r.report().phases.io).sum();
    let faults: u64 = kept.iter().map(|r| r.report().minor_faults).sum();
    let mode = kept.first().map_or("-", |r| r.report().io_mode.as_str());
    println!(
        "runs budget {budget_bytes}: {} runs, {:.2} GB/s, io {io_seconds:.3} s, {faults} minor faults, {mode}",
        kept.len(),
        bytes as f64 / seconds / 1e9
    );
    Ok(())
}

/// One default load in this process, with fresh (`fresh`) or recycled (`recycle`) arena memory:
/// a process's first load, as a cold start pays it.
fn once(dir: &Path, reuse: &str) -> Res<()> {
    let arena_reuse = match reuse {
        "fresh" => ArenaReuse::Fresh,
        "recycle" => ArenaReuse::Recycle,
        other => return Err(format!("once: arena reuse must be fresh or recycle, got {other:?}").into()),
    };
    let ckpt = tensora_format::open(dir)?;
    let loaded = load(&ckpt, &LoadOptions { arena_reuse, ..LoadOptions::default() })?;
    let r = loaded.report();
    println!("once {reuse}: {:.2} GB/s, {} minor faults, {}", r.gbps, r.minor_faults, r.io_mode);
    Ok(())
}

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: load_bench gen|warm|cold|stream|runs|once DIR [BUDGET | fresh|recycle]";
    let (cmd, dir) = match (args.get(1), args.get(2)) {
        (Some(c), Some(d)) => (c.as_str(), Path::new(d)),
        _ => return Err(usage.into()),
    };
    match cmd {
        "gen" => generate(dir),
        "warm" => compare(dir, false),
        "cold" => compare(dir, true),
        "stream" => stream(dir, parse_bytes(args.get(3).map_or("256MiB", String::as_str))?),
        "runs" => runs(dir, parse_bytes(args.get(3).map_or("85MiB", String::as_str))?),
        "once" => once(dir, args.get(3).map_or("fresh", String::as_str)),
        _ => Err(usage.into()),
    }
}
