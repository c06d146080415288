//! Recovery: scan every segment in version order, verify every record, keep
//! the longest valid prefix, truncate a torn tail, and refuse corruption
//! anywhere before the tail.
//!
//! A bad record at offset X of the last segment is a torn tail when no valid
//! record of this stream with a later version starts anywhere after X: a
//! crash during a write can leave garbage after the last synced record, but
//! it cannot leave a valid later record behind garbage. Any other bad record
//! is corruption, and the log refuses to open with an error naming the file
//! and the offset.

use std::path::Path;
use std::sync::Arc;

use proto::{Record, RECORD_HEADER_LEN};

use crate::log::LogError;
use crate::segment::{self, SEGMENT_HEADER_LEN};
use crate::storage::{Storage, StorageFile};

/// The sparse index keeps one entry per this many bytes of a segment, so a
/// reader seeks close to any version with an index that costs a few bytes
/// per 64 KiB of log.
pub(crate) const INDEX_INTERVAL_BYTES: u64 = 64 * 1024;

/// One segment as the log tracks it.
pub(crate) struct Segment {
    pub base: u64,
    /// The last version in the segment, `base - 1` while it is empty.
    pub last_version: u64,
    /// Open once the file exists on disk.
    pub file: Option<Arc<dyn StorageFile>>,
    /// Sparse (version, offset) pairs, ascending.
    pub index: Vec<(u64, u64)>,
    /// Bytes in the segment including appends not yet written.
    pub length: u64,
}

impl Segment {
    pub fn new(base: u64) -> Segment {
        Segment {
            base,
            last_version: base - 1,
            file: None,
            index: Vec::new(),
            length: SEGMENT_HEADER_LEN as u64,
        }
    }

    /// Records that a record of `version` starts at `offset`.
    pub fn note_record(&mut self, version: u64, offset: u64, length: u64) {
        let far_enough = match self.index.last() {
            None => true,
            Some(&(_, indexed)) => offset - indexed >= INDEX_INTERVAL_BYTES,
        };
        if far_enough {
            self.index.push((version, offset));
        }
        self.last_version = version;
        self.length = offset + length;
    }

    /// The offset of the indexed record nearest at or before `version`.
    pub fn seek(&self, version: u64) -> u64 {
        let position = self.index.partition_point(|&(v, _)| v <= version);
        match position {
            0 => SEGMENT_HEADER_LEN as u64,
            p => self.index[p - 1].1,
        }
    }
}

/// Whether recovery may change the files (the log's own open) or only
/// read them (inspection by a checker of a stopped server's folder).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    Repair,
    ReadOnly,
}

pub(crate) struct Recovered {
    pub segments: Vec<Segment>,
    pub last_version: u64,
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> LogError + '_ {
    move |source| LogError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Recovers the log in `folder`, calling `visit` with every valid record in
/// version order. Creates the first segment of an empty log.
pub(crate) fn recover(
    storage: &dyn Storage,
    folder: &Path,
    stream: u64,
    mode: Mode,
    visit: &mut dyn FnMut(&Record<'_>),
) -> Result<Recovered, LogError> {
    if mode == Mode::Repair {
        storage.create_dir_all(folder).map_err(io_error(folder))?;
    }
    let mut bases: Vec<u64> = storage
        .list(folder)
        .map_err(io_error(folder))?
        .iter()
        .filter_map(|name| segment::parse_segment_name(name))
        .collect();
    bases.sort_unstable();
    if bases.is_empty() {
        if mode == Mode::ReadOnly {
            return Ok(Recovered {
                segments: Vec::new(),
                last_version: 0,
            });
        }
        let first = create_segment(storage, folder, stream, 1)?;
        return Ok(Recovered {
            segments: vec![first],
            last_version: 0,
        });
    }
    let mut segments: Vec<Segment> = Vec::with_capacity(bases.len());
    // Until retention deletes old segments, a log starts at version 1; a
    // first segment based later means segments were lost.
    let mut expected = 1;
    for (position, &base) in bases.iter().enumerate() {
        let is_last = position + 1 == bases.len();
        let path = segment::segment_path(folder, base);
        if base != expected {
            return Err(LogError::Corrupt {
                path,
                offset: 0,
                reason: format!(
                    "segment starts at version {base}, expected {expected}: versions are missing"
                ),
            });
        }
        let segment = scan_segment(storage, folder, stream, base, is_last, mode, visit)?;
        expected = segment.last_version + 1;
        segments.push(segment);
    }
    Ok(Recovered {
        last_version: expected - 1,
        segments,
    })
}

/// Creates a segment file with its header, durable along with its folder
/// entry before any record is written into it.
pub(crate) fn create_segment(
    storage: &dyn Storage,
    folder: &Path,
    stream: u64,
    base: u64,
) -> Result<Segment, LogError> {
    let mut segment = Segment::new(base);
    segment.file = Some(create_segment_file(storage, folder, stream, base)?);
    Ok(segment)
}

/// Creates the file of a segment with its header; returns it once the file
/// and its folder entry are durable.
pub(crate) fn create_segment_file(
    storage: &dyn Storage,
    folder: &Path,
    stream: u64,
    base: u64,
) -> Result<Arc<dyn StorageFile>, LogError> {
    let path = segment::segment_path(folder, base);
    let file = storage.open(&path, true).map_err(io_error(&path))?;
    file.set_len(0).map_err(io_error(&path))?;
    file.write_at(&segment::encode_header(stream, base), 0)
        .map_err(io_error(&path))?;
    file.sync_data().map_err(io_error(&path))?;
    // The new file's folder entry must be durable too, or a crash could
    // lose the whole segment after its records were acknowledged.
    storage.sync_dir(folder).map_err(io_error(folder))?;
    Ok(file)
}

fn scan_segment(
    storage: &dyn Storage,
    folder: &Path,
    stream: u64,
    base: u64,
    is_last: bool,
    mode: Mode,
    visit: &mut dyn FnMut(&Record<'_>),
) -> Result<Segment, LogError> {
    let path = segment::segment_path(folder, base);
    let file = storage.open(&path, false).map_err(io_error(&path))?;
    let length = file.len().map_err(io_error(&path))?;
    let mut bytes = vec![0u8; length as usize];
    file.read_exact_at(&mut bytes, 0).map_err(io_error(&path))?;
    if let Err(reason) = segment::check_header(&bytes, stream, base) {
        // A crash while a segment was being created leaves a last segment
        // whose header is cut short (or still zeros) and nothing after it;
        // it is made anew. A whole header that is wrong is no torn write
        // (it may be another stream's file) and is refused.
        let header_torn = bytes.len() < SEGMENT_HEADER_LEN
            || bytes[..SEGMENT_HEADER_LEN].iter().all(|&byte| byte == 0);
        if is_last && header_torn && !has_record_after(&bytes, 0, stream, base) {
            if mode == Mode::ReadOnly {
                return Ok(Segment::new(base));
            }
            drop(file);
            return create_segment(storage, folder, stream, base);
        }
        return Err(LogError::Corrupt {
            path,
            offset: 0,
            reason,
        });
    }
    let mut segment = Segment::new(base);
    let mut offset = SEGMENT_HEADER_LEN;
    while offset < bytes.len() {
        let expected = segment.last_version + 1;
        let problem = match Record::decode(&bytes[offset..]) {
            Ok((record, used))
                if record.header.stream == stream && record.header.version == expected =>
            {
                visit(&record);
                segment.note_record(expected, offset as u64, used as u64);
                offset += used;
                continue;
            }
            Ok((record, _)) => {
                // A whole record with a good checksum in the wrong place is
                // no torn write: something else wrote here.
                return Err(LogError::Corrupt {
                    path,
                    offset: offset as u64,
                    reason: format!(
                        "record of stream {} version {} where stream {stream} version {expected} belongs",
                        record.header.stream, record.header.version
                    ),
                });
            }
            Err(error) => error.to_string(),
        };
        if !is_last || has_record_after(&bytes, offset + 1, stream, expected) {
            return Err(LogError::Corrupt {
                path,
                offset: offset as u64,
                reason: problem,
            });
        }
        // A torn tail: cut it so the next append starts on a clean edge.
        if mode == Mode::Repair {
            file.set_len(offset as u64).map_err(io_error(&path))?;
            file.sync_data().map_err(io_error(&path))?;
        }
        break;
    }
    if is_last && mode == Mode::Repair {
        // The bytes read back may sit only in the page cache: a process
        // killed between the write and its fdatasync leaves them there.
        // Sync before counting them durable, or a later power loss could
        // take back what this process then acknowledges or serves.
        file.sync_data().map_err(io_error(&path))?;
    }
    segment.length = offset as u64;
    segment.file = Some(file);
    Ok(segment)
}

/// Whether a valid record of `stream` with a version of at least
/// `min_version` starts at any offset from `from` on.
fn has_record_after(bytes: &[u8], from: usize, stream: u64, min_version: u64) -> bool {
    let mut offset = from;
    while offset + RECORD_HEADER_LEN <= bytes.len() {
        // Cheap checks first, so the scan costs a checksum only where a
        // plausible header stands.
        let plausible = bytes[offset + 8] == 1
            && bytes[offset + 9] == 1
            && Record::peek_len(&bytes[offset..])
                .is_some_and(|l| l >= RECORD_HEADER_LEN && offset + l <= bytes.len());
        if plausible {
            if let Ok((record, _)) = Record::decode(&bytes[offset..]) {
                if record.header.stream == stream && record.header.version >= min_version {
                    return true;
                }
            }
        }
        offset += 1;
    }
    false
}

/// See [`crate::truncate_after`].
pub(crate) fn truncate_after(
    storage: &dyn Storage,
    folder: &Path,
    stream: u64,
    version: u64,
) -> Result<u64, LogError> {
    let recovered = recover(storage, folder, stream, Mode::Repair, &mut |_| {})?;
    if recovered.last_version <= version {
        return Ok(0);
    }
    let dropped = recovered.last_version - version;
    for segment in recovered.segments.iter().rev() {
        let path = segment::segment_path(folder, segment.base);
        if segment.base > version + 1 || (segment.base == version + 1 && segment.base > 1) {
            // Wholly past the cut (the first segment stays, as a log's
            // first segment always exists).
            drop(segment.file.clone());
            storage.remove_file(&path).map_err(io_error(&path))?;
            storage.sync_dir(folder).map_err(io_error(folder))?;
            continue;
        }
        let file = segment.file.as_ref().expect("a recovered segment is open");
        let mut offset = segment.seek(version + 1);
        let mut bytes = vec![0u8; (segment.length - offset) as usize];
        file.read_exact_at(&mut bytes, offset)
            .map_err(io_error(&path))?;
        let mut at = 0;
        while at < bytes.len() {
            let (record, used) =
                Record::decode(&bytes[at..]).map_err(|error| LogError::Corrupt {
                    path: path.clone(),
                    offset: offset + at as u64,
                    reason: error.to_string(),
                })?;
            if record.header.version > version {
                break;
            }
            at += used;
        }
        offset += at as u64;
        file.set_len(offset).map_err(io_error(&path))?;
        file.sync_data().map_err(io_error(&path))?;
        break;
    }
    Ok(dropped)
}
