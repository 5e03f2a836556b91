//! Where a warm F32 -> BF16 cast load's time goes, against an uncast owned load of the same
//! output bytes: each way in one process, alternating, rounds of each (`cargo run --release
//! --example cast_cost -- F32_DIR BF16_DIR [ROUNDS]`; both warm).
//!
//! - `cast`: `Residence::Auto` (Python's default for torch), converted from views of the files;
//! - `uncast`: an owned load of the BF16 copy;
//! - `pread F32` and `pread BF16`: each copy's files read in 1 MiB chunks into one buffer per
//!   thread (two), nothing kept (`tensora_testkit::pread_only`, the bench's cast pairs' reads
//!   too): what crossing 4.4 GB and 2.2 GB of page cache cost alone;
//! - `convert only`: an L2-sized F32 buffer converted into every chunk of a destination faulted
//!   in beforehand (the kernel alone).
//!
//! The cast must cross the 4.4 GB, the uncast load 2.2: the cast's best is about the uncast
//! load's time plus the difference of the two `pread` lines plus `convert only`.

use std::time::Instant;

use tensora_io::{DtypeTarget, LoadOptions, Residence, load};

/// Bytes of the F32 buffer `convert only` converts: fits a core's L2, as the `pread` chunks do.
const PREAD_CHUNK_BYTES: usize = tensora_testkit::PreadOnly::TWO_THREADS_1_MIB.chunk_bytes;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let (f32_dir, bf16_dir) = (&args[1], &args[2]);
    let rounds: usize = args.get(3).map_or(Ok(3), |r| r.parse())?;
    let f32_ckpt = tensora_format::open(std::path::Path::new(f32_dir))?;
    let bf16_ckpt = tensora_format::open(std::path::Path::new(bf16_dir))?;
    // SAFETY: the bench fixtures are not modified while this runs.
    let promise = unsafe { tensora_io::FilesUnchanged::promise() };
    let out_gb = bf16_ckpt.files().iter().map(|f| f.len_bytes()).sum::<u64>() as f64 / 1e9;
    let mut times: Vec<(&str, Vec<f64>)> = ["cast", "uncast", "pread F32", "pread BF16", "convert only"]
        .iter()
        .map(|n| (*n, Vec::new()))
        .collect();
    // A destination faulted in beforehand, for `convert only`.
    let mut dst = vec![1u8; (out_gb * 1e9) as usize];
    for round in 0..rounds {
        for (k, (name, samples)) in times.iter_mut().enumerate() {
            let t = Instant::now();
            let reason = match k {
                0 => {
                    let opts = LoadOptions {
                        residence: Residence::Auto(promise),
                        dtype: DtypeTarget::BF16,
                        ..LoadOptions::default()
                    };
                    let loaded = load(&f32_ckpt, &opts)?;
                    let r = loaded.report();
                    let cast_s = r.cast.as_ref().map_or(0.0, |c| c.seconds);
                    println!("  converting {cast_s:.3} s (summed over workers), phases {:?}", r.phases);
                    r.reason.clone()
                }
                1 => {
                    let opts = LoadOptions { residence: Residence::Owned, ..LoadOptions::default() };
                    let loaded = load(&bf16_ckpt, &opts)?;
                    loaded.report().reason.clone()
                }
                2 | 3 => {
                    let ckpt = if k == 2 { &f32_ckpt } else { &bf16_ckpt };
                    let paths: Vec<_> = ckpt.files().iter().map(|f| f.path().to_path_buf()).collect();
                    tensora_testkit::pread_only(&paths, tensora_testkit::PreadOnly::TWO_THREADS_1_MIB)?;
                    String::new()
                }
                _ => {
                    convert_only(&mut dst);
                    String::new()
                }
            };
            let s = t.elapsed().as_secs_f64();
            samples.push(s);
            if round == 0 {
                println!("{name}: {reason:.200}");
            }
            println!("round {round} {name}: {s:.3} s ({:.2} GB/s of output)", out_gb / s);
        }
    }
    for (name, mut s) in times {
        s.sort_by(f64::total_cmp);
        println!("{name}: median {:.3} s ({:.3}..{:.3})", s[s.len() / 2], s[0], s[s.len() - 1]);
    }
    Ok(())
}

/// One L2-sized F32 buffer converted into every chunk of a destination faulted in beforehand, two
/// threads: the kernel alone.
fn convert_only(dst: &mut [u8]) {
    let chunk = PREAD_CHUNK_BYTES;
    let src: Vec<u8> = (0..chunk).map(|i| (i * 7) as u8).collect();
    let (a, b) = dst.split_at_mut(dst.len() / 2);
    std::thread::scope(|s| {
        for half in [a, b] {
            let src = &src;
            s.spawn(move || {
                for d in half.chunks_mut(chunk / 2) {
                    let n = d.len() / 2 * 2;
                    tensora_io::convert(
                        tensora_format::Dtype::F32,
                        tensora_format::Dtype::BF16,
                        &src[..2 * n],
                        &mut d[..n],
                    )
                    .unwrap();
                }
            });
        }
    });
}
