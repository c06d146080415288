//! `bench duplication` with tiny parameters against a real `stamplog
//! cluster` child process.

use bench::duplication::{self, DuplicationArgs, Variant};
use bench::replication::Durability;
use client::Protocol;

use crate::{assert_files, quiet_output, read_json, stamplog_binary};

#[test]
fn duplication_with_tiny_parameters_completes_every_run_and_writes_its_files() {
    let folder = tempfile::tempdir().unwrap();
    let args = DuplicationArgs {
        server_binary: Some(stamplog_binary()),
        servers: 4,
        replicas: 2,
        streams: 2,
        clients: vec![1, 2],
        protocols: Protocol::DUPLICATION.to_vec(),
        messages: 200,
        payload: 1000,
        durability: Durability::Sync,
        window: 32,
        retry_ms: 2000,
        // The servers as threads of one process: the way kept for
        // comparison must work too.
        servers_as: bench::process::ServersAs::Threads,
        output: quiet_output(folder.path()),
    };
    let figures = duplication::run(args).unwrap();
    assert_eq!(figures.cells.len(), 2 * 6);
    for cell in &figures.cells {
        assert_eq!(cell.messages, cell.clients * 200, "{cell:?}");
        assert_eq!(cell.latency.count, cell.clients * 200, "{cell:?}");
        assert!(cell.settled, "every replica logged every message: {cell:?}");
        assert!(cell.messages_per_second > 0.0 && cell.megabytes_per_second > 0.0);
        let percent = cell.percent_of_baseline.expect("a baseline at every count");
        assert!(percent > 0.0, "{cell:?}");
        if cell.variant == Variant::NoDuplication {
            assert!((percent - 100.0).abs() < 1e-9);
        }
        let hybrid = cell.variant == Variant::Duplicated(Protocol::Hybrid);
        assert_eq!(cell.hybrid_mode.is_some(), hybrid, "{cell:?}");
    }
    // Two replicas outnumber one client: the hybrid runs server-sync.
    let single = figures
        .cell(1, Variant::Duplicated(Protocol::Hybrid))
        .unwrap();
    assert_eq!(single.hybrid_mode.as_deref(), Some("server-sync"));

    // Seed 002's Table II shape: a row per protocol, MB/s and % per count.
    let table = duplication::ratio_table(&figures);
    let labels: Vec<&str> = table.rows().iter().map(|r| r[0].as_str()).collect();
    assert_eq!(
        labels,
        [
            "no duplication",
            "server-async",
            "server-sync",
            "client-async",
            "client-sync",
            "hybrid"
        ]
    );
    assert_eq!(table.columns().len(), 1 + 2 * 2);
    assert_eq!(table.rows()[0][2], "100");

    let out = folder.path().join("out");
    assert_files(
        &out,
        &[
            "duplication.csv",
            "duplication-ratio.csv",
            "duplication.png",
            "duplication-ratio.png",
        ],
    );
    let json = read_json(&folder.path().join("figures.json"));
    assert_eq!(json["cells"].as_array().unwrap().len(), 12);
}
