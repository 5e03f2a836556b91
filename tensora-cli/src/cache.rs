//! `tensora cache ls|rm|verify DIR`: the verified local cache of remote loads (`--cache DIR`).
//! Every check and removal is a `tensora_remote::Cache` call; this file only prints.

use std::io::Write;
use std::process::ExitCode;

use tensora_remote::{Cache, CacheOptions};

/// Inspect, clear or check a cache directory made by `--cache DIR`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub action: Action,
}

/// What to do with the cache.
#[derive(Debug, clap::Subcommand)]
pub enum Action {
    /// List the cached objects: URL, version, size, how much is cached, complete or partial.
    Ls {
        /// The cache directory.
        dir: std::path::PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Remove cached objects that no running load holds.
    Rm {
        /// The cache directory.
        dir: std::path::PathBuf,
        /// Only objects whose URL starts with this (default: every object).
        #[arg(long, value_name = "URL")]
        url: Option<String>,
    },
    /// Check every cached range against the CRC-32C recorded when it arrived (exit 1 if one
    /// differs). To check cached tensors against a manifest, `tensora verify URL --cache DIR
    /// --manifest FILE` reads them from the cache.
    Verify {
        /// The cache directory.
        dir: std::path::PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

fn open(dir: &std::path::Path) -> anyhow::Result<Cache> {
    if !dir.is_dir() {
        anyhow::bail!("{} is not a cache directory", dir.display());
    }
    Ok(Cache::open(&CacheOptions {
        dir: dir.to_path_buf(),
        size_max_bytes: None,
        offline: true,
        writes: tensora_remote::CacheWrites::default(),
    })?)
}

/// Run the subcommand. Exit code 0 on success, 1 when `verify` finds a damaged range.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let mut out = std::io::stdout().lock();
    let code = match args.action {
        Action::Ls { dir, json } => {
            let objects = open(&dir)?.list();
            let printed = if json {
                serde_json::to_writer_pretty(&mut out, &objects)
                    .map_err(std::io::Error::other)
                    .and_then(|()| writeln!(out))
            } else {
                objects.iter().try_for_each(|o| {
                    let state = if o.complete { "complete" } else { "partial" };
                    writeln!(
                        out,
                        "{}  {}  {state}  {}/{} bytes  {}",
                        o.key, o.url, o.cached_bytes, o.size_bytes, o.version
                    )
                })
            };
            crate::output::written(printed)?;
            ExitCode::SUCCESS
        }
        Action::Rm { dir, url } => {
            let (removed, busy) = open(&dir)?.remove(url.as_deref());
            crate::output::written(writeln!(
                out,
                "removed {} objects; {} held by a running load",
                removed.len(),
                busy.len()
            ))?;
            ExitCode::SUCCESS
        }
        Action::Verify { dir, json } => {
            let checked = open(&dir)?.verify();
            let damaged = checked.iter().filter(|(_, bad)| !bad.is_empty()).count();
            let printed = if json {
                let doc: Vec<_> = checked
                    .iter()
                    .map(|(o, bad)| {
                        let bad: Vec<_> =
                            bad.iter().map(|r| serde_json::json!({"offset": r.offset_bytes, "len": r.len_bytes})).collect();
                        serde_json::json!({"key": o.key, "url": o.url, "complete": o.complete, "bad_ranges": bad})
                    })
                    .collect();
                serde_json::to_writer_pretty(&mut out, &doc)
                    .map_err(std::io::Error::other)
                    .and_then(|()| writeln!(out))
            } else {
                checked
                    .iter()
                    .filter(|(_, bad)| !bad.is_empty())
                    .try_for_each(|(o, bad)| {
                        let first = bad[0];
                        writeln!(
                            out,
                            "error: {} ({}): {} damaged ranges, the first at bytes {}..+{}",
                            o.url,
                            o.key,
                            bad.len(),
                            first.offset_bytes,
                            first.len_bytes
                        )
                    })
                    .and_then(|()| {
                        writeln!(
                            out,
                            "{}: {} objects checked, {damaged} damaged",
                            if damaged == 0 { "OK" } else { "FAILED" },
                            checked.len()
                        )
                    })
            };
            crate::output::written(printed)?;
            if damaged == 0 { ExitCode::SUCCESS } else { ExitCode::from(1) }
        }
    };
    Ok(code)
}
