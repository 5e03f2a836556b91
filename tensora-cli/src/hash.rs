//! `tensora hash`: per-tensor digests, as text, JSON, or an atomically written manifest.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use tensora_io::BackendChoice;
use tensora_verify::Algo;
use tensora_verify::Manifest;
use tensora_verify::{HashOptions, hash_checkpoint};

use crate::progress::{Progress, Show};

#[derive(Debug, clap::Args)]
#[command(after_help = crate::remote::stores_help())]
pub struct Args {
    /// Checkpoint path: a .safetensors file, a sharded directory or a ServerlessLLM directory; or a
    /// remote location (a URL of one of the stores listed at the end of this help), digested inside a streamed
    /// remote load (memory bounded by its in-flight cap).
    pub path: PathBuf,
    /// Digest algorithm: crc32c (fast, default), xxh3 (XXH3-128) or sha256.
    #[arg(long, default_value = "crc32c", value_parser = parse_algo)]
    pub algo: Algo,
    /// I/O backend for the load that computes the digests: auto (the default), or one of sync,
    /// mmap, io-uring, async.
    #[arg(long, default_value = "auto")]
    pub backend: BackendChoice,
    /// Print `{"algo", "tensors": {name: {dtype, shape, <algo>}}}` instead of text.
    #[arg(long)]
    pub json: bool,
    /// Also write a manifest (digests plus file sizes and format) to FILE, atomically.
    #[arg(long, value_name = "FILE")]
    pub write_manifest: Option<PathBuf>,
    #[command(flatten)]
    pub remote: crate::remote::RemoteArgs,
}

fn parse_algo(s: &str) -> Result<Algo, String> {
    s.parse::<Algo>().map_err(|e| e.to_string())
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    if let Some(location) = crate::remote::location(&args.path)? {
        if !matches!(args.backend, BackendChoice::Auto) {
            anyhow::bail!(
                "--backend does not apply to a remote location ({})",
                crate::remote::shown(&args.path)
            );
        }
        let remote = crate::remote::open(&location, &args.remote.options())?;
        let ckpt = remote.checkpoint();
        let progress = checkpoint_progress(ckpt);
        let (digests, _) = tensora_remote::digests(&remote, args.algo, progress.hook())
            .with_context(|| format!("hashing {}", crate::remote::shown(&args.path)))?;
        progress.finish();
        return finish(&args, ckpt, &digests);
    }
    let ckpt = tensora_verify::open_checkpoint(&args.path)?;
    let progress = checkpoint_progress(&ckpt);
    let opts = HashOptions { algo: args.algo, backend: args.backend.clone(), progress: progress.hook() };
    let digests = hash_checkpoint(&ckpt, &opts)
        .with_context(|| format!("hashing {}", crate::remote::shown(&args.path)))?;
    progress.finish();
    finish(&args, &ckpt, &digests)
}

/// The bar over the checkpoint's bytes; tied tensors share theirs, so each byte counts once.
fn checkpoint_progress(ckpt: &tensora_format::Checkpoint) -> Progress {
    let every_tensor: Vec<usize> = (0..ckpt.tensors().len()).collect();
    Progress::new(Show::OnTerminal, "hashing", ckpt.distinct_bytes(&every_tensor))
}

/// The manifest (written when asked) and the digests printed.
fn finish(
    args: &Args,
    ckpt: &tensora_format::Checkpoint,
    digests: &[tensora_verify::Digest],
) -> anyhow::Result<ExitCode> {
    let manifest = Manifest::from_checkpoint(ckpt, args.algo, digests)?;

    // The manifest first: it is the durable result, and must not depend on stdout's reader.
    if let Some(path) = &args.write_manifest {
        manifest.write_atomic(path).with_context(|| format!("writing manifest {}", path.display()))?;
        if !args.json && std::io::stderr().is_terminal() {
            eprintln!(
                "wrote {} ({} tensors, {} files, {})",
                path.display(),
                manifest.tensors.len(),
                manifest.files.len(),
                args.algo
            );
        }
    }
    crate::output::written(print(args, ckpt, &manifest))?;
    Ok(ExitCode::SUCCESS)
}

fn print(args: &Args, ckpt: &tensora_format::Checkpoint, manifest: &Manifest) -> std::io::Result<()> {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &manifest.tensors_json())?;
        writeln!(out)?;
    } else {
        // sha256sum style: digest, two spaces, name; then dtype and shape.
        for t in ckpt.tensors() {
            let d = &manifest.tensors[t.name()].digest;
            writeln!(out, "{d}  {}  {} {:?}", t.name(), t.dtype(), t.shape())?;
        }
    }
    out.flush()
}
