//! Storage faults under a running server, with `wal::fault::FaultStorage`
//! as its disk: a full disk and failing fsyncs get clear errors, latch the
//! stream failed, and never cost an acknowledged message. In a cluster, a
//! replica whose disk fills leaves the stream's in-sync set and the
//! stream goes on with the others.

use std::sync::Arc;
use std::time::Duration;

use client::{Ack, Client, ClientError, DurabilityConfig, ErrorCode};
use server::ServerState;
use wal::fault::{CrashMode, FaultStorage};

use crate::harness::{fault_config, quick_client_config, read_log, TestServer};

fn payload(index: u32) -> Vec<u8> {
    let mut bytes = index.to_le_bytes().to_vec();
    bytes.resize(1000, (index % 251) as u8);
    bytes
}

/// Submits `count` messages (from `first` on) with up to the client's
/// window in flight; returns each one's answer, in order.
async fn submit_all(
    client: &Client,
    stream: u64,
    first: u32,
    count: u32,
) -> Vec<(u32, Result<Ack, ClientError>)> {
    let mut producer = client.producer(stream);
    let mut pending = Vec::new();
    for index in first..first + count {
        pending.push((index, producer.submit(b"", &payload(index)).await.unwrap()));
    }
    let mut answers = Vec::new();
    for (index, ack) in pending {
        let answer = tokio::time::timeout(Duration::from_secs(10), ack)
            .await
            .unwrap_or_else(|_| panic!("message {index} got no answer within 10 s"));
        answers.push((index, answer));
    }
    answers
}

/// Opens a new server state on `image`, as a restarted process would, and
/// checks that every acknowledged message of `acked` is in stream `name`
/// at its version with its payload, and that versions are dense. Returns
/// the number of records recovered.
async fn check_recovered(
    image: FaultStorage,
    name: &str,
    acked: &[(u32, Ack)],
    what: &str,
) -> usize {
    let streams = [(name.to_string(), acked.to_vec())];
    check_recovered_streams(fault_config(&image), &streams, what).await[0]
}

fn total_bytes(storage: &FaultStorage) -> u64 {
    storage.files().iter().map(|(_, length)| length).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_fails_the_stream_with_a_clear_error_and_loses_nothing_acknowledged() {
    let storage = FaultStorage::new();
    let mut config = fault_config(&storage);
    config.segment_bytes_max = 64 * 1024;
    let server = TestServer::start(config).await;
    let client = Client::connect(quick_client_config(server.address))
        .await
        .unwrap();
    let stream = client
        .create_stream("full", DurabilityConfig::Sync)
        .await
        .unwrap();
    // Room for about 150 messages of 1000 bytes, over a few segments.
    storage.set_space_limit(Some(total_bytes(&storage) + 150 * 1_050));

    let mut acked: Vec<(u32, Ack)> = Vec::new();
    let mut errors: Vec<(u32, ErrorCode, String)> = Vec::new();
    let mut next = 0u32;
    for _round in 0..20 {
        for (index, answer) in submit_all(&client, stream.id, next, 40).await {
            match answer {
                Ok(ack) => {
                    assert!(
                        errors.is_empty(),
                        "message {index} was acknowledged after the log failed"
                    );
                    acked.push((index, ack));
                }
                Err(ClientError::Server { code, message }) => errors.push((index, code, message)),
                Err(other) => panic!("message {index}: {other}"),
            }
        }
        next += 40;
        if errors.len() >= 40 {
            break;
        }
    }
    assert!(
        !acked.is_empty(),
        "nothing was acknowledged before the disk filled"
    );
    assert!(!errors.is_empty(), "the disk never filled");
    for (index, code, message) in &errors {
        assert_eq!(*code, ErrorCode::LogFailed, "message {index}: {message}");
        assert!(
            message.contains("No space left on device"),
            "message {index}: the error does not say the disk is full: {message}"
        );
    }
    for (position, (_, ack)) in acked.iter().enumerate() {
        assert_eq!(ack.version, position as u64 + 1);
    }
    let status: serde_json::Value = serde_json::from_str(&client.status().await.unwrap()).unwrap();
    let failed = status["streams"][0]["failed"].as_str().unwrap_or_default();
    assert!(failed.contains("No space left on device"), "{status}");
    // A read of what was acknowledged still works on the failed stream.
    let fetched = client.fetch(stream.id, 1, 10).await.unwrap();
    assert_eq!(fetched.first().map(|r| r.version), Some(1));

    // Power loss now, in both ways, then a restart on what is left.
    for (mode, seed) in [
        (CrashMode::DurableOnly, 1),
        (CrashMode::TornTail, 2),
        (CrashMode::TornTail, 3),
    ] {
        let image = storage.crash(mode, seed);
        let what = format!("{mode:?} crash with seed {seed}");
        let recovered = check_recovered(image, "full", &acked, &what).await;
        assert!(recovered >= acked.len(), "{what}");
    }
    drop(client);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_fsync_failure_is_never_acknowledged() {
    for allowed_syncs in [0u64, 2, 5] {
        let storage = FaultStorage::new();
        let server = TestServer::start(fault_config(&storage)).await;
        let client = Client::connect(quick_client_config(server.address))
            .await
            .unwrap();
        let stream = client
            .create_stream("fsync", DurabilityConfig::Sync)
            .await
            .unwrap();
        let mut acked: Vec<(u32, Ack)> = Vec::new();
        for (index, answer) in submit_all(&client, stream.id, 0, 10).await {
            acked.push((index, answer.expect("no fault yet")));
        }
        storage.fail_sync_after(allowed_syncs);
        let mut errors = 0;
        // Rounds of messages until the syncs run out: each round needs at
        // least one more sync.
        let mut next = 10u32;
        for _round in 0..100 {
            for (index, answer) in submit_all(&client, stream.id, next, 40).await {
                match answer {
                    Ok(ack) => {
                        assert_eq!(
                            errors, 0,
                            "allowed {allowed_syncs}: message {index} acknowledged after a failed fsync"
                        );
                        acked.push((index, ack));
                    }
                    Err(ClientError::Server { code, message }) => {
                        assert_eq!(code, ErrorCode::LogFailed, "message {index}: {message}");
                        assert!(
                            message.contains("injected fsync failure"),
                            "message {index}: the error does not name the failure: {message}"
                        );
                        errors += 1;
                    }
                    Err(other) => panic!("message {index}: {other}"),
                }
            }
            next += 40;
            if errors > 0 {
                break;
            }
        }
        assert!(errors > 0, "allowed {allowed_syncs}: no fsync ever failed");
        // Later appends are refused at once, and the status says why.
        let later = client.producer(stream.id).send(b"", &payload(9999)).await;
        assert!(
            matches!(
                &later,
                Err(ClientError::Server {
                    code: ErrorCode::LogFailed,
                    ..
                })
            ),
            "{later:?}"
        );
        let status: serde_json::Value =
            serde_json::from_str(&client.status().await.unwrap()).unwrap();
        let failed = status["streams"][0]["failed"].as_str().unwrap_or_default();
        assert!(failed.contains("injected fsync failure"), "{status}");
        // Readers never see past what was synced.
        let info = client.open_stream("fsync").await.unwrap();
        let last_acked = acked.last().map_or(0, |(_, ack)| ack.version);
        assert_eq!(
            info.committed_version, last_acked,
            "allowed {allowed_syncs}: committed version against the last ack"
        );
        let fetched = client.fetch(stream.id, last_acked + 1, 10).await.unwrap();
        assert!(
            fetched.is_empty(),
            "allowed {allowed_syncs}: a reader sees unsynced records {:?}",
            fetched.iter().map(|r| r.version).collect::<Vec<_>>()
        );

        // Only what was synced survives DurableOnly: every ack must be in it.
        let what = format!("allowed {allowed_syncs}, DurableOnly crash");
        let image = storage.crash(CrashMode::DurableOnly, 11);
        check_recovered(image, "fsync", &acked, &what).await;
        let what = format!("allowed {allowed_syncs}, TornTail crash");
        let image = storage.crash(CrashMode::TornTail, 12);
        check_recovered(image, "fsync", &acked, &what).await;
        drop(client);
        server.stop().await;
    }
}

/// `check_recovered` for every stream of `streams` (name and what it
/// acknowledged) on one opening of a crashed image (`config`'s storage);
/// the records each recovered.
async fn check_recovered_streams(
    config: server::ServerConfig,
    streams: &[(String, Vec<(u32, Ack)>)],
    what: &str,
) -> Vec<usize> {
    let streams = streams.to_vec();
    let what = what.to_string();
    tokio::task::spawn_blocking(move || {
        let state: Arc<ServerState> = ServerState::open(config)
            .unwrap_or_else(|e| panic!("{what}: the crashed image does not open: {e}"));
        let counts = streams
            .iter()
            .map(|(name, acked)| {
                let records = read_log(&state, name);
                for (position, record) in records.iter().enumerate() {
                    assert_eq!(record.version, position as u64 + 1, "{what}, {name}: versions are dense");
                }
                for (index, ack) in acked {
                    let record = records.get((ack.version - 1) as usize).unwrap_or_else(|| {
                        panic!(
                            "{what}, {name}: acknowledged message {index} (version {}) is lost; {} records recovered",
                            ack.version,
                            records.len()
                        )
                    });
                    assert_eq!(
                        record.payload,
                        payload(*index),
                        "{what}, {name}: version {} holds another message",
                        ack.version
                    );
                }
                records.len()
            })
            .collect();
        drop(state);
        counts
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_sharing_the_journal_lose_nothing_acknowledged_in_a_power_loss() {
    journal_power_loss(None, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_journal_in_a_folder_of_its_own_loses_nothing_acknowledged_in_a_power_loss() {
    journal_power_loss(Some(std::path::PathBuf::from("/journal-disk")), 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn few_busy_streams_each_writing_its_own_log_lose_nothing_acknowledged_in_a_power_loss() {
    journal_power_loss(None, wal::JournalConfig::default().few_logs).await;
}

/// Six `sync` streams written at once on a server whose journal is in
/// `journal_dir` (the data folder when `None`) and takes rounds of
/// several streams once more than `few_logs` are busy; a power-loss image
/// after every round of messages must hold everything acknowledged.
async fn journal_power_loss(journal_dir: Option<std::path::PathBuf>, few_logs: usize) {
    const STREAMS: usize = 6;
    let storage = FaultStorage::new();
    let configured = |storage: &FaultStorage| {
        let mut config = fault_config(storage);
        // A small journal: it rotates during the run.
        config.journal_bytes_max = 256 * 1024;
        config.journal_dir = journal_dir.clone();
        config.journal_few_logs = few_logs;
        config
    };
    let config = configured(&storage);
    let server = TestServer::start(config).await;
    let client = Client::connect(quick_client_config(server.address))
        .await
        .unwrap();
    let mut ids = Vec::new();
    for index in 0..STREAMS {
        let name = format!("j{index}");
        let stream = client
            .create_stream(&name, DurabilityConfig::Sync)
            .await
            .unwrap();
        ids.push((name, stream.id));
    }
    let mut streams: Vec<(String, Vec<(u32, Ack)>)> = ids
        .iter()
        .map(|(name, _)| (name.clone(), Vec::new()))
        .collect();
    let mut images = Vec::new();
    for round in 0..12u32 {
        // Every stream gets a burst at once: the server's rounds hold
        // several streams' records.
        let mut pending = Vec::new();
        for (position, (_, id)) in ids.iter().enumerate() {
            let mut producer = client.producer(*id);
            for index in round * 20..round * 20 + 20 {
                let ack = producer.submit(b"", &payload(index)).await.unwrap();
                pending.push((position, index, ack));
            }
        }
        for (position, index, ack) in pending {
            let answer = tokio::time::timeout(Duration::from_secs(10), ack)
                .await
                .unwrap_or_else(|_| panic!("message {index} got no answer within 10 s"));
            streams[position].1.push((index, answer.expect("no fault")));
        }
        // A power loss now: what every stream acknowledged must be there.
        let mode = if round % 3 == 0 {
            CrashMode::DurableOnly
        } else {
            CrashMode::TornTail
        };
        images.push((
            storage.crash(mode, u64::from(round)),
            streams.clone(),
            format!("{mode:?} after round {round}"),
        ));
    }
    let metrics = server
        .state
        .journal_metrics()
        .expect("the server has a journal");
    if STREAMS > few_logs {
        assert!(
            metrics.rounds > 0,
            "rounds of several streams went through the journal: {metrics:?}"
        );
        assert!(metrics.rotations > 0, "the journal rotated: {metrics:?}");
    } else {
        // Six streams are few: each wrote and synced its own log.
        assert_eq!(metrics.rounds, 0, "{metrics:?}");
        assert!(metrics.direct_writes >= 12 * STREAMS as u64, "{metrics:?}");
    }
    if let Some(folder) = &journal_dir {
        let journal = folder.join(wal::journal::JOURNAL_FILE);
        assert!(
            storage.read_file(&journal).is_some(),
            "the journal is in {}",
            folder.display()
        );
        let in_data = std::path::Path::new("/stamplog").join(wal::journal::JOURNAL_FILE);
        assert!(
            storage.read_file(&in_data).is_none(),
            "no journal in the data folder"
        );
    }
    for (image, acked, what) in images {
        check_recovered_streams(configured(&image), &acked, &what).await;
    }
    drop(client);
    server.stop().await;
}

/// Sends messages `range` through `publisher`, each acknowledged within
/// 30 s, into `history`.
async fn publish_all(
    publisher: &client::Publisher,
    history: &mut checker::ClientHistory,
    range: std::ops::Range<u32>,
) {
    publish_within(publisher, history, range, Duration::from_secs(30)).await;
}

/// [`publish_all`], each message given room in the window and
/// acknowledged within `limit`.
async fn publish_within(
    publisher: &client::Publisher,
    history: &mut checker::ClientHistory,
    range: std::ops::Range<u32>,
    limit: Duration,
) {
    let mut pending = Vec::new();
    for index in range.clone() {
        let body = payload(index);
        let sent = tokio::time::timeout(limit, publisher.submit(b"", &body))
            .await
            .unwrap_or_else(|_| panic!("message {index} finds no room in the window in {limit:?}"))
            .unwrap();
        history.sent.push(checker::Sent {
            event: sent.event,
            digest: checker::digest(b"", &body),
        });
        pending.push((index, sent));
    }
    for (index, sent) in pending {
        let ack = tokio::time::timeout(limit, sent)
            .await
            .unwrap_or_else(|_| panic!("message {index} is not done in {limit:?}"))
            .unwrap_or_else(|error| panic!("message {index}: {error}"));
        history.acked.push(checker::Acked {
            event: ack.event,
            version: ack.version,
            duplicate: ack.duplicate,
        });
    }
}

/// Server `id`'s log of stream `name`, read through its storage.
fn replica_log_in(
    storage: &FaultStorage,
    data: &std::path::Path,
    name: &str,
    stream: u64,
    id: u32,
) -> checker::ReplicaLog {
    let mut records = Vec::new();
    let log = data.join("streams").join(name).join("log");
    wal::inspect(storage, &log, stream, &mut |record| {
        records.push(checker::Logged {
            version: record.header.version,
            event: record.header.event,
            digest: checker::digest(record.key, record.payload),
        })
    })
    .unwrap_or_else(|error| panic!("server {id}'s log: {error}"));
    checker::ReplicaLog {
        replica: format!("server-{id}"),
        records,
    }
}

/// The checker's verdict on `history` and the logs of stream `name`, `id`
/// in each server's `(id, data folder)`: clean, with `acknowledged`
/// messages.
fn judge(
    storages: &[FaultStorage],
    folders: &[(u32, std::path::PathBuf)],
    (name, id): (&str, u64),
    history: &checker::ClientHistory,
    acknowledged: u64,
) {
    let logs: Vec<checker::ReplicaLog> = folders
        .iter()
        .map(|(server, data)| {
            replica_log_in(&storages[*server as usize - 1], data, name, id, *server)
        })
        .collect();
    let report = checker::check(std::slice::from_ref(history), &logs, None);
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.acknowledged, acknowledged, "{report}");
}

/// `count` servers with fast failure detection and an admin port, each
/// on a storage of its own (returned by server id - 1).
async fn cluster_on_storages(
    count: usize,
    folder: &std::path::Path,
) -> (server::LocalCluster, Vec<FaultStorage>) {
    let storages: Vec<FaultStorage> = (0..count).map(|_| FaultStorage::new()).collect();
    let shared = storages.clone();
    let cluster = server::LocalCluster::start(count, folder, move |config| {
        crate::harness::fast(config);
        config.storage = Arc::new(shared[config.cluster.me as usize - 1].clone());
        config.admin_listen = Some(std::net::SocketAddr::from(([127, 0, 0, 1], 0)));
    })
    .await
    .unwrap();
    (cluster, storages)
}

/// A replica's disk fills in a three-server cluster (each server has a
/// storage of its own; the victim's refuses writes past a limit): its log
/// fails, the control plane takes its process out of the stream as if it
/// had left (a primary hands over to an in-sync backup in a new epoch),
/// and the stream goes on with the other two: every message is
/// acknowledged. Restarted with room on its disk, the server is a replica
/// again and catches up; the checker then judges all three logs.
async fn a_full_disk_on_one_replica(victim_is_primary: bool) {
    let folder = tempfile::tempdir().unwrap();
    let (mut cluster, storages) = cluster_on_storages(3, folder.path()).await;
    let (_client, info) =
        crate::harness::create_on_three(&cluster, "full", client::Protocol::OneHopAckClient).await;
    let victim = match victim_is_primary {
        true => info.primary,
        false => (1..=3).find(|&id| id != info.primary).unwrap(),
    };
    let storage = &storages[victim as usize - 1];
    // Room for about 100 messages of 1,000 bytes on the victim.
    storage.set_space_limit(Some(total_bytes(storage) + 100 * 1_050));
    let publisher = crate::harness::publisher(&info, 16, 200).await;
    let mut history = checker::ClientHistory::default();
    publish_all(&publisher, &mut history, 0..400).await;
    let observer_id = (1..=3).find(|&id| id != victim).unwrap();
    let observer = cluster.servers[observer_id as usize - 1].state();
    let placed = observer.control_state().unwrap().streams["full"].clone();
    assert!(!placed.in_sync.contains(&victim), "{placed:?}");
    assert!(!placed.replicas.contains(&victim), "{placed:?}");
    assert!(
        placed.failed.iter().any(|&(id, _)| id == victim),
        "{placed:?}"
    );
    assert_ne!(placed.primary, Some(victim), "{placed:?}");
    assert_eq!(placed.epoch, if victim_is_primary { 2 } else { 1 });
    let failed = cluster.servers[victim as usize - 1]
        .state()
        .stream_by_name("full")
        .and_then(|stream| stream.log.failure());
    assert!(
        failed.is_some_and(|why| why.contains("No space left on device")),
        "the victim's log failed for its full disk"
    );
    // An operator sees it in the victim's metrics, and only there.
    let series = r#"stamplog_log_failed{stream="full",protocol="one-hop-ack-client"}"#;
    for id in [victim, observer_id] {
        let admin = crate::observe::admin_address(&cluster, id);
        let (_, metrics) = crate::observe::http_get(admin, "/metrics").await;
        let expected = if id == victim { 1.0 } else { 0.0 };
        assert_eq!(crate::observe::sample(&metrics, series), Some(expected));
    }
    // And in `stamplog status`: the placement names the server whose log
    // failed, and that server's replica says why.
    let status = observer.status_json();
    let streams = status["cluster"]["streams"].as_array().unwrap();
    let full = streams.iter().find(|s| s["name"] == "full").unwrap();
    assert_eq!(full["failed"], serde_json::json!([victim]), "{full}");
    let mine = cluster.servers[victim as usize - 1].state().status_json();
    let why = mine["streams"][0]["failed"].as_str().unwrap_or_default();
    assert!(why.contains("No space left on device"), "{mine}");

    // Room again, and a restart: a replica again, caught up, in sync.
    cluster.stop_server(victim).await;
    storage.set_space_limit(None);
    cluster.start_server(victim).await.unwrap();
    publish_all(&publisher, &mut history, 400..500).await;
    crate::harness::wait_until(Duration::from_secs(20), "the victim back in sync", || {
        observer.control_state().is_some_and(|state| {
            let placed = &state.streams["full"];
            placed.in_sync.contains(&victim) && placed.failed.is_empty()
        })
    })
    .await;
    let newest = history.acked.iter().map(|a| a.version).max().unwrap();
    crate::harness::wait_until(Duration::from_secs(20), "every replica complete", || {
        cluster.servers.iter().all(|server| {
            server
                .current()
                .and_then(|state| state.stream_by_name("full"))
                .is_some_and(|stream| stream.log.durable_version() >= newest)
        })
    })
    .await;
    let folders: Vec<_> = cluster
        .servers
        .iter()
        .map(|s| (s.id, s.data.clone()))
        .collect();
    drop(publisher);
    drop(observer);
    cluster.stop().await;
    judge(&storages, &folders, ("full", info.id), &history, 500);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_whose_disk_fills_leaves_the_stream_and_comes_back_after_a_restart() {
    a_full_disk_on_one_replica(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_whose_disk_fills_hands_over_and_comes_back_after_a_restart() {
    a_full_disk_on_one_replica(true).await;
}

/// A replica's log fails while the control plane has no leader (three of
/// five servers down) for longer than its proposals once were retried
/// (30 s). The stream waits on the failed replica, which is still in
/// sync; its server keeps proposing `LogFailed`, and once the three are
/// back and a leader takes it, the stream goes on without the replica:
/// every message is acknowledged, and the checker judges the logs of the
/// primary and of the spare that took the failed replica's place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_failure_while_the_control_plane_has_no_leader_is_taken_once_it_has_one() {
    let folder = tempfile::tempdir().unwrap();
    let (mut cluster, storages) = cluster_on_storages(5, folder.path()).await;
    let client = Client::connect(client::ClientConfig::new(cluster.address(1).to_string()))
        .await
        .unwrap();
    let protocol = client::Protocol::OneHopAckClient;
    let info = client
        .create_stream_with("lone", DurabilityConfig::Sync, protocol, 2)
        .await
        .unwrap();
    let publisher = crate::harness::publisher(&info, 16, 200).await;
    let mut history = checker::ClientHistory::default();
    publish_all(&publisher, &mut history, 0..50).await;
    let primary = cluster.servers[info.primary as usize - 1].state();
    let placed = primary.control_state().unwrap().streams["lone"].clone();
    let victim = *placed
        .replicas
        .iter()
        .find(|&&id| id != info.primary)
        .unwrap();
    for id in 1..=5 {
        if !placed.replicas.contains(&id) {
            cluster.stop_server(id).await;
        }
    }
    let storage = &storages[victim as usize - 1];
    storage.set_space_limit(Some(total_bytes(storage) + 20 * 1_050));
    let server_of = |cluster: &server::LocalCluster, id: u32| {
        let found = cluster.servers.iter().find(|server| server.id == id);
        found.expect("the server runs").state()
    };
    let victim_state = server_of(&cluster, victim);
    let outage = async {
        crate::harness::wait_until(Duration::from_secs(20), "the victim's log failed", || {
            victim_state
                .stream_by_name("lone")
                .is_some_and(|stream| stream.log.failure().is_some())
        })
        .await;
        tokio::time::sleep(Duration::from_secs(35)).await;
        let stalled = primary.control_state().unwrap().streams["lone"].clone();
        assert!(
            stalled.in_sync.contains(&victim) && stalled.failed.is_empty(),
            "no leader, so the failed replica is still in sync: {stalled:?}"
        );
        for id in 1..=5 {
            if !placed.replicas.contains(&id) {
                cluster.start_server(id).await.unwrap();
            }
        }
    };
    tokio::join!(
        outage,
        publish_within(&publisher, &mut history, 50..3050, Duration::from_secs(120))
    );
    let now = primary.control_state().unwrap().streams["lone"].clone();
    assert!(
        now.failed.iter().any(|&(id, _)| id == victim) && !now.in_sync.contains(&victim),
        "{now:?}"
    );
    assert_eq!(now.replicas.len(), 2, "a spare took the place: {now:?}");
    let newest = history.acked.iter().map(|a| a.version).max().unwrap();
    crate::harness::wait_until(Duration::from_secs(20), "both replicas complete", || {
        now.replicas.iter().all(|&id| {
            server_of(&cluster, id)
                .stream_by_name("lone")
                .is_some_and(|stream| stream.log.durable_version() >= newest)
        })
    })
    .await;
    let folders: Vec<_> = now
        .replicas
        .iter()
        .map(|&id| {
            let server = cluster.servers.iter().find(|server| server.id == id);
            (id, server.expect("the server runs").data.clone())
        })
        .collect();
    drop((publisher, client, primary, victim_state));
    cluster.stop().await;
    judge(&storages, &folders, ("lone", info.id), &history, 3050);
}
