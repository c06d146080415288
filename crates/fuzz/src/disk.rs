//! What a server reads from its disk: records, a log folder's files
//! (segments, checkpoints, the manifest), read by the read-only scan that
//! `stamplog check` uses and by the recovery a restarting server runs,
//! and the server's journal, redone before any stream opens.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use proto::{EventId, Record, RecordHeader};
use wal::fault::FaultStorage;
use wal::{Log, LogConfig, Storage};

const STREAM: u64 = 7;
const FOLDER: &str = "/log";

/// Records as a log writes them: a few, each encoded alone.
pub(crate) fn record_seeds() -> Vec<Vec<u8>> {
    (1..=3)
        .map(|version| {
            let mut bytes = Vec::new();
            sample_record(version, b"payload").encode(&mut bytes);
            bytes
        })
        .collect()
}

fn sample_record(version: u64, payload: &[u8]) -> Record<'_> {
    Record {
        header: RecordHeader {
            flags: 0,
            stream: STREAM,
            version,
            epoch: 1,
            event: EventId {
                client: 9,
                session: 1,
                sequence: version,
            },
            low_water: 1,
        },
        key: b"k",
        payload,
    }
}

/// Which file of a log folder an input's part becomes.
fn file_name(kind: u8) -> String {
    match kind % 4 {
        0 => wal::segment::segment_name(1),
        1 => wal::segment::segment_name(3),
        2 => wal::checkpoint::checkpoint_name(2),
        _ => wal::manifest::MANIFEST_NAME.to_string(),
    }
}

/// Cuts the input into files: `[kind: u8][length: u16 LE][bytes]`
/// repeated, the last part taking what is left.
fn files_of(mut bytes: &[u8]) -> Vec<(String, &[u8])> {
    let mut files = Vec::new();
    while let Some((&kind, rest)) = bytes.split_first() {
        let (length, rest) = match rest {
            [low, high, rest @ ..] => (usize::from(u16::from_le_bytes([*low, *high])), rest),
            _ => (rest.len(), &rest[rest.len()..]),
        };
        let (part, after) = rest.split_at(length.min(rest.len()));
        files.push((file_name(kind), part));
        bytes = after;
    }
    files
}

/// The input's files as a log folder: the read-only scan and the
/// recovery of a restarting server read it; either may refuse it, neither
/// may panic, and what the scan accepts recovery opens too, with the same
/// last version.
pub fn log_files(bytes: &[u8]) {
    let storage = FaultStorage::new();
    let folder = Path::new(FOLDER);
    storage.create_dir_all(folder).expect("a folder in memory");
    for (name, part) in files_of(bytes) {
        let file = storage
            .open(&folder.join(name), true)
            .expect("a file in memory");
        file.write_at(part, 0).expect("a write in memory");
    }
    let mut scanned = 0;
    let inspected = wal::inspect(&storage, folder, STREAM, &mut |_| scanned += 1);
    let opened = Log::open(
        Arc::new(storage),
        folder,
        STREAM,
        small_segments(),
        &mut |_| {},
    );
    if let (Ok(last), Ok(log)) = (&inspected, &opened) {
        assert_eq!(*last, log.last_version(), "scan and recovery disagree");
    }
}

/// Segments of 64 KiB: what a fuzzed folder's log preallocates stays
/// small.
fn small_segments() -> LogConfig {
    LogConfig {
        segment_bytes_max: 64 * 1024,
        ..LogConfig::default()
    }
}

/// A real log's folder, written by the log itself, as one input.
pub(crate) fn log_file_seeds() -> Vec<Vec<u8>> {
    let storage = FaultStorage::new();
    let folder = PathBuf::from(FOLDER);
    {
        let log = Log::open(
            Arc::new(storage.clone()),
            &folder,
            STREAM,
            small_segments(),
            &mut |_| {},
        )
        .expect("a new log opens");
        for version in 1..=4 {
            let mut bytes = Vec::new();
            sample_record(version, b"some payload").encode(&mut bytes);
            log.append(version, &bytes).expect("an append");
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while log.durable_version() < 4 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let _ = log.checkpoint(2, b"state", 0);
    }
    let mut input = Vec::new();
    for (path, _) in storage.files() {
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        let kind = (0..4u8).find(|kind| file_name(*kind) == name);
        let (Some(kind), Some(content)) = (kind, storage.read_file(&path)) else {
            continue;
        };
        input.push(kind);
        input.extend_from_slice(&(content.len().min(usize::from(u16::MAX)) as u16).to_le_bytes());
        input.extend_from_slice(&content[..content.len().min(usize::from(u16::MAX))]);
    }
    vec![input]
}

/// Where a fuzzed journal lives, and the segment files its frames may
/// name (made before redo, each with a valid header).
const JOURNAL_ROOT: &str = "/data";
const JOURNALED_LOGS: [&str; 2] = ["streams/a/log", "streams/b/log"];
/// A small journal: what a fuzzed input's journal preallocates stays
/// small.
const JOURNAL_BYTES: u64 = 64 * 1024;

/// A folder with the journaled logs' first segments, as a server's
/// data folder holds them when its journal is redone.
fn journal_folder() -> FaultStorage {
    let storage = FaultStorage::new();
    for (index, log) in JOURNALED_LOGS.iter().enumerate() {
        let folder = Path::new(JOURNAL_ROOT).join(log);
        storage.create_dir_all(&folder).expect("a folder in memory");
        let file = storage
            .open(&wal::segment::segment_path(&folder, 1), true)
            .expect("a file in memory");
        let header = wal::segment::encode_header(STREAM + index as u64, 1);
        file.write_at(&header, 0).expect("a write in memory");
    }
    storage
}

/// The input as a server's `journal.wal`, redone before any stream opens:
/// redo may refuse it, must not panic, writes only into files that exist
/// (never makes one, never outside the data folder), and leaves a journal
/// that opens again with nothing to redo.
pub fn journal(bytes: &[u8]) {
    let storage = journal_folder();
    let root = Path::new(JOURNAL_ROOT);
    let file = storage
        .open(&root.join(wal::journal::JOURNAL_FILE), true)
        .expect("a file in memory");
    file.write_at(bytes, 0).expect("a write in memory");
    let before: Vec<PathBuf> = storage.files().into_iter().map(|(path, _)| path).collect();
    let config = wal::JournalConfig {
        bytes_max: JOURNAL_BYTES,
        ..wal::JournalConfig::default()
    };
    let Ok((journal, _)) = wal::Journal::open(Arc::new(storage.clone()), root, config) else {
        return;
    };
    drop(journal);
    for (path, _) in storage.files() {
        assert!(before.contains(&path), "redo made {}", path.display());
    }
    let (_, again) = wal::Journal::open(Arc::new(storage), root, config)
        .expect("a journal redo left opens again");
    assert_eq!(again.frames, 0, "a redone journal has nothing left to redo");
}

/// A real journal, written by two logs whose records went through it in
/// rounds of both.
pub(crate) fn journal_seeds() -> Vec<Vec<u8>> {
    let storage = FaultStorage::new();
    let root = Path::new(JOURNAL_ROOT);
    // Rounds of both logs go through the journal, few as they are.
    let config = wal::JournalConfig {
        bytes_max: JOURNAL_BYTES,
        few_logs: 0,
    };
    let (journal, _) =
        wal::Journal::open(Arc::new(storage.clone()), root, config).expect("a new journal");
    let journal = Arc::new(journal);
    let logs: Vec<Log> = JOURNALED_LOGS
        .iter()
        .enumerate()
        .map(|(index, log)| {
            let config = LogConfig {
                journal: Some(Arc::clone(&journal)),
                ..small_segments()
            };
            let stream = STREAM + index as u64;
            Log::open(
                Arc::new(storage.clone()),
                &root.join(log),
                stream,
                config,
                &mut |_| {},
            )
            .expect("a new log opens")
        })
        .collect();
    for version in 1..=3 {
        // A held sync: both logs' records wait for one round.
        storage.hold_syncs();
        for (index, log) in logs.iter().enumerate() {
            let mut record = sample_record(version, b"journaled payload");
            record.header.stream = STREAM + index as u64;
            let mut bytes = Vec::new();
            record.encode(&mut bytes);
            log.append(version, &bytes).expect("an append");
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
        storage.release_syncs();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while logs.iter().any(|log| log.durable_version() < version)
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
    let path = root.join(wal::journal::JOURNAL_FILE);
    let mut content = storage.read_file(&path).unwrap_or_default();
    // The rounds, without the zeros after them.
    let used = content
        .iter()
        .rposition(|b| *b != 0)
        .map_or(0, |last| last + 1);
    content.truncate(used.next_multiple_of(4096));
    vec![content]
}
