//! The control plane's integration tests: real nodes on 127.0.0.1 with
//! their folders in temporary directories.

// A test stops at the first thing that is not as it expects.
#![allow(clippy::unwrap_used)]

mod cluster;
mod harness;
mod membership;
mod restart;
