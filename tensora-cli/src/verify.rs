//! `tensora verify`. PLACEHOLDER: replaced by the issue that builds this subcommand.

use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Checkpoint path.
    pub path: std::path::PathBuf,
}

pub fn run(_args: Args) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`tensora verify` is not built yet")
}
