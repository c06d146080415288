//! A reset's marker and its steps on disk (see `reset.rs` for what a reset
//! is): writing the marker, the transferred checkpoint, and finishing a
//! reset, which every open of a folder does first when it finds a marker.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::checkpoint::{self, Checkpoint, CheckpointSegment};
use crate::error::{io_error, LogError};
use crate::segment;
use crate::storage::{self, Storage, StorageFile};

/// The reset marker's name in a log's folder.
pub const RESET_MARKER: &str = "reset.ckpt";

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
    let file = segment::create_segment_file(storage, folder, checkpoint.stream, through + 1)?;
    let path = checkpoint::checkpoint_path(folder, through);
    storage::write_atomically(storage, &path, bytes).map_err(io_error(&path))?;
    let marker = marker_path(folder);
    storage.remove_file(&marker).map_err(io_error(&marker))?;
    storage.sync_dir(folder).map_err(io_error(folder))?;
    Ok(file)
}
