//! stamplog's write-ahead log: one log per stream, in segment files of
//! checksummed records, written with group commit (`Sync`), through seed
//! 004's page buffer (`Paged`), or kept in memory only (`Memory`).
//!
//! Invariant: versions in a log are dense; `append` takes version
//! `last_version() + 1` and nothing else.
//! Invariant: `durable_version()` never passes a record that is not on disk
//! (for `Memory`, that is held in memory), and it never moves backwards.
//! Invariant: after a failed write or fsync the log is latched failed: no
//! later append succeeds and the durable version never moves again.

pub mod fault;
pub mod storage;

pub use storage::{FileStorage, Storage, StorageFile};
mod config;
mod log;
mod recovery;
pub mod segment;
mod writer;

pub use config::{Durability, LogConfig};
pub use log::{AppendError, Log, LogError, LogMetrics, Progress, ReadError};
