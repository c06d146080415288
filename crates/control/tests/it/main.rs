//! The control plane's integration tests: real nodes on 127.0.0.1 with
//! their folders in temporary directories.

mod cluster;
mod harness;
mod membership;
mod restart;
