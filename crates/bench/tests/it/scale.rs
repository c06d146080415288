//! `bench scale` with tiny parameters: three server processes, one and
//! three streams, one and two clients, two rounds.

use std::time::Duration;

use bench::scale::{self, ScaleArgs};

use crate::{assert_files, quiet_output, read_json, stamplog_binary};

#[test]
fn bench_scale_runs_every_count_of_streams_and_clients() {
    let folder = tempfile::tempdir().unwrap();
    let args = ScaleArgs {
        server_binary: Some(stamplog_binary()),
        streams: vec![1, 3],
        clients: vec![1, 2],
        messages: 300,
        window: 16,
        rounds: 2,
        disk_syncs: 10,
        output: quiet_output(folder.path()),
        ..ScaleArgs::default()
    };
    let figures = scale::run(args).unwrap();
    let counts: Vec<(usize, usize)> = figures
        .cells
        .iter()
        .map(|c| (c.streams, c.clients))
        .collect();
    assert_eq!(counts, [(1, 1), (1, 2), (3, 1), (3, 2)]);
    for cell in &figures.cells {
        assert_eq!(cell.messages, 300, "every message acknowledged: {cell:?}");
        assert_eq!(cell.latency.count, 300, "{cell:?}");
        assert!(cell.messages_per_second > 0.0 && cell.megabytes_per_second > 0.0);
        assert!(
            cell.cpu.servers >= 0.0 && cell.cpu.client >= 0.0,
            "{cell:?}"
        );
        assert_eq!(cell.round_rates.len(), 2, "{cell:?}");
        let least = cell.round_rates.iter().copied().fold(f64::MAX, f64::min);
        assert_eq!(
            cell.messages_per_second, least,
            "the lower median of two rounds: {cell:?}"
        );
        let of_one = cell.of_one_stream.expect("one stream was measured");
        if cell.streams == 1 {
            assert_eq!(of_one, 1.0, "{cell:?}");
        } else {
            let one = figures.cell(1, cell.clients).unwrap();
            let ratios: Vec<f64> = cell
                .round_rates
                .iter()
                .zip(&one.round_rates)
                .map(|(rate, one)| rate / one)
                .collect();
            let least = ratios.iter().copied().fold(f64::MAX, f64::min);
            assert_eq!(of_one, least, "paired by round: {cell:?} {one:?}");
        }
    }
    let json = read_json(&folder.path().join("figures.json"));
    let charged: f64 = figures.cells.iter().map(|c| c.cpu.servers).sum();
    assert!(charged > 0.0, "the servers were charged some CPU");
    for cell in &figures.cells {
        // Three replicas log every 1,000-byte payload with its record's
        // header: at least that much reaches the servers' files.
        let written = cell.disk_bytes_per_message.expect("the servers' io read");
        assert!(written >= 3_000.0, "disk bytes per message: {cell:?}");
    }
    assert!(
        json["cells"][0]["servers_disk_bytes_per_message"].as_f64() >= Some(3_000.0),
        "{json}"
    );
    let limits = figures.limits.as_ref().expect("the limits at the payload");
    assert_eq!(limits.payload, 1000);
    assert!(limits.disk.messages_per_second > 0.0 && limits.loopback.messages_per_second() > 0.0);
    assert_files(&folder.path().join("out"), &["scale.csv", "scale.png"]);
    assert_eq!(json["cells"].as_array().unwrap().len(), 4);
    assert_eq!(json["rounds"], 2);
    assert_eq!(
        json["cells"][3]["round_messages_per_second"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
}

/// `--durability memory` and `sender`: the same cell with streams that
/// keep no log, and with sender-based logging; every message
/// acknowledged, and the table says which durability.
#[test]
fn bench_scale_runs_memory_and_sender_streams() {
    use bench::replication::Durability;
    for (durability, name) in [
        (Durability::Memory, "memory"),
        (Durability::Sender, "sender"),
    ] {
        let folder = tempfile::tempdir().unwrap();
        let args = ScaleArgs {
            server_binary: Some(stamplog_binary()),
            streams: vec![3],
            clients: vec![2],
            messages: 300,
            window: 16,
            disk_syncs: 10,
            durability,
            output: quiet_output(folder.path()),
            ..ScaleArgs::default()
        };
        let figures = scale::run(args.clone()).unwrap();
        assert_eq!(figures.cells.len(), 1, "{name}");
        assert_eq!(
            figures.cells[0].messages, 300,
            "{name}: {:?}",
            figures.cells[0]
        );
        let table = scale::table(&figures, &args);
        let title = table.title();
        assert!(
            title.contains(&format!("{name} one-hop-ack-client")),
            "{title}"
        );
    }
}

/// `--connections publisher`: each publisher on connections of its own,
/// as before the clients shared theirs; every message acknowledged, and
/// the table says so.
#[test]
fn bench_scale_runs_with_a_connection_per_publisher() {
    let folder = tempfile::tempdir().unwrap();
    let args = ScaleArgs {
        server_binary: Some(stamplog_binary()),
        streams: vec![3],
        clients: vec![1],
        messages: 300,
        window: 16,
        disk_syncs: 10,
        connections: scale::Connections::Publisher,
        output: quiet_output(folder.path()),
        ..ScaleArgs::default()
    };
    let figures = scale::run(args.clone()).unwrap();
    assert_eq!(figures.cells.len(), 1);
    assert_eq!(figures.cells[0].messages, 300, "{:?}", figures.cells[0]);
    let table = scale::table(&figures, &args);
    assert!(
        table
            .title()
            .contains("connections of each publisher's own"),
        "{}",
        table.title()
    );
    let json = read_json(&folder.path().join("figures.json"));
    assert_eq!(json["connections"], "publisher");
}

#[test]
fn each_server_runs_with_the_runtime_workers_the_bench_gives_it() {
    use bench::process::{ClusterOptions, Servers, ServersAs};
    let folder = tempfile::tempdir().unwrap();
    let options = ClusterOptions {
        runtime_workers: Some(1),
        ..ClusterOptions::default()
    };
    let servers =
        bench::replication::spawn_cluster(&stamplog_binary(), 3, folder.path(), options).unwrap();
    let Servers::Processes(cluster) = &servers else {
        panic!("servers run as processes by default");
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    for id in 1..=3 {
        let admin = cluster.admin_address(id).unwrap();
        // The admin port opens just after the server says it listens.
        let metrics = runtime.block_on(async {
            for _ in 0..100 {
                let answer = server::observe::get(admin, "/metrics", Duration::from_secs(5)).await;
                if let Ok((200, body)) = answer {
                    return body;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            panic!("server {id}'s /metrics never answered");
        });
        assert!(
            metrics.contains("\nstamplog_runtime_workers 1.0\n"),
            "server {id}: {metrics}"
        );
    }
    servers.stop().unwrap();
    let threads = ClusterOptions {
        runtime_workers: Some(1),
        servers_as: ServersAs::Threads,
        ..ClusterOptions::default()
    };
    let refused = bench::replication::spawn_cluster(&stamplog_binary(), 3, folder.path(), threads)
        .err()
        .expect("refused")
        .to_string();
    assert!(refused.contains("--servers-as processes"), "{refused}");
}
