//! The restart-time experiment with tiny parameters, so it cannot rot.

use std::sync::Arc;

use wal::experiment::{build_log, time_open};
use wal::{FileStorage, LogConfig, Storage};

#[test]
fn the_restart_experiment_replays_only_the_records_after_the_checkpoint() {
    let folder = tempfile::tempdir().unwrap();
    let storage: Arc<dyn Storage> = Arc::new(FileStorage);
    let config = LogConfig {
        segment_bytes_max: 16 * 1024,
        ..LogConfig::default()
    };
    build_log(storage.clone(), folder.path(), config.clone(), 400, 100, 30).unwrap();
    let full = time_open(storage.clone(), folder.path(), config.clone(), false).unwrap();
    assert_eq!(full.records_visited, 400);
    assert_eq!(full.checkpoint, None);
    let fast = time_open(storage, folder.path(), config, true).unwrap();
    assert_eq!(fast.records_visited, 30);
    assert_eq!(fast.checkpoint, Some(370));
}
