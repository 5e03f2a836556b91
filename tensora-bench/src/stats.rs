//! Summaries of repeated measurements.

use serde::{Deserialize, Serialize};

/// Bytes per gigabyte, as used for every GB/s figure (decimal, like disk vendors and `dd`).
pub const BYTES_PER_GB: f64 = 1e9;

/// Throughput in GB/s for `bytes` moved in `seconds` (0 when no time was measured).
pub fn gbps(bytes: u64, seconds: f64) -> f64 {
    if seconds > 0.0 { bytes as f64 / BYTES_PER_GB / seconds } else { 0.0 }
}

/// Median, minimum and maximum of a set of samples.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// The middle value (the mean of the two middle ones for an even count).
    pub median: f64,
    /// The smallest value.
    pub min: f64,
    /// The largest value.
    pub max: f64,
    /// How many values.
    pub count: usize,
}

impl Summary {
    /// Summarise `samples`; `None` when empty or when any sample is NaN.
    ///
    /// ```
    /// let s = tensora_bench::Summary::of(&[3.0, 1.0, 2.0, 10.0]).unwrap();
    /// assert_eq!((s.median, s.min, s.max, s.count), (2.5, 1.0, 10.0, 4));
    /// ```
    pub fn of(samples: &[f64]) -> Option<Summary> {
        if samples.is_empty() || samples.iter().any(|x| x.is_nan()) {
            return None;
        }
        let mut sorted = samples.to_vec();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        let median = if n % 2 == 1 { sorted[n / 2] } else { (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0 };
        Some(Summary { median, min: sorted[0], max: sorted[n - 1], count: n })
    }
}

impl Summary {
    /// `median (min..max)` with two decimals, or `-` for no summary.
    pub fn text(summary: Option<Summary>) -> String {
        summary.map_or("-".to_owned(), |s| format!("{:.2} ({:.2}..{:.2})", s.median, s.min, s.max))
    }
}

/// `value / reference`, or `None` when the reference is not a positive number.
pub fn ratio(value: f64, reference: f64) -> Option<f64> {
    (reference > 0.0 && reference.is_finite()).then(|| value / reference)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn odd_even_and_single() {
        assert_eq!(Summary::of(&[5.0]).unwrap(), Summary { median: 5.0, min: 5.0, max: 5.0, count: 1 });
        let s = Summary::of(&[4.0, 1.0, 9.0]).unwrap();
        assert_eq!((s.median, s.min, s.max), (4.0, 1.0, 9.0));
        assert_eq!(Summary::of(&[1.0, 2.0, 3.0, 4.0]).unwrap().median, 2.5);
        assert!(Summary::of(&[]).is_none());
        assert!(Summary::of(&[1.0, f64::NAN]).is_none());
        assert_eq!(Summary::text(Summary::of(&[1.0, 2.0, 4.0])), "2.00 (1.00..4.00)");
        assert_eq!(Summary::text(None), "-");
    }

    #[test]
    fn throughput_and_ratio() {
        assert_eq!(gbps(2_000_000_000, 2.0), 1.0);
        assert_eq!(gbps(1, 0.0), 0.0);
        assert_eq!(ratio(1.0, 4.0), Some(0.25));
        assert_eq!(ratio(1.0, 0.0), None);
        assert_eq!(ratio(1.0, f64::INFINITY), None);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn median_lies_between_min_and_max(samples in proptest::collection::vec(0.0f64..1e6, 1..40)) {
            let s = Summary::of(&samples).unwrap();
            prop_assert!(s.min <= s.median && s.median <= s.max);
            prop_assert_eq!(s.count, samples.len());
            prop_assert!(samples.iter().all(|&x| x >= s.min && x <= s.max));
            // At least half the samples are <= the median and at least half are >= it.
            let below = samples.iter().filter(|&&x| x <= s.median).count();
            let above = samples.iter().filter(|&&x| x >= s.median).count();
            prop_assert!(2 * below >= samples.len() && 2 * above >= samples.len());
        }

        #[test]
        fn order_does_not_matter(mut samples in proptest::collection::vec(0.0f64..1e6, 1..40)) {
            let a = Summary::of(&samples).unwrap();
            samples.reverse();
            prop_assert_eq!(a, Summary::of(&samples).unwrap());
        }
    }
}
