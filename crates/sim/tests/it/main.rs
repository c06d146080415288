//! The simulator's seeds across every protocol, server crashes and
//! failover, replay of one seed, and the tests that prove the harness can
//! fail.

mod failover;
mod seeds;
