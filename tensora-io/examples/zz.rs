use std::time::Instant;
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let ckpt = tensora_format::open(&args[1]).unwrap();
    let budget: u64 = args[2].parse().unwrap();
    let recycle = args[3] == "recycle";
    let reuse = if recycle { tensora_io::ArenaReuse::Recycle } else { tensora_io::ArenaReuse::Fresh };
    let opts = tensora_io::LoadOptions { budget_bytes: budget, arena_reuse: reuse, ..Default::default() };
    let t = Instant::now();
    let mut keep = Vec::new();
    let mut io = 0.0;
    let mut faults = 0;
    for run in tensora_io::load_runs(&ckpt, &opts).unwrap() {
        let run = run.unwrap();
        io += run.report().phases.io;
        faults += run.report().minor_faults;
        if !recycle {
            keep.push(run);
        }
    }
    let s = t.elapsed().as_secs_f64();
    println!("{} {:.2} GB/s io {:.3} faults {}", args[3], 2.2 / s, io, faults);
}
