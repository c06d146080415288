//! Seeded mutations for the fuzz targets on the stable toolchain: each
//! input is a corpus entry changed a few times (bits flipped, bytes set
//! to edge values, ranges cut, repeated or spliced in from another
//! entry). No coverage guidance: that is the libFuzzer run's job; this
//! one makes CI try a few thousand inputs near every corpus entry, the
//! same ones for the same seed.

/// A deterministic source of mutated inputs.
pub struct Mutator {
    random: proto::Rng,
}

/// Values that sit on the edges of lengths and counts.
const EDGES: [u64; 8] = [0, 1, 0x7F, 0x80, 0xFF, 0xFFFF, 0xFFFF_FFFF, u64::MAX];

impl Mutator {
    pub fn new(seed: u64) -> Mutator {
        Mutator {
            random: proto::Rng::new(seed),
        }
    }

    fn next(&mut self) -> u64 {
        self.random.next_u64()
    }

    /// A number in `0..bound`; 0 when `bound` is 0.
    fn below(&mut self, bound: usize) -> usize {
        match bound {
            0 => 0,
            _ => self.random.below(bound as u64) as usize,
        }
    }

    /// A new input: one of `pool`, changed one to four times.
    pub fn mutate(&mut self, pool: &[Vec<u8>]) -> Vec<u8> {
        let mut input = pool
            .get(self.below(pool.len()))
            .cloned()
            .unwrap_or_default();
        for _ in 0..1 + self.below(4) {
            self.change(&mut input, pool);
        }
        input
    }

    fn change(&mut self, input: &mut Vec<u8>, pool: &[Vec<u8>]) {
        let at = self.below(input.len() + 1);
        match self.below(7) {
            0 if !input.is_empty() => {
                let index = at.min(input.len() - 1);
                input[index] ^= 1 << self.below(8);
            }
            1 => {
                let edge = EDGES[self.below(EDGES.len())].to_le_bytes();
                let width = [1, 2, 4, 8][self.below(4)];
                let end = (at + width).min(input.len());
                input.splice(at..end, edge[..width].iter().copied());
            }
            2 => {
                let end = (at + 1 + self.below(16)).min(input.len());
                input.drain(at..end);
            }
            3 => {
                let count = 1 + self.below(32);
                let bytes: Vec<u8> = (0..count).map(|_| self.next() as u8).collect();
                input.splice(at..at, bytes);
            }
            4 if !input.is_empty() => {
                let start = self.below(input.len());
                let end = (start + 1 + self.below(64)).min(input.len());
                let copy = input[start..end].to_vec();
                input.splice(at..at, copy);
            }
            5 => {
                let other = &pool[self.below(pool.len())];
                let start = self.below(other.len());
                let end = (start + 1 + self.below(other.len() + 1)).min(other.len());
                input.splice(at..at, other[start..end].iter().copied());
            }
            _ => input.truncate(at),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_inputs_and_another_seed_others() {
        let pool = vec![b"hello, stamplog".to_vec(), vec![0; 40]];
        let run = |seed| {
            let mut mutator = Mutator::new(seed);
            (0..50).map(|_| mutator.mutate(&pool)).collect::<Vec<_>>()
        };
        assert_eq!(run(1), run(1));
        assert_ne!(run(1), run(2));
        assert!(run(1).iter().any(|input| !pool.contains(input)));
    }
}
