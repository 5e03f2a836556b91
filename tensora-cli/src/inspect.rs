//! `tensora inspect PATH [--json]`: a checkpoint's format, files, tensors and metadata.
//!
//! Reads only headers and indexes (through `tensora_format::open`), never tensor data. With
//! `--tp RANK/WORLD`, how that rank's share of each tensor would be read (`crate::tp`).

use std::collections::BTreeMap;
use std::io::{self, BufWriter, Write};
use std::process::ExitCode;

use anyhow::Context as _;

use tensora_format::{Checkpoint, Dtype, Inspection};

use crate::output::printable;

/// Print a checkpoint's format, files, tensor count, bytes by dtype, metadata and a tensor table.
#[derive(Debug, clap::Args)]
#[command(after_help = crate::remote::stores_help())]
pub struct Args {
    /// Checkpoint path: a .safetensors file, a directory of shards (with or without
    /// *.safetensors.index.json), or a ServerlessLLM directory; or a remote location
    /// (a URL of one of the stores listed at the end of this help), whose headers are read with
    /// ranged requests.
    pub path: std::path::PathBuf,
    /// Print JSON, the schema `tensora.inspect` returns in Python: {"path", "format", "files":
    /// [{"path", "len_bytes", "tensors"}], "metadata", "tensors": [{"name", "dtype", "shape",
    /// "file", "offset_bytes", "len_bytes", "strides"}], "tensor_bytes", "warnings": [{"path",
    /// "message"}]}. "file" is the index into "files", "offset_bytes" is absolute in that file,
    /// "strides" is null unless the format records them.
    ///
    /// With --tp, instead: {"path", "format", "tp": {"rank", "world", "rules"}, "tensors":
    /// [{"name", "dtype", "split_dim", "start", "shape", "kind", "bytes_selected", "bytes_read"}],
    /// "bytes_selected", "bytes_read", "read_per_selected", "slices": {"contiguous", "strided",
    /// "covering", "inner_contiguous"}, "warnings"}: "split_dim" (and "start", where the rank's
    /// part of that dimension begins) is null for a replicated tensor, "shape" is the rank's, "kind" is how `tensora load --tp` would read it (contiguous,
    /// strided or covering), "bytes_read" includes the alignment and gaps that read takes;
    /// "read_per_selected" is null when nothing is selected.
    #[arg(long)]
    pub json: bool,
    /// --tp and --rules: how `load --tp` would read the share.
    #[command(flatten)]
    pub tp: crate::tp::TpArgs,
    /// With --tp: decide as `load --tp --direct` would (reads around the page cache: a request
    /// costs more, so fewer slices are read row by row).
    #[arg(long, requires = "tp", conflicts_with = "buffered")]
    pub direct: bool,
    /// With --tp: decide as `load --tp --buffered` would.
    #[arg(long, requires = "tp")]
    pub buffered: bool,
    #[command(flatten)]
    pub remote: crate::remote::RemoteArgs,
}

/// Run the subcommand. Exit code 0 on success; errors are returned (and printed by `main`).
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let remote = match crate::remote::location(&args.path)? {
        Some(location) => Some(crate::remote::open(&location, &args.remote.options())?),
        None => None,
    };
    let local;
    let ckpt = match &remote {
        Some(r) => r.checkpoint(),
        None => {
            local = tensora_format::open(&args.path)?;
            crate::output::print_warnings(&local);
            &local
        }
    };
    let stdout = io::stdout();
    let mut out = BufWriter::with_capacity(1 << 16, stdout.lock());
    if let Some(shard) = args.tp.shard()? {
        let io_mode = crate::load::io_mode(args.direct, args.buffered);
        let opts =
            tensora_io::LoadOptions { shard: Some(shard), io_mode, ..tensora_io::LoadOptions::default() };
        let context = || format!("cannot plan the --tp share of {}", crate::remote::shown(&args.path));
        let reads = match &remote {
            Some(r) => r.shard_reads(&opts).with_context(context)?,
            None => tensora_io::shard_reads(ckpt, &opts).with_context(context)?,
        };
        let share = crate::tp::Share::of(ckpt, &reads)?;
        let style = if args.json { crate::tp::Style::Json } else { crate::tp::Style::Text };
        crate::output::written(share.write(ckpt, &args.tp, style, &mut out).and_then(|()| out.flush()))?;
        return Ok(ExitCode::SUCCESS);
    }
    let written = if args.json { write_json(ckpt, &mut out) } else { write_text(ckpt, &mut out) };
    crate::output::written(written.and_then(|()| out.flush()))?;
    Ok(ExitCode::SUCCESS)
}

fn tensors_per_file(ckpt: &Checkpoint) -> Vec<usize> {
    let mut counts = vec![0usize; ckpt.files().len()];
    for t in ckpt.tensors() {
        counts[t.file().index()] += 1;
    }
    counts
}

/// Streamed straight from the checkpoint (`Inspection::write_json`): no copy of its names.
fn write_json(ckpt: &Checkpoint, out: &mut impl Write) -> io::Result<()> {
    Inspection::write_json(ckpt, &mut *out).map_err(io::Error::from)?;
    writeln!(out)
}

/// `1234567` -> `1,234,567`.
fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut s = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            s.push(',');
        }
        s.push(c);
    }
    s
}

fn write_text(ckpt: &Checkpoint, out: &mut impl Write) -> io::Result<()> {
    let counts = tensors_per_file(ckpt);
    writeln!(out, "format:  {}", ckpt.format().as_str())?;
    writeln!(out, "path:    {}", printable(&ckpt.root().to_string_lossy()))?;
    writeln!(out, "files:   {}", ckpt.files().len())?;
    for (i, (f, n)) in ckpt.files().iter().zip(&counts).enumerate() {
        let path = printable(&f.path().to_string_lossy());
        writeln!(out, "  [{i}] {path}  {} bytes  {n} tensors", grouped(f.len_bytes()))?;
    }
    writeln!(out, "tensors: {}", ckpt.tensors().len())?;
    let mut by_dtype: BTreeMap<Dtype, (usize, u64)> = BTreeMap::new();
    for t in ckpt.tensors() {
        let e = by_dtype.entry(t.dtype()).or_default();
        e.0 += 1;
        e.1 += t.nbytes();
    }
    writeln!(out, "bytes by dtype:")?;
    for (d, (n, bytes)) in &by_dtype {
        writeln!(out, "  {:<12} {:>18} bytes  {n} tensors", d.as_str(), grouped(*bytes))?;
    }
    let total: u64 = by_dtype.values().map(|v| v.1).sum();
    writeln!(out, "  {:<12} {:>18} bytes", "total", grouped(total))?;
    writeln!(out, "metadata:{}", if ckpt.metadata().is_empty() { " (none)" } else { "" })?;
    for (k, v) in ckpt.metadata() {
        writeln!(out, "  {} = {}", printable(k), printable(v))?;
    }
    let name_w = ckpt.tensors().iter().map(|t| t.name().chars().count()).max().unwrap_or(4).clamp(4, 80);
    writeln!(
        out,
        "{:<name_w$}  {:<11}  {:<24}  {:>4}  {:>14}  {:>14}",
        "NAME", "DTYPE", "SHAPE", "FILE", "OFFSET", "NBYTES"
    )?;
    for t in ckpt.tensors() {
        let shape = format!("{:?}", t.shape());
        writeln!(
            out,
            "{:<name_w$}  {:<11}  {:<24}  {:>4}  {:>14}  {:>14}",
            printable(t.name()),
            t.dtype().as_str(),
            shape,
            t.file().0,
            t.offset_bytes(),
            t.nbytes()
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grouping() {
        assert_eq!(grouped(0), "0");
        assert_eq!(grouped(999), "999");
        assert_eq!(grouped(1000), "1,000");
        assert_eq!(grouped(344_412), "344,412");
        assert_eq!(grouped(u64::MAX), "18,446,744,073,709,551,615");
    }
}
