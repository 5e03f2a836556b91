//! Self-tuning concurrency: how many ranges a load keeps in flight, and how long they are.
//!
//! A load's ranges are `chunk_bytes` long, or shorter for a load of fewer than [`LOAD_RANGES_MIN`]
//! of them ([`range_bytes`]: sized from the load, not probed, since the plan fixes them before
//! the first byte).
//!
//! The controller starts at [`START_DEPTH`] and probes upward the way TCP's slow start does: after
//! each window at one depth, it compares the window's throughput with the best so far. While
//! doubling the depth raises throughput by at least [`GAIN_MIN`], it doubles again (up to the
//! in-flight budget); when a doubling gains less, or loses, it settles on the best depth seen and
//! keeps it for the rest of the load. A window far below the best ([`STALL_FRACTION`]) is measured
//! once more first: on a shared machine one window can catch another process's burst. The report
//! says what it tried and why it stopped. A fixed depth (`Tuning::Fixed`, `--queue-depth`) skips
//! all of this.
//!
//! Windows count body bytes as they arrive, not landed ranges: the issuing loops show the
//! controller the load's byte counter on every landing and every [`TUNE_TICK`]. Counted in
//! landings, the first window at 64 in flight closed only after 96 ranges of 8 MiB had landed, so
//! on a 1 GiB load (128 ranges) the probe's next depth came after every range had started and
//! changed nothing: the start was the whole choice. Counted in bytes, a window at `depth` closes
//! once the bytes of `depth × 3 / 8` ranges have arrived after the change (an eighth of the
//! depth's bytes in flight as warm-up, [`WARM_UP_DIVISOR`], then a quarter,
//! [`WINDOW_DIVISOR`]: 192 MiB at 64 ranges of 8 MiB), and a raised depth is issued within a tick.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

/// The throughput a doubling must add (as a fraction) to be kept.
pub const GAIN_MIN: f64 = 0.10;
/// The depth the controller starts at (or the budget's depth, if lower). Measured (remote bench,
/// 2-core machine, nginx on loopback): where the CPU bounds the load, 8, 16, 32 and 64 were within
/// the run-to-run noise of each other; where each connection is limited to 50 MB/s (as object
/// stores limit theirs), more in flight is more throughput (fixed 16: 0.81 GB/s, 32: 1.19-1.43,
/// 64: 1.40-1.44, 128: 1.72-2.15). The default load of that link reached 1.40 GB/s starting at 32
/// and 1.54-1.66 starting at 64. From a fresh process (its arena's pages faulted in from memory
/// the host took back), 128 in flight lost to 64 on 2 × 1.1 GB in 3 of 4 runs, and on memory
/// freed a moment before it won by about 20 % on 1 GiB: so 128 stays a depth the probe must
/// earn, in a window of the load itself.
pub const START_DEPTH: usize = 64;
/// A window below this fraction of the best throughput may be a stall of the machine rather than
/// of the depth: it is measured once more before the controller decides.
pub const STALL_FRACTION: f64 = 0.7;
/// After a change of depth, the window opens once this fraction (1 / divisor) of the bytes the
/// new depth keeps in flight has arrived: the new ranges are claimed, sent and under way.
pub const WARM_UP_DIVISOR: u64 = 8;
/// One measuring window spans this fraction (1 / divisor) of the bytes the depth keeps in flight.
pub const WINDOW_DIVISOR: u64 = 4;
/// How often each issuing loop shows the controller the byte counter while it probes (it also
/// does on every landing), and so the longest a raised depth waits to be issued.
pub const TUNE_TICK: Duration = Duration::from_millis(10);

/// The shortest range [`range_bytes`] sizes a load's ranges down to: a request's first byte
/// costs a round trip or more, so shorter ranges would pay it for too few bytes.
pub const RANGE_MIN_BYTES: u64 = 1 << 20;
/// The fewest ranges [`range_bytes`] gives a load (while they can still be halved): half the
/// start depth. Measured from nginx on loopback, 64 MiB in fresh `tensora load` processes: where
/// each connection is limited to 50 MB/s (as object stores limit theirs), 8 ranges took 0.19 s,
/// 32 ranges 0.10 s and 64 ranges 0.076 s; where the server itself bounds the load, every
/// request costs it: s3rver (one process) loaded 256 MiB in 0.83 s in 64 ranges against 0.62 s in
/// 32, and nginx unlimited 64 MiB in 0.088 s in 64 against 0.072 s in 8. Half the start depth
/// keeps most of the first gain and none of the s3rver loss.
pub const LOAD_RANGES_MIN: u64 = START_DEPTH as u64 / 2;

/// The range length of a self-tuned load of `selected_bytes` whose ranges are at most
/// `chunk_bytes`: the chunk, halved while the load has fewer than `LOAD_RANGES_MIN` ranges and
/// the half is at least `RANGE_MIN_BYTES`. On a link that limits each connection (as object
/// stores do), a load's throughput is at most its ranges in flight times that limit: 64 MiB in
/// 8 MiB ranges is 8 connections.
///
/// ```
/// use tensora_remote::range_bytes;
///
/// const MIB: u64 = 1 << 20;
/// // 256 MiB is 32 ranges of 8 MiB (`LOAD_RANGES_MIN`): enough.
/// assert_eq!(range_bytes(256 * MIB, 8 * MIB), 8 * MIB);
/// // 64 MiB: 32 ranges of 2 MiB.
/// assert_eq!(range_bytes(64 * MIB, 8 * MIB), 2 * MIB);
/// // Never below the 1 MiB floor (`RANGE_MIN_BYTES`), nor above the chunk asked for.
/// assert_eq!(range_bytes(10 * MIB, 8 * MIB), MIB);
/// assert_eq!(range_bytes(MIB, 512 << 10), 512 << 10);
/// ```
pub fn range_bytes(selected_bytes: u64, chunk_bytes: u64) -> u64 {
    let mut range = chunk_bytes.max(1);
    while range / 2 >= RANGE_MIN_BYTES && selected_bytes.div_ceil(range) < LOAD_RANGES_MIN {
        range /= 2;
    }
    range
}

/// How the depth is chosen.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Tuning {
    /// Probe upward from `START_DEPTH` to at most `reads_inflight_max` (the default).
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
    /// The byte counter when the depth last changed (or at the first observation).
    changed_at_bytes: Option<u64>,
    /// Where the current window opened: the byte counter and the time.
    window_start: Option<(u64, Instant)>,
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
    /// The length of one range (the windows are counted in ranges' bytes).
    range_bytes: u64,
    /// Whether it has not settled yet (read on every tick of every issuing loop, lock-free).
    probing: AtomicBool,
    max: usize,
    tuning: Tuning,
    state: Mutex<State>,
}

impl Tuner {
    /// A controller for a run that may keep at most `max` ranges of `range_bytes` in flight.
    pub fn new(tuning: Tuning, max: usize, range_bytes: u64) -> Tuner {
        let max = max.max(1);
        let (depth, settled) = match tuning {
            Tuning::Fixed => (max, Some(format!("fixed at {max} in flight"))),
            Tuning::Auto => (START_DEPTH.min(max), None),
        };
        let state = State {
            changed_at_bytes: None,
            window_start: None,
            best: None,
            probes: Vec::new(),
            settled,
            remeasured: false,
        };
        let probing = AtomicBool::new(state.settled.is_none());
        let range_bytes = range_bytes.max(1);
        Tuner { depth: AtomicUsize::new(depth), range_bytes, probing, max, tuning, state: Mutex::new(state) }
    }

    /// Ranges to keep in flight now.
    pub fn depth(&self) -> usize {
        self.depth.load(Ordering::Acquire)
    }

    /// Whether the controller still changes the depth (the issuing loops then tick).
    pub fn probing(&self) -> bool {
        self.probing.load(Ordering::Acquire)
    }

    /// The load's byte counter read `arrived_bytes` (body bytes so far, counted as they arrive)
    /// at `now`. The first observation is the start: call it before the first range is issued.
    pub fn observe(&self, arrived_bytes: u64, now: Instant) {
        // Settled: every landing of the rest of the load returns here, without the lock.
        if !self.probing() {
            return;
        }
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if s.settled.is_some() {
            return;
        }
        let depth = self.depth();
        let inflight_bytes = (depth as u64).saturating_mul(self.range_bytes);
        let changed_at = *s.changed_at_bytes.get_or_insert(arrived_bytes);
        let Some((start_bytes, start)) = s.window_start else {
            // Warm-up: the pipeline fills to the new depth; the window opens at its end.
            if arrived_bytes.saturating_sub(changed_at) >= inflight_bytes / WARM_UP_DIVISOR {
                s.window_start = Some((arrived_bytes, now));
            }
            return;
        };
        let window_bytes = arrived_bytes.saturating_sub(start_bytes);
        if window_bytes < inflight_bytes / WINDOW_DIVISOR {
            return;
        }
        let seconds = now.saturating_duration_since(start).as_secs_f64().max(1e-9);
        let probe = Probe { depth, gbps: window_bytes as f64 / seconds / 1e9 };
        s.probes.push(probe);
        let stalled = s.best.is_some_and(|b| probe.gbps < b.gbps * STALL_FRACTION);
        if stalled && !s.remeasured {
            s.remeasured = true;
            s.window_start = Some((arrived_bytes, now));
            return;
        }
        s.remeasured = false;
        let better = s.best.is_none_or(|b| probe.gbps > b.gbps * (1.0 + GAIN_MIN));
        let next = match s.best {
            _ if better && depth >= self.max => {
                let gaining = if s.best.is_some() { " still gaining" } else { "" };
                s.best = Some(probe);
                Err(format!(
                    "reached the in-flight budget ({} ranges: the most the options, the byte budget and \
                     the load's ranges allow){gaining}",
                    self.max
                ))
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
                s.changed_at_bytes = Some(arrived_bytes);
                s.window_start = None;
            }
            Err(why) => {
                let settle = s.best.map_or(depth, |b| b.depth);
                self.depth.store(settle, Ordering::Release);
                s.settled = Some(format!("settled on {settle} in flight: {why}"));
                self.probing.store(false, Ordering::Release);
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

    /// Ranges of 8 MiB, the default.
    const RANGE: u64 = 8 << 20;

    /// Drive a tuner with a synthetic link: `gbps(depth)`, observed every 1 MiB, until
    /// `mib` MiB have arrived. Time is synthetic too: nothing here reads a clock.
    fn drive(tuner: &Tuner, gbps: impl Fn(usize) -> f64, mib: usize) {
        drive_on(tuner, gbps, mib, &mut (Instant::now(), 0));
    }

    /// [`drive`], going on from `link`: the clock and the byte counter.
    fn drive_on(tuner: &Tuner, gbps: impl Fn(usize) -> f64, mib: usize, link: &mut (Instant, u64)) {
        let step = 1u64 << 20;
        for _ in 0..mib {
            let rate = gbps(tuner.depth()) * 1e9;
            link.0 += Duration::from_secs_f64(step as f64 / rate);
            link.1 += step;
            tuner.observe(link.1, link.0);
        }
    }

    #[test]
    fn settles_where_throughput_stops_growing() {
        const S: usize = START_DEPTH;
        let tuner = Tuner::new(Tuning::Auto, 4 * S, RANGE);
        drive(&tuner, |d| (d.min(8) as f64) * 0.2, 8000);
        let r = tuner.report();
        assert_eq!(r.depth, S, "{r:?}");
        assert!(r.reason.contains(&format!("settled on {S}")), "{r:?}");
        assert_eq!(r.probes.iter().map(|p| p.depth).collect::<Vec<_>>(), [S, 2 * S]);
        // One window that stalls is measured again; a depth that stays good is kept.
        let tuner = Tuner::new(Tuning::Auto, 4 * S, RANGE);
        // The first bytes at 2S (its warm-up and first window: 6S MiB) crawl: another process's
        // burst.
        let at_double = std::cell::Cell::new(0);
        let link = |d: usize| {
            if d == 2 * S {
                at_double.set(at_double.get() + 1);
            }
            if d == 2 * S && at_double.get() <= 6 * S { 0.1 } else { d.min(2 * S) as f64 * 0.2 }
        };
        drive(&tuner, link, 32000);
        let r = tuner.report();
        assert_eq!(r.depth, 2 * S, "{r:?}");
        assert_eq!(r.probes.iter().map(|p| p.depth).collect::<Vec<_>>(), [S, 2 * S, 2 * S, 4 * S]);
    }

    /// A window counts bytes as they arrive: at 64 ranges of 8 MiB, the first closes once 64 MiB
    /// of warm-up and 128 MiB of window have arrived, whatever has landed.
    #[test]
    fn a_window_closes_after_its_bytes_arrive() {
        const S: usize = START_DEPTH;
        let inflight_mib = S * (RANGE >> 20) as usize;
        let first = inflight_mib / WARM_UP_DIVISOR as usize + inflight_mib / WINDOW_DIVISOR as usize;
        let tuner = Tuner::new(Tuning::Auto, 2 * S, RANGE);
        let link = &mut (Instant::now(), 0);
        tuner.observe(0, link.0);
        drive_on(&tuner, |d| d as f64 * 0.05, first - 1, link);
        assert!(tuner.report().probes.is_empty(), "{:?}", tuner.report());
        assert_eq!(tuner.depth(), S);
        drive_on(&tuner, |d| d as f64 * 0.05, 1, link);
        assert_eq!(tuner.report().probes.len(), 1, "{:?}", tuner.report());
        assert_eq!(tuner.depth(), 2 * S);
        assert!(tuner.probing());
        // Within a load of 2S ranges, the doubled depth is measured too, and the tuner settles.
        drive_on(&tuner, |d| d as f64 * 0.05, 2 * inflight_mib - first, link);
        assert_eq!(tuner.report().probes.iter().map(|p| p.depth).collect::<Vec<_>>(), [S, 2 * S]);
        assert!(!tuner.probing());
    }

    #[test]
    fn backs_off_from_a_collapse_and_climbs_to_the_budget_when_it_keeps_gaining() {
        const S: usize = START_DEPTH;
        let tuner = Tuner::new(Tuning::Auto, 4 * S, RANGE);
        drive(&tuner, |d| if d >= 2 * S { 0.5 } else { d as f64 * 0.25 }, 8000);
        assert_eq!(tuner.depth(), S);
        let r = tuner.report();
        assert_eq!(r.probes.iter().map(|p| p.depth).collect::<Vec<_>>(), [S, 2 * S, 2 * S], "{r:?}");
        // 50 MB/s per connection: every doubling doubles throughput, up to the budget.
        let tuner = Tuner::new(Tuning::Auto, 3 * S / 2, RANGE);
        drive(&tuner, |d| d as f64 * 0.05, 16000);
        let r = tuner.report();
        assert_eq!(r.depth, 3 * S / 2, "{r:?}");
        assert!(r.reason.contains("in-flight budget") && r.reason.contains("still gaining"), "{r:?}");
        // A budget below the start: the start is the budget's depth, and its first window ends
        // the probe (with nothing before it to gain on).
        let small = Tuner::new(Tuning::Auto, 12, RANGE);
        assert_eq!(small.depth(), 12);
        drive(&small, |d| d as f64 * 0.05, 100);
        let r = small.report();
        assert_eq!((r.depth, r.probes.len()), (12, 1), "{r:?}");
        assert!(r.reason.contains("in-flight budget") && !r.reason.contains("gaining"), "{r:?}");
        let fixed = Tuner::new(Tuning::Fixed, 12, RANGE);
        drive(&fixed, |d| d as f64, 800);
        assert_eq!((fixed.depth(), fixed.report().probes.len()), (12, 0));
    }

    proptest! {
        /// A load's ranges are at most the chunk and at least the floor (or the chunk, if
        /// shorter); a range shorter than the chunk was halved from one that left the load fewer
        /// than LOAD_RANGES_MIN ranges; and a range that could still be halved leaves it enough.
        #[test]
        fn ranges_shrink_only_to_fill_the_start_depth(selected in 0u64..(4 << 30), chunk in 1u64..(64 << 20)) {
            let range = range_bytes(selected, chunk);
            prop_assert!(range <= chunk && range >= chunk.min(RANGE_MIN_BYTES));
            if range < chunk {
                prop_assert!(selected.div_ceil(range * 2) < LOAD_RANGES_MIN);
            }
            if range / 2 >= RANGE_MIN_BYTES {
                prop_assert!(selected.div_ceil(range) >= LOAD_RANGES_MIN);
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Whatever the link does, the depth stays within 1..=max, and once settled it never
        /// changes again.
        #[test]
        fn the_depth_stays_within_the_budget(max in 1usize..100, rates in proptest::collection::vec(0.01f64..10.0, 8)) {
            let tuner = Tuner::new(Tuning::Auto, max, RANGE);
            drive(&tuner, |d| rates[d.trailing_zeros() as usize % rates.len()], 16000);
            let settled = tuner.depth();
            prop_assert!((1..=max).contains(&settled));
            drive(&tuner, |d| rates[(d + 1) % rates.len()], 1600);
            prop_assert_eq!(tuner.depth(), settled);
        }
    }
}
