//! A removed live server rejoins by itself: the cluster removes a server
//! that is still running (as the failure detector does when the server
//! was paused, cut off or slow), and the server notices, closes, opens
//! again from its folder as a new member (a new join view; the old one
//! stays shunned), cuts what the cluster does not agree with, catches up
//! by state flush and counts toward acknowledgements again, with no
//! restart and no operator. And a reader whose server dies goes on
//! through another replica.

use std::sync::Arc;
use std::time::{Duration, Instant};

use checker::{Acked, ClientHistory, Sent};
use client::{Client, ClientConfig, Protocol, Publisher};
use server::{LocalCluster, ServerState};

const NAME: &str = "rejoined";

fn state_of(cluster: &LocalCluster, id: u32) -> Option<Arc<ServerState>> {
    cluster.servers.iter().find(|s| s.id == id)?.current()
}

/// Sends messages `from..to` and records them, each acknowledged.
async fn send(publisher: &Publisher, history: &mut ClientHistory, from: u64, to: u64) {
    for index in from..to {
        let body = format!("message {index}").into_bytes();
        let sent = publisher.submit(b"", &body).await.unwrap();
        history.sent.push(Sent {
            event: sent.event,
            digest: checker::digest(b"", &body),
        });
        let published = tokio::time::timeout(Duration::from_secs(30), sent)
            .await
            .unwrap_or_else(|_| panic!("message {index} is done within 30 s"))
            .expect("accepted");
        history.acked.push(Acked {
            event: published.event,
            version: published.version,
            duplicate: published.duplicate,
        });
    }
}

/// Creates the stream on three servers and sends messages `0..count`
/// through a publisher: the client, the stream, the publisher and the
/// history so far.
async fn create_and_send(
    cluster: &LocalCluster,
    count: u64,
) -> (Client, client::StreamInfo, Publisher, ClientHistory) {
    let (client, info) =
        crate::harness::create_on_three(cluster, NAME, Protocol::OneHopAckClient).await;
    let publisher = crate::harness::publisher(&info, 16, 200).await;
    let mut history = ClientHistory::default();
    send(&publisher, &mut history, 0, count).await;
    (client, info, publisher, history)
}

/// Waits (at most 20 s) until every server's copy of the stream holds
/// `newest`.
async fn every_replica_holds(cluster: &LocalCluster, newest: u64) {
    crate::harness::wait_until(Duration::from_secs(20), "every replica complete", || {
        (1..=3).all(|id| {
            state_of(cluster, id)
                .and_then(|state| state.stream_by_name(NAME))
                .is_some_and(|stream| stream.log.durable_version() >= newest)
        })
    })
    .await;
}

/// The join view of `id`'s member in `observer`'s control state.
fn join_view(observer: &ServerState, id: u32) -> Option<u64> {
    let state = observer.control_state()?;
    state.members.get(&id).map(|m| m.join_view)
}

async fn removed_server_rejoins(victim_is_primary: bool) {
    let folder = tempfile::tempdir().unwrap();
    let cluster = LocalCluster::start(3, folder.path(), crate::harness::fast)
        .await
        .unwrap();
    let (_client, info, publisher, mut history) = create_and_send(&cluster, 200).await;

    let victim = if victim_is_primary {
        info.primary
    } else {
        (1..=3).find(|&id| id != info.primary).unwrap()
    };
    let observer_id = (1..=3).find(|&id| id != victim).unwrap();
    let observer = state_of(&cluster, observer_id).unwrap();
    let old_view = join_view(&observer, victim).unwrap();
    // The cluster removes the live server, as its failure detector does
    // when the server has been silent for longer than the suspect timeout.
    let removal = control::Command::Remove {
        id: victim,
        join_view: old_view,
        reason: "suspected (test)".to_string(),
    };
    observer.control().unwrap().propose(removal).await.unwrap();
    let removed_at = Instant::now();
    send(&publisher, &mut history, 200, 400).await;

    // It comes back by itself as a new member, in a later view.
    crate::harness::wait_until(Duration::from_secs(10), "the server to rejoin", || {
        join_view(&observer, victim).is_some_and(|view| view > old_view)
    })
    .await;
    let rejoined_after = removed_at.elapsed();
    let new_view = join_view(&observer, victim).unwrap();
    // Its old incarnation stays shunned: its view is not the member's.
    assert!(new_view > old_view);

    // It is back in the stream's in-sync set and holds every version.
    crate::harness::wait_until(Duration::from_secs(10), "the server back in sync", || {
        observer.control_state().is_some_and(|state| {
            state.streams[NAME].in_sync.contains(&victim)
                && state.streams[NAME].replicas.contains(&victim)
        })
    })
    .await;
    send(&publisher, &mut history, 400, 500).await;
    let newest = history.acked.iter().map(|a| a.version).max().unwrap();
    every_replica_holds(&cluster, newest).await;

    let data = crate::replication::data_folders(&cluster);
    drop(publisher);
    drop(observer);
    cluster.stop().await;
    let logs = crate::replication::replica_logs(&data, NAME, info.id);
    for log in &logs {
        let last = log.records.last().map_or(0, |r| r.version);
        assert!(
            last >= newest,
            "{} holds up to {last} of {newest}",
            log.replica
        );
    }
    let report = checker::check(std::slice::from_ref(&history), &logs, None);
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.acknowledged, 500, "{report}");
    eprintln!(
        "server {victim} (primary: {victim_is_primary}) rejoined {:.0} ms after its removal, in view {new_view} (was {old_view})",
        rejoined_after.as_secs_f64() * 1e3
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_live_backup_rejoins_by_itself_and_catches_up() {
    removed_server_rejoins(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_live_primary_rejoins_by_itself_after_the_failover() {
    removed_server_rejoins(true).await;
}

/// A reader whose server dies goes on reading through another replica of
/// the stream, from the version after the last it got: nothing skipped,
/// nothing twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_resumes_on_another_replica_when_its_server_dies() {
    let folder = tempfile::tempdir().unwrap();
    let mut cluster = LocalCluster::start(3, folder.path(), crate::harness::fast)
        .await
        .unwrap();
    let (_creator, info) =
        crate::harness::create_on_three(&cluster, NAME, Protocol::OneHopAckClient).await;
    let publisher = crate::harness::publisher(&info, 16, 200).await;
    let mut history = ClientHistory::default();
    send(&publisher, &mut history, 0, 100).await;
    // The reader talks to a backup that is not server 1: it learns the
    // stream's replicas when it opens the stream.
    let doomed = (1..=3).find(|&id| id != info.primary && id != 1).unwrap();
    let reader = Client::connect(ClientConfig::new(cluster.address(doomed).to_string()))
        .await
        .unwrap();
    reader.open_stream(NAME).await.unwrap();
    let mut subscription = reader.subscribe(info.id, 1).await.unwrap();
    let mut versions = Vec::new();
    while versions.len() < 50 {
        let record = subscription.next().await.unwrap().unwrap();
        versions.push(record.version);
    }
    cluster.stop_server(doomed).await;
    send(&publisher, &mut history, 100, 200).await;
    while versions.len() < 200 {
        let record = tokio::time::timeout(Duration::from_secs(20), subscription.next())
            .await
            .expect("the subscription goes on through another server")
            .unwrap()
            .unwrap();
        versions.push(record.version);
    }
    let expected: Vec<u64> = (1..=200).collect();
    assert_eq!(versions, expected, "every version once, in order");
    drop(publisher);
    cluster.stop().await;
}

/// A backup whose log is damaged while it is down (bytes flipped inside a
/// record well before its tail, so recovery refuses the log rather than
/// cutting a torn tail) comes back with every version: its copy is set
/// aside in `<data>/damaged`, as it was, and a new replica catches up
/// from its peers. The history checker judges every replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_whose_log_was_damaged_while_down_comes_back_with_every_version() {
    let folder = tempfile::tempdir().unwrap();
    // No journal: its redo would write the damaged bytes over again.
    let mut cluster = LocalCluster::start(3, folder.path(), |config| {
        crate::harness::fast(config);
        config.journal_bytes_max = 0;
        config.admin_listen = Some(std::net::SocketAddr::from(([127, 0, 0, 1], 0)));
    })
    .await
    .unwrap();
    let (_client, info, publisher, mut history) = create_and_send(&cluster, 300).await;
    let victim = (1..=3).find(|&id| id != info.primary).unwrap();
    let data = crate::replication::data_folders(&cluster);
    let victim_data = data.iter().find(|(id, _)| *id == victim).unwrap().1.clone();
    cluster.stop_server(victim).await;
    let log = victim_data.join("streams").join(NAME).join("log");
    let mut segments: Vec<_> = std::fs::read_dir(&log)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "seg"))
        .collect();
    segments.sort();
    let segment = segments.first().expect("the victim has a segment");
    let mut bytes = std::fs::read(segment).unwrap();
    // A third of the way into 300 records of about 90 bytes each.
    assert!(bytes.len() > 20_000, "{} bytes", bytes.len());
    let at = bytes.len() / 3;
    for byte in &mut bytes[at..at + 16] {
        *byte ^= 0x5a;
    }
    std::fs::write(segment, &bytes).unwrap();
    send(&publisher, &mut history, 300, 400).await;
    cluster.start_server(victim).await.unwrap();
    send(&publisher, &mut history, 400, 500).await;
    let newest = history.acked.iter().map(|a| a.version).max().unwrap();
    every_replica_holds(&cluster, newest).await;
    // The victim's metrics count the copy set aside.
    for id in [victim, info.primary] {
        let admin = crate::observe::admin_address(&cluster, id);
        let (_, metrics) = crate::observe::http_get(admin, "/metrics").await;
        let kept = crate::observe::sample(&metrics, "stamplog_damaged_copies");
        assert_eq!(
            kept,
            Some(if id == victim { 1.0 } else { 0.0 }),
            "server {id}"
        );
    }
    drop(publisher);
    cluster.stop().await;
    let logs = crate::replication::replica_logs(&data, NAME, info.id);
    let report = checker::check(std::slice::from_ref(&history), &logs, None);
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.acknowledged, 500, "{report}");
    // The copy that could not be opened is kept as it was, not deleted.
    let kept: Vec<_> = std::fs::read_dir(victim_data.join(server::DAMAGED_FOLDER))
        .expect("a folder of damaged copies")
        .map(|entry| entry.unwrap().path())
        .collect();
    assert_eq!(kept.len(), 1, "{kept:?}");
    let name = kept[0].file_name().unwrap().to_string_lossy().into_owned();
    assert!(name.starts_with(&format!("{NAME}-{}-", info.id)), "{name}");
    let kept_segment = kept[0].join("log").join(segment.file_name().unwrap());
    assert_eq!(
        std::fs::read(kept_segment).unwrap(),
        bytes,
        "the damaged bytes, kept"
    );
}
