//! Records written in place (`wal::write_here`) by several threads at once,
//! beside the journal's rounds of the same log, under crash images taken
//! at any moment: every image recovers, dense from version 1, with every
//! version that was durable before it was taken.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use proto::Record;
use wal::fault::{CrashMode, FaultStorage};
use wal::{Journal, JournalConfig, Log, LogConfig, Storage};

use crate::basics::encode;
use crate::crash::{append, assert_prefix, payload, sync_config, Recovered};

const STREAM: u64 = 7;

fn folder() -> &'static std::path::Path {
    std::path::Path::new("/data/streams/s/log")
}

fn open(
    storage: &FaultStorage,
    segment_bytes: u64,
) -> Result<(Arc<Journal>, Log, Recovered), String> {
    let (journal, _) = Journal::open(
        Arc::new(storage.clone()),
        std::path::Path::new("/data"),
        JournalConfig {
            bytes_max: 1 << 20,
            ..JournalConfig::default()
        },
    )
    .map_err(|error| format!("redo failed: {error}"))?;
    let journal = Arc::new(journal);
    let config = LogConfig {
        journal: Some(Arc::clone(&journal)),
        ..sync_config(segment_bytes)
    };
    let mut seen = Vec::new();
    let log = Log::open(
        Arc::new(storage.clone()) as Arc<dyn Storage>,
        folder(),
        STREAM,
        config,
        &mut |record: &Record<'_>| seen.push((record.header.version, record.payload.to_vec())),
    )
    .map_err(|error| format!("the log does not open: {error}"))?;
    Ok((journal, log, seen))
}

/// The size of record `version`'s payload: mostly small, some empty, one
/// in eight from 4 to 39 KB, so that batches past the journal's
/// direct-write size come too.
fn size(version: u64) -> usize {
    let pick = version.wrapping_mul(0x9E37_79B9) >> 7;
    match pick % 8 {
        0 => 4_000 + (pick / 20 % 35_000) as usize,
        1..=3 => 0,
        _ => 1 + (pick / 20 % 600) as usize,
    }
}

#[test]
fn records_written_in_place_by_many_threads_survive_every_crash_image() {
    for segment_bytes in [4096 * 3, 64 * 1024] {
        let storage = FaultStorage::new();
        let (journal, log, _) = open(&storage, segment_bytes).unwrap();
        // The payloads by version, under the lock that orders the
        // appends (a stream's lock in the server).
        let payloads: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
        let log = Arc::new(log);
        let highest = Arc::new(std::sync::atomic::AtomicU64::new(0));
        {
            // The durable hook takes the same lock, as a stream's does.
            let payloads = Arc::clone(&payloads);
            let highest = Arc::clone(&highest);
            log.on_durable(move |durable, _| {
                drop(payloads.lock().unwrap());
                let before = highest.fetch_max(durable, Ordering::SeqCst);
                assert!(
                    before <= durable,
                    "durable went back from {before} to {durable}"
                );
                true
            });
        }
        let stop = Arc::new(AtomicBool::new(false));
        let mut images = Vec::new();
        std::thread::scope(|scope| {
            for thread in 0..3u64 {
                let (log, payloads, stop) = (&log, &payloads, &stop);
                scope.spawn(move || {
                    let mut round = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        round += 1;
                        let burst = 1 + (round + thread) % 3;
                        let mut last = 0;
                        let mut work = || {
                            for _ in 0..burst {
                                let mut payloads = payloads.lock().unwrap();
                                let version = payloads.len() as u64 + 1;
                                let bytes = payload(version, size(version));
                                append(log, version, &encode(STREAM, version, &bytes)).unwrap();
                                payloads.push(bytes);
                                last = version;
                            }
                        };
                        if (round + thread).is_multiple_of(4) {
                            work();
                        } else {
                            wal::write_here(work);
                        }
                        if round.is_multiple_of(2) {
                            let deadline = std::time::Instant::now() + Duration::from_secs(10);
                            while log.durable_version() < last {
                                assert!(std::time::Instant::now() < deadline, "never durable");
                                std::thread::yield_now();
                            }
                        }
                    }
                });
            }
            for seed in 0..120u64 {
                std::thread::sleep(Duration::from_micros(50 + seed % 7 * 60));
                let acknowledged = log.durable_version();
                let mode = if seed.is_multiple_of(2) {
                    CrashMode::DurableOnly
                } else {
                    CrashMode::TornTail
                };
                images.push((seed, mode, acknowledged, storage.crash(mode, seed)));
            }
            stop.store(true, Ordering::Relaxed);
        });
        let payloads = payloads.lock().unwrap().clone();
        let metrics = journal.metrics();
        for (seed, mode, acknowledged, image) in images {
            let context = format!(
                "segments of {segment_bytes} bytes, image {seed} ({mode:?}), acknowledged {acknowledged}"
            );
            let (_, _, seen) =
                open(&image, segment_bytes).unwrap_or_else(|e| panic!("{context}: {e}"));
            assert_prefix(&seen, &payloads, acknowledged, &context);
        }
        println!(
            "segments of {segment_bytes} bytes: {} records, {metrics:?}",
            payloads.len()
        );
        assert!(metrics.in_place_writes > 0, "{metrics:?}");
        assert_eq!(
            metrics.rounds, 0,
            "a log alone never shares a round with itself: {metrics:?}"
        );
    }
}
