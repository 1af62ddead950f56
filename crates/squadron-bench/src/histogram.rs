//! A latency histogram with bounded memory and a bounded relative error, in microseconds: an
//! HDR histogram (`hdrhistogram`) plus the exact sum and maximum, so the mean and the largest
//! sample are reported as measured. Storing every sample instead would grow without bound at
//! hundreds of thousands of operations per point.
//!
//! The load of `bench compare` keeps one histogram per client (up to 4,096 clients), so it
//! uses [`LatencyHistogram::new`]: two significant digits, values below 256 µs exact, above
//! that a reported percentile at most 1/128 (0.8 %) above the true sample, about 20 KiB each.
//! `squadron bench` keeps four per client and uses three digits
//! ([`LatencyHistogram::with_significant_digits`]): exact below 2,048 µs, 0.05 % above.

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// The largest value kept apart; larger samples count as this (about 19 hours).
pub const LATENCY_US_MAX: u64 = 1 << 36;
/// Significant digits of [`LatencyHistogram::new`].
pub const SIGNIFICANT_DIGITS_DEFAULT: u8 = 2;
/// Most significant digits an HDR histogram keeps.
pub const SIGNIFICANT_DIGITS_MAX: u8 = 5;

/// A histogram of latencies in microseconds.
#[derive(Debug, Clone, PartialEq)]
pub struct LatencyHistogram {
    histogram: Histogram<u64>,
    sum_us: u128,
    max_us: u64,
}

/// The summary of a histogram, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct LatencySummary {
    pub count: u64,
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self::new()
    }
}

impl LatencyHistogram {
    /// Two significant digits: small enough for one histogram per client.
    pub fn new() -> Self {
        Self::with_significant_digits(SIGNIFICANT_DIGITS_DEFAULT)
    }

    /// A histogram keeping `digits` significant digits (1..=5; out-of-range values are
    /// clamped). It grows with the largest sample recorded, up to [`LATENCY_US_MAX`].
    pub fn with_significant_digits(digits: u8) -> Self {
        let digits = digits.clamp(1, SIGNIFICANT_DIGITS_MAX);
        // Auto-resizing: the counts cover the largest sample seen, not all of LATENCY_US_MAX.
        let histogram =
            Histogram::new(digits).expect("an HDR histogram takes 1..=5 significant digits");
        Self {
            histogram,
            sum_us: 0,
            max_us: 0,
        }
    }

    /// Records one sample.
    pub fn record(&mut self, value_us: u64) {
        let v = value_us.min(LATENCY_US_MAX);
        // Auto-resizing, so `record` grows the counts; saturating is the fallback should it
        // ever refuse.
        if self.histogram.record(v).is_err() {
            self.histogram.saturating_record(v);
        }
        self.sum_us += u128::from(v);
        self.max_us = self.max_us.max(v);
    }

    /// Adds another histogram's samples to this one.
    pub fn merge(&mut self, other: &LatencyHistogram) {
        if self.histogram.add(&other.histogram).is_err() {
            // Only a histogram of other bounds can be refused; add its samples one value at a
            // time instead.
            for v in other.histogram.iter_recorded() {
                let value = v.value_iterated_to();
                if self.histogram.record_n(value, v.count_at_value()).is_err() {
                    self.histogram
                        .saturating_record_n(value, v.count_at_value());
                }
            }
        }
        self.sum_us += other.sum_us;
        self.max_us = self.max_us.max(other.max_us);
    }

    pub fn count(&self) -> u64 {
        self.histogram.len()
    }

    /// The nearest-rank percentile (`q` in 0..=1): the upper bound of the bucket holding the
    /// smallest sample with at least `q` of the samples at or below it, never above the
    /// largest sample. 0 when empty.
    pub fn percentile_us(&self, q: f64) -> u64 {
        if self.count() == 0 {
            return 0;
        }
        self.histogram
            .value_at_quantile(q.clamp(0.0, 1.0))
            .min(self.max_us)
    }

    pub fn summary(&self) -> LatencySummary {
        let count = self.count();
        if count == 0 {
            return LatencySummary::default();
        }
        let ms = |us: u64| us as f64 / 1_000.0;
        LatencySummary {
            count,
            mean_ms: self.sum_us as f64 / count as f64 / 1_000.0,
            p50_ms: ms(self.percentile_us(0.50)),
            p99_ms: ms(self.percentile_us(0.99)),
            p999_ms: ms(self.percentile_us(0.999)),
            max_ms: ms(self.max_us),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The relative error the default histogram promises above its exact range.
    const RELATIVE_ERROR_MAX: f64 = 1.0 / 128.0;

    #[test]
    fn buckets_are_contiguous_and_bounded() {
        let h = LatencyHistogram::new().histogram;
        // Every value falls in a bucket whose upper bound is at or above it, and the next
        // bucket starts right after that bound.
        let mut v = 0u64;
        while v < 10_000_000 {
            let upper = h.highest_equivalent(v);
            assert!(upper >= v, "{v}");
            assert_eq!(h.lowest_equivalent(upper + 1), upper + 1, "after {upper}");
            v = upper + 1 + v / 7;
        }
        for v in [1u64, 127, 128, 129, 1_000, 65_535, 1_234_567, 99_999_999] {
            let upper = h.highest_equivalent(v);
            assert!(upper >= v, "{v}");
            assert!(
                (upper - v) as f64 <= v as f64 * RELATIVE_ERROR_MAX,
                "{v} -> {upper}"
            );
        }
    }

    #[test]
    fn small_values_are_exact_percentiles() {
        let mut h = LatencyHistogram::new();
        for v in 1..=100u64 {
            h.record(v);
        }
        assert_eq!(h.percentile_us(0.50), 50);
        assert_eq!(h.percentile_us(0.99), 99);
        assert_eq!(h.percentile_us(0.999), 100);
        assert_eq!(h.percentile_us(0.0), 1);
        let s = h.summary();
        assert_eq!(s.count, 100);
        assert!((s.mean_ms - 0.0505).abs() < 1e-9, "{s:?}");
        assert!((s.max_ms - 0.1).abs() < 1e-9);
    }

    #[test]
    fn large_values_stay_within_relative_error() {
        let mut h = LatencyHistogram::new();
        // 10 000 samples: 1 ms .. 10 s, one of each multiple of 1 ms.
        for i in 1..=10_000u64 {
            h.record(i * 1_000);
        }
        for (q, exact) in [(0.5, 5_000_000u64), (0.99, 9_900_000), (0.999, 9_990_000)] {
            let got = h.percentile_us(q);
            assert!(got >= exact, "p{q}: {got} < {exact}");
            assert!(
                (got - exact) as f64 <= exact as f64 * RELATIVE_ERROR_MAX,
                "p{q}: {got} vs {exact}"
            );
        }
        assert_eq!(h.percentile_us(1.0), 10_000_000);
    }

    #[test]
    fn tail_percentiles_see_rare_slow_samples() {
        let mut h = LatencyHistogram::new();
        for _ in 0..9_980 {
            h.record(500);
        }
        for _ in 0..20 {
            h.record(200_000);
        }
        assert!(h.percentile_us(0.99) <= 510);
        let p999 = h.percentile_us(0.999);
        assert!((200_000..=203_200).contains(&p999), "{p999}");
    }

    #[test]
    fn merge_equals_recording_everything_in_one() {
        let mut a = LatencyHistogram::new();
        let mut b = LatencyHistogram::new();
        let mut all = LatencyHistogram::new();
        for v in 0..5_000u64 {
            let sample = v * 37 % 90_000;
            if v % 3 == 0 {
                a.record(sample);
            } else {
                b.record(sample);
            }
            all.record(sample);
        }
        a.merge(&b);
        assert_eq!(a, all);
    }

    #[test]
    fn empty_and_huge_values() {
        let h = LatencyHistogram::new();
        assert_eq!(h.percentile_us(0.5), 0);
        assert_eq!(h.summary(), LatencySummary::default());
        let mut h = LatencyHistogram::new();
        h.record(u64::MAX);
        assert_eq!(h.percentile_us(0.5), LATENCY_US_MAX);
    }

    #[test]
    fn more_digits_keep_larger_values_exact() {
        let mut h = LatencyHistogram::with_significant_digits(3);
        for v in 1..=2_000u64 {
            h.record(v);
        }
        assert_eq!(h.percentile_us(0.5), 1_000);
        assert_eq!(h.percentile_us(0.999), 1_998);
        // Out of range asks are clamped, not refused.
        let mut h = LatencyHistogram::with_significant_digits(9);
        h.record(123_456);
        assert_eq!(h.percentile_us(1.0), 123_456);
    }
}
