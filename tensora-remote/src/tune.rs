//! Self-tuning concurrency: how many ranges a load keeps in flight.
//!
//! The controller starts at [`START_DEPTH`] and probes upward the way TCP's slow start does: after
//! each window of landed ranges at one depth (the first `depth / 2` completions after a change are
//! a warm-up and do not count, so the window sees the new depth in flight), it compares the window's throughput
//! with the best so far. While doubling the depth raises throughput by at least
//! [`GAIN_MIN`], it doubles again (up to the in-flight budget); when a doubling gains less, or
//! loses, it settles on the best depth seen and keeps it for the rest of the load. A window far
//! below the best ([`STALL_FRACTION`]) is measured once more first: on a shared machine one
//! window can catch another process's burst. The report says
//! what it tried and why it stopped. A fixed depth (`Tuning::Fixed`, `--queue-depth`) skips all of
//! this.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use serde::Serialize;

/// The throughput a doubling must add (as a fraction) to be kept.
pub const GAIN_MIN: f64 = 0.10;
/// The depth the controller starts at (or the budget's depth, if lower). A depth takes effect as
/// ranges complete, and the first of `depth` ranges started together completes after about
/// `depth × chunk_bytes` have arrived: on a load of 128 ranges (1 GiB of 8 MiB), every range has
/// started by the 64th completion at a depth of 64, before any window could raise it. So the
/// start is most of the choice on loads up to a few GiB. Measured (remote bench, 2-core machine,
/// nginx on loopback): where the CPU bounds the load, 8, 16, 32 and 64 were within the run-to-run
/// noise of each other; where each connection is limited to 50 MB/s (as object stores limit
/// theirs), more in flight is more throughput (fixed 16: 0.81 GB/s, 32: 1.19-1.43, 64:
/// 1.40-1.44, 128: 1.72-2.15). The default load of that link reached 1.40 GB/s starting at 32
/// (the day's `cargo xtask bench --remote`; 1.01-1.65 over earlier runs) and 1.66 and 1.54
/// starting at 64 (`remote_bench --runs 5`, twice). A start at 64 with 128 at most was not
/// reliably faster on that link in four earlier runs (1.30-1.60 against 1.47-1.65 from 32), and
/// from a fresh process 128 in flight lost to 64 on 2 × 1.1 GB in 3 of 4 runs, so 128 stays a
/// depth the probe must earn.
pub const START_DEPTH: usize = 64;
/// A window below this fraction of the best throughput may be a stall of the machine rather than
/// of the depth: it is measured once more before the controller decides.
pub const STALL_FRACTION: f64 = 0.7;
/// Completed ranges in one measuring window, per range in flight (at least [`WINDOW_READS_MIN`]).
pub const WINDOW_READS_PER_DEPTH: usize = 1;
/// The fewest completed ranges in one measuring window.
pub const WINDOW_READS_MIN: usize = 4;

/// How the depth is chosen.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Tuning {
    /// Probe upward from [`START_DEPTH`] to at most `reads_inflight_max` (the default).
    #[default]
    Auto,
    /// Keep exactly `reads_inflight_max` ranges in flight.
    Fixed,
}

/// One measured window.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Probe {
    /// Ranges in flight.
    pub depth: usize,
    /// Throughput over the window, GB/s.
    pub gbps: f64,
}

/// What the controller did, for the load report.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct TuneReport {
    /// `"auto"` or `"fixed"`.
    pub mode: String,
    /// The depth the load ended at.
    pub depth: usize,
    /// The windows measured, in order.
    pub probes: Vec<Probe>,
    /// Why it ended at that depth.
    pub reason: String,
}

#[derive(Debug)]
struct State {
    /// Completions since the last change (warm-up included).
    seen: usize,
    window_start: Option<Instant>,
    window_bytes: u64,
    best: Option<Probe>,
    probes: Vec<Probe>,
    settled: Option<String>,
    /// Whether the current depth's window is a second measurement after a stall.
    remeasured: bool,
}

/// The controller, shared by a run's issuing threads.
#[derive(Debug)]
pub(crate) struct Tuner {
    depth: AtomicUsize,
    max: usize,
    tuning: Tuning,
    state: Mutex<State>,
}

impl Tuner {
    /// A controller for a run that may keep at most `max` ranges in flight.
    pub fn new(tuning: Tuning, max: usize) -> Tuner {
        let max = max.max(1);
        let (depth, settled) = match tuning {
            Tuning::Fixed => (max, Some(format!("fixed at {max} in flight"))),
            Tuning::Auto => (START_DEPTH.min(max), None),
        };
        let state = State {
            seen: 0,
            window_start: None,
            window_bytes: 0,
            best: None,
            probes: Vec::new(),
            settled,
            remeasured: false,
        };
        Tuner { depth: AtomicUsize::new(depth), max, tuning, state: Mutex::new(state) }
    }

    /// Ranges to keep in flight now.
    pub fn depth(&self) -> usize {
        self.depth.load(Ordering::Acquire)
    }

    /// A range of `bytes` landed at `now`.
    pub fn landed(&self, bytes: u64, now: Instant) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if s.settled.is_some() {
            return;
        }
        let depth = self.depth();
        s.seen += 1;
        let warm_up = (depth / 2).max(1);
        if s.seen <= warm_up {
            // Warm-up: the pipeline fills to the new depth; the window starts at its end.
            if s.seen == warm_up {
                s.window_start = Some(now);
                s.window_bytes = 0;
            }
            return;
        }
        s.window_bytes += bytes;
        let window_reads = (depth * WINDOW_READS_PER_DEPTH).max(WINDOW_READS_MIN);
        if s.seen < warm_up + window_reads {
            return;
        }
        let seconds = s.window_start.map_or(0.0, |t| now.duration_since(t).as_secs_f64()).max(1e-9);
        let probe = Probe { depth, gbps: s.window_bytes as f64 / seconds / 1e9 };
        s.probes.push(probe);
        let stalled = s.best.is_some_and(|b| probe.gbps < b.gbps * STALL_FRACTION);
        if stalled && !s.remeasured {
            s.remeasured = true;
            s.seen = warm_up;
            s.window_start = Some(now);
            s.window_bytes = 0;
            return;
        }
        s.remeasured = false;
        let better = s.best.is_none_or(|b| probe.gbps > b.gbps * (1.0 + GAIN_MIN));
        let next = match s.best {
            _ if better && depth >= self.max => {
                s.best = Some(probe);
                Err(format!("reached the in-flight budget ({} ranges) still gaining", self.max))
            }
            _ if better => {
                s.best = Some(probe);
                Ok((depth * 2).min(self.max))
            }
            Some(b) => Err(format!(
                "{depth} in flight gave {:.2} GB/s, not {:.0} % more than {:.2} GB/s at {}",
                probe.gbps,
                GAIN_MIN * 100.0,
                b.gbps,
                b.depth
            )),
            None => Err("no window measured".to_owned()),
        };
        match next {
            Ok(d) => {
                self.depth.store(d, Ordering::Release);
                s.seen = 0;
                s.window_start = None;
            }
            Err(why) => {
                let settle = s.best.map_or(depth, |b| b.depth);
                self.depth.store(settle, Ordering::Release);
                s.settled = Some(format!("settled on {settle} in flight: {why}"));
            }
        }
    }

    /// What the controller did.
    pub fn report(&self) -> TuneReport {
        let s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let reason = s
            .settled
            .clone()
            .unwrap_or_else(|| format!("still probing when the load ended, at {} in flight", self.depth()));
        TuneReport {
            mode: match self.tuning {
                Tuning::Auto => "auto".to_owned(),
                Tuning::Fixed => "fixed".to_owned(),
            },
            depth: self.depth(),
            probes: s.probes.clone(),
            reason,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::time::Duration;

    /// Drive a tuner with a synthetic link: `gbps(depth)`, ranges of 8 MiB, until it settles or
    /// `reads` ranges have landed. Time is synthetic too: nothing here reads a clock.
    fn drive(tuner: &Tuner, gbps: impl Fn(usize) -> f64, reads: usize) {
        let mut now = Instant::now();
        let bytes = 8u64 << 20;
        for _ in 0..reads {
            let rate = gbps(tuner.depth()) * 1e9;
            now += Duration::from_secs_f64(bytes as f64 / rate);
            tuner.landed(bytes, now);
        }
    }

    #[test]
    fn settles_where_throughput_stops_growing() {
        const S: usize = START_DEPTH;
        let tuner = Tuner::new(Tuning::Auto, 4 * S);
        drive(&tuner, |d| (d.min(8) as f64) * 0.2, 1000);
        let r = tuner.report();
        assert_eq!(r.depth, S, "{r:?}");
        assert!(r.reason.contains(&format!("settled on {S}")), "{r:?}");
        assert_eq!(r.probes.iter().map(|p| p.depth).collect::<Vec<_>>(), [S, 2 * S]);
        // One window that stalls is measured again; a depth that stays good is kept.
        let tuner = Tuner::new(Tuning::Auto, 4 * S);
        // The first ranges at 2S (its warm-up and first window) crawl: another process's burst.
        let at_double = std::cell::Cell::new(0);
        let link = |d: usize| {
            if d == 2 * S {
                at_double.set(at_double.get() + 1);
            }
            if d == 2 * S && at_double.get() <= 3 * S { 0.1 } else { d.min(2 * S) as f64 * 0.2 }
        };
        drive(&tuner, link, 4000);
        let r = tuner.report();
        assert_eq!(r.depth, 2 * S, "{r:?}");
        assert_eq!(r.probes.iter().map(|p| p.depth).collect::<Vec<_>>(), [S, 2 * S, 2 * S, 4 * S]);
    }

    #[test]
    fn backs_off_from_a_collapse_and_climbs_to_the_budget_when_it_keeps_gaining() {
        const S: usize = START_DEPTH;
        let tuner = Tuner::new(Tuning::Auto, 4 * S);
        drive(&tuner, |d| if d >= 2 * S { 0.5 } else { d as f64 * 0.25 }, 1000);
        assert_eq!(tuner.depth(), S);
        let r = tuner.report();
        assert_eq!(r.probes.iter().map(|p| p.depth).collect::<Vec<_>>(), [S, 2 * S, 2 * S], "{r:?}");
        // 50 MB/s per connection: every doubling doubles throughput, up to the budget.
        let tuner = Tuner::new(Tuning::Auto, 3 * S / 2);
        drive(&tuner, |d| d as f64 * 0.05, 2000);
        let r = tuner.report();
        assert_eq!(r.depth, 3 * S / 2, "{r:?}");
        assert!(r.reason.contains("in-flight budget"), "{r:?}");
        // A budget below the start: the start is the budget's depth.
        let small = Tuner::new(Tuning::Auto, 12);
        assert_eq!(small.depth(), 12);
        let fixed = Tuner::new(Tuning::Fixed, 12);
        drive(&fixed, |d| d as f64, 100);
        assert_eq!((fixed.depth(), fixed.report().probes.len()), (12, 0));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Whatever the link does, the depth stays within 1..=max, and once settled it never
        /// changes again.
        #[test]
        fn the_depth_stays_within_the_budget(max in 1usize..100, rates in proptest::collection::vec(0.01f64..10.0, 8)) {
            let tuner = Tuner::new(Tuning::Auto, max);
            drive(&tuner, |d| rates[d.trailing_zeros() as usize % rates.len()], 2000);
            let settled = tuner.depth();
            prop_assert!((1..=max).contains(&settled));
            drive(&tuner, |d| rates[(d + 1) % rates.len()], 200);
            prop_assert_eq!(tuner.depth(), settled);
        }
    }
}
