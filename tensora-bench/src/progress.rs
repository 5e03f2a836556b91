//! Progress of a bench run: a line per measured step with the time elapsed and an estimate of what
//! is left (a bar redrawn in place on a terminal, plain lines otherwise).
//!
//! The whole run is known in advance as a list of steps, each with an estimate key (a cell, or one
//! round of paired runs). What is left is the sum, over the steps to come, of the last duration of
//! the same key, or of the mean step duration so far for keys not yet seen; so the estimate is
//! rough during the first round and close after it.

use std::collections::HashMap;
use std::time::Instant;

/// Where the progress goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// A terminal: one bar, redrawn in place.
    Bar,
    /// A log or a pipe: one line per step.
    Lines,
}

impl Output {
    /// [`Output::Bar`] when stderr is a terminal.
    pub fn detect() -> Output {
        use std::io::IsTerminal;
        if std::io::stderr().is_terminal() { Output::Bar } else { Output::Lines }
    }
}

/// Width of the bar, in characters.
const BAR_WIDTH: usize = 30;

/// The steps of a run and how long the finished ones took.
#[derive(Debug)]
pub struct Progress {
    started: Instant,
    keys: Vec<String>,
    done: usize,
    last_seconds: HashMap<String, f64>,
    done_seconds: f64,
    output: Output,
}

impl Progress {
    /// A run of `keys.len()` steps, in order; `keys[i]` names what step `i` measures.
    pub fn new(keys: Vec<String>, output: Output) -> Progress {
        Progress {
            started: Instant::now(),
            keys,
            done: 0,
            last_seconds: HashMap::new(),
            done_seconds: 0.0,
            output,
        }
    }

    /// Where it draws.
    pub fn output(&self) -> Output {
        self.output
    }

    /// Record that the next step took `seconds`.
    pub fn finish(&mut self, seconds: f64) {
        if let Some(key) = self.keys.get(self.done) {
            self.last_seconds.insert(key.clone(), seconds);
        }
        self.done = (self.done + 1).min(self.keys.len());
        self.done_seconds += seconds;
    }

    /// Estimated seconds left, `None` before any step has finished.
    pub fn left_seconds(&self) -> Option<f64> {
        if self.done == 0 {
            return None;
        }
        let mean = self.done_seconds / self.done as f64;
        Some(self.keys[self.done..].iter().map(|k| self.last_seconds.get(k).copied().unwrap_or(mean)).sum())
    }

    /// `[done/total] elapsed E, ~L left`, the head of every progress line.
    pub fn status(&self) -> String {
        let left = self.left_seconds().map_or("estimating".to_owned(), |s| format!("~{} left", clock(s)));
        format!(
            "[{}/{}] {} elapsed, {left}",
            self.done,
            self.keys.len(),
            clock(self.started.elapsed().as_secs_f64())
        )
    }

    /// The line after a finished step: the status and what the step gave.
    pub fn line(&self, what: &str) -> String {
        format!("{} | {what}", self.status())
    }

    /// The bar for a terminal, about to run `what` (no line break: the caller redraws it in place).
    pub fn bar(&self, what: &str) -> String {
        let total = self.keys.len().max(1);
        let filled = BAR_WIDTH * self.done / total;
        format!("[{}{}] {} | {what}", "#".repeat(filled), "-".repeat(BAR_WIDTH - filled), self.status())
    }
}

/// Seconds as `1m02s` or `45s`.
pub fn clock(seconds: f64) -> String {
    let s = seconds.max(0.0).round() as u64;
    if s >= 60 { format!("{}m{:02}s", s / 60, s % 60) } else { format!("{s}s") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_estimate_uses_each_steps_last_duration_and_the_mean_for_new_ones() {
        let keys = ["a", "b", "a", "b", "c"].map(String::from).to_vec();
        let mut p = Progress::new(keys, Output::Lines);
        assert_eq!(p.left_seconds(), None);
        assert!(p.status().starts_with("[0/5] 0s elapsed, estimating"), "{}", p.status());
        p.finish(10.0);
        // b, a, b, c: b and c unseen (mean 10), a seen (10).
        assert_eq!(p.left_seconds(), Some(40.0));
        p.finish(2.0);
        // a (10) + b (2) + c (mean 6).
        assert_eq!(p.left_seconds(), Some(18.0));
        p.finish(4.0);
        p.finish(2.0);
        p.finish(1.0);
        assert_eq!(p.left_seconds(), Some(0.0));
        // Extra finishes do not run past the end.
        p.finish(1.0);
        assert!(p.line("x").starts_with("[5/5] "), "{}", p.line("x"));
        assert!(p.line("x").ends_with("~0s left | x"), "{}", p.line("x"));
    }

    #[test]
    fn the_bar_fills_with_the_steps() {
        let mut p = Progress::new(vec!["a".into(), "b".into()], Output::Bar);
        assert!(p.bar("a").starts_with(&format!("[{}]", "-".repeat(BAR_WIDTH))));
        p.finish(1.0);
        let half = format!("[{}{}]", "#".repeat(BAR_WIDTH / 2), "-".repeat(BAR_WIDTH - BAR_WIDTH / 2));
        assert!(p.bar("b").starts_with(&half), "{}", p.bar("b"));
        assert_eq!(p.output(), Output::Bar);
        assert!(Progress::new(Vec::new(), Output::Lines).bar("none").starts_with("[---"));
    }

    #[test]
    fn clock_reads_like_a_clock() {
        assert_eq!(clock(0.4), "0s");
        assert_eq!(clock(59.6), "1m00s");
        assert_eq!(clock(125.0), "2m05s");
        assert_eq!(clock(-3.0), "0s");
    }
}
