//! `bench patterns` with tiny parameters against a real `stamplog cluster`
//! child process.

use bench::patterns::{self, PatternsArgs};
use bench::replication::Durability;
use client::Protocol;

use crate::{assert_files, quiet_output, read_json, stamplog_binary};

#[test]
fn patterns_with_tiny_parameters_completes_every_cell_and_writes_its_files() {
    let folder = tempfile::tempdir().unwrap();
    let args = PatternsArgs {
        server_binary: Some(stamplog_binary()),
        messages: 200,
        payloads: vec![100, 1000],
        durability: vec![Durability::Sync, Durability::Memory],
        patterns: Protocol::PATTERNS.to_vec(),
        window: 32,
        warmup: Some(30),
        retry_ms: 2000,
        latency_messages: 50,
        latency_payload: 1000,
        disk_syncs: 20,
        // Secure, as `stamplog cluster` runs by default: every pattern
        // over TLS links with the admin token.
        tls: true,
        // The servers' admin ports and metrics off: the paired runs'
        // other side must work too.
        admin: false,
        // And each log syncing alone, without the servers' journals: the
        // other side of a journal pair (every other experiment's test
        // runs with them).
        journal: false,
        // Each server its own process, as deployed (and by default).
        servers_as: bench::process::ServersAs::Processes,
        // One runtime worker per server, as for servers sharing cores.
        server_workers: Some(1),
        // A small neighbour on the disk, and one on the CPU, for the
        // whole run.
        disk_neighbour: vec![4096],
        cpu_neighbour: 1,
        output: quiet_output(folder.path()),
    };
    let figures = patterns::run(args).unwrap();
    assert_eq!(figures.disk_neighbour, vec![4096]);
    assert!(figures.neighbours.writes > 0, "the neighbour wrote");
    assert_eq!(figures.cpu_neighbour, 1);
    let work = figures.neighbours;
    assert!(
        work.cpu > std::time::Duration::ZERO && work.cpu_wall > std::time::Duration::ZERO,
        "the CPU neighbour used the CPU for the run: {work:?}"
    );
    assert_eq!(figures.cells.len(), 2 * 2 * 6);
    for cell in &figures.cells {
        assert_eq!(cell.messages, 200, "{cell:?}");
        assert_eq!(cell.latency.count, 200, "{cell:?}");
        assert!(cell.settled, "every replica logged every message: {cell:?}");
        assert!(cell.seconds > 0.0 && cell.messages_per_second > 0.0);
        assert!(cell.megabytes_per_second > 0.0 && cell.seconds_per_million() > 0.0);
        match cell.durability {
            Durability::Sync => {
                assert!(cell.records_per_sync.unwrap() >= 1.0, "{cell:?}");
                assert!(cell.record_bytes.unwrap() > cell.payload as f64, "{cell:?}");
                // Three replicas log every payload.
                let written = cell.disk_bytes_per_message.expect("the servers' io read");
                assert!(written >= 3.0 * cell.payload as f64, "{cell:?}");
                let memory = figures.cells.iter().find(|c| {
                    c.durability == Durability::Memory
                        && c.payload == cell.payload
                        && c.pattern == cell.pattern
                });
                let memory = memory
                    .and_then(|c| c.disk_bytes_per_message)
                    .expect("the memory cell's io read");
                assert!(memory < written, "memory {memory}: {cell:?}");
            }
            Durability::Memory | Durability::Sender => {
                assert!(cell.records_per_sync.is_none())
            }
        }
    }
    // Separate processes: each role's CPU is its own. 200 messages take a
    // few ticks of 10 ms in all, so only the sum over the cells must show.
    for cell in &figures.cells {
        let cpu = cell.cpu;
        assert!(cpu.primary.is_some() && cpu.backup.is_some(), "{cell:?}");
        let roles = cpu.primary.unwrap() + 2.0 * cpu.backup.unwrap();
        assert!(
            (roles - cpu.servers).abs() < 1e-6 * cpu.servers.max(1.0),
            "{cell:?}"
        );
    }
    let charged: f64 = figures
        .cells
        .iter()
        .map(|c| c.cpu.servers + c.cpu.client)
        .sum();
    assert!(
        charged > 0.0,
        "no CPU charged over {} cells",
        figures.cells.len()
    );
    assert_eq!(figures.headline_payload, 1000);
    let headline = figures
        .headline()
        .expect("the 1 KB sync one-hop-ack-client cell");
    assert!(headline.messages_per_second > 0.0);
    let fastest = figures.fastest_versioned(Durability::Sync, 1000).unwrap();
    assert_ne!(fastest.pattern, Protocol::Unversioned);

    let disk = figures.disk().expect("a sync one-hop-ack-client cell ran");
    assert_eq!(disk.writers, 3);
    assert_eq!(disk.sync_latency.count, 3 * 20);
    assert!(
        disk.batch_bytes > 1000 && disk.messages_per_second > 0.0,
        "{disk:?}"
    );

    // The disk's and the loopback's limits beside every payload's figure.
    let payloads: Vec<usize> = figures.limits.iter().map(|l| l.payload).collect();
    assert_eq!(payloads, [100, 1000]);
    for limit in &figures.limits {
        assert_eq!(limit.disk.writers, 3);
        assert_eq!(limit.loopback.connections, 3);
        assert!(limit.loopback.messages_per_second() > 0.0, "{limit:?}");
        assert!(limit.disk.messages_per_second > 0.0, "{limit:?}");
    }

    let one = &figures.window_one;
    assert_eq!(one.ack.count, 50);
    assert_eq!(one.fdatasync.count, 50);
    assert_eq!(one.fdatasync_appending.count, 50);
    assert_eq!(one.fdatasync_replicas.count, 50);
    assert!(one.fdatasync_replicas.p50 > 0.0);
    assert!(one.ack.p50 > 0.0 && one.fdatasync.p50 > 0.0);
    assert!(one.median_ratio().is_finite() && one.median_ratio() > 0.0);
    // The tails: the ack's over its median, beside the flow's floor's.
    assert_eq!(one.floor.count, 50);
    assert!(one.tail_ratio() >= 1.0, "{:?}", one.ack);
    assert!(one.floor_tail_ratio() >= 1.0, "{:?}", one.floor);
    // The servers' segments found, and apart where the file system can
    // spread their folders (ext4, as here), as on hosts of their own.
    let probe = tempfile::tempdir_in(folder.path()).unwrap();
    let spread = bench::process::spread_subfolders(probe.path()).unwrap();
    let blocks = one
        .segment_inode_blocks
        .expect("the servers' segments found");
    assert!((1..=3).contains(&blocks), "{blocks}");
    if spread {
        assert_eq!(blocks, 3, "three servers, three inode-table blocks");
    }

    // Seed 001's shape: a row per payload, a column per pattern.
    let seconds = patterns::seconds_table(&figures, Durability::Sync);
    assert_eq!(seconds.rows().len(), 2);
    assert_eq!(seconds.columns().len(), 1 + 6);
    assert_eq!(seconds.columns()[1], "unversioned");
    assert_eq!(seconds.rows()[1][0], "1KB");
    assert!(
        seconds.title().contains("200 messages"),
        "{}",
        seconds.title()
    );
    let limits = patterns::limits_table(&figures);
    let measures: Vec<&str> = limits.rows().iter().map(|r| r[0].as_str()).collect();
    for expected in [
        "one-hop-ack-client msgs/s",
        "one-hop-ack-client / fastest versioned",
        "one-hop-ack-client / disk limit",
        "ack p50 / fdatasync p50",
        "ack p99 / ack p50",
        "floor p99 / floor p50 (the flow's own tail here)",
    ] {
        assert!(
            measures.contains(&expected),
            "{expected} missing: {measures:?}"
        );
    }

    let out = folder.path().join("out");
    assert_files(
        &out,
        &[
            "patterns-sync-seconds.csv",
            "patterns-sync-mbps.csv",
            "patterns-memory-seconds.csv",
            "patterns-memory-mbps.csv",
            "patterns-limits.csv",
            "patterns-limits-per-payload.csv",
            "patterns-cells.csv",
            "patterns-sync.png",
            "patterns-memory.png",
            "patterns-latency.png",
            "patterns-window-one.csv",
        ],
    );
    // Every window-1 message in order, with what was timed after it.
    let samples = std::fs::read_to_string(out.join("patterns-window-one.csv")).unwrap();
    let mut lines = samples.lines();
    assert_eq!(
        lines.next().unwrap(),
        "message,ack,floor,runtime floor,bare write + fdatasync,3 at once"
    );
    let rows: Vec<Vec<f64>> = lines
        .map(|line| line.split(',').map(|cell| cell.parse().unwrap()).collect())
        .collect();
    assert_eq!(rows.len(), 50);
    for (index, row) in rows.iter().enumerate() {
        assert_eq!(row[0], (index + 1) as f64, "{row:?}");
        assert!(row[1..].iter().all(|us| *us > 0.0), "{row:?}");
    }
    for (row, ack) in rows.iter().zip(&one.ack_samples) {
        assert!((row[1] - ack).abs() <= 0.5, "{row:?} against {ack}");
    }
    let json = read_json(&folder.path().join("figures.json"));
    assert_eq!(json["cells"].as_array().unwrap().len(), 24);
    assert_eq!(json["window_one"]["ack_latency_us"]["count"], 50);
    assert!(
        json["window_one"]["floor_p99_over_median"]
            .as_f64()
            .unwrap()
            >= 1.0
    );
}
