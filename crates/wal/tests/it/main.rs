//! Integration tests of the write-ahead log through its public API.

// A test stops at the first thing that is not as it expects.
#![allow(clippy::unwrap_used)]

mod basics;
mod checkpoint;
mod crash;
mod experiment;
mod hook;
mod in_place;
mod journal;
