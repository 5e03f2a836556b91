//! How far an acceptance value could move by chance: a bootstrap over the runs behind it.
//!
//! Single loads on this 2-core machine differ by up to 3× within a cell (docs/design.md,
//! Measuring remote loads), so a median of 5 moves by ±15 % between runs of the bench, and a
//! ratio of two such medians by more. Each check therefore carries an interval: the value
//! recomputed from every cell's runs resampled with replacement, [`DRAWS`] times, the best
//! fixed depth chosen again in every draw (picking the largest of several noisy medians favours
//! the luckiest, which a fixed choice would hide). The seed is fixed, so the same runs give the
//! same interval.

use super::median;

/// Bootstrap draws per check: the interval's ends move by well under 1 % between seeds at this
/// count, and a check costs `DRAWS × cells × runs` samples, microseconds.
pub const DRAWS: usize = 2000;
/// The share of draws below the interval and the share above it: a 90 % interval.
pub const TAIL: f64 = 0.05;
/// The generator's fixed seed.
const SEED: u64 = 0x7e45_07a5_eed0_0016;

/// One cell's runs as a check sees them: its bytes and the seconds of each run.
#[derive(Clone, Copy)]
pub struct Runs<'a> {
    pub bytes: u64,
    pub seconds: &'a [f64],
}

/// GB/s of `bytes` in `seconds`: the one unit every cell and check of the bench reports in.
pub fn gbps(bytes: u64, seconds: f64) -> f64 {
    bytes as f64 / seconds / 1e9
}

/// SplitMix64: a small, seeded generator; the bootstrap needs reproducibility, not secrecy.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// An index below `len` (> 0); the modulo's bias is below 2^-50 for a bench's run counts.
    fn below(&mut self, len: usize) -> usize {
        (self.next() % len as u64) as usize
    }
}

/// The 90 % bootstrap interval of `value` over `cells`: each draw resamples every cell's runs,
/// hands `value` each cell's GB/s from the resampled median (in `cells`' order), and the
/// interval is the [`TAIL`] and `1 - TAIL` quantiles of the draws. `None` when a cell has no
/// runs.
pub fn interval(cells: &[Runs<'_>], value: impl Fn(&[f64]) -> f64) -> Option<(f64, f64)> {
    if cells.is_empty() || cells.iter().any(|c| c.seconds.is_empty()) {
        return None;
    }
    let mut rng = SplitMix(SEED);
    let mut resampled = Vec::new();
    let mut each_gbps = vec![0.0; cells.len()];
    let mut draws: Vec<f64> = (0..DRAWS)
        .map(|_| {
            for (g, cell) in each_gbps.iter_mut().zip(cells) {
                resampled.clear();
                resampled
                    .extend((0..cell.seconds.len()).map(|_| cell.seconds[rng.below(cell.seconds.len())]));
                *g = gbps(cell.bytes, median(&resampled));
            }
            value(&each_gbps)
        })
        .collect();
    draws.sort_by(f64::total_cmp);
    let at = |q: f64| draws[((DRAWS - 1) as f64 * q).round() as usize];
    Some((at(TAIL), at(1.0 - TAIL)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_runs_give_a_point_and_spread_runs_an_interval_around_the_value() {
        let same = [1.0; 5];
        let runs = Runs { bytes: 1_000_000_000, seconds: &same };
        assert_eq!(interval(&[runs], |g| g[0]), Some((1.0, 1.0)));

        let spread = [0.8, 0.9, 1.0, 1.1, 1.2];
        let a = Runs { bytes: 1_000_000_000, seconds: &spread };
        let (lo, hi) = interval(&[a, runs], |g| g[0] / g[1]).unwrap();
        assert!(lo < 1.0 && 1.0 < hi, "{lo} {hi}");
        assert!(lo >= 1.0 / 1.2 && hi <= 1.0 / 0.8, "{lo} {hi}");
        // Reproducible: the seed is fixed.
        assert_eq!(interval(&[a, runs], |g| g[0] / g[1]), Some((lo, hi)));
    }

    #[test]
    fn a_cell_without_runs_has_no_interval() {
        let none: [f64; 0] = [];
        assert_eq!(interval(&[Runs { bytes: 1, seconds: &none }], |g| g[0]), None);
        assert_eq!(interval(&[], |_| 1.0), None);
    }
}
