//! Appends, durability, reads and recovery on the real file system.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use wal::{Durability, FileStorage, Log, LogConfig, ReadError, Storage};

pub fn encode(stream: u64, version: u64, payload: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::new();
    wal::experiment::encode_record(stream, version, 1, payload, &mut bytes);
    bytes
}

pub fn wait_durable(log: &Log, version: u64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while log.durable_version() < version {
        assert!(
            std::time::Instant::now() < deadline,
            "version {version} never became durable"
        );
        assert!(log.failure().is_none(), "log failed: {:?}", log.failure());
        std::thread::sleep(Duration::from_micros(200));
    }
}

pub fn append_all(log: &Log, stream: u64, from: u64, count: u64, size: usize) {
    for version in from..from + count {
        let record = encode(stream, version, &vec![(version % 251) as u8; size]);
        loop {
            match log.append(version, &record) {
                Ok(()) => break,
                Err(wal::AppendError::Full) => std::thread::sleep(Duration::from_micros(100)),
                Err(other) => panic!("append {version}: {other}"),
            }
        }
    }
}

pub fn read_versions(log: &Log, from: u64) -> Vec<(u64, usize)> {
    let mut found = Vec::new();
    let mut next = from;
    loop {
        let mut out = Vec::new();
        let count = log.read(next, 1000, 1 << 20, &mut out).unwrap();
        if count == 0 {
            return found;
        }
        for record in proto::frame::iter_records(&out) {
            found.push((record.header.version, record.payload.len()));
        }
        next = found.last().unwrap().0 + 1;
    }
}

pub fn open(storage: Arc<dyn Storage>, folder: &Path, config: LogConfig) -> (Log, Vec<u64>) {
    let mut seen = Vec::new();
    let log = Log::open(storage, folder, 7, config, &mut |record| {
        seen.push(record.header.version)
    })
    .unwrap();
    (log, seen)
}

#[test]
fn synced_records_are_read_back_in_order_after_reopening() {
    let folder = tempfile::tempdir().unwrap();
    let storage: Arc<dyn Storage> = Arc::new(FileStorage);
    let config = LogConfig {
        segment_bytes_max: 64 * 1024,
        ..LogConfig::default()
    };
    {
        let (log, seen) = open(storage.clone(), folder.path(), config.clone());
        assert!(seen.is_empty());
        append_all(&log, 7, 1, 500, 300);
        wait_durable(&log, 500);
        let versions = read_versions(&log, 1);
        assert_eq!(versions.len(), 500);
        assert!(versions
            .iter()
            .enumerate()
            .all(|(i, (v, len))| *v == i as u64 + 1 && *len == 300));
        assert_eq!(read_versions(&log, 250).first().unwrap().0, 250);
        let metrics = log.metrics();
        assert_eq!(metrics.records_synced, 500);
        assert!(metrics.syncs >= 1 && metrics.syncs <= 500);
    }
    let segments = storage.list(folder.path()).unwrap().len();
    assert!(
        segments > 2,
        "64 KiB segments should roll over, found {segments}"
    );
    let (log, seen) = open(storage, folder.path(), config);
    assert_eq!(seen, (1..=500).collect::<Vec<_>>());
    assert_eq!(log.last_version(), 500);
    assert_eq!(log.durable_version(), 500);
    append_all(&log, 7, 501, 10, 10);
    wait_durable(&log, 510);
    assert_eq!(read_versions(&log, 495).len(), 16);
}

#[test]
fn paged_log_writes_every_page_by_shutdown_and_counts_buffer_full_waits() {
    let folder = tempfile::tempdir().unwrap();
    let storage: Arc<dyn Storage> = Arc::new(FileStorage);
    let config = LogConfig::with_durability(Durability::Paged {
        pages: 1,
        page_size: 8192,
    });
    {
        let (log, _) = open(storage.clone(), folder.path(), config.clone());
        append_all(&log, 7, 1, 2000, 100);
        assert!(
            log.metrics().buffer_full_waits > 0,
            "one page must make writers wait"
        );
    }
    let (log, seen) = open(storage, folder.path(), config);
    assert_eq!(seen.len(), 2000);
    assert_eq!(log.durable_version(), 2000);
}

#[test]
fn a_partly_filled_page_is_written_after_the_flush_interval() {
    let folder = tempfile::tempdir().unwrap();
    let config = LogConfig {
        page_flush_interval: Duration::from_millis(5),
        ..LogConfig::with_durability(Durability::Paged {
            pages: 2,
            page_size: 1 << 20,
        })
    };
    let (log, _) = open(Arc::new(FileStorage), folder.path(), config);
    append_all(&log, 7, 1, 3, 10);
    wait_durable(&log, 3);
    assert_eq!(read_versions(&log, 1).len(), 3);
}

#[test]
fn memory_log_keeps_a_bounded_ring_and_names_the_oldest_version() {
    let folder = tempfile::tempdir().unwrap();
    let config = LogConfig {
        memory_retain_bytes: 10_000,
        ..LogConfig::with_durability(Durability::Memory)
    };
    let (log, _) = open(Arc::new(FileStorage), folder.path(), config);
    append_all(&log, 7, 1, 1000, 100);
    assert_eq!(log.durable_version(), 1000);
    let first = log.first_version();
    assert!(first > 900, "ring kept too much: first {first}");
    assert_eq!(read_versions(&log, first).len() as u64, 1001 - first);
    let mut out = Vec::new();
    assert_eq!(
        log.read(1, 10, 1 << 20, &mut out),
        Err(ReadError::Retained {
            requested: 1,
            oldest: first
        })
    );
}

#[test]
fn an_append_over_the_page_size_is_refused() {
    let folder = tempfile::tempdir().unwrap();
    let config = LogConfig::with_durability(Durability::Paged {
        pages: 2,
        page_size: 4096,
    });
    let (log, _) = open(Arc::new(FileStorage), folder.path(), config);
    let record = encode(7, 1, &[0; 5000]);
    assert!(matches!(
        log.append(1, &record),
        Err(wal::AppendError::TooLarge { .. })
    ));
}

#[test]
fn a_log_missing_its_first_segment_is_refused() {
    let folder = tempfile::tempdir().unwrap();
    let storage: Arc<dyn Storage> = Arc::new(FileStorage);
    let config = LogConfig {
        segment_bytes_max: 4096,
        ..LogConfig::default()
    };
    {
        let (log, _) = open(storage.clone(), folder.path(), config.clone());
        append_all(&log, 7, 1, 100, 200);
        wait_durable(&log, 100);
    }
    std::fs::remove_file(folder.path().join(wal::segment::segment_name(1))).unwrap();
    let refused = Log::open(storage, folder.path(), 7, config, &mut |_| {});
    match refused {
        Err(wal::LogError::Corrupt { reason, .. }) => {
            assert!(reason.contains("versions are missing"), "{reason}")
        }
        Err(other) => panic!("wrong error: {other}"),
        Ok(_) => panic!("a log without its first segment opened"),
    }
}

#[test]
fn another_streams_segment_is_refused_and_left_as_it_is() {
    let folder = tempfile::tempdir().unwrap();
    let storage: Arc<dyn Storage> = Arc::new(FileStorage);
    {
        let (log, _) = open(storage.clone(), folder.path(), LogConfig::default());
        append_all(&log, 7, 1, 10, 100);
        wait_durable(&log, 10);
    }
    let path = folder.path().join(wal::segment::segment_name(1));
    let before = std::fs::read(&path).unwrap();
    let refused = Log::open(storage, folder.path(), 8, LogConfig::default(), &mut |_| {});
    assert!(
        matches!(refused, Err(wal::LogError::Corrupt { offset: 0, .. })),
        "{:?}",
        refused.err()
    );
    assert_eq!(
        std::fs::read(&path).unwrap(),
        before,
        "the file must not be touched"
    );
}

#[test]
fn inspecting_a_log_reads_its_valid_prefix_and_changes_nothing() {
    let folder = tempfile::tempdir().unwrap();
    let storage: Arc<dyn Storage> = Arc::new(FileStorage);
    {
        let (log, _) = open(storage.clone(), folder.path(), LogConfig::default());
        append_all(&log, 7, 1, 20, 50);
        wait_durable(&log, 20);
    }
    let path = folder.path().join(wal::segment::segment_name(1));
    let mut bytes = std::fs::read(&path).unwrap();
    let torn = encode(7, 21, b"never finished");
    bytes.extend_from_slice(&torn[..torn.len() / 2]);
    std::fs::write(&path, &bytes).unwrap();
    let mut seen = Vec::new();
    let last = wal::inspect(storage.as_ref(), folder.path(), 7, &mut |r| {
        seen.push(r.header.version)
    })
    .unwrap();
    assert_eq!(last, 20);
    assert_eq!(seen, (1..=20).collect::<Vec<_>>());
    assert_eq!(
        std::fs::read(&path).unwrap(),
        bytes,
        "inspection must not cut the torn tail"
    );
    let (log, seen) = open(storage, folder.path(), LogConfig::default());
    assert_eq!(seen.len(), 20);
    assert_eq!(log.last_version(), 20);
}

/// A buffer of `length` bytes starting on a block boundary, made with safe
/// code: the slice of a larger vector that begins at a boundary.
fn aligned(memory: &mut Vec<u8>, length: usize) -> &mut [u8] {
    *memory = vec![0u8; length + wal::storage::BLOCK_BYTES];
    let start = memory.as_ptr().align_offset(wal::storage::BLOCK_BYTES);
    &mut memory[start..start + length]
}

#[test]
fn block_writes_and_plain_writes_to_one_file_read_back_alike() {
    let folder = tempfile::tempdir().unwrap();
    let file = FileStorage.open(&folder.path().join("f"), true).unwrap();
    let mut memory = Vec::new();
    let block = aligned(&mut memory, 8192);
    block.fill(1);
    assert!(wal::storage::is_block_aligned(block, 4096));
    file.write_blocks_at(block, 4096).unwrap();
    // Unaligned: same contract through the buffered path.
    file.write_blocks_at(&[2u8; 100], 50).unwrap();
    let mut read = vec![0u8; 4096 * 3];
    file.read_exact_at(&mut read, 0).unwrap();
    assert_eq!(&read[50..150], &[2u8; 100][..]);
    assert!(read[4096..].iter().all(|b| *b == 1));
    // A block rewritten in place is read back new, after a cached read.
    block.fill(3);
    file.write_blocks_at(&block[..4096], 4096).unwrap();
    file.sync_data().unwrap();
    file.read_exact_at(&mut read, 0).unwrap();
    assert!(read[4096..8192].iter().all(|b| *b == 3));
    assert!(read[8192..].iter().all(|b| *b == 1));
}

#[test]
fn records_read_between_batches_stay_whole_while_their_last_block_is_rewritten() {
    let folder = tempfile::tempdir().unwrap();
    let storage: Arc<dyn Storage> = Arc::new(FileStorage);
    // Not a multiple of the block: the last preallocation step and the
    // padding of a segment's last block meet the limit unaligned.
    let config = LogConfig {
        segment_bytes_max: 10_007,
        ..LogConfig::default()
    };
    let sizes = [1usize, 37, 500, 4095, 4097, 13];
    let mut version = 0u64;
    {
        let (log, _) = open(storage.clone(), folder.path(), config.clone());
        for round in 0..120 {
            let size = sizes[round % sizes.len()];
            let count = 1 + (round % 3) as u64;
            append_all(&log, 7, version + 1, count, size);
            version += count;
            wait_durable(&log, version);
            let found = read_versions(&log, 1);
            assert_eq!(found.len() as u64, version, "round {round}");
            assert!(found
                .iter()
                .enumerate()
                .all(|(i, (v, _))| *v == i as u64 + 1));
        }
    }
    let (log, seen) = open(storage, folder.path(), config);
    assert_eq!(seen, (1..=version).collect::<Vec<_>>());
    let mut out = Vec::new();
    let mut next = 1;
    while next <= version {
        out.clear();
        log.read(next, 1000, 1 << 20, &mut out).unwrap();
        for record in proto::frame::iter_records(&out) {
            let expected = vec![(record.header.version % 251) as u8; record.payload.len()];
            assert_eq!(
                record.payload,
                &expected[..],
                "version {}",
                record.header.version
            );
            next = record.header.version + 1;
        }
    }
}

#[test]
#[should_panic(
    expected = "a record is logged only in the stream and at the version its header names"
)]
fn a_record_whose_header_names_another_version_is_never_logged() {
    let folder = tempfile::tempdir().unwrap();
    let (log, _) = open(Arc::new(FileStorage), folder.path(), LogConfig::default());
    let _ = log.append(1, &encode(7, 2, b"misplaced"));
}

/// A record appended in two parts (its head, then a payload kept where it
/// came) is the same record, read back byte for byte and recovered on
/// open, as one appended whole; its size counts against the limit whole.
#[test]
fn a_record_appended_in_two_parts_reads_back_as_the_whole_record() {
    let parts_of = |version: u64, size: usize| {
        let whole = encode(7, version, &vec![version as u8; size]);
        let cut = whole.len() - size;
        (whole, cut)
    };
    for durability in [Durability::Sync, Durability::Memory] {
        let folder = tempfile::tempdir().unwrap();
        let storage: Arc<dyn Storage> = Arc::new(FileStorage);
        let config = LogConfig::with_durability(durability);
        let mut expected = Vec::new();
        {
            let (log, _) = open(storage.clone(), folder.path(), config.clone());
            for (version, size) in [(1, 5_000), (2, 10), (3, 70_000), (4, 4_096)] {
                let (whole, cut) = parts_of(version, size);
                let (head, rest) = whole.split_at(cut);
                if version == 2 {
                    log.append(version, &whole).unwrap();
                } else {
                    log.append_parts(version, head, rest).unwrap();
                }
                expected.extend_from_slice(&whole);
            }
            let limit = config.record_bytes_max();
            let (whole, cut) = parts_of(5, limit);
            let (head, rest) = whole.split_at(cut);
            assert_eq!(
                log.append_parts(5, head, rest),
                Err(wal::AppendError::TooLarge {
                    length: whole.len(),
                    limit
                })
            );
            wait_durable(&log, 4);
            let mut read = Vec::new();
            assert_eq!(log.read(1, 10, 1 << 20, &mut read).unwrap(), 4);
            assert_eq!(read, expected, "{durability:?}");
        }
        if durability == Durability::Sync {
            let (log, seen) = open(storage, folder.path(), config);
            assert_eq!(seen, [1, 2, 3, 4]);
            let mut read = Vec::new();
            assert_eq!(log.read(1, 10, 1 << 20, &mut read).unwrap(), 4);
            assert_eq!(read, expected);
        }
    }
}
