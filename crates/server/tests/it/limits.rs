//! Each connection's bounds, driven past: replicated writes in flight and
//! their bytes (answered `Busy`, and retried by the client library with
//! nothing lost under every protocol), and appends in flight (the server
//! stops reading). The bounds on connections per address and on
//! subscriptions are driven past in `security` and `streams`.

use std::time::Duration;

use client::{Client, ClientConfig, Protocol};
use proto::{DurabilityConfig, ErrorCode, Frame, SubmitFields};
use server::{LocalCluster, ServerConfig};
use tokio::io::AsyncWriteExt;
use wal::fault::FaultStorage;

use crate::harness::{fault_config, raw_hello, read_frames, TestServer};
use crate::replication::{judge, write};

/// `count` replicated writes of `size` bytes, sequences from `first`, as
/// one buffer: the server reads them all before any can be acknowledged.
fn submits(stream: u64, first: u64, count: u64, size: usize) -> Vec<u8> {
    let mut bytes = Vec::new();
    for sequence in first..first + count {
        let fields = SubmitFields {
            stream,
            kind: proto::frame::SUBMIT_WRITE,
            version: 0,
            epoch: 0,
            session: 1,
            sequence,
            low_water: first,
        };
        fields.encode(&mut bytes, b"", &vec![sequence as u8; size]);
    }
    bytes
}

/// Reads answers until `count` writes are answered: (acknowledged
/// sequences, sequences refused with `Busy` and their messages).
async fn answers(socket: &mut tokio::net::TcpStream, count: usize) -> (Vec<u64>, Vec<String>) {
    let (mut acked, mut busy) = (Vec::new(), Vec::new());
    while acked.len() + busy.len() < count {
        let (frames, closed) = read_frames(socket, 1, Duration::from_secs(10)).await;
        assert!(
            !closed && !frames.is_empty(),
            "answers so far {acked:?} {busy:?}"
        );
        for frame in frames {
            match frame {
                Frame::Acked { sequence, more, .. } => {
                    acked.extend(sequence..=sequence + u64::from(more));
                }
                Frame::Refused { code, message, .. } => {
                    assert_eq!(code, ErrorCode::Busy, "{message}");
                    busy.push(message);
                }
                other => panic!("unexpected answer {other:?}"),
            }
        }
    }
    (acked, busy)
}

/// A server configured by `configure` with one `sync` stream, its id,
/// and the in-memory disk under it (whose syncs a test can hold, so that
/// nothing is acknowledged while it drives past a bound).
async fn one_stream_server(
    configure: impl Fn(&mut ServerConfig),
) -> (TestServer, u64, FaultStorage) {
    let storage = FaultStorage::new();
    let mut config = fault_config(&storage);
    configure(&mut config);
    let server = TestServer::start(config).await;
    let client = Client::connect(server.client_config()).await.unwrap();
    let stream = client
        .create_stream("bounded", DurabilityConfig::Sync)
        .await
        .unwrap();
    (server, stream.id, storage)
}

#[tokio::test]
async fn writes_past_a_connections_bound_in_flight_are_answered_busy() {
    let (server, stream, storage) =
        one_stream_server(|config| config.in_flight_per_connection_max = 4).await;
    let mut socket = raw_hello(server.address).await;
    storage.hold_syncs();
    socket.write_all(&submits(stream, 1, 10, 16)).await.unwrap();
    let (acked, busy) = answers(&mut socket, 6).await;
    assert!(
        acked.is_empty(),
        "acknowledged while the disk holds: {acked:?}"
    );
    assert_eq!(busy.len(), 6, "four are taken, six refused");
    assert!(busy[0].contains("4 replicated writes"), "{}", busy[0]);
    storage.release_syncs();
    let (mut acked, busy) = answers(&mut socket, 4).await;
    acked.sort();
    assert_eq!((acked, busy.len()), (vec![1, 2, 3, 4], 0), "the first four");
    // Once answered, they make room for as many again.
    socket.write_all(&submits(stream, 11, 4, 16)).await.unwrap();
    let (mut acked, busy) = answers(&mut socket, 4).await;
    acked.sort();
    assert_eq!((acked, busy.len()), (vec![11, 12, 13, 14], 0));
    assert_eq!(server.state.status_json()["writes_busy"], 6);
    server.stop().await;
}

#[tokio::test]
async fn bytes_past_a_connections_bound_in_flight_are_answered_busy() {
    let (server, stream, storage) = one_stream_server(|config| {
        config.bytes_in_flight_per_connection_max = 3000;
    })
    .await;
    let mut socket = raw_hello(server.address).await;
    storage.hold_syncs();
    socket
        .write_all(&submits(stream, 1, 10, 1000))
        .await
        .unwrap();
    let (acked, busy) = answers(&mut socket, 7).await;
    assert!(
        acked.is_empty(),
        "acknowledged while the disk holds: {acked:?}"
    );
    assert_eq!(busy.len(), 7, "three of 1,000 bytes fit in 3,000");
    assert!(busy[0].contains("3000 bytes"), "{}", busy[0]);
    storage.release_syncs();
    let (mut acked, _) = answers(&mut socket, 3).await;
    acked.sort();
    assert_eq!(acked, vec![1, 2, 3]);
    server.stop().await;
}

/// How many of ten appends sent at once the server stamped while the
/// disk held every sync, with `in_flight` appends allowed per connection;
/// then every one is acknowledged, in order, once the disk goes on.
async fn stamped_while_the_disk_stalls(in_flight: usize) -> u64 {
    let storage = FaultStorage::new();
    let mut config = fault_config(&storage);
    config.in_flight_per_connection_max = in_flight;
    let server = TestServer::start(config).await;
    let client = Client::connect(server.client_config()).await.unwrap();
    let stream = client
        .create_stream("stalled", DurabilityConfig::Sync)
        .await
        .unwrap();
    storage.hold_syncs();
    let mut socket = raw_hello(server.address).await;
    let mut bytes = Vec::new();
    for request in 1..=10u64 {
        let append = Frame::Append {
            request,
            stream: stream.id,
            flags: 0,
            session: 1,
            sequence: request,
            low_water: 1,
            key: Vec::new(),
            payload: vec![7; 100],
        };
        bytes.extend_from_slice(&append.to_bytes());
    }
    socket.write_all(&bytes).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let status = server.state.status_json();
    let stamped = status["streams"][0]["last_version"].as_u64().unwrap();
    let (early, _) = read_frames(&mut socket, 1, Duration::from_millis(50)).await;
    assert!(early.is_empty(), "acknowledged before the sync: {early:?}");
    storage.release_syncs();
    let (frames, _) = read_frames(&mut socket, 10, Duration::from_secs(10)).await;
    let requests: Vec<u64> = frames
        .iter()
        .map(|frame| match frame {
            Frame::Ack {
                request, version, ..
            } => {
                assert_eq!(request, version);
                *request
            }
            other => panic!("unexpected answer {other:?}"),
        })
        .collect();
    assert_eq!(requests, (1..=10).collect::<Vec<_>>());
    server.stop().await;
    stamped
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_past_a_connections_bound_wait_unread_until_some_are_acknowledged() {
    assert_eq!(
        stamped_while_the_disk_stalls(2).await,
        2,
        "two in flight: the third is not read"
    );
    assert_eq!(
        stamped_while_the_disk_stalls(64).await,
        10,
        "with room, all ten are stamped while the disk stalls"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_protocol_loses_nothing_when_a_connection_is_held_to_eight_writes() {
    let folder = tempfile::tempdir().unwrap();
    let cluster = LocalCluster::start(3, folder.path(), |config| {
        config.in_flight_per_connection_max = 8;
    })
    .await
    .unwrap();
    let client = Client::connect(ClientConfig::new(cluster.address(1).to_string()))
        .await
        .unwrap();
    for protocol in Protocol::ALL {
        let name = format!("held-{protocol}");
        let info = client
            .create_stream_with(&name, DurabilityConfig::Sync, protocol, 3)
            .await
            .unwrap();
        let publisher = crate::harness::publisher(&info, 64, 200).await;
        let mut history = checker::ClientHistory::default();
        let mut acks_by_server = Vec::new();
        write(&publisher, 1, 300, &mut history, &mut acks_by_server).await;
        assert_eq!(history.acked.len(), 300, "{protocol}");
        judge(
            protocol,
            &cluster,
            &name,
            info.id,
            &history,
            &acks_by_server,
        );
    }
    let busy: u64 = cluster
        .servers
        .iter()
        .map(|s| s.state().status_json()["writes_busy"].as_u64().unwrap())
        .sum();
    assert!(busy > 0, "a window of 64 never met the bound of 8");
    cluster.stop().await;
}
