//! `tensora`: inspect, load, convert, hash and verify checkpoints.
//!
//! Exit status is 0 on success and 1 on any error, with one line on stderr starting `error:`.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod convert;
mod hash;
mod inspect;
mod load;
mod verify;

#[derive(Debug, Parser)]
#[command(
    name = "tensora",
    version,
    about = "Load large-model checkpoints as fast as the disk and memory allow"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print a checkpoint's format, files, tensors and metadata.
    Inspect(inspect::Args),
    /// Load a checkpoint (or a selection of it) and report where the time went.
    Load(load::Args),
    /// Convert between safetensors and the ServerlessLLM layout.
    Convert(convert::Args),
    /// Compute per-tensor digests.
    Hash(hash::Args),
    /// Check structure, file integrity and digests.
    Verify(verify::Args),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // --help and --version are not errors.
            let code = if e.use_stderr() { 1 } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    let result = match cli.command {
        Command::Inspect(args) => inspect::run(args),
        Command::Load(args) => load::run(args),
        Command::Convert(args) => convert::run(args),
        Command::Hash(args) => hash::run(args),
        Command::Verify(args) => verify::run(args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            let msg = format!("{e:#}").replace('\n', " ");
            eprintln!("error: {msg}");
            ExitCode::from(1)
        }
    }
}
