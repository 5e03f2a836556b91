//! Measure the arena's prefault strategies: time to map + prefault, then time for a first full
//! write pass (what a backend's copy would pay), and how much of it got huge pages.
//!
//! `cargo run --release -p tensora-io --example arena_prefault -- [GIB]` (default 1).

use std::time::Instant;

use tensora_io::{Arena, ArenaConfig, Prefault};

/// Repetitions per strategy; the best is reported.
const RUNS: usize = 3;

/// `AnonHugePages` of this process in bytes.
fn anon_huge_bytes() -> u64 {
    let s = std::fs::read_to_string("/proc/self/smaps_rollup").unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with("AnonHugePages:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kib| kib.parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let gib: u64 = std::env::args().nth(1).map(|s| s.parse()).transpose()?.unwrap_or(1);
    let len_bytes = gib << 30;
    let threads = tensora_sys::cpu_count();
    let strategies = [
        ("none (fault on first write)", Prefault::None),
        ("MAP_POPULATE", Prefault::MapPopulate),
        ("MADV_POPULATE_WRITE", Prefault::PopulateWrite),
        ("parallel touch", Prefault::ParallelTouch { threads }),
    ];
    println!("{gib} GiB arena, {threads} CPU(s); GB/s = arena bytes / seconds");
    for (label, prefault) in strategies {
        let mut best: Option<(f64, f64, u64)> = None;
        for _ in 0..RUNS {
            let t = Instant::now();
            let mut arena = Arena::new(&ArenaConfig { len_bytes, prefault })?;
            let prefault_s = t.elapsed().as_secs_f64();
            let t = Instant::now();
            // A first write pass over the arena from `threads` threads, like a backend's copy.
            let buf = arena.as_mut_slice();
            let per = buf.len().div_ceil(threads);
            std::thread::scope(|s| {
                for part in buf.chunks_mut(per) {
                    s.spawn(move || part.fill(1));
                }
            });
            let write_s = t.elapsed().as_secs_f64();
            let huge = anon_huge_bytes();
            let total = prefault_s + write_s;
            if best.is_none_or(|b| total < b.0 + b.1) {
                best = Some((prefault_s, write_s, huge));
            }
        }
        if let Some((p, w, huge)) = best {
            println!(
                "{label:<28} prefault {p:7.3} s  first write {w:7.3} s  total {:6.2} GB/s  huge pages {:5.1}%",
                len_bytes as f64 / (p + w) / 1e9,
                huge as f64 * 100.0 / len_bytes as f64
            );
        }
    }
    Ok(())
}
