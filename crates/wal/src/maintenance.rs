//! Checkpoints and retention of a log: writing the checkpoint of a durable
//! version, and deleting whole segments that checkpoints cover.
//!
//! Retention deletes only segments that every kept checkpoint covers, so
//! either of the two kept checkpoints can recover the log, and deletes
//! them oldest first, each removal synced in the folder before the next:
//! a crash at any step leaves a log that starts at one of the segments'
//! bases, which the checkpoints cover.

use crate::FormatError;
use std::sync::Arc;

use proto::Record;

use crate::checkpoint::{self, Checkpoint, CheckpointSegment, CHECKPOINTS_KEPT};
use crate::config::Durability;
use crate::error::LogError;
use crate::log::{lock, Log};
use crate::segment;
use crate::storage::StorageFile;

/// How much of a log to keep. A limit of 0 is no limit of that kind; with
/// both 0 the log keeps everything.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Retention {
    /// Delete the oldest segments while the log stays at least this large
    /// without them.
    pub bytes: u64,
    /// Delete segments closed at least this long ago (counted from when a
    /// checkpoint first saw them closed).
    pub ms: u64,
}

impl Retention {
    pub fn keeps_everything(&self) -> bool {
        self.bytes == 0 && self.ms == 0
    }
}

/// A checkpoint's segment table, and where the segment holding its
/// version is cut (table position, file unless it is not open yet, a
/// record offset before the cut).
type CoveredTable = (
    Vec<CheckpointSegment>,
    Option<(usize, Option<Arc<dyn StorageFile>>, u64)>,
);

/// What a checkpoint wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointWritten {
    pub through: u64,
    /// Size of the checkpoint file.
    pub bytes: u64,
}

/// What retention did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Retained {
    /// Segment files deleted.
    pub segments_deleted: usize,
    pub bytes_deleted: u64,
    /// The oldest version the log holds now.
    pub first_version: u64,
}

fn io_error(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> LogError + '_ {
    move |source| LogError::Io {
        path: path.to_path_buf(),
        source,
    }
}

impl Log {
    /// Writes a checkpoint of the log through version `through`, which
    /// must be durable: the segment table up to it and `blob`, the state
    /// the caller rebuilt from the records up to `through` (and from
    /// nothing else). `now_ms` (ms since the Unix epoch) dates the
    /// segments it is the first to see closed, for age retention. The
    /// file is written atomically; then all but the newest two checkpoint
    /// files are removed. Blocks on disk I/O; takes the log's lock only to
    /// copy the segment table.
    pub fn checkpoint(
        &self,
        through: u64,
        blob: &[u8],
        now_ms: u64,
    ) -> Result<CheckpointWritten, LogError> {
        let shared = &self.shared;
        if shared.config.durability == Durability::Memory {
            return Err(LogError::Checkpoint("a memory log has no files".into()));
        }
        let _maintenance = shared
            .maintenance
            .lock()
            .expect("maintenance lock poisoned");
        shared.spill_kept(&mut Vec::new())?;
        let durable = self.durable_version();
        if through == 0 || through > durable {
            return Err(LogError::Checkpoint(format!(
                "version {through} is not durable (durable: {durable})"
            )));
        }
        let (mut table, cut) = self.covered_table(through, now_ms)?;
        if table.is_empty() {
            // Retention deleted the segment ending at `through`: the
            // checkpoint covers nothing on disk, yet still carries the
            // state. A table needs an entry, and this cannot happen while
            // the last segment is never deleted.
            return Err(LogError::Checkpoint(format!(
                "no segment holds version {through}"
            )));
        }
        if let Some((position, file, offset)) = cut {
            // The segment goes on past `through`: its covered length ends
            // where `through`'s record ends.
            let base = table[position].base;
            let file = match file {
                Some(file) => file,
                // A segment a checkpoint covered whole, not read since the
                // open: its records are checked before they are counted.
                None => self.checked_file(base)?,
            };
            table[position].length =
                record_end(file.as_ref(), offset, through).map_err(|reason| LogError::Corrupt {
                    path: segment::segment_path(&shared.folder, base),
                    offset,
                    reason: reason.to_string(),
                })?;
        }
        let checkpoint = Checkpoint {
            stream: shared.stream,
            through,
            written_at_ms: now_ms,
            segments: table,
            blob: blob.to_vec(),
        };
        let previous = lock(&shared.state).checkpoints.clone();
        let mut keep: Vec<u64> = vec![through];
        keep.extend(previous.iter().copied().filter(|&v| v != through));
        keep.truncate(CHECKPOINTS_KEPT);
        let bytes = checkpoint::write(shared.storage.as_ref(), &shared.folder, &checkpoint, &keep)
            .map_err(io_error(&shared.folder))?;
        lock(&shared.state).checkpoints = keep;
        {
            let _manifest = shared.manifest.lock().expect("manifest lock poisoned");
            let newest = lock(&shared.state).segments.last().map_or(1, |s| s.base);
            shared.write_manifest(newest)?;
        }
        Ok(CheckpointWritten { through, bytes })
    }

    /// The segment table up to `through`, copied under the log's lock,
    /// and, when the segment holding `through` goes on past it, where to
    /// find the end of `through`'s record (the table entry, the file and a
    /// record offset at or before it). Stamps the segments first seen
    /// closed with `now_ms`.
    fn covered_table(&self, through: u64, now_ms: u64) -> Result<CoveredTable, LogError> {
        let shared = &self.shared;
        let mut state = lock(&shared.state);
        if through + 1 < state.first_version {
            return Err(LogError::Checkpoint(format!(
                "version {through} is older than the log's first, {}",
                state.first_version
            )));
        }
        let count = state.segments.len();
        let mut table = Vec::new();
        let mut cut = None;
        for (position, segment) in state.segments.iter_mut().enumerate() {
            if segment.base > through {
                break;
            }
            if position + 1 < count && segment.sealed_at_ms == 0 {
                segment.sealed_at_ms = now_ms;
            }
            if segment.last_version > through {
                cut = Some((table.len(), segment.file.clone(), segment.seek(through)));
            }
            table.push(CheckpointSegment {
                base: segment.base,
                last_version: segment.last_version.min(through),
                length: segment.length,
                sealed_at_ms: segment.sealed_at_ms,
            });
        }
        Ok((table, cut))
    }

    /// The file of segment `base`, which a checkpoint covered whole and no
    /// one has read since the open: checked as its first read would.
    fn checked_file(&self, base: u64) -> Result<Arc<dyn StorageFile>, LogError> {
        let shared = &self.shared;
        let unchecked = {
            let state = lock(&shared.state);
            let segment = state.segments.iter().find(|s| s.base == base);
            match segment.and_then(|s| s.file.clone().map(Ok).or(s.unchecked.map(Err))) {
                Some(Ok(file)) => return Ok(file),
                Some(Err(unchecked)) => unchecked,
                None => {
                    return Err(LogError::Checkpoint(format!(
                        "segment {base} is no longer in the log"
                    )))
                }
            }
        };
        let (file, index) = crate::recovery::check_unchecked(
            shared.storage.as_ref(),
            &shared.folder,
            shared.stream,
            base,
            None,
            unchecked,
        )
        .map_err(|error| error.into_log_error(&segment::segment_path(&shared.folder, base)))?;
        let mut state = lock(&shared.state);
        if let Some(segment) = state.segments.iter_mut().find(|s| s.base == base) {
            segment.mark_checked(file.clone(), index);
        }
        Ok(file)
    }

    /// The versions of the checkpoints the log keeps, newest first.
    pub fn checkpoints(&self) -> Vec<u64> {
        lock(&self.shared.state).checkpoints.clone()
    }

    /// Deletes the oldest whole segments that `retention` lets go and that
    /// every kept checkpoint covers (once two are kept), oldest first;
    /// never the last segment.
    /// `now_ms` is ms since the Unix epoch. Readers of a deleted version
    /// get [`crate::ReadError::Retained`] naming the oldest one left.
    pub fn retain(&self, retention: Retention, now_ms: u64) -> Result<Retained, LogError> {
        let shared = &self.shared;
        let _maintenance = shared
            .maintenance
            .lock()
            .expect("maintenance lock poisoned");
        let doomed: Vec<(u64, u64)> = {
            let state = lock(&shared.state);
            // Nothing goes until two checkpoints are kept, so a damaged
            // newest one always leaves one that recovers the log.
            let covered = (state.checkpoints.len() >= CHECKPOINTS_KEPT)
                .then(|| state.checkpoints.iter().copied().min())
                .flatten();
            match covered {
                Some(covered) if !retention.keeps_everything() => {
                    doomed_segments(&state.segments, retention, covered, now_ms)
                }
                _ => Vec::new(),
            }
        };
        let mut retained = Retained::default();
        for (base, length) in doomed {
            {
                // Readers stop asking for the segment before it goes; one
                // that already holds its file reads on from the handle.
                let mut state = lock(&shared.state);
                let front = state.segments.first().map(|s| s.base);
                assert_eq!(front, Some(base), "retention deletes the oldest segment");
                state.segments.remove(0);
                state.first_version = state.segments[0].base;
            }
            let path = segment::segment_path(&shared.folder, base);
            crate::segment::remove_segment_file(shared.storage.as_ref(), &path)
                .map_err(io_error(&path))?;
            // Durable before the next one goes, so a crash leaves the log
            // starting at one of the segments' bases, never with a hole.
            shared
                .storage
                .sync_dir(&shared.folder)
                .map_err(io_error(&shared.folder))?;
            retained.segments_deleted += 1;
            retained.bytes_deleted += length;
        }
        retained.first_version = self.first_version();
        Ok(retained)
    }
}

/// The (base, length) of the oldest segments retention deletes, in order.
fn doomed_segments(
    segments: &[crate::recovery::Segment],
    retention: Retention,
    covered: u64,
    now_ms: u64,
) -> Vec<(u64, u64)> {
    let mut remaining: u64 = segments.iter().map(|s| s.length).sum();
    let mut doomed = Vec::new();
    // The last segment stays: appends go into it.
    for segment in &segments[..segments.len().saturating_sub(1)] {
        let not_created = segment.file.is_none() && segment.unchecked.is_none();
        if segment.last_version > covered || not_created {
            break;
        }
        let left = remaining - segment.length;
        let by_bytes = retention.bytes > 0 && left >= retention.bytes;
        let by_age = retention.ms > 0
            && segment.sealed_at_ms > 0
            && now_ms.saturating_sub(segment.sealed_at_ms) >= retention.ms;
        if !by_bytes && !by_age {
            break;
        }
        remaining = left;
        doomed.push((segment.base, segment.length));
    }
    doomed
}

/// The offset where the record of `version` ends, scanning from `offset`
/// (a record at or before it).
fn record_end(file: &dyn StorageFile, mut offset: u64, version: u64) -> Result<u64, FormatError> {
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let capacity = buffer.len();
        let read = file
            .read_at(&mut buffer, offset)
            .map_err(|error| FormatError::Read(error.to_string()))?;
        let mut position = 0;
        loop {
            match Record::decode(&buffer[position..read]) {
                Ok((record, used)) => {
                    if record.header.version == version {
                        return Ok(offset + (position + used) as u64);
                    }
                    if record.header.version > version {
                        return Err(FormatError::Inconsistent(format!(
                            "version {version} is not in its segment"
                        )));
                    }
                    position += used;
                }
                Err(proto::RecordError::Truncated { needed, .. }) if read > 0 => {
                    if needed > buffer.len() {
                        buffer.resize(needed, 0);
                    }
                    break;
                }
                Err(error) => return Err(FormatError::Inconsistent(error.to_string())),
            }
        }
        if position == 0 && read < capacity {
            return Err(FormatError::Inconsistent(format!(
                "version {version} is past the segment's end"
            )));
        }
        offset += position as u64;
    }
}
