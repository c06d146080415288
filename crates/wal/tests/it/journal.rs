//! The server's journal (`wal::journal`) on `FaultStorage`: logs that
//! share it keep every acknowledged record in any crash image, a round of
//! many logs is one write and one fdatasync, redo skips files that are
//! gone and never writes old bytes into a file made again after a
//! rotation, and a damaged round is refused unless it is the last.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use proto::Record;
use wal::fault::{CrashMode, FaultStorage};
use wal::{Journal, JournalConfig, Log, LogConfig, LogError, Storage};

use crate::basics::encode;
use crate::crash::{append, assert_prefix, payload, sync_config, wait_durable, Recovered};

const ROOT: &str = "/data";
/// The salt of large payloads (see `push_salted`).
const LARGE: u64 = 99;

fn root() -> &'static Path {
    Path::new(ROOT)
}

fn log_folder(index: usize) -> PathBuf {
    root().join("streams").join(format!("s{index}")).join("log")
}

fn stream_id(index: usize) -> u64 {
    100 + index as u64
}

fn open_journal(storage: &FaultStorage, bytes_max: u64) -> Result<Journal, LogError> {
    Journal::open(
        Arc::new(storage.clone()),
        root(),
        JournalConfig { bytes_max },
    )
    .map(|(journal, _)| journal)
}

fn journaled(journal: &Arc<Journal>, segment_bytes_max: u64) -> LogConfig {
    LogConfig {
        journal: Some(Arc::clone(journal)),
        ..sync_config(segment_bytes_max)
    }
}

/// Opens log `index`; returns it with the records recovery visited.
fn open_log(storage: &FaultStorage, index: usize, config: LogConfig) -> (Log, Recovered) {
    let mut seen = Vec::new();
    let log = Log::open(
        Arc::new(storage.clone()),
        &log_folder(index),
        stream_id(index),
        config,
        &mut |record: &Record<'_>| seen.push((record.header.version, record.payload.to_vec())),
    )
    .unwrap_or_else(|error| panic!("log {index} does not open: {error}"));
    (log, seen)
}

/// Appends the next record of log `index`, its payload noted in `payloads`.
fn push(log: &Log, index: usize, payloads: &mut Vec<Vec<u8>>) {
    push_salted(log, index, payloads, 0);
}

/// `push`, with payloads (and their sizes) that differ with `salt`; a
/// salt of `LARGE` makes payloads of 10 to 50 KB.
fn push_salted(log: &Log, index: usize, payloads: &mut Vec<Vec<u8>>, salt: u64) {
    let version = payloads.len() as u64 + 1;
    let size = match salt {
        LARGE => 2_000 + (version as usize * 7919) % 48_000,
        _ => 30 + (version as usize * 53 + salt as usize * 301) % 700,
    };
    let bytes = payload(version * 31 + index as u64 + salt * 1000, size);
    append(log, version, &encode(stream_id(index), version, &bytes)).unwrap();
    payloads.push(bytes);
}

#[test]
fn logs_sharing_a_journal_keep_every_acknowledged_record_in_every_crash_image() {
    // A small journal and small segments: rotations and segment rolls
    // happen while the images are taken.
    let metrics = crash_images(32 * 1024, 8 * 1024, 240, 0);
    assert!(metrics.rounds > 40, "rounds of several logs: {metrics:?}");
    assert!(metrics.rotations > 3, "the journal rotated: {metrics:?}");
}

#[test]
fn logs_with_large_batches_keep_every_acknowledged_record_in_every_crash_image() {
    // Batches past 32 KiB go to the direct writers, in parallel with the
    // journal's rounds of the small ones.
    let metrics = crash_images(1 << 20, 256 * 1024, 60, LARGE);
    assert!(metrics.direct_writes > 20, "direct writes: {metrics:?}");
    assert!(
        metrics.rounds > 5,
        "journal rounds beside them: {metrics:?}"
    );
}

/// Four logs share a journal of `journal_bytes` while records go in
/// (payloads of `salt`); a crash image after every few records must
/// redo and recover every log to at least what it had acknowledged.
fn crash_images(
    journal_bytes: u64,
    segment_bytes: u64,
    images: u64,
    salt: u64,
) -> wal::JournalMetrics {
    const LOGS: usize = 4;
    let storage = FaultStorage::new();
    let journal = Arc::new(open_journal(&storage, journal_bytes).unwrap());
    let logs: Vec<Log> = (0..LOGS)
        .map(|i| open_log(&storage, i, journaled(&journal, segment_bytes)).0)
        .collect();
    let mut payloads: Vec<Vec<Vec<u8>>> = vec![Vec::new(); LOGS];
    let mut past_acknowledged = 0;
    for seed in 0..images {
        // Two or three logs get a record each without waiting; every
        // other time a stalled sync lets them gather into one round.
        let stall = seed % 2 == 0;
        if stall {
            storage.hold_syncs();
        }
        for step in 0..2 + seed as usize % 2 {
            let index = (seed as usize + step * 3) % LOGS;
            push_salted(&logs[index], index, &mut payloads[index], salt);
            if salt == LARGE {
                push_salted(&logs[index], index, &mut payloads[index], salt);
            }
        }
        if stall {
            std::thread::sleep(Duration::from_micros(300));
            storage.release_syncs();
        }
        let acknowledged: Vec<u64> = logs.iter().map(Log::durable_version).collect();
        if salt != LARGE && seed % 4 == 3 {
            // A live read: what rounds kept goes to the segments first.
            for (index, log) in logs.iter().enumerate() {
                read_back(log, &payloads[index], acknowledged[index], seed);
            }
        }
        let mode = if seed % 3 == 2 {
            CrashMode::DurableOnly
        } else {
            CrashMode::TornTail
        };
        let image = storage.crash(mode, seed);
        let context = format!("seed {seed}, {mode:?}, acknowledged {acknowledged:?}");
        let reopened = Arc::new(
            open_journal(&image, journal_bytes)
                .unwrap_or_else(|error| panic!("{context}: redo failed: {error}")),
        );
        for index in 0..LOGS {
            let (log, seen) = open_log(&image, index, journaled(&reopened, segment_bytes));
            let context = format!("{context}, log {index}");
            assert_prefix(&seen, &payloads[index], acknowledged[index], &context);
            assert_eq!(log.last_version(), seen.len() as u64, "{context}");
            past_acknowledged += usize::from(seen.len() as u64 > acknowledged[index]);
        }
    }
    for (index, log) in logs.iter().enumerate() {
        wait_durable(log, payloads[index].len() as u64, "all");
    }
    let metrics = journal.metrics();
    // Everything durable: any image holds every record.
    for mode in [CrashMode::DurableOnly, CrashMode::TornTail] {
        let image = storage.crash(mode, 9);
        let reopened = Arc::new(open_journal(&image, journal_bytes).unwrap());
        for (index, records) in payloads.iter().enumerate() {
            let (_, seen) = open_log(&image, index, journaled(&reopened, segment_bytes));
            assert_prefix(&seen, records, records.len() as u64, "all durable");
            assert_eq!(seen.len(), records.len());
        }
    }
    println!(
        "{metrics:?}; {past_acknowledged} log images held records past the acknowledged version"
    );
    metrics
}

/// Reads log `log` from version 1 through `through` and checks each
/// record against `payloads`.
fn read_back(log: &Log, payloads: &[Vec<u8>], through: u64, seed: u64) {
    let mut bytes = Vec::new();
    let mut next = 1;
    while next <= through {
        bytes.clear();
        let count = log
            .read(next, 1000, 1 << 20, &mut bytes)
            .unwrap_or_else(|error| panic!("seed {seed}: read from {next}: {error}"));
        assert!(
            count > 0,
            "seed {seed}: nothing read from {next} of {through}"
        );
        let mut at = 0;
        for _ in 0..count {
            let (record, used) = Record::decode(&bytes[at..]).unwrap();
            assert_eq!(record.header.version, next, "seed {seed}");
            assert_eq!(
                record.payload,
                &payloads[next as usize - 1][..],
                "seed {seed}, version {next}"
            );
            at += used;
            next += 1;
        }
    }
}

#[test]
fn a_round_of_many_logs_is_one_write_and_one_fdatasync() {
    const LOGS: usize = 20;
    let storage = FaultStorage::new();
    let journal = Arc::new(open_journal(&storage, 1 << 20).unwrap());
    let logs: Vec<Log> = (0..LOGS)
        .map(|i| open_log(&storage, i, journaled(&journal, 1 << 20)).0)
        .collect();
    let mut payloads: Vec<Vec<Vec<u8>>> = vec![Vec::new(); LOGS];
    // The journal's thread stalls in the sync of a round of log 0 alone
    // while every log gets a record.
    storage.hold_syncs();
    push(&logs[0], 0, &mut payloads[0]);
    std::thread::sleep(Duration::from_millis(20));
    for (index, log) in logs.iter().enumerate() {
        push(log, index, &mut payloads[index]);
    }
    let syncs = storage.sync_count();
    let writes = storage.write_count();
    let before = journal.metrics();
    storage.release_syncs();
    for (index, log) in logs.iter().enumerate() {
        wait_durable(log, payloads[index].len() as u64, "after the release");
    }
    let after = journal.metrics();
    assert_eq!(after.rounds - before.rounds, 1, "{before:?} -> {after:?}");
    assert!(after.records - before.records >= LOGS as u64 - 1);
    // The held sync, then one journal write and one sync for all twenty
    // logs, and each log's write through the page cache; no log syncs.
    let synced = storage.sync_count() - syncs;
    assert!(synced <= 2, "{synced} syncs for one round of {LOGS} logs");
    let written = storage.write_count() - writes;
    assert!(
        written <= 2 * LOGS as u64 + 4,
        "{written} writes for one round of {LOGS} logs"
    );
}

/// Two logs whose records go through journal rounds (a held sync makes
/// each round hold both), `rounds` times; notes their payloads.
fn journal_rounds(
    storage: &FaultStorage,
    logs: &[Log],
    payloads: &mut [Vec<Vec<u8>>],
    rounds: usize,
    salt: u64,
) {
    for _ in 0..rounds {
        storage.hold_syncs();
        for (index, log) in logs.iter().enumerate() {
            push_salted(log, index, &mut payloads[index], salt);
            push_salted(log, index, &mut payloads[index], salt);
        }
        std::thread::sleep(Duration::from_millis(5));
        storage.release_syncs();
        for (index, log) in logs.iter().enumerate() {
            wait_durable(log, payloads[index].len() as u64, "a round");
        }
    }
}

#[test]
fn redo_skips_a_deleted_log_and_never_writes_old_bytes_into_one_made_again_after_a_rotation() {
    let storage = FaultStorage::new();
    let journal = Arc::new(open_journal(&storage, 1 << 20).unwrap());
    let mut logs: Vec<Log> = (0..2)
        .map(|i| open_log(&storage, i, journaled(&journal, 1 << 20)).0)
        .collect();
    let mut payloads: Vec<Vec<Vec<u8>>> = vec![Vec::new(); 2];
    journal_rounds(&storage, &logs, &mut payloads, 5, 0);
    assert!(journal.metrics().rounds >= 3, "{:?}", journal.metrics());

    // Log 0 goes: its folder is removed without a rotation. Redo finds
    // frames naming its files and skips them; it makes no file.
    drop(logs.remove(0));
    storage.remove_dir_all(&root().join("streams/s0")).unwrap();
    let image = storage.crash(CrashMode::DurableOnly, 1);
    let (_, report) = Journal::open(
        Arc::new(image.clone()),
        root(),
        JournalConfig { bytes_max: 1 << 20 },
    )
    .unwrap();
    assert!(report.skipped > 0, "{report:?}");
    assert!(
        !image.exists(&log_folder(0).join(wal::segment::segment_name(1))),
        "redo made a file"
    );

    // Made again under the same name after a rotation, with other
    // records: no old frame is redone into it.
    journal.rotate().unwrap();
    let (again, seen) = open_log(&storage, 0, journaled(&journal, 1 << 20));
    assert!(seen.is_empty());
    logs.insert(0, again);
    // Other payloads, of other sizes, than the first incarnation's.
    let mut fresh: Vec<Vec<Vec<u8>>> = vec![Vec::new(), std::mem::take(&mut payloads[1])];
    journal_rounds(&storage, &logs, &mut fresh, 2, 1);
    for mode in [CrashMode::DurableOnly, CrashMode::TornTail] {
        let image = storage.crash(mode, 3);
        let reopened = Arc::new(open_journal(&image, 1 << 20).unwrap());
        for (index, records) in fresh.iter().enumerate() {
            let (_, seen) = open_log(&image, index, journaled(&reopened, 1 << 20));
            assert_prefix(&seen, records, records.len() as u64, "made again");
            assert_eq!(seen.len(), records.len(), "log {index}");
        }
    }
}

/// The block-aligned offsets past the first block where a round starts.
fn round_starts(journal_file: &[u8]) -> Vec<usize> {
    (4096..journal_file.len())
        .step_by(4096)
        .filter(|at| journal_file[*at..].starts_with(b"SLJ1"))
        .collect()
}

#[test]
fn a_damaged_round_before_a_later_one_is_refused_and_a_damaged_last_round_ends_redo() {
    let storage = FaultStorage::new();
    let journal = Arc::new(open_journal(&storage, 1 << 20).unwrap());
    let logs: Vec<Log> = (0..2)
        .map(|i| open_log(&storage, i, journaled(&journal, 1 << 20)).0)
        .collect();
    let mut payloads: Vec<Vec<Vec<u8>>> = vec![Vec::new(); 2];
    journal_rounds(&storage, &logs, &mut payloads, 4, 0);
    let path = root().join(wal::journal::JOURNAL_FILE);
    let image = storage.crash(CrashMode::DurableOnly, 0);
    let file = image.read_file(&path).unwrap();
    let starts = round_starts(&file);
    assert!(starts.len() >= 3, "rounds at {starts:?}");

    let first = image.crash(CrashMode::DurableOnly, 0);
    first.flip_bit(&path, (starts[0] as u64 + 60) * 8).unwrap();
    match Journal::open(
        Arc::new(first),
        root(),
        JournalConfig { bytes_max: 1 << 20 },
    ) {
        Err(LogError::Corrupt { offset, .. }) => assert_eq!(offset, starts[0] as u64),
        other => panic!("a damaged first round was not refused: {other:?}"),
    }

    let last = image.crash(CrashMode::DurableOnly, 0);
    let at = *starts.last().unwrap();
    last.flip_bit(&path, (at as u64 + 60) * 8).unwrap();
    let (_, report) = Journal::open(
        Arc::new(last.clone()),
        root(),
        JournalConfig { bytes_max: 1 << 20 },
    )
    .unwrap();
    assert!(
        report.frames > 0,
        "the rounds before it were redone: {report:?}"
    );
}
