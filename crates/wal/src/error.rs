//! The log's errors: what an open, an append or a read refuses with
//! (`LogError`, `AppendError`, `ReadError`), a configuration out of bounds,
//! and why bytes read from disk are not the format they claim to be (a
//! segment header, a checkpoint or a manifest that is cut, foreign, of an
//! unknown version, damaged or inconsistent). Recovery reports such damage
//! and falls back (an older checkpoint, a listing of the folder, a full
//! scan), or refuses to start when nothing can stand in for the damaged
//! part.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A byte format that does not decode.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    #[error("{what} cut at {length} bytes")]
    Cut { what: &'static str, length: usize },
    #[error("not a stamplog {what} (bad magic)")]
    BadMagic { what: &'static str },
    #[error("unsupported {what} format version {version}")]
    UnsupportedVersion { what: &'static str, version: u32 },
    #[error("{what} checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    Checksum {
        what: &'static str,
        stored: u32,
        computed: u32,
    },
    /// The bytes decode but contradict themselves, or what names them
    /// (another stream's file, a base the name does not give, a version
    /// missing from its segment).
    #[error("{0}")]
    Inconsistent(String),
    /// The bytes could not be read.
    #[error("cannot read: {0}")]
    Read(String),
}

/// A log configuration outside its bounds.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("pages must be 1 to 64, not {0}")]
    Pages(usize),
    #[error("page_size must be 4 KiB to 256 MiB, not {0} bytes")]
    PageSize(usize),
    #[error("segment_bytes_max must be at least 4096")]
    SegmentBytes,
    #[error("pending_bytes_max must be at least 4096")]
    PendingBytes,
}

/// Why a caller refused the state a checkpoint holds (its own decoder's
/// error, whatever its type): recovery then tries an older checkpoint.
pub type RestoreError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("i/o error on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("log corrupt in {path} at byte {offset}: {reason}; refusing to start")]
    Corrupt {
        path: PathBuf,
        offset: u64,
        reason: String,
    },
    #[error("bad log configuration: {0}")]
    Config(#[from] ConfigError),
    /// A checkpoint asked for versions the log cannot cover.
    #[error("cannot checkpoint: {0}")]
    Checkpoint(String),
}

/// Why an append was not taken.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum AppendError {
    /// The buffer is full; wait on [`Log::space_notified`] and try again.
    #[error("log buffer full")]
    Full,
    #[error("record of {length} bytes exceeds the log's limit of {limit} bytes")]
    TooLarge { length: usize, limit: usize },
    /// The log is latched failed after a write or fsync error.
    #[error("log failed: {0}")]
    Failed(Arc<str>),
}

#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum ReadError {
    /// The version is older than the oldest the log keeps: retention
    /// deleted it (or, for `Memory`, the ring dropped it).
    #[error("version {requested} is no longer retained; the oldest available is {oldest}")]
    Retained { requested: u64, oldest: u64 },
    #[error("read failed: {0}")]
    Io(String),
    #[error("record at version {version} is damaged: {reason}")]
    Corrupt { version: u64, reason: String },
}

/// Turns an I/O error on `path` into a [`LogError`].
pub(crate) fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> LogError + '_ {
    move |source| LogError::Io {
        path: path.to_path_buf(),
        source,
    }
}
