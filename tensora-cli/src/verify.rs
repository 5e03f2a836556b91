//! `tensora verify`: structure, file integrity, digests against a manifest, cross-backend agreement.
//!
//! Prints every finding, one per line, then a one-line summary as the last line; with `--json`,
//! the report as one JSON document and then the same summary line, so the last line of stdout is
//! always the summary. Exit status 0 when there are no errors (warnings allowed); 1 otherwise,
//! with one `error:` line on stderr.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use tensora_verify::Manifest;
use tensora_verify::ScanConfig;
use tensora_verify::{VerifyOptions, verify_path};

#[derive(Debug, clap::Args)]
#[command(after_help = crate::remote::stores_help())]
pub struct Args {
    /// Checkpoint path: a .safetensors file, a sharded directory or a ServerlessLLM directory; or a
    /// remote location (a URL of one of the stores listed at the end of this help). A remote location is checked
    /// for structure (every header and index valid) and, with --manifest, object sizes and tensor
    /// digests from a streamed load; the local file-integrity checks (sparse files, readability
    /// to EOF, files changed on disk) and --cross-check do not apply to it.
    pub path: PathBuf,
    /// Manifest written by `tensora hash --write-manifest` (or any `{"tensors": ...}` document
    /// with digests) to compare file sizes and tensor digests with.
    #[arg(long, value_name = "FILE")]
    pub manifest: Option<PathBuf>,
    /// Also load the checkpoint with every available backend and require identical digests.
    #[arg(long)]
    pub cross_check: bool,
    /// Print the report as one JSON document, followed by the one-line summary as the last line
    /// (parse stdout without its last line, or read the JSON's "summary" field).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub remote: crate::remote::RemoteArgs,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let manifest = match &args.manifest {
        // Its errors name the file.
        Some(p) => Some(Manifest::read(p)?),
        None => None,
    };
    let report = match crate::remote::location(&args.path)? {
        Some(location) => {
            if args.cross_check {
                anyhow::bail!(
                    "--cross-check does not apply to a remote location ({})",
                    crate::remote::shown(&args.path)
                );
            }
            tensora_remote::verify(&location, &args.remote.options(), manifest.as_ref())
        }
        None => {
            let cross = tensora_verify::cross_check;
            let opts = VerifyOptions {
                manifest: manifest.as_ref(),
                cross_check: if args.cross_check { Some(&cross) } else { None },
                scan: ScanConfig::default(),
            };
            verify_path(&args.path, &opts)
        }
    };

    // A reader that left early (`| head`) does not change the verdict.
    crate::output::written(print(&args, &report))?;
    if report.is_clean() {
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!(
            "error: {}: verification failed with {} errors",
            crate::remote::shown(&args.path),
            report.errors()
        );
        Ok(ExitCode::from(1))
    }
}

fn print(args: &Args, report: &tensora_verify::Report) -> std::io::Result<()> {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &report.to_json())?;
        writeln!(out)?;
    } else {
        for f in &report.findings {
            writeln!(out, "{f}")?;
        }
    }
    writeln!(out, "{}", report.summary_line())?;
    out.flush()
}
