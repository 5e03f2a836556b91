//! `tensora load PATH`: load a checkpoint (or a selection of it) and report where the time went.
//!
//! Owned loads copy every selected tensor into one hugepage arena; `--stream` hands each tensor
//! out as it lands and recycles arena space within `--budget`. `--tp RANK/WORLD` loads one rank's
//! tensor-parallel share (`crate::tp`). `--json` prints the load report.

use std::io::Write;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context as _;
use tensora_format::Selection;
use tensora_io::{BackendChoice, IoMode, LoadOptions, LoadReport, Residence};

use crate::progress::{Progress, Show};
use crate::units::parse_bytes;

/// Load a checkpoint and report the backend, why it was chosen, and the time per phase.
#[derive(Debug, clap::Args)]
#[command(after_help = crate::remote::stores_help())]
pub struct Args {
    /// Checkpoint path: a .safetensors file, a directory of shards, or a ServerlessLLM directory;
    /// or a remote location (a URL of a store listed at the end of this help). Remote loads read ranged GETs of
    /// --chunk bytes (default 8 MiB; a load of fewer than 32 of them gets shorter ones, down to
    /// 1 MiB, unless --queue-depth is given); how many are in flight tunes itself (from 64,
    /// doubling while throughput grows, at most 128, 32 when streaming; "concurrency" in the
    /// report says where it settled and why) unless --queue-depth fixes it; --threads runtime
    /// threads drive them (default 2); --backend, --direct, --buffered, --mapped and
    /// --allow-sparse do not apply to them. Their --json report adds "requests", "url",
    /// "retry_seconds" and "open_requests", "open_retries", "open_retry_seconds" (what opening
    /// cost), and "retries" counts HTTP retries.
    pub path: std::path::PathBuf,
    /// I/O backend: auto, or one of sync, mmap, io-uring, async.
    #[arg(long, default_value = "auto")]
    pub backend: BackendChoice,
    /// Read with O_DIRECT (falls back to buffered where the filesystem refuses it).
    #[arg(long, conflicts_with = "buffered")]
    pub direct: bool,
    /// Read through the page cache.
    #[arg(long)]
    pub buffered: bool,
    /// Worker threads (default: CPU count, at most 8).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=256))]
    pub threads: Option<u64>,
    /// Reads in flight per worker (io_uring queue depth).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub queue_depth: Option<u32>,
    /// In-flight byte budget, e.g. 268435456, 256MiB, 1GiB, 512M (K/M/G/T = 1000-based,
    /// KiB/MiB/GiB/TiB = 1024-based; default 1 GiB). When streaming, also the bound on arena memory.
    #[arg(long, value_parser = parse_bytes)]
    pub budget: Option<u64>,
    /// Size of one read, e.g. 8MiB (units as for --budget).
    #[arg(long, value_parser = parse_bytes)]
    pub chunk: Option<u64>,
    /// Load only tensors whose name matches this glob (repeatable).
    #[arg(long = "select", value_name = "GLOB")]
    pub select: Vec<String>,
    /// Stream: hand out each tensor as soon as it lands, recycling memory within the budget. Not
    /// with --tp.
    #[arg(long, conflicts_with = "tp")]
    pub stream: bool,
    /// Deliver floating-point tensors as bf16, f16 or f32, each read converted as it lands into
    /// an owned arena at that dtype (integer and boolean tensors keep theirs). Not with --stream
    /// or --tp; with --mapped the tensors are an owned copy.
    #[arg(long, value_name = "bf16|f16|f32", conflicts_with_all = ["stream", "tp"])]
    pub dtype: Option<tensora_io::DtypeTarget>,
    /// Zero-copy: views into a private mapping of the files instead of an owned arena, every
    /// selected page read in. Only for files nothing truncates or rewrites while the load runs
    /// (truncation kills the process with SIGBUS). Not with --stream or --tp.
    #[arg(long, conflicts_with_all = ["stream", "tp"])]
    pub mapped: bool,
    /// Load files whose allocated size is far below their length (normally refused as a sign of an
    /// interrupted download).
    #[arg(long)]
    pub allow_sparse: bool,
    /// With an index and --select: parse only the shards the index says hold a selected tensor
    /// (a one-expert load of a 163-shard MoE checkpoint reads a handful of headers). Not strict:
    /// the other shards are never opened, so a missing or corrupt one goes unnoticed; the load
    /// says so in a warning (stderr, and `warnings` in --json).
    #[arg(long, requires = "select")]
    pub lazy_index: bool,
    /// Verify every tensor against this manifest (`tensora hash --write-manifest`) as its bytes
    /// land, inside the load (crc32c manifests digest each piece on the worker that read it). The
    /// first tensor that does not match stops the load: exit 1 with an error naming the tensor,
    /// its file and its offset. Every tensor of the checkpoint must be in the manifest. Not with
    /// --tp (a manifest's digests cover whole tensors).
    #[arg(long, value_name = "MANIFEST", conflicts_with = "tp")]
    pub manifest: Option<std::path::PathBuf>,
    /// Print the load report as JSON. With --tp, "bytes_selected" counts the share's bytes,
    /// "bytes_read" what was read for them, and "slices" how many tensors were read as one range
    /// ("contiguous"; "inner_contiguous" of them slices of an inner dimension), row by row
    /// ("strided") or as one covering range narrowed in memory ("covering").
    #[arg(long)]
    pub json: bool,
    /// --tp and --rules: the load is owned, each slice contiguous in one arena; with --select,
    /// --lazy-index, --backend, --direct/--buffered and remote locations, not with --stream,
    /// --mapped, --dtype or --manifest. `inspect PATH --tp` shows how it would read each tensor.
    #[command(flatten)]
    pub tp: crate::tp::TpArgs,
    #[command(flatten)]
    pub remote: crate::remote::RemoteArgs,
}

/// The promise behind `--mapped`: the user asked for views of files that, as its help says, nothing
/// truncates or rewrites while the load runs.
#[allow(unsafe_code)]
fn views_requested() -> tensora_io::FilesUnchanged {
    // SAFETY: the caller of `tensora load --mapped` states this (the flag's help); the process
    // exits after the load, so the views live only as long as the command.
    unsafe { tensora_io::FilesUnchanged::promise() }
}

/// Run the subcommand. Exit code 0 on success; errors are returned (and printed by `main`).
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    if let Some(location) = crate::remote::location(&args.path)? {
        return run_remote(&args, &location);
    }
    let t = Instant::now();
    // The format error names the path already.
    let ckpt = if args.lazy_index {
        let shards = tensora_format::Shards::Selected(Selection::Glob(args.select.clone()));
        tensora_format::open_with(&args.path, &tensora_format::OpenOptions { shards, ..Default::default() })?
    } else {
        tensora_format::open(&args.path)?
    };
    let parse_seconds = t.elapsed().as_secs_f64();
    crate::output::print_warnings(&ckpt);

    let mut opts = LoadOptions {
        backend: args.backend.clone(),
        io_mode: io_mode(args.direct, args.buffered),
        residence: if args.mapped { Residence::Mapped(views_requested()) } else { Residence::Owned },
        allow_sparse: args.allow_sparse,
        ..LoadOptions::default()
    };
    if let Some(n) = args.threads {
        opts.threads = usize::try_from(n).context("--threads")?;
    }
    if let Some(q) = args.queue_depth {
        opts.queue_depth = q;
    }
    if let Some(c) = args.chunk {
        opts.chunk_bytes = c;
    }
    verify_against_manifest(&args, &ckpt, &mut opts)?;
    let progress = common_options(&args, &mut opts)?;

    let mut report = if args.stream {
        let mut delivered: u64 = 0;
        tensora_io::load_streaming(&ckpt, &opts, |t| {
            // A consumer would hand the bytes on here; touch them so the work is real.
            delivered = delivered.wrapping_add(t.bytes().first().copied().map_or(0, u64::from));
            Ok(())
        })
        .with_context(|| format!("cannot load {}", crate::remote::shown(&args.path)))?
    } else {
        let loaded = tensora_io::load(&ckpt, &opts)
            .with_context(|| format!("cannot load {}", crate::remote::shown(&args.path)))?;
        loaded.report().clone()
    };
    progress.finish();
    report.phases.parse = parse_seconds;
    report.finalize();

    crate::output::written(print(&args, &report, ckpt.warnings()))?;
    Ok(ExitCode::SUCCESS)
}

/// The I/O mode `--direct` and `--buffered` (which clap keeps apart) ask for: `Auto` without them.
pub fn io_mode(direct: bool, buffered: bool) -> IoMode {
    match (direct, buffered) {
        (true, _) => IoMode::Direct,
        (_, true) => IoMode::Buffered,
        _ => IoMode::Auto,
    }
}

/// `--manifest`: read it and install its check ([`tensora_verify::ManifestCheck`]) on
/// `opts`, so every tensor is checked as it lands.
fn verify_against_manifest(
    args: &Args,
    ckpt: &tensora_format::Checkpoint,
    opts: &mut LoadOptions,
) -> anyhow::Result<()> {
    let Some(path) = &args.manifest else { return Ok(()) };
    // Its errors name the file.
    let manifest = tensora_verify::Manifest::read(path).context("cannot read the manifest")?;
    let check = tensora_verify::ManifestCheck::new(ckpt, &manifest).with_context(|| {
        format!("manifest {} does not describe {}", path.display(), crate::remote::shown(&args.path))
    })?;
    check.install(opts);
    Ok(())
}

/// Selection, share, budget, dtype and the progress bar: the options local and remote loads share.
fn common_options(args: &Args, opts: &mut LoadOptions) -> anyhow::Result<Progress> {
    if !args.select.is_empty() {
        opts.selection = Selection::Glob(args.select.clone());
    }
    opts.shard = args.tp.shard()?;
    if let Some(b) = args.budget {
        opts.budget_bytes = b;
    }
    if let Some(dtype) = args.dtype {
        opts.dtype = dtype;
    }
    // `--json` output is for a machine: no bar even on a terminal.
    let show = if args.json { Show::Never } else { Show::OnTerminal };
    let progress = Progress::new(show, "loading", 0);
    opts.progress = progress.hook();
    Ok(progress)
}

/// `tensora load URL`: open the remote checkpoint and load it through `tensora_remote`.
fn run_remote(args: &Args, location: &tensora_remote::Location) -> anyhow::Result<ExitCode> {
    let local_only = [
        (!matches!(args.backend, BackendChoice::Auto), "--backend"),
        (args.direct, "--direct"),
        (args.buffered, "--buffered"),
        (args.mapped, "--mapped"),
        (args.allow_sparse, "--allow-sparse"),
        (args.lazy_index, "--lazy-index"),
    ];
    if let Some((_, flag)) = local_only.iter().find(|(set, _)| *set) {
        anyhow::bail!("{flag} does not apply to a remote location ({})", crate::remote::shown(&args.path));
    }
    let mut remote_opts = args.remote.options();
    if let Some(c) = args.chunk {
        remote_opts.chunk_bytes = c;
    }
    if let Some(q) = args.queue_depth {
        remote_opts.reads_inflight_max = usize::try_from(q).context("--queue-depth")?;
        remote_opts.tuning = tensora_remote::Tuning::Fixed;
    }
    if let Some(n) = args.threads {
        remote_opts.runtime_threads = usize::try_from(n).context("--threads")?;
    }
    if let Some(b) = args.budget {
        // A budget given is the stream's window, whatever the default for remote streams.
        remote_opts.streamed_bytes_max = b;
    }
    let checkpoint = crate::remote::open(location, &remote_opts)?;
    let mut opts = LoadOptions::default();
    verify_against_manifest(args, checkpoint.checkpoint(), &mut opts)?;
    let progress = common_options(args, &mut opts)?;
    let context = || format!("cannot load {}", crate::remote::shown(&args.path));
    let report = if args.stream {
        let mut delivered: u64 = 0;
        checkpoint
            .load_streaming(&opts, |t| {
                delivered = delivered.wrapping_add(t.bytes().first().copied().map_or(0, u64::from));
                Ok(())
            })
            .with_context(context)?
    } else {
        // The model is in memory when `load` returns; a cache's copies are made durable behind
        // it, and this command waits for that before it reports (and exits).
        checkpoint.load(&opts).with_context(context)?.wait_cache().clone()
    };
    progress.finish();
    let printed = (|| {
        let mut out = std::io::stdout().lock();
        if args.json {
            let value = with_warnings(serde_json::to_value(&report)?, checkpoint.checkpoint().warnings());
            serde_json::to_writer_pretty(&mut out, &value)?;
            writeln!(out)?;
        } else {
            writeln!(out, "location     {}", report.url)?;
            write_text(&mut out, &report.load, &args.tp)?;
            writeln!(
                out,
                "requests     {} ({} retries, {:.3} s retrying); opening: {} ({} retries)",
                report.requests,
                report.load.retries,
                report.retry_seconds,
                report.open_requests,
                report.open_retries
            )?;
            if let Some(c) = &report.cache {
                writeln!(
                    out,
                    "cache        {}: {} bytes read from it, {} written ({:.3} s of the load waiting for the disk after the last range), {} objects completed ({:.3} s making them durable after the load), {} loaded as local files",
                    c.dir,
                    c.hit_bytes,
                    c.written_bytes,
                    c.disk_tail_seconds,
                    c.promoted,
                    c.sync_seconds,
                    c.local_objects
                )?;
                if c.changed_bytes > 0 {
                    writeln!(
                        out,
                        "cache        {} bytes changed in memory before they reached the disk: left out of the copy, fetched again next time",
                        c.changed_bytes
                    )?;
                }
            }
        }
        out.flush()
    })();
    crate::output::written(printed)?;
    Ok(ExitCode::SUCCESS)
}

/// The report on stdout; with `--json`, the parser's warnings (already on stderr) in `warnings`.
fn print(args: &Args, report: &LoadReport, warnings: &[tensora_format::Warning]) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &with_warnings(serde_json::to_value(report)?, warnings))?;
        writeln!(out)?;
    } else {
        write_text(&mut out, report, &args.tp)?;
    }
    out.flush()
}

/// A `--json` report object with the parser's warnings (already on stderr) added as `warnings`:
/// one `"PATH: message"` string each, an empty array when there are none.
fn with_warnings(mut value: serde_json::Value, warnings: &[tensora_format::Warning]) -> serde_json::Value {
    if let serde_json::Value::Object(fields) = &mut value {
        let texts = warnings
            .iter()
            .map(|w| serde_json::Value::String(format!("{}: {}", w.path.display(), w.message)))
            .collect();
        fields.insert("warnings".into(), serde_json::Value::Array(texts));
    }
    value
}

/// The report as text; with `--tp`, the share and how its slices were read.
fn write_text(out: &mut impl Write, r: &LoadReport, tp: &crate::tp::TpArgs) -> std::io::Result<()> {
    writeln!(out, "backend      {} ({})", r.backend, r.io_mode)?;
    writeln!(out, "reason       {}", r.reason)?;
    writeln!(out, "tensors      {} from {} file(s), {} window(s)", r.tensors, r.files, r.windows)?;
    if let Some(share) = tp.described() {
        writeln!(out, "share        {share}")?;
        write!(out, "slices       {}", crate::tp::slice_counts(&r.slices))?;
        if r.slices.inner_contiguous > 0 {
            write!(out, " ({} of them inner-dimension slices read as one range)", r.slices.inner_contiguous)?;
        }
        writeln!(out)?;
    }
    write!(out, "bytes        {} selected, {} read", r.bytes_selected, r.bytes_read)?;
    if let Some(ratio) = tp.tp.and(crate::tp::read_per_selected(r.bytes_read, r.bytes_selected)) {
        write!(out, " ({ratio:.3}x the selected)")?;
    }
    if r.bytes_advised_beyond_reads > 0 {
        write!(out, ", {} of gaps between reads advised to the device", r.bytes_advised_beyond_reads)?;
    }
    writeln!(out)?;
    writeln!(out, "time         {:.3} s, {:.2} GB/s", r.seconds, r.gbps)?;
    let p = r.phases;
    writeln!(
        out,
        "phases       open {:.3} s, parse {:.3} s, plan {:.3} s, io {:.3} s, finish {:.3} s",
        p.open, p.parse, p.plan, p.io, p.finish
    )?;
    writeln!(out, "inflight     peak {} bytes, {} retries", r.peak_inflight_bytes, r.retries)?;
    writeln!(out, "faults       {} minor, {} major", r.minor_faults, r.major_faults)?;
    if let Some(c) = &r.cast {
        writeln!(
            out,
            "cast         {} tensor(s) to {} ({} bytes in, {} out, {:.3} s converting, {}), {} kept",
            c.tensors.len(),
            c.to,
            c.bytes_in,
            c.bytes_out,
            c.seconds,
            c.simd,
            c.kept
        )?;
    }
    writeln!(out, "peak rss     {} bytes", r.peak_rss_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--backend` as clap parses it, through `BackendChoice`'s `FromStr`.
    fn parse_backend(name: &str) -> Result<BackendChoice, String> {
        use clap::Parser as _;
        match crate::Cli::try_parse_from(["tensora", "load", "m.safetensors", "--backend", name]) {
            Ok(crate::Cli { command: crate::Command::Load(args) }) => Ok(args.backend),
            Ok(other) => Err(format!("not a load: {other:?}")),
            Err(e) => Err(e.to_string()),
        }
    }

    #[test]
    fn backend_names_are_checked() {
        assert!(parse_backend("auto").is_ok());
        assert!(parse_backend("sync").is_ok());
        assert!(parse_backend("io-uring").is_ok());
        assert!(parse_backend("floppy").unwrap_err().contains("sync"));
        assert!(matches!(parse_backend("auto"), Ok(BackendChoice::Auto)));
        assert!(matches!(parse_backend("mmap"), Ok(BackendChoice::Named(n)) if n == "mmap"));
    }

    #[test]
    fn dtype_names_are_checked() {
        use clap::Parser as _;
        let parse = |dtype: &str| match crate::Cli::try_parse_from(["tensora", "load", "m", "--dtype", dtype])
        {
            Ok(crate::Cli { command: crate::Command::Load(args) }) => Ok(args.dtype),
            Ok(other) => Err(format!("not a load: {other:?}")),
            Err(e) => Err(e.to_string()),
        };
        assert_eq!(parse("bf16"), Ok(Some(tensora_io::DtypeTarget::BF16)));
        assert_eq!(parse("f32"), Ok(Some(tensora_io::DtypeTarget::F32)));
        assert!(parse("f64").unwrap_err().contains("bf16, f16, f32"));
    }

    #[test]
    fn the_text_report_names_the_gap_bytes_advised_only_when_there_are_some() {
        let text = |advised: u64| {
            let r = LoadReport {
                bytes_selected: 512,
                bytes_read: 512,
                bytes_advised_beyond_reads: advised,
                ..LoadReport::default()
            };
            let mut out = Vec::new();
            write_text(&mut out, &r, &crate::tp::TpArgs { tp: None, rules: None }).unwrap();
            String::from_utf8(out).unwrap()
        };
        assert!(text(0).contains("bytes        512 selected, 512 read\n"), "{}", text(0));
        let cold = text(8192);
        assert!(
            cold.contains(
                "bytes        512 selected, 512 read, 8192 of gaps between reads advised to the device\n"
            ),
            "{cold}"
        );
    }
}
