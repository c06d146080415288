//! Summary statistics and density estimates for latency and throughput samples.

/// Count, moments and nearest-rank percentiles of a sample.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Summary {
    pub count: usize,
    pub mean: f64,
    /// Sample standard deviation (divides by `count - 1`), zero for fewer than two samples.
    pub std_dev: f64,
    pub min: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

impl Summary {
    /// Summarises `samples`, ignoring NaN values.
    ///
    /// The input is copied and sorted, so callers may keep their samples in arrival order.
    /// An empty input (or one holding only NaN) gives a summary of zeros with `count` 0.
    pub fn of(samples: &[f64]) -> Summary {
        let sorted = sorted_without_nan(samples);
        if sorted.is_empty() {
            return Summary::default();
        }
        let count = sorted.len();
        let mean = sorted.iter().sum::<f64>() / count as f64;
        let std_dev = if count > 1 {
            let squares: f64 = sorted.iter().map(|value| (value - mean).powi(2)).sum();
            (squares / (count - 1) as f64).sqrt()
        } else {
            0.0
        };
        Summary {
            count,
            mean,
            std_dev,
            min: sorted[0],
            p50: nearest_rank(&sorted, 50.0),
            p90: nearest_rank(&sorted, 90.0),
            p99: nearest_rank(&sorted, 99.0),
            max: sorted[count - 1],
        }
    }

    /// Returns the summary as a JSON object with one field per statistic.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "count": self.count,
            "mean": self.mean,
            "std_dev": self.std_dev,
            "min": self.min,
            "p50": self.p50,
            "p90": self.p90,
            "p99": self.p99,
            "max": self.max,
        })
    }
}

/// Returns the percentile of an ascending, non-empty slice by the nearest-rank method.
///
/// Nearest rank always returns an observed value, which is what latency reports quote.
pub fn nearest_rank(sorted: &[f64], percentile: f64) -> f64 {
    let count = sorted.len();
    let rank = (percentile / 100.0 * count as f64).ceil() as usize;
    sorted[rank.clamp(1, count) - 1]
}

/// The median of a non-empty set of values, the lower of the two middle
/// ones for an even count (an observed value: with two rounds, neither
/// counts twice).
pub fn lower_median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    nearest_rank(&sorted, 50.0)
}

/// Copies the samples without NaN and sorts them ascending.
fn sorted_without_nan(samples: &[f64]) -> Vec<f64> {
    let mut sorted: Vec<f64> = samples
        .iter()
        .copied()
        .filter(|value| !value.is_nan())
        .collect();
    sorted.sort_by(f64::total_cmp);
    sorted
}

/// Estimates a probability density as a normalised histogram with `bins` bins.
///
/// Returns one `(bin centre, density)` point per bin; the densities times the bin width sum to 1.
/// The top 0.5% of samples are trimmed first because a few stragglers would otherwise
/// stretch the x axis and squash the body of the distribution into one bin.
/// Non-finite samples are ignored. Constant input gets a window of width 1 around the value
/// so the bin width is never zero. Empty input or zero bins give an empty vector.
pub fn density(samples: &[f64], bins: usize) -> Vec<(f64, f64)> {
    let mut sorted: Vec<f64> = samples
        .iter()
        .copied()
        .filter(|value| value.is_finite())
        .collect();
    if sorted.is_empty() || bins == 0 {
        return Vec::new();
    }
    sorted.sort_by(f64::total_cmp);
    let trimmed = sorted.len() * 5 / 1000;
    sorted.truncate(sorted.len() - trimmed);
    let (mut low, mut high) = (sorted[0], sorted[sorted.len() - 1]);
    if high - low <= 0.0 {
        low -= 0.5;
        high += 0.5;
    }
    let width = (high - low) / bins as f64;
    let mut counts = vec![0usize; bins];
    for value in &sorted {
        let index = ((value - low) / width) as usize;
        counts[index.min(bins - 1)] += 1;
    }
    let total = sorted.len() as f64;
    counts
        .iter()
        .enumerate()
        .map(|(index, count)| {
            let centre = low + (index as f64 + 0.5) * width;
            (centre, *count as f64 / (total * width))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lower_median_is_an_observed_value() {
        assert_eq!(lower_median(&[3.0]), 3.0);
        assert_eq!(lower_median(&[5.0, 1.0]), 1.0);
        assert_eq!(lower_median(&[2.0, 9.0, 4.0]), 4.0);
        assert_eq!(lower_median(&[4.0, 1.0, 3.0, 2.0]), 2.0);
    }

    #[test]
    fn summary_of_one_to_one_hundred_has_nearest_rank_percentiles() {
        let samples: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        let summary = Summary::of(&samples);
        assert_eq!(summary.count, 100);
        assert_eq!(summary.mean, 50.5);
        assert_eq!(summary.min, 1.0);
        assert_eq!(summary.p50, 50.0);
        assert_eq!(summary.p90, 90.0);
        assert_eq!(summary.p99, 99.0);
        assert_eq!(summary.max, 100.0);
        assert!((summary.std_dev - 29.011_491_975_882_016).abs() < 1e-9);
    }

    #[test]
    fn summary_of_a_small_vector_rounds_ranks_up() {
        let summary = Summary::of(&[15.0, 20.0, 35.0, 40.0, 50.0]);
        assert_eq!(summary.p50, 35.0);
        assert_eq!(summary.p90, 50.0);
        assert_eq!(summary.p99, 50.0);
        assert_eq!(summary.mean, 32.0);
    }

    #[test]
    fn summary_of_nothing_is_all_zeros() {
        let summary = Summary::of(&[]);
        assert_eq!(summary, Summary::default());
        assert_eq!(summary.count, 0);
        assert_eq!(Summary::of(&[f64::NAN]).count, 0);
    }

    #[test]
    fn summary_json_has_every_field() {
        let json = Summary::of(&[1.0, 2.0]).to_json();
        for field in [
            "count", "mean", "std_dev", "min", "p50", "p90", "p99", "max",
        ] {
            assert!(json.get(field).is_some(), "missing {field}");
        }
        assert_eq!(json["count"], 2);
    }

    fn area(points: &[(f64, f64)]) -> f64 {
        let width = if points.len() > 1 {
            points[1].0 - points[0].0
        } else {
            1.0
        };
        points.iter().map(|(_, density)| density * width).sum()
    }

    #[test]
    fn density_integrates_to_one() {
        let samples: Vec<f64> = (0..10_000)
            .map(|index| ((index * 7919) % 1000) as f64 / 10.0)
            .collect();
        let points = density(&samples, 40);
        assert_eq!(points.len(), 40);
        assert!((area(&points) - 1.0).abs() < 1e-9, "area {}", area(&points));
    }

    #[test]
    fn density_trims_a_far_outlier() {
        let mut samples: Vec<f64> = (0..1000).map(|index| (index % 10) as f64).collect();
        samples.push(1e9);
        let points = density(&samples, 10);
        assert!(points.last().unwrap().0 < 10.0);
        assert!((area(&points) - 1.0).abs() < 1e-9);
    }

    #[test]
    fn density_of_constant_or_empty_input_does_not_divide_by_zero() {
        let points = density(&[5.0; 20], 4);
        assert!(points.iter().all(|(x, y)| x.is_finite() && y.is_finite()));
        assert!((area(&points) - 1.0).abs() < 1e-9);
        assert!(density(&[], 10).is_empty());
        assert!(density(&[1.0, 2.0], 0).is_empty());
        assert!(density(&[f64::NAN, f64::INFINITY], 3).is_empty());
        assert_eq!(density(&[3.0], 1), vec![(3.0, 1.0)]);
    }
}
