//! Axis ranges, "nice" tick positions and tick labels for linear and logarithmic scales.

/// A numeric axis: the range it spans and where its labelled ticks go.
#[derive(Debug, Clone, PartialEq)]
pub struct Axis {
    /// The value at the start of the axis (left or bottom).
    pub low: f64,
    /// The value at the end of the axis (right or top).
    pub high: f64,
    /// Whether positions are proportional to the logarithm of the value.
    pub logarithmic: bool,
    /// Values at which to draw a grid line and a label, ascending.
    pub ticks: Vec<f64>,
    /// Distance between linear ticks; labels use it to pick how many decimals to show.
    /// Zero on logarithmic axes whose ticks each carry their own precision.
    step: f64,
}

/// Roughly how many intervals a linear axis is divided into.
const TARGET_INTERVALS: f64 = 5.0;

/// The most decades a logarithmic axis labels before it starts skipping some.
const MAX_LABELLED_DECADES: i32 = 8;

impl Axis {
    /// A linear axis covering `minimum..=maximum`, widened outwards to whole tick steps.
    ///
    /// Steps are 1, 2 or 5 times a power of ten because those read easily.
    /// A zero-width range is widened so that a single value sits in the middle.
    pub fn linear(minimum: f64, maximum: f64) -> Axis {
        let (mut low, mut high) =
            if minimum.is_finite() && maximum.is_finite() && minimum <= maximum {
                (minimum, maximum)
            } else {
                (0.0, 1.0)
            };
        if high - low <= 0.0 {
            let padding = if low == 0.0 { 1.0 } else { low.abs() * 0.1 };
            low -= padding;
            high += padding;
        }
        let step = nice_step((high - low) / TARGET_INTERVALS);
        if !step.is_finite() || step <= 0.0 {
            // Ranges near the limits of f64 overflow; an unlabelled axis still places points.
            return Axis {
                low,
                high,
                logarithmic: false,
                ticks: Vec::new(),
                step: 1.0,
            };
        }
        let first = (low / step).floor();
        let last = (high / step).ceil();
        let ticks = (0..=(last - first) as i64)
            .map(|index| (first + index as f64) * step)
            .collect();
        Axis {
            low: first * step,
            high: last * step,
            logarithmic: false,
            ticks,
            step,
        }
    }

    /// A logarithmic axis covering `minimum..=maximum` (both positive) with a small margin.
    ///
    /// Ticks sit on powers of ten. Ranges holding fewer than three powers also get ticks
    /// at 2 and 5 times each power, and ranges narrower than that get evenly spaced linear
    /// ticks, so every axis carries a few labels. Invalid bounds give the decade 1..10.
    pub fn logarithmic(minimum: f64, maximum: f64) -> Axis {
        let valid =
            minimum.is_finite() && maximum.is_finite() && minimum > 0.0 && minimum <= maximum;
        let (minimum, maximum) = if valid {
            (minimum, maximum)
        } else {
            (1.0, 10.0)
        };
        let (mut log_low, mut log_high) = (minimum.log10(), maximum.log10());
        if log_high - log_low < 1e-9 {
            log_low -= 0.5;
            log_high += 0.5;
        }
        // A margin of 5% keeps the extreme points off the frame, as on linear axes.
        let margin = (log_high - log_low) * 0.05;
        let log_low = (log_low - margin).max(-300.0);
        let log_high = (log_high + margin).min(300.0);
        let (low, high) = (10f64.powf(log_low), 10f64.powf(log_high));
        let (ticks, step) = logarithmic_ticks(log_low, log_high, low, high);
        Axis {
            low,
            high,
            logarithmic: true,
            ticks,
            step,
        }
    }

    /// Where `value` falls along the axis, from 0 at `low` to 1 at `high` (outside for values beyond).
    ///
    /// Returns NaN for values a logarithmic axis cannot show, so callers skip them.
    pub fn fraction(&self, value: f64) -> f64 {
        if self.logarithmic {
            if value <= 0.0 {
                return f64::NAN;
            }
            (value.log10() - self.low.log10()) / (self.high.log10() - self.low.log10())
        } else {
            (value - self.low) / (self.high - self.low)
        }
    }

    /// The label for one of this axis's ticks.
    pub fn label(&self, tick: f64) -> String {
        if self.logarithmic && self.step == 0.0 {
            format_tick(tick, tick)
        } else {
            format_tick(tick, self.step)
        }
    }
}

/// Tick values for a logarithmic axis spanning `10^log_low..10^log_high` (that is, `low..high`).
///
/// Returns the ticks and the step their labels should use (zero for per-tick precision).
fn logarithmic_ticks(log_low: f64, log_high: f64, low: f64, high: f64) -> (Vec<f64>, f64) {
    let inside = |value: &f64| (low * (1.0 - 1e-9)..=high * (1.0 + 1e-9)).contains(value);
    let first = log_low.floor() as i32;
    let last = log_high.ceil() as i32;
    let powers: Vec<f64> = (first..=last)
        .map(|exponent| 10f64.powi(exponent))
        .filter(inside)
        .collect();
    if powers.len() >= 3 {
        let stride = powers.len().div_ceil(MAX_LABELLED_DECADES as usize);
        return (powers.into_iter().step_by(stride).collect(), 0.0);
    }
    let multiples: Vec<f64> = (first..=last)
        .flat_map(|exponent| [1.0, 2.0, 5.0].map(|factor| factor * 10f64.powi(exponent)))
        .filter(inside)
        .collect();
    if multiples.len() >= 3 {
        return (multiples, 0.0);
    }
    let linear = Axis::linear(low, high);
    let ticks = linear
        .ticks
        .into_iter()
        .filter(|tick| *tick > 0.0 && inside(tick))
        .collect();
    (ticks, linear.step)
}

/// Rounds `raw` up to 1, 2 or 5 times a power of ten.
pub fn nice_step(raw: f64) -> f64 {
    if !raw.is_finite() || raw <= 0.0 {
        return f64::NAN;
    }
    let power = 10f64.powf(raw.log10().floor());
    let fraction = raw / power;
    let nice = if fraction <= 1.0 + 1e-9 {
        1.0
    } else if fraction <= 2.0 + 1e-9 {
        2.0
    } else if fraction <= 5.0 + 1e-9 {
        5.0
    } else {
        10.0
    };
    nice * power
}

/// Formats a tick value with just enough decimals to tell ticks `step` apart.
///
/// Steps of a thousand and up get k, M, G or T suffixes because benchmark rates are large
/// and "250k" fits under a tick where "250000" crowds its neighbours.
pub fn format_tick(value: f64, step: f64) -> String {
    let step = step.abs();
    if !value.is_finite() {
        return "?".to_string();
    }
    if value == 0.0 || value.abs() < step * 1e-9 {
        return "0".to_string();
    }
    if !(1e-4..1e15).contains(&step) {
        let digits = (value.abs().log10().floor() - step.log10().floor()).clamp(0.0, 6.0) as usize;
        return format!("{value:.digits$e}");
    }
    // The suffix follows the step, not the value, so every label on an axis uses the same
    // unit ("500k", "1000k", "1500k") and none needs decimals after its suffix.
    let (unit, suffix) = [(1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")]
        .into_iter()
        .find(|(unit, _)| step >= *unit)
        .unwrap_or((1.0, ""));
    let decimals = (-((step / unit).log10() + 1e-9).floor()).max(0.0) as usize;
    format!("{:.*}{}", decimals, value / unit, suffix)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nice_steps_are_one_two_or_five_times_a_power_of_ten() {
        assert_eq!(nice_step(0.7), 1.0);
        assert_eq!(nice_step(1.3), 2.0);
        assert_eq!(nice_step(3.0), 5.0);
        assert_eq!(nice_step(6.0), 10.0);
        assert!((nice_step(0.013) - 0.02).abs() < 1e-12);
    }

    #[test]
    fn linear_axis_widens_to_whole_steps() {
        let axis = Axis::linear(3.0, 97.0);
        assert_eq!((axis.low, axis.high), (0.0, 100.0));
        assert_eq!(axis.ticks, vec![0.0, 20.0, 40.0, 60.0, 80.0, 100.0]);
        let labels: Vec<String> = axis.ticks.iter().map(|tick| axis.label(*tick)).collect();
        assert_eq!(labels, ["0", "20", "40", "60", "80", "100"]);
    }

    #[test]
    fn linear_axis_around_a_single_value_is_not_empty() {
        let axis = Axis::linear(5.0, 5.0);
        assert!(axis.low < 5.0 && axis.high > 5.0);
        let zero = Axis::linear(0.0, 0.0);
        assert!(zero.low < 0.0 && zero.high > 0.0);
        let invalid = Axis::linear(f64::NAN, 1.0);
        assert_eq!((invalid.low, invalid.high), (0.0, 1.0));
    }

    fn labels(axis: &Axis) -> Vec<String> {
        axis.ticks.iter().map(|tick| axis.label(*tick)).collect()
    }

    #[test]
    fn logarithmic_axis_puts_ticks_on_powers_of_ten() {
        let axis = Axis::logarithmic(3.0, 45_000.0);
        assert!(axis.low < 3.0 && axis.high > 45_000.0);
        assert_eq!(labels(&axis), ["10", "100", "1k", "10k"]);
        assert!(axis.fraction(3.0) > 0.0 && axis.fraction(45_000.0) < 1.0);
        assert!(axis.fraction(0.0).is_nan());
    }

    #[test]
    fn wide_logarithmic_axis_skips_decades() {
        let axis = Axis::logarithmic(1e-9, 1e9);
        assert!(axis.ticks.len() <= MAX_LABELLED_DECADES as usize);
        assert!(axis.ticks.len() >= 3);
    }

    #[test]
    fn narrow_logarithmic_axes_still_get_several_ticks() {
        assert_eq!(
            labels(&Axis::logarithmic(3.0, 70.0)),
            ["5", "10", "20", "50"]
        );
        assert_eq!(
            labels(&Axis::logarithmic(0.2, 0.9)),
            ["0.2", "0.4", "0.6", "0.8"]
        );
        assert!(Axis::logarithmic(7.0, 7.0).ticks.len() >= 3);
        assert!(Axis::logarithmic(-1.0, 0.0).ticks.len() >= 2);
    }

    #[test]
    fn tick_labels_use_suffixes_and_exponents() {
        assert_eq!(format_tick(250_000.0, 50_000.0), "250k");
        assert_eq!(format_tick(1_500_000.0, 500_000.0), "1500k");
        assert_eq!(format_tick(3_000_000.0, 1_000_000.0), "3M");
        assert_eq!(format_tick(1000.0, 200.0), "1000");
        assert_eq!(format_tick(1000.5, 0.5), "1000.5");
        assert_eq!(format_tick(0.25, 0.05), "0.25");
        assert_eq!(format_tick(-0.0, 1.0), "0");
        assert_eq!(format_tick(0.00002, 0.00001), "2e-5");
    }
}
