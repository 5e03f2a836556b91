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

/// What is damaged in one object, in one line.
fn damage_line(v: &tensora_remote::VerifiedObject) -> String {
    let o = &v.object;
    let ranges = match v.bad_ranges.first() {
        Some(first) => format!(
            "{} damaged ranges, the first at bytes {}..+{}",
            v.bad_ranges.len(),
            first.offset_bytes,
            first.len_bytes
        ),
        None => "no damaged range".to_owned(),
    };
    format!("{} ({}): {ranges}; {} damaged range log records", o.url, o.key, v.bad_log_records)
}

/// Run the subcommand. A damaged range or range log record found by `verify` is an error.
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
            let damaged: Vec<_> = checked.iter().filter(|v| v.is_damaged()).collect();
            let printed = if json {
                let doc: Vec<_> = checked
                    .iter()
                    .map(|v| {
                        let bad: Vec<_> = v
                            .bad_ranges
                            .iter()
                            .map(|r| serde_json::json!({"offset": r.offset_bytes, "len": r.len_bytes}))
                            .collect();
                        let o = &v.object;
                        serde_json::json!({"key": o.key, "url": o.url, "complete": o.complete,
                            "bad_ranges": bad, "bad_log_records": v.bad_log_records})
                    })
                    .collect();
                serde_json::to_writer_pretty(&mut out, &doc)
                    .map_err(std::io::Error::other)
                    .and_then(|()| writeln!(out))
            } else {
                damaged.iter().try_for_each(|v| writeln!(out, "{}", damage_line(v))).and_then(|()| {
                    writeln!(out, "{} objects checked, {} damaged", checked.len(), damaged.len())
                })
            };
            crate::output::written(printed)?;
            if let Some(first) = damaged.first() {
                // The one `error:` line on stderr (main prints it), like every other failure.
                anyhow::bail!(
                    "{} of {} cached objects damaged; the first: {}",
                    damaged.len(),
                    checked.len(),
                    damage_line(first)
                );
            }
            ExitCode::SUCCESS
        }
    };
    Ok(code)
}
