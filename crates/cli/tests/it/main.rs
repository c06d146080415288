//! Tests of the `stamplog` binary as a user runs it: real processes, real
//! ports on 127.0.0.1, temporary folders.

mod bench;
mod commands;
