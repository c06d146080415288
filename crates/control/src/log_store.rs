//! The Raft log and vote on disk, as openraft's `RaftLogStorage`.
//!
//! Two files in the control folder:
//!
//! - `vote.json`: `{"version": 1, "vote": ...}`, replaced atomically (tmp,
//!   sync, rename, sync folder) before `save_vote` returns.
//! - `raft.log`: a 12-byte header (`STLCRLOG`, then the format version as a
//!   u32 LE, 1), then records `[u32 LE body length][u32 LE CRC32C][body]`
//!   whose body is one JSON [`LogRecord`]: an `Entry`, a `Committed` log id,
//!   or a `Purged` log id. Appends are written and fdatasynced before
//!   openraft hears they are durable; `Committed` records are written
//!   without a sync (losing one only makes a restart re-learn it). A
//!   truncation or a purge rewrites the whole file atomically, starting
//!   with `Purged` and `Committed`.
//!
//! Recovery replays the records in order. A record cut short, or one that
//! fails its checksum with nothing valid after it, is a torn tail: it and
//! everything after it are dropped and the file truncated. A record that
//! fails its checksum while a valid record follows it, or entries that are
//! not dense, are corruption and refuse to open.
//!
//! **Invariant:** the entries in memory are dense, from the last purged
//! index + 1 to the last log index, and the file holds exactly them.
//! **Invariant:** after a failed write or sync the store is latched failed
//! and every later write is refused.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::ops::RangeBounds;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{
    AnyError, Entry, LogId, LogState, OptionalSend, RaftLogReader, StorageError, StorageIOError,
    Vote,
};
use serde::{Deserialize, Serialize};

use crate::error::ControlError;
use crate::files::{decode_record, encode_record, sync_folder, write_atomically, RecordRead};
use crate::TypeConfig;

/// The log file's name in the control folder.
pub(crate) const LOG_FILE: &str = "raft.log";
/// The vote file's name in the control folder.
pub(crate) const VOTE_FILE: &str = "vote.json";
const LOG_MAGIC: [u8; 8] = *b"STLCRLOG";
const LOG_VERSION: u32 = 1;
/// The magic, then the version.
const LOG_HEADER_LEN: usize = LOG_MAGIC.len() + 4;
const VOTE_VERSION: u32 = 1;

/// One record of `raft.log`.
#[derive(Debug, Serialize, Deserialize)]
enum LogRecord {
    /// Entries up to this id have been dropped (they are in a snapshot).
    Purged(LogId<u64>),
    /// Entries up to this id are committed.
    Committed(LogId<u64>),
    Entry(Entry<TypeConfig>),
}

/// [`LogRecord`] by reference, for writing without copying entries.
#[derive(Serialize)]
#[serde(rename = "LogRecord")]
enum LogRecordRef<'a> {
    Purged(&'a LogId<u64>),
    Committed(&'a LogId<u64>),
    Entry(&'a Entry<TypeConfig>),
}

#[derive(Serialize, Deserialize)]
struct VoteFile {
    version: u32,
    vote: Vote<u64>,
}

/// What the log holds, in memory; readers share it.
#[derive(Clone, Debug, Default)]
struct LogContent {
    entries: BTreeMap<u64, Entry<TypeConfig>>,
    last_purged: Option<LogId<u64>>,
    committed: Option<LogId<u64>>,
}

impl LogContent {
    fn last_log_id(&self) -> Option<LogId<u64>> {
        match self.entries.last_key_value() {
            Some((_, entry)) => Some(entry.log_id),
            None => self.last_purged,
        }
    }

    /// Whether an entry at `index` may come next: right after the last
    /// one, or anywhere in a log that never held one.
    fn takes(&self, index: u64) -> bool {
        self.last_log_id().is_none_or(|id| index == id.index + 1)
    }

    /// Applies one record read back from the file.
    fn replay(&mut self, record: LogRecord) -> Result<(), Corruption> {
        match record {
            LogRecord::Purged(id) => {
                self.entries.retain(|&index, _| index > id.index);
                self.last_purged = Some(id);
            }
            LogRecord::Committed(id) => self.committed = Some(id),
            LogRecord::Entry(entry) => {
                if !self.takes(entry.log_id.index) {
                    return Err(Corruption(format!(
                        "entry {} after {:?}: the log would have a hole",
                        entry.log_id.index,
                        self.last_log_id().map(|id| id.index)
                    )));
                }
                self.entries.insert(entry.log_id.index, entry);
            }
        }
        Ok(())
    }

    /// The whole file for this content, as a truncation or purge writes it.
    fn image(&self) -> Vec<u8> {
        let mut bytes = header();
        if let Some(id) = &self.last_purged {
            put_record(&mut bytes, &LogRecordRef::Purged(id));
        }
        if let Some(id) = &self.committed {
            put_record(&mut bytes, &LogRecordRef::Committed(id));
        }
        for entry in self.entries.values() {
            put_record(&mut bytes, &LogRecordRef::Entry(entry));
        }
        bytes
    }
}

fn header() -> Vec<u8> {
    let mut bytes = LOG_MAGIC.to_vec();
    bytes.extend_from_slice(&LOG_VERSION.to_le_bytes());
    bytes
}

fn put_record(out: &mut Vec<u8>, record: &LogRecordRef<'_>) {
    let body = serde_json::to_vec(record).expect("log records serialize");
    encode_record(&body, out);
}

/// What recovery found in `raft.log`.
#[derive(Debug)]
struct Recovered {
    content: LogContent,
    /// Bytes of the file that hold whole, valid records; the rest is a torn
    /// tail.
    valid_length: usize,
}

/// What makes a control log file unreadable: bytes no crash can leave
/// behind, said as a sentence for `ControlError::Corrupt`.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Corruption(String);

/// Replays a log file's bytes; pure, so tests feed it any image.
fn recover(bytes: &[u8]) -> Result<Recovered, Corruption> {
    let Some(header_bytes) = bytes.get(..LOG_HEADER_LEN) else {
        return Err(Corruption(format!(
            "{} bytes, shorter than the header",
            bytes.len()
        )));
    };
    if header_bytes[..LOG_MAGIC.len()] != LOG_MAGIC {
        return Err(Corruption("it does not start with STLCRLOG".to_string()));
    }
    let version = u32::from_le_bytes(header_bytes[LOG_MAGIC.len()..].try_into().expect("4 bytes"));
    if version != LOG_VERSION {
        return Err(Corruption(format!(
            "format version {version}; this build reads {LOG_VERSION}"
        )));
    }
    let mut content = LogContent::default();
    let mut offset = LOG_HEADER_LEN;
    while offset < bytes.len() {
        match decode_record(&bytes[offset..]) {
            RecordRead::Record { body, length } => {
                let record: LogRecord = serde_json::from_slice(body).map_err(|error| {
                    Corruption(format!("record at byte {offset} does not parse: {error}"))
                })?;
                content
                    .replay(record)
                    .map_err(|error| Corruption(format!("record at byte {offset}: {error}")))?;
                offset += length;
            }
            RecordRead::Incomplete => break,
            RecordRead::Mismatch { length } => {
                if valid_record_at(&bytes[offset + length..]) {
                    return Err(Corruption(format!(
                        "record at byte {offset} fails its checksum and valid records follow it"
                    )));
                }
                break;
            }
        }
    }
    Ok(Recovered {
        content,
        valid_length: offset,
    })
}

fn valid_record_at(bytes: &[u8]) -> bool {
    match decode_record(bytes) {
        RecordRead::Record { body, .. } => serde_json::from_slice::<LogRecord>(body).is_ok(),
        _ => false,
    }
}

/// Runs blocking file work off the async threads.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> io::Result<T> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|error| io::Error::other(format!("storage task failed: {error}")))?
}

/// The Raft log and vote of one server.
pub(crate) struct LogStore {
    dir: PathBuf,
    content: Arc<Mutex<LogContent>>,
    vote: Option<Vote<u64>>,
    /// `raft.log`, open for appending.
    file: Arc<Mutex<File>>,
    /// Why the store stopped taking writes, once a write or sync failed.
    failed: Option<String>,
}

/// Reads entries for openraft's replication tasks.
pub(crate) struct LogReader {
    content: Arc<Mutex<LogContent>>,
}

fn storage_error(path: &Path, action: &'static str, source: io::Error) -> ControlError {
    ControlError::Storage {
        path: path.to_path_buf(),
        action,
        source,
    }
}

impl LogStore {
    /// Opens (or creates) the log and vote in `dir`, dropping a torn tail.
    /// Blocking.
    pub(crate) fn open(dir: &Path) -> Result<LogStore, ControlError> {
        if !dir.exists() {
            // The folder's own entry must survive a crash too.
            fs::create_dir_all(dir)
                .and_then(|()| sync_folder(dir))
                .map_err(|error| storage_error(dir, "creating the folder", error))?;
        }
        let vote = read_vote_file(&dir.join(VOTE_FILE))?;
        let path = dir.join(LOG_FILE);
        if !path.exists() {
            write_atomically(&path, &header())
                .map_err(|error| storage_error(&path, "creating", error))?;
        }
        let bytes = fs::read(&path).map_err(|error| storage_error(&path, "reading", error))?;
        let recovered = recover(&bytes).map_err(|detail| ControlError::Corrupt {
            path: path.clone(),
            detail: detail.to_string(),
        })?;
        if recovered.valid_length < bytes.len() {
            tracing::warn!(
                "control log {}: dropping a torn tail of {} bytes",
                path.display(),
                bytes.len() - recovered.valid_length
            );
            let file = OpenOptions::new()
                .write(true)
                .open(&path)
                .map_err(|error| storage_error(&path, "opening", error))?;
            file.set_len(recovered.valid_length as u64)
                .and_then(|()| file.sync_all())
                .map_err(|error| storage_error(&path, "truncating the torn tail", error))?;
        }
        let file = OpenOptions::new()
            .append(true)
            .open(&path)
            .map_err(|error| storage_error(&path, "opening for appends", error))?;
        Ok(LogStore {
            dir: dir.to_path_buf(),
            content: Arc::new(Mutex::new(recovered.content)),
            vote,
            file: Arc::new(Mutex::new(file)),
            failed: None,
        })
    }

    /// True when nothing was ever voted or logged here: a pristine node.
    pub(crate) fn is_pristine(&self) -> bool {
        let content = self.content.lock().expect("control log lock");
        self.vote.is_none() && content.last_log_id().is_none()
    }

    /// The error every write returns once the store is latched failed.
    fn latched(&self) -> Option<StorageError<u64>> {
        let why = self.failed.as_ref()?;
        let error = StorageIOError::write_logs(AnyError::error(format!(
            "the control log refuses writes after an earlier failure: {why}"
        )));
        Some(error.into())
    }

    fn latch(&mut self, error: &io::Error) {
        self.failed.get_or_insert_with(|| error.to_string());
    }

    /// Replaces the file with `content`'s image, then the memory with
    /// `content`.
    async fn rewrite(&mut self, content: LogContent) -> Result<(), StorageError<u64>> {
        if let Some(error) = self.latched() {
            return Err(error);
        }
        let path = self.dir.join(LOG_FILE);
        let image = content.image();
        let file = self.file.clone();
        let result = blocking(move || {
            write_atomically(&path, &image)?;
            let reopened = OpenOptions::new().append(true).open(&path)?;
            *file.lock().expect("control log file lock") = reopened;
            Ok(())
        })
        .await;
        if let Err(error) = result {
            self.latch(&error);
            return Err(StorageIOError::write_logs(&error).into());
        }
        *self.content.lock().expect("control log lock") = content;
        Ok(())
    }
}

fn read_vote_file(path: &Path) -> Result<Option<Vote<u64>>, ControlError> {
    let bytes = match fs::read(path) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(storage_error(path, "reading", error)),
    };
    let file: VoteFile = serde_json::from_slice(&bytes).map_err(|error| ControlError::Corrupt {
        path: path.to_path_buf(),
        detail: error.to_string(),
    })?;
    if file.version != VOTE_VERSION {
        return Err(ControlError::Corrupt {
            path: path.to_path_buf(),
            detail: format!("vote format version {}", file.version),
        });
    }
    Ok(Some(file.vote))
}

fn entries_in<RB: RangeBounds<u64>>(
    content: &Mutex<LogContent>,
    range: RB,
) -> Vec<Entry<TypeConfig>> {
    let content = content.lock().expect("control log lock");
    content
        .entries
        .range(range)
        .map(|(_, entry)| entry.clone())
        .collect()
}

impl RaftLogReader<TypeConfig> for LogReader {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, StorageError<u64>> {
        Ok(entries_in(&self.content, range))
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, StorageError<u64>> {
        Ok(entries_in(&self.content, range))
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogReader;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError<u64>> {
        let content = self.content.lock().expect("control log lock");
        Ok(LogState {
            last_purged_log_id: content.last_purged,
            last_log_id: content.last_log_id(),
        })
    }

    async fn get_log_reader(&mut self) -> LogReader {
        LogReader {
            content: self.content.clone(),
        }
    }

    async fn save_vote(&mut self, vote: &Vote<u64>) -> Result<(), StorageError<u64>> {
        if let Some(error) = self.latched() {
            return Err(error);
        }
        let path = self.dir.join(VOTE_FILE);
        let bytes = serde_json::to_vec(&VoteFile {
            version: VOTE_VERSION,
            vote: *vote,
        })
        .expect("votes serialize");
        if let Err(error) = blocking(move || write_atomically(&path, &bytes)).await {
            self.latch(&error);
            return Err(StorageIOError::write_vote(&error).into());
        }
        self.vote = Some(*vote);
        Ok(())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<u64>>, StorageError<u64>> {
        Ok(self.vote)
    }

    async fn save_committed(
        &mut self,
        committed: Option<LogId<u64>>,
    ) -> Result<(), StorageError<u64>> {
        if let Some(error) = self.latched() {
            return Err(error);
        }
        let Some(id) = committed else {
            return Ok(());
        };
        // Written without a sync: a lost record only makes a restarted
        // node wait for the leader to tell it again.
        let mut bytes = Vec::new();
        put_record(&mut bytes, &LogRecordRef::Committed(&id));
        let written = self
            .file
            .lock()
            .expect("control log file lock")
            .write_all(&bytes);
        if let Err(error) = written {
            self.latch(&error);
            return Err(StorageIOError::write_logs(&error).into());
        }
        self.content.lock().expect("control log lock").committed = committed;
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<u64>>, StorageError<u64>> {
        Ok(self.content.lock().expect("control log lock").committed)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError<u64>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        if let Some(error) = self.latched() {
            return Err(error);
        }
        let entries: Vec<Entry<TypeConfig>> = entries.into_iter().collect();
        let mut last = self.content.lock().expect("control log lock").last_log_id();
        let mut bytes = Vec::new();
        for entry in &entries {
            if last.is_some_and(|id| entry.log_id.index != id.index + 1) {
                return Err(StorageIOError::write_logs(AnyError::error(format!(
                    "entry {} after {:?} would leave a hole in the control log",
                    entry.log_id.index, last
                )))
                .into());
            }
            last = Some(entry.log_id);
            put_record(&mut bytes, &LogRecordRef::Entry(entry));
        }
        let file = self.file.clone();
        let result = blocking(move || {
            let mut file = file.lock().expect("control log file lock");
            file.write_all(&bytes)?;
            file.sync_data()
        })
        .await;
        if let Err(error) = result {
            self.latch(&error);
            callback.log_io_completed(Err(io::Error::new(error.kind(), error.to_string())));
            return Err(StorageIOError::write_logs(&error).into());
        }
        {
            let mut content = self.content.lock().expect("control log lock");
            for entry in entries {
                content.entries.insert(entry.log_id.index, entry);
            }
        }
        callback.log_io_completed(Ok(()));
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId<u64>) -> Result<(), StorageError<u64>> {
        let mut content = self.content.lock().expect("control log lock").clone();
        content.entries.retain(|&index, _| index < log_id.index);
        self.rewrite(content).await
    }

    async fn purge(&mut self, log_id: LogId<u64>) -> Result<(), StorageError<u64>> {
        let mut content = self.content.lock().expect("control log lock").clone();
        content.entries.retain(|&index, _| index > log_id.index);
        content.last_purged = Some(log_id);
        self.rewrite(content).await
    }
}

#[cfg(test)]
mod tests;
