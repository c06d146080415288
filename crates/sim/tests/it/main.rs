//! The simulator's seeds across every protocol, replay of one seed, and
//! the tests that prove the harness can fail.

mod seeds;
