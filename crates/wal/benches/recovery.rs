//! Restart time against log length, with and without a checkpoint: a log
//! of N records, its checkpoint `AFTER` records before its end, opened by
//! a full scan and from the checkpoint. With the checkpoint the time
//! follows the records after it, not N.
//!
//! `cargo bench -p wal --bench recovery`; `STAMPLOG_RECOVERY_RECORDS=a,b,c`
//! sets the values of N (default 2000 and 20000, small so it runs in
//! seconds).

// A test stops at the first thing that is not as it expects.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use wal::experiment::{build_log, time_open};
use wal::{FileStorage, LogConfig, Storage};

/// Records appended after the checkpoint.
const AFTER: u64 = 500;
const PAYLOAD_BYTES: usize = 200;

fn record_counts() -> Vec<u64> {
    std::env::var("STAMPLOG_RECOVERY_RECORDS")
        .ok()
        .map(|text| {
            text.split(',')
                .map(|n| n.trim().parse().expect("a number of records"))
                .collect()
        })
        .unwrap_or_else(|| vec![2_000, 20_000])
}

fn restart_time(criterion: &mut Criterion) {
    let storage: Arc<dyn Storage> = Arc::new(FileStorage);
    let config = LogConfig {
        segment_bytes_max: 1024 * 1024,
        ..LogConfig::default()
    };
    let mut group = criterion.benchmark_group("restart");
    group.sample_size(10);
    for records in record_counts() {
        let folder = tempfile::tempdir().expect("a temporary folder");
        build_log(
            storage.clone(),
            folder.path(),
            config.clone(),
            records,
            PAYLOAD_BYTES,
            AFTER,
        )
        .expect("the log is built");
        for from_checkpoint in [false, true] {
            let name = if from_checkpoint {
                "from a checkpoint"
            } else {
                "full scan"
            };
            group.bench_with_input(BenchmarkId::new(name, records), &records, |bench, _| {
                // Only the open is timed, not the close that follows it.
                bench.iter_custom(|iterations| {
                    let mut total = Duration::ZERO;
                    for _ in 0..iterations {
                        let sample = time_open(
                            storage.clone(),
                            folder.path(),
                            config.clone(),
                            from_checkpoint,
                        )
                        .expect("the log opens");
                        let expected = if from_checkpoint { AFTER } else { records };
                        assert_eq!(sample.records_visited, expected);
                        total += sample.elapsed;
                    }
                    total
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, restart_time);
criterion_main!(benches);
