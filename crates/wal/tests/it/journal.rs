//! The server's journal (`wal::journal`) on `FaultStorage`: logs that
//! share it keep every acknowledged record in any crash image, a round of
//! many logs is one write and one fdatasync, redo skips files that are
//! gone and never writes old bytes into a file made again after a
//! rotation, a damaged round is refused unless it is the last, and a log
//! alone on its journal is written in place (`wal::write_here`), and
//! appends on many threads at once never leave a record unwritten.

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

/// A journal of `bytes_max` whose rounds of several logs go through it
/// however few logs are busy (`few_logs` 0), as rounds do with many.
fn open_journal(storage: &FaultStorage, bytes_max: u64) -> Result<Journal, LogError> {
    open_journal_with(storage, bytes_max, 0)
}

fn open_journal_with(
    storage: &FaultStorage,
    bytes_max: u64,
    few_logs: usize,
) -> Result<Journal, LogError> {
    Journal::open(
        Arc::new(storage.clone()),
        root(),
        JournalConfig {
            bytes_max,
            few_logs,
        },
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
    let metrics = crash_images(32 * 1024, 8 * 1024, 240, 0, 0);
    assert!(metrics.rounds > 40, "rounds of several logs: {metrics:?}");
    assert!(metrics.rotations > 3, "the journal rotated: {metrics:?}");
}

#[test]
fn logs_with_large_batches_keep_every_acknowledged_record_in_every_crash_image() {
    // Batches past 32 KiB go to the direct writers, in parallel with the
    // journal's rounds of the small ones.
    // Enough images that rounds of several small batches come on a
    // loaded machine too.
    let metrics = crash_images(1 << 20, 256 * 1024, 150, LARGE, 0);
    assert!(metrics.direct_writes > 20, "direct writes: {metrics:?}");
    assert!(
        metrics.rounds > 5,
        "journal rounds beside them: {metrics:?}"
    );
}

/// Four logs share a journal of `journal_bytes` (`few_logs` as its
/// config says) while records go in (payloads of `salt`); a crash image
/// after every few records must redo and recover every log to at least
/// what it had acknowledged.
fn crash_images(
    journal_bytes: u64,
    segment_bytes: u64,
    images: u64,
    salt: u64,
    few_logs: usize,
) -> wal::JournalMetrics {
    const LOGS: usize = 4;
    let storage = FaultStorage::new();
    let journal = Arc::new(open_journal_with(&storage, journal_bytes, few_logs).unwrap());
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
fn logs_written_each_into_its_own_segment_while_few_are_busy_keep_every_acknowledged_record_in_every_crash_image(
) {
    // Four logs, fewer than the default's twelve: rounds of several write
    // each log's batch into its own segment, in parallel, and none goes
    // through the journal.
    let few_logs = JournalConfig::default().few_logs;
    assert!(few_logs >= 4);
    let metrics = crash_images(32 * 1024, 8 * 1024, 120, 0, few_logs);
    assert_eq!(
        metrics.rounds, 0,
        "no round went through the journal: {metrics:?}"
    );
    assert!(metrics.direct_writes > 120, "direct writes: {metrics:?}");
}

#[test]
fn while_few_logs_are_busy_a_round_of_small_batches_writes_each_alone_and_with_many_the_journal_takes_them(
) {
    const FEW: usize = 4;
    const MANY: usize = 20;
    let storage = FaultStorage::new();
    let few_logs = JournalConfig::default().few_logs;
    assert!((FEW..MANY).contains(&few_logs));
    let journal = Arc::new(open_journal_with(&storage, 1 << 20, few_logs).unwrap());
    let logs: Vec<Log> = (0..MANY)
        .map(|i| open_log(&storage, i, journaled(&journal, 1 << 20)).0)
        .collect();
    let mut payloads: Vec<Vec<Vec<u8>>> = vec![Vec::new(); MANY];
    let journal_file = root().join(wal::journal::JOURNAL_FILE);
    // (logs with a record, whether log 1 has a large batch among them,
    // whether the round goes through the journal)
    for (busy, large, journaled) in [(FEW, true, true), (FEW, false, false), (MANY, false, true)] {
        // The journal's thread stalls in the sync of a round of log 0
        // alone while `busy` logs get records: its next round holds them.
        storage.hold_syncs();
        push(&logs[0], 0, &mut payloads[0]);
        std::thread::sleep(Duration::from_millis(20));
        for (index, log) in logs.iter().enumerate().take(busy) {
            push(log, index, &mut payloads[index]);
        }
        if large {
            // Twenty records of at least 2,000 bytes: past 32 KiB.
            for _ in 0..20 {
                push_salted(&logs[1], 1, &mut payloads[1], LARGE);
            }
        }
        let before = journal.metrics();
        let frames_before = round_starts(&storage.read_file(&journal_file).unwrap()).len();
        storage.release_syncs();
        for (index, log) in logs.iter().enumerate().take(busy) {
            wait_durable(log, payloads[index].len() as u64, "after the release");
        }
        let after = journal.metrics();
        let frames = round_starts(&storage.read_file(&journal_file).unwrap()).len() - frames_before;
        let context = format!("{busy} logs, large {large}: {before:?} -> {after:?}");
        if journaled {
            // One round of frames: with many logs, all of them; beside a
            // large batch (written by a direct writer), the small ones.
            assert_eq!(after.rounds - before.rounds, 1, "{context}");
            assert_eq!(frames, 1, "one round of frames: {context}");
        } else {
            // The stalled round of log 0, then every log's batch written
            // into its own segment (the one the journal's thread writes
            // may be counted just after its log is durable).
            assert_eq!(after.rounds, before.rounds, "{context}");
            assert_eq!(frames, 0, "no frames: {context}");
            assert!(
                after.direct_writes - before.direct_writes >= FEW as u64,
                "{context}"
            );
        }
    }
}

#[test]
fn a_round_of_many_logs_is_one_write_and_one_fdatasync() {
    const LOGS: usize = 20;
    let (storage, journal, logs) = logs_on_one_journal(LOGS);
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

#[test]
fn logs_appended_on_many_threads_at_once_each_see_every_record_durable() {
    // An append wakes the journal's thread only when it waits, and the
    // wake clears that: the appends before the thread runs make no system
    // call. None of them may be left waiting for a round that never
    // comes, however the threads interleave.
    const THREADS: usize = 8;
    const RECORDS: usize = 300;
    let (_storage, _journal, logs) = logs_on_one_journal(THREADS);
    std::thread::scope(|scope| {
        for (index, log) in logs.iter().enumerate() {
            scope.spawn(move || {
                let mut payloads = Vec::new();
                for _ in 0..RECORDS {
                    push(log, index, &mut payloads);
                    wait_durable(log, payloads.len() as u64, "one record at a time");
                }
            });
        }
    });
    for log in &logs {
        assert_eq!(log.durable_version(), RECORDS as u64);
    }
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
        JournalConfig {
            bytes_max: 1 << 20,
            ..JournalConfig::default()
        },
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

/// `count` logs sharing a journal, journal and segments of 1 MiB, in a
/// storage of their own.
fn logs_on_one_journal(count: usize) -> (FaultStorage, Arc<Journal>, Vec<Log>) {
    let storage = FaultStorage::new();
    let journal = Arc::new(open_journal(&storage, 1 << 20).unwrap());
    let logs = (0..count)
        .map(|i| open_log(&storage, i, journaled(&journal, 1 << 20)).0)
        .collect();
    (storage, journal, logs)
}

#[test]
fn a_damaged_round_before_a_later_one_is_refused_and_a_damaged_last_round_ends_redo() {
    let (storage, _journal, logs) = logs_on_one_journal(2);
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
        JournalConfig {
            bytes_max: 1 << 20,
            ..JournalConfig::default()
        },
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
        JournalConfig {
            bytes_max: 1 << 20,
            ..JournalConfig::default()
        },
    )
    .unwrap();
    assert!(
        report.frames > 0,
        "the rounds before it were redone: {report:?}"
    );
}

/// Waits until the journal's thread waits for work (it returns to its
/// wait a moment after a round's records are durable).
fn wait_idle(journal: &Journal) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !journal.idle() {
        assert!(
            std::time::Instant::now() < deadline,
            "the journal never idles"
        );
        std::thread::sleep(Duration::from_micros(100));
    }
}

/// One log on a journal of `journal_bytes` (segments of `segment_bytes`),
/// its first record durable through a round of it alone and the
/// journal's thread idle again: the next record may be written in place.
fn one_log_alone(
    journal_bytes: u64,
    segment_bytes: u64,
) -> (FaultStorage, Arc<Journal>, Log, Vec<Vec<u8>>) {
    let storage = FaultStorage::new();
    let journal = Arc::new(open_journal(&storage, journal_bytes).unwrap());
    let (log, _) = open_log(&storage, 0, journaled(&journal, segment_bytes));
    let mut payloads = Vec::new();
    push(&log, 0, &mut payloads);
    wait_durable(&log, 1, "the first record");
    wait_idle(&journal);
    (storage, journal, log, payloads)
}

/// Notes the thread each call of `log`'s durable hook runs on, and
/// whether that thread said it wrote the record in place
/// (`wal::hook_in_place`).
type HookThreads = Arc<std::sync::Mutex<Vec<(std::thread::ThreadId, bool)>>>;

fn hook_threads(log: &Log) -> HookThreads {
    let threads: HookThreads = Arc::default();
    let noted = Arc::clone(&threads);
    log.on_durable(move |_, _| {
        let here = (std::thread::current().id(), wal::hook_in_place());
        noted.lock().unwrap().push(here);
        true
    });
    threads
}

#[test]
fn a_log_alone_on_its_journal_is_written_and_synced_by_the_thread_that_appends() {
    // The first record goes through the journal: a round of this log alone.
    let (storage, journal, log, mut payloads) = one_log_alone(1 << 20, 1 << 20);
    let threads = hook_threads(&log);
    let before = journal.metrics();
    let syncs = storage.sync_count();
    let durable = wal::write_here(|| {
        push(&log, 0, &mut payloads);
        push(&log, 0, &mut payloads);
        log.durable_version()
    });
    assert_eq!(durable, 1, "nothing is written while the work runs");
    // Back from `write_here`: both records are durable, synced once, and
    // the hook ran here.
    assert_eq!(log.durable_version(), 3);
    assert_eq!(storage.sync_count() - syncs, 1);
    assert_eq!(
        *threads.lock().unwrap(),
        vec![(std::thread::current().id(), true)]
    );
    assert!(!wal::hook_in_place(), "only while the hook runs");
    let after = journal.metrics();
    assert_eq!(after.direct_writes - before.direct_writes, 1);
    assert_eq!(after.rounds, before.rounds);
    // Everything is in every crash image.
    for mode in [CrashMode::DurableOnly, CrashMode::TornTail] {
        let image = storage.crash(mode, 3);
        let reopened = Arc::new(open_journal(&image, 1 << 20).unwrap());
        let (_, seen) = open_log(&image, 0, journaled(&reopened, 1 << 20));
        assert_prefix(&seen, &payloads, 3, "written in place");
        assert_eq!(seen.len(), 3);
    }
}

#[test]
fn with_several_logs_busy_write_here_leaves_the_records_to_the_journals_rounds() {
    let (storage, journal, logs) = logs_on_one_journal(2);
    let mut payloads: Vec<Vec<Vec<u8>>> = vec![Vec::new(); 2];
    // A round of both logs: neither has the journal to itself.
    journal_rounds(&storage, &logs, &mut payloads, 1, 0);
    let threads = hook_threads(&logs[0]);
    let before = journal.metrics();
    wal::write_here(|| push(&logs[0], 0, &mut payloads[0]));
    wait_durable(&logs[0], payloads[0].len() as u64, "through the journal");
    let here = std::thread::current().id();
    assert!(
        threads
            .lock()
            .unwrap()
            .iter()
            .all(|(thread, in_place)| *thread != here && !in_place),
        "the journal's thread made the record durable"
    );
    // A round of the log alone (the journal's thread writes it directly);
    // now it has the journal to itself and the next write is in place.
    wait_idle(&journal);
    assert_eq!(journal.metrics().direct_writes - before.direct_writes, 1);
    wal::write_here(|| push(&logs[0], 0, &mut payloads[0]));
    assert_eq!(logs[0].durable_version(), payloads[0].len() as u64);
    assert_eq!(threads.lock().unwrap().last(), Some(&(here, true)));
}

#[test]
fn a_log_may_be_written_here_only_while_it_has_the_idle_journal_to_itself() {
    let (storage, journal, logs) = logs_on_one_journal(2);
    let mut payloads: Vec<Vec<Vec<u8>>> = vec![Vec::new(); 2];
    // A round of both logs: neither had the journal to itself. The
    // journal's thread may take the first log's records in a round of
    // their own before the second's arrive, and the second's round is then
    // alone too: such a set of rounds is tried again.
    for _ in 0..20 {
        journal_rounds(&storage, &logs, &mut payloads, 1, 0);
        wait_idle(&journal);
        if !logs[0].may_write_here() && !logs[1].may_write_here() {
            break;
        }
    }
    assert!(!logs[0].may_write_here() && !logs[1].may_write_here());
    // A round of the first alone: it may now, the other may not.
    push(&logs[0], 0, &mut payloads[0]);
    wait_durable(&logs[0], payloads[0].len() as u64, "a round of it alone");
    wait_idle(&journal);
    assert!(logs[0].may_write_here());
    assert!(!logs[1].may_write_here());
    // While the journal's thread has work (a round held at its sync), not
    // even the log alone may.
    storage.hold_syncs();
    push(&logs[1], 1, &mut payloads[1]);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while journal.idle() {
        assert!(
            std::time::Instant::now() < deadline,
            "the round never starts"
        );
        std::thread::sleep(Duration::from_micros(100));
    }
    assert!(!logs[0].may_write_here());
    storage.release_syncs();
    wait_durable(&logs[1], payloads[1].len() as u64, "the held round");
    // The hint agrees with what `write_here` then does.
    wait_idle(&journal);
    assert!(logs[1].may_write_here() && !logs[0].may_write_here());
    let threads = hook_threads(&logs[1]);
    wal::write_here(|| push(&logs[1], 1, &mut payloads[1]));
    assert_eq!(logs[1].durable_version(), payloads[1].len() as u64);
    assert_eq!(
        threads.lock().unwrap().last(),
        Some(&(std::thread::current().id(), true))
    );
    // A log without a journal is never written by `write_here`.
    let (alone, _) = open_log(&FaultStorage::new(), 7, sync_config(1 << 20));
    assert!(!alone.may_write_here());
}

#[test]
fn records_appended_in_place_survive_every_crash_image_and_a_panic_in_the_work() {
    let (storage, journal, log, mut payloads) = one_log_alone(64 * 1024, 16 * 1024);
    let before = journal.metrics();
    for seed in 0..60u64 {
        wait_idle(&journal);
        wal::write_here(|| {
            for _ in 0..1 + seed % 3 {
                push(&log, 0, &mut payloads);
            }
        });
        let acknowledged = log.durable_version();
        assert_eq!(acknowledged, payloads.len() as u64, "seed {seed}");
        let mode = if seed % 2 == 0 {
            CrashMode::DurableOnly
        } else {
            CrashMode::TornTail
        };
        let image = storage.crash(mode, seed);
        let reopened = Arc::new(open_journal(&image, 64 * 1024).unwrap());
        let (_, seen) = open_log(&image, 0, journaled(&reopened, 16 * 1024));
        assert_prefix(&seen, &payloads, acknowledged, &format!("seed {seed}"));
    }
    let after = journal.metrics();
    assert_eq!(after.direct_writes - before.direct_writes, 60);
    assert_eq!(after.rounds, before.rounds, "no journal round was needed");
    // Work that panics lets go of the log: the journal writes its record.
    let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wal::write_here(|| {
            push(&log, 0, &mut payloads);
            panic!("the work fails after appending");
        })
    }));
    assert!(unwound.is_err());
    wait_durable(&log, payloads.len() as u64, "after the panic");
    // And the thread is free of it: a later call writes in place again.
    wait_idle(&journal);
    wal::write_here(|| push(&log, 0, &mut payloads));
    assert_eq!(log.durable_version(), payloads.len() as u64);
    drop(log);
    drop(journal);
}

#[test]
fn a_hook_run_in_place_that_drops_the_last_owner_of_its_log_and_journal_waits_for_nothing() {
    let (storage, journal, log, mut payloads) = one_log_alone(1 << 20, 1 << 20);
    // From here the log holds the journal's last handle, and a slot the
    // hook empties holds the log's.
    drop(journal);
    let slot: Arc<std::sync::Mutex<Option<Log>>> = Arc::new(std::sync::Mutex::new(None));
    let emptied = Arc::new(std::sync::atomic::AtomicBool::new(false));
    {
        let (slot, emptied) = (Arc::clone(&slot), Arc::clone(&emptied));
        log.on_durable(move |durable, _| {
            if durable >= 2 {
                drop(slot.lock().unwrap().take());
                emptied.store(true, std::sync::atomic::Ordering::Release);
            }
            true
        });
    }
    *slot.lock().unwrap() = Some(log);
    wal::write_here(|| {
        let log = slot.lock().unwrap();
        push(log.as_ref().unwrap(), 0, &mut payloads);
    });
    // The hook ran here, in place, and dropped the log and its journal
    // without waiting for this thread.
    assert!(emptied.load(std::sync::atomic::Ordering::Acquire));
    let image = storage.crash(CrashMode::DurableOnly, 1);
    let reopened = Arc::new(open_journal(&image, 1 << 20).unwrap());
    let (_, seen) = open_log(&image, 0, journaled(&reopened, 1 << 20));
    assert_prefix(&seen, &payloads, 2, "dropped by its hook");
}

/// The bytes of log `index`'s segment files, as their lengths stand.
fn segment_bytes(storage: &FaultStorage, index: usize) -> u64 {
    let folder = log_folder(index);
    storage
        .files()
        .into_iter()
        .filter(|(path, _)| path.starts_with(&folder) && path.extension() == Some("seg".as_ref()))
        .map(|(_, length)| length)
        .sum()
}

#[test]
fn journal_rounds_put_no_zeros_ahead_of_a_segment_while_a_log_written_alone_keeps_them() {
    const SEGMENT: u64 = 8 << 20;
    const LOGS: usize = 3;
    const ALONE: usize = 2;
    let storage = FaultStorage::new();
    let journal = Arc::new(open_journal(&storage, 4 << 20).unwrap());
    let logs: Vec<Log> = (0..LOGS)
        .map(|i| open_log(&storage, i, journaled(&journal, SEGMENT)).0)
        .collect();
    let mut payloads: Vec<Vec<Vec<u8>>> = vec![Vec::new(); LOGS];
    for _ in 0..20 {
        // The journal's thread stalls in the sync of log 2's record,
        // written alone past the journal, while logs 0 and 1 get theirs:
        // the next round holds both, as frames.
        storage.hold_syncs();
        push(&logs[ALONE], ALONE, &mut payloads[ALONE]);
        std::thread::sleep(Duration::from_millis(10));
        for (index, log) in logs.iter().enumerate().take(ALONE) {
            push(log, index, &mut payloads[index]);
        }
        storage.release_syncs();
        for (index, log) in logs.iter().enumerate() {
            wait_durable(log, payloads[index].len() as u64, "a round");
        }
    }
    let metrics = journal.metrics();
    assert!(
        metrics.rounds >= 20 && metrics.direct_writes >= 20,
        "rounds of several logs and writes of one: {metrics:?}"
    );
    let running: Vec<u64> = (0..LOGS).map(|i| segment_bytes(&storage, i)).collect();
    // A clean close cuts each segment back to its last record.
    drop(logs);
    let closed: Vec<u64> = (0..LOGS).map(|i| segment_bytes(&storage, i)).collect();
    for index in 0..ALONE {
        assert!(
            running[index] <= closed[index].next_multiple_of(4096),
            "log {index}, written only in journal rounds, had {} bytes on file for {} of records",
            running[index],
            closed[index]
        );
    }
    assert!(
        running[ALONE] >= closed[ALONE] + (1 << 20),
        "the log written alone keeps its tail 1 MiB ahead: {} bytes on file for {} of records",
        running[ALONE],
        closed[ALONE]
    );
    for (index, payloads) in payloads.iter().enumerate() {
        let (log, recovered) = open_log(&storage, index, journaled(&journal, SEGMENT));
        assert_prefix(&recovered, payloads, payloads.len() as u64, "reopened");
        assert_eq!(recovered.len(), payloads.len(), "log {index} reopened");
        read_back(&log, payloads, payloads.len() as u64, index as u64);
    }
}

#[test]
fn a_log_written_alone_keeps_zeros_ahead_of_small_batches_but_not_of_large_ones() {
    const SEGMENT: u64 = 16 << 20;
    let storage = FaultStorage::new();
    let journal = Arc::new(open_journal(&storage, 4 << 20).unwrap());
    let (log, _) = open_log(&storage, 0, journaled(&journal, SEGMENT));
    let mut payloads: Vec<Vec<u8>> = Vec::new();
    // One record per batch, each written alone past the journal.
    let mut put = |size: usize| {
        let version = payloads.len() as u64 + 1;
        let bytes = payload(version * 131, size);
        append(&log, version, &encode(stream_id(0), version, &bytes)).unwrap();
        payloads.push(bytes);
        wait_durable(&log, version, "a batch of one record");
    };
    for _ in 0..5 {
        put(1_000);
    }
    let small = segment_bytes(&storage, 0);
    assert!(
        small >= 1 << 20,
        "batches of 1 KB keep the tail 1 MiB ahead with zeros: {small} bytes on file"
    );
    // 2.2 MB in batches of 40 KB (32 KiB or more) and 70 KB: past the
    // zeros, and none written ahead of them. The file grows by a hole
    // ahead of them, which costs the disk nothing: what is written is the
    // records, and again the block each batch starts in.
    let before = storage.bytes_written();
    const LARGE: usize = 40;
    for index in 0..LARGE {
        put(if index % 2 == 0 { 40_000 } else { 70_000 });
    }
    let written = storage.bytes_written() - before;
    drop(log);
    let closed = segment_bytes(&storage, 0);
    assert!(
        closed > 2_000_000 && written <= closed + (LARGE as u64) * 2 * 4096,
        "batches of 40 and 70 KB write no zeros ahead: {written} bytes written for {closed} of records"
    );
    let (log, recovered) = open_log(&storage, 0, journaled(&journal, SEGMENT));
    assert_eq!(recovered.len(), payloads.len(), "reopened");
    assert_prefix(&recovered, &payloads, payloads.len() as u64, "reopened");
    read_back(&log, &payloads, payloads.len() as u64, 0);
}
