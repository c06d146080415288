//! The restart-time experiment: build a log of N records with a checkpoint
//! some records before its end, then time how long it takes to open with
//! and without the checkpoint. `benches/recovery.rs` runs it with
//! criterion; the tests run it with tiny parameters so it cannot rot.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use proto::{EventId, Record, RecordHeader};

use crate::{AppendError, Log, LogConfig, LogError, Storage};

/// The stream id the experiment's logs carry.
pub const EXPERIMENT_STREAM: u64 = 0x5eed;

/// Encodes onto `out` a record of `stream` at `version` with `payload`, as
/// the experiments and tests write them: epoch 1, client 1, session 1,
/// sequence `version`, no key, the given low-water mark.
pub fn encode_record(stream: u64, version: u64, low_water: u64, payload: &[u8], out: &mut Vec<u8>) {
    Record {
        header: RecordHeader {
            flags: 0,
            stream,
            version,
            epoch: 1,
            event: EventId {
                client: 1,
                session: 1,
                sequence: version,
            },
            low_water,
        },
        key: b"",
        payload,
    }
    .encode(out);
}

/// How long one open took and how much it scanned.
#[derive(Clone, Copy, Debug)]
pub struct RestartSample {
    pub elapsed: Duration,
    /// Records recovery scanned and replayed.
    pub records_visited: u64,
    /// The checkpoint recovery started from, if any.
    pub checkpoint: Option<u64>,
}

/// Writes `records` records of `payload_bytes` into a new log in `folder`,
/// with a checkpoint after `records - after_checkpoint` of them (none when
/// `after_checkpoint >= records`), and closes it.
pub fn build_log(
    storage: Arc<dyn Storage>,
    folder: &Path,
    config: LogConfig,
    records: u64,
    payload_bytes: usize,
    after_checkpoint: u64,
) -> Result<(), LogError> {
    let log = Log::open(storage, folder, EXPERIMENT_STREAM, config, &mut |_| {})?;
    let payload = vec![0x5a; payload_bytes];
    let through = records.saturating_sub(after_checkpoint);
    let mut bytes = Vec::new();
    for version in log.last_version() + 1..=records {
        bytes.clear();
        encode_record(EXPERIMENT_STREAM, version, version, &payload, &mut bytes);
        loop {
            match log.append(version, &bytes) {
                Ok(()) => break,
                Err(AppendError::Full) => std::thread::sleep(Duration::from_micros(50)),
                Err(error) => return Err(LogError::Checkpoint(error.to_string())),
            }
        }
        if version == through {
            wait_durable(&log, version)?;
            log.checkpoint(through, &through.to_le_bytes(), 0)?;
        }
    }
    wait_durable(&log, records)
}

fn wait_durable(log: &Log, version: u64) -> Result<(), LogError> {
    while log.durable_version() < version {
        if let Some(failure) = log.failure() {
            return Err(LogError::Checkpoint(failure.to_string()));
        }
        std::thread::sleep(Duration::from_micros(50));
    }
    Ok(())
}

/// Opens the log in `folder` and closes it again, timing the open: from
/// its newest checkpoint when `from_checkpoint`, else by a full scan.
pub fn time_open(
    storage: Arc<dyn Storage>,
    folder: &Path,
    config: LogConfig,
    from_checkpoint: bool,
) -> Result<RestartSample, LogError> {
    let mut records_visited = 0;
    let started = Instant::now();
    let (log, checkpoint) = if from_checkpoint {
        let (log, report) = Log::open_checkpointed(
            storage,
            folder,
            EXPERIMENT_STREAM,
            config,
            &mut |_| Ok(()),
            &mut |_| records_visited += 1,
        )?;
        (log, report.checkpoint)
    } else {
        let log = Log::open(storage, folder, EXPERIMENT_STREAM, config, &mut |_| {
            records_visited += 1
        })?;
        (log, None)
    };
    let elapsed = started.elapsed();
    drop(log);
    Ok(RestartSample {
        elapsed,
        records_visited,
        checkpoint,
    })
}
