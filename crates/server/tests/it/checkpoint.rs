//! Checkpoints and retention in a running server: streams write
//! checkpoints in the background, a restart recovers from the newest one
//! (its dedupe table included), and retention deletes covered segments,
//! after which readers of an older version are told the oldest available.

use std::time::Duration;

use client::{Client, DurabilityConfig};
use server::{ServerConfig, StreamMeta};

use crate::harness::{fetch_all, quick_client_config, wait_until, TestServer};

fn checkpointing_config(data: &std::path::Path) -> ServerConfig {
    let mut config = ServerConfig::new(data);
    config.segment_bytes_max = 4096;
    config.checkpoint_interval = Duration::from_millis(30);
    config.checkpoint_records = 0;
    // Keep as little as retention may: only what no checkpoint covers.
    config.retain_bytes = 1;
    config
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_recovers_from_a_checkpoint_that_remembers_event_ids_whose_records_retention_deleted(
) {
    let data = tempfile::tempdir().unwrap();
    let mut config = checkpointing_config(data.path());
    // This test writes its checkpoints itself, so it knows what retention
    // has done when it reads.
    config.checkpoint_interval = Duration::ZERO;
    let server = TestServer::start(config.clone()).await;
    let address = server.address;
    let client = Client::connect(quick_client_config(address)).await.unwrap();
    let stream = client
        .create_stream("kept", DurabilityConfig::Sync)
        .await
        .unwrap();
    let original = client
        .producer_with_session(stream.id, 77, 1)
        .send(b"k", b"the first message")
        .await
        .unwrap();
    assert_eq!(original.version, 1);
    let handle = server.state.stream_by_name("kept").unwrap();
    let mut producer = client.producer(stream.id);
    // Two rounds, each followed by its checkpoint: retention deletes only
    // what both kept checkpoints cover.
    for round in 0..2u64 {
        for index in 0..50u32 {
            producer.send(b"", &[index as u8; 500]).await.unwrap();
        }
        let last = 1 + 50 * (round + 1);
        let written = handle
            .checkpoint(handle.retention, Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(written, Some(last));
        assert_eq!(handle.log.checkpoints().first(), Some(&last));
    }
    // Retention deletes what both kept checkpoints cover.
    let oldest = handle.log.first_version();
    assert!(oldest > 1 && oldest <= 52, "the log starts at {oldest}");
    drop(handle);

    // Readers of a deleted version are told the oldest available.
    crate::harness::assert_version_1_unavailable(&client, stream.id, oldest).await;
    let client_id = client.client_id();
    drop(client);
    server.stop().await;

    let server = TestServer::start_at(config, address).await;
    let handle = server.state.stream_by_name("kept").unwrap();
    assert_eq!(handle.log.first_version(), oldest);
    assert_eq!(handle.log.last_version(), 101);
    assert_eq!(handle.checkpointed(), 101, "recovered from the checkpoint");
    drop(handle);
    let mut client_config = quick_client_config(address);
    client_config.client_id = Some(client_id);
    let again = Client::connect(client_config).await.unwrap();
    // Version 1's record is gone from the log; only the checkpoint's
    // dedupe table can still answer its retry.
    let retry = again
        .producer_with_session(stream.id, 77, 1)
        .send(b"k", b"the first message")
        .await
        .unwrap();
    assert!(retry.duplicate, "the retry after a restart: {retry:?}");
    assert_eq!(retry.version, 1);
    let next = again
        .producer_with_session(stream.id, 78, 1)
        .send(b"", b"next")
        .await
        .unwrap();
    assert_eq!(next.version, 102);
    let mut from = oldest;
    let mut versions = Vec::new();
    loop {
        let page = again.fetch(stream.id, from, 1000).await.unwrap();
        let Some(last) = page.last() else { break };
        from = last.version + 1;
        versions.extend(page.iter().map(|r| r.version));
    }
    assert_eq!(versions, (oldest..=102).collect::<Vec<_>>());
    drop(again);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_retention_checkpoints_keep_the_whole_log_readable() {
    let data = tempfile::tempdir().unwrap();
    let mut config = checkpointing_config(data.path());
    config.retain_bytes = 0;
    let server = TestServer::start(config.clone()).await;
    let client = Client::connect(quick_client_config(server.address))
        .await
        .unwrap();
    let stream = client
        .create_stream("whole", DurabilityConfig::Sync)
        .await
        .unwrap();
    let mut producer = client.producer(stream.id);
    for index in 0..60u32 {
        producer.send(b"", &[index as u8; 500]).await.unwrap();
    }
    let handle = server.state.stream_by_name("whole").unwrap();
    wait_until(Duration::from_secs(10), "a checkpoint", || {
        handle.checkpointed() >= 60
    })
    .await;
    assert_eq!(handle.log.first_version(), 1);
    assert_eq!(fetch_all(&client, stream.id).await.len(), 60);
    drop(handle);
    drop(client);
    server.stop().await;
}

#[test]
fn a_meta_file_without_retention_takes_the_servers_and_its_own_overrides_it() {
    let mut config = ServerConfig::new("/unused");
    config.retain_bytes = 1000;
    config.retain_ms = 5000;
    let plain =
        r#"{"format": 1, "id": 5, "name": "s", "durability": "sync", "pages": 0, "page_size": 0}"#;
    let meta: StreamMeta = serde_json::from_str(plain).unwrap();
    assert_eq!(meta.retain_bytes, None);
    let retention = meta.retention(&config);
    assert_eq!((retention.bytes, retention.ms), (1000, 5000));
    // Unset fields are not written back.
    assert!(!serde_json::to_string(&meta).unwrap().contains("retain"));
    let own = r#"{"format": 1, "id": 5, "name": "s", "durability": "sync", "pages": 0, "page_size": 0, "retain_bytes": 0, "retain_ms": 60000}"#;
    let meta: StreamMeta = serde_json::from_str(own).unwrap();
    let retention = meta.retention(&config);
    assert_eq!((retention.bytes, retention.ms), (0, 60_000));
}

/// Opens a server's state on `image` (without serving) and returns the
/// state machine of the stream `name` and its log's first version.
async fn recovered_state(config: ServerConfig, name: &str) -> ((u64, Vec<u8>), u64, u64) {
    let name = name.to_string();
    tokio::task::spawn_blocking(move || {
        let state = server::ServerState::open(config).expect("the server opens");
        let stream = state.stream_by_name(&name).expect("the stream exists");
        let found = (
            stream.machine_state(),
            stream.log.first_version(),
            stream.checkpointed(),
        );
        drop(stream);
        drop(state);
        found
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn power_loss_after_checkpoints_and_retention_recovers_the_same_state_machine() {
    use wal::fault::{CrashMode, FaultStorage};
    let storage = FaultStorage::new();
    let settings = |storage: &FaultStorage| {
        let mut config = crate::harness::fault_config(storage);
        config.segment_bytes_max = 4096;
        config.checkpoint_interval = Duration::ZERO;
        config.checkpoint_records = 0;
        config.retain_bytes = 1;
        config
    };
    let server = TestServer::start(settings(&storage)).await;
    let client = Client::connect(quick_client_config(server.address))
        .await
        .unwrap();
    let stream = client
        .create_stream("machine", DurabilityConfig::Sync)
        .await
        .unwrap();
    let handle = server.state.stream_by_name("machine").unwrap();
    let mut producers: Vec<_> = (1..=3)
        .map(|session| client.producer_with_session(stream.id, session, 1))
        .collect();
    let mut images = Vec::new();
    for round in 0..3u32 {
        for index in 0..60u32 {
            let producer = &mut producers[(index % 3) as usize];
            producer.send(b"", &[round as u8; 400]).await.unwrap();
        }
        let written = handle
            .checkpoint(handle.retention, Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(written, Some(u64::from(60 * (round + 1))));
        let live = handle.machine_state();
        let first = handle.log.first_version();
        for mode in [CrashMode::DurableOnly, CrashMode::TornTail] {
            images.push((
                format!("round {round}, {mode:?}"),
                storage.crash(mode, 9),
                live.clone(),
                first,
            ));
        }
        // The newest checkpoint damaged: the one before it serves, and
        // the records after it rebuild the same state.
        let damaged = storage.crash(CrashMode::DurableOnly, 9);
        let folder = std::path::Path::new("/stamplog/streams/machine/log");
        let newest = folder.join(wal::checkpoint::checkpoint_name(live.0));
        damaged.flip_bit(&newest, 300).unwrap();
        images.push((
            format!("round {round}, newest checkpoint damaged"),
            damaged,
            live,
            first,
        ));
    }
    assert!(handle.log.first_version() > 1, "retention deleted segments");
    drop(handle);
    drop(client);
    server.stop().await;
    for (context, image, live, first) in images {
        let (recovered, recovered_first, checkpointed) =
            recovered_state(settings(&image), "machine").await;
        assert_eq!(recovered.0, live.0, "{context}: last version");
        assert_eq!(
            recovered.1, live.1,
            "{context}: the same dedupe table and epoch"
        );
        assert_eq!(
            recovered_first, first,
            "{context}: the log starts where it did"
        );
        if context.contains("damaged") {
            assert!(
                checkpointed < live.0,
                "{context}: the damaged one is skipped"
            );
        } else {
            assert_eq!(
                checkpointed, live.0,
                "{context}: the newest checkpoint serves"
            );
        }
    }
}

/// A stream's own retention, set at creation, reaches every replica's
/// meta file (and so survives restarts); limits left at 0 take the
/// server's defaults.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_set_at_creation_reaches_every_replica() {
    let data = tempfile::tempdir().unwrap();
    let cluster = server::LocalCluster::start(3, data.path(), |config| {
        config.retain_ms = 86_400_000;
    })
    .await
    .unwrap();
    let client = client::Client::connect(client::ClientConfig::new(
        cluster.servers[0].address.to_string(),
    ))
    .await
    .unwrap();
    let options = client::StreamOptions {
        replicas: 3,
        retention: client::RetentionConfig {
            bytes: 5 << 20,
            ms: 0,
        },
        ..client::StreamOptions::new(DurabilityConfig::Sync)
    };
    client
        .create_stream_with_options("kept", &options)
        .await
        .unwrap();
    for server in &cluster.servers {
        let stream = server.state().stream_by_name("kept").unwrap();
        assert_eq!(stream.retention.bytes, 5 << 20, "the stream's own limit");
        assert_eq!(stream.retention.ms, 86_400_000, "the server's default");
        let meta = std::fs::read_to_string(stream.folder.join("stream.json")).unwrap();
        let meta: serde_json::Value = serde_json::from_str(&meta).unwrap();
        assert_eq!(meta["retain_bytes"], 5u64 << 20);
        assert!(meta.get("retain_ms").is_none(), "{meta}");
    }
    drop(client);
    cluster.stop().await;
}

/// A stream deleted while its checkpoint task writes one is removed
/// whole: the task ends before the folder goes, so no checkpoint file
/// appears in it halfway ("directory not empty").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_deleted_while_it_writes_checkpoints_is_removed_whole() {
    let data = tempfile::tempdir().unwrap();
    let mut config = checkpointing_config(data.path());
    // A checkpoint as often as new records come: one is nearly always
    // being written while messages flow.
    config.checkpoint_interval = Duration::from_millis(1);
    let server = TestServer::start(config).await;
    let client = Client::connect(quick_client_config(server.address))
        .await
        .unwrap();
    // A delete meets a checkpoint being written in a few rounds of a
    // hundred; fifty rounds make a regression show nearly every run.
    for round in 0..50 {
        let name = format!("busy-{round}");
        let stream = client
            .create_stream(&name, DurabilityConfig::Sync)
            .await
            .unwrap();
        let writer = {
            let client = Client::connect(quick_client_config(server.address))
                .await
                .unwrap();
            tokio::spawn(async move {
                let mut producer = client.producer(stream.id);
                // Refused once the stream is gone; the writer just stops.
                for index in 0..100_000u32 {
                    if producer.send(b"", &[index as u8; 200]).await.is_err() {
                        break;
                    }
                }
            })
        };
        let handle = server.state.stream_by_name(&name).unwrap();
        wait_until(Duration::from_secs(10), "two checkpoints", || {
            handle.log.checkpoints().len() >= 2
        })
        .await;
        drop(handle);
        client
            .delete_stream(&name)
            .await
            .unwrap_or_else(|error| panic!("round {round}: {error}"));
        writer.abort();
        assert!(
            !data.path().join("streams").join(&name).exists(),
            "round {round}: the stream's folder is gone"
        );
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_made_together_spread_their_checkpoints_over_the_interval() {
    let data = tempfile::tempdir().unwrap();
    let mut config = ServerConfig::new(data.path());
    config.checkpoint_interval = Duration::from_millis(1000);
    config.checkpoint_records = 0;
    let server = TestServer::start(config).await;
    let client = Client::connect(quick_client_config(server.address))
        .await
        .unwrap();
    const STREAMS: usize = 16;
    let mut made = Vec::new();
    for index in 0..STREAMS {
        let name = format!("spread-{index}");
        made.push((name.clone(), std::time::Instant::now()));
        let stream = client
            .create_stream(&name, DurabilityConfig::Sync)
            .await
            .unwrap();
        client
            .producer(stream.id)
            .send(b"", b"one message")
            .await
            .unwrap();
    }
    // How long after its making each stream wrote its first checkpoint,
    // polled every 10 ms.
    let mut after: Vec<Option<Duration>> = vec![None; STREAMS];
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while after.iter().any(Option::is_none) && std::time::Instant::now() < deadline {
        for (index, (name, at)) in made.iter().enumerate() {
            if after[index].is_none()
                && server.state.stream_by_name(name).unwrap().checkpointed() > 0
            {
                after[index] = Some(at.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let after: Vec<Duration> = after
        .iter()
        .map(|time| time.expect("every stream wrote a checkpoint within 5 s"))
        .collect();
    let spread = *after.iter().max().unwrap() - *after.iter().min().unwrap();
    // Each due one interval after its task started, every stream would
    // write its first checkpoint about 1 s after its making.
    assert!(
        spread >= Duration::from_millis(300),
        "first checkpoints {spread:?} apart counted from each stream's making: {after:?}"
    );
    drop(client);
    server.stop().await;
}
