//! Restarts of a server on the same data folder and address: the client
//! library reconnects by itself, resends what was not acknowledged with the
//! same event ids, and subscriptions resume where they stopped.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use client::{Ack, AckLevel, Client, DurabilityConfig};
use server::ServerConfig;

use crate::harness::{fetch_all, quick_client_config, wait_until, TestServer};

/// The payload of message `index`: its index, then filler of a length that
/// depends on it, so a payload identifies its message.
fn payload(index: u32) -> Vec<u8> {
    let mut bytes = index.to_le_bytes().to_vec();
    bytes.extend(std::iter::repeat_n(
        (index % 251) as u8,
        (index % 97) as usize,
    ));
    bytes
}

fn index_of(payload: &[u8]) -> u32 {
    u32::from_le_bytes(
        payload[..4]
            .try_into()
            .expect("a payload starts with its index"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restart_under_load_loses_and_duplicates_nothing() {
    const MESSAGES: u32 = 20_000;
    /// The server restarts each time this many more messages are acked.
    const RESTART_AFTER_ACKS: [usize; 6] = [3_000, 5_500, 8_000, 10_500, 13_000, 15_500];
    let data = tempfile::tempdir().unwrap();
    let config = ServerConfig::new(data.path());
    let server = TestServer::start(config.clone()).await;
    let address = server.address;
    let mut client_config = quick_client_config(address);
    client_config.window = 256;
    let client = Client::connect(client_config).await.unwrap();
    let stream = client
        .create_stream("load", DurabilityConfig::Sync)
        .await
        .unwrap();

    // One task submits (bounded by the window), another awaits the acks in
    // submission order.
    let (pending_sender, mut pending_receiver) = tokio::sync::mpsc::channel(1024);
    let mut producer = client.producer(stream.id);
    let submitter = tokio::spawn(async move {
        for index in 0..MESSAGES {
            let pending = producer
                .submit(&index.to_be_bytes(), &payload(index))
                .await
                .expect("submit");
            if pending_sender.send((index, pending)).await.is_err() {
                return;
            }
        }
    });
    let acked = Arc::new(AtomicUsize::new(0));
    let collector = tokio::spawn({
        let acked = Arc::clone(&acked);
        async move {
            let mut acks: Vec<Option<Ack>> = vec![None; MESSAGES as usize];
            while let Some((index, pending)) = pending_receiver.recv().await {
                let ack = pending
                    .await
                    .unwrap_or_else(|e| panic!("message {index} failed: {e}"));
                acks[index as usize] = Some(ack);
                acked.fetch_add(1, Ordering::Relaxed);
            }
            acks
        }
    });

    let mut server = server;
    let mut restarts = Vec::new();
    for threshold in RESTART_AFTER_ACKS {
        wait_until(Duration::from_secs(30), "acks before a restart", || {
            acked.load(Ordering::Relaxed) >= threshold
        })
        .await;
        restarts.push(acked.load(Ordering::Relaxed));
        let old_stream = Arc::downgrade(&server.state.stream_by_name("load").unwrap());
        server.stop().await;
        // The next server opens the same log files: the old log must be
        // closed (its pending records written, its I/O thread gone) by now,
        // or two logs write the same segment.
        if old_stream.upgrade().is_some() {
            // Say whether it is a late release or a leak, then fail.
            let stopped = std::time::Instant::now();
            let mut gone_after = None;
            for _ in 0..500 {
                tokio::time::sleep(Duration::from_millis(2)).await;
                if old_stream.upgrade().is_none() {
                    gone_after = Some(stopped.elapsed());
                    break;
                }
            }
            panic!(
                "after TestServer::stop (run returned, last ServerState dropped) the old server's stream and its log are still alive (released {gone_after:?} later); a new server on the same folder races the old log's I/O thread"
            );
        }
        server = TestServer::start_at(config.clone(), address).await;
    }

    let acks = tokio::time::timeout(Duration::from_secs(60), async {
        submitter.await.unwrap();
        collector.await.unwrap()
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "not every message was acknowledged within 60 s after the restart ({} of {MESSAGES})",
            acked.load(Ordering::Relaxed)
        )
    });
    assert!(
        restarts.iter().all(|&count| count < MESSAGES as usize),
        "a restart came after the load; the test proves nothing: {restarts:?}"
    );
    let acks: Vec<Ack> = acks
        .into_iter()
        .enumerate()
        .map(|(index, ack)| ack.unwrap_or_else(|| panic!("message {index} has no ack")))
        .collect();

    let records = fetch_all(&client, stream.id).await;
    assert_eq!(
        records.len(),
        MESSAGES as usize,
        "the log holds {} records for {MESSAGES} messages",
        records.len()
    );
    let mut seen = HashSet::new();
    for (position, record) in records.iter().enumerate() {
        assert_eq!(record.version, position as u64 + 1, "versions are dense");
        let index = index_of(&record.payload);
        assert!(
            seen.insert(index),
            "message {index} is in the log twice (again at version {})",
            record.version
        );
        assert_eq!(record.payload, payload(index));
        assert_eq!(record.event.client, client.client_id());
        assert_eq!(record.event.sequence, u64::from(index) + 1);
    }
    let mut duplicates = 0;
    for (index, ack) in acks.iter().enumerate() {
        assert_eq!(ack.level, AckLevel::Synced);
        assert_eq!(ack.stream, stream.id);
        let record = &records[(ack.version - 1) as usize];
        assert_eq!(
            index_of(&record.payload),
            index as u32,
            "the ack of message {index} names version {}, which holds another message",
            ack.version
        );
        if ack.duplicate {
            duplicates += 1;
        }
    }
    println!("restarts after {restarts:?} acks; {duplicates} acks were duplicates");
    drop(client);
    server.stop().await;
}

#[tokio::test]
async fn the_dedupe_table_survives_a_restart() {
    let data = tempfile::tempdir().unwrap();
    let config = ServerConfig::new(data.path());
    let server = TestServer::start(config.clone()).await;
    let address = server.address;
    let first = Client::connect(quick_client_config(address)).await.unwrap();
    let stream = first
        .create_stream("dedupe", DurabilityConfig::Sync)
        .await
        .unwrap();
    first
        .producer(stream.id)
        .send(b"", b"before")
        .await
        .unwrap();
    let original = first
        .producer_with_session(stream.id, 77, 1)
        .send(b"k", b"the message")
        .await
        .unwrap();
    assert_eq!(original.version, 2);
    assert!(!original.duplicate);
    first.producer(stream.id).send(b"", b"after").await.unwrap();
    let client_id = first.client_id();
    drop(first);
    server.stop().await;

    let server = TestServer::start_at(config, address).await;
    // The same client process, restarted: same client id, same session,
    // same sequence.
    let mut config = quick_client_config(address);
    config.client_id = Some(client_id);
    let again = Client::connect(config).await.unwrap();
    let retry = again
        .producer_with_session(stream.id, 77, 1)
        .send(b"k", b"the message")
        .await
        .unwrap();
    assert!(retry.duplicate, "the retry after a restart: {retry:?}");
    assert_eq!(retry.version, original.version);
    // The session goes on with new messages as usual.
    let next = again
        .producer_with_session(stream.id, 77, 2)
        .send(b"k", b"the next message")
        .await
        .unwrap();
    assert!(!next.duplicate);
    assert_eq!(next.version, 4);
    let records = fetch_all(&again, stream.id).await;
    let payloads: Vec<&[u8]> = records.iter().map(|r| r.payload.as_slice()).collect();
    assert_eq!(
        payloads,
        vec![
            &b"before"[..],
            b"the message",
            b"after",
            b"the next message"
        ],
        "the retried message is logged once"
    );
    drop(again);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_resumes_after_a_restart_without_gaps_or_repeats() {
    const BEFORE: u32 = 600;
    const AFTER: u32 = 600;
    let data = tempfile::tempdir().unwrap();
    let config = ServerConfig::new(data.path());
    let server = TestServer::start(config.clone()).await;
    let address = server.address;
    let writer = Client::connect(quick_client_config(address)).await.unwrap();
    let stream = writer
        .create_stream("tail", DurabilityConfig::Sync)
        .await
        .unwrap();
    let mut reader_config = quick_client_config(address);
    // A small buffer, so the server still holds records back when it stops.
    reader_config.subscription_buffer = 64;
    let reader = Client::connect(reader_config).await.unwrap();
    let mut subscription = reader.subscribe(stream.id, 1).await.unwrap();

    let mut producer = writer.producer(stream.id);
    let mut pending = Vec::new();
    for index in 0..BEFORE {
        pending.push(producer.submit(b"", &payload(index)).await.unwrap());
    }
    for ack in pending.drain(..) {
        ack.await.unwrap();
    }
    // Read part of it, then restart while the subscription is active.
    let mut received = Vec::new();
    for _ in 0..BEFORE / 2 {
        let record = tokio::time::timeout(Duration::from_secs(10), subscription.next())
            .await
            .expect("a record within 10 s")
            .expect("the subscription is open")
            .expect("no subscription error");
        received.push(record);
    }
    server.stop().await;
    let server = TestServer::start_at(config, address).await;

    for index in BEFORE..BEFORE + AFTER {
        pending.push(producer.submit(b"", &payload(index)).await.unwrap());
    }
    let acks = tokio::time::timeout(Duration::from_secs(20), async {
        let mut acks = Vec::new();
        for ack in pending.drain(..) {
            acks.push(ack.await.unwrap());
        }
        acks
    })
    .await
    .expect("the writer is acknowledged within 20 s after the restart");
    assert_eq!(acks.last().unwrap().version, u64::from(BEFORE + AFTER));

    let total = (BEFORE + AFTER) as usize;
    let read_rest = async {
        while received.len() < total {
            match subscription.next().await {
                Some(Ok(record)) => received.push(record),
                Some(Err(error)) => panic!("the subscription failed: {error}"),
                None => panic!("the subscription ended"),
            }
        }
    };
    if tokio::time::timeout(Duration::from_secs(15), read_rest)
        .await
        .is_err()
    {
        panic!(
            "the subscription did not resume after the restart: {} of {total} records after 15 s (last version {:?})",
            received.len(),
            received.last().map(|r| r.version)
        );
    }
    for (position, record) in received.iter().enumerate() {
        assert_eq!(
            record.version,
            position as u64 + 1,
            "every version once, in order"
        );
        assert_eq!(record.payload, payload(position as u32));
    }
    // Nothing more than the log holds.
    let extra = tokio::time::timeout(Duration::from_millis(200), subscription.next()).await;
    assert!(extra.is_err(), "a record past the end: {extra:?}");
    drop(subscription);
    drop(reader);
    drop(writer);
    server.stop().await;
}

/// The stated loss windows: a `paged` stream acknowledges from memory and
/// writes its pages asynchronously, so a crash loses at most what the
/// pages held, but a clean stop writes every pending page; a `memory`
/// stream keeps nothing on disk, so a restart (clean or not) loses all its
/// records, and the stream comes back empty.
#[tokio::test]
async fn paged_and_memory_streams_state_their_loss_on_restart() {
    const MESSAGES: u32 = 1_000;
    let data = tempfile::tempdir().unwrap();
    let mut config = ServerConfig::new(data.path());
    // Pages are written only when full or at shutdown: the records below
    // fit in one page, so only the shutdown can write them.
    config.page_flush_interval = Duration::from_secs(3600);
    let server = TestServer::start(config.clone()).await;
    let address = server.address;
    let client = Client::connect(quick_client_config(address)).await.unwrap();
    let paged = client
        .create_stream(
            "paged",
            DurabilityConfig::Paged {
                pages: 2,
                page_size: 2 << 20,
            },
        )
        .await
        .unwrap();
    let memory = client
        .create_stream("memory", DurabilityConfig::Memory)
        .await
        .unwrap();
    for stream in [paged.id, memory.id] {
        let mut producer = client.producer(stream);
        let mut pending = Vec::new();
        for index in 0..MESSAGES {
            pending.push(producer.submit(b"", &payload(index)).await.unwrap());
        }
        for (index, ack) in pending.into_iter().enumerate() {
            let ack = ack.await.unwrap();
            assert_eq!(ack.version, index as u64 + 1);
            assert_eq!(ack.level, AckLevel::Memory);
        }
    }
    let before = client.open_stream("paged").await.unwrap();
    assert_eq!(before.last_version, u64::from(MESSAGES));
    drop(client);
    server.stop().await;

    let server = TestServer::start_at(config, address).await;
    let client = Client::connect(quick_client_config(address)).await.unwrap();
    let paged_after = client.open_stream("paged").await.unwrap();
    assert_eq!(
        paged_after.last_version,
        u64::from(MESSAGES),
        "a clean stop writes every pending page"
    );
    let records = fetch_all(&client, paged.id).await;
    assert_eq!(records.len(), MESSAGES as usize);
    for (position, record) in records.iter().enumerate() {
        assert_eq!(record.version, position as u64 + 1);
        assert_eq!(record.payload, payload(position as u32));
    }
    let memory_after = client.open_stream("memory").await.unwrap();
    assert_eq!(memory_after.id, memory.id, "the stream itself is kept");
    assert_eq!(
        memory_after.last_version, 0,
        "a memory stream's records do not survive a restart"
    );
    assert!(fetch_all(&client, memory.id).await.is_empty());
    drop(client);
    server.stop().await;
}
