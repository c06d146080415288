//! Checkpoints and retention on `FaultStorage`: recovery from a checkpoint
//! scans only what follows it, damaged checkpoints are skipped, retention
//! deletes only covered segments, and a crash at every step of writing a
//! checkpoint or deleting segments recovers to before or after the step.

use std::cell::RefCell;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use wal::checkpoint::{checkpoint_path, Checkpoint};
use wal::fault::{CrashMode, FaultStorage};
use wal::manifest::manifest_path;
use wal::segment::segment_path;
use wal::{Log, LogConfig, LogError, ReadError, RecoveryReport, Retention, Storage, StorageFile};

use crate::basics::encode;
use crate::crash::{
    append, copy_of, durable_log, folder, payload, read_back, sync_config, wait_durable, STREAM,
};

/// The state an application rebuilds from a log, small enough to check
/// exactly: the last version and a checksum chained over every payload in
/// version order. A checkpoint's blob is its bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Fold {
    last: u64,
    chain: u32,
}

impl Fold {
    fn of(payloads: &[Vec<u8>]) -> Fold {
        let mut fold = Fold::default();
        for (index, bytes) in payloads.iter().enumerate() {
            fold.add(index as u64 + 1, bytes);
        }
        fold
    }

    fn add(&mut self, version: u64, payload: &[u8]) {
        assert_eq!(version, self.last + 1, "records are replayed densely");
        self.last = version;
        self.chain = crc32c::crc32c_append(self.chain, payload);
    }

    fn encode(&self) -> Vec<u8> {
        let mut bytes = self.last.to_le_bytes().to_vec();
        bytes.extend_from_slice(&self.chain.to_le_bytes());
        bytes
    }

    fn decode(bytes: &[u8]) -> Result<Fold, String> {
        if bytes.len() != 12 {
            return Err(format!("{} bytes, not 12", bytes.len()));
        }
        Ok(Fold {
            last: u64::from_le_bytes(bytes[..8].try_into().unwrap()),
            chain: u32::from_le_bytes(bytes[8..].try_into().unwrap()),
        })
    }
}

struct Opened {
    log: Log,
    fold: Fold,
    /// Versions recovery passed to `visit`.
    visited: Vec<u64>,
    report: RecoveryReport,
}

/// Opens the log from its newest usable checkpoint, folding the records
/// after it into the checkpoint's state.
fn open_from_checkpoint(storage: Arc<dyn Storage>, config: LogConfig) -> Result<Opened, LogError> {
    let fold = RefCell::new(Fold::default());
    let mut visited = Vec::new();
    let (log, report) = Log::open_checkpointed(
        storage,
        folder(),
        STREAM,
        config,
        &mut |blob| {
            *fold.borrow_mut() = Fold::decode(blob)?;
            Ok(())
        },
        &mut |record| {
            visited.push(record.header.version);
            fold.borrow_mut().add(record.header.version, record.payload);
        },
    )?;
    Ok(Opened {
        log,
        fold: fold.into_inner(),
        visited,
        report,
    })
}

fn open_from_checkpoint_ok(storage: &FaultStorage, config: LogConfig, context: &str) -> Opened {
    open_from_checkpoint(Arc::new(storage.clone()), config)
        .unwrap_or_else(|error| panic!("{context}: recovery failed: {error}"))
}

/// Writes a checkpoint of the first `through` records into the log.
fn checkpoint(log: &Log, payloads: &[Vec<u8>], through: u64, now_ms: u64) {
    let blob = Fold::of(&payloads[..through as usize]).encode();
    log.checkpoint(through, &blob, now_ms)
        .unwrap_or_else(|error| panic!("checkpoint through {through}: {error}"));
}

/// Asserts that the log holds exactly `first..=payloads.len()` with the
/// right payloads, read through `Log::read`.
fn assert_reads(log: &Log, payloads: &[Vec<u8>], first: u64, context: &str) {
    assert_eq!(log.first_version(), first, "{context}: first version");
    let found = read_back(log, first, 7, 3000);
    let expected: Vec<(u64, Vec<u8>)> = (first..=payloads.len() as u64)
        .map(|v| (v, payloads[v as usize - 1].clone()))
        .collect();
    assert_eq!(found, expected, "{context}: records read back");
}

/// 40 records of 700 bytes in segments of at most 4 KiB: five records a
/// segment, eight segments.
fn forty_records() -> (LogConfig, FaultStorage, Vec<Vec<u8>>) {
    let config = sync_config(4096);
    let (storage, payloads) = durable_log(&config, &[700; 40]);
    (config, storage, payloads)
}

#[test]
fn recovery_from_a_checkpoint_visits_only_the_records_after_it() {
    let (config, storage, payloads) = forty_records();
    for through in [5, 13, 40] {
        let image = copy_of(&storage);
        let opened = open_from_checkpoint_ok(&image, config.clone(), "first open");
        assert_eq!(opened.report.checkpoint, None, "no checkpoint yet");
        assert_eq!(opened.visited.len(), 40);
        checkpoint(&opened.log, &payloads, through, 1000);
        assert_eq!(opened.log.checkpoints(), vec![through]);
        drop(opened);
        let context = format!("checkpoint through {through}");
        let opened = open_from_checkpoint_ok(&image, config.clone(), &context);
        assert_eq!(opened.report.checkpoint, Some(through), "{context}");
        assert!(opened.report.ignored.is_empty(), "{context}");
        let after: Vec<u64> = (through + 1..=40).collect();
        assert_eq!(
            opened.visited, after,
            "{context}: only the records after it"
        );
        assert_eq!(opened.report.records_visited, 40 - through);
        assert_eq!(
            opened.fold,
            Fold::of(&payloads),
            "{context}: the same state"
        );
        assert_reads(&opened.log, &payloads, 1, &context);
        // The log goes on from where it was.
        let next = payload(41, 700);
        append(&opened.log, 41, &encode(STREAM, 41, &next)).unwrap();
        wait_durable(&opened.log, 41, &context);
        let mut longer = payloads.clone();
        longer.push(next);
        assert_reads(&opened.log, &longer, 1, &context);
    }
}

#[test]
fn covered_segments_are_not_scanned_at_open_and_damage_in_them_is_found_when_read() {
    let (config, storage, payloads) = forty_records();
    let opened = open_from_checkpoint_ok(&storage, config.clone(), "first open");
    checkpoint(&opened.log, &payloads, 30, 1000);
    drop(opened);
    // Damage a record payload inside a covered segment: a full scan
    // refuses it, recovery from the checkpoint does not read it, and a
    // read of it says where it is.
    let damaged = copy_of(&storage);
    let at = 32 + 780 + 200;
    damaged
        .flip_bit(&segment_path(folder(), 6), at * 8)
        .unwrap();
    let full = Log::open(
        Arc::new(damaged.clone()),
        folder(),
        STREAM,
        config.clone(),
        &mut |_| {},
    );
    assert!(
        matches!(full, Err(LogError::Corrupt { .. })),
        "a full scan finds it"
    );
    let opened = open_from_checkpoint_ok(&damaged, config.clone(), "from the checkpoint");
    assert_eq!(opened.report.checkpoint, Some(30));
    assert!(opened.report.ignored.is_empty());
    assert_eq!(opened.visited, (31..=40).collect::<Vec<_>>());
    for from in [6, 7, 10] {
        let error = read_error(&opened.log, from);
        assert_damaged(&error, 6, 32 + 780, &format!("read from {from}"));
    }
    // The segments around it read exactly as written.
    let (before, error) = read_until_error(&opened.log, 1);
    assert_eq!(before, expected(&payloads, 1, 5), "segment 1");
    assert_damaged(&error, 6, 32 + 780, "read from 1");
    assert_reads_from(&opened.log, &payloads, 11, "after the damage");
    drop(opened);
    // A covered segment's header is checked when it is read.
    let bad_header = copy_of(&storage);
    bad_header
        .flip_bit(&segment_path(folder(), 11), 20 * 8)
        .unwrap();
    let opened = open_from_checkpoint_ok(&bad_header, config.clone(), "a damaged header");
    assert_eq!(opened.report.checkpoint, Some(30));
    let error = read_error(&opened.log, 12);
    assert_damaged(&error, 11, 0, "a damaged header");
    assert!(error.to_string().contains("checksum"), "{error}");
    assert_reads_from(&opened.log, &payloads, 16, "past the damaged header");
    drop(opened);
    // Another segment's file in a covered one's place.
    let swapped = copy_of(&storage);
    let other = swapped.read_file(&segment_path(folder(), 16)).unwrap();
    write_file(&swapped, &segment_path(folder(), 11), &other);
    let opened = open_from_checkpoint_ok(&swapped, config, "a segment in another's place");
    let error = read_error(&opened.log, 11);
    assert_damaged(&error, 11, 0, "a segment in another's place");
    assert!(error.to_string().contains("base version 16"), "{error}");
}

#[test]
fn a_covered_segment_cut_short_after_the_checkpoint_opens_and_fails_when_read() {
    let (config, storage, payloads) = forty_records();
    let opened = open_from_checkpoint_ok(&storage, config.clone(), "first open");
    checkpoint(&opened.log, &payloads, 30, 1000);
    drop(opened);
    let segment_bytes = 32 + 5 * 780;
    // Cut inside its last record, at a record boundary (a whole record
    // lost, the rest good), inside its header, and to nothing.
    for cut in [segment_bytes - 1, segment_bytes - 780, 32 + 780 + 3, 20, 0] {
        let context = format!("segment 16 cut to {cut} bytes");
        let image = copy_of(&storage);
        image.truncate_to(&segment_path(folder(), 16), cut).unwrap();
        let opened = open_from_checkpoint_ok(&image, config.clone(), &context);
        assert_eq!(opened.report.checkpoint, Some(30), "{context}");
        assert!(opened.report.ignored.is_empty(), "{context}");
        assert_eq!(opened.fold, Fold::of(&payloads), "{context}");
        for from in [16, 18, 20] {
            let error = read_error(&opened.log, from);
            assert_damaged(&error, 16, cut, &context);
            assert!(
                error.to_string().contains(&format!("holds {cut} bytes")),
                "{context}: {error}"
            );
        }
        // A read that runs into it returns what comes before it, then
        // the next read the error.
        let (before, error) = read_until_error(&opened.log, 1);
        assert_eq!(before, expected(&payloads, 1, 15), "{context}");
        assert_damaged(&error, 16, cut, &context);
        assert_reads_from(&opened.log, &payloads, 21, &context);
        // New records still go in after the checkpoint's.
        let next = payload(41, 700);
        append(&opened.log, 41, &encode(STREAM, 41, &next)).unwrap();
        wait_durable(&opened.log, 41, &context);
    }
    // Removed altogether: the open, which goes by the manifest and looks
    // for no covered segment, succeeds, and a read of it says it is
    // missing.
    let image = copy_of(&storage);
    image.remove_file(&segment_path(folder(), 16)).unwrap();
    image.sync_dir(folder()).unwrap();
    let opened = open_from_checkpoint_ok(&image, config.clone(), "segment 16 removed");
    assert_eq!(opened.report.checkpoint, Some(30));
    let error = read_error(&opened.log, 17);
    assert_damaged(&error, 16, 0, "segment 16 removed");
    assert!(error.to_string().contains("missing"), "{error}");
    assert_reads_from(&opened.log, &payloads, 21, "segment 16 removed");
    drop(opened);
    // Without the manifest, the folder listing shows the hole at open,
    // and no checkpoint fits.
    image.remove_file(&manifest_path(folder())).unwrap();
    image.sync_dir(folder()).unwrap();
    assert!(open_from_checkpoint(Arc::new(image), config).is_err());
}

#[test]
fn opening_from_a_checkpoint_opens_no_segment_it_covers_whole() {
    let (config, storage, payloads) = forty_records();
    let opened = open_from_checkpoint_ok(&storage, config.clone(), "first open");
    checkpoint(&opened.log, &payloads, 33, 1000);
    drop(opened);
    let counting = CountingOpens::new(copy_of(&storage));
    let opened = open_from_checkpoint(Arc::new(counting.clone()), config.clone()).unwrap();
    assert_eq!(opened.report.checkpoint, Some(33));
    // Segment 31 holds the checkpoint's version and 36 follows it; 1 to
    // 26 are not touched.
    assert_eq!(
        counting.segments_opened(),
        vec![31, 36],
        "only the checkpoint's last segment and the ones after it"
    );
    // The first read of a covered segment opens it, once.
    assert_reads_from(&opened.log, &payloads, 7, "read from 7");
    assert_reads_from(&opened.log, &payloads, 7, "read again");
    assert_eq!(
        counting.segments_opened(),
        vec![31, 36, 6, 11, 16, 21, 26],
        "each covered segment once"
    );
    // A checkpoint cut inside a segment not read yet checks it first.
    checkpoint(&opened.log, &payloads, 3, 2000);
    assert_eq!(counting.segments_opened().last(), Some(&1));
    assert_eq!(opened.log.checkpoints(), vec![3, 33]);
    drop(opened);
    let image = copy_of(&counting.inner);
    image.flip_bit(&checkpoint_path(folder(), 33), 200).unwrap();
    let opened = open_from_checkpoint_ok(&image, config, "from checkpoint 3");
    assert_eq!(opened.report.checkpoint, Some(3));
    assert_eq!(opened.visited, (4..=40).collect::<Vec<_>>());
    assert_eq!(opened.fold, Fold::of(&payloads));
    assert_reads(&opened.log, &payloads, 1, "from checkpoint 3");
}

#[test]
fn a_checkpoint_inside_a_damaged_covered_segment_is_refused() {
    let (config, storage, payloads) = forty_records();
    let opened = open_from_checkpoint_ok(&storage, config.clone(), "first open");
    checkpoint(&opened.log, &payloads, 30, 1000);
    drop(opened);
    let image = copy_of(&storage);
    image
        .flip_bit(&segment_path(folder(), 6), (32 + 100) * 8)
        .unwrap();
    let opened = open_from_checkpoint_ok(&image, config, "damaged");
    let refused = opened
        .log
        .checkpoint(8, &Fold::of(&payloads[..8]).encode(), 2000);
    match refused {
        Err(LogError::Corrupt { path, offset, .. }) => {
            assert_eq!(path, segment_path(folder(), 6));
            assert_eq!(offset, 32);
        }
        other => panic!("a checkpoint inside a damaged segment: {other:?}"),
    }
    assert_eq!(opened.log.checkpoints(), vec![30]);
}

#[test]
fn retention_deletes_covered_segments_no_one_has_read() {
    let (config, storage, payloads) = forty_records();
    let opened = open_from_checkpoint_ok(&storage, config.clone(), "first open");
    checkpoint(&opened.log, &payloads, 28, 1000);
    checkpoint(&opened.log, &payloads, 34, 1000);
    drop(opened);
    let opened = open_from_checkpoint_ok(&storage, config.clone(), "reopened");
    let retained = opened
        .log
        .retain(Retention { bytes: 1, ms: 0 }, 2000)
        .unwrap();
    assert_eq!(retained.segments_deleted, 5);
    assert_eq!(retained.bytes_deleted, 5 * (32 + 5 * 780));
    assert_eq!(retained.first_version, 26);
    assert_eq!(
        read_error(&opened.log, 25),
        ReadError::Retained {
            requested: 25,
            oldest: 26
        }
    );
    assert_reads(&opened.log, &payloads, 26, "after retention");
    drop(opened);
    let opened = open_from_checkpoint_ok(&storage, config.clone(), "reopened after retention");
    assert_eq!(opened.report.checkpoint, Some(34));
    assert_reads(&opened.log, &payloads, 26, "reopened after retention");
    drop(opened);
    // A covered segment already gone when retention comes to it.
    let (config, storage, payloads) = (config, copy_of(&storage), payloads);
    let opened = open_from_checkpoint_ok(&storage, config.clone(), "again");
    checkpoint(&opened.log, &payloads, 38, 3000);
    checkpoint(&opened.log, &payloads, 39, 3000);
    drop(opened);
    storage.remove_file(&segment_path(folder(), 31)).unwrap();
    storage.sync_dir(folder()).unwrap();
    let opened = open_from_checkpoint_ok(&storage, config, "segment 31 gone");
    let retained = opened
        .log
        .retain(Retention { bytes: 1, ms: 0 }, 4000)
        .unwrap();
    assert_eq!(retained.segments_deleted, 2);
    assert_eq!(retained.first_version, 36);
    assert_reads(&opened.log, &payloads, 36, "segment 31 gone");
}

#[test]
fn a_checkpoint_of_format_1_still_recovers_the_log() {
    let (config, storage, payloads) = forty_records();
    let opened = open_from_checkpoint_ok(&storage, config.clone(), "first open");
    checkpoint(&opened.log, &payloads, 23, 1000);
    drop(opened);
    // Rewrite it as a writer of format 1 did, with a sparse index.
    let path = checkpoint_path(folder(), 23);
    let decoded = Checkpoint::decode(&storage.read_file(&path).unwrap(), STREAM).unwrap();
    let index: Vec<Vec<(u64, u64)>> = decoded
        .segments
        .iter()
        .map(|s| vec![(s.base, 32), (s.base + 2, 32 + 2 * 780)])
        .collect();
    let old = decoded.encode_format_1(&index);
    assert_eq!(old[8..12], 1u32.to_le_bytes());
    write_file(&storage, &path, &old);
    let opened = open_from_checkpoint_ok(&storage, config.clone(), "format 1");
    assert_eq!(opened.report.checkpoint, Some(23));
    assert!(opened.report.ignored.is_empty(), "{:?}", opened.report);
    assert_eq!(opened.visited, (24..=40).collect::<Vec<_>>());
    assert_eq!(opened.fold, Fold::of(&payloads));
    assert_reads(&opened.log, &payloads, 1, "format 1");
    // The next checkpoint is written in format 2.
    checkpoint(&opened.log, &payloads, 40, 2000);
    let newest = storage.read_file(&checkpoint_path(folder(), 40)).unwrap();
    assert_eq!(newest[8..12], 2u32.to_le_bytes());
    drop(opened);
    // A format this crate does not know is skipped, with the reason.
    let mut future = storage.read_file(&checkpoint_path(folder(), 40)).unwrap();
    future[8..12].copy_from_slice(&3u32.to_le_bytes());
    write_file(&storage, &checkpoint_path(folder(), 40), &future);
    let opened = open_from_checkpoint_ok(&storage, config, "an unknown format");
    assert_eq!(opened.report.checkpoint, Some(23));
    assert!(
        opened.report.ignored[0].contains("unsupported checkpoint format version 3"),
        "{:?}",
        opened.report
    );
}

#[test]
fn with_a_manifest_the_open_lists_no_folder_and_without_one_it_lists_it_once() {
    let (config, storage, payloads) = forty_records();
    let opened = open_from_checkpoint_ok(&storage, config.clone(), "first open");
    checkpoint(&opened.log, &payloads, 23, 1000);
    drop(opened);
    let manifest = storage.read_file(&manifest_path(folder())).unwrap();
    let decoded = wal::manifest::Manifest::decode(&manifest, STREAM).unwrap();
    assert_eq!(decoded.newest_segment, 36);
    assert_eq!(decoded.checkpoints, vec![23]);
    let stale = wal::manifest::Manifest {
        newest_segment: 41,
        checkpoints: vec![23],
    };
    let cases: Vec<(&str, Option<Vec<u8>>, u64)> = vec![
        ("the manifest", Some(manifest.clone()), 0),
        ("no manifest", None, 1),
        ("a damaged manifest", Some(manifest[..30].to_vec()), 1),
        ("a manifest naming no file", Some(stale.encode(STREAM)), 1),
    ];
    for (context, bytes, lists) in cases {
        let image = copy_of(&storage);
        image.remove_file(&manifest_path(folder())).unwrap();
        if let Some(bytes) = bytes {
            write_file(&image, &manifest_path(folder()), &bytes);
        }
        image.sync_dir(folder()).unwrap();
        let counting = CountingOpens::new(image);
        let opened = open_from_checkpoint(Arc::new(counting.clone()), config.clone())
            .unwrap_or_else(|error| panic!("{context}: {error}"));
        assert_eq!(counting.lists(), lists, "{context}: folder listings");
        assert_eq!(opened.report.checkpoint, Some(23), "{context}");
        assert!(opened.report.ignored.is_empty(), "{context}");
        assert_eq!(opened.visited, (24..=40).collect::<Vec<_>>(), "{context}");
        assert_eq!(opened.fold, Fold::of(&payloads), "{context}");
        assert_reads(&opened.log, &payloads, 1, context);
    }
    // The next rollover writes the manifest again.
    let image = copy_of(&storage);
    image.remove_file(&manifest_path(folder())).unwrap();
    image.sync_dir(folder()).unwrap();
    let opened = open_from_checkpoint_ok(&image, config.clone(), "no manifest");
    let mut longer = payloads.clone();
    for version in 41..=46 {
        let bytes = payload(version, 700);
        append(&opened.log, version, &encode(STREAM, version, &bytes)).unwrap();
        longer.push(bytes);
    }
    wait_durable(&opened.log, 46, "appended");
    drop(opened);
    let manifest = image.read_file(&manifest_path(folder())).unwrap();
    let decoded = wal::manifest::Manifest::decode(&manifest, STREAM).unwrap();
    assert_eq!(decoded.newest_segment, 46);
    let counting = CountingOpens::new(image);
    let opened = open_from_checkpoint(Arc::new(counting.clone()), config).unwrap();
    assert_eq!(counting.lists(), 0);
    assert_eq!(opened.fold, Fold::of(&longer));
    assert_reads(&opened.log, &longer, 1, "after the rollover");
}

#[test]
fn with_a_manifest_a_hole_after_the_checkpoint_is_still_refused() {
    let (config, storage, payloads) = forty_records();
    let opened = open_from_checkpoint_ok(&storage, config.clone(), "first open");
    checkpoint(&opened.log, &payloads, 13, 1000);
    drop(opened);
    for missing in [16, 21, 26, 31] {
        let image = copy_of(&storage);
        image.remove_file(&segment_path(folder(), missing)).unwrap();
        image.sync_dir(folder()).unwrap();
        match open_from_checkpoint(Arc::new(image), config.clone()) {
            Err(LogError::Corrupt { reason, .. }) => {
                assert!(reason.contains("versions are missing"), "{reason}")
            }
            Err(other) => panic!("segment {missing} missing: {other}"),
            Ok(_) => panic!("segment {missing} missing was accepted"),
        }
    }
}

#[test]
fn a_segment_past_the_manifests_newest_is_refused_not_ignored() {
    let (config, storage, payloads) = forty_records();
    let opened = open_from_checkpoint_ok(&storage, config.clone(), "first open");
    checkpoint(&opened.log, &payloads, 33, 1000);
    drop(opened);
    let old_manifest = storage.read_file(&manifest_path(folder())).unwrap();
    // A server that does not keep the manifest appends past a rollover.
    let opened = open_from_checkpoint_ok(&storage, config.clone(), "second open");
    for version in 41..=43 {
        let bytes = payload(version, 700);
        append(&opened.log, version, &encode(STREAM, version, &bytes)).unwrap();
    }
    wait_durable(&opened.log, 43, "appended");
    drop(opened);
    write_file(&storage, &manifest_path(folder()), &old_manifest);
    match open_from_checkpoint(Arc::new(copy_of(&storage)), config.clone()) {
        Err(LogError::Corrupt { path, reason, .. }) => {
            assert_eq!(path, segment_path(folder(), 41));
            assert!(reason.contains("manifest is stale"), "{reason}");
        }
        Err(other) => panic!("{other}"),
        Ok(_) => panic!("a segment past the manifest's newest was accepted"),
    }
    // Removing the manifest recovers every record.
    storage.remove_file(&manifest_path(folder())).unwrap();
    storage.sync_dir(folder()).unwrap();
    let opened = open_from_checkpoint_ok(&storage, config, "without the manifest");
    assert_eq!(opened.log.last_version(), 43);
}

#[test]
fn a_crash_at_every_step_of_appending_across_rollovers_recovers_from_the_checkpoint() {
    let (config, storage, payloads) = forty_records();
    let opened = open_from_checkpoint_ok(&storage, config.clone(), "first open");
    checkpoint(&opened.log, &payloads, 33, 1000);
    drop(opened);
    let mut all = payloads.clone();
    all.extend((41..=52).map(|v| payload(v, 700)));
    let steps = crash_at_every_step(
        &storage,
        &config,
        &|log| {
            for version in 41..=52 {
                let bytes = &all[version as usize - 1];
                append(log, version, &encode(STREAM, version, bytes))
                    .map_err(|error| LogError::Checkpoint(error.to_string()))?;
                // One record a batch, so each rollover is its own step.
                while log.durable_version() < version {
                    if let Some(failure) = log.failure() {
                        return Err(LogError::Checkpoint(failure.to_string()));
                    }
                    std::thread::sleep(std::time::Duration::from_micros(50));
                }
            }
            Ok(())
        },
        &|image, finished, context| {
            let opened = open_from_checkpoint_ok(image, config.clone(), context);
            assert_eq!(opened.report.checkpoint, Some(33), "{context}");
            let last = opened.log.last_version();
            assert!((40..=52).contains(&last), "{context}: last {last}");
            if finished {
                assert_eq!(last, 52, "{context}");
            }
            assert_eq!(opened.fold, Fold::of(&all[..last as usize]), "{context}");
            assert_reads(&opened.log, &all[..last as usize], 1, context);
        },
    );
    assert!(steps > 12, "appending took {steps} steps");
}

/// The error a read from `from` fails with.
fn read_error(log: &Log, from: u64) -> ReadError {
    let mut out = Vec::new();
    match log.read(from, 100, 1 << 20, &mut out) {
        Err(error) => error,
        Ok(count) => panic!("read from {from} returned {count} records"),
    }
}

/// Asserts that `error` says segment `base` is damaged at byte `offset`.
fn assert_damaged(error: &ReadError, base: u64, offset: u64, context: &str) {
    let ReadError::Corrupt { reason, .. } = error else {
        panic!("{context}: {error:?}");
    };
    let place = format!(
        "{} at byte {offset}",
        segment_path(folder(), base).display()
    );
    assert!(reason.contains(&place), "{context}: {reason}");
}

/// Versions `from..=to` with their payloads.
fn expected(payloads: &[Vec<u8>], from: u64, to: u64) -> Vec<(u64, Vec<u8>)> {
    (from..=to)
        .map(|v| (v, payloads[v as usize - 1].clone()))
        .collect()
}

/// Asserts that the log reads exactly `from..=payloads.len()`.
fn assert_reads_from(log: &Log, payloads: &[Vec<u8>], from: u64, context: &str) {
    let expected = expected(payloads, from, payloads.len() as u64);
    assert_eq!(read_back(log, from, 7, 3000), expected, "{context}");
}

/// Reads from `from` on, a few records at a time, until a read fails;
/// returns what was read before and the error.
fn read_until_error(log: &Log, from: u64) -> (Vec<(u64, Vec<u8>)>, ReadError) {
    let mut found = Vec::new();
    let mut next = from;
    loop {
        let mut out = Vec::new();
        match log.read(next, 3, 1 << 20, &mut out) {
            Ok(0) => panic!("read up to {next} without an error"),
            Ok(_) => {
                for record in proto::frame::iter_records(&out) {
                    assert_eq!(record.header.version, next);
                    found.push((next, record.payload.to_vec()));
                    next += 1;
                }
            }
            Err(error) => return (found, error),
        }
    }
}

/// Replaces a file's content, durably.
fn write_file(storage: &FaultStorage, path: &Path, bytes: &[u8]) {
    let file = storage.open(path, true).unwrap();
    file.set_len(0).unwrap();
    file.write_at(bytes, 0).unwrap();
    file.sync_data().unwrap();
}

/// A `Storage` that notes the base of every segment file opened.
#[derive(Clone)]
struct CountingOpens {
    inner: FaultStorage,
    opened: Arc<std::sync::Mutex<Vec<u64>>>,
    lists: Arc<AtomicU64>,
}

impl CountingOpens {
    fn new(inner: FaultStorage) -> CountingOpens {
        CountingOpens {
            inner,
            opened: Arc::default(),
            lists: Arc::default(),
        }
    }

    fn lists(&self) -> u64 {
        self.lists.load(Ordering::SeqCst)
    }

    fn segments_opened(&self) -> Vec<u64> {
        self.opened.lock().unwrap().clone()
    }
}

impl Storage for CountingOpens {
    fn open(&self, path: &Path, create: bool) -> io::Result<Arc<dyn StorageFile>> {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if let Some(base) = wal::segment::parse_segment_name(name) {
            self.opened.lock().unwrap().push(base);
        }
        self.inner.open(path, create)
    }
    fn list(&self, folder: &Path) -> io::Result<Vec<String>> {
        self.lists.fetch_add(1, Ordering::SeqCst);
        self.inner.list(folder)
    }
    fn create_dir_all(&self, folder: &Path) -> io::Result<()> {
        self.inner.create_dir_all(folder)
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        self.inner.remove_file(path)
    }
    fn remove_dir_all(&self, folder: &Path) -> io::Result<()> {
        self.inner.remove_dir_all(folder)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.inner.rename(from, to)
    }
    fn sync_dir(&self, folder: &Path) -> io::Result<()> {
        self.inner.sync_dir(folder)
    }
    fn exists(&self, path: &Path) -> bool {
        self.inner.exists(path)
    }
}

#[test]
fn a_damaged_newest_checkpoint_falls_back_to_the_one_before_it() {
    let (config, storage, payloads) = forty_records();
    let opened = open_from_checkpoint_ok(&storage, config.clone(), "first open");
    checkpoint(&opened.log, &payloads, 12, 1000);
    checkpoint(&opened.log, &payloads, 31, 2000);
    checkpoint(&opened.log, &payloads, 37, 3000);
    assert_eq!(
        opened.log.checkpoints(),
        vec![37, 31],
        "the newest two are kept"
    );
    drop(opened);
    assert!(!storage.exists(&checkpoint_path(folder(), 12)));
    let newest = checkpoint_path(folder(), 37);
    let length = storage.read_file(&newest).unwrap().len() as u64;
    let mut cases: Vec<(String, FaultStorage)> = Vec::new();
    for bit in (0..length * 8).step_by(13) {
        let image = copy_of(&storage);
        image.flip_bit(&newest, bit).unwrap();
        cases.push((format!("bit {bit} flipped"), image));
    }
    for cut in (0..length).step_by(7) {
        let image = copy_of(&storage);
        image.truncate_to(&newest, cut).unwrap();
        cases.push((format!("cut at {cut}"), image));
    }
    for (context, image) in cases {
        let opened = open_from_checkpoint_ok(&image, config.clone(), &context);
        assert_eq!(opened.report.checkpoint, Some(31), "{context}");
        assert_eq!(
            opened.report.ignored.len(),
            1,
            "{context}: {:?}",
            opened.report
        );
        assert!(opened.report.ignored[0].contains("checkpoint-00000000000000000037"));
        assert_eq!(opened.fold, Fold::of(&payloads), "{context}");
        assert_eq!(opened.visited, (32..=40).collect::<Vec<_>>(), "{context}");
    }
    // Both damaged: every segment is scanned.
    let image = copy_of(&storage);
    image.flip_bit(&newest, 200).unwrap();
    image.flip_bit(&checkpoint_path(folder(), 31), 200).unwrap();
    let opened = open_from_checkpoint_ok(&image, config, "both damaged");
    assert_eq!(opened.report.checkpoint, None);
    assert_eq!(opened.report.ignored.len(), 2);
    assert_eq!(opened.visited.len(), 40);
    assert_eq!(opened.fold, Fold::of(&payloads));
}

#[test]
fn a_log_shorter_than_its_checkpoint_claims_falls_back_and_says_so() {
    let (config, storage, payloads) = forty_records();
    let opened = open_from_checkpoint_ok(&storage, config.clone(), "first open");
    checkpoint(&opened.log, &payloads, 20, 1000);
    checkpoint(&opened.log, &payloads, 40, 2000);
    drop(opened);
    // The last segment (36..=40) lost its last two records.
    let image = copy_of(&storage);
    let last = segment_path(folder(), 36);
    let length = image.read_file(&last).unwrap().len() as u64;
    image.truncate_to(&last, length - 2 * 780 + 5).unwrap();
    let opened = open_from_checkpoint_ok(&image, config.clone(), "shortened");
    assert_eq!(opened.report.checkpoint, Some(20));
    assert!(
        opened.report.ignored[0].contains("shorter than the checkpoint claims"),
        "{:?}",
        opened.report.ignored
    );
    assert_eq!(opened.log.last_version(), 38);
    assert_eq!(opened.fold, Fold::of(&payloads[..38]));
    assert_eq!(
        opened.log.checkpoints(),
        vec![20],
        "the one past the log is not kept"
    );
    drop(opened);
    // A middle segment lost: from the manifest, the covered segment is
    // not looked for, and its read fails.
    let image = copy_of(&storage);
    image.remove_file(&segment_path(folder(), 16)).unwrap();
    image.sync_dir(folder()).unwrap();
    let opened = open_from_checkpoint_ok(&image, config.clone(), "segment 16 lost");
    assert_eq!(opened.report.checkpoint, Some(40));
    assert!(matches!(
        read_error(&opened.log, 16),
        ReadError::Corrupt { .. }
    ));
    drop(opened);
    // Without the manifest the folder is listed: neither checkpoint fits,
    // and a full scan refuses the hole.
    image.remove_file(&manifest_path(folder())).unwrap();
    image.sync_dir(folder()).unwrap();
    match open_from_checkpoint(Arc::new(image), config) {
        Err(LogError::Corrupt { reason, .. }) => {
            assert!(reason.contains("versions are missing"), "{reason}");
            assert!(reason.contains("no usable checkpoint"), "{reason}");
        }
        Err(other) => panic!("a missing segment: {other}"),
        Ok(_) => panic!("a missing segment was accepted"),
    }
}

#[test]
fn retention_deletes_only_covered_segments_oldest_first_and_names_the_oldest_left() {
    let (config, storage, payloads) = forty_records();
    let opened = open_from_checkpoint_ok(&storage, config.clone(), "first open");
    let log = opened.log;
    let keep_little = Retention { bytes: 1, ms: 0 };
    // No checkpoint: nothing is covered, nothing goes.
    let retained = log.retain(keep_little, 5000).unwrap();
    assert_eq!(retained.segments_deleted, 0);
    assert_eq!(log.first_version(), 1);
    checkpoint(&log, &payloads, 21, 1000);
    assert_eq!(
        log.retain(keep_little, 5000).unwrap().segments_deleted,
        0,
        "one checkpoint is not enough"
    );
    checkpoint(&log, &payloads, 23, 1000);
    // Segments 1..=20 are covered by both; 21..=25 is not.
    let retained = log.retain(keep_little, 5000).unwrap();
    assert_eq!(retained.segments_deleted, 4);
    assert_eq!(retained.first_version, 21);
    assert_reads(&log, &payloads, 21, "after retention");
    let mut out = Vec::new();
    assert_eq!(
        log.read(20, 10, 1 << 20, &mut out),
        Err(ReadError::Retained {
            requested: 20,
            oldest: 21
        })
    );
    // A newer checkpoint alone does not let more go: the older one must
    // still be able to recover the log.
    checkpoint(&log, &payloads, 40, 2000);
    assert_eq!(log.retain(keep_little, 5000).unwrap().segments_deleted, 0);
    checkpoint(&log, &payloads, 40, 2000);
    checkpoint(&log, &payloads, 39, 2000);
    assert_eq!(log.checkpoints(), vec![39, 40]);
    let retained = log.retain(keep_little, 5000).unwrap();
    assert_eq!(retained.first_version, 36, "the last segment always stays");
    drop(log);
    let opened = open_from_checkpoint_ok(&storage, config.clone(), "reopened");
    assert_eq!(opened.fold, Fold::of(&payloads));
    assert_reads(&opened.log, &payloads, 36, "reopened");
    drop(opened);
    // Without a checkpoint the retained log cannot be replayed.
    let full = Log::open(
        Arc::new(storage.clone()),
        folder(),
        STREAM,
        config,
        &mut |_| {},
    );
    assert!(matches!(full, Err(LogError::Corrupt { .. })));
}

#[test]
fn retention_by_bytes_keeps_at_least_the_limit_and_by_age_counts_from_when_a_segment_closed() {
    let (config, storage, payloads) = forty_records();
    let segment_bytes = 32 + 5 * (80 + 700) as u64;
    let opened = open_from_checkpoint_ok(&storage, config.clone(), "first open");
    let log = opened.log;
    checkpoint(&log, &payloads, 39, 10_000);
    checkpoint(&log, &payloads, 40, 10_000);
    // Keep at least three segments' worth.
    let by_bytes = Retention {
        bytes: 3 * segment_bytes,
        ms: 0,
    };
    let retained = log.retain(by_bytes, 10_000).unwrap();
    assert_eq!(retained.segments_deleted, 5);
    assert_eq!(retained.bytes_deleted, 5 * segment_bytes);
    assert_eq!(log.first_version(), 26);
    drop(log);
    let (config, storage, payloads) = forty_records();
    let log = open_from_checkpoint_ok(&storage, config, "second log").log;
    // Segments seen closed by the checkpoint at 10 s age from then.
    checkpoint(&log, &payloads, 39, 10_000);
    checkpoint(&log, &payloads, 40, 10_000);
    let by_age = Retention {
        bytes: 0,
        ms: 60_000,
    };
    assert_eq!(log.retain(by_age, 69_999).unwrap().segments_deleted, 0);
    let retained = log.retain(by_age, 70_000).unwrap();
    assert_eq!(retained.segments_deleted, 7, "all but the last segment");
    assert!(Retention::default().keeps_everything());
}

/// A `Storage` over a `FaultStorage` whose mutating operations (creating,
/// writing, cutting, syncing, renaming and removing) fail once a budget
/// is spent, as if the power went at that step; reads go on.
#[derive(Clone)]
struct Steps {
    inner: FaultStorage,
    left: Arc<AtomicU64>,
}

impl Steps {
    fn new(inner: FaultStorage) -> Steps {
        Steps {
            inner,
            left: Arc::new(AtomicU64::new(u64::MAX)),
        }
    }

    fn stop_after(&self, steps: u64) {
        self.left.store(steps, Ordering::SeqCst);
    }

    fn step(&self) -> io::Result<()> {
        let taken = self
            .left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                left.checked_sub(1)
            });
        taken
            .map(|_| ())
            .map_err(|_| io::Error::other("power lost"))
    }
}

struct StepFile {
    inner: Arc<dyn StorageFile>,
    steps: Steps,
}

impl StorageFile for StepFile {
    fn read_at(&self, buffer: &mut [u8], offset: u64) -> io::Result<usize> {
        self.inner.read_at(buffer, offset)
    }
    fn write_at(&self, bytes: &[u8], offset: u64) -> io::Result<()> {
        self.steps.step()?;
        self.inner.write_at(bytes, offset)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.steps.step()?;
        self.inner.sync_data()
    }
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
    fn set_len(&self, length: u64) -> io::Result<()> {
        self.steps.step()?;
        self.inner.set_len(length)
    }
}

impl Storage for Steps {
    fn open(&self, path: &Path, create: bool) -> io::Result<Arc<dyn StorageFile>> {
        if create && !self.inner.exists(path) {
            self.step()?;
        }
        let inner = self.inner.open(path, create)?;
        Ok(Arc::new(StepFile {
            inner,
            steps: self.clone(),
        }))
    }
    fn list(&self, folder: &Path) -> io::Result<Vec<String>> {
        self.inner.list(folder)
    }
    fn create_dir_all(&self, folder: &Path) -> io::Result<()> {
        if !self.inner.exists(folder) {
            self.step()?;
        }
        self.inner.create_dir_all(folder)
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        self.step()?;
        self.inner.remove_file(path)
    }
    fn remove_dir_all(&self, folder: &Path) -> io::Result<()> {
        self.step()?;
        self.inner.remove_dir_all(folder)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.step()?;
        self.inner.rename(from, to)
    }
    fn sync_dir(&self, folder: &Path) -> io::Result<()> {
        self.step()?;
        self.inner.sync_dir(folder)
    }
    fn exists(&self, path: &Path) -> bool {
        self.inner.exists(path)
    }
}

/// Runs `operation` on a log over `storage` stopped after every number of
/// steps in turn, crashes, and checks each image with `check` (given the
/// image and whether the operation had finished); returns how many steps
/// the operation takes.
fn crash_at_every_step(
    storage: &FaultStorage,
    config: &LogConfig,
    operation: &dyn Fn(&Log) -> Result<(), LogError>,
    check: &dyn Fn(&FaultStorage, bool, &str),
) -> u64 {
    for budget in 0..200 {
        let image = copy_of(storage);
        let steps = Steps::new(image.clone());
        let opened = open_from_checkpoint(Arc::new(steps.clone()), config.clone())
            .expect("the log opens before the crash");
        steps.stop_after(budget);
        let finished = operation(&opened.log).is_ok();
        for (mode, seed) in [(CrashMode::DurableOnly, 0), (CrashMode::TornTail, budget)] {
            let crashed = image.crash(mode, seed);
            check(
                &crashed,
                finished,
                &format!("crash after {budget} steps, {mode:?}"),
            );
        }
        // Dropping the log only touches its tail, which the budget stops.
        drop(opened);
        if finished {
            return budget;
        }
    }
    panic!("the operation never finished within 200 steps");
}

#[test]
fn a_crash_at_every_step_of_writing_a_checkpoint_recovers_to_before_or_after_it() {
    let (config, storage, payloads) = forty_records();
    let opened = open_from_checkpoint_ok(&storage, config.clone(), "first open");
    checkpoint(&opened.log, &payloads, 9, 1000);
    checkpoint(&opened.log, &payloads, 17, 1000);
    drop(opened);
    let steps = crash_at_every_step(
        &storage,
        &config,
        &|log| {
            let blob = Fold::of(&payloads[..33]).encode();
            log.checkpoint(33, &blob, 2000).map(|_| ())
        },
        &|image, finished, context| {
            let opened = open_from_checkpoint_ok(image, config.clone(), context);
            let used = opened.report.checkpoint;
            assert!(
                used == Some(17) || used == Some(33),
                "{context}: recovered from {used:?}"
            );
            if finished {
                assert_eq!(used, Some(33), "{context}: a finished checkpoint is used");
            }
            assert!(
                opened.report.ignored.is_empty(),
                "{context}: {:?}",
                opened.report
            );
            assert_eq!(opened.fold, Fold::of(&payloads), "{context}");
            assert_reads(&opened.log, &payloads, 1, context);
            let kept = opened.log.checkpoints();
            assert!(kept.len() <= 3 && kept.contains(&17), "{context}: {kept:?}");
        },
    );
    // Temporary file: create, write, sync; rename; folder sync; then the
    // removal of checkpoint 9 and a folder sync.
    assert!(steps >= 6, "writing a checkpoint took {steps} steps");
}

#[test]
fn a_crash_at_every_step_of_retention_recovers_a_dense_log_from_a_segment_base() {
    let (config, storage, payloads) = forty_records();
    let opened = open_from_checkpoint_ok(&storage, config.clone(), "first open");
    checkpoint(&opened.log, &payloads, 28, 1000);
    checkpoint(&opened.log, &payloads, 34, 1000);
    drop(opened);
    let steps = crash_at_every_step(
        &storage,
        &config,
        &|log| {
            let retained = log.retain(Retention { bytes: 1, ms: 0 }, 2000)?;
            assert_eq!(retained.first_version, 26);
            Ok(())
        },
        &|image, finished, context| {
            let opened = open_from_checkpoint_ok(image, config.clone(), context);
            assert_eq!(opened.report.checkpoint, Some(34), "{context}");
            assert_eq!(opened.fold, Fold::of(&payloads), "{context}");
            let first = opened.log.first_version();
            assert!(
                [1, 6, 11, 16, 21, 26].contains(&first),
                "{context}: the log starts at {first}"
            );
            if finished {
                assert_eq!(first, 26, "{context}");
            }
            assert_reads(&opened.log, &payloads, first, context);
        },
    );
    // Five segments, each a removal and a folder sync.
    assert_eq!(steps, 10);
}

#[test]
fn truncating_a_tail_removes_the_checkpoints_past_the_cut() {
    let (config, storage, payloads) = forty_records();
    let opened = open_from_checkpoint_ok(&storage, config.clone(), "first open");
    checkpoint(&opened.log, &payloads, 12, 1000);
    checkpoint(&opened.log, &payloads, 30, 1000);
    opened
        .log
        .retain(Retention { bytes: 1, ms: 0 }, 2000)
        .unwrap();
    assert_eq!(opened.log.first_version(), 11);
    drop(opened);
    let cut = copy_of(&storage);
    assert_eq!(wal::truncate_after(&cut, folder(), STREAM, 20).unwrap(), 20);
    assert!(!cut.exists(&checkpoint_path(folder(), 30)));
    let opened = open_from_checkpoint_ok(&cut, config.clone(), "cut at 20");
    assert_eq!(opened.report.checkpoint, Some(12));
    assert_eq!(opened.fold, Fold::of(&payloads[..20]));
    assert_reads(&opened.log, &payloads[..20], 11, "cut at 20");
    drop(opened);
    // Below the retained start there is nothing to cut back to.
    let refused = wal::truncate_after(&copy_of(&storage), folder(), STREAM, 5);
    assert!(
        matches!(refused, Err(LogError::Corrupt { .. })),
        "{refused:?}"
    );
    // An inspection reads what retention left.
    let mut versions = Vec::new();
    let last = wal::inspect(&storage, folder(), STREAM, &mut |r| {
        versions.push(r.header.version)
    })
    .unwrap();
    assert_eq!(last, 40);
    assert_eq!(versions, (11..=40).collect::<Vec<_>>());
}

#[test]
fn a_checkpoint_of_a_version_not_yet_durable_is_refused() {
    let (config, storage, payloads) = forty_records();
    let opened = open_from_checkpoint_ok(&storage, config, "first open");
    let refused = opened.log.checkpoint(41, &[], 0);
    assert!(
        matches!(refused, Err(LogError::Checkpoint(_))),
        "{refused:?}"
    );
    let refused = opened.log.checkpoint(0, &[], 0);
    assert!(
        matches!(refused, Err(LogError::Checkpoint(_))),
        "{refused:?}"
    );
    checkpoint(&opened.log, &payloads, 40, 0);
    let bytes = storage.read_file(&checkpoint_path(folder(), 40)).unwrap();
    let decoded = Checkpoint::decode(&bytes, STREAM).unwrap();
    assert_eq!(decoded.through, 40);
    assert_eq!(decoded.segments.len(), 8);
    assert_eq!(decoded.segments[7].last_version, 40);
    assert_eq!(decoded.blob, Fold::of(&payloads).encode());
}

#[test]
fn checkpoints_and_retention_while_appending_keep_every_record_readable_across_restarts() {
    let storage: Arc<dyn Storage> = Arc::new(FaultStorage::new());
    let config = sync_config(4096);
    let mut payloads: Vec<Vec<u8>> = Vec::new();
    for round in 0..3 {
        let context = format!("round {round}");
        let opened = open_from_checkpoint(storage.clone(), config.clone())
            .unwrap_or_else(|error| panic!("{context}: {error}"));
        assert_eq!(opened.fold, Fold::of(&payloads), "{context}");
        let log = Arc::new(opened.log);
        let first = payloads.len() as u64 + 1;
        let count = 300;
        let new: Vec<Vec<u8>> = (first..first + count)
            .map(|v| payload(v, 100 + (v as usize * 37) % 900))
            .collect();
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let checkpointer = {
            let log = Arc::clone(&log);
            let done = Arc::clone(&done);
            let mut all = payloads.clone();
            all.extend(new.iter().cloned());
            std::thread::spawn(move || {
                let mut written = 0;
                while !done.load(Ordering::SeqCst) {
                    let through = log.durable_version();
                    if through > 0 {
                        let blob = Fold::of(&all[..through as usize]).encode();
                        log.checkpoint(through, &blob, 1000).unwrap();
                        log.retain(Retention { bytes: 1, ms: 0 }, 1000).unwrap();
                        written += 1;
                    }
                    std::thread::sleep(std::time::Duration::from_micros(300));
                }
                written
            })
        };
        for (index, bytes) in new.iter().enumerate() {
            let version = first + index as u64;
            append(&log, version, &encode(STREAM, version, bytes)).unwrap();
            if version.is_multiple_of(25) {
                // Room for the checkpointer, which mostly finds records
                // appended past the durable version (a checkpoint that
                // cuts its last segment short).
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
        wait_durable(&log, first + count - 1, &context);
        done.store(true, Ordering::SeqCst);
        assert!(
            checkpointer.join().unwrap() > 0,
            "{context}: checkpoints written"
        );
        payloads.extend(new);
        let oldest = log.first_version();
        assert!(oldest > 1, "{context}: retention deleted something");
        assert_reads(&log, &payloads, oldest, &context);
        let log = Arc::into_inner(log).expect("the only handle");
        drop(log);
    }
}

/// The 60 payloads of which the log of `forty_records` holds the first 40:
/// a reset brings in the state of all 60.
fn sixty_payloads(payloads: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let mut all = payloads.to_vec();
    all.extend((41..=60).map(|version| payload(version, 700)));
    all
}

/// Checks a log that a reset to 60 left: no record, the transferred
/// state, reads before 61 refused naming 61, and appends going on at 61
/// (they survive a restart).
fn assert_reset_log(image: &FaultStorage, config: &LogConfig, all: &[Vec<u8>], context: &str) {
    let opened = open_from_checkpoint_ok(image, config.clone(), context);
    assert_eq!(opened.report.checkpoint, Some(60), "{context}");
    assert!(opened.visited.is_empty(), "{context}: {:?}", opened.visited);
    assert_eq!(opened.fold, Fold::of(all), "{context}");
    assert_eq!(opened.log.first_version(), 61, "{context}");
    assert_eq!(opened.log.last_version(), 60, "{context}");
    assert_eq!(opened.log.durable_version(), 60, "{context}");
    let mut out = Vec::new();
    assert_eq!(
        opened.log.read(20, 10, 1 << 20, &mut out),
        Err(ReadError::Retained {
            requested: 20,
            oldest: 61
        }),
        "{context}"
    );
    assert!(
        !image.exists(&folder().join(wal::RESET_MARKER)),
        "{context}"
    );
    let next = payload(61, 700);
    append(&opened.log, 61, &encode(STREAM, 61, &next)).expect("append after a reset");
    wait_durable(&opened.log, 61, context);
    drop(opened);
    let reopened = open_from_checkpoint_ok(&copy_of(image), config.clone(), context);
    assert_eq!(reopened.visited, vec![61], "{context}");
    let mut with_next = all.to_vec();
    with_next.push(next);
    assert_eq!(reopened.fold, Fold::of(&with_next), "{context}");
}

#[test]
fn a_crash_at_every_step_of_a_reset_leaves_the_old_log_or_the_new_one() {
    let (config, storage, payloads) = forty_records();
    let opened = open_from_checkpoint_ok(&storage, config.clone(), "first open");
    checkpoint(&opened.log, &payloads, 9, 1000);
    checkpoint(&opened.log, &payloads, 17, 1000);
    drop(opened);
    let all = sixty_payloads(&payloads);
    let new_seen = AtomicU64::new(0);
    let steps = crash_at_every_step(
        &storage,
        &config,
        &|log| log.reset(60, &Fold::of(&all).encode(), 3000),
        &|image, finished, context| {
            // An inspection (what a checker does) never fails either.
            let mut inspected = Vec::new();
            let last = wal::inspect(image, folder(), STREAM, &mut |r| {
                inspected.push(r.header.version)
            })
            .unwrap_or_else(|error| panic!("{context}: inspect: {error}"));
            let opened = open_from_checkpoint_ok(image, config.clone(), context);
            if opened.report.checkpoint == Some(60) {
                assert_eq!(last, 60, "{context}: inspected");
                assert!(inspected.is_empty(), "{context}: inspected {inspected:?}");
                drop(opened);
                new_seen.fetch_add(1, Ordering::Relaxed);
                assert_reset_log(image, &config, &all, context);
                return;
            }
            assert!(!finished, "{context}: a finished reset is kept");
            assert_eq!(last, 40, "{context}: inspected");
            assert_eq!(opened.report.checkpoint, Some(17), "{context}");
            assert_eq!(opened.fold, Fold::of(&payloads), "{context}");
            assert_reads(&opened.log, &payloads, 1, context);
        },
    );
    // The marker (create, write, sync, rename, folder sync), then eight
    // segments and two checkpoints removed, a folder sync, the new
    // segment, the checkpoint and the marker's removal.
    assert!(steps >= 20, "a reset took {steps} steps");
    assert!(new_seen.load(Ordering::Relaxed) >= 2);
}

#[test]
fn a_reset_of_an_open_log_goes_on_at_the_next_version_and_refuses_to_go_back() {
    let (config, storage, payloads) = forty_records();
    let opened = open_from_checkpoint_ok(&storage, config.clone(), "first open");
    let all = sixty_payloads(&payloads);
    let refused = opened.log.reset(40, &[], 0);
    assert!(
        matches!(refused, Err(LogError::Checkpoint(_))),
        "{refused:?}"
    );
    let progress = opened.log.progress();
    opened
        .log
        .reset(60, &Fold::of(&all).encode(), 3000)
        .expect("reset");
    assert_eq!(progress.borrow().durable, 60);
    assert_eq!(opened.log.checkpoints(), vec![60]);
    assert_eq!(
        opened.log.newest_checkpoint(),
        Some((60, Fold::of(&all).encode()))
    );
    for version in 61..=75 {
        append(
            &opened.log,
            version,
            &encode(STREAM, version, &payload(version, 700)),
        )
        .expect("append");
    }
    wait_durable(&opened.log, 75, "after the reset");
    let mut more = all.clone();
    more.extend((61..=75).map(|version| payload(version, 700)));
    // Checkpoints and retention go on as in any log.
    checkpoint(&opened.log, &more, 70, 4000);
    checkpoint(&opened.log, &more, 75, 4000);
    opened
        .log
        .retain(Retention { bytes: 1, ms: 0 }, 5000)
        .unwrap();
    let first = opened.log.first_version();
    assert!(first > 61, "the log starts at {first}");
    let expected: Vec<(u64, Vec<u8>)> = (first..=75)
        .map(|v| (v, more[v as usize - 1].clone()))
        .collect();
    assert_eq!(read_back(&opened.log, first, 7, 3000), expected);
    drop(opened);
    let reopened = open_from_checkpoint_ok(&copy_of(&storage), config, "reopened");
    assert_eq!(reopened.report.checkpoint, Some(75));
    assert_eq!(reopened.fold, Fold::of(&more));
}

#[test]
fn a_damaged_reset_marker_is_refused_by_name_and_a_stray_temporary_one_is_ignored() {
    let (config, storage, payloads) = forty_records();
    // A crash while the marker's temporary file was written: nothing
    // changed, the old log opens.
    let stray = copy_of(&storage);
    let temporary = folder().join(format!("{}.tmp", wal::RESET_MARKER));
    stray
        .open(&temporary, true)
        .unwrap()
        .write_at(b"half a marker", 0)
        .unwrap();
    let opened = open_from_checkpoint_ok(&stray, config.clone(), "stray temporary");
    assert_reads(&opened.log, &payloads, 1, "stray temporary");
    drop(opened);
    // A whole marker that does not decode is damage, not a crash.
    let damaged = copy_of(&storage);
    damaged
        .open(&folder().join(wal::RESET_MARKER), true)
        .unwrap()
        .write_at(b"not a checkpoint at all, not even close to one", 0)
        .unwrap();
    match open_from_checkpoint(Arc::new(damaged), config) {
        Err(LogError::Corrupt { path, reason, .. }) => {
            assert!(path.ends_with(wal::RESET_MARKER), "{}", path.display());
            assert!(reason.contains("reset marker"), "{reason}");
        }
        Err(other) => panic!("another error: {other}"),
        Ok(_) => panic!("a damaged reset marker was opened"),
    }
}
