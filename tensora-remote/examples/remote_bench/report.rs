//! The remote bench's acceptance checks (issue 16's targets) and its Markdown and JSON reports.

use std::fmt::Write as _;

use super::spread::{self, Runs};
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
    /// The value's 90 % bootstrap interval over the runs behind it ([`spread::interval`]);
    /// `None` where the value is one reading (peak RSS).
    pub interval: Option<(f64, f64)>,
    pub target: f64,
    pub unit: &'static str,
    pub bound: Bound,
}

impl Check {
    pub fn pass(&self) -> bool {
        self.value.is_some_and(|v| self.meets(v))
    }

    fn meets(&self, v: f64) -> bool {
        match self.bound {
            Bound::AtLeast => v >= self.target,
            Bound::AtMost => v <= self.target,
        }
    }

    /// Whether the interval has values on both sides of the target: the run's noise alone could
    /// have turned this pass into a fail or this fail into a pass.
    pub fn within_noise(&self) -> bool {
        self.interval.is_some_and(|(lo, hi)| self.meets(lo) != self.meets(hi))
    }

    /// `pass`, `fail`, or either with `, within noise`.
    fn verdict(&self) -> String {
        let verdict = if self.pass() { "pass" } else { "fail" };
        if self.within_noise() { format!("{verdict}, within noise") } else { verdict.to_owned() }
    }
}

fn find<'c>(cells: &'c [Cell], group: &str, name_has: &str) -> Option<&'c Cell> {
    cells
        .iter()
        .find(|c| c.group == group && c.name.contains(name_has) && c.error.is_none() && !c.seconds.is_empty())
}

fn runs(cell: &Cell) -> Runs<'_> {
    Runs { bytes: cell.bytes, seconds: &cell.seconds }
}

/// What a check holds a cell's GB/s against.
enum Against<'c> {
    /// Nothing: the GB/s itself.
    Nothing,
    /// The fastest of these cells (one anchor, or the fixed depths to pick the best of); none
    /// when they did not run.
    Fastest(Vec<&'c Cell>),
}

/// `cell`'s GB/s, or its ratio to what it is held `against`, at least `at_least`, with its
/// bootstrap interval; the value is `None` when a cell did not run.
fn check(
    name: String,
    cell: Option<&Cell>,
    against: Against<'_>,
    at_least: f64,
    unit: &'static str,
) -> Check {
    let value_of = |g: &[f64]| match against {
        Against::Fastest(_) => g[0] / g[1..].iter().copied().fold(f64::MIN, f64::max),
        Against::Nothing => g[0],
    };
    let cells: Option<Vec<Runs<'_>>> = match (cell, &against) {
        (Some(cell), Against::Fastest(over)) if !over.is_empty() => {
            Some(std::iter::once(cell).chain(over.iter().copied()).map(runs).collect())
        }
        (Some(cell), Against::Nothing) => Some(vec![runs(cell)]),
        _ => None,
    };
    let value = cells.as_ref().map(|cells| {
        let gbps: Vec<f64> = cells.iter().map(|c| spread::gbps(c.bytes, median(c.seconds))).collect();
        value_of(&gbps)
    });
    let interval = cells.and_then(|cells| spread::interval(&cells, value_of));
    Check { name, value, interval, target: at_least, unit, bound: Bound::AtLeast }
}

/// `a` over `b`, at least `at_least` times, as a [`check`].
fn ratio(name: &str, a: Option<&Cell>, b: Option<&Cell>, at_least: f64) -> Check {
    check(name.to_owned(), a, Against::Fastest(b.into_iter().collect()), at_least, "x")
}

/// The checks of issue 16 over whatever cells ran.
pub fn acceptance(cells: &[Cell]) -> Vec<Check> {
    let mut checks = Vec::new();
    for group in ["tinyllama", "shards8", "one1g", "limited"] {
        if !cells.iter().any(|c| c.group == group) {
            continue;
        }
        let default = find(cells, group, "default");
        if group == "limited" {
            checks.push(check(format!("{group}: default GB/s"), default, Against::Nothing, 1.5, "GB/s"));
        } else {
            let curl = find(cells, group, "curl");
            checks.push(ratio(&format!("{group}: default / curl anchor"), default, curl, 0.9));
        }
        let fixed: Vec<&Cell> = cells
            .iter()
            .filter(|c| {
                c.group == group
                    && c.name.contains("--queue-depth")
                    && c.error.is_none()
                    && !c.seconds.is_empty()
            })
            .collect();
        checks.push(check(
            format!("{group}: default / best fixed depth"),
            default,
            Against::Fastest(fixed),
            0.9,
            "x",
        ));
    }
    if cells.iter().any(|c| c.group == "cache") {
        let warm = find(cells, "cache", "warm");
        let local = find(cells, "cache", "local load");
        checks.push(ratio(
            "cache: warm / local load of the same files (both read from the disk)",
            warm,
            local,
            0.9,
        ));
        let cold = find(cells, "cache", "MiB: cold");
        let none = find(cells, "cache", "MiB: no cache");
        checks.push(ratio("cache: cold / no cache (at most 10 % slower)", cold, none, 1.0 / 1.1));
        // A cold cache writes every byte it loads, while it loads: the disk and the network
        // share the machine, so the least a cold-cache load can take is the same load and the
        // same writes run side by side.
        let both = find(cells, "cache", "side by side");
        checks.push(ratio(
            "cache: cold / no cache and the write roofline side by side",
            cold,
            both,
            1.0 / 1.1,
        ));
        let (slow_cold, slow_none) =
            (find(cells, "cache", "connection: cold"), find(cells, "cache", "connection: no cache"));
        let name = "cache, 50 MB/s per connection: cold / no cache (network-bound)";
        checks.push(ratio(name, slow_cold, slow_none, 1.0 / 1.1));
    }
    if cells.iter().any(|c| c.group == "s3") {
        let tensora = find(cells, "s3", "tensora");
        let runai = find(cells, "s3", "Run:ai");
        checks.push(ratio("s3: tensora / Run:ai streamer", tensora, runai, 1.0));
        let curl = find(cells, "s3", "curl");
        checks.push(ratio("s3: tensora / curl SigV4 anchor", tensora, curl, 0.9));
    }
    if let Some(rss) = find(cells, "rss", "peak RSS") {
        let mib = |b: f64| b / 1048576.0;
        checks.push(Check {
            name: "streamed load peak RSS (MiB) vs in-flight cap + 64 MiB".into(),
            value: Some(mib(rss.seconds[0])),
            interval: None,
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
    let _ =
        writeln!(md, "\n| acceptance | value | 90 % interval | target | verdict |\n|---|---|---|---|---|");
    for c in checks {
        let cmp = match c.bound {
            Bound::AtLeast => "≥",
            Bound::AtMost => "≤",
        };
        let value = c.value.map_or_else(|| "n/a".to_owned(), |v| format!("{v:.2}"));
        let interval = c.interval.map_or_else(String::new, |(lo, hi)| format!("{lo:.2}–{hi:.2}"));
        let _ = writeln!(
            md,
            "| {} | {value} | {interval} | {cmp} {:.2} {} | {} |",
            c.name,
            c.target,
            c.unit,
            c.verdict()
        );
    }
    let _ = writeln!(
        md,
        "\nThe interval: {:.0}th to {:.0}th percentile of the value over {} bootstrap draws of each \
         cell's runs, the best fixed depth picked again in each draw. 'within noise': the interval \
         lies on both sides of the target, so these runs alone cannot tell a pass from a fail.",
        spread::TAIL * 100.0,
        (1.0 - spread::TAIL) * 100.0,
        spread::DRAWS
    );
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
        .map(|c| {
            serde_json::json!({
                "name": c.name, "value": c.value, "interval": c.interval.map(|(lo, hi)| [lo, hi]),
                "target": c.target, "unit": c.unit, "pass": c.pass(), "within_noise": c.within_noise(),
            })
        })
        .collect();
    serde_json::json!({"runs": runs, "started": when.0, "ended": when.1, "cells": cells_json, "acceptance": checks_json})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(group: &'static str, name: &str, seconds: &[f64]) -> Cell {
        let mut cell = Cell::new(group, name);
        cell.bytes = 1_000_000_000;
        cell.seconds = seconds.to_vec();
        cell
    }

    #[test]
    fn the_default_is_held_against_the_fastest_fixed_depth_with_an_interval() {
        let cells = [
            cell("shards8", "tensora, default", &[1.0, 1.0, 1.0]),
            cell("shards8", "curl", &[1.0, 1.0, 1.0]),
            cell("shards8", "tensora, --queue-depth 8", &[2.0, 2.0, 2.0]),
            cell("shards8", "tensora, --queue-depth 32", &[0.8, 1.0, 1.2]),
        ];
        let checks = acceptance(&cells);
        let best = checks.iter().find(|c| c.name.contains("best fixed")).unwrap();
        // The median of depth 32 (1.0 s) is the fastest; its spread straddles the target.
        assert_eq!(best.value, Some(1.0));
        let (lo, hi) = best.interval.unwrap();
        assert!(lo < 0.9 && hi >= 1.0, "{lo} {hi}");
        assert!(best.pass() && best.within_noise());
        let curl = checks.iter().find(|c| c.name.contains("curl")).unwrap();
        assert_eq!((curl.value, curl.interval), (Some(1.0), Some((1.0, 1.0))));
        assert!(curl.pass() && !curl.within_noise());
    }

    #[test]
    fn a_check_whose_cells_did_not_run_fails_without_a_value() {
        let cells = [cell("one1g", "tensora, default", &[1.0]), cell("one1g", "curl", &[])];
        let checks = acceptance(&cells);
        let curl = checks.iter().find(|c| c.name.contains("curl")).unwrap();
        assert_eq!((curl.value, curl.interval), (None, None));
        assert!(!curl.pass() && !curl.within_noise());
        let best = checks.iter().find(|c| c.name.contains("best fixed")).unwrap();
        assert_eq!(best.value, None);
    }
}
