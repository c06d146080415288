//! Seed 001's forwarding (F5) on a three-server cluster: an `Append` that
//! reaches a server other than the stream's primary is forwarded there and
//! the answer relayed, so a retry that lands anywhere gets the message's
//! one version, flagged duplicate; a client that asks for the redirect
//! gets `NotPrimary` naming the primary, and nothing is written. A server
//! without a replica answers `OpenStream` with the placement.

use std::time::Duration;

use client::{Client, ClientConfig, Protocol};
use proto::frame::{ACK_FLAG_DUPLICATE, APPEND_FLAG_REDIRECT};
use proto::{DurabilityConfig, ErrorCode, Frame};
use server::LocalCluster;
use tokio::io::AsyncWriteExt;

use crate::harness::{fast, raw_hello, read_frames};

/// Sends one `Append` of (session 1, `sequence`) to `address` as the
/// harness's client and returns the one answer.
async fn append(
    address: std::net::SocketAddr,
    stream: u64,
    (request, sequence, flags): (u64, u64, u8),
) -> Frame {
    let mut socket = raw_hello(address).await;
    let frame = Frame::Append {
        request,
        stream,
        flags,
        session: 1,
        sequence,
        low_water: 1,
        key: Vec::new(),
        payload: format!("message {sequence}").into_bytes(),
    };
    socket.write_all(&frame.to_bytes()).await.unwrap();
    let (mut frames, _) = read_frames(&mut socket, 1, Duration::from_secs(10)).await;
    assert_eq!(frames.len(), 1, "one answer from {address}: {frames:?}");
    frames.remove(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_append_to_a_backup_is_forwarded_and_a_retry_anywhere_gets_its_one_version() {
    let folder = tempfile::tempdir().unwrap();
    let cluster = LocalCluster::start(3, folder.path(), fast).await.unwrap();
    let creator = Client::connect(ClientConfig::new(cluster.address(1).to_string()))
        .await
        .unwrap();
    let info = creator
        .create_stream_with("forwarded", DurabilityConfig::Sync, Protocol::ServerSync, 3)
        .await
        .unwrap();
    let backups: Vec<u32> = (1..=3).filter(|id| *id != info.primary).collect();

    // The first try reaches a backup: forwarded, answered with version 1
    // under the client's own request number.
    match append(cluster.address(backups[0]), info.id, (7, 1, 0)).await {
        Frame::Ack {
            request,
            version,
            flags,
            ..
        } => {
            assert_eq!((request, version), (7, 1));
            assert_eq!(flags & ACK_FLAG_DUPLICATE, 0, "the first time it lands");
        }
        other => panic!("the backup did not relay the primary's ack: {other:?}"),
    }
    // The retry reaches the other backup, then the primary: the same
    // version, flagged duplicate.
    for server in [backups[1], info.primary] {
        match append(cluster.address(server), info.id, (8, 1, 0)).await {
            Frame::Ack {
                request,
                version,
                flags,
                ..
            } => {
                assert_eq!((request, version), (8, 1), "at server {server}");
                assert_ne!(flags & ACK_FLAG_DUPLICATE, 0, "a duplicate at {server}");
            }
            other => panic!("server {server}: {other:?}"),
        }
    }
    // A client that prefers the redirect gets it, naming the primary.
    match append(
        cluster.address(backups[0]),
        info.id,
        (9, 2, APPEND_FLAG_REDIRECT),
    )
    .await
    {
        Frame::Error { code, message, .. } => {
            assert_eq!(code, ErrorCode::NotPrimary, "{message}");
            assert!(
                message.contains(&format!("server {} at", info.primary)),
                "{message}"
            );
        }
        other => panic!("no redirect: {other:?}"),
    }
    // The redirected message was not written: the next one gets version 2.
    match append(cluster.address(backups[1]), info.id, (10, 3, 0)).await {
        Frame::Ack { version, .. } => assert_eq!(version, 2),
        other => panic!("{other:?}"),
    }
    let records = crate::harness::fetch_visible(&creator, info.id, 2).await;
    let payloads: Vec<&[u8]> = records.iter().map(|r| r.payload.as_slice()).collect();
    assert_eq!(payloads, [&b"message 1"[..], b"message 3"], "each once");
    cluster.stop().await;
}

/// A client that knows only a server holding no replica of the stream
/// (four servers, R = 3) opens it there: the answer is the placement, and
/// a publisher built on it writes to the replicas.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_a_replica_names_the_replicas_and_a_publisher_follows_them() {
    let folder = tempfile::tempdir().unwrap();
    let cluster = LocalCluster::start(4, folder.path(), fast).await.unwrap();
    let creator = Client::connect(ClientConfig::new(cluster.address(1).to_string()))
        .await
        .unwrap();
    let info = creator
        .create_stream_with(
            "placed",
            DurabilityConfig::Sync,
            Protocol::OneHopAckClient,
            3,
        )
        .await
        .unwrap();
    let outsider = (1..=4)
        .find(|id| !info.replicas.iter().any(|r| r.id == *id))
        .unwrap();
    let client = Client::connect(ClientConfig::new(cluster.address(outsider).to_string()))
        .await
        .unwrap();
    let seen = client.open_stream("placed").await.unwrap();
    assert_eq!(
        (seen.id, seen.primary, seen.epoch),
        (info.id, info.primary, info.epoch)
    );
    let ids = |i: &client::StreamInfo| i.replicas.iter().map(|r| r.id).collect::<Vec<_>>();
    assert_eq!(ids(&seen), ids(&info));
    assert_eq!(seen.last_version, 0, "it holds no version itself");
    let publisher = crate::harness::publisher(&seen, 4, 100).await;
    assert_eq!(
        publisher
            .send(b"", b"through the placement")
            .await
            .unwrap()
            .version,
        1
    );
    let unknown = client.open_stream("nowhere").await;
    assert!(unknown.is_err(), "{unknown:?}");
    cluster.stop().await;
}
