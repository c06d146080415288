//! Failover on a three-server cluster in this process: the primary stops
//! (its heartbeats end), the control plane removes it in a new view, a
//! replica that holds every acknowledged version becomes primary in a new
//! epoch, and the publisher moves its messages there; the history checker
//! judges the surviving replicas. The kill loop with SIGKILL and restarts
//! of real processes is in the `bench` crate's tests.

use std::time::{Duration, Instant};

use checker::{Acked, ClientHistory, Sent};
use client::{Client, ClientConfig, Protocol, Publisher, PublisherConfig};
use proto::DurabilityConfig;
use server::LocalCluster;

use crate::replication::replica_log;

async fn failover(protocol: Protocol) {
    let folder = tempfile::tempdir().unwrap();
    let mut cluster = LocalCluster::start(3, folder.path(), |config| {
        config.cluster.heartbeat_interval = Duration::from_millis(50);
        config.cluster.suspect_timeout = Duration::from_millis(400);
        config.replication.gap_timeout_ms = 30;
    })
    .await
    .unwrap();
    let client = Client::connect(ClientConfig::new(cluster.address(1).to_string()))
        .await
        .unwrap();
    let name = format!("f-{protocol}");
    let info = client
        .create_stream_with(&name, DurabilityConfig::Sync, protocol, 3)
        .await
        .unwrap();
    let publisher = Publisher::connect(
        &info,
        PublisherConfig {
            window: 16,
            retry: Duration::from_millis(200),
            ..PublisherConfig::default()
        },
    )
    .await
    .unwrap();
    let mut history = ClientHistory::default();
    let mut pending = Vec::new();
    let mut stopped_at = None;
    for index in 0..600u64 {
        let body = format!("message {index}").into_bytes();
        let sent = publisher.submit(b"", &body).await.unwrap();
        history.sent.push(Sent {
            event: sent.event,
            digest: checker::digest(b"", &body),
        });
        pending.push(sent);
        if index == 200 {
            let primary = info.primary;
            let position = cluster
                .servers
                .iter()
                .position(|s| s.id == primary)
                .unwrap();
            cluster.servers.remove(position).stop().await;
            stopped_at = Some(Instant::now());
        }
        if index % 50 == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    let mut duplicates = 0;
    for sent in pending {
        let published = tokio::time::timeout(Duration::from_secs(30), sent)
            .await
            .unwrap_or_else(|_| panic!("{protocol}: a message is done within 30 s"))
            .expect("accepted");
        duplicates += u64::from(published.duplicate);
        history.acked.push(Acked {
            event: published.event,
            version: published.version,
            duplicate: published.duplicate,
        });
    }
    let recovered = stopped_at.unwrap().elapsed();
    let survivor = Client::connect(ClientConfig::new(cluster.servers[0].address.to_string()))
        .await
        .unwrap();
    let after = survivor.open_stream(&name).await.unwrap();
    assert_ne!(after.primary, info.primary, "{protocol}: a new primary");
    assert!(after.epoch > info.epoch, "{protocol}: a new epoch");
    assert_eq!(after.replicas.len(), 2, "{protocol}: the live replicas");
    let status: serde_json::Value =
        serde_json::from_str(&survivor.status().await.unwrap()).unwrap();
    let view = status["cluster"]["view"].as_u64().unwrap();
    assert!(view >= 4, "{protocol}: the stop made a new view: {status}");
    // Wait until both survivors commit everything, then judge their logs.
    let acknowledged = history.acked.iter().map(|a| a.version).max().unwrap();
    for server in &cluster.servers {
        let client = Client::connect(ClientConfig::new(server.address.to_string()))
            .await
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while client.open_stream(&name).await.unwrap().committed_version < acknowledged {
            assert!(
                Instant::now() < deadline,
                "{protocol}: server {} commits",
                server.id
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let data: Vec<(u32, std::path::PathBuf)> = cluster
        .servers
        .iter()
        .map(|s| (s.id, s.data.clone()))
        .collect();
    drop(publisher);
    cluster.stop().await;
    let logs: Vec<_> = data
        .iter()
        .map(|(id, folder)| replica_log(folder, &name, info.id, format!("server-{id}")))
        .collect();
    let report = checker::check(std::slice::from_ref(&history), &logs, None);
    assert!(report.is_clean(), "{protocol}: {report}");
    assert_eq!(report.acknowledged, 600, "{protocol}: {report}");
    eprintln!(
        "{protocol}: all 600 acknowledged {:.0} ms after the stop, {duplicates} as duplicates",
        recovered.as_secs_f64() * 1e3
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_protocol_fails_over_to_a_replica_with_every_acknowledged_version() {
    failover(Protocol::OneHopAckClient).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_other_versioned_protocol_fails_over_too() {
    for protocol in Protocol::ALL {
        if matches!(protocol, Protocol::OneHopAckClient | Protocol::Unversioned) {
            continue;
        }
        failover(protocol).await;
    }
}
