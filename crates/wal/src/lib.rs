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

pub mod checkpoint;
pub mod experiment;
pub mod fault;
pub mod journal;
pub mod manifest;
pub mod storage;

pub use storage::{FileStorage, Storage, StorageFile};
mod block;
mod config;
mod error;
mod log;
mod maintenance;
mod marker;
mod recovery;
mod reset;
pub mod segment;
mod writer;

pub use config::{Durability, LogConfig, SyncObserver, SyncReport};
pub use error::{AppendError, ConfigError, FormatError, LogError, ReadError, RestoreError};
pub use journal::{
    hook_in_place, not_here, write_here, Journal, JournalConfig, JournalMetrics, RedoReport,
};
pub use log::{DurableHook, Log, LogMetrics, Progress};
pub use maintenance::{CheckpointWritten, Retained, Retention};
pub use marker::RESET_MARKER;
pub use recovery::RecoveryReport;
pub use writer::PREALLOCATE_AHEAD_BYTES;

/// Reads the log of `stream` in `folder` without changing anything: calls
/// `visit` with every valid record in version order and returns the last
/// version. A torn tail ends the scan as it would end recovery (and is left
/// in place); corruption before it is the same error the log would report.
/// A log whose oldest segments retention deleted is read from its first
/// segment on disk.
/// For checking the folder of a stopped server.
pub fn inspect(
    storage: &dyn Storage,
    folder: &std::path::Path,
    stream: u64,
    visit: &mut dyn FnMut(&proto::Record<'_>),
) -> Result<u64, LogError> {
    let recovered = recovery::inspect(storage, folder, stream, visit)?;
    Ok(recovered.last_version)
}

/// Drops every record after `version` from the closed log of `stream` in
/// `folder`, durably; returns how many records were dropped. Segments past
/// the cut go first, newest first, then the segment holding the cut is
/// shortened, so a crash at any step leaves a valid log that ends between
/// the old end and the cut, and running it again finishes the job.
/// Checkpoints past the cut are removed before any segment is touched.
/// For a replica whose tail no one else agrees with after a failover.
pub fn truncate_after(
    storage: &dyn Storage,
    folder: &std::path::Path,
    stream: u64,
    version: u64,
) -> Result<u64, LogError> {
    recovery::truncate_after(storage, folder, stream, version)
}
