//! Cold-load experiments (drop caches before each run; root only).
use std::path::PathBuf;
use std::time::Instant;
use tensora_io::arena::Arena;
use tensora_io::probe::{DirectRooflineConfig, direct_read_roofline, direct_roofline_arena_bytes, drop_caches_global};
use tensora_io::{BackendChoice, IoMode, LoadOptions, load};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = PathBuf::from(std::env::args().nth(1).ok_or("dir")?);
    let which: Vec<String> = std::env::args().skip(2).collect();
    let ckpt = tensora_format::open(&dir)?;
    let paths: Vec<PathBuf> = ckpt.files().iter().map(|f| f.path().to_owned()).collect();
    let lens: Vec<u64> = ckpt.files().iter().map(|f| f.len_bytes()).collect();
    let total: u64 = lens.iter().sum();
    let mut reused = Arena::with_len(direct_roofline_arena_bytes(&lens))?;
    let cfg = DirectRooflineConfig { queue_depth: 32, block_bytes: 8 << 20 };
    let warm = std::env::var_os("WARM").is_some();
    let rounds: usize = std::env::var("ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(2);
    for round in 0..rounds {
        for w in &which {
            if !warm {
                drop_caches_global()?;
            }
            let t = Instant::now();
            let what = match w.as_str() {
                "roof-reused" => { direct_read_roofline(&paths, cfg, &mut reused)?; "".to_string() }
                "pread-fresh" => {
                    let mut a = Arena::with_len(total)?;
                    let bytes = a.as_mut_slice();
                    let mut at = 0usize;
                    for p in &paths {
                        let f = std::fs::File::open(p)?;
                        let len = f.metadata()?.len() as usize;
                        let dst = &mut bytes[at..at + len];
                        std::thread::scope(|s| {
                            let (a, b) = dst.split_at_mut(len / 2 / (8 << 20) * (8 << 20));
                            let f = &f;
                            s.spawn(move || for (k, c) in a.chunks_mut(8 << 20).enumerate() { std::os::unix::fs::FileExt::read_exact_at(f, c, (k * (8 << 20)) as u64).unwrap() });
                            let off = (len / 2 / (8 << 20) * (8 << 20)) as u64;
                            s.spawn(move || for (k, c) in b.chunks_mut(8 << 20).enumerate() { std::os::unix::fs::FileExt::read_exact_at(f, c, off + (k * (8 << 20)) as u64).unwrap() });
                        });
                        at += len;
                    }
                    "".into()
                }
                "roof-fresh" => { let mut a = Arena::with_len(direct_roofline_arena_bytes(&lens))?; direct_read_roofline(&paths, cfg, &mut a)?; "".into() }
                spec => {
                    // backend:threads:qd:chunkMiB:budgetMiB:mode
                    let p: Vec<&str> = spec.split(':').collect();
                    let opts = LoadOptions {
                        backend: if p[0] == "auto" { BackendChoice::Auto } else { BackendChoice::Named(p[0].into()) },
                        threads: p[1].parse()?, queue_depth: p[2].parse()?, chunk_bytes: p[3].parse::<u64>()? << 20,
                        budget_bytes: p[4].parse::<u64>()? << 20,
                        io_mode: match p[5] { "d" => IoMode::Direct, "b" => IoMode::Buffered, _ => IoMode::Auto },
                        ..LoadOptions::default()
                    };
                    let l = load(&ckpt, &opts)?;
                    let r = l.report();
                    format!("{} {} io {:.3}s", r.backend, r.io_mode, r.phases.io)
                }
            };
            let dt = t.elapsed().as_secs_f64();
            println!("round {round} {w:32} {:.2} GB/s {what}", total as f64 / dt / 1e9);
        }
    }
    Ok(())
}
