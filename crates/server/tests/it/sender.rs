//! Sender-based logging through a real server: the publisher is done when
//! it holds the version, it drops its copies once the primary's checkpoint
//! covers them, readers see every message in order, and the protocols it
//! does not fit are refused at creation.

use std::time::Duration;

use client::{
    Client, ClientError, DurabilityConfig, ErrorCode, Protocol, Publisher, PublisherConfig,
    StreamOptions,
};
use server::ServerConfig;

use crate::harness::TestServer;

fn sender_options(protocol: Protocol) -> StreamOptions {
    StreamOptions {
        protocol,
        ..StreamOptions::new(DurabilityConfig::Sender {
            pages: 2,
            page_size: 4 << 20,
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publisher_drops_its_copies_once_a_checkpoint_covers_them() {
    const MESSAGES: u64 = 500;
    let data = tempfile::tempdir().unwrap();
    let mut config = ServerConfig::new(data.path());
    config.sender_checkpoint_interval = Duration::from_millis(100);
    let server = TestServer::start(config).await;
    let client = Client::connect(server.client_config()).await.unwrap();
    let info = client
        .create_stream_with_options("held", &sender_options(Protocol::OneHopAckClient))
        .await
        .unwrap();
    let publisher = Publisher::connect(&info, PublisherConfig::default())
        .await
        .unwrap();
    let mut pending = Vec::new();
    for index in 0..MESSAGES {
        pending.push(publisher.submit(b"", &index.to_le_bytes()).await.unwrap());
    }
    for (index, answer) in pending.into_iter().enumerate() {
        let published = answer.await.unwrap();
        assert_eq!(published.version, index as u64 + 1);
    }
    let (held, bytes) = publisher.held();
    assert!(held > 0 && bytes >= 8 * held, "kept after done: {held}");
    // The next checkpoints cover every version: the copies go.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while publisher.held().0 > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "still holding {:?} after 20 s",
            publisher.held()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let stream = server.state.stream_by_name("held").unwrap();
    assert!(stream.checkpointed() >= MESSAGES);
    let mut subscription = client.subscribe(info.id, 1).await.unwrap();
    for version in 1..=MESSAGES {
        let record = tokio::time::timeout(Duration::from_secs(10), subscription.next())
            .await
            .expect("delivered within 10 s")
            .unwrap()
            .unwrap();
        assert_eq!(record.version, version);
        assert_eq!(record.payload, (version - 1).to_le_bytes());
    }
    let status: serde_json::Value = serde_json::from_str(&client.status().await.unwrap()).unwrap();
    let streams = status["streams"].as_array().unwrap();
    let held_stream = streams.iter().find(|s| s["name"] == "held").unwrap();
    assert_eq!(held_stream["replication"]["awaiting_confirmation"], 0);
    drop(subscription);
    drop(publisher);
    drop(client);
    server.stop().await;
}

#[tokio::test]
async fn sender_logging_is_refused_where_the_client_sends_to_every_replica() {
    let data = tempfile::tempdir().unwrap();
    let server = TestServer::start(ServerConfig::new(data.path())).await;
    let client = Client::connect(server.client_config()).await.unwrap();
    for protocol in [
        Protocol::Unversioned,
        Protocol::VersionRequest,
        Protocol::ReturnsVersion,
        Protocol::BroadcastTag,
        Protocol::ClientAsync,
        Protocol::ClientSync,
        Protocol::Hybrid,
    ] {
        let name = format!("refused-{protocol}");
        match client
            .create_stream_with_options(&name, &sender_options(protocol))
            .await
        {
            Err(ClientError::Server { code, message }) => {
                assert_eq!(code, ErrorCode::InvalidArgument, "{protocol}: {message}");
                assert!(message.contains("durability sender"), "{message}");
            }
            other => panic!("{protocol}: {other:?}"),
        }
    }
    for protocol in [
        Protocol::OneHop,
        Protocol::OneHopAckClient,
        Protocol::ServerAsync,
        Protocol::ServerSync,
    ] {
        let name = format!("taken-{protocol}");
        client
            .create_stream_with_options(&name, &sender_options(protocol))
            .await
            .unwrap_or_else(|e| panic!("{protocol}: {e}"));
    }
    drop(client);
    server.stop().await;
}
