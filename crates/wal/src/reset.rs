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

use std::sync::Arc;

use crate::checkpoint::{self, Checkpoint};
use crate::error::LogError;
use crate::marker::{reset_folder, transferred, ResetFailed};
use crate::recovery;
use crate::storage;

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
                shared.reset_tail(&mut state);
                shared.publish(|progress| progress.durable = progress.durable.max(through));
                Ok(())
            }
            Err(ResetFailed { committed, error }) => {
                if committed {
                    let message: Arc<str> = Arc::from(format!(
                        "a reset to version {through} failed halfway (the next open finishes it): {error}"
                    ));
                    state.failed = Some(message.clone());
                    drop(state);
                    shared.publish(|progress| progress.failed = Some(message));
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
