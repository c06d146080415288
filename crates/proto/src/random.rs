//! Random identities (client ids in event ids, server ids, stream ids) from
//! the standard library's randomly keyed hasher, so no random-number crate
//! is needed for them.

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

#[cfg(test)]
mod tests {
    #[test]
    fn two_draws_differ() {
        assert_ne!(super::random_u128(), super::random_u128());
    }
}
