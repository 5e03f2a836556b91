//! `--tp RANK/WORLD [--rules PRESET]` of `tensora load` and `tensora inspect`: one rank's
//! tensor-parallel share ([`tensora_format::Shard::TensorParallel`]), and the table `inspect --tp`
//! prints of how each tensor of the share would be read ([`tensora_io::shard_reads`]), before any
//! tensor byte is read. The splits and presets live in `tensora_format::tp`.

use std::fmt;
use std::io::{self, Write};

use tensora_format::{Checkpoint, Shard, TensorParallel, TpRules};
use tensora_io::{ShardRead, SliceCounts};

use crate::output::printable;

/// The preset `--rules` defaults to, as Python's `load_file(..., tp=...)`.
const DEFAULT_RULES: &str = "llama";

/// `--tp` and `--rules`, flattened into `load` and `inspect`.
#[derive(Debug, Clone, clap::Args)]
pub struct TpArgs {
    /// Only this rank's tensor-parallel share: RANK/WORLD, e.g. 0/2 (RANK below WORLD, WORLD at
    /// least 1). Each tensor the rules split is narrowed to the rank's part of its dimension as
    /// torch.chunk(WORLD, dim) does (uneven sizes: the last ranks get fewer); every other tensor
    /// is whole (replicated). `load --tp` loads the share (with --select, --lazy-index,
    /// --backend, --direct/--buffered and remote locations; not with --stream, --mapped, --dtype
    /// or --manifest); `inspect --tp` shows, before any tensor byte is read, how `load --tp` would
    /// read each tensor of it (the split, the rank's shape, contiguous, strided or covering, the
    /// bytes selected and read).
    // Hyphen values admitted, so that `--tp -1/2` is refused by `parse_tp` naming --tp.
    #[arg(long, value_name = "RANK/WORLD", value_parser = parse_tp, allow_hyphen_values = true)]
    pub tp: Option<TpRank>,
    /// Which tensors --tp splits along which dimension: a preset (q/k/v, gate/up and the
    /// embeddings column-parallel, o/down row-parallel, the rest replicated; qwen adds the q/k/v
    /// biases, mixtral the experts' w1/w3/w2, deepseek q_b_proj/kv_b_proj). Default llama.
    #[arg(
        long,
        value_name = "PRESET",
        requires = "tp",
        value_parser = clap::builder::PossibleValuesParser::new(TpRules::preset_names().iter().copied())
    )]
    pub rules: Option<String>,
}

/// One rank of a tensor-parallel group, as `--tp` spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TpRank {
    /// This rank, below `world`.
    pub rank: u32,
    /// The group's size, at least 1.
    pub world: u32,
}

impl fmt::Display for TpRank {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.rank, self.world)
    }
}

/// `RANK/WORLD`: two decimal numbers (digits only) that fit 32 bits, RANK below WORLD, WORLD at
/// least 1. Clap puts the message after `invalid value '...' for '--tp <RANK/WORLD>'`.
fn parse_tp(s: &str) -> Result<TpRank, String> {
    let expected = "expected RANK/WORLD, e.g. 0/2";
    let (rank, world) = s.split_once('/').ok_or_else(|| format!("no '/': {expected}"))?;
    let number = |what: &str, digits: &str| {
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!("{what} {digits:?} is not a number: {expected}"));
        }
        digits.parse::<u32>().map_err(|_| format!("{what} {digits} is over {}", u32::MAX))
    };
    let (rank, world) = (number("RANK", rank)?, number("WORLD", world)?);
    if world == 0 {
        return Err("WORLD must be at least 1".to_owned());
    }
    if rank >= world {
        return Err(format!("RANK {rank} is not below WORLD {world} (ranks are 0 to {})", world - 1));
    }
    Ok(TpRank { rank, world })
}

impl TpArgs {
    /// The preset's name, given or the default (meaningful only with `--tp`).
    pub fn rules_name(&self) -> &str {
        self.rules.as_deref().unwrap_or(DEFAULT_RULES)
    }

    /// The share `--tp` asks for, or `None` without it.
    pub fn shard(&self) -> anyhow::Result<Option<Shard>> {
        let Some(TpRank { rank, world }) = self.tp else { return Ok(None) };
        let name = self.rules_name();
        // Clap admits only the preset names; this is the library's own check of the name.
        let rules =
            TpRules::preset(name).ok_or_else(|| anyhow::anyhow!("unknown --rules preset {name:?}"))?;
        Ok(Some(Shard::TensorParallel(TensorParallel { rank, world, rules })))
    }

    /// `rank 0 of 2, llama rules`, or `None` without `--tp`.
    pub fn described(&self) -> Option<String> {
        let tp = self.tp?;
        Some(format!("rank {} of {}, {} rules", tp.rank, tp.world, self.rules_name()))
    }
}

/// One tensor of a share as `inspect --tp` shows it.
struct Row<'c> {
    name: &'c str,
    dtype: &'static str,
    /// The part kept, or `None` when the tensor is replicated (whole).
    slice: Option<tensora_format::Slice>,
    /// The shape this rank gets.
    shape: Vec<u64>,
    /// `contiguous`, `strided` or `covering` (`tensora_plan::SliceKind::as_str`).
    kind: &'static str,
    bytes_selected: u64,
    bytes_read: u64,
}

/// The share's totals: the load report's fields of the same names.
#[derive(Default)]
struct Totals {
    bytes_selected: u64,
    bytes_read: u64,
    slices: SliceCounts,
}

impl Totals {
    fn read_per_selected(&self) -> Option<f64> {
        read_per_selected(self.bytes_read, self.bytes_selected)
    }
}

/// `bytes_read / bytes_selected`, or `None` when nothing is selected.
pub fn read_per_selected(bytes_read: u64, bytes_selected: u64) -> Option<f64> {
    (bytes_selected > 0).then(|| bytes_read as f64 / bytes_selected as f64)
}

/// How `inspect --tp` prints the share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    /// A table for a person.
    Text,
    /// One JSON object.
    Json,
}

/// One rank's share as `inspect --tp` shows it: a row per selected tensor, and the totals.
pub struct Share<'c> {
    rows: Vec<Row<'c>>,
    totals: Totals,
}

impl<'c> Share<'c> {
    /// The rows of `reads` (what [`tensora_io::shard_reads`] decided), narrowed shapes and sizes
    /// taken from `ckpt` (`TensorInfo::sliced`, as the load narrows them), and their totals.
    pub fn of(ckpt: &'c Checkpoint, reads: &[ShardRead]) -> anyhow::Result<Share<'c>> {
        let mut rows = Vec::with_capacity(reads.len());
        let mut totals = Totals::default();
        for read in reads {
            let t = ckpt.tensors().get(read.tensor).ok_or_else(|| {
                anyhow::anyhow!("shard_reads named tensor #{} of {}", read.tensor, ckpt.tensors().len())
            })?;
            let (shape, bytes_selected, inner) = match read.slice {
                Some(slice) => {
                    let (narrowed, l) = t.sliced(slice)?;
                    // As the load's report counts `inner_contiguous`: rows of an inner dimension.
                    let inner = l.rows > 1 && l.width_bytes != l.stride_bytes;
                    (narrowed.shape().to_vec(), narrowed.len_bytes(), inner)
                }
                None => (t.shape().to_vec(), t.len_bytes(), false),
            };
            totals.bytes_selected += bytes_selected;
            totals.bytes_read += read.bytes_read;
            let kind = read.kind.as_str();
            match kind {
                "contiguous" => {
                    totals.slices.contiguous += 1;
                    totals.slices.inner_contiguous += usize::from(inner);
                }
                "strided" => totals.slices.strided += 1,
                _ => totals.slices.covering += 1,
            }
            rows.push(Row {
                name: t.name(),
                dtype: t.dtype().as_str(),
                slice: read.slice,
                shape,
                kind,
                bytes_selected,
                bytes_read: read.bytes_read,
            });
        }
        Ok(Share { rows, totals })
    }

    /// The share as a table, or with [`Style::Json`] one object (see `inspect --help`).
    pub fn write(
        &self,
        ckpt: &Checkpoint,
        tp: &TpArgs,
        style: Style,
        out: &mut impl Write,
    ) -> io::Result<()> {
        match style {
            Style::Json => self.write_json(ckpt, tp, out),
            Style::Text => self.write_text(ckpt, tp, out),
        }
    }

    fn write_json(&self, ckpt: &Checkpoint, tp: &TpArgs, out: &mut impl Write) -> io::Result<()> {
        use serde_json::json;
        let (rows, totals) = (&self.rows, &self.totals);
        let tensors: Vec<serde_json::Value> = rows
            .iter()
            .map(|r| {
                json!({
                    "name": r.name,
                    "dtype": r.dtype,
                    "split_dim": r.slice.map(|s| s.dim),
                    "start": r.slice.map(|s| s.start),
                    "shape": r.shape,
                    "kind": r.kind,
                    "bytes_selected": r.bytes_selected,
                    "bytes_read": r.bytes_read,
                })
            })
            .collect();
        let warnings: Vec<serde_json::Value> = ckpt
            .warnings()
            .iter()
            .map(|w| json!({ "path": w.path.to_string_lossy(), "message": w.message }))
            .collect();
        let value = json!({
            "path": ckpt.root().to_string_lossy(),
            "format": ckpt.format().as_str(),
            "tp": { "rank": tp.tp.map(|t| t.rank), "world": tp.tp.map(|t| t.world), "rules": tp.rules_name() },
            "tensors": tensors,
            "bytes_selected": totals.bytes_selected,
            "bytes_read": totals.bytes_read,
            "read_per_selected": totals.read_per_selected(),
            "slices": totals.slices,
            "warnings": warnings,
        });
        serde_json::to_writer_pretty(&mut *out, &value)?;
        writeln!(out)
    }

    fn write_text(&self, ckpt: &Checkpoint, tp: &TpArgs, out: &mut impl Write) -> io::Result<()> {
        let (rows, totals) = (&self.rows, &self.totals);
        writeln!(out, "format:  {}", ckpt.format().as_str())?;
        writeln!(out, "path:    {}", printable(&ckpt.root().to_string_lossy()))?;
        writeln!(out, "share:   {}", tp.described().unwrap_or_default())?;
        let name_w = rows.iter().map(|r| r.name.chars().count()).max().unwrap_or(4).clamp(4, 80);
        writeln!(
            out,
            "{:<name_w$}  {:<11}  {:<10}  {:<24}  {:<10}  {:>14}  {:>14}",
            "NAME", "DTYPE", "SPLIT", "SHAPE", "READ AS", "SELECTED", "READ"
        )?;
        for r in rows {
            let split =
                r.slice.map(|s| s.dim).map_or_else(|| "replicated".to_owned(), |d| format!("dim {d}"));
            writeln!(
                out,
                "{:<name_w$}  {:<11}  {:<10}  {:<24}  {:<10}  {:>14}  {:>14}",
                printable(r.name),
                r.dtype,
                split,
                format!("{:?}", r.shape),
                r.kind,
                r.bytes_selected,
                r.bytes_read
            )?;
        }
        writeln!(out, "tensors: {} ({})", rows.len(), slice_counts(&totals.slices))?;
        write!(out, "bytes:   {} selected, {} read", totals.bytes_selected, totals.bytes_read)?;
        if let Some(ratio) = totals.read_per_selected() {
            write!(out, " ({ratio:.3}x the selected)")?;
        }
        writeln!(out)
    }
}

/// `3 contiguous, 2 strided, 1 covering`: how many tensors of a share are read each way.
pub fn slice_counts(c: &SliceCounts) -> String {
    format!("{} contiguous, {} strided, {} covering", c.contiguous, c.strided, c.covering)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_and_world_are_parsed_strictly() {
        assert_eq!(parse_tp("0/2"), Ok(TpRank { rank: 0, world: 2 }));
        assert_eq!(parse_tp("0/1"), Ok(TpRank { rank: 0, world: 1 }));
        assert_eq!(parse_tp("4294967294/4294967295"), Ok(TpRank { rank: u32::MAX - 1, world: u32::MAX }));
        for (bad, needle) in [
            ("0/0", "WORLD must be at least 1"),
            ("3/2", "RANK 3 is not below WORLD 2 (ranks are 0 to 1)"),
            ("2/2", "RANK 2 is not below WORLD 2"),
            ("x/2", "RANK \"x\" is not a number"),
            ("1/", "WORLD \"\" is not a number"),
            ("/2", "RANK \"\" is not a number"),
            ("2", "no '/'"),
            ("", "no '/'"),
            ("+1/2", "RANK \"+1\" is not a number"),
            (" 1/2", "is not a number"),
            ("1/2/3", "WORLD \"2/3\" is not a number"),
            ("-1/2", "is not a number"),
            ("0/99999999999999999999999", "WORLD 99999999999999999999999 is over 4294967295"),
            ("4294967296/4294967297", "RANK 4294967296 is over"),
        ] {
            let e = parse_tp(bad).unwrap_err();
            assert!(e.contains(needle), "{bad:?}: {e}");
        }
    }

    #[test]
    fn the_default_rules_are_a_preset() {
        let args = TpArgs { tp: Some(TpRank { rank: 1, world: 2 }), rules: None };
        assert!(TpRules::preset_names().contains(&args.rules_name()));
        assert_eq!(args.described().as_deref(), Some("rank 1 of 2, llama rules"));
        assert!(matches!(
            args.shard(),
            Ok(Some(Shard::TensorParallel(TensorParallel { rank: 1, world: 2, .. })))
        ));
        assert!(matches!(TpArgs { tp: None, rules: None }.shard(), Ok(None)));
    }
}
