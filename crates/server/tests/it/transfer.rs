//! Catching up from behind the retained log: a replica that was away
//! while its primary's retention deleted the versions it lacks gets the
//! primary's newest checkpoint instead (a checkpoint transfer), installs
//! it, takes the rest from the log, and counts toward acknowledgements
//! again.

use std::sync::Arc;
use std::time::Duration;

use client::{Client, ClientConfig, Protocol, Publisher};
use server::{LocalCluster, ServerState};

use crate::harness::{read_log, wait_until, LoggedRecord};

const NAME: &str = "behind";

fn state_of(cluster: &LocalCluster, id: u32) -> Arc<ServerState> {
    let server = cluster
        .servers
        .iter()
        .find(|s| s.id == id)
        .expect("running");
    server.state()
}

fn log_of(state: &ServerState) -> (u64, u64) {
    let stream = state.stream_by_name(NAME).expect("the stream is open");
    (stream.log.first_version(), stream.log.durable_version())
}

async fn send(publisher: &Publisher, from: u64, to: u64) {
    for index in from..to {
        let body = format!("message {index} {}", "x".repeat(480));
        publisher.send(b"", body.as_bytes()).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_behind_the_retained_log_catches_up_through_a_checkpoint_transfer() {
    let folder = tempfile::tempdir().unwrap();
    let mut cluster = LocalCluster::start(3, folder.path(), |config| {
        config.cluster.heartbeat_interval = Duration::from_millis(50);
        config.cluster.suspect_timeout = Duration::from_millis(400);
        config.replication.gap_timeout_ms = 30;
        // Small segments, frequent checkpoints, and retention that keeps
        // only what no checkpoint covers.
        config.segment_bytes_max = 4096;
        config.checkpoint_interval = Duration::from_millis(200);
        config.checkpoint_records = 0;
        config.retain_bytes = 1;
    })
    .await
    .unwrap();
    let (client, info) =
        crate::harness::create_on_three(&cluster, NAME, Protocol::OneHopAckClient).await;
    let publisher = crate::harness::publisher(&info, 16, 200).await;
    send(&publisher, 0, 20).await;
    // A backup other than server 1 (which the client talks to) goes away.
    let primary = info.primary;
    let victim = (1..=3).find(|&id| id != primary && id != 1).unwrap();
    let behind = log_of(&state_of(&cluster, victim)).1;
    cluster.stop_server(victim).await;

    // Many more messages: the primary's retention deletes what it lacks.
    send(&publisher, 20, 420).await;
    let leader = state_of(&cluster, primary);
    wait_until(
        Duration::from_secs(20),
        "retention past the replica",
        || log_of(&leader).0 > behind + 1,
    )
    .await;

    // It comes back and catches up through the transfer, while writes go
    // on: what follows the checkpoint comes from the primary's log.
    cluster.start_server(victim).await.unwrap();
    let returned = state_of(&cluster, victim);
    send(&publisher, 420, 480).await;
    wait_until(Duration::from_secs(30), "the replica to catch up", || {
        returned.stream_by_name(NAME).is_some_and(|s| {
            s.log.first_version() > behind + 1
                && s.log.durable_version() >= 480
                && s.checkpointed() > behind
        })
    })
    .await;
    let (first, _) = log_of(&returned);
    let through = first - 1;
    assert!(through > behind, "installed at {through}, held {behind}");
    let stream = returned.stream_by_name(NAME).unwrap();
    let checkpointed = stream.checkpointed();
    assert!(
        checkpointed >= through,
        "checkpointed {checkpointed}, the log starts at {first}"
    );
    drop(stream);

    // It counts toward acknowledgements again, and new writes reach all.
    wait_until(Duration::from_secs(30), "the replica back in sync", || {
        leader
            .stream_by_name(NAME)
            .is_some_and(|s| s.counting().contains(&victim))
    })
    .await;
    send(&publisher, 480, 500).await;
    let states: Vec<Arc<ServerState>> = (1..=3).map(|id| state_of(&cluster, id)).collect();
    wait_until(Duration::from_secs(20), "every log at 500", || {
        states.iter().all(|state| log_of(state).1 >= 500)
    })
    .await;

    // Readers of the returned replica asking for what it never held are
    // told the oldest version it has.
    let reader = Client::connect(ClientConfig::new(cluster.address(victim).to_string()))
        .await
        .unwrap();
    crate::harness::assert_version_1_unavailable(&reader, info.id, first).await;

    // The returned replica holds every version after the installed one,
    // and the logs agree on every version they all still hold (retention
    // goes on deleting at the others).
    let logs: Vec<Vec<LoggedRecord>> =
        tokio::task::spawn_blocking(move || states.iter().map(|s| read_log(s, NAME)).collect())
            .await
            .unwrap();
    let returned_versions: Vec<u64> = logs[victim as usize - 1]
        .iter()
        .map(|r| r.version)
        .collect();
    let oldest_left = logs[victim as usize - 1][0].version;
    assert!(
        oldest_left >= first,
        "the returned log starts at {oldest_left}"
    );
    assert_eq!(returned_versions, (oldest_left..=500).collect::<Vec<_>>());
    let common = logs.iter().map(|log| log[0].version).max().unwrap();
    assert!(common < 500, "the logs share versions {common}..=500");
    let tail = |log: &Vec<LoggedRecord>| -> Vec<LoggedRecord> {
        log.iter()
            .filter(|r| r.version >= common)
            .cloned()
            .collect()
    };
    for (index, log) in logs.iter().enumerate() {
        let versions: Vec<u64> = tail(log).iter().map(|r| r.version).collect();
        assert_eq!(
            versions,
            (common..=500).collect::<Vec<_>>(),
            "server {}",
            index + 1
        );
        assert_eq!(tail(log), tail(&logs[0]), "server {} disagrees", index + 1);
    }
    drop(publisher);
    drop(reader);
    drop(client);
    cluster.stop().await;
}
