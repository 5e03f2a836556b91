//! The remote bench's acceptance checks (issue 16's targets) and its Markdown and JSON reports.

use std::fmt::Write as _;

use super::{Cell, median};

/// Which side of its target an acceptance value must be on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound {
    /// Passes at or above the target (throughput, ratios).
    AtLeast,
    /// Passes at or below the target (memory).
    AtMost,
}

/// One acceptance check: `None` as value when a cell it needs failed or did not run.
pub struct Check {
    pub name: String,
    pub value: Option<f64>,
    pub target: f64,
    pub unit: &'static str,
    pub bound: Bound,
}

impl Check {
    pub fn pass(&self) -> bool {
        match (self.value, self.bound) {
            (Some(v), Bound::AtLeast) => v >= self.target,
            (Some(v), Bound::AtMost) => v <= self.target,
            (None, _) => false,
        }
    }
}

fn find<'c>(cells: &'c [Cell], group: &str, name_has: &str) -> Option<&'c Cell> {
    cells
        .iter()
        .find(|c| c.group == group && c.name.contains(name_has) && c.error.is_none() && !c.seconds.is_empty())
}

fn ratio(a: Option<&Cell>, b: Option<&Cell>) -> Option<f64> {
    Some(a?.gbps() / b?.gbps())
}

/// The checks of issue 16 over whatever cells ran.
pub fn acceptance(cells: &[Cell]) -> Vec<Check> {
    let at_least =
        |name: String, value, target, unit| Check { name, value, target, unit, bound: Bound::AtLeast };
    let mut checks = Vec::new();
    for group in ["tinyllama", "shards8", "one1g", "limited"] {
        if !cells.iter().any(|c| c.group == group) {
            continue;
        }
        let default = find(cells, group, "default");
        if group == "limited" {
            checks.push(at_least(format!("{group}: default GB/s"), default.map(Cell::gbps), 1.5, "GB/s"));
        } else {
            let curl = find(cells, group, "curl");
            checks.push(at_least(format!("{group}: default / curl anchor"), ratio(default, curl), 0.9, "x"));
        }
        let best_fixed = cells
            .iter()
            .filter(|c| {
                c.group == group
                    && c.name.contains("--queue-depth")
                    && c.error.is_none()
                    && !c.seconds.is_empty()
            })
            .max_by(|a, b| a.gbps().total_cmp(&b.gbps()));
        checks.push(at_least(
            format!("{group}: default / best fixed depth"),
            ratio(default, best_fixed),
            0.9,
            "x",
        ));
    }
    if cells.iter().any(|c| c.group == "cache") {
        let warm = find(cells, "cache", "warm");
        let local = find(cells, "cache", "local load");
        checks.push(at_least(
            "cache: warm / local load of the same files (both read from the disk)".into(),
            ratio(warm, local),
            0.9,
            "x",
        ));
        let cold = find(cells, "cache", "MiB: cold");
        let none = find(cells, "cache", "MiB: no cache");
        checks.push(at_least(
            "cache: cold / no cache (at most 10 % slower)".into(),
            ratio(cold, none),
            1.0 / 1.1,
            "x",
        ));
        // A cold cache writes every byte it loads, while it loads: the disk and the network
        // share the machine, so the least a cold-cache load can take is the same load and the
        // same writes run side by side.
        let both = find(cells, "cache", "side by side");
        checks.push(at_least(
            "cache: cold / no cache and the write roofline side by side".into(),
            ratio(cold, both),
            1.0 / 1.1,
            "x",
        ));
        let (slow_cold, slow_none) =
            (find(cells, "cache", "connection: cold"), find(cells, "cache", "connection: no cache"));
        checks.push(at_least(
            "cache, 50 MB/s per connection: cold / no cache (network-bound)".into(),
            ratio(slow_cold, slow_none),
            1.0 / 1.1,
            "x",
        ));
    }
    if cells.iter().any(|c| c.group == "s3") {
        let tensora = find(cells, "s3", "tensora");
        let runai = find(cells, "s3", "Run:ai");
        checks.push(at_least("s3: tensora / Run:ai streamer".into(), ratio(tensora, runai), 1.0, "x"));
        let curl = find(cells, "s3", "curl");
        checks.push(at_least("s3: tensora / curl SigV4 anchor".into(), ratio(tensora, curl), 0.9, "x"));
    }
    if let Some(rss) = find(cells, "rss", "peak RSS") {
        let mib = |b: f64| b / 1048576.0;
        checks.push(Check {
            name: "streamed load peak RSS (MiB) vs in-flight cap + 64 MiB".into(),
            value: Some(mib(rss.seconds[0])),
            target: mib((rss.bytes + (64 << 20)) as f64),
            unit: "MiB",
            bound: Bound::AtMost,
        });
    }
    checks
}

/// The report in Markdown: the cells, then the acceptance checks.
pub fn markdown(runs: usize, cells: &[Cell], checks: &[Check], when: (&str, &str)) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "# tensora-remote bench\n");
    let _ = writeln!(
        md,
        "{runs} runs per cell, interleaved with their anchors; started {}, ended {}.\n",
        when.0, when.1
    );
    let _ =
        writeln!(md, "| cell | MB | median s | GB/s median | GB/s min–max | runs (s) | measured | notes |");
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|");
    for c in cells {
        if let Some(e) = &c.error {
            let _ = writeln!(md, "| {} | | | | | | | error: {e} |", c.name);
            continue;
        }
        if c.group == "rss" {
            let _ = writeln!(
                md,
                "| {} | | | | | {:.0} / {} | {} | |",
                c.name,
                c.seconds[0],
                c.bytes,
                c.when.join(", ")
            );
            continue;
        }
        let runs: Vec<String> = c.seconds.iter().map(|s| format!("{s:.3}")).collect();
        let (lo, hi) = c.gbps_range();
        let when = match (c.when.first(), c.when.last()) {
            (Some(a), Some(b)) => format!("{a} – {b}"),
            _ => String::new(),
        };
        let _ = writeln!(
            md,
            "| {} | {:.0} | {:.3} | {:.3} | {lo:.3}–{hi:.3} | {} | {when} | {} |",
            c.name,
            c.bytes as f64 / 1e6,
            median(&c.seconds),
            c.gbps(),
            runs.join(" "),
            c.notes.join("; ")
        );
    }
    let _ = writeln!(md, "\n| acceptance | value | target | pass |\n|---|---|---|---|");
    for c in checks {
        let cmp = match c.bound {
            Bound::AtLeast => "≥",
            Bound::AtMost => "≤",
        };
        let value = c.value.map_or_else(|| "n/a".to_owned(), |v| format!("{v:.2}"));
        let _ = writeln!(md, "| {} | {value} | {cmp} {:.2} {} | {} |", c.name, c.target, c.unit, c.pass());
    }
    md
}

/// The report as JSON.
pub fn json(runs: usize, cells: &[Cell], checks: &[Check], when: (&str, &str)) -> serde_json::Value {
    let cells_json: Vec<_> = cells
        .iter()
        .map(|c| {
            let (lo, hi) = if c.seconds.is_empty() { (f64::NAN, f64::NAN) } else { c.gbps_range() };
            serde_json::json!({
                "group": c.group, "name": c.name, "bytes": c.bytes, "seconds": c.seconds,
                "median_seconds": median(&c.seconds), "gbps_median": c.gbps(), "gbps_min": lo, "gbps_max": hi,
                "measured": c.when, "notes": c.notes, "error": c.error,
            })
        })
        .collect();
    let checks_json: Vec<_> = checks
        .iter()
        .map(|c| serde_json::json!({"name": c.name, "value": c.value, "target": c.target, "unit": c.unit, "pass": c.pass()}))
        .collect();
    serde_json::json!({"runs": runs, "started": when.0, "ended": when.1, "cells": cells_json, "acceptance": checks_json})
}
