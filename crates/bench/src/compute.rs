//! Real CPU work of a chosen duration, standing in for the computation of
//! seed 004's NAS benchmarks between two messages.
//!
//! The work is a multiply-xorshift hash over a small buffer, calibrated once
//! against the clock; `black_box` keeps the compiler from removing it.

use std::hint::black_box;
use std::time::{Duration, Instant};

/// Words hashed by one step of the work.
const BUFFER_WORDS: usize = 16;

/// How long calibration runs: long enough to smooth out the timer, short
/// enough not to matter next to the experiment.
const CALIBRATION: Duration = Duration::from_millis(100);

/// Hash steps per microsecond of this machine.
#[derive(Clone, Copy, Debug)]
pub struct Calibration {
    pub steps_per_microsecond: f64,
}

impl Calibration {
    /// Measures how many steps fit in a microsecond.
    pub fn measure() -> Calibration {
        // One short run first so the caches and the frequency settle.
        black_box(work(10_000, 1));
        let mut steps = 0u64;
        let chunk = 10_000u64;
        let started = Instant::now();
        while started.elapsed() < CALIBRATION {
            black_box(work(chunk, steps));
            steps += chunk;
        }
        let microseconds = started.elapsed().as_secs_f64() * 1e6;
        Calibration {
            steps_per_microsecond: (steps as f64 / microseconds).max(1e-3),
        }
    }

    /// Steps that take about `microseconds`.
    pub fn steps_for(&self, microseconds: f64) -> u64 {
        (self.steps_per_microsecond * microseconds).round() as u64
    }
}

/// Runs `steps` steps of the hash seeded with `seed` and returns the hash.
pub fn work(steps: u64, seed: u64) -> u64 {
    let mut buffer = [0u64; BUFFER_WORDS];
    for (index, word) in buffer.iter_mut().enumerate() {
        *word = seed ^ (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
    let mut hash = seed | 1;
    for step in 0..steps {
        let word = &mut buffer[step as usize % BUFFER_WORDS];
        hash ^= *word;
        hash = hash.wrapping_mul(0xFF51_AFD7_ED55_8CCD);
        hash ^= hash >> 33;
        *word = hash;
    }
    black_box(hash)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_depends_on_its_seed_and_steps() {
        assert_ne!(work(100, 1), work(100, 2));
        assert_ne!(work(100, 1), work(101, 1));
        assert_eq!(work(100, 7), work(100, 7));
    }

    #[test]
    fn calibration_finds_a_positive_rate() {
        let calibration = Calibration::measure();
        assert!(calibration.steps_per_microsecond > 0.0);
        assert!(calibration.steps_for(10.0) >= calibration.steps_for(1.0));
    }
}
