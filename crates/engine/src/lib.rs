//! stamplog's pure state machines: the versioning and deduplication of one
//! stream. Events go in (an append's event id, a recovered record), decisions
//! come out; no I/O, no clock, no async, so the server, the tests and a
//! simulator drive the same code.
//!
//! Invariant: one event id maps to at most one version until its session's
//! low-water mark passes it.
//! Invariant: versions are handed out densely, one past the last recorded.

mod dedupe;
pub mod replication;
mod stream;

pub use dedupe::{DedupeLimits, DedupeTable, Lookup, SnapshotError};
pub use stream::{Decision, Rejection, StreamMachine, STATE_FORMAT_VERSION};
