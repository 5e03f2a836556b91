//! Time a mapped load: parse the header(s), map each file privately, read every selected page in
//! and hand out views (warm files: a page-table fill, no copy).
//!
//! `cargo run --release -p tensora-io --example open_mapped -- FILE [RUNS]` prints the median, min
//! and max over RUNS opens in one process (default 50), after one warm-up.

use std::path::PathBuf;
use std::time::Instant;

use tensora_io::{FilesUnchanged, LoadOptions, Residence, load_path};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = PathBuf::from(args.next().ok_or("usage: open_mapped FILE [RUNS]")?);
    let runs: usize = args.next().map(|r| r.parse()).transpose()?.unwrap_or(50).clamp(1, 10_000);
    // SAFETY: the file given on the command line is not modified or truncated while this runs.
    let promise = unsafe { FilesUnchanged::promise() };
    let opts = LoadOptions { residence: Residence::Mapped(promise), ..LoadOptions::default() };
    let mut seconds = Vec::with_capacity(runs);
    let mut tensors = 0;
    for i in 0..=runs {
        let t = Instant::now();
        let loaded = load_path(&path, &opts)?;
        let elapsed = t.elapsed().as_secs_f64();
        tensors = loaded.len();
        drop(loaded);
        if i > 0 {
            seconds.push(elapsed);
        }
    }
    seconds.sort_by(f64::total_cmp);
    let ms = |s: f64| s * 1e3;
    println!(
        "{}: {tensors} tensors, mapped open median {:.3} ms (min {:.3}, max {:.3}) over {runs} runs",
        path.display(),
        ms(seconds[seconds.len() / 2]),
        ms(seconds[0]),
        ms(seconds[seconds.len() - 1])
    );
    Ok(())
}
