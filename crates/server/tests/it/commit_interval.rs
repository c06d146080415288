//! The output commit interval through real servers: a message is
//! acknowledged only after the boundary that follows its arrival, the
//! setting is fixed at creation, kept across a restart and reaches every
//! replica of a cluster.

use std::time::Duration;

use client::{
    Client, ClientError, DurabilityConfig, ErrorCode, Protocol, Publisher, PublisherConfig,
    StreamOptions,
};
use server::{now_ms, LocalCluster, ServerConfig};

use crate::harness::TestServer;

/// Long enough that a boundary is not crossed by chance between a submit
/// and the server's group commit, short enough for a quick test.
const INTERVAL_MS: u32 = 200;

fn options(commit_interval_ms: u32) -> StreamOptions {
    StreamOptions {
        commit_interval_ms,
        ..StreamOptions::new(DurabilityConfig::Sync)
    }
}

/// Sends `count` messages one at a time and checks each ack arrives in a
/// later interval than its submit (the server and this test share
/// `now_ms`'s clock), and within two intervals of it.
async fn assert_acks_wait_for_a_boundary(client: &Client, stream: u64, count: usize) {
    let mut producer = client.producer(stream);
    let interval = u64::from(INTERVAL_MS);
    for index in 0..count {
        let submitted = now_ms();
        let pending = producer.submit(b"", &[index as u8; 100]).await.unwrap();
        tokio::time::timeout(Duration::from_secs(5), pending)
            .await
            .expect("acked within 5 s")
            .unwrap();
        let acked = now_ms();
        assert!(
            acked / interval > submitted / interval,
            "message {index}: submitted at {submitted} ms, acked at {acked} ms, before the boundary"
        );
        assert!(
            acked - submitted < 2 * interval + 500,
            "message {index}: {} ms is far past its boundary",
            acked - submitted
        );
    }
}

#[tokio::test]
async fn acks_wait_for_the_next_boundary_and_the_interval_survives_a_restart() {
    let data = tempfile::tempdir().unwrap();
    let server = TestServer::start(ServerConfig::new(data.path())).await;
    let client = Client::connect(server.client_config()).await.unwrap();
    let info = client
        .create_stream_with_options("batched", &options(INTERVAL_MS))
        .await
        .unwrap();
    assert_eq!(info.commit_interval_ms, INTERVAL_MS);
    let plain = client
        .create_stream("plain", DurabilityConfig::Sync)
        .await
        .unwrap();
    assert_eq!(plain.commit_interval_ms, 0);
    assert_acks_wait_for_a_boundary(&client, info.id, 3).await;
    let listed = client.list_streams().await.unwrap();
    let intervals: Vec<(String, u32)> = listed
        .iter()
        .map(|s| (s.name.clone(), s.commit_interval_ms))
        .collect();
    assert_eq!(
        intervals,
        vec![
            ("batched".to_string(), INTERVAL_MS),
            ("plain".to_string(), 0)
        ]
    );
    drop(client);
    server.stop().await;

    let server = TestServer::start(ServerConfig::new(data.path())).await;
    let client = Client::connect(server.client_config()).await.unwrap();
    let reopened = client.open_stream("batched").await.unwrap();
    assert_eq!(reopened.commit_interval_ms, INTERVAL_MS);
    assert_eq!(
        reopened.committed_version, 3,
        "what was acked stays visible"
    );
    assert_acks_wait_for_a_boundary(&client, reopened.id, 2).await;
    drop(client);
    server.stop().await;
}

#[tokio::test]
async fn a_commit_interval_over_the_limit_is_refused() {
    let data = tempfile::tempdir().unwrap();
    let server = TestServer::start(ServerConfig::new(data.path())).await;
    let client = Client::connect(server.client_config()).await.unwrap();
    let refused = client
        .create_stream_with_options("slow", &options(10_001))
        .await;
    assert!(
        matches!(
            &refused,
            Err(ClientError::Server {
                code: ErrorCode::InvalidArgument,
                message,
            }) if message.contains("commit interval")
        ),
        "{refused:?}"
    );
    drop(client);
    server.stop().await;
}

#[tokio::test]
async fn every_replica_of_a_cluster_stream_acks_at_its_boundaries() {
    let folder = tempfile::tempdir().unwrap();
    let cluster = LocalCluster::start(3, folder.path(), |_| {}).await.unwrap();
    let client = Client::connect(client::ClientConfig::new(
        cluster.servers[0].address.to_string(),
    ))
    .await
    .unwrap();
    let options = StreamOptions {
        protocol: Protocol::OneHopAckClient,
        replicas: 3,
        ..options(INTERVAL_MS)
    };
    let info = client
        .create_stream_with_options("replicated", &options)
        .await
        .unwrap();
    assert_eq!(info.commit_interval_ms, INTERVAL_MS);
    let publisher = Publisher::connect(&info, PublisherConfig::default())
        .await
        .unwrap();
    let interval = u64::from(INTERVAL_MS);
    for index in 0..3u8 {
        let submitted = now_ms();
        let pending = publisher.submit(b"", &[index; 100]).await.unwrap();
        let published = tokio::time::timeout(Duration::from_secs(10), pending)
            .await
            .expect("done within 10 s")
            .unwrap();
        let acked = now_ms();
        assert_eq!(published.acks.len(), 3, "every replica acks");
        assert!(
            acked / interval > submitted / interval,
            "submitted at {submitted} ms, done at {acked} ms, before the boundary"
        );
    }
    for server in &cluster.servers {
        let stream = server.state().stream_by_name("replicated").unwrap();
        assert_eq!(stream.commit_interval_ms(), INTERVAL_MS);
    }
    drop(client);
    cluster.stop().await;
}
