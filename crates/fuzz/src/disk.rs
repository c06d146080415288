//! What a server reads from its disk: records, and a log folder's files
//! (segments, checkpoints, the manifest), read by the read-only scan that
//! `stamplog check` uses and by the recovery a restarting server runs.

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
