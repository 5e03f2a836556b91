//! `tensora convert SRC DST --to serverlessllm|safetensors`: stream a checkpoint into another
//! layout through `tensora_convert`'s save writer, atomically (a failed conversion leaves no
//! DST), optionally writing the destination's manifest from digests computed while writing.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use tensora_convert::WriteChoice;
use tensora_convert::{COPY_BUFFER_BYTES_DEFAULT, ConvertConfig, ConvertReport, TargetFormat};
use tensora_verify::Algo;

use crate::progress::{Progress, Show};
use crate::units::parse_bytes;

/// The layout to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum To {
    /// sllm-store layout: tensor_index.json + tensor.data_N.
    Serverlessllm,
    /// HF-compatible safetensors (sharded with an index when --shard-bytes is given).
    Safetensors,
}

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Source checkpoint: a .safetensors file, a sharded directory, or a ServerlessLLM directory.
    pub src: PathBuf,
    /// Destination; must not exist. A directory, or a single `.safetensors` file when converting
    /// to unsharded safetensors.
    pub dst: PathBuf,
    /// Output layout.
    #[arg(long, value_enum)]
    pub to: To,
    /// ServerlessLLM partition cap in bytes, e.g. 10GiB (K/M/G/T = 1000-based, KiB/MiB/GiB/TiB =
    /// 1024-based). Default 10 GiB.
    #[arg(long, value_parser = parse_bytes)]
    pub partition_bytes: Option<u64>,
    /// Safetensors shard cap in bytes (suffixes as above); writes shards plus
    /// model.safetensors.index.json.
    #[arg(long, value_parser = parse_bytes)]
    pub shard_bytes: Option<u64>,
    /// Largest storage of a non-contiguous tensor gathered into row-major order (units as above;
    /// at most 256 MiB). Default 64 MiB.
    #[arg(long, value_parser = parse_bytes)]
    pub buffer_bytes: Option<u64>,
    /// Write with O_DIRECT (buffered where the filesystem refuses it; the report says why).
    #[arg(long, conflicts_with = "buffered")]
    pub direct: bool,
    /// Write through the page cache. Default: chosen from the destination's filesystem and size.
    #[arg(long)]
    pub buffered: bool,
    /// Writer threads (default: 8 for direct writes, the CPU count for buffered ones).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Also write the destination's manifest (digests computed while writing, file sizes,
    /// format) to FILE, atomically: what `tensora verify DST --manifest FILE` checks.
    #[arg(long, value_name = "FILE")]
    pub write_manifest: Option<PathBuf>,
    /// Digest algorithm of --write-manifest: crc32c (default), xxh3 or sha256.
    #[arg(long, default_value = "crc32c", value_parser = parse_algo, requires = "write_manifest")]
    pub algo: Algo,
    /// Print the conversion report as JSON on stdout (seconds, gbps, the write mode and why).
    #[arg(long)]
    pub json: bool,
}

fn parse_algo(s: &str) -> Result<Algo, String> {
    s.parse::<Algo>().map_err(|e| e.to_string())
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    if args.to == To::Serverlessllm && args.shard_bytes.is_some() {
        anyhow::bail!("--shard-bytes applies to --to safetensors");
    }
    if args.to == To::Safetensors && args.partition_bytes.is_some() {
        anyhow::bail!("--partition-bytes applies to --to serverlessllm");
    }
    // The format error names the path already.
    let src = tensora_format::open(&args.src)?;
    let mut cfg = ConvertConfig {
        to: match args.to {
            To::Serverlessllm => TargetFormat::ServerlessLlm,
            To::Safetensors => TargetFormat::Safetensors,
        },
        shard_bytes_max: args.shard_bytes,
        buffer_bytes: COPY_BUFFER_BYTES_DEFAULT,
        mode: match (args.direct, args.buffered) {
            (true, _) => WriteChoice::Direct,
            (_, true) => WriteChoice::Buffered,
            _ => WriteChoice::Auto,
        },
        threads: args.threads.unwrap_or(0),
        manifest: args.write_manifest.as_ref().map(|_| args.algo),
        ..ConvertConfig::default()
    };
    if let Some(p) = args.partition_bytes {
        cfg.partition_bytes_max = p;
    }
    if let Some(b) = args.buffer_bytes {
        cfg.buffer_bytes = usize::try_from(b).unwrap_or(usize::MAX);
    }
    let progress = Progress::new(Show::OnTerminal, "converting", 0);
    cfg.progress = progress.hook();
    let result = tensora_convert::convert(&src, &args.dst, &cfg);
    progress.finish();
    let report = result?;
    // The manifest first: it is a durable result, and must not depend on stdout's reader.
    if let (Some(path), Some(manifest)) = (&args.write_manifest, &report.manifest) {
        manifest.write_atomic(path).with_context(|| format!("writing manifest {}", path.display()))?;
    }
    crate::output::written(print(&args, &report))?;
    Ok(ExitCode::SUCCESS)
}

fn print(args: &Args, report: &ConvertReport) -> std::io::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if args.json {
        let mut doc = serde_json::to_value(report)?;
        if let Some(path) = &args.write_manifest {
            doc["manifest"] = serde_json::Value::from(path.display().to_string());
        }
        serde_json::to_writer_pretty(&mut out, &doc)?;
        writeln!(out)?;
    } else {
        writeln!(out, "{}", summary(report))?;
    }
    out.flush()
}

fn summary(r: &ConvertReport) -> String {
    format!(
        "converted {} tensors ({} tied) from {} to {}: {} bytes copied, {} files, {} bytes written, \
         {:.3} s ({:.2} GB/s, {} writes, {} threads), peak RSS {} MiB -> {}",
        r.tensors,
        r.tied_tensors,
        r.from,
        r.to,
        r.bytes_copied,
        r.files_written,
        r.bytes_written,
        r.seconds,
        r.gbps,
        r.mode,
        r.threads,
        r.peak_rss_bytes >> 20,
        r.destination.display()
    )
}
