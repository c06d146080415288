//! One stream on this server: its log, its versioning state machine, and
//! the append path that ties them together.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use engine::{Decision, DedupeLimits, Rejection, StreamMachine};
use proto::{AckLevel, DurabilityConfig, EventId, Record, RecordHeader, StreamInfo};
use serde::{Deserialize, Serialize};
use wal::{AppendError, Durability, Log, LogConfig, LogError};

use crate::config::ServerConfig;

/// The file in a stream's folder that describes it.
pub const META_FILE: &str = "stream.json";
/// Longest stream name.
const NAME_BYTES_MAX: usize = 128;
/// An append that finds the log buffer full retries at least this often,
/// as a guard should a wake-up be missed.
const SPACE_RETRY_INTERVAL: Duration = Duration::from_millis(20);

/// What is persisted about a stream.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct StreamMeta {
    pub format: u32,
    pub id: u64,
    pub name: String,
    pub durability: String,
    pub pages: u16,
    pub page_size: u32,
}

impl StreamMeta {
    pub fn new(id: u64, name: &str, durability: DurabilityConfig) -> Self {
        let (mode, pages, page_size) = match durability {
            DurabilityConfig::Memory => ("memory", 0, 0),
            DurabilityConfig::Sync => ("sync", 0, 0),
            DurabilityConfig::Paged { pages, page_size } => ("paged", pages, page_size),
        };
        StreamMeta {
            format: 1,
            id,
            name: name.to_string(),
            durability: mode.to_string(),
            pages,
            page_size,
        }
    }

    pub fn durability(&self) -> Result<DurabilityConfig, String> {
        match self.durability.as_str() {
            "memory" => Ok(DurabilityConfig::Memory),
            "sync" => Ok(DurabilityConfig::Sync),
            "paged" => Ok(DurabilityConfig::Paged {
                pages: self.pages,
                page_size: self.page_size,
            }),
            other => Err(format!("unknown durability {other:?}")),
        }
    }
}

/// Why a stream name is not acceptable, or `None` when it is.
pub fn stream_name_error(name: &str) -> Option<String> {
    if name.is_empty() || name.len() > NAME_BYTES_MAX {
        return Some(format!("stream names are 1 to {NAME_BYTES_MAX} bytes long"));
    }
    if name.starts_with('.')
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
    {
        return Some(format!(
            "stream name {name:?} may hold only letters, digits, '.', '_' and '-', and may not start with '.'"
        ));
    }
    None
}

/// Why an append was refused.
#[derive(Debug, thiserror::Error)]
pub enum AppendFailure {
    #[error(transparent)]
    Rejected(#[from] Rejection),
    #[error("{0}")]
    TooLarge(String),
    #[error("the stream's log has failed and takes no more writes: {0}")]
    LogFailed(Arc<str>),
    #[error("the stream was deleted")]
    Deleted,
}

/// The outcome of an accepted append.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Appended {
    pub version: u64,
    pub duplicate: bool,
}

pub struct Stream {
    /// Set once the stream is deleted: appends are refused from then on.
    deleted: AtomicBool,
    pub id: u64,
    pub name: String,
    pub durability: DurabilityConfig,
    pub folder: PathBuf,
    pub log: Log,
    machine: Mutex<StreamMachine>,
}

pub fn log_config(durability: DurabilityConfig, config: &ServerConfig) -> LogConfig {
    LogConfig {
        durability: match durability {
            DurabilityConfig::Memory => Durability::Memory,
            DurabilityConfig::Sync => Durability::Sync,
            DurabilityConfig::Paged { pages, page_size } => Durability::Paged {
                pages: pages as usize,
                page_size: page_size as usize,
            },
        },
        segment_bytes_max: config.segment_bytes_max,
        pending_bytes_max: config.pending_bytes_max,
        page_flush_interval: config.page_flush_interval,
        memory_retain_bytes: config.memory_retain_bytes,
        sample_latency: config.sample_log_latency,
    }
}

impl Stream {
    /// Opens (and recovers) the stream described by `meta` in `folder`.
    pub fn open(meta: &StreamMeta, folder: &Path, config: &ServerConfig) -> Result<Stream, String> {
        let durability = meta.durability()?;
        let log_config = log_config(durability, config);
        let record_max = config.message_bytes_max + proto::RECORD_HEADER_LEN;
        if log_config.record_bytes_max() < record_max {
            let setting = match durability {
                DurabilityConfig::Paged { .. } => "raise the stream's page_size",
                DurabilityConfig::Sync => "raise the server's pending_bytes_max",
                DurabilityConfig::Memory => "raise the server's memory_retain_bytes",
            };
            return Err(format!(
                "this durability holds records of at most {} bytes, less than a message of {} bytes needs; {setting}",
                log_config.record_bytes_max(),
                record_max
            ));
        }
        let mut machine = StreamMachine::new(1, DedupeLimits::default());
        let log = Log::open(
            config.storage.clone(),
            &folder.join("log"),
            meta.id,
            log_config,
            &mut |record| machine.record(&record.header),
        )
        .map_err(|error: LogError| error.to_string())?;
        Ok(Stream {
            deleted: AtomicBool::new(false),
            id: meta.id,
            name: meta.name.clone(),
            durability,
            folder: folder.to_path_buf(),
            log,
            machine: Mutex::new(machine),
        })
    }

    pub fn info(&self) -> StreamInfo {
        StreamInfo {
            id: self.id,
            name: self.name.clone(),
            durability: self.durability,
            first_version: self.log.first_version(),
            last_version: self.log.last_version(),
            committed_version: self.log.durable_version(),
        }
    }

    /// Refuses every later append, then waits (up to `timeout`) until the
    /// log has written what it holds. Blocking; for the delete path.
    pub fn close_for_delete(&self, timeout: Duration) {
        {
            // Under the machine lock, so no append is halfway through.
            let _machine = self.machine.lock().expect("stream lock poisoned");
            self.deleted.store(true, Ordering::Release);
        }
        let deadline = std::time::Instant::now() + timeout;
        while self.log.durable_version() < self.log.last_version()
            && self.log.failure().is_none()
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    pub fn epoch(&self) -> u64 {
        self.machine.lock().expect("stream lock poisoned").epoch()
    }

    pub fn dedupe_entries(&self) -> usize {
        self.machine
            .lock()
            .expect("stream lock poisoned")
            .dedupe()
            .entries()
    }

    /// Decides, logs and applies one append. Returns once the log has taken
    /// the record (not once it is durable: see [`Stream::wait_ack`]).
    pub async fn append(
        &self,
        event: EventId,
        low_water: u64,
        key: &[u8],
        payload: &[u8],
    ) -> Result<Appended, AppendFailure> {
        let mut record = Vec::with_capacity(proto::RECORD_HEADER_LEN + key.len() + payload.len());
        loop {
            match self.try_append(event, low_water, key, payload, &mut record)? {
                Some(appended) => return Ok(appended),
                None => {
                    // The buffer was full. Register for the wake-up first,
                    // then try once more, so a wake-up between the two
                    // cannot be missed.
                    let notified = self.log.space_notified();
                    if let Some(appended) =
                        self.try_append(event, low_water, key, payload, &mut record)?
                    {
                        return Ok(appended);
                    }
                    let _ = tokio::time::timeout(SPACE_RETRY_INTERVAL, notified).await;
                }
            }
        }
    }

    fn try_append(
        &self,
        event: EventId,
        low_water: u64,
        key: &[u8],
        payload: &[u8],
        record: &mut Vec<u8>,
    ) -> Result<Option<Appended>, AppendFailure> {
        let mut machine = self.machine.lock().expect("stream lock poisoned");
        if self.deleted.load(Ordering::Acquire) {
            return Err(AppendFailure::Deleted);
        }
        let version = match machine.decide(event, low_water)? {
            Decision::Duplicate { version } => {
                return Ok(Some(Appended {
                    version,
                    duplicate: true,
                }))
            }
            Decision::Assign { version } => version,
        };
        let header = RecordHeader {
            flags: 0,
            stream: self.id,
            version,
            epoch: machine.epoch(),
            event,
            low_water: low_water.min(event.sequence),
        };
        record.clear();
        Record {
            header,
            key,
            payload,
        }
        .encode(record);
        match self.log.append(version, record) {
            Ok(()) => {
                machine.record(&header);
                Ok(Some(Appended {
                    version,
                    duplicate: false,
                }))
            }
            Err(AppendError::Full) => Ok(None),
            Err(AppendError::TooLarge { length, limit }) => Err(AppendFailure::TooLarge(format!(
                "record of {length} bytes exceeds the log's limit of {limit} bytes"
            ))),
            Err(AppendError::Failed(message)) => Err(AppendFailure::LogFailed(message)),
        }
    }

    /// Waits until `version` meets the stream's ack rule; returns the level
    /// reached, or the log's failure.
    pub async fn wait_ack(&self, version: u64) -> Result<AckLevel, Arc<str>> {
        match self.durability {
            DurabilityConfig::Memory | DurabilityConfig::Paged { .. } => {
                return match self.log.failure() {
                    Some(failure) => Err(failure),
                    None => Ok(AckLevel::Memory),
                }
            }
            DurabilityConfig::Sync => {}
        }
        if self.log.durable_version() >= version {
            return Ok(AckLevel::Synced);
        }
        let mut progress = self.log.progress();
        let reached = progress
            .wait_for(|p| p.durable >= version || p.failed.is_some())
            .await
            .map_err(|_| Arc::<str>::from("the stream was closed"))?;
        if reached.durable >= version {
            Ok(AckLevel::Synced)
        } else {
            Err(reached.failed.clone().expect("woken for a failure"))
        }
    }
}
