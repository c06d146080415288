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

use crate::checkpoint::{self, Checkpoint, CheckpointSegment};
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
    /// When a checkpoint first saw the segment closed (ms since the Unix
    /// epoch), 0 until then; age retention counts from here.
    pub sealed_at_ms: u64,
}

impl Segment {
    pub fn new(base: u64) -> Segment {
        Segment {
            base,
            last_version: base - 1,
            file: None,
            index: Vec::new(),
            length: SEGMENT_HEADER_LEN as u64,
            sealed_at_ms: 0,
        }
    }

    /// The segment as a checkpoint recorded it, its file already open.
    fn covered(entry: &CheckpointSegment, file: Arc<dyn StorageFile>) -> Segment {
        Segment {
            base: entry.base,
            last_version: entry.last_version,
            file: Some(file),
            index: entry.index.clone(),
            length: entry.length,
            sealed_at_ms: entry.sealed_at_ms,
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

/// What recovery used and found, for the log's owner to report.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// The version of the checkpoint recovery started from, if any; the
    /// records up to it were not scanned.
    pub checkpoint: Option<u64>,
    /// Checkpoints that could not be used, each with why (damaged, or not
    /// matching the segments on disk); recovery fell back past them.
    pub ignored: Vec<String>,
    /// Records scanned and passed to `visit`.
    pub records_visited: u64,
}

pub(crate) struct Recovered {
    pub segments: Vec<Segment>,
    pub last_version: u64,
    /// Valid checkpoints on disk within the log, newest first.
    pub checkpoints: Vec<u64>,
    pub report: RecoveryReport,
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> LogError + '_ {
    move |source| LogError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The bases of the segment files in `folder`, ascending.
fn segment_bases(storage: &dyn Storage, folder: &Path) -> Result<Vec<u64>, LogError> {
    let mut bases: Vec<u64> = storage
        .list(folder)
        .map_err(io_error(folder))?
        .iter()
        .filter_map(|name| segment::parse_segment_name(name))
        .collect();
    bases.sort_unstable();
    Ok(bases)
}

/// Recovers the log in `folder` by scanning every segment, calling `visit`
/// with every valid record in version order. Creates the first segment of
/// an empty log. The log must start at version 1: without a checkpoint,
/// retained-away records cannot be replayed.
pub(crate) fn recover(
    storage: &dyn Storage,
    folder: &Path,
    stream: u64,
    mode: Mode,
    visit: &mut dyn FnMut(&Record<'_>),
) -> Result<Recovered, LogError> {
    if mode == Mode::Repair {
        storage.create_dir_all(folder).map_err(io_error(folder))?;
        crate::reset::pending(storage, folder, stream, true)?;
    }
    let bases = segment_bases(storage, folder)?;
    scan_all(
        storage,
        folder,
        stream,
        mode,
        &bases,
        1,
        Covered::default(),
        visit,
    )
}

/// Reads every record on disk, for inspection: like [`recover`], except
/// that a log whose oldest segments retention deleted starts at its first
/// segment on disk when a valid checkpoint covers the versions before it.
pub(crate) fn inspect(
    storage: &dyn Storage,
    folder: &Path,
    stream: u64,
    visit: &mut dyn FnMut(&Record<'_>),
) -> Result<Recovered, LogError> {
    if storage.exists(folder) {
        if let Some(through) = crate::reset::pending(storage, folder, stream, false)? {
            // A reset that a crash interrupted: the log is the empty one
            // after `through` that the next open finishes making.
            return Ok(Recovered {
                segments: Vec::new(),
                last_version: through,
                checkpoints: Vec::new(),
                report: RecoveryReport::default(),
            });
        }
    }
    let bases = segment_bases(storage, folder)?;
    let first = bases.first().copied().unwrap_or(1);
    let loaded = checkpoint::load(storage, folder, stream).map_err(io_error(folder))?;
    let vouched = loaded.checkpoints.iter().any(|c| c.through + 1 >= first);
    let start = if vouched { first } else { 1 };
    let mode = Mode::ReadOnly;
    scan_all(
        storage,
        folder,
        stream,
        mode,
        &bases,
        start,
        Covered::default(),
        visit,
    )
}

/// Recovers the log in `folder` from its newest usable checkpoint: the
/// segments the checkpoint covers are checked (header and length) but not
/// scanned, `restore` gets the checkpoint's blob, and `visit` only the
/// records after it. A checkpoint that is damaged, that `restore` refuses,
/// or that claims more than the segments on disk hold is skipped for the
/// one before it, and without any, every segment is scanned (`restore` is
/// then never called). Each skip is reported.
pub(crate) fn recover_checkpointed(
    storage: &dyn Storage,
    folder: &Path,
    stream: u64,
    mode: Mode,
    restore: &mut dyn FnMut(&[u8]) -> Result<(), String>,
    visit: &mut dyn FnMut(&Record<'_>),
) -> Result<Recovered, LogError> {
    if mode == Mode::Repair {
        storage.create_dir_all(folder).map_err(io_error(folder))?;
        crate::reset::pending(storage, folder, stream, true)?;
    }
    let bases = segment_bases(storage, folder)?;
    let loaded = checkpoint::load(storage, folder, stream).map_err(io_error(folder))?;
    let mut ignored: Vec<String> = loaded
        .ignored
        .iter()
        .map(|(path, reason)| format!("{}: {reason}", path.display()))
        .collect();
    let valid: Vec<u64> = loaded.checkpoints.iter().map(|c| c.through).collect();
    for checkpoint in &loaded.checkpoints {
        let name = checkpoint::checkpoint_name(checkpoint.through);
        let covered = match check_covered(storage, folder, stream, &bases, checkpoint)? {
            Ok(covered) => covered,
            Err(reason) => {
                ignored.push(format!("{name}: {reason}"));
                continue;
            }
        };
        if let Err(reason) = restore(&checkpoint.blob) {
            ignored.push(format!("{name}: its state was refused: {reason}"));
            continue;
        }
        let first = covered.next_version;
        let mut recovered = scan_all(storage, folder, stream, mode, &bases, first, covered, visit)?;
        recovered.report.checkpoint = Some(checkpoint.through);
        recovered.report.ignored = ignored;
        let last = recovered.last_version;
        recovered.checkpoints = valid.iter().copied().filter(|&v| v <= last).collect();
        return Ok(recovered);
    }
    let mut recovered = scan_all(
        storage,
        folder,
        stream,
        mode,
        &bases,
        1,
        Covered::default(),
        visit,
    )
    .map_err(|error| match error {
        LogError::Corrupt {
            path,
            offset,
            reason,
        } if !loaded.checkpoints.is_empty() || !ignored.is_empty() => LogError::Corrupt {
            path,
            offset,
            reason: format!("{reason} (no usable checkpoint: {})", ignored.join("; ")),
        },
        other => other,
    })?;
    recovered.report.ignored = ignored;
    Ok(recovered)
}

/// The part of a log a checkpoint covers, checked against the disk.
#[derive(Default)]
struct Covered {
    /// Segments wholly covered, ready for reads.
    segments: Vec<Segment>,
    /// The checkpoint's last segment when its file is on disk: the scan
    /// resumes in it after the covered records.
    resume: Option<(CheckpointSegment, Arc<dyn StorageFile>)>,
    /// Segment files on disk that the checkpoint covers (wholly or partly).
    files: usize,
    /// The first version the scan expects.
    next_version: u64,
}

/// Checks that the segments on disk hold what `checkpoint` says, reading
/// only their headers and lengths. `Ok(Err(why))` when they do not.
fn check_covered(
    storage: &dyn Storage,
    folder: &Path,
    stream: u64,
    bases: &[u64],
    checkpoint: &Checkpoint,
) -> Result<Result<Covered, String>, LogError> {
    let table = &checkpoint.segments;
    let through = checkpoint.through;
    let Some(&first) = bases.first() else {
        return Ok(Err("the log has no segment".into()));
    };
    // Retention deletes the oldest covered segments, so the files on disk
    // may start anywhere in the table, or right after it.
    let start = match table.iter().position(|s| s.base == first) {
        Some(position) => position,
        None if first == through + 1 => table.len(),
        None => {
            return Ok(Err(format!(
                "the log starts at version {first}, which the checkpoint through {through} does not reach"
            )))
        }
    };
    let mut covered = Covered {
        next_version: through + 1,
        ..Covered::default()
    };
    for (position, entry) in table[start..].iter().enumerate() {
        if bases.get(position) != Some(&entry.base) {
            return Ok(Err(format!(
                "segment {} of the checkpoint is missing",
                segment::segment_name(entry.base)
            )));
        }
        let path = segment::segment_path(folder, entry.base);
        let file = match storage.open(&path, false) {
            Ok(file) => file,
            Err(error) => return Ok(Err(format!("{}: {error}", path.display()))),
        };
        let length = file.len().map_err(io_error(&path))?;
        let mut header = [0u8; SEGMENT_HEADER_LEN];
        if length < SEGMENT_HEADER_LEN as u64 {
            return Ok(Err(format!("{}: header cut short", path.display())));
        }
        file.read_exact_at(&mut header, 0)
            .map_err(io_error(&path))?;
        if let Err(reason) = segment::check_header(&header, stream, entry.base) {
            return Ok(Err(format!("{}: {reason}", path.display())));
        }
        let is_last_entry = start + position + 1 == table.len();
        let fits = if is_last_entry {
            length >= entry.length
        } else {
            length == entry.length
        };
        if !fits {
            return Ok(Err(format!(
                "{} holds {length} bytes, the checkpoint says {}: the log is shorter than the checkpoint claims",
                path.display(),
                entry.length
            )));
        }
        covered.files += 1;
        if is_last_entry {
            covered.resume = Some((entry.clone(), file));
        } else {
            covered.segments.push(Segment::covered(entry, file));
        }
    }
    Ok(Ok(covered))
}

/// Scans the segment files `bases` not already covered, chaining from
/// `first_version`, after the covered ones.
#[allow(clippy::too_many_arguments)]
fn scan_all(
    storage: &dyn Storage,
    folder: &Path,
    stream: u64,
    mode: Mode,
    bases: &[u64],
    first_version: u64,
    covered: Covered,
    visit: &mut dyn FnMut(&Record<'_>),
) -> Result<Recovered, LogError> {
    let mut report = RecoveryReport::default();
    let mut counting = |record: &Record<'_>| {
        report.records_visited += 1;
        visit(record);
    };
    if bases.is_empty() {
        if mode == Mode::ReadOnly {
            return Ok(Recovered {
                segments: Vec::new(),
                last_version: 0,
                checkpoints: Vec::new(),
                report,
            });
        }
        let first = create_segment(storage, folder, stream, 1)?;
        return Ok(Recovered {
            segments: vec![first],
            last_version: 0,
            checkpoints: Vec::new(),
            report,
        });
    }
    let mut segments = covered.segments;
    let mut position = segments.len();
    let mut expected = first_version;
    if let Some((entry, file)) = covered.resume {
        let is_last = position + 1 == bases.len();
        let start = Start::After(entry, file);
        let segment = scan_segment(storage, folder, stream, start, is_last, mode, &mut counting)?;
        expected = segment.last_version + 1;
        segments.push(segment);
        position += 1;
    }
    debug_assert_eq!(position, covered.files);
    for (index, &base) in bases.iter().enumerate().skip(position) {
        let is_last = index + 1 == bases.len();
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
        let start = Start::Header(base);
        let segment = scan_segment(storage, folder, stream, start, is_last, mode, &mut counting)?;
        expected = segment.last_version + 1;
        segments.push(segment);
    }
    Ok(Recovered {
        last_version: expected - 1,
        segments,
        checkpoints: Vec::new(),
        report,
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

/// Where the scan of one segment starts.
enum Start {
    /// At its header: the whole segment is checked and scanned.
    Header(u64),
    /// After the records a checkpoint covers; the header was checked.
    After(CheckpointSegment, Arc<dyn StorageFile>),
}

fn scan_segment(
    storage: &dyn Storage,
    folder: &Path,
    stream: u64,
    start: Start,
    is_last: bool,
    mode: Mode,
    visit: &mut dyn FnMut(&Record<'_>),
) -> Result<Segment, LogError> {
    let (mut segment, file, from) = match start {
        Start::Header(base) => {
            let path = segment::segment_path(folder, base);
            let file = storage.open(&path, false).map_err(io_error(&path))?;
            (Segment::new(base), file, 0)
        }
        Start::After(entry, file) => {
            let from = entry.length;
            (Segment::covered(&entry, file.clone()), file, from)
        }
    };
    let base = segment.base;
    let path = segment::segment_path(folder, base);
    let length = file.len().map_err(io_error(&path))?;
    // Offsets in `bytes` are file offsets less `from`.
    let mut bytes = vec![0u8; length.saturating_sub(from) as usize];
    file.read_exact_at(&mut bytes, from)
        .map_err(io_error(&path))?;
    let mut offset = SEGMENT_HEADER_LEN;
    if from == 0 {
        if let Err(reason) = segment::check_header(&bytes, stream, base) {
            // A crash while a segment was being created leaves a last
            // segment whose header is cut short (or still zeros) and
            // nothing after it; it is made anew. A whole header that is
            // wrong is no torn write (it may be another stream's file) and
            // is refused.
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
    } else {
        offset = 0;
    }
    while offset < bytes.len() {
        let expected = segment.last_version + 1;
        let at = from + offset as u64;
        let problem = match Record::decode(&bytes[offset..]) {
            Ok((record, used))
                if record.header.stream == stream && record.header.version == expected =>
            {
                visit(&record);
                segment.note_record(expected, at, used as u64);
                offset += used;
                continue;
            }
            Ok((record, _)) => {
                // A whole record with a good checksum in the wrong place is
                // no torn write: something else wrote here.
                return Err(LogError::Corrupt {
                    path,
                    offset: at,
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
                offset: at,
                reason: problem,
            });
        }
        // A torn tail: cut it so the next append starts on a clean edge.
        if mode == Mode::Repair {
            file.set_len(at).map_err(io_error(&path))?;
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
    segment.length = from + offset as u64;
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
    let recovered = recover_checkpointed(
        storage,
        folder,
        stream,
        Mode::Repair,
        &mut |_| Ok(()),
        &mut |_| {},
    )?;
    if recovered.last_version <= version {
        return Ok(0);
    }
    let first_base = recovered.segments.first().map_or(1, |s| s.base);
    if version + 1 < first_base {
        return Err(LogError::Corrupt {
            path: segment::segment_path(folder, first_base),
            offset: 0,
            reason: format!(
                "cannot cut the log after version {version}: retention removed every version before {first_base}"
            ),
        });
    }
    // A checkpoint past the cut describes records that are going away;
    // it goes first, so a crash midway never leaves one that claims them.
    let mut removed = false;
    for through in checkpoint::list(storage, folder).map_err(io_error(folder))? {
        if through > version {
            let path = checkpoint::checkpoint_path(folder, through);
            storage.remove_file(&path).map_err(io_error(&path))?;
            removed = true;
        }
    }
    if removed {
        storage.sync_dir(folder).map_err(io_error(folder))?;
    }
    let dropped = recovered.last_version - version;
    for segment in recovered.segments.iter().rev() {
        let path = segment::segment_path(folder, segment.base);
        if segment.base > version + 1 || (segment.base == version + 1 && segment.base > first_base)
        {
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
