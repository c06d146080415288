//! Randomness: random identities (client ids in event ids, server ids,
//! stream ids) from the standard library's randomly keyed hasher, and the
//! one seeded generator (`Rng`) that the simulator, the crash images of
//! `wal::FaultStorage` and the tests draw from, so any run replays from its
//! seed. No random-number crate is needed for either.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};

/// 128 random bits.
pub fn random_u128() -> u128 {
    let mut value = 0u128;
    for _ in 0..2 {
        let mut hasher = RandomState::new().build_hasher();
        hasher.write_u128(value);
        value = (value << 64) | u128::from(hasher.finish());
    }
    value
}

/// splitmix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number
/// generators", OOPSLA 2014): 64 bits of state, full period, statistics
/// good enough for fault schedules and test cases. The same seed always
/// gives the same numbers.
#[derive(Clone, Debug)]
pub struct Rng {
    state: u64,
}

impl Rng {
    /// splitmix64's increment (the golden ratio's 64 bits); also a good
    /// constant to spread related seeds apart.
    pub const GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

    pub fn new(seed: u64) -> Rng {
        Rng { state: seed }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(Self::GAMMA);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..bound` (`bound > 0`), by the multiply-high method.
    pub fn below(&mut self, bound: u64) -> u64 {
        assert!(bound > 0, "an empty range has no numbers");
        ((u128::from(self.next_u64()) * u128::from(bound)) >> 64) as u64
    }

    /// A number in `low..=high`.
    pub fn between(&mut self, low: u64, high: u64) -> u64 {
        assert!(low <= high, "range {low}..={high} is empty");
        match (high - low).checked_add(1) {
            Some(width) => low + self.below(width),
            None => self.next_u64(),
        }
    }

    /// True with probability `permille` / 1000.
    pub fn chance(&mut self, permille: u32) -> bool {
        self.below(1_000) < u64::from(permille)
    }

    /// True once in `n` draws on average (`n > 0`).
    pub fn one_in(&mut self, n: u64) -> bool {
        self.below(n) == 0
    }

    /// True half the time.
    pub fn coin(&mut self) -> bool {
        self.next_u64() & 1 == 1
    }

    /// `length` random bytes.
    pub fn bytes(&mut self, length: usize) -> Vec<u8> {
        (0..length).map(|_| self.next_u64() as u8).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_draws_differ() {
        assert_ne!(random_u128(), random_u128());
    }

    #[test]
    fn the_same_seed_gives_the_same_numbers() {
        let mut a = Rng::new(7);
        let mut b = Rng::new(7);
        for _ in 0..100 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
    }

    #[test]
    fn splitmix64_gives_its_published_first_numbers() {
        // The reference implementation's first outputs for seed 0.
        let mut rng = Rng::new(0);
        assert_eq!(rng.next_u64(), 0xe220_a839_7b1d_cdaf);
        assert_eq!(rng.next_u64(), 0x6e78_9e6a_a1b9_65f4);
    }

    #[test]
    fn ranges_stay_inside_their_bounds() {
        let mut rng = Rng::new(1);
        for _ in 0..10_000 {
            assert!((3..=9).contains(&rng.between(3, 9)));
            assert!(rng.below(5) < 5);
        }
        assert_eq!(rng.between(5, 5), 5);
        assert!(!Rng::new(2).chance(0));
        assert!(Rng::new(2).chance(1_000));
        assert!(Rng::new(2).one_in(1));
    }
}
