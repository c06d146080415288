//! Publishers sharing one connection per server (`PublisherLinks`) on a
//! cluster of three `stamplog server` processes: six `sync` streams,
//! R = 3, written through three connections; the server that leads some
//! of them killed with SIGKILL with messages in flight and started again;
//! every message acknowledged, the history checker clean on every stream,
//! and the links closed once the last publisher is gone.

use std::time::{Duration, Instant};

use bench::process::ProcessCluster;
use client::{Client, DurabilityConfig, Protocol, Publisher, PublisherLinks};

use crate::journal::Streams;
use crate::stamplog_binary;

const STREAMS: usize = 6;
const ROUND: u64 = 150;

/// Creates stream `name` through server 1, retrying while the cluster
/// agrees its first view.
async fn create(client: &Client, name: &str) -> client::StreamInfo {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let created = client
            .create_stream_with(name, DurabilityConfig::Sync, Protocol::OneHopAckClient, 3)
            .await;
        match created {
            Ok(info) => return info,
            Err(error) if Instant::now() > deadline => panic!("cannot create {name}: {error}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

#[test]
fn publishers_sharing_connections_lose_nothing_when_a_server_is_killed_and_restarted() {
    let folder = tempfile::tempdir().unwrap();
    let mut cluster = ProcessCluster::start(&stamplog_binary(), folder.path(), 3, &[]).unwrap();
    let runtime = crate::two_worker_runtime();
    let config = cluster.publisher_config(64).unwrap();
    let links = PublisherLinks::new(&config);
    let mut streams = runtime.block_on(async {
        let client = Client::connect(cluster.client_config(1).unwrap())
            .await
            .unwrap();
        let mut streams = Streams::new(STREAMS);
        for index in 0..STREAMS {
            let info = create(&client, &format!("shared-{index}")).await;
            let publisher = Publisher::connect_over(&links, &info, config.clone())
                .await
                .unwrap();
            streams.publishers.push(publisher);
            streams.infos.push(info);
        }
        streams.submit(0, ROUND).await;
        streams.settle().await;
        streams.submit(ROUND, 2 * ROUND).await;
        streams
    });
    assert_eq!(links.servers(), 3, "one connection per server: {links:?}");
    let led_by_1 = streams.infos.iter().filter(|i| i.primary == 1).count();
    assert!(led_by_1 > 0, "server 1 leads some streams");
    cluster.kill(1).unwrap();
    runtime.block_on(async {
        // Acknowledged by the other two once the streams server 1 led
        // fail over.
        streams.settle().await;
        streams.submit(2 * ROUND, 3 * ROUND).await;
        streams.settle().await;
    });
    cluster.start_server(1).unwrap();
    runtime.block_on(async {
        // The link to server 1 comes back for every stream.
        streams.submit(3 * ROUND, 4 * ROUND).await;
        streams.settle().await;
        let credentials = cluster.credentials().unwrap();
        let replicas: Vec<(u32, String)> = [2, 3]
            .into_iter()
            .map(|id| (id, cluster.address(id).to_string()))
            .collect();
        for (info, history) in streams.infos.iter().zip(&streams.histories) {
            assert_eq!(history.acked.len() as u64, 4 * ROUND, "{}", info.name);
            let (report, _) = bench::failover::read_logs(
                &replicas,
                info,
                std::slice::from_ref(history),
                &credentials,
            )
            .await
            .unwrap();
            assert!(report.is_clean(), "stream {}: {report}", info.name);
        }
        assert_eq!(links.servers(), 3, "{links:?}");
        // Dropped and done, each publisher leaves; the last one out of a
        // link closes it.
        streams.publishers.clear();
        let deadline = Instant::now() + Duration::from_secs(10);
        while links.servers() > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(links.servers(), 0, "{links:?}");
    });
}
