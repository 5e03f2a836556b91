//! Measure what a strided slice costs through the page cache, against its covering range: the
//! fact behind the page cache's per-request cost in `load/sliced.rs`.
//!
//! For rows of `WIDTH` bytes every `STRIDE` bytes of a cached file (a row-parallel weight's slice),
//! times (a) one `pread` per row into a packed buffer (the strided read) and (b) `pread`s of the
//! covering range in `CHUNK` pieces followed by packing the rows in place (the covering read).
//! Destinations are faulted in before the clock starts (a load's arena is prefaulted). Prints,
//! per row, both times, and the request cost they imply: the bytes the covering read moves in the
//! time one more `pread` takes (`(strided - width x per_byte) / per_byte`, per_byte being the
//! covering read's time per byte it reads).
//!
//! `cargo run --release -p tensora-io --example slice_cost -- FILE [WIDTH STRIDE [MIB]]`
//! (default 1024 4096 256: TinyLlama's o_proj at TP=4 in F16; FILE is read warm first).
//!
//! With `TENSORA_SLICE_COST_COLD=1` the region is evicted (`POSIX_FADV_DONTNEED`) before every
//! timed read, and three cold reads are timed, as a cold load through the page cache reads
//! (`Reading::ReadAhead`: `POSIX_FADV_WILLNEED` ahead of the copies): (a) the rows, advised row by
//! row (what the read-ahead helper does with a strided plan's pieces); (b) the same rows, the
//! covering range advised in 2 MiB steps; (c) the covering read, advised in 2 MiB steps, then
//! packed. Each prints ns per row and the bytes the device delivered (`/proc/self/io`).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::time::Instant;

/// Rounds per shape, alternating strided and covering; medians are printed.
const ROUNDS: usize = 7;
/// The pieces the covering range is read in (the load's default chunk).
const CHUNK_BYTES: usize = 8 << 20;

fn median(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

fn strided(f: &File, dest: &mut [u8], width: usize, stride: usize) -> std::io::Result<()> {
    for (r, row) in dest.chunks_exact_mut(width).enumerate() {
        f.read_exact_at(row, (r * stride) as u64)?;
    }
    Ok(())
}

fn covering(f: &File, dest: &mut [u8], width: usize, stride: usize, rows: usize) -> std::io::Result<()> {
    let len = (rows - 1) * stride + width;
    for (k, piece) in dest[..len].chunks_mut(CHUNK_BYTES).enumerate() {
        f.read_exact_at(piece, (k * CHUNK_BYTES) as u64)?;
    }
    for r in 1..rows {
        dest.copy_within(r * stride..r * stride + width, r * width);
    }
    Ok(())
}

/// The read-ahead helper's step (`map::readahead::READAHEAD_STEP_BYTES`).
const STEP_BYTES: usize = 2 << 20;

fn advise(f: &File, offset: usize, len: usize, advice: libc::c_int) {
    use std::os::fd::AsRawFd;
    // SAFETY: posix_fadvise takes a descriptor this process owns (borrowed from `f`, alive for
    // the call) and plain integers; it touches no memory of ours.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), offset as i64, len as i64, advice) };
}

fn disk_read_bytes() -> u64 {
    let io = std::fs::read_to_string("/proc/self/io").unwrap_or_default();
    io.lines().find_map(|l| l.strip_prefix("read_bytes: ")).and_then(|v| v.trim().parse().ok()).unwrap_or(0)
}

/// The three cold reads of the module docs, alternated over `ROUNDS` rounds; prints each.
fn cold(f: &File, width: usize, stride: usize, rows: usize) -> Result<(), Box<dyn std::error::Error>> {
    let span = (rows - 1) * stride + width;
    let mut packed = vec![1u8; rows * width];
    let mut cover = vec![1u8; rows * stride];
    let names = ["rows advised row by row", "rows, covering advised in steps", "covering, advised in steps"];
    let mut ns: [Vec<f64>; 3] = Default::default();
    let mut disk: [Vec<f64>; 3] = Default::default();
    for _ in 0..ROUNDS {
        for (k, (ns, disk)) in ns.iter_mut().zip(&mut disk).enumerate() {
            advise(f, 0, span, libc::POSIX_FADV_DONTNEED);
            let before = disk_read_bytes();
            let t = Instant::now();
            if k == 0 {
                for r in 0..rows {
                    advise(f, r * stride, width, libc::POSIX_FADV_WILLNEED);
                }
            } else {
                for at in (0..span).step_by(STEP_BYTES) {
                    advise(f, at, STEP_BYTES.min(span - at), libc::POSIX_FADV_WILLNEED);
                }
            }
            if k == 2 {
                covering(f, &mut cover, width, stride, rows)?;
            } else {
                strided(f, &mut packed, width, stride)?;
            }
            ns.push(t.elapsed().as_secs_f64() * 1e9 / rows as f64);
            disk.push((disk_read_bytes() - before) as f64);
        }
    }
    for (k, name) in names.iter().enumerate() {
        let (m, lo, hi) = median(ns[k].clone());
        let (d, _, _) = median(disk[k].clone());
        println!(
            "cold width {width} stride {stride}, {rows} rows: {name}: {m:.0} ns/row ({lo:.0}..{hi:.0}), \
             device {:.3} of the covering range ({:.3} GB/s of the rows)",
            d / span as f64,
            (rows * width) as f64 / m / rows as f64
        );
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let path = args.first().ok_or("usage: slice_cost FILE [WIDTH STRIDE [MIB]]")?;
    let arg = |i: usize, default: usize| args.get(i).map_or(Ok(default), |s| s.parse::<usize>());
    let (width, stride, mib) = (arg(1, 1024)?, arg(2, 4096)?, arg(3, 256)?);
    if width == 0 || stride < width {
        return Err("WIDTH must be at least 1 and at most STRIDE".into());
    }
    let f = File::open(path)?;
    let region = (mib << 20).min(f.metadata()?.len() as usize);
    let rows = region / stride;
    if rows < 2 {
        return Err("the file holds fewer than two rows".into());
    }
    if std::env::var_os("TENSORA_SLICE_COST_COLD").is_some() {
        return cold(&f, width, stride, rows);
    }
    // Warm: the region in the page cache before either read is timed.
    let mut warm = vec![0u8; CHUNK_BYTES];
    for k in 0..region.div_ceil(CHUNK_BYTES) {
        let n = f.read_at(&mut warm, (k * CHUNK_BYTES) as u64)?;
        if n == 0 {
            break;
        }
    }
    let mut packed = vec![1u8; rows * width];
    let mut cover = vec![1u8; rows * stride];
    let (mut s_ns, mut c_ns) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        let t = Instant::now();
        strided(&f, &mut packed, width, stride)?;
        s_ns.push(t.elapsed().as_secs_f64() * 1e9 / rows as f64);
        let t = Instant::now();
        covering(&f, &mut cover, width, stride, rows)?;
        c_ns.push(t.elapsed().as_secs_f64() * 1e9 / rows as f64);
        if cover[..rows * width] != packed[..] {
            return Err("the strided and covering reads differ".into());
        }
    }
    let (s, s_min, s_max) = median(s_ns);
    let (c, c_min, c_max) = median(c_ns);
    let per_byte = c / stride as f64;
    let request_bytes = (s - width as f64 * per_byte) / per_byte;
    println!(
        "width {width} stride {stride}, {rows} rows of {path}: strided {s:.0} ns/row ({s_min:.0}..{s_max:.0}), \
         covering {c:.0} ns/row ({c_min:.0}..{c_max:.0}), {:.2} GB/s covered; one pread costs \
         {request_bytes:.0} bytes of the covering read (median of {ROUNDS} alternating rounds)",
        stride as f64 / c
    );
    Ok(())
}
