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
use crate::error::{io_error, LogError};
use crate::manifest::{self, Manifest};
use crate::segment::{self, SEGMENT_HEADER_LEN};
use crate::storage::{Storage, StorageFile};
use crate::{FormatError, RestoreError};

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
    /// Records at the start of the segment that a checkpoint vouched for
    /// and that nothing has read since the log opened: not checked, not in
    /// `index`, and, for a segment the checkpoint covers whole, with its
    /// file not even opened (`file` is `None`). The first read of them
    /// checks them ([`check_unchecked`]); `None` once checked.
    pub unchecked: Option<Unchecked>,
}

/// The part of a segment a checkpoint vouched for and recovery did not
/// read: every byte from the header to `end`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Unchecked {
    /// Where the last covered record ends.
    pub end: u64,
    /// The version of that record.
    pub last_version: u64,
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
            unchecked: None,
        }
    }

    /// The segment as a checkpoint recorded it, with its file when
    /// recovery opened it (the checkpoint's last segment) and without
    /// when it did not (a segment the checkpoint covers whole): its
    /// covered records are checked, and indexed, when first read.
    fn covered(entry: &CheckpointSegment, file: Option<Arc<dyn StorageFile>>) -> Segment {
        Segment {
            base: entry.base,
            last_version: entry.last_version,
            file,
            index: Vec::new(),
            length: entry.length,
            sealed_at_ms: entry.sealed_at_ms,
            unchecked: Some(Unchecked {
                end: entry.length,
                last_version: entry.last_version,
            }),
        }
    }

    /// Whether reading `version` from this segment needs its unchecked
    /// part checked first.
    pub fn needs_check(&self, version: u64) -> bool {
        self.unchecked
            .is_some_and(|unchecked| version <= unchecked.last_version)
    }

    /// Takes in what [`check_unchecked`] found: the file, and the index of
    /// the part it checked, ahead of the entries already there (which all
    /// lie after it).
    pub fn mark_checked(&mut self, file: Arc<dyn StorageFile>, index: Vec<(u64, u64)>) {
        if self.unchecked.take().is_none() {
            return;
        }
        if self.file.is_none() {
            self.file = Some(file);
        }
        self.index.splice(0..0, index);
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

/// The bases of the segment files in `folder`, ascending.
fn segment_bases(storage: &dyn Storage, folder: &Path) -> Result<Vec<u64>, LogError> {
    let names = storage.list(folder).map_err(io_error(folder))?;
    Ok(bases_named(&names))
}

/// The bases of the segment files among `names`, ascending.
fn bases_named(names: &[String]) -> Vec<u64> {
    let mut bases: Vec<u64> = names
        .iter()
        .filter_map(|name| segment::parse_segment_name(name))
        .collect();
    bases.sort_unstable();
    bases
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
        crate::marker::pending(storage, folder, stream, true)?;
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
        if let Some(through) = crate::marker::pending(storage, folder, stream, false)? {
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
/// segments the checkpoint covers are neither scanned nor opened (but for
/// its last one, where the scan resumes: header and length checked), only
/// looked for in the folder listing, and checked when first read;
/// `restore` gets the checkpoint's blob, and `visit` only the
/// records after it. A checkpoint that is damaged, that `restore` refuses,
/// or that claims more than the segments on disk hold is skipped for the
/// one before it, and without any, every segment is scanned (`restore` is
/// then never called). Each skip is reported.
pub(crate) fn recover_checkpointed(
    storage: &dyn Storage,
    folder: &Path,
    stream: u64,
    mode: Mode,
    restore: &mut dyn FnMut(&[u8]) -> Result<(), RestoreError>,
    visit: &mut dyn FnMut(&Record<'_>),
) -> Result<Recovered, LogError> {
    if mode == Mode::Repair {
        storage.create_dir_all(folder).map_err(io_error(folder))?;
        crate::marker::pending(storage, folder, stream, true)?;
    }
    if let Some(manifest) = manifest::read(storage, folder, stream) {
        let recovered =
            recover_from_manifest(storage, folder, stream, mode, &manifest, restore, visit)?;
        if let Some(recovered) = recovered {
            return Ok(recovered);
        }
    }
    // Without a manifest to go by: one listing of the folder serves both
    // the segments and the checkpoints.
    let names = storage.list(folder).map_err(io_error(folder))?;
    let bases = bases_named(&names);
    let loaded =
        checkpoint::load_listed(storage, folder, stream, &names).map_err(io_error(folder))?;
    let mut ignored = ignored_reasons(&loaded);
    let from_checkpoint = recover_from_first_usable(
        &loaded,
        &mut ignored,
        restore,
        |checkpoint| check_covered(storage, folder, stream, &bases, checkpoint),
        |covered| {
            let first = covered.next_version;
            scan_all(storage, folder, stream, mode, &bases, first, covered, visit)
        },
    )?;
    if let Some(recovered) = from_checkpoint {
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

/// Recovers the log from a checkpoint the manifest names without listing
/// the folder: the newest segment must exist (no segment file is newer,
/// the manifest's promise), the table's segments are looked for by name
/// from its oldest (retention deletes oldest first) and then taken as
/// there, and the segments after the checkpoint are found one by one,
/// each based right after the one before, up to the newest. A segment
/// missing on the way to the newest is a hole, refused as the listing
/// would refuse it. `Ok(None)`, before `restore` or `visit` is called,
/// when the manifest cannot be gone by (its newest segment is not on
/// disk, or no checkpoint it names fits): the caller lists the folder.
fn recover_from_manifest(
    storage: &dyn Storage,
    folder: &Path,
    stream: u64,
    mode: Mode,
    manifest: &Manifest,
    restore: &mut dyn FnMut(&[u8]) -> Result<(), RestoreError>,
    visit: &mut dyn FnMut(&Record<'_>),
) -> Result<Option<Recovered>, LogError> {
    let newest = manifest.newest_segment;
    if !storage.exists(&segment::segment_path(folder, newest)) {
        return Ok(None);
    }
    let mut versions = manifest.checkpoints.clone();
    versions.sort_unstable_by(|a, b| b.cmp(a));
    versions.dedup();
    let loaded = checkpoint::load_versions(storage, folder, stream, &versions, true);
    let mut ignored = ignored_reasons(&loaded);
    recover_from_first_usable(
        &loaded,
        &mut ignored,
        restore,
        |checkpoint| probe_covered(storage, folder, stream, newest, checkpoint),
        |covered| scan_probed(storage, folder, stream, mode, newest, covered, visit),
    )
}

/// The checkpoint files that could not be used, each as "path: reason".
fn ignored_reasons(loaded: &checkpoint::Loaded) -> Vec<String> {
    loaded
        .ignored
        .iter()
        .map(|(path, reason)| format!("{}: {reason}", path.display()))
        .collect()
}

/// Recovers from the newest of `loaded`'s checkpoints whose covered
/// segments check out (`covered_by`) and whose state `restore` takes,
/// scanning the log after it (`scan`); each checkpoint passed over is
/// added to `ignored` with the reason. `Ok(None)`, with nothing scanned,
/// when none is usable.
fn recover_from_first_usable(
    loaded: &checkpoint::Loaded,
    ignored: &mut Vec<String>,
    restore: &mut dyn FnMut(&[u8]) -> Result<(), RestoreError>,
    mut covered_by: impl FnMut(
        &checkpoint::Checkpoint,
    ) -> Result<Result<Covered, FormatError>, LogError>,
    mut scan: impl FnMut(Covered) -> Result<Recovered, LogError>,
) -> Result<Option<Recovered>, LogError> {
    let valid: Vec<u64> = loaded.checkpoints.iter().map(|c| c.through).collect();
    for checkpoint in &loaded.checkpoints {
        let name = checkpoint::checkpoint_name(checkpoint.through);
        let covered = match covered_by(checkpoint)? {
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
        let mut recovered = scan(covered)?;
        recovered.report.checkpoint = Some(checkpoint.through);
        recovered.report.ignored = std::mem::take(ignored);
        let last = recovered.last_version;
        recovered.checkpoints = valid.iter().copied().filter(|&v| v <= last).collect();
        return Ok(Some(recovered));
    }
    Ok(None)
}

/// [`check_covered`] without a listing: the segments of the table are
/// looked for by name, from the oldest until one is there.
fn probe_covered(
    storage: &dyn Storage,
    folder: &Path,
    stream: u64,
    newest: u64,
    checkpoint: &Checkpoint,
) -> Result<Result<Covered, FormatError>, LogError> {
    let table = &checkpoint.segments;
    let through = checkpoint.through;
    let present = |base: u64| storage.exists(&segment::segment_path(folder, base));
    let start = match table.iter().position(|s| present(s.base)) {
        Some(position) => position,
        None if present(through + 1) => table.len(),
        None => {
            return Ok(Err(FormatError::Inconsistent(format!(
                "no segment from the checkpoint through {through} on is there"
            ))))
        }
    };
    let mut covered = Covered {
        next_version: through + 1,
        ..Covered::default()
    };
    let Some((last, whole)) = table[start..].split_last() else {
        return Ok(Ok(covered));
    };
    if last.base > newest {
        return Ok(Err(FormatError::Inconsistent(format!(
            "the manifest's newest segment {newest} is older than the checkpoint's last"
        ))));
    }
    covered.segments = whole
        .iter()
        .map(|entry| Segment::covered(entry, None))
        .collect();
    match open_resumed(storage, folder, stream, last)? {
        Ok(file) => covered.resume = Some((last.clone(), file)),
        Err(reason) => return Ok(Err(reason)),
    }
    covered.files = table.len() - start;
    Ok(Ok(covered))
}

/// Opens the checkpoint's last segment, where the scan resumes: its header
/// must be good and it must hold at least what the checkpoint says.
fn open_resumed(
    storage: &dyn Storage,
    folder: &Path,
    stream: u64,
    last: &CheckpointSegment,
) -> Result<Result<Arc<dyn StorageFile>, FormatError>, LogError> {
    let path = segment::segment_path(folder, last.base);
    let file = match storage.open(&path, false) {
        Ok(file) => file,
        Err(error) => {
            return Ok(Err(FormatError::Read(format!(
                "{}: {error}",
                path.display()
            ))))
        }
    };
    let length = file.len().map_err(io_error(&path))?;
    let mut header = [0u8; SEGMENT_HEADER_LEN];
    if length < SEGMENT_HEADER_LEN as u64 {
        return Ok(Err(FormatError::Inconsistent(format!(
            "{}: header cut short",
            path.display()
        ))));
    }
    file.read_exact_at(&mut header, 0)
        .map_err(io_error(&path))?;
    if let Err(reason) = segment::check_header(&header, stream, last.base) {
        return Ok(Err(FormatError::Inconsistent(format!(
            "{}: {reason}",
            path.display()
        ))));
    }
    if length < last.length {
        return Ok(Err(FormatError::Inconsistent(format!(
            "{} holds {length} bytes, the checkpoint says {}: the log is shorter than the checkpoint claims",
            path.display(),
            last.length
        ))));
    }
    Ok(Ok(file))
}

/// Scans the rest of the checkpoint's last segment and the segments after
/// it, each based right after the one before, up to `newest`.
fn scan_probed(
    storage: &dyn Storage,
    folder: &Path,
    stream: u64,
    mode: Mode,
    newest: u64,
    covered: Covered,
    visit: &mut dyn FnMut(&Record<'_>),
) -> Result<Recovered, LogError> {
    let mut report = RecoveryReport::default();
    let mut counting = |record: &Record<'_>| {
        report.records_visited += 1;
        visit(record);
    };
    let mut segments = covered.segments;
    let mut expected = covered.next_version;
    let mut done = false;
    if let Some((entry, file)) = covered.resume {
        let is_last = entry.base == newest;
        let start = Start::After(entry, file);
        let segment = scan_segment(storage, folder, stream, start, is_last, mode, &mut counting)?;
        expected = segment.last_version + 1;
        segments.push(segment);
        done = is_last;
    }
    while !done {
        let is_last = expected == newest;
        let path = segment::segment_path(folder, expected);
        if expected > newest || (!is_last && !storage.exists(&path)) {
            return Err(LogError::Corrupt {
                path: segment::segment_path(folder, newest),
                offset: 0,
                reason: format!(
                    "segment starts at version {newest}, expected {expected}: versions are missing"
                ),
            });
        }
        let start = Start::Header(expected);
        let segment = scan_segment(storage, folder, stream, start, is_last, mode, &mut counting)?;
        if !is_last && segment.last_version < segment.base {
            return Err(LogError::Corrupt {
                path,
                offset: SEGMENT_HEADER_LEN as u64,
                reason: "a segment before the last holds no record".into(),
            });
        }
        expected = segment.last_version + 1;
        segments.push(segment);
        done = is_last;
    }
    // The manifest's promise, checked where breaking it would lose
    // records: a segment after the newest would be one a server that does
    // not keep the manifest wrote (an older version). The records are
    // already visited, so this refuses rather than falls back.
    let after = segment::segment_path(folder, expected);
    if expected > newest && storage.exists(&after) {
        return Err(LogError::Corrupt {
            path: after,
            offset: 0,
            reason: format!(
                "segment past the manifest's newest segment {newest}: the manifest is stale (was the log written by a server that does not keep it?); remove {} to recover by listing the folder",
                manifest::manifest_path(folder).display()
            ),
        });
    }
    Ok(Recovered {
        last_version: expected - 1,
        segments,
        checkpoints: Vec::new(),
        report,
    })
}

/// The part of a log a checkpoint covers, checked against the disk.
#[derive(Default)]
struct Covered {
    /// Segments wholly covered, their files not yet opened: the first
    /// read of each checks it.
    segments: Vec<Segment>,
    /// The checkpoint's last segment when its file is on disk: the scan
    /// resumes in it after the covered records.
    resume: Option<(CheckpointSegment, Arc<dyn StorageFile>)>,
    /// Segment files on disk that the checkpoint covers (wholly or partly).
    files: usize,
    /// The first version the scan expects.
    next_version: u64,
}

/// Checks that the segments on disk can hold what `checkpoint` says:
/// every segment of its table from the first on disk must be there (the
/// folder listing says so), and the table's last segment, where the scan
/// resumes, must have a good header and at least the table's length. The
/// segments the table covers whole are neither opened nor read: their
/// header, length and records are checked when they are first read, so
/// this costs the same however many segments the checkpoint covers.
/// `Ok(Err(why))` when the segments do not fit.
fn check_covered(
    storage: &dyn Storage,
    folder: &Path,
    stream: u64,
    bases: &[u64],
    checkpoint: &Checkpoint,
) -> Result<Result<Covered, FormatError>, LogError> {
    let table = &checkpoint.segments;
    let through = checkpoint.through;
    let Some(&first) = bases.first() else {
        return Ok(Err(FormatError::Inconsistent(
            "the log has no segment".into(),
        )));
    };
    // Retention deletes the oldest covered segments, so the files on disk
    // may start anywhere in the table, or right after it. The table and
    // the bases are both sorted.
    let start = match table.binary_search_by_key(&first, |s| s.base) {
        Ok(position) => position,
        Err(_) if first == through + 1 => table.len(),
        Err(_) => {
            return Ok(Err(FormatError::Inconsistent(format!(
                "the log starts at version {first}, which the checkpoint through {through} does not reach"
            ))))
        }
    };
    let mut covered = Covered {
        next_version: through + 1,
        ..Covered::default()
    };
    let entries = &table[start..];
    if let Some(position) = entries
        .iter()
        .zip(bases)
        .position(|(entry, &base)| entry.base != base)
        .or_else(|| (bases.len() < entries.len()).then_some(bases.len()))
    {
        return Ok(Err(FormatError::Inconsistent(format!(
            "segment {} of the checkpoint is missing",
            segment::segment_name(entries[position].base)
        ))));
    }
    let Some((last, whole)) = entries.split_last() else {
        return Ok(Ok(covered));
    };
    covered.segments = whole
        .iter()
        .map(|entry| Segment::covered(entry, None))
        .collect();
    match open_resumed(storage, folder, stream, last)? {
        Ok(file) => covered.resume = Some((last.clone(), file)),
        Err(reason) => return Ok(Err(reason)),
    }
    covered.files = entries.len();
    Ok(Ok(covered))
}

/// Why a covered segment failed its check on first read.
#[derive(Debug)]
pub(crate) enum CheckError {
    /// Reading it failed.
    Io(std::io::Error),
    /// It is not what the checkpoint says: missing, shorter or longer,
    /// another segment's header, or a damaged or misplaced record.
    Damaged { offset: u64, reason: String },
}

impl CheckError {
    pub fn into_log_error(self, path: &Path) -> LogError {
        match self {
            CheckError::Io(source) => LogError::Io {
                path: path.to_path_buf(),
                source,
            },
            CheckError::Damaged { offset, reason } => LogError::Corrupt {
                path: path.to_path_buf(),
                offset,
                reason,
            },
        }
    }
}

/// A checked segment's open file and the sparse index of the part checked.
pub(crate) type Checked = (Arc<dyn StorageFile>, Vec<(u64, u64)>);

/// Bytes read at a time when a covered segment is checked.
const CHECK_CHUNK_BYTES: usize = 1024 * 1024;

/// A covered segment's file, opened unless the caller has it, with the
/// length its checkpoint names and a good header for `stream` at `base`.
fn open_covered(
    storage: &dyn Storage,
    folder: &Path,
    (stream, base, end): (u64, u64, u64),
    file: Option<Arc<dyn StorageFile>>,
) -> Result<Arc<dyn StorageFile>, CheckError> {
    let damaged = |offset: u64, reason: String| CheckError::Damaged { offset, reason };
    let file = match file {
        Some(file) => file,
        None => {
            let path = segment::segment_path(folder, base);
            let file = storage.open(&path, false).map_err(|error| {
                if error.kind() == std::io::ErrorKind::NotFound {
                    damaged(
                        0,
                        "the segment file is missing, yet a checkpoint covers it".into(),
                    )
                } else {
                    CheckError::Io(error)
                }
            })?;
            let length = file.len().map_err(CheckError::Io)?;
            if length != end {
                return Err(damaged(
                    length.min(end),
                    format!("the segment holds {length} bytes, its checkpoint says {end}"),
                ));
            }
            file
        }
    };
    let mut header = [0u8; SEGMENT_HEADER_LEN];
    file.read_exact_at(&mut header, 0).map_err(|error| {
        if error.kind() == std::io::ErrorKind::UnexpectedEof {
            damaged(0, "segment header cut short".into())
        } else {
            CheckError::Io(error)
        }
    })?;
    segment::check_header(&header, stream, base)
        .map_err(|reason| damaged(0, reason.to_string()))?;
    Ok(file)
}

/// Checks the part of segment `base` a checkpoint vouched for and that
/// recovery did not read: opens the file when `file` is `None` (a segment
/// the checkpoint covers whole, whose length must then be exactly the
/// checkpoint's, as a sealed segment's is), checks its header, and reads
/// its records from the header to `unchecked.end`: versions `base` to
/// `unchecked.last_version`, back to back, each whole, of this stream and
/// with a good checksum. Returns the open file and the sparse index of
/// that part.
pub(crate) fn check_unchecked(
    storage: &dyn Storage,
    folder: &Path,
    stream: u64,
    base: u64,
    file: Option<Arc<dyn StorageFile>>,
    unchecked: Unchecked,
) -> Result<Checked, CheckError> {
    let damaged = |offset: u64, reason: String| CheckError::Damaged { offset, reason };
    let end = unchecked.end;
    let file = open_covered(storage, folder, (stream, base, end), file)?;
    let mut index: Vec<(u64, u64)> = Vec::new();
    let mut expected = base;
    let mut offset = SEGMENT_HEADER_LEN as u64;
    let mut buffer = vec![0u8; CHECK_CHUNK_BYTES.min((end - offset) as usize)];
    while offset < end {
        let want = buffer.len().min((end - offset) as usize);
        file.read_exact_at(&mut buffer[..want], offset)
            .map_err(|error| {
                if error.kind() == std::io::ErrorKind::UnexpectedEof {
                    damaged(offset, "the segment is cut short".into())
                } else {
                    CheckError::Io(error)
                }
            })?;
        let mut position = 0;
        while position < want {
            let at = offset + position as u64;
            match Record::decode(&buffer[position..want]) {
                Ok((record, used)) => {
                    let header = &record.header;
                    if header.stream != stream || header.version != expected {
                        return Err(damaged(
                            at,
                            format!(
                                "record of stream {} version {} where stream {stream} version {expected} belongs",
                                header.stream, header.version
                            ),
                        ));
                    }
                    let far_enough = index
                        .last()
                        .is_none_or(|&(_, indexed)| at - indexed >= INDEX_INTERVAL_BYTES);
                    if far_enough {
                        index.push((expected, at));
                    }
                    expected += 1;
                    position += used;
                }
                Err(proto::RecordError::Truncated { needed, .. }) => {
                    if position == 0 {
                        if needed as u64 > end - offset {
                            return Err(damaged(
                                at,
                                format!(
                                    "a record of {needed} bytes runs past byte {end}, where its checkpoint says the segment's records end"
                                ),
                            ));
                        }
                        buffer.resize(needed, 0);
                    }
                    break;
                }
                Err(error) => return Err(damaged(at, error.to_string())),
            }
        }
        offset += position as u64;
    }
    if expected - 1 != unchecked.last_version {
        return Err(damaged(
            end,
            format!(
                "the segment's records end with version {}, its checkpoint says {}",
                expected - 1,
                unchecked.last_version
            ),
        ));
    }
    Ok((file, index))
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
    segment.file = Some(segment::create_segment_file(storage, folder, stream, base)?);
    Ok(segment)
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
            (Segment::covered(&entry, Some(file.clone())), file, from)
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
        let torn =
            torn_header(&bytes, (stream, base), is_last).map_err(|reason| LogError::Corrupt {
                path: path.clone(),
                offset: 0,
                reason: reason.to_string(),
            })?;
        if torn {
            if mode == Mode::ReadOnly {
                return Ok(Segment::new(base));
            }
            drop(file);
            return create_segment(storage, folder, stream, base);
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

/// Whether a segment's header is torn: a crash while a segment was being
/// created leaves a last segment whose header is cut short (or still
/// zeros) and nothing after it, which is made anew. A whole header that is
/// wrong is no torn write (it may be another stream's file): an error.
fn torn_header(
    bytes: &[u8],
    (stream, base): (u64, u64),
    is_last: bool,
) -> Result<bool, FormatError> {
    let Err(reason) = segment::check_header(bytes, stream, base) else {
        return Ok(false);
    };
    let header_torn = bytes.len() < SEGMENT_HEADER_LEN
        || bytes[..SEGMENT_HEADER_LEN].iter().all(|&byte| byte == 0);
    if is_last && header_torn && !has_record_after(bytes, 0, stream, base) {
        return Ok(true);
    }
    Err(reason)
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
            segment::remove_segment_file(storage, &path).map_err(io_error(&path))?;
            storage.sync_dir(folder).map_err(io_error(folder))?;
            continue;
        }
        let file = match (&segment.file, segment.unchecked) {
            (Some(file), _) => file.clone(),
            // A segment the checkpoint covers whole, not opened yet.
            (None, Some(unchecked)) => {
                check_unchecked(storage, folder, stream, segment.base, None, unchecked)
                    .map_err(|error| error.into_log_error(&path))?
                    .0
            }
            (None, None) => unreachable!("a recovered segment is on disk"),
        };
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
