//! How a log reaches the disk, and the bounds on what it buffers.

use std::sync::Arc;
use std::time::{Duration, Instant};

/// The durability mode of one stream's log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// No disk. Records live in a memory ring of `LogConfig::memory_retain_bytes`;
    /// older ones are dropped, and everything is lost on a crash or restart.
    Memory,
    /// Group commit: every record is written and fdatasynced before it counts
    /// as durable; all records that arrived while a sync was in flight go out
    /// in the next write and fdatasync.
    Sync,
    /// Seed 004's page buffer: records are copied into the current page of
    /// `pages` × `page_size`; a full page is written and synced by the I/O
    /// thread while appends go on into the next free page; an append that
    /// finds no free page waits (a buffer-full wait). A crash loses at most
    /// the records in pages not yet written and synced. A page must hold
    /// the largest record; the server checks that at stream creation.
    Paged { pages: usize, page_size: usize },
}

/// What one group commit (one write + fdatasync of a batch) did, handed
/// to the log's [`SyncObserver`] on the I/O thread once the batch is
/// durable.
pub struct SyncReport<'a> {
    /// Records in the batch.
    pub records: u64,
    pub bytes: u64,
    /// The write and fdatasync together.
    pub io: Duration,
    /// When the batch became durable.
    pub durable_at: Instant,
    /// The batch's chunks, each with when its records were appended.
    pub(crate) chunks: &'a [crate::block::Chunk],
}

impl SyncReport<'_> {
    /// When each record of the batch was appended.
    pub fn appended_at(&self) -> impl Iterator<Item = Instant> + '_ {
        self.chunks
            .iter()
            .flat_map(|chunk| chunk.appended_at.iter().copied())
    }
}

/// Watches a log's group commits (the server's metrics): called on the
/// I/O thread after each batch is durable, once the durable hook has run
/// (the acknowledgements are on their way) and before the progress
/// watches' tasks are woken, so it must be quick.
pub trait SyncObserver: Send + Sync {
    fn synced(&self, report: &SyncReport<'_>);
}

/// Configuration of one log.
#[derive(Clone)]
pub struct LogConfig {
    pub durability: Durability,
    /// A segment is closed and a new one started once it would grow past
    /// this many bytes.
    pub segment_bytes_max: u64,
    /// `Sync`: bytes waiting for the next group commit before appends wait
    /// for room. Bounds the memory of a writer faster than the disk.
    pub pending_bytes_max: usize,
    /// `Paged`: a partly filled page is written after it has waited this
    /// long, so a trickle of records still reaches the disk.
    pub page_flush_interval: Duration,
    /// `Memory`: bytes of records kept for readers.
    pub memory_retain_bytes: usize,
    /// Keep a sample of per-record logging latency (append to durable) for
    /// the logging experiment; off on the normal path.
    pub sample_latency: bool,
    /// Told of every group commit, with when each of its records was
    /// appended (noted only when there is an observer or a sampler).
    pub observer: Option<Arc<dyn SyncObserver>>,
    /// `Sync`: the server's journal, whose thread then does this log's
    /// group commits with those of the other logs that share it (see
    /// `wal::journal`); `None`: the log has an I/O thread of its own.
    pub journal: Option<Arc<crate::Journal>>,
}

impl std::fmt::Debug for LogConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogConfig")
            .field("durability", &self.durability)
            .field("segment_bytes_max", &self.segment_bytes_max)
            .field("pending_bytes_max", &self.pending_bytes_max)
            .field("page_flush_interval", &self.page_flush_interval)
            .field("memory_retain_bytes", &self.memory_retain_bytes)
            .field("sample_latency", &self.sample_latency)
            .field("observer", &self.observer.is_some())
            .field("journal", &self.journal.is_some())
            .finish()
    }
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            durability: Durability::Sync,
            segment_bytes_max: 64 * 1024 * 1024,
            pending_bytes_max: 32 * 1024 * 1024,
            page_flush_interval: Duration::from_millis(2),
            memory_retain_bytes: 64 * 1024 * 1024,
            sample_latency: false,
            observer: None,
            journal: None,
        }
    }
}

impl LogConfig {
    /// Whether appends note when they happened (a sampler or an
    /// observer wants it).
    pub(crate) fn times_appends(&self) -> bool {
        self.sample_latency || self.observer.is_some()
    }

    pub fn with_durability(durability: Durability) -> Self {
        LogConfig {
            durability,
            ..LogConfig::default()
        }
    }

    /// The largest record an append accepts under this configuration.
    pub fn record_bytes_max(&self) -> usize {
        match self.durability {
            Durability::Paged { page_size, .. } => page_size,
            Durability::Sync => self.pending_bytes_max,
            Durability::Memory => self.memory_retain_bytes,
        }
    }

    /// Checks the bounds; an error names the bad setting.
    pub fn validate(&self) -> Result<(), crate::ConfigError> {
        if let Durability::Paged { pages, page_size } = self.durability {
            if !(1..=64).contains(&pages) {
                return Err(crate::ConfigError::Pages(pages));
            }
            if !(4096..=256 * 1024 * 1024).contains(&page_size) {
                return Err(crate::ConfigError::PageSize(page_size));
            }
        }
        if self.segment_bytes_max < 4096 {
            return Err(crate::ConfigError::SegmentBytes);
        }
        if self.pending_bytes_max < 4096 {
            return Err(crate::ConfigError::PendingBytes);
        }
        Ok(())
    }
}
