//! The Markdown rendering of a [`Report`]: the run's facts, the summary that the README's
//! performance section quotes, the acceptance tables (paired runs, `auto` against the peers), then
//! one table per fixture and situation, situation (a) first.

use std::fmt::Write as _;

use crate::report::{Cell, FixtureFacts, Report, Situation, Status};
use crate::stats::Summary;

impl Report {
    /// The Markdown report.
    pub fn to_markdown(&self) -> String {
        let mut s = String::new();
        self.markdown_facts(&mut s);
        self.markdown_summary(&mut s);
        if !self.pairs.is_empty() {
            self.markdown_pairs(&mut s);
        }
        if !self.versus.is_empty() {
            self.markdown_versus(&mut s);
        }
        if let Some(p) = &self.python_peers {
            s.push_str(&p.markdown_section(crate::torch_peers::PEERS_TITLE));
        }
        if let Some(r) = &self.restarts {
            s.push_str(&r.markdown_section(crate::torch_peers::RESTARTS_TITLE));
        }
        for f in &self.fixtures {
            self.markdown_fixture(f, &mut s);
        }
        s
    }

    /// The title, the machine, the run's configuration and the fixtures that were skipped.
    fn markdown_facts(&self, s: &mut String) {
        let m = &self.machine;
        let _ = writeln!(s, "# Tensora bench\n");
        let _ = writeln!(
            s,
            "Machine: {} cores ({}), {:.1} GiB RAM, Linux {}, THP `{}`, fixtures on {}.  ",
            m.cores,
            m.cpu_model,
            m.mem_total_bytes as f64 / f64::from(1u32 << 30),
            m.kernel,
            m.transparent_hugepage,
            m.fixture_filesystem
        );
        let r = &self.run;
        let _ = writeln!(
            s,
            "Run: {} plan, size {}, {} timed runs per cell (rounds interleaved), {} timed pairs, seed {:#x}, \
             {} in all, load average {} at the start and {} at the end. GB = 10^9 bytes.  ",
            r.plan,
            r.size,
            r.runs,
            r.pair_runs,
            r.seed,
            crate::progress::clock(r.seconds),
            r.load_average[0],
            r.load_average[1],
        );
        let _ =
            writeln!(s, "Cold cache: {}.  ", r.cache_drop.as_deref().unwrap_or("not measured (--no-cold)"));
        let _ = writeln!(s, "Memory: {}.  ", r.memory);
        let _ = writeln!(
            s,
            "Situations: {} (each run a child process; its start is timed apart, in the `start s` \
             column) and {} (ours with `ArenaReuse::Recycle`). A cell is only compared with the \
             roofline of its own situation.\n",
            Situation::FirstLoad.label(),
            Situation::RepeatLoad.label()
        );
        for (name, why) in &self.fixtures_skipped {
            let _ = writeln!(s, "Fixture `{name}` skipped: {why}.  ");
        }
    }

    /// The main fixture in situation (a): the figures the README's performance section quotes.
    fn markdown_summary(&self, s: &mut String) {
        let Some(main) = self.fixtures.first() else { return };
        let first: Vec<&Cell> = self
            .cells
            .iter()
            .filter(|c| c.fixture == main.name && c.situation != Situation::RepeatLoad)
            .filter(|c| c.scope == crate::report::Scope::Full && c.status == Status::Ok)
            .collect();
        if first.is_empty() {
            return;
        }
        let _ = writeln!(
            s,
            "\n## Summary: {}, full load, {}\n\nMedian GB/s; the README's performance section \
             quotes this table.\n",
            main.name,
            Situation::FirstLoad.label()
        );
        s.push_str("| subject | mode | warm | cold |\n|---|---|---:|---:|\n");
        let mut rows: Vec<(&str, &str)> = Vec::new();
        for c in &first {
            let key = (c.subject.as_str(), c.mode.as_str());
            if !rows.contains(&key) {
                rows.push(key);
            }
        }
        for (subject, mode) in rows {
            let value = |cache| {
                first
                    .iter()
                    .find(|c| c.subject == subject && c.mode.as_str() == mode && c.cache == cache)
                    .and_then(|c| c.gbps)
                    .map_or("-".to_owned(), |g| format!("{:.2}", g.median))
            };
            let _ = writeln!(
                s,
                "| {subject} | {mode} | {} | {} |",
                value(crate::report::Cache::Warm),
                value(crate::report::Cache::Cold)
            );
        }
    }

    /// The acceptance table of the paired runs.
    fn markdown_pairs(&self, s: &mut String) {
        let _ = writeln!(
            s,
            "\n## Acceptance, paired runs, {}\n\nThe loader and its roofline alternately, back to \
             back, order alternating; the ratio is taken per pair, so drift within the run cancels. \
             A cast pair's memory bound is the best ratio its memory traffic allows, from reads alone \
             of both fixtures in the same rounds (`tensora_bench::memory_bound`).\n",
            Situation::FirstLoad.label()
        );
        s.push_str(
            "| fixture | cache | loader | loader GB/s | anchor | anchor GB/s | ratio median (min..max) | goal | memory bound |\n",
        );
        s.push_str("|---|---|---|---:|---|---:|---:|---|---|\n");
        for p in &self.pairs {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} | {} | {:.2}: {} | {} |",
                p.fixture,
                p.cache.as_str(),
                p.subject,
                Summary::text(Summary::of(&p.subject_gbps)),
                p.anchor,
                Summary::text(Summary::of(&p.anchor_gbps)),
                Summary::text(Summary::of(&p.ratios)),
                p.goal,
                p.verdict(),
                p.bound_text().unwrap_or_else(|| "-".to_owned())
            );
        }
    }

    /// `auto` against the best peer, situation (a).
    fn markdown_versus(&self, s: &mut String) {
        let _ = writeln!(
            s,
            "\n## `auto` against the best owned peer, {}\n\nMedians of the cells below (owned, \
             full load).\n",
            Situation::FirstLoad.label()
        );
        s.push_str(
            "| fixture | cache | auto GB/s | best peer | peer GB/s | ratio | goal | peers not measured |\n",
        );
        s.push_str("|---|---|---:|---|---:|---:|---|---|\n");
        for v in &self.versus {
            let missing =
                if v.peers_missing.is_empty() { "none".to_owned() } else { v.peers_missing.join("; ") };
            let _ = writeln!(
                s,
                "| {} | {} | {:.2} | {} | {:.2} | {} | {:.2}: {} | {} |",
                v.fixture,
                v.cache.as_str(),
                v.auto_gbps,
                v.peer,
                v.peer_gbps,
                v.ratio.map_or("-".to_owned(), |r| format!("{r:.2}")),
                v.goal,
                v.verdict(),
                cell_text(&missing)
            );
        }
    }

    /// One fixture's sections, one per situation: rooflines and a row per cell.
    fn markdown_fixture(&self, f: &FixtureFacts, s: &mut String) {
        for situation in [Situation::FirstLoad, Situation::RepeatLoad] {
            let cells: Vec<&Cell> = self
                .cells
                .iter()
                .filter(|c| c.fixture == f.name && c.situation.compared_as() == situation)
                .collect();
            if cells.is_empty() {
                continue;
            }
            let _ = writeln!(
                s,
                "\n## {}, {} — {} tensors in {} file(s), {:.3} GB of tensor data\n",
                f.name,
                situation.label(),
                f.tensors,
                f.files,
                f.data_len_bytes as f64 / 1e9
            );
            if let Some(rl) = self.rooflines_of(&f.name, situation) {
                let _ = writeln!(
                    s,
                    "Warm roofline {}; device roofline {}{}.\n",
                    fmt_gbps(rl.warm_gbps),
                    fmt_gbps(rl.device_gbps),
                    rl.device_subject.as_deref().map(|d| format!(" ({d})")).unwrap_or_default()
                );
            }
            s.push_str(
                "| subject | cache | scope | mode | median GB/s | min | max | vs roofline | start s | note |\n",
            );
            s.push_str("|---|---|---|---|---:|---:|---:|---:|---:|---|\n");
            for c in cells {
                let _ = writeln!(s, "{}", markdown_row(c));
            }
        }
    }
}

fn fmt_gbps(v: Option<f64>) -> String {
    v.map_or("not measured".to_string(), |v| format!("{v:.2} GB/s"))
}

/// Text made safe for a table cell (no pipes, no line breaks).
fn cell_text(text: &str) -> String {
    text.replace('|', "/").replace('\n', " ")
}

/// A cell's row in its fixture's table.
fn markdown_row(c: &Cell) -> String {
    let (median, min, max) = match c.gbps {
        Some(g) => (format!("{:.2}", g.median), format!("{:.2}", g.min), format!("{:.2}", g.max)),
        None => ("-".to_string(), "-".to_string(), "-".to_string()),
    };
    let vs = c.ratio.map_or("-".to_string(), |r| format!("{:.0} %", r * 100.0));
    let start = c.start_seconds().map_or("-".to_string(), |s| format!("{:.2}", s.median));
    let note = match c.status {
        Status::Ok => c.chosen_backend().map(|b| format!("ran {b}")).unwrap_or_default(),
        Status::Skipped => format!("skipped: {}", c.reason.as_deref().unwrap_or("")),
        Status::Failed => format!("FAILED: {}", c.reason.as_deref().unwrap_or("")),
    };
    format!(
        "| {} | {} | {} | {} | {median} | {min} | {max} | {vs} | {start} | {} |",
        c.subject,
        c.cache.as_str(),
        c.scope.as_str(),
        c.mode.as_str(),
        cell_text(&note)
    )
}
