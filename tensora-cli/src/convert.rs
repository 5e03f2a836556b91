//! `tensora convert SRC DST --to serverlessllm|safetensors`: stream a checkpoint into another
//! layout through a bounded buffer, atomically (a failed conversion leaves no DST).

use std::path::PathBuf;
use std::process::ExitCode;

use tensora_convert::{COPY_BUFFER_BYTES_DEFAULT, ConvertConfig, ConvertReport, TargetFormat};

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
    /// Copy buffer size in bytes (units as above; at most 256 MiB). Default 64 MiB.
    #[arg(long, value_parser = parse_bytes)]
    pub buffer_bytes: Option<u64>,
    /// Print the conversion report as JSON on stdout.
    #[arg(long)]
    pub json: bool,
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
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_summary(&report);
    }
    Ok(ExitCode::SUCCESS)
}

fn print_summary(r: &ConvertReport) {
    println!(
        "converted {} tensors ({} tied) from {} to {}: {} bytes copied, {} files, {} bytes written, \
         {:.3} s ({:.2} GB/s), peak RSS {} MiB -> {}",
        r.tensors,
        r.tied_tensors,
        r.from,
        r.to,
        r.bytes_copied,
        r.files_written,
        r.bytes_written,
        r.seconds,
        r.gbps,
        r.peak_rss_bytes >> 20,
        r.destination.display()
    );
}
