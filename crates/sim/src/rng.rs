//! A small seeded generator (splitmix64): the simulation's only source of
//! randomness, so one seed replays a whole run.

/// splitmix64 (Steele, Lea and Flood): 64 bits of state, full period, good
/// enough statistics for fault schedules, and no dependency.
#[derive(Clone, Debug)]
pub struct Rng {
    state: u64,
}

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng { state: seed }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
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

    /// `length` random bytes.
    pub fn bytes(&mut self, length: usize) -> Vec<u8> {
        (0..length).map(|_| self.next_u64() as u8).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_numbers() {
        let mut a = Rng::new(7);
        let mut b = Rng::new(7);
        for _ in 0..100 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
    }

    #[test]
    fn ranges_stay_inside_their_bounds() {
        let mut rng = Rng::new(1);
        for _ in 0..10_000 {
            let n = rng.between(3, 9);
            assert!((3..=9).contains(&n));
        }
        assert_eq!(rng.between(5, 5), 5);
        assert!(!Rng::new(2).chance(0));
        assert!(Rng::new(2).chance(1_000));
    }
}
