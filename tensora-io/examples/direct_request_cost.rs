//! What one more `O_DIRECT` request costs on a file's device, in the bytes the device transfers
//! meanwhile: the fact behind the direct reads' per-request cost in `load/sliced.rs`
//! (`cargo run --release -p tensora-io --example direct_request_cost -- FILE [THREADS]`).
//!
//! Two passes over disjoint parts of the file, neither through the page cache, alternating
//! `ROUNDS` times: 8 MiB reads by 16 threads (the device's rate), then `SMALL_READ_BYTES` reads at
//! the start of every 4 KiB by `THREADS` threads (default 128: requests in flight), the rate of a
//! row-parallel slice read row by row. The cost of a request is its time less its bytes at the
//! device's rate; printed with its bytes' worth at that rate.

use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

const LARGE_READ_BYTES: u64 = 8 << 20;
const LARGE_THREADS: usize = 16;
const SMALL_READ_BYTES: u64 = 2048;
const SMALL_STRIDE_BYTES: u64 = 4096;
/// Bytes of the file each small pass spans (its reads are 1/2 of it).
const SMALL_SPAN_BYTES: u64 = 128 << 20;
const ROUNDS: usize = 3;
const THREADS_MAX: usize = 1024;

/// Reads `read` bytes every `stride` over `range` with `threads` threads; the seconds it took.
fn pass(
    file: &std::fs::File,
    range: std::ops::Range<u64>,
    read: u64,
    stride: u64,
    threads: usize,
) -> Result<f64, String> {
    let next = AtomicU64::new(range.start);
    let failed: Mutex<Option<String>> = Mutex::new(None);
    let t = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                // An arena is 2 MiB-aligned, as O_DIRECT wants its memory.
                let mut arena = match tensora_io::Arena::with_len(read) {
                    Ok(a) => a,
                    Err(e) => {
                        let mut f = failed.lock().unwrap_or_else(|p| p.into_inner());
                        f.get_or_insert(format!("an arena of {read} bytes: {e}"));
                        return;
                    }
                };
                let buf = &mut arena.as_mut_slice()[..read as usize];
                loop {
                    let at = next.fetch_add(stride, Ordering::Relaxed);
                    if at + read > range.end {
                        return;
                    }
                    if let Err(e) = file.read_exact_at(buf, at) {
                        let mut f = failed.lock().unwrap_or_else(|p| p.into_inner());
                        f.get_or_insert(format!("read of {read} bytes at {at}: {e}"));
                        next.store(range.end, Ordering::Relaxed);
                        return;
                    }
                }
            });
        }
    });
    match failed.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some(e) => Err(e),
        None => Ok(t.elapsed().as_secs_f64()),
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let path = args.get(1).ok_or("usage: direct_request_cost FILE [THREADS]")?;
    let threads: usize = args.get(2).map_or(Ok(128), |t| t.parse())?;
    if threads == 0 || threads > THREADS_MAX {
        return Err(format!("THREADS must be 1 to {THREADS_MAX}").into());
    }
    let file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(path)?;
    let len = file.metadata()?.len();
    let half = len / 2 / LARGE_READ_BYTES * LARGE_READ_BYTES;
    if half < SMALL_SPAN_BYTES * ROUNDS as u64 || half < LARGE_READ_BYTES * LARGE_THREADS as u64 {
        return Err(
            format!("{path}: {len} bytes; at least {} needed", 2 * SMALL_SPAN_BYTES * ROUNDS as u64).into()
        );
    }
    let large_span = half / ROUNDS as u64 / LARGE_READ_BYTES * LARGE_READ_BYTES;
    let mut rates = Vec::new();
    let mut costs = Vec::new();
    for round in 0..ROUNDS {
        let large = round as u64 * large_span..(round as u64 + 1) * large_span;
        let gbps =
            large_span as f64 / pass(&file, large, LARGE_READ_BYTES, LARGE_READ_BYTES, LARGE_THREADS)? / 1e9;
        let small_at = half + round as u64 * SMALL_SPAN_BYTES;
        let small = small_at..small_at + SMALL_SPAN_BYTES;
        let seconds = pass(&file, small, SMALL_READ_BYTES, SMALL_STRIDE_BYTES, threads)?;
        let requests = (SMALL_SPAN_BYTES / SMALL_STRIDE_BYTES) as f64;
        let cost_s = seconds / requests - SMALL_READ_BYTES as f64 / (gbps * 1e9);
        println!(
            "round {round}: 8 MiB reads {gbps:.2} GB/s; {SMALL_READ_BYTES} B reads {:.0} a second at {threads} in flight; \
             a request {:.1} µs = {:.0} bytes at the device's rate",
            requests / seconds,
            cost_s * 1e6,
            cost_s * gbps * 1e9
        );
        rates.push(requests / seconds);
        costs.push(cost_s * gbps * 1e9);
    }
    costs.sort_by(f64::total_cmp);
    rates.sort_by(f64::total_cmp);
    println!(
        "median: {:.0} small reads a second, a request {:.0} bytes ({:.0}..{:.0})",
        rates[ROUNDS / 2],
        costs[ROUNDS / 2],
        costs[0],
        costs[ROUNDS - 1]
    );
    Ok(())
}
