//! Crash-consistency tests of the write-ahead log on `FaultStorage`: torn
//! tails at every byte, crash images, bit flips, missing segments, failed
//! fsyncs, a full disk, torn writes, and a seeded property test.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use proto::{Record, Rng};
use wal::fault::{CrashMode, FaultStorage};
use wal::segment::{encode_header, parse_segment_name, segment_path, SEGMENT_HEADER_LEN};
use wal::{AppendError, Durability, Log, LogConfig, LogError};

use crate::basics::encode;

pub(crate) const STREAM: u64 = 7;
const FOLDER: &str = "/wal";

pub(crate) fn folder() -> &'static Path {
    Path::new(FOLDER)
}

/// A payload whose bytes depend on its version, so a record read back under
/// the wrong version or with damaged content is noticed.
pub(crate) fn payload(version: u64, size: usize) -> Vec<u8> {
    (0..size)
        .map(|i| {
            (version as usize)
                .wrapping_mul(131)
                .wrapping_add(i * 7 + (i >> 8)) as u8
        })
        .collect()
}

pub(crate) type Recovered = Vec<(u64, Vec<u8>)>;

/// Opens the log in `FOLDER` of `storage`; returns it with every record the
/// recovery visited (version and payload).
pub(crate) fn open(
    storage: &FaultStorage,
    config: LogConfig,
) -> Result<(Log, Recovered), LogError> {
    let mut seen = Vec::new();
    let log = Log::open(
        Arc::new(storage.clone()),
        folder(),
        STREAM,
        config,
        &mut |record: &Record<'_>| {
            assert_eq!(
                record.header.stream, STREAM,
                "recovery visited a record of another stream"
            );
            seen.push((record.header.version, record.payload.to_vec()));
        },
    )?;
    Ok((log, seen))
}

pub(crate) fn open_ok(
    storage: &FaultStorage,
    config: LogConfig,
    context: &str,
) -> (Log, Recovered) {
    match open(storage, config) {
        Ok(opened) => opened,
        Err(error) => panic!("{context}: recovery failed: {error}"),
    }
}

/// Waits until `version` is durable (true) or the log latched failed
/// (false).
fn durable_or_failed(log: &Log, version: u64) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let progress = log.progress().borrow().clone();
        if progress.durable >= version {
            return true;
        }
        if progress.failed.is_some() {
            return false;
        }
        assert!(
            Instant::now() < deadline,
            "version {version} neither durable nor failed after 10 s"
        );
        std::thread::sleep(Duration::from_micros(100));
    }
}

pub(crate) fn wait_durable(log: &Log, version: u64, context: &str) {
    assert!(
        durable_or_failed(log, version),
        "{context}: log failed before version {version} was durable: {:?}",
        log.failure()
    );
}

/// Appends one record, retrying while the buffer is full.
pub(crate) fn append(log: &Log, version: u64, record: &[u8]) -> Result<(), AppendError> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match log.append(version, record) {
            Err(AppendError::Full) => {
                assert!(
                    Instant::now() < deadline,
                    "append {version}: buffer full for 10 s"
                );
                std::thread::sleep(Duration::from_micros(50));
            }
            other => return other,
        }
    }
}

/// Reads every durable record from `from` on through `Log::read`, in
/// batches of at most `max_records` records and `max_bytes` bytes.
pub(crate) fn read_back(log: &Log, from: u64, max_records: usize, max_bytes: usize) -> Recovered {
    let mut found: Recovered = Vec::new();
    let mut next = from;
    loop {
        let mut out = Vec::new();
        let count = log
            .read(next, max_records, max_bytes, &mut out)
            .unwrap_or_else(|error| panic!("read from {next}: {error}"));
        if count == 0 {
            return found;
        }
        let records: Vec<Record<'_>> = proto::frame::iter_records(&out).collect();
        assert_eq!(
            records.len(),
            count,
            "read reported {count} records, returned {}",
            records.len()
        );
        for record in records {
            assert_eq!(record.header.stream, STREAM);
            found.push((record.header.version, record.payload.to_vec()));
        }
        next = found.last().expect("count > 0").0 + 1;
    }
}

/// Asserts that `recovered` is versions 1..=n, dense, each with the payload
/// appended under its version, and that `n >= acknowledged`.
pub(crate) fn assert_prefix(
    recovered: &Recovered,
    payloads: &[Vec<u8>],
    acknowledged: u64,
    context: &str,
) {
    for (index, (version, bytes)) in recovered.iter().enumerate() {
        assert_eq!(
            *version,
            index as u64 + 1,
            "{context}: versions are not dense from 1"
        );
        let expected = payloads
            .get(index)
            .unwrap_or_else(|| panic!("{context}: recovered version {version}, never appended"));
        assert!(
            bytes == expected,
            "{context}: payload of version {version} differs"
        );
    }
    assert!(
        recovered.len() as u64 >= acknowledged,
        "{context}: acknowledged version {acknowledged} lost; recovered only up to {}",
        recovered.len()
    );
}

/// The segment files of the log, by path, with their lengths.
fn segment_files(storage: &FaultStorage) -> Vec<(PathBuf, u64)> {
    storage
        .files()
        .into_iter()
        .filter(|(path, _)| {
            path.parent() == Some(folder())
                && path
                    .file_name()
                    .and_then(|n| n.to_str())
                    .and_then(parse_segment_name)
                    .is_some()
        })
        .collect()
}

/// One record as laid out in a segment file.
#[derive(Clone, Copy, Debug)]
struct Placed {
    version: u64,
    offset: u64,
    length: u64,
}

/// One segment file: its path, base version and records.
#[derive(Clone, Debug)]
struct SegmentLayout {
    path: PathBuf,
    base: u64,
    length: u64,
    records: Vec<Placed>,
}

/// Parses every segment file of an intact log.
fn layout(storage: &FaultStorage) -> Vec<SegmentLayout> {
    segment_files(storage)
        .into_iter()
        .map(|(path, length)| {
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .expect("a segment name");
            let base = parse_segment_name(name).expect("a segment name");
            let bytes = storage.read_file(&path).expect("the file exists");
            assert_eq!(
                bytes[..SEGMENT_HEADER_LEN],
                encode_header(STREAM, base),
                "header of {}",
                path.display()
            );
            let mut records = Vec::new();
            let mut offset = SEGMENT_HEADER_LEN;
            // The log keeps zeros ahead of its last record (preallocation);
            // the records end where they start.
            let mut length = length;
            while offset < bytes.len() {
                if bytes[offset..].iter().all(|&b| b == 0) {
                    length = offset as u64;
                    break;
                }
                let (record, used) = Record::decode(&bytes[offset..]).expect("an intact log");
                records.push(Placed {
                    version: record.header.version,
                    offset: offset as u64,
                    length: used as u64,
                });
                offset += used;
            }
            SegmentLayout {
                path,
                base,
                length,
                records,
            }
        })
        .collect()
}

pub(crate) fn sync_config(segment_bytes_max: u64) -> LogConfig {
    LogConfig {
        segment_bytes_max,
        ..LogConfig::default()
    }
}

/// Writes records 1..=sizes.len() with the given payload sizes into a new
/// log, waits until all are durable and closes the log. Returns the storage
/// and the payloads.
pub(crate) fn durable_log(config: &LogConfig, sizes: &[usize]) -> (FaultStorage, Vec<Vec<u8>>) {
    let storage = FaultStorage::new();
    let (log, seen) = open_ok(&storage, config.clone(), "new log");
    assert!(seen.is_empty());
    let mut payloads = Vec::new();
    for (index, &size) in sizes.iter().enumerate() {
        let version = index as u64 + 1;
        let bytes = payload(version, size);
        append(&log, version, &encode(STREAM, version, &bytes)).expect("append");
        payloads.push(bytes);
    }
    wait_durable(&log, sizes.len() as u64, "durable log");
    assert_eq!(log.metrics().records_synced, sizes.len() as u64);
    drop(log);
    (storage, payloads)
}

/// A crashed copy of a closed log: exactly its durable content.
pub(crate) fn copy_of(storage: &FaultStorage) -> FaultStorage {
    storage.crash(CrashMode::DurableOnly, 0)
}

/// After a recovery that should have kept exactly `payloads`: checks the
/// reopened log's versions, appends the next version, and checks that it is
/// durable, readable, and survives another crash.
fn assert_reopened_log_takes_the_next_version(
    storage: &FaultStorage,
    config: &LogConfig,
    log: Log,
    payloads: &[Vec<u8>],
    context: &str,
) {
    let last = payloads.len() as u64;
    assert_eq!(log.last_version(), last, "{context}: last_version");
    assert_eq!(log.durable_version(), last, "{context}: durable_version");
    let next = last + 1;
    let bytes = payload(next, 61);
    append(&log, next, &encode(STREAM, next, &bytes))
        .unwrap_or_else(|e| panic!("{context}: append {next}: {e}"));
    wait_durable(&log, next, context);
    let mut expected = payloads.to_vec();
    expected.push(bytes);
    let read = read_back(&log, 1, 7, 2000);
    assert_prefix(
        &read,
        &expected,
        next,
        &format!("{context}, read after the new append"),
    );
    assert_eq!(
        read.len() as u64,
        next,
        "{context}: read after the new append"
    );
    drop(log);
    let (log, seen) = open_ok(
        &storage.crash(CrashMode::DurableOnly, 1),
        config.clone(),
        context,
    );
    assert_prefix(
        &seen,
        &expected,
        next,
        &format!("{context}, reopened after the new append"),
    );
    assert_eq!(
        seen.len() as u64,
        next,
        "{context}: reopened after the new append"
    );
    assert_eq!(log.last_version(), next);
}

#[test]
fn a_log_cut_at_any_byte_of_its_last_record_recovers_the_longest_valid_prefix() {
    let config = sync_config(LogConfig::default().segment_bytes_max);
    let mut sizes: Vec<usize> = (1..20).map(|v| v * 53 % 211).collect();
    sizes.push(173);
    let (storage, payloads) = durable_log(&config, &sizes);
    let segments = layout(&storage);
    assert_eq!(segments.len(), 1);
    let segment = &segments[0];
    let last = *segment.records.last().expect("records");
    assert_eq!(last.version, 20);
    assert_eq!(last.offset + last.length, segment.length);
    let kept = &payloads[..19];
    for cut in last.offset..last.offset + last.length {
        let context = format!(
            "cut at byte {cut} (last record at {}..{})",
            last.offset, segment.length
        );
        let image = copy_of(&storage);
        image.truncate_to(&segment.path, cut).unwrap();
        let (log, seen) = open_ok(&image, config.clone(), &context);
        assert_prefix(&seen, kept, 19, &context);
        assert_eq!(
            seen.len(),
            19,
            "{context}: recovered more than the valid prefix"
        );
        assert_eq!(
            segment_files(&image),
            vec![(segment.path.clone(), last.offset)],
            "{context}: the torn tail is not cut back to the end of record 19"
        );
        assert_reopened_log_takes_the_next_version(&image, &config, log, kept, &context);
    }
    // The whole last record is kept when nothing is cut.
    let (log, seen) = open_ok(&copy_of(&storage), config, "uncut");
    assert_prefix(&seen, &payloads, 20, "uncut");
    assert_eq!(seen.len(), 20);
    assert_eq!(log.last_version(), 20);
}

#[test]
fn a_new_log_whose_segment_header_is_cut_at_any_byte_starts_empty_again() {
    let config = sync_config(4096);
    let storage = FaultStorage::new();
    drop(open_ok(&storage, config.clone(), "new log"));
    let path = segment_path(folder(), 1);
    assert_eq!(
        segment_files(&storage),
        vec![(path.clone(), SEGMENT_HEADER_LEN as u64)]
    );
    for cut in 0..SEGMENT_HEADER_LEN as u64 {
        let context = format!("header cut at byte {cut}");
        let image = copy_of(&storage);
        image.truncate_to(&path, cut).unwrap();
        let (log, seen) = open_ok(&image, config.clone(), &context);
        assert!(seen.is_empty(), "{context}");
        assert_eq!(
            image.read_file(&path).as_deref(),
            Some(&encode_header(STREAM, 1)[..]),
            "{context}: the segment is not made anew"
        );
        assert_reopened_log_takes_the_next_version(&image, &config, log, &[], &context);
    }
}

#[test]
fn a_fresh_last_segment_cut_inside_its_header_is_made_anew_and_earlier_segments_kept() {
    let config = sync_config(4096);
    let sizes: Vec<usize> = (1..=30u64).map(|v| 200 + (v * 97 % 300) as usize).collect();
    let (storage, payloads) = durable_log(&config, &sizes);
    let segments = layout(&storage);
    assert!(
        segments.len() >= 3,
        "expected several segments, found {}",
        segments.len()
    );
    let last = segments.last().expect("segments");
    let kept = &payloads[..last.base as usize - 1];
    for cut in 0..=SEGMENT_HEADER_LEN as u64 {
        let context = format!("segment {} cut at byte {cut}", last.base);
        let image = copy_of(&storage);
        image.truncate_to(&last.path, cut).unwrap();
        let (log, seen) = open_ok(&image, config.clone(), &context);
        assert_prefix(&seen, kept, last.base - 1, &context);
        assert_eq!(seen.len() as u64, last.base - 1, "{context}");
        assert_eq!(
            image.read_file(&last.path).as_deref(),
            Some(&encode_header(STREAM, last.base)[..]),
            "{context}: the segment is not made anew"
        );
        assert_reopened_log_takes_the_next_version(&image, &config, log, kept, &context);
    }
}

#[test]
fn crash_images_taken_while_appending_keep_every_acknowledged_record() {
    let config = sync_config(4096);
    let storage = FaultStorage::new();
    let (log, _) = open_ok(&storage, config.clone(), "new log");
    let mut payloads = Vec::new();
    let push = |log: &Log, payloads: &mut Vec<Vec<u8>>| {
        let version = payloads.len() as u64 + 1;
        let bytes = payload(version, 40 + (version as usize * 71) % 400);
        append(log, version, &encode(STREAM, version, &bytes)).expect("append");
        payloads.push(bytes);
    };
    for _ in 0..60 {
        push(&log, &mut payloads);
    }
    wait_durable(&log, 60, "first 60");
    let mut beyond_acknowledged = 0;
    for seed in 0..200u64 {
        // Keep appending without waiting; the I/O thread runs concurrently.
        push(&log, &mut payloads);
        let acknowledged = log.durable_version();
        let mode = if seed % 4 == 3 {
            CrashMode::DurableOnly
        } else {
            CrashMode::TornTail
        };
        let image = storage.crash(mode, seed);
        let context = format!("seed {seed}, {mode:?}, acknowledged {acknowledged}");
        let (reopened, seen) = open_ok(&image, config.clone(), &context);
        assert_prefix(&seen, &payloads, acknowledged, &context);
        assert_eq!(reopened.last_version(), seen.len() as u64, "{context}");
        assert_eq!(reopened.durable_version(), seen.len() as u64, "{context}");
        assert_eq!(
            read_back(&reopened, 1, 1000, 1 << 20),
            seen,
            "{context}: read differs from recovery"
        );
        beyond_acknowledged += usize::from(seen.len() as u64 > acknowledged);
    }
    let last = payloads.len() as u64;
    wait_durable(&log, last, "all");
    for mode in [CrashMode::DurableOnly, CrashMode::TornTail] {
        let (_, seen) = open_ok(&storage.crash(mode, 5), config.clone(), "after all durable");
        assert_prefix(&seen, &payloads, last, "after all durable");
        assert_eq!(seen.len() as u64, last);
    }
    println!("{beyond_acknowledged} of 200 images held records past the acknowledged version");
}

#[test]
fn crash_images_of_unsynced_appends_keep_the_synced_prefix_for_every_seed() {
    // Syncs fail from some point on, so appended records stay written but
    // unsynced: every TornTail image keeps a different prefix of them.
    let config = sync_config(4096);
    let storage = FaultStorage::new();
    let (log, _) = open_ok(&storage, config.clone(), "new log");
    let mut payloads = Vec::new();
    for version in 1..=25u64 {
        let bytes = payload(version, 100 + (version as usize * 37) % 250);
        append(&log, version, &encode(STREAM, version, &bytes)).expect("append");
        payloads.push(bytes);
    }
    wait_durable(&log, 25, "first 25");
    storage.fail_sync_after(0);
    let mut last = 25;
    for version in 26..=40u64 {
        let bytes = payload(version, 100 + (version as usize * 37) % 250);
        match append(&log, version, &encode(STREAM, version, &bytes)) {
            Ok(()) => {
                payloads.push(bytes);
                last = version;
            }
            Err(AppendError::Failed(_)) => break,
            Err(other) => panic!("append {version}: {other}"),
        }
    }
    assert!(
        !durable_or_failed(&log, last),
        "a sync succeeded after fail_sync_after(0)"
    );
    assert_eq!(log.durable_version(), 25);
    let mut recovered_lengths = std::collections::BTreeSet::new();
    for seed in 0..200u64 {
        let mode = if seed % 8 == 7 {
            CrashMode::DurableOnly
        } else {
            CrashMode::TornTail
        };
        let context = format!("seed {seed}, {mode:?}");
        let (reopened, seen) = open_ok(&storage.crash(mode, seed), config.clone(), &context);
        assert_prefix(&seen, &payloads, 25, &context);
        if mode == CrashMode::DurableOnly {
            assert_eq!(
                seen.len(),
                25,
                "{context}: unsynced records survived a DurableOnly crash"
            );
        }
        assert_eq!(reopened.last_version(), seen.len() as u64, "{context}");
        assert_eq!(
            read_back(&reopened, 1, 3, 1 << 20),
            seen,
            "{context}: read differs from recovery"
        );
        recovered_lengths.insert(seen.len());
    }
    assert!(
        recovered_lengths.len() > 1,
        "every image recovered the same length {recovered_lengths:?}; the torn tails were not exercised"
    );
}

/// What recovery of an image with one flipped bit must do.
#[derive(Debug, PartialEq, Eq)]
enum Expect {
    Corrupt {
        path: PathBuf,
        offset: u64,
    },
    /// The last record of the last segment is cut away.
    TornTail {
        kept: u64,
        cut_at: u64,
    },
}

fn expected_after_flip(segments: &[SegmentLayout], path: &Path, bit: u64) -> Expect {
    let position = segments
        .iter()
        .position(|s| s.path == path)
        .expect("a segment");
    let segment = &segments[position];
    let byte = bit / 8;
    if byte < SEGMENT_HEADER_LEN as u64 {
        return Expect::Corrupt {
            path: path.to_path_buf(),
            offset: 0,
        };
    }
    let record = segment
        .records
        .iter()
        .find(|r| r.offset <= byte && byte < r.offset + r.length)
        .expect("every byte after the header is in a record");
    let is_last = position + 1 == segments.len() && record.offset + record.length == segment.length;
    if is_last {
        Expect::TornTail {
            kept: record.version - 1,
            cut_at: record.offset,
        }
    } else {
        Expect::Corrupt {
            path: path.to_path_buf(),
            offset: record.offset,
        }
    }
}

fn check_flip(
    storage: &FaultStorage,
    config: &LogConfig,
    segments: &[SegmentLayout],
    payloads: &[Vec<u8>],
    path: &Path,
    bit: u64,
) {
    let expected = expected_after_flip(segments, path, bit);
    let context = format!(
        "bit {bit} (byte {}) of {} flipped, expecting {expected:?}",
        bit / 8,
        path.display()
    );
    let image = copy_of(storage);
    image.flip_bit(path, bit).unwrap();
    match (open(&image, config.clone()), expected) {
        (
            Err(LogError::Corrupt {
                path: found,
                offset,
                reason,
            }),
            Expect::Corrupt {
                path: want,
                offset: want_offset,
            },
        ) => {
            assert_eq!(
                (found, offset),
                (want, want_offset),
                "{context}: reason {reason}"
            );
        }
        (Ok((log, seen)), Expect::TornTail { kept, cut_at }) => {
            assert_prefix(&seen, &payloads[..kept as usize], kept, &context);
            assert_eq!(seen.len() as u64, kept, "{context}");
            assert_eq!(log.last_version(), kept, "{context}");
            let length = segment_files(&image)
                .into_iter()
                .find(|(p, _)| p == path)
                .map(|(_, l)| l);
            assert_eq!(length, Some(cut_at), "{context}: the torn tail is not cut");
        }
        (Err(error), _) => panic!("{context}: open failed with {error}"),
        (Ok((_, seen)), _) => panic!("{context}: opened with {} records", seen.len()),
    }
}

#[test]
fn a_flipped_bit_anywhere_but_the_last_record_is_refused_naming_the_file_and_record_offset() {
    let config = sync_config(4096);
    let sizes: Vec<usize> = (1..=43u64).map(|v| 150 + (v * 89 % 500) as usize).collect();
    let (storage, payloads) = durable_log(&config, &sizes);
    let segments = layout(&storage);
    assert!(
        segments.len() >= 4,
        "expected several segments, found {}",
        segments.len()
    );
    let last = segments.last().expect("segments");
    assert!(
        last.records.len() >= 3,
        "the last segment needs a middle record"
    );
    let mut checked = 0u64;
    // Every bit of a middle record of a middle segment and of the last
    // segment, and every bit of the last record.
    let middle = &segments[segments.len() / 2];
    let targets = [
        (&middle.path, middle.records[middle.records.len() / 2]),
        (&last.path, last.records[last.records.len() / 2]),
        (&last.path, *last.records.last().expect("records")),
    ];
    for (path, record) in targets {
        for bit in record.offset * 8..(record.offset + record.length) * 8 {
            check_flip(&storage, &config, &segments, &payloads, path, bit);
            checked += 1;
        }
    }
    // Every bit of the header of a non-last segment and of the last one.
    for segment in [&segments[0], middle, last] {
        for bit in 0..SEGMENT_HEADER_LEN as u64 * 8 {
            check_flip(&storage, &config, &segments, &payloads, &segment.path, bit);
            checked += 1;
        }
    }
    // Sampled bits everywhere else, including record headers and
    // boundaries of every segment.
    for segment in &segments {
        let mut bit = 3;
        while bit < segment.length * 8 {
            check_flip(&storage, &config, &segments, &payloads, &segment.path, bit);
            checked += 1;
            bit += 61;
        }
        for record in &segment.records {
            for byte in [
                record.offset,
                record.offset + 4,
                record.offset + 24,
                record.offset + record.length - 1,
            ] {
                check_flip(
                    &storage,
                    &config,
                    &segments,
                    &payloads,
                    &segment.path,
                    byte * 8 + 5,
                );
                checked += 1;
            }
        }
    }
    assert!(checked > 10_000, "only {checked} flips checked");
}

#[test]
fn a_missing_middle_segment_is_refused_as_corrupt() {
    let config = sync_config(4096);
    let sizes: Vec<usize> = (1..=40u64).map(|v| 150 + (v * 89 % 500) as usize).collect();
    let (storage, payloads) = durable_log(&config, &sizes);
    let segments = layout(&storage);
    assert!(
        segments.len() >= 4,
        "expected several segments, found {}",
        segments.len()
    );
    for missing in 1..segments.len() - 1 {
        let image = copy_of(&storage);
        wal::Storage::remove_file(&image, &segments[missing].path).unwrap();
        match open(&image, config.clone()) {
            Err(LogError::Corrupt {
                path,
                offset,
                reason,
            }) => {
                assert_eq!(
                    path,
                    segments[missing + 1].path,
                    "segment {missing} removed: {reason}"
                );
                assert_eq!(offset, 0);
                assert!(reason.contains("missing"), "reason: {reason}");
            }
            Err(other) => panic!("segment {missing} removed: {other}"),
            Ok((_, seen)) => panic!(
                "segment {missing} removed, yet the log opened with {} records",
                seen.len()
            ),
        }
    }
    // The intact log still opens with every record.
    let (_, seen) = open_ok(&copy_of(&storage), config, "intact");
    assert_prefix(&seen, &payloads, 40, "intact");
}

/// How a log that latched failed got there.
struct Failed {
    /// Payloads appended, acknowledged or not.
    payloads: Vec<Vec<u8>>,
    /// The durable version seen before the failed append.
    acknowledged: u64,
    /// The version whose write or sync failed.
    version: u64,
}

/// Appends records one at a time, each waited for, until the log latches
/// failed.
fn append_until_failed(log: &Log, limit: u64, size: impl Fn(u64) -> usize) -> Failed {
    let mut payloads = Vec::new();
    for version in 1..=limit {
        let bytes = payload(version, size(version));
        let acknowledged = log.durable_version();
        match append(log, version, &encode(STREAM, version, &bytes)) {
            Ok(()) => payloads.push(bytes),
            Err(error) => panic!("append {version} refused before any failure was seen: {error}"),
        }
        if !durable_or_failed(log, version) {
            return Failed {
                payloads,
                acknowledged,
                version,
            };
        }
    }
    panic!("the log never failed within {limit} records");
}

/// The checks every latched log must pass: the failure mentions `cause`,
/// the durable version stays at `acknowledged`, later appends fail, and
/// every crash image keeps the acknowledged records.
fn assert_latched_and_recoverable(
    storage: &FaultStorage,
    config: &LogConfig,
    log: Log,
    failed: &Failed,
    cause: &str,
    context: &str,
) {
    let (payloads, acknowledged, failed_version) =
        (&failed.payloads[..], failed.acknowledged, failed.version);
    let failure = log
        .failure()
        .unwrap_or_else(|| panic!("{context}: no failure latched"));
    assert!(
        failure.contains(cause),
        "{context}: failure {failure:?} does not mention {cause:?}"
    );
    assert_eq!(log.progress().borrow().failed.as_deref(), Some(&*failure));
    assert_eq!(acknowledged, failed_version - 1, "{context}");
    assert_eq!(
        log.durable_version(),
        acknowledged,
        "{context}: durable version moved past the failure"
    );
    assert_eq!(
        log.metrics().records_synced,
        acknowledged,
        "{context}: records_synced"
    );
    for attempt in 0..3 {
        let version = failed_version + 1;
        let record = encode(STREAM, version, &payload(version, 10));
        match log.append(version, &record) {
            Err(AppendError::Failed(message)) => assert_eq!(&*message, &*failure, "{context}"),
            other => panic!("{context}: append {attempt} after failure returned {other:?}"),
        }
    }
    std::thread::sleep(Duration::from_millis(5));
    assert_eq!(
        log.durable_version(),
        acknowledged,
        "{context}: durable version moved after failure"
    );
    let mut out = Vec::new();
    assert_eq!(
        log.read(failed_version, 10, 1 << 20, &mut out),
        Ok(0),
        "{context}: read past durable"
    );
    let read = read_back(&log, 1, 5, 4096);
    assert_eq!(
        read.len() as u64,
        acknowledged,
        "{context}: read of the failed log"
    );
    assert_prefix(&read, payloads, acknowledged, context);
    drop(log);
    for seed in 0..12u64 {
        let mode = if seed == 0 {
            CrashMode::DurableOnly
        } else {
            CrashMode::TornTail
        };
        let context = format!("{context}, crash {mode:?} seed {seed}");
        let image = storage.crash(mode, seed);
        let (reopened, seen) = open_ok(&image, config.clone(), &context);
        assert_prefix(&seen, payloads, acknowledged, &context);
        if mode == CrashMode::DurableOnly {
            assert_eq!(
                seen.len() as u64,
                acknowledged,
                "{context}: unacknowledged record survived"
            );
        }
        if seed < 3 {
            let kept = payloads[..seen.len()].to_vec();
            assert_reopened_log_takes_the_next_version(&image, config, reopened, &kept, &context);
        }
    }
}

#[test]
fn a_failed_fsync_latches_the_log_and_keeps_every_acknowledged_record() {
    let config = sync_config(4096);
    for syncs_allowed in [0, 1, 2, 3, 4, 5, 7, 9, 12, 16, 19, 20, 21, 22, 23, 30] {
        let context = format!("fail_sync_after({syncs_allowed})");
        let storage = FaultStorage::new();
        let (log, _) = open_ok(&storage, config.clone(), &context);
        storage.fail_sync_after(syncs_allowed);
        let failed = append_until_failed(&log, 200, |v| 300 + (v as usize * 13) % 200);
        assert_latched_and_recoverable(
            &storage,
            &config,
            log,
            &failed,
            "injected fsync failure",
            &context,
        );
    }
}

#[test]
fn a_failed_fsync_in_a_burst_never_acknowledges_the_records_it_covered() {
    let config = sync_config(4096);
    for syncs_allowed in [0, 1, 3, 6, 10] {
        let context = format!("burst, fail_sync_after({syncs_allowed})");
        let storage = FaultStorage::new();
        let (log, _) = open_ok(&storage, config.clone(), &context);
        storage.fail_sync_after(syncs_allowed);
        let mut payloads = Vec::new();
        let mut highest_seen = 0;
        for version in 1..=300u64 {
            let bytes = payload(version, 100 + (version as usize * 29) % 300);
            match append(&log, version, &encode(STREAM, version, &bytes)) {
                Ok(()) => payloads.push(bytes),
                Err(AppendError::Failed(_)) => break,
                Err(other) => panic!("{context}: append {version}: {other}"),
            }
            let durable = log.durable_version();
            assert!(
                durable >= highest_seen,
                "{context}: durable version went back"
            );
            highest_seen = durable;
        }
        let last = payloads.len() as u64;
        assert!(!durable_or_failed(&log, last.max(1) + 1), "{context}");
        let failure = log.failure().expect("latched");
        assert!(
            failure.contains("injected fsync failure"),
            "{context}: {failure}"
        );
        let acknowledged = log.durable_version();
        assert!(
            acknowledged >= highest_seen && acknowledged < last,
            "{context}: acknowledged {acknowledged} of {last}"
        );
        drop(log);
        for seed in 0..20u64 {
            let mode = if seed == 0 {
                CrashMode::DurableOnly
            } else {
                CrashMode::TornTail
            };
            let context = format!("{context}, crash {mode:?} seed {seed}");
            let (_, seen) = open_ok(&storage.crash(mode, seed), config.clone(), &context);
            // A sync that succeeded before the failed one may have made
            // records durable that were never acknowledged; they may come
            // back, but nothing acknowledged may be lost.
            assert_prefix(&seen, &payloads, acknowledged, &context);
        }
    }
}

#[test]
fn a_full_disk_latches_the_log_with_enospc_and_loses_nothing_acknowledged() {
    let config = sync_config(4096);
    // Limits that run out inside a record, at a segment edge and inside a
    // new segment's header.
    for limit in [100, 2_000, 4_096, 4_110, 4_200, 6_000, 8_192, 8_200, 12_345] {
        let context = format!("space limit {limit}");
        let storage = FaultStorage::new();
        let (log, _) = open_ok(&storage, config.clone(), &context);
        storage.set_space_limit(Some(limit));
        let failed = append_until_failed(&log, 500, |v| 250 + (v as usize * 41) % 300);
        let used: u64 = segment_files(&storage).iter().map(|(_, l)| l).sum();
        assert!(used <= limit, "{context}: {used} bytes in use");
        assert_latched_and_recoverable(
            &storage,
            &config,
            log,
            &failed,
            "No space left on device",
            &context,
        );
    }
}

#[test]
fn a_torn_write_latches_the_log_and_keeps_every_durable_record() {
    let config = sync_config(4096);
    for keep in [0, 1, 7, 8, 79, 80, 81, 200, 10_000] {
        let context = format!("tear_next_write({keep})");
        let storage = FaultStorage::new();
        let (log, _) = open_ok(&storage, config.clone(), &context);
        let mut payloads = Vec::new();
        for version in 1..=12u64 {
            let bytes = payload(version, 250 + version as usize);
            append(&log, version, &encode(STREAM, version, &bytes)).expect("append");
            payloads.push(bytes);
        }
        wait_durable(&log, 12, &context);
        storage.tear_next_write(keep);
        let version = 13;
        let bytes = payload(version, 300);
        append(&log, version, &encode(STREAM, version, &bytes)).expect("append");
        payloads.push(bytes);
        assert!(
            !durable_or_failed(&log, version),
            "{context}: a torn write was acknowledged"
        );
        let failed = Failed {
            payloads,
            acknowledged: 12,
            version: 13,
        };
        assert_latched_and_recoverable(
            &storage,
            &config,
            log,
            &failed,
            "injected torn write",
            &context,
        );
    }
}

fn check_image(
    image: &FaultStorage,
    config: &LogConfig,
    payloads: &[Vec<u8>],
    acknowledged: u64,
    rng: &mut Rng,
    context: &str,
) {
    let (log, seen) = open_ok(image, config.clone(), context);
    assert_prefix(&seen, payloads, acknowledged, context);
    let last = seen.len() as u64;
    assert_eq!(log.last_version(), last, "{context}: last_version");
    assert_eq!(log.durable_version(), last, "{context}: durable_version");
    let max_records = rng.between(1, 50) as usize;
    let max_bytes = rng.between(1, 20_000) as usize;
    let read = read_back(&log, 1, max_records, max_bytes);
    assert!(
        read == seen,
        "{context}: read({max_records}, {max_bytes}) differs from recovery"
    );
    if last > 0 {
        let from = rng.between(1, last);
        let tail = read_back(&log, from, max_records, max_bytes);
        assert!(
            tail[..] == seen[from as usize - 1..],
            "{context}: read from {from} differs"
        );
    }
    let next = last + 1;
    let bytes = payload(next, 33);
    append(&log, next, &encode(STREAM, next, &bytes))
        .unwrap_or_else(|e| panic!("{context}: append after reopen: {e}"));
    wait_durable(&log, next, context);
    let read = read_back(&log, next, 1, 1);
    assert!(
        read == vec![(next, bytes)],
        "{context}: the record appended after reopening is not read back"
    );
}

#[test]
fn property_acknowledged_records_survive_any_crash_in_any_durability_mode() {
    for seed in 0..100u64 {
        let mut rng = Rng::new(seed.wrapping_mul(0xA076_1D64_78BD_642F) ^ 0x5EED);
        let durability = if rng.one_in(2) {
            Durability::Sync
        } else {
            Durability::Paged {
                pages: rng.between(1, 3) as usize,
                page_size: rng.between(4096, 65536) as usize,
            }
        };
        let config = LogConfig {
            durability,
            // Now and then segments large enough for the sparse index to
            // hold several entries (one per 64 KiB).
            segment_bytes_max: if rng.one_in(4) {
                rng.between(200_000, 1_000_000)
            } else {
                rng.between(4096, 40_000)
            },
            page_flush_interval: Duration::from_millis(1),
            ..LogConfig::default()
        };
        let setup = format!(
            "seed {seed}: {durability:?}, segment_bytes_max {}",
            config.segment_bytes_max
        );
        let largest_payload = match durability {
            Durability::Paged { page_size, .. } => page_size - proto::RECORD_HEADER_LEN,
            _ => 12_000,
        }
        .min(12_000) as u64;
        let storage = FaultStorage::new();
        let (log, seen) = open_ok(&storage, config.clone(), &setup);
        assert!(seen.is_empty(), "{setup}");
        let total = rng.between(10, 80);
        let mut payloads: Vec<Vec<u8>> = Vec::new();
        let mut highest_durable = 0;
        for version in 1..=total {
            let size = if rng.one_in(8) {
                rng.between(1000, largest_payload)
            } else {
                rng.between(0, 400)
            } as usize;
            let bytes = payload(version, size);
            append(&log, version, &encode(STREAM, version, &bytes))
                .unwrap_or_else(|e| panic!("{setup}: append {version}: {e}"));
            payloads.push(bytes);
            if rng.one_in(6) {
                wait_durable(&log, version, &setup);
            }
            if rng.one_in(5) {
                let acknowledged = log.durable_version();
                assert!(
                    acknowledged >= highest_durable,
                    "{setup}: durable version went back"
                );
                assert!(
                    acknowledged <= version,
                    "{setup}: durable {acknowledged} past the last append {version}"
                );
                highest_durable = acknowledged;
                let mode = if rng.one_in(2) {
                    CrashMode::TornTail
                } else {
                    CrashMode::DurableOnly
                };
                let crash_seed = rng.next_u64();
                let context = format!("{setup}: crash {mode:?} seed {crash_seed} after version {version}, acknowledged {acknowledged}");
                check_image(
                    &storage.crash(mode, crash_seed),
                    &config,
                    &payloads,
                    acknowledged,
                    &mut rng,
                    &context,
                );
            }
        }
        // A clean shutdown writes everything.
        drop(log);
        let context = format!("{setup}: after shutdown");
        let image = storage.crash(CrashMode::DurableOnly, 0);
        check_image(&image, &config, &payloads, total, &mut rng, &context);
        let (_, seen) = open_ok(&storage.crash(CrashMode::DurableOnly, 0), config, &context);
        assert_eq!(seen.len() as u64, total, "{context}");
    }
}

#[test]
fn a_last_segment_holding_one_record_cut_at_any_byte_recovers_the_earlier_segments() {
    let config = sync_config(4096);
    // 39 records make six segments, the last holding only version 39.
    let sizes: Vec<usize> = (1..=39u64).map(|v| 150 + (v * 89 % 500) as usize).collect();
    let (storage, payloads) = durable_log(&config, &sizes);
    let segments = layout(&storage);
    let last = segments.last().expect("segments");
    assert_eq!(
        last.records.len(),
        1,
        "the last segment should hold one record: {last:?}"
    );
    assert_eq!(last.base, 39);
    let kept = &payloads[..38];
    for cut in SEGMENT_HEADER_LEN as u64..last.length {
        let context = format!("segment {} cut at byte {cut}", last.base);
        let image = copy_of(&storage);
        image.truncate_to(&last.path, cut).unwrap();
        let (log, seen) = open_ok(&image, config.clone(), &context);
        assert_prefix(&seen, kept, 38, &context);
        assert_eq!(seen.len(), 38, "{context}");
        assert_eq!(
            image.read_file(&last.path).as_deref(),
            Some(&encode_header(STREAM, 39)[..]),
            "{context}: the torn record is not cut back to the header"
        );
        assert_reopened_log_takes_the_next_version(&image, &config, log, kept, &context);
    }
}

#[test]
fn a_segment_before_the_last_cut_anywhere_in_its_last_record_is_refused() {
    let config = sync_config(4096);
    let sizes: Vec<usize> = (1..=43u64).map(|v| 150 + (v * 89 % 500) as usize).collect();
    let (storage, _) = durable_log(&config, &sizes);
    let segments = layout(&storage);
    assert!(segments.len() >= 3);
    let (cut_segment, next_segment) =
        (&segments[segments.len() - 2], &segments[segments.len() - 1]);
    let record = *cut_segment.records.last().expect("records");
    for cut in record.offset..record.offset + record.length {
        let context = format!("{} cut at byte {cut}", cut_segment.path.display());
        let image = copy_of(&storage);
        image.truncate_to(&cut_segment.path, cut).unwrap();
        // A cut on the record's edge loses it whole: the next segment then
        // starts past a missing version. A cut inside it is a damaged record.
        let (want_path, want_offset) = if cut == record.offset {
            (next_segment.path.clone(), 0)
        } else {
            (cut_segment.path.clone(), record.offset)
        };
        match open(&image, config.clone()) {
            Err(LogError::Corrupt {
                path,
                offset,
                reason,
            }) => {
                assert_eq!(
                    (path, offset),
                    (want_path, want_offset),
                    "{context}: {reason}"
                );
            }
            Err(other) => panic!("{context}: {other}"),
            Ok((_, seen)) => panic!("{context}: opened with {} records", seen.len()),
        }
    }
}

/// A storage whose `sync_data` calls wait while the gate is closed, so a
/// test can stop the I/O thread between a write and its sync, as a process
/// killed at that moment would be.
#[derive(Clone)]
struct Gated {
    inner: FaultStorage,
    closed: Arc<(std::sync::Mutex<bool>, std::sync::Condvar)>,
}

struct GatedFile {
    inner: Arc<dyn wal::StorageFile>,
    closed: Arc<(std::sync::Mutex<bool>, std::sync::Condvar)>,
}

impl Gated {
    fn set_closed(&self, closed: bool) {
        *self.closed.0.lock().unwrap() = closed;
        self.closed.1.notify_all();
    }
}

impl wal::Storage for Gated {
    fn open(&self, path: &Path, create: bool) -> std::io::Result<Arc<dyn wal::StorageFile>> {
        Ok(Arc::new(GatedFile {
            inner: self.inner.open(path, create)?,
            closed: Arc::clone(&self.closed),
        }))
    }
    fn list(&self, folder: &Path) -> std::io::Result<Vec<String>> {
        self.inner.list(folder)
    }
    fn create_dir_all(&self, folder: &Path) -> std::io::Result<()> {
        self.inner.create_dir_all(folder)
    }
    fn remove_file(&self, path: &Path) -> std::io::Result<()> {
        self.inner.remove_file(path)
    }
    fn remove_dir_all(&self, folder: &Path) -> std::io::Result<()> {
        self.inner.remove_dir_all(folder)
    }
    fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()> {
        self.inner.rename(from, to)
    }
    fn sync_dir(&self, folder: &Path) -> std::io::Result<()> {
        self.inner.sync_dir(folder)
    }
    fn exists(&self, path: &Path) -> bool {
        self.inner.exists(path)
    }
}

impl wal::StorageFile for GatedFile {
    fn read_at(&self, buffer: &mut [u8], offset: u64) -> std::io::Result<usize> {
        self.inner.read_at(buffer, offset)
    }
    fn write_at(&self, bytes: &[u8], offset: u64) -> std::io::Result<()> {
        self.inner.write_at(bytes, offset)
    }
    fn sync_data(&self) -> std::io::Result<()> {
        let (lock, opened) = &*self.closed;
        let mut closed = lock.lock().unwrap();
        while *closed {
            closed = opened.wait(closed).unwrap();
        }
        drop(closed);
        self.inner.sync_data()
    }
    fn len(&self) -> std::io::Result<u64> {
        self.inner.len()
    }
    fn set_len(&self, length: u64) -> std::io::Result<()> {
        self.inner.set_len(length)
    }
}

/// The version of the record written at `offset` of a file, if a whole
/// valid one stands there (the log may keep zeros ahead of its records).
fn record_at(storage: &FaultStorage, path: &Path, offset: u64) -> Option<u64> {
    let bytes = storage.read_file(path)?;
    let (record, _) = Record::decode(bytes.get(offset as usize..)?).ok()?;
    Some(record.header.version)
}

#[test]
fn a_log_restarted_after_a_process_crash_counts_as_durable_only_records_on_disk() {
    // The process dies after the I/O thread wrote record 6 and before it
    // synced it; the page cache still holds it. The restarted log recovers
    // it, and then a power loss must not take away anything the restarted
    // log reports durable.
    let config = sync_config(LogConfig::default().segment_bytes_max);
    let storage = FaultStorage::new();
    let gated = Gated {
        inner: storage.clone(),
        closed: Arc::default(),
    };
    let mut seen = Vec::new();
    let old = Log::open(
        Arc::new(gated.clone()),
        folder(),
        STREAM,
        config.clone(),
        &mut |r| seen.push(r.header.version),
    )
    .unwrap();
    let path = segment_path(folder(), 1);
    let written =
        |records: usize| (SEGMENT_HEADER_LEN + records * (proto::RECORD_HEADER_LEN + 100)) as u64;
    let mut payloads = Vec::new();
    for version in 1..=8u64 {
        if version == 6 {
            wait_durable(&old, 5, "first five");
            gated.set_closed(true);
        }
        let bytes = payload(version, 100);
        append(&old, version, &encode(STREAM, version, &bytes)).unwrap();
        payloads.push(bytes);
        if version == 6 {
            // Record 6 is written and its sync held; 7 and 8 stay pending.
            let deadline = Instant::now() + Duration::from_secs(10);
            while record_at(&storage, &path, written(5)) != Some(6) {
                assert!(Instant::now() < deadline, "record 6 was never written");
                std::thread::sleep(Duration::from_micros(100));
            }
        }
    }
    assert_eq!(
        record_at(&storage, &path, written(6)),
        None,
        "records 7 and 8 wait for the held sync"
    );
    assert_eq!(old.durable_version(), 5);
    // The restarted process opens the same files (no power loss).
    let (restarted, recovered) = open_ok(&storage, config.clone(), "restart");
    let claimed = restarted.durable_version();
    // Then the power fails before anything else is synced.
    let image = storage.crash(CrashMode::DurableOnly, 0);
    drop(restarted);
    gated.set_closed(false);
    drop(old);
    assert_prefix(&recovered, &payloads, 6, "restart");
    assert_eq!(recovered.len(), 6, "restart");
    assert_eq!(claimed, 6, "the restarted log recovered 6 records");
    let (_, after_power_loss) = open_ok(&image, config, "after power loss");
    assert_prefix(
        &after_power_loss,
        &payloads,
        claimed,
        "power loss after the restarted log reported durable version 6",
    );
}

#[test]
fn truncating_a_tail_survives_a_crash_at_every_step_and_finishes_when_run_again() {
    let config = sync_config(4096);
    let sizes = vec![700; 40];
    let (storage, payloads) = durable_log(&config, &sizes);
    let segments = segment_files(&storage).len();
    assert!(segments >= 4, "the log spans several segments: {segments}");
    let cut = 13;
    let mut step = 0;
    loop {
        let image = copy_of(&storage);
        image.fail_sync_after(step);
        let result = wal::truncate_after(&image, folder(), STREAM, cut);
        for mode in [CrashMode::DurableOnly, CrashMode::TornTail] {
            let context = format!("sync step {step}, {mode:?}");
            let crashed = image.crash(mode, step);
            let (log, seen) = open_ok(&crashed, config.clone(), &context);
            let last = log.last_version();
            assert!(
                (cut..=sizes.len() as u64).contains(&last),
                "{context}: the log ends at {last}"
            );
            for (version, bytes) in &seen {
                assert_eq!(bytes, &payloads[*version as usize - 1], "{context}");
            }
            drop(log);
            let dropped = wal::truncate_after(&crashed, folder(), STREAM, cut).unwrap();
            assert_eq!(dropped, last - cut, "{context}");
            let (log, seen) = open_ok(&crashed, config.clone(), &context);
            assert_eq!(log.last_version(), cut, "{context}");
            assert_eq!(seen.len() as u64, cut, "{context}");
        }
        if let Ok(dropped) = result {
            assert_eq!(dropped, sizes.len() as u64 - cut);
            break;
        }
        step += 1;
        assert!(step < 100, "truncation never finished");
    }
    let (log, seen) = open_ok(
        &storage.crash(CrashMode::DurableOnly, 0),
        config,
        "untouched",
    );
    assert_eq!(seen.len(), sizes.len(), "the original is untouched");
    drop(log);
}
