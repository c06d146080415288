//! Streams, appends, deduplication and reading through the client library.

use client::{AckLevel, Client, ClientError, DurabilityConfig, ErrorCode};
use server::ServerConfig;

use crate::harness::TestServer;

#[tokio::test]
async fn streams_are_created_listed_opened_and_deleted_with_clear_errors() {
    let data = tempfile::tempdir().unwrap();
    let server = TestServer::start(ServerConfig::new(data.path())).await;
    let client = Client::connect(server.client_config()).await.unwrap();
    let created = client
        .create_stream("orders", DurabilityConfig::Sync)
        .await
        .unwrap();
    assert_eq!(created.name, "orders");
    assert_eq!(created.last_version, 0);
    let again = client
        .create_stream("orders", DurabilityConfig::Memory)
        .await;
    assert!(
        matches!(
            again,
            Err(ClientError::Server {
                code: ErrorCode::StreamExists,
                ..
            })
        ),
        "{again:?}"
    );
    let bad = client.create_stream("../etc", DurabilityConfig::Sync).await;
    assert!(
        matches!(
            bad,
            Err(ClientError::Server {
                code: ErrorCode::InvalidArgument,
                ..
            })
        ),
        "{bad:?}"
    );
    let small_pages = client
        .create_stream(
            "tiny",
            DurabilityConfig::Paged {
                pages: 2,
                page_size: 4096,
            },
        )
        .await;
    assert!(
        matches!(
            small_pages,
            Err(ClientError::Server {
                code: ErrorCode::InvalidArgument,
                ..
            })
        ),
        "{small_pages:?}"
    );
    assert_eq!(client.open_stream("orders").await.unwrap().id, created.id);
    let listed: Vec<String> = client
        .list_streams()
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(listed, vec!["orders".to_string()]);
    client.delete_stream("orders").await.unwrap();
    let gone = client.open_stream("orders").await;
    assert!(
        matches!(
            gone,
            Err(ClientError::Server {
                code: ErrorCode::UnknownStream,
                ..
            })
        ),
        "{gone:?}"
    );
    server.stop().await;
}

#[tokio::test]
async fn acknowledged_messages_get_dense_versions_and_are_read_back_in_order() {
    let data = tempfile::tempdir().unwrap();
    let server = TestServer::start(ServerConfig::new(data.path())).await;
    let client = Client::connect(server.client_config()).await.unwrap();
    for durability in [
        DurabilityConfig::Sync,
        DurabilityConfig::Memory,
        DurabilityConfig::Paged {
            pages: 2,
            page_size: 2 << 20,
        },
    ] {
        let name = format!("s{}", proto_name(durability));
        let stream = client.create_stream(&name, durability).await.unwrap();
        let mut producer = client.producer(stream.id);
        let mut pending = Vec::new();
        for number in 0..2000u32 {
            pending.push(
                producer
                    .submit(
                        &number.to_le_bytes(),
                        &vec![7u8; 100 + (number % 50) as usize],
                    )
                    .await
                    .unwrap(),
            );
        }
        for (index, ack) in pending.into_iter().enumerate() {
            let ack = ack.await.unwrap();
            assert_eq!(ack.version, index as u64 + 1);
            assert!(!ack.duplicate);
            let expected = if durability == DurabilityConfig::Sync {
                AckLevel::Synced
            } else {
                AckLevel::Memory
            };
            assert_eq!(ack.level, expected);
        }
        let mut subscription = client.subscribe(stream.id, 1).await.unwrap();
        for version in 1..=2000u64 {
            let record = subscription.next().await.unwrap().unwrap();
            assert_eq!(record.version, version);
            assert_eq!(record.key, ((version - 1) as u32).to_le_bytes());
            assert_eq!(record.payload.len(), 100 + ((version - 1) % 50) as usize);
        }
        let fetched = client.fetch(stream.id, 1500, 10).await.unwrap();
        assert_eq!(
            fetched.iter().map(|r| r.version).collect::<Vec<_>>(),
            (1500..1510).collect::<Vec<_>>()
        );
    }
    server.stop().await;
}

fn proto_name(durability: DurabilityConfig) -> &'static str {
    durability.parts().0
}

#[tokio::test]
async fn a_repeated_event_id_gets_the_original_version_and_the_duplicate_flag() {
    let data = tempfile::tempdir().unwrap();
    let server = TestServer::start(ServerConfig::new(data.path())).await;
    let client = Client::connect(server.client_config()).await.unwrap();
    let stream = client
        .create_stream("dedupe", DurabilityConfig::Sync)
        .await
        .unwrap();
    let mut first = client.producer_with_session(stream.id, 9, 1);
    let original = first.send(b"", b"hello").await.unwrap();
    let mut other = client.producer(stream.id);
    other.send(b"", b"someone else").await.unwrap();
    let mut retry = client.producer_with_session(stream.id, 9, 1);
    let answer = retry.send(b"", b"hello").await.unwrap();
    assert!(answer.duplicate);
    assert_eq!(answer.version, original.version);
    assert_eq!(
        client.fetch(stream.id, 1, 100).await.unwrap().len(),
        2,
        "the duplicate must not be logged"
    );
    server.stop().await;
}

#[tokio::test]
async fn a_message_over_the_limit_is_refused_and_the_connection_goes_on() {
    let data = tempfile::tempdir().unwrap();
    let mut config = ServerConfig::new(data.path());
    config.message_bytes_max = 1000;
    let server = TestServer::start(config).await;
    let client = Client::connect(server.client_config()).await.unwrap();
    let stream = client
        .create_stream("limits", DurabilityConfig::Sync)
        .await
        .unwrap();
    let mut producer = client.producer(stream.id);
    let refused = producer.send(b"", &[0; 1001]).await;
    assert!(
        matches!(
            refused,
            Err(ClientError::Server {
                code: ErrorCode::MessageTooLarge,
                ..
            })
        ),
        "{refused:?}"
    );
    let ack = producer.send(b"", &[0; 1000 - 3]).await.unwrap();
    assert_eq!(ack.version, 1);
    let unknown = client.producer(424242).send(b"", b"x").await;
    assert!(
        matches!(
            unknown,
            Err(ClientError::Server {
                code: ErrorCode::UnknownStream,
                ..
            })
        ),
        "{unknown:?}"
    );
    server.stop().await;
}

#[tokio::test]
async fn a_stream_recreated_right_after_its_delete_keeps_what_it_acknowledges() {
    let data = tempfile::tempdir().unwrap();
    let config = ServerConfig::new(data.path());
    let server = TestServer::start(config.clone()).await;
    let client = Client::connect(server.client_config()).await.unwrap();
    let old = client
        .create_stream("again", DurabilityConfig::Sync)
        .await
        .unwrap();
    let mut old_producer = client.producer(old.id);
    old_producer.send(b"", b"old").await.unwrap();
    client.delete_stream("again").await.unwrap();
    let refused = old_producer.send(b"", b"after delete").await;
    assert!(
        matches!(
            refused,
            Err(ClientError::Server {
                code: ErrorCode::UnknownStream,
                ..
            })
        ),
        "{refused:?}"
    );
    let new = client
        .create_stream("again", DurabilityConfig::Sync)
        .await
        .unwrap();
    assert_ne!(new.id, old.id);
    let mut producer = client.producer(new.id);
    for number in 0..10u8 {
        producer.send(b"", &[number]).await.unwrap();
    }
    let address = server.address;
    server.stop().await;
    let server = TestServer::start_at(config, address).await;
    let client = Client::connect(server.client_config()).await.unwrap();
    let reopened = client.open_stream("again").await.unwrap();
    assert_eq!(reopened.id, new.id);
    let records = client.fetch(new.id, 1, 100).await.unwrap();
    let payloads: Vec<Vec<u8>> = records.into_iter().map(|r| r.payload).collect();
    assert_eq!(payloads, (0..10u8).map(|n| vec![n]).collect::<Vec<_>>());
    server.stop().await;
}

#[tokio::test]
async fn a_connection_holds_a_bounded_number_of_subscriptions() {
    let data = tempfile::tempdir().unwrap();
    let mut config = ServerConfig::new(data.path());
    config.subscriptions_per_connection_max = 3;
    let server = TestServer::start(config).await;
    let client = Client::connect(server.client_config()).await.unwrap();
    let stream = client
        .create_stream("many", DurabilityConfig::Sync)
        .await
        .unwrap();
    client.producer(stream.id).send(b"", b"x").await.unwrap();
    let mut kept = Vec::new();
    for _ in 0..3 {
        let mut subscription = client.subscribe(stream.id, 1).await.unwrap();
        assert_eq!(subscription.next().await.unwrap().unwrap().version, 1);
        kept.push(subscription);
    }
    let mut refused = client.subscribe(stream.id, 1).await.unwrap();
    match refused.next().await {
        Some(Err(ClientError::Server {
            code: ErrorCode::Busy,
            message,
        })) => {
            assert!(message.contains("at most 3 subscriptions"), "{message}")
        }
        other => panic!("a fourth subscription was not refused: {other:?}"),
    }
    server.stop().await;
}

/// A replica that cannot be made when its stream is created (here a file
/// lies where its folder goes on server 3) is made once the cause is
/// gone, although nothing in the control plane's state changes: the
/// stream then acknowledges writes with all three replicas.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_could_not_be_made_is_made_once_it_can_without_a_new_placement() {
    use std::time::Duration;
    let folder = tempfile::tempdir().unwrap();
    let cluster = server::LocalCluster::start(3, folder.path(), |_| {})
        .await
        .unwrap();
    let streams = folder.path().join("server-3").join("streams");
    std::fs::create_dir_all(&streams).unwrap();
    let obstacle = streams.join("blocked");
    std::fs::write(&obstacle, b"in the way").unwrap();
    let (_client, info) =
        crate::harness::create_on_three(&cluster, "blocked", client::Protocol::OneHopAckClient)
            .await;
    let third = cluster.servers[2].state();
    assert_eq!(third.config.cluster.me, 3);
    let publisher = crate::harness::publisher(&info, 4, 200).await;
    let first = publisher.submit(b"", b"before").await.unwrap();
    // Every replica must hold a write before it is acknowledged: this
    // one waits for server 3's.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        third.stream_by_name("blocked").is_none(),
        "server 3 made its replica through the file in the way"
    );
    let before = cluster.servers[0].state().control_state().unwrap();
    std::fs::remove_file(&obstacle).unwrap();
    crate::harness::wait_until(Duration::from_secs(10), "server 3's replica", || {
        third.stream_by_name("blocked").is_some()
    })
    .await;
    let acked = tokio::time::timeout(Duration::from_secs(10), first)
        .await
        .expect("the write before the replica is acknowledged once it is made")
        .unwrap();
    assert_eq!(acked.version, 1);
    let second = publisher.submit(b"", b"after").await.unwrap();
    let acked = tokio::time::timeout(Duration::from_secs(10), second)
        .await
        .expect("a write after the replica is made is acknowledged")
        .unwrap();
    assert_eq!(acked.version, 2);
    let after = cluster.servers[0].state().control_state().unwrap();
    let placed = |state: &control::ControlState| {
        let placed = &state.streams["blocked"];
        (
            state.view,
            placed.replicas.clone(),
            placed.in_sync.clone(),
            placed.epoch,
        )
    };
    assert_eq!(
        placed(&before),
        placed(&after),
        "the replica was made again on a timer, not by a change of the placement"
    );
    drop(publisher);
    cluster.stop().await;
}
