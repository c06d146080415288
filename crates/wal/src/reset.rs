//! Resetting a log to start after a version whose state came from
//! elsewhere: a replica too far behind its primary's retained log takes
//! the primary's checkpoint (the state as of version V) instead of the
//! records up to V, and its log becomes an empty log whose first version
//! is V+1 plus a checkpoint at V holding that state.
//!
//! Crash safety: the new checkpoint is first written atomically as the
//! folder's reset marker (`reset.ckpt`: temporary file, sync, rename,
//! folder sync). That is the commit point: before it is durable, a crash
//! leaves the old log untouched; once it is, every open of the folder
//! finishes the reset before anything else (it is idempotent), so a crash
//! at any later step leaves the new log. Finishing removes every segment
//! and checkpoint file (folder synced), creates the empty segment V+1
//! (synced with its folder entry), writes the checkpoint at V atomically,
//! and removes the marker (folder synced).
//!
//! The checkpoint's segment table names one segment, based at V and
//! ending at V, which is not on disk: recovery from a checkpoint accepts a
//! log whose first segment starts right after the checkpoint's version.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::checkpoint::{self, Checkpoint, CheckpointSegment};
use crate::log::LogError;
use crate::recovery;
use crate::segment;
use crate::storage::{self, Storage, StorageFile};

/// The reset marker's name in a log's folder.
pub const RESET_MARKER: &str = "reset.ckpt";

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> LogError + '_ {
    move |source| LogError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn marker_path(folder: &Path) -> PathBuf {
    folder.join(RESET_MARKER)
}

/// The checkpoint a reset to `through` leaves: `blob` as the state, and a
/// segment table whose one entry stands for the versions up to `through`
/// that this log never holds.
pub(crate) fn transferred(stream: u64, through: u64, blob: &[u8], now_ms: u64) -> Checkpoint {
    Checkpoint {
        stream,
        through,
        written_at_ms: now_ms,
        segments: vec![CheckpointSegment {
            base: through,
            last_version: through,
            length: (segment::SEGMENT_HEADER_LEN + proto::RECORD_HEADER_LEN) as u64,
            sealed_at_ms: now_ms,
        }],
        blob: blob.to_vec(),
    }
}

/// Why a reset failed, and whether it had passed its commit point (the
/// folder then holds a reset that the next open finishes).
pub(crate) struct ResetFailed {
    pub committed: bool,
    pub error: LogError,
}

/// Resets the log in `folder` (closed, or open with nothing in flight) to
/// an empty log starting after `checkpoint.through` with `checkpoint`;
/// returns the new segment's file.
pub(crate) fn reset_folder(
    storage: &dyn Storage,
    folder: &Path,
    checkpoint: &Checkpoint,
) -> Result<Arc<dyn StorageFile>, ResetFailed> {
    let bytes = checkpoint.encode();
    let marker = marker_path(folder);
    storage::write_atomically(storage, &marker, &bytes).map_err(|source| ResetFailed {
        committed: false,
        error: LogError::Io {
            path: marker.clone(),
            source,
        },
    })?;
    finish(storage, folder, checkpoint, &bytes).map_err(|error| ResetFailed {
        committed: true,
        error,
    })
}

/// A reset whose marker is in `folder`: `Some(through)` when there is one.
/// With `repair`, it is finished first (a crash interrupted it).
pub(crate) fn pending(
    storage: &dyn Storage,
    folder: &Path,
    stream: u64,
    repair: bool,
) -> Result<Option<u64>, LogError> {
    let marker = marker_path(folder);
    if !storage.exists(&marker) {
        return Ok(None);
    }
    let bytes = storage::read_all(storage, &marker).map_err(io_error(&marker))?;
    // The marker was synced before it got its name, so it is whole; a
    // damaged one is damage, not a crash.
    let checkpoint = Checkpoint::decode(&bytes, stream).map_err(|reason| LogError::Corrupt {
        path: marker.clone(),
        offset: 0,
        reason: format!("the reset marker is damaged: {reason}"),
    })?;
    if repair {
        finish(storage, folder, &checkpoint, &bytes)?;
    }
    Ok(Some(checkpoint.through))
}

/// The steps after the commit point, each safe to run again.
fn finish(
    storage: &dyn Storage,
    folder: &Path,
    checkpoint: &Checkpoint,
    bytes: &[u8],
) -> Result<Arc<dyn StorageFile>, LogError> {
    let mut removed = false;
    for name in storage.list(folder).map_err(io_error(folder))? {
        // The manifest goes too: it names segments that are gone, and the
        // next open lists the folder instead until a new one is written.
        let doomed = segment::parse_segment_name(&name).is_some()
            || name == crate::manifest::MANIFEST_NAME
            || name.strip_suffix(".tmp") == Some(crate::manifest::MANIFEST_NAME)
            || checkpoint::parse_checkpoint_name(&name).is_some()
            || name
                .strip_suffix(".tmp")
                .and_then(checkpoint::parse_checkpoint_name)
                .is_some();
        if doomed {
            let path = folder.join(&name);
            storage.remove_file(&path).map_err(io_error(&path))?;
            removed = true;
        }
    }
    if removed {
        storage.sync_dir(folder).map_err(io_error(folder))?;
    }
    let through = checkpoint.through;
    let file = recovery::create_segment_file(storage, folder, checkpoint.stream, through + 1)?;
    let path = checkpoint::checkpoint_path(folder, through);
    storage::write_atomically(storage, &path, bytes).map_err(io_error(&path))?;
    let marker = marker_path(folder);
    storage.remove_file(&marker).map_err(io_error(&marker))?;
    storage.sync_dir(folder).map_err(io_error(folder))?;
    Ok(file)
}

/// How long a reset waits for the log's writes in flight to finish.
const IDLE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

impl crate::Log {
    /// Replaces the whole log with an empty one whose first version is
    /// `through + 1`, plus a checkpoint at `through` holding `blob` (the
    /// state as of `through`, from another replica's checkpoint), crash
    /// safely (see the module's comment). `through` must be past the
    /// log's last version, and the caller appends nothing meanwhile; the
    /// reset waits (up to 10 s) for the writes in flight to finish. Reads
    /// of versions up to `through` then get [`crate::ReadError::Retained`]
    /// naming `through + 1`, and the durable version becomes `through`.
    /// A failure after the commit point latches the log failed: its folder
    /// holds a reset that the next open finishes.
    pub fn reset(&self, through: u64, blob: &[u8], now_ms: u64) -> Result<(), LogError> {
        use crate::log::lock;
        let shared = &self.shared;
        if shared.config.durability == crate::Durability::Memory {
            return Err(LogError::Checkpoint(
                "a memory log has no files to reset".into(),
            ));
        }
        let _maintenance = shared
            .maintenance
            .lock()
            .expect("maintenance lock poisoned");
        let deadline = std::time::Instant::now() + IDLE_WAIT;
        let mut state = loop {
            let mut state = lock(&shared.state);
            if let Some(failure) = &state.failed {
                return Err(LogError::Checkpoint(format!("the log failed: {failure}")));
            }
            if through <= state.last_version {
                return Err(LogError::Checkpoint(format!(
                    "cannot reset to version {through}: the log already holds up to {}",
                    state.last_version
                )));
            }
            if state.pending.is_empty() && self.durable_version() == state.last_version {
                break state;
            }
            // A paged log writes a partly filled page only when sealed.
            if let Some(page) = state.pending.back_mut() {
                page.sealed = true;
            }
            drop(state);
            shared.work.notify_one();
            if std::time::Instant::now() >= deadline {
                return Err(LogError::Checkpoint(
                    "the log's writes did not finish in time for a reset".into(),
                ));
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        };
        let checkpoint = transferred(shared.stream, through, blob, now_ms);
        // Under the state lock: no read or write sees a half-made log.
        match reset_folder(shared.storage.as_ref(), &shared.folder, &checkpoint) {
            Ok(file) => {
                let mut segment = recovery::Segment::new(through + 1);
                segment.file = Some(file);
                state.segments = vec![segment];
                state.first_version = through + 1;
                state.last_version = through;
                state.checkpoints = vec![through];
                state.tail_reset = true;
                shared
                    .progress
                    .send_modify(|progress| progress.durable = progress.durable.max(through));
                Ok(())
            }
            Err(ResetFailed { committed, error }) => {
                if committed {
                    let message: Arc<str> = Arc::from(format!(
                        "a reset to version {through} failed halfway (the next open finishes it): {error}"
                    ));
                    state.failed = Some(message.clone());
                    drop(state);
                    shared
                        .progress
                        .send_modify(|progress| progress.failed = Some(message));
                    shared.space.notify_waiters();
                }
                Err(error)
            }
        }
    }

    /// The newest checkpoint the log keeps that reads back whole: its
    /// version and state. `None` when there is none (or no file). Reads
    /// the file; takes the log's lock only to list the checkpoints.
    pub fn newest_checkpoint(&self) -> Option<(u64, Vec<u8>)> {
        let shared = &self.shared;
        let kept = crate::log::lock(&shared.state).checkpoints.clone();
        kept.into_iter().find_map(|through| {
            let path = checkpoint::checkpoint_path(&shared.folder, through);
            let bytes = storage::read_all(shared.storage.as_ref(), &path).ok()?;
            let decoded = Checkpoint::decode(&bytes, shared.stream).ok()?;
            (decoded.through == through).then_some((through, decoded.blob))
        })
    }
}
