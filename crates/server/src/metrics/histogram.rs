//! A histogram the data path can feed without a lock: fixed bucket
//! bounds, one atomic count per bucket, the sum kept in whole units
//! (nanoseconds, records). `observe_many` adds one value many times at
//! the price of one, which a group commit needs (every record of a batch
//! waited for the same fdatasync). It is encoded by prometheus-client as
//! a Prometheus histogram (cumulative `le` buckets, `_sum`, `_count`).

use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;

/// Bucket bounds of latencies, in nanoseconds: 10 µs to 10 s, about
/// 2.5 × apart (a disk's fdatasync takes 50 µs to tens of ms).
pub(crate) const LATENCY_BOUNDS_NANOS: [u64; 19] = [
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
    5_000_000_000,
    10_000_000_000,
];

/// Bucket bounds of counts (records in one fdatasync): powers of two.
pub(crate) const COUNT_BOUNDS: [u64; 14] = [
    1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192,
];

/// A histogram of whole-unit values; `scale` turns a unit into what the
/// metric is named in (1e-9 for nanoseconds shown as seconds).
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [u64],
    scale: f64,
    /// Values at most `bounds[i]` and above `bounds[i - 1]`; the last
    /// slot holds those above every bound.
    buckets: Box<[AtomicU64]>,
    count: AtomicU64,
    sum: AtomicU64,
}

impl Histogram {
    pub(crate) fn new(bounds: &'static [u64], scale: f64) -> Histogram {
        assert!(bounds.len() < 32, "observe_all counts at most 32 buckets");
        Histogram {
            bounds,
            scale,
            buckets: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            sum: AtomicU64::new(0),
        }
    }

    /// A latency histogram, observed in nanoseconds, shown in seconds.
    pub(crate) fn latency() -> Histogram {
        Histogram::new(&LATENCY_BOUNDS_NANOS, 1e-9)
    }

    /// A histogram of counts, shown as they are.
    pub(crate) fn counts() -> Histogram {
        Histogram::new(&COUNT_BOUNDS, 1.0)
    }

    pub(crate) fn observe(&self, value: u64) {
        self.observe_many(value, 1);
    }

    /// Adds `value` `times` times.
    pub(crate) fn observe_many(&self, value: u64, times: u64) {
        if times == 0 {
            return;
        }
        let slot = self.bounds.partition_point(|&bound| bound < value);
        self.buckets[slot].fetch_add(times, Ordering::Relaxed);
        self.count.fetch_add(times, Ordering::Relaxed);
        self.sum
            .fetch_add(value.saturating_mul(times), Ordering::Relaxed);
    }

    /// Adds every value of `values`, with one atomic add per bucket that
    /// takes any rather than three per value (a batch's records).
    pub(crate) fn observe_all(&self, values: impl Iterator<Item = u64>) {
        let mut counts = [0u64; 32];
        let (mut count, mut sum) = (0u64, 0u64);
        for value in values {
            let slot = self.bounds.partition_point(|&bound| bound < value);
            counts[slot.min(counts.len() - 1)] += 1;
            count += 1;
            sum = sum.saturating_add(value);
        }
        if count == 0 {
            return;
        }
        for (slot, &n) in counts.iter().enumerate().take(self.buckets.len()) {
            if n > 0 {
                self.buckets[slot].fetch_add(n, Ordering::Relaxed);
            }
        }
        self.count.fetch_add(count, Ordering::Relaxed);
        self.sum.fetch_add(sum, Ordering::Relaxed);
    }

    /// Values observed so far.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// (upper bound, values in that bucket alone), the last bound
    /// `f64::MAX` (what prometheus-client writes as `+Inf`; it makes the
    /// counts cumulative as it writes them); the sum; the count (the
    /// buckets' total, so the three agree however observations race the
    /// read).
    fn snapshot(&self) -> (Vec<(f64, u64)>, f64, u64) {
        let mut count = 0;
        let mut buckets = Vec::with_capacity(self.buckets.len());
        for (index, slot) in self.buckets.iter().enumerate() {
            let values = slot.load(Ordering::Relaxed);
            count += values;
            let bound = self
                .bounds
                .get(index)
                .map_or(f64::MAX, |&b| b as f64 * self.scale);
            buckets.push((bound, values));
        }
        let sum = self.sum.load(Ordering::Relaxed) as f64 * self.scale;
        (buckets, sum, count)
    }
}

impl EncodeMetric for Histogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let (buckets, sum, count) = self.snapshot();
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

impl EncodeMetric for &Histogram {
    fn encode(&self, encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        (**self).encode(encoder)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_land_in_the_first_bucket_that_holds_them() {
        let histogram = Histogram::counts();
        histogram.observe(1);
        histogram.observe_many(3, 5);
        histogram.observe(100_000);
        histogram.observe_all([2, 2].into_iter());
        let (buckets, sum, count) = histogram.snapshot();
        assert_eq!(count, 9);
        assert_eq!(histogram.count(), 9);
        assert_eq!(sum, 1.0 + 15.0 + 100_000.0 + 4.0);
        assert_eq!(buckets[0], (1.0, 1));
        assert_eq!(buckets[1], (2.0, 2));
        assert_eq!(buckets[2], (4.0, 5));
        assert_eq!(buckets[COUNT_BOUNDS.len() - 1], (8192.0, 0));
        assert_eq!(buckets[COUNT_BOUNDS.len()], (f64::MAX, 1));
    }

    #[test]
    fn latencies_are_shown_in_seconds() {
        let histogram = Histogram::latency();
        histogram.observe(30_000);
        let (buckets, sum, _) = histogram.snapshot();
        assert!((sum - 30e-6).abs() < 1e-12);
        assert_eq!(buckets[1].1, 0, "25 µs holds nothing");
        assert_eq!(buckets[2].1, 1, "the 50 µs bucket holds the 30 µs value");
        assert!((buckets[2].0 - 50e-6).abs() < 1e-12);
    }
}
