//! `tensora convert SRC DST --to serverlessllm|safetensors`: stream a checkpoint into another
//! layout through a bounded buffer, atomically (a failed conversion leaves no DST).

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use tensora_io::convert::{
    COPY_BUFFER_BYTES_DEFAULT, ConvertConfig, ConvertProgress, ConvertReport, TargetFormat,
};

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
    /// ServerlessLLM partition cap in bytes (suffixes K, M, G, KiB, MiB, GiB). Default 10 GiB.
    #[arg(long, value_parser = parse_bytes)]
    pub partition_bytes: Option<u64>,
    /// Safetensors shard cap in bytes (suffixes as above); writes shards plus
    /// model.safetensors.index.json.
    #[arg(long, value_parser = parse_bytes)]
    pub shard_bytes: Option<u64>,
    /// Copy buffer size in bytes (at most 256 MiB). Default 64 MiB.
    #[arg(long, value_parser = parse_bytes)]
    pub buffer_bytes: Option<u64>,
    /// Print the conversion report as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Parse `123`, `64M`, `64MiB`, `10G`, `10GiB` (K/M/G are powers of 1000, KiB/MiB/GiB of 1024).
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let digits_end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, suffix) = s.split_at(digits_end);
    let n: u64 = digits.parse().map_err(|_| format!("{s:?} is not a byte count"))?;
    let scale: u64 = match suffix.trim() {
        "" | "B" => 1,
        "K" | "KB" => 1_000,
        "M" | "MB" => 1_000_000,
        "G" | "GB" => 1_000_000_000,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        other => return Err(format!("unknown size suffix {other:?}")),
    };
    n.checked_mul(scale).ok_or_else(|| format!("{s:?} overflows u64"))
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    if args.to == To::Serverlessllm && args.shard_bytes.is_some() {
        anyhow::bail!("--shard-bytes applies to --to safetensors");
    }
    if args.to == To::Safetensors && args.partition_bytes.is_some() {
        anyhow::bail!("--partition-bytes applies to --to serverlessllm");
    }
    let src = tensora_format::open(&args.src).with_context(|| format!("opening {}", args.src.display()))?;
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
    let bar = std::io::stderr().is_terminal().then(progress_bar);
    if let Some(bar) = &bar {
        let bar = bar.clone();
        let hook: ConvertProgress = Arc::new(move |done, total| {
            bar.set_length(total);
            bar.set_position(done);
        });
        cfg.progress = Some(hook);
    }
    let result = tensora_io::convert::convert(&src, &args.dst, &cfg);
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    let report = result?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_summary(&report);
    }
    Ok(ExitCode::SUCCESS)
}

fn progress_bar() -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(0);
    let style = indicatif::ProgressStyle::with_template(
        "{spinner} converting [{bar:40}] {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}",
    )
    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
    .progress_chars("=> ");
    bar.set_style(style);
    bar
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_byte_counts_with_suffixes() {
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("64MiB"), Ok(64 << 20));
        assert_eq!(parse_bytes("10G"), Ok(10_000_000_000));
        assert_eq!(parse_bytes("10GiB"), Ok(10 << 30));
        assert_eq!(parse_bytes("3 K"), Ok(3000));
        assert!(parse_bytes("").is_err());
        assert!(parse_bytes("12XB").is_err());
        assert!(parse_bytes("-1").is_err());
        assert!(parse_bytes("18446744073709551615GiB").is_err());
    }
}
