//! Integration tests: real servers on 127.0.0.1 port 0, driven through the
//! client library and raw sockets.

// A test stops at the first thing that is not as it expects.
#![allow(clippy::unwrap_used)]

mod bad_input;
mod checkpoint;
mod commit_interval;
mod failover;
mod faults;
mod forward;
mod harness;
mod limits;
mod observe;
mod property;
mod rejoin;
mod replication;
mod restart;
mod security;
mod sender;
mod streams;
mod transfer;
