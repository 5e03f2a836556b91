//! `tensora`: inspect, load, convert, hash and verify checkpoints.
//!
//! Exit status is 0 on success and 1 on any error, with one line on stderr starting `error:`
//! (usage errors included; `--help` and `--version` print to stdout and exit 0).
// `unsafe` only for the promise behind `load --mapped` (`load::views_requested`).
#![deny(unsafe_code)]

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod cache;
mod convert;
mod hash;
mod inspect;
mod load;
mod output;
mod progress;
mod remote;
mod tp;
mod units;
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
    /// Print a checkpoint's format, files, tensors and metadata (with --tp: how a tensor-parallel
    /// rank's share of each tensor would be read).
    Inspect(inspect::Args),
    /// Load a checkpoint (or a selection of it, or a tensor-parallel rank's share) and report where
    /// the time went.
    Load(load::Args),
    /// Convert between safetensors and the ServerlessLLM layout.
    Convert(convert::Args),
    /// Compute per-tensor digests.
    Hash(hash::Args),
    /// Check structure, file integrity and digests.
    Verify(verify::Args),
    /// Inspect, clear or check the local cache of remote loads (--cache DIR).
    Cache(cache::Args),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // --help and --version are not errors: clap prints them as it likes.
        Err(e) if !e.use_stderr() => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("error: {}", usage_error_line(&e.render().to_string()));
            return ExitCode::from(1);
        }
    };
    let result = match cli.command {
        Command::Inspect(args) => inspect::run(args),
        Command::Load(args) => load::run(args),
        Command::Convert(args) => convert::run(args),
        Command::Hash(args) => hash::run(args),
        Command::Verify(args) => verify::run(args),
        Command::Cache(args) => cache::run(args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", error_line(e.chain().map(ToString::to_string)));
            ExitCode::from(1)
        }
    }
}

/// The one line for a usage error: the first paragraph of clap's message joined into one line
/// (the flag a "required arguments were not provided:" names, the possible values of a refused
/// one), without its own `error: ` prefix; the tip and usage paragraphs that follow are dropped
/// (`--help` has them). Clap quotes the argument it refused, which may be a URL: its password and
/// query values are redacted.
fn usage_error_line(rendered: &str) -> String {
    let lines = rendered.lines().map(str::trim).skip_while(|l| l.is_empty());
    let first = lines.take_while(|l| !l.is_empty()).collect::<Vec<_>>().join(" ");
    let first = first.strip_prefix("error:").map_or(first.as_str(), str::trim_start);
    tensora_remote::redact(if first.is_empty() { "invalid usage" } else { first })
}

/// An error and its causes as one line, `outer: cause: …`, leaving out a cause whose text the line
/// already holds (a `tensora_format::Error` shows its `io::Error` in its own message, and is its
/// source too). Every URL in it is redacted once more, whatever put it there, and control
/// characters (from a checkpoint's names or paths) are replaced ([`output::printable`]).
fn error_line(chain: impl Iterator<Item = String>) -> String {
    let mut line = String::new();
    for message in chain {
        let message = output::printable(&message.replace('\n', " "));
        if line.contains(message.as_str()) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&message);
    }
    tensora_remote::redact(&line)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cause_already_in_the_message_is_not_repeated() {
        let chain = ["x: I/O error: gone (os error 2)", "gone (os error 2)"].map(String::from);
        assert_eq!(error_line(chain.into_iter()), "x: I/O error: gone (os error 2)");
        let chain = ["cannot load m", "m: bad header", "bad\nheader"].map(String::from);
        assert_eq!(error_line(chain.into_iter()), "cannot load m: m: bad header");
        let chain = ["opening a", "a: truncated"].map(String::from);
        assert_eq!(error_line(chain.into_iter()), "opening a: a: truncated");
    }

    #[test]
    fn usage_errors_keep_only_their_first_line() {
        let rendered = "error: unexpected argument '--x' found\n\n  tip: ...\n\nUsage: tensora\n";
        assert_eq!(usage_error_line(rendered), "unexpected argument '--x' found");
        assert_eq!(usage_error_line(""), "invalid usage");
        assert_eq!(usage_error_line("\n\n"), "invalid usage");
    }

    /// What clap renders for a missing required flag or a value outside the possible ones: the
    /// flag, or the possible values, are on the lines after the first, and stay in the line.
    #[test]
    fn usage_errors_keep_the_flag_a_missing_argument_names_and_the_possible_values() {
        use clap::Parser as _;
        let line =
            |args: &[&str]| usage_error_line(&Cli::try_parse_from(args).unwrap_err().render().to_string());
        assert_eq!(
            line(&["tensora", "load", "m", "--rules", "qwen"]),
            "the following required arguments were not provided: --tp <RANK/WORLD>"
        );
        assert_eq!(
            line(&["tensora", "inspect", "m", "--tp", "0/2", "--rules", "gpt"]),
            "invalid value 'gpt' for '--rules <PRESET>' [possible values: llama, qwen, mixtral, deepseek]"
        );
    }

    /// A URL that clap quotes, or that a cause names as typed, shows with its secrets redacted;
    /// a control character (a terminal escape in a file name) is replaced.
    #[test]
    fn error_lines_redact_urls_and_replace_control_characters() {
        let rendered =
            "error: unexpected argument 'http://u:hunter2@h/m?sig=hunter2' found\n\nUsage: tensora\n";
        assert_eq!(usage_error_line(rendered), "unexpected argument 'http://u:***@h/m?sig=***' found");
        let chain =
            ["cannot load http://u:hunter2@h/m", "s3://b/k?X-Amz-Signature=hunter2: gone"].map(String::from);
        assert_eq!(
            error_line(chain.into_iter()),
            // A query value runs to whitespace: the colon after it goes with it (safe side).
            "cannot load http://u:***@h/m: s3://b/k?X-Amz-Signature=*** gone"
        );
        let chain = ["cannot load /m", "/m/a\u{1b}[2J.safetensors: gone"].map(String::from);
        assert_eq!(error_line(chain.into_iter()), "cannot load /m: /m/a\u{fffd}[2J.safetensors: gone");
    }
}
