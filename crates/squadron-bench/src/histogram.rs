//! A latency histogram with bounded memory and a bounded relative error, in microseconds.
//!
//! Log-linear buckets in the manner of HDR histograms: values below `2 * SUB_BUCKETS` are
//! exact; above, every power-of-two range is split into `SUB_BUCKETS` equal buckets, so a
//! reported percentile is at most `1 / SUB_BUCKETS` (1.6 %) above the true sample. Storing every
//! sample instead would grow without bound at hundreds of thousands of operations per point.

use serde::{Deserialize, Serialize};

/// Buckets per power of two (2^SUB_BUCKET_BITS).
const SUB_BUCKET_BITS: u32 = 6;
const SUB_BUCKETS: u64 = 1 << SUB_BUCKET_BITS;
/// The largest value kept apart; larger samples count as this (about 19 hours).
pub const LATENCY_US_MAX: u64 = 1 << 36;

/// A histogram of latencies in microseconds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LatencyHistogram {
    counts: Vec<u64>,
    count: u64,
    sum_us: u128,
    min_us: u64,
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

fn bucket_of(value_us: u64) -> usize {
    let v = value_us.min(LATENCY_US_MAX);
    if v < 2 * SUB_BUCKETS {
        return v as usize;
    }
    let msb = 63 - v.leading_zeros();
    let exponent = msb - SUB_BUCKET_BITS;
    (SUB_BUCKETS * u64::from(exponent) + (v >> exponent)) as usize
}

/// The largest value that falls in bucket `index`.
fn bucket_upper(index: usize) -> u64 {
    let i = index as u64;
    if i < 2 * SUB_BUCKETS {
        return i;
    }
    let exponent = i / SUB_BUCKETS - 1;
    let mantissa = i - SUB_BUCKETS * exponent;
    ((mantissa + 1) << exponent) - 1
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self::new()
    }
}

impl LatencyHistogram {
    pub fn new() -> Self {
        Self {
            counts: vec![0; bucket_of(LATENCY_US_MAX) + 1],
            count: 0,
            sum_us: 0,
            min_us: u64::MAX,
            max_us: 0,
        }
    }

    /// Records one sample.
    pub fn record(&mut self, value_us: u64) {
        let v = value_us.min(LATENCY_US_MAX);
        if let Some(c) = self.counts.get_mut(bucket_of(v)) {
            *c += 1;
        }
        self.count += 1;
        self.sum_us += u128::from(v);
        self.min_us = self.min_us.min(v);
        self.max_us = self.max_us.max(v);
    }

    /// Adds another histogram's samples to this one.
    pub fn merge(&mut self, other: &LatencyHistogram) {
        for (mine, theirs) in self.counts.iter_mut().zip(&other.counts) {
            *mine += theirs;
        }
        self.count += other.count;
        self.sum_us += other.sum_us;
        self.min_us = self.min_us.min(other.min_us);
        self.max_us = self.max_us.max(other.max_us);
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    /// The nearest-rank percentile (`q` in 0..=1): the upper bound of the bucket holding the
    /// smallest sample with at least `q` of the samples at or below it, never above the
    /// largest sample. 0 when empty.
    pub fn percentile_us(&self, q: f64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.count as f64).ceil() as u64).clamp(1, self.count);
        let mut seen = 0u64;
        for (index, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return bucket_upper(index).min(self.max_us);
            }
        }
        self.max_us
    }

    pub fn summary(&self) -> LatencySummary {
        if self.count == 0 {
            return LatencySummary::default();
        }
        let ms = |us: u64| us as f64 / 1_000.0;
        LatencySummary {
            count: self.count,
            mean_ms: self.sum_us as f64 / self.count as f64 / 1_000.0,
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

    #[test]
    fn buckets_are_contiguous_and_bounded() {
        let mut previous_upper = None;
        for index in 0..=bucket_of(LATENCY_US_MAX) {
            let upper = bucket_upper(index);
            if let Some(p) = previous_upper {
                assert_eq!(bucket_of(p + 1), index, "value after bucket {} ", index - 1);
            }
            assert_eq!(bucket_of(upper), index);
            previous_upper = Some(upper);
        }
        for v in [1u64, 127, 128, 129, 1_000, 65_535, 1_234_567, 99_999_999] {
            let upper = bucket_upper(bucket_of(v));
            assert!(upper >= v, "{v}");
            assert!(
                (upper - v) as f64 <= v as f64 / SUB_BUCKETS as f64,
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
                (got - exact) as f64 <= exact as f64 / SUB_BUCKETS as f64,
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
}
