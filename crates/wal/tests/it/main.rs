//! Integration tests of the write-ahead log through its public API.

mod basics;
mod checkpoint;
mod crash;
mod experiment;
mod hook;
