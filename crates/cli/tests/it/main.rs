//! Tests of the `stamplog` binary as a user runs it: real processes, real
//! ports on 127.0.0.1, temporary folders.

// A test stops at the first thing that is not as it expects.
#![allow(clippy::unwrap_used)]

mod bench;
mod commands;
