//! Failover on a three-server cluster in this process: the primary stops
//! (its heartbeats end), the control plane removes it in a new view, a
//! replica that holds every acknowledged version becomes primary in a new
//! epoch, and the publisher moves its messages there; the history checker
//! judges the surviving replicas. The kill loop with SIGKILL and restarts
//! of real processes is in the `bench` crate's tests.

use std::time::{Duration, Instant};

use checker::{Acked, ClientHistory, Sent};
use client::{Client, ClientConfig, Protocol};
use proto::DurabilityConfig;
use server::LocalCluster;

use crate::harness::fast;

async fn failover(protocol: Protocol) {
    let folder = tempfile::tempdir().unwrap();
    let mut cluster = LocalCluster::start(3, folder.path(), fast).await.unwrap();
    let client = Client::connect(ClientConfig::new(cluster.address(1).to_string()))
        .await
        .unwrap();
    let name = format!("f-{protocol}");
    let info = client
        .create_stream_with(&name, DurabilityConfig::Sync, protocol, 3)
        .await
        .unwrap();
    let publisher = crate::harness::publisher(&info, 16, 200).await;
    let mut history = ClientHistory::default();
    let mut pending = Vec::new();
    let mut stopped_at = None;
    for index in 0..600u64 {
        let body = format!("message {index}").into_bytes();
        let sent = publisher.submit(b"", &body).await.unwrap();
        history.sent.push(Sent {
            event: sent.event,
            digest: checker::digest(b"", &body),
        });
        pending.push(sent);
        if index == 200 {
            let primary = info.primary;
            let position = cluster
                .servers
                .iter()
                .position(|s| s.id == primary)
                .unwrap();
            cluster.servers.remove(position).stop().await;
            stopped_at = Some(Instant::now());
        }
        if index % 50 == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    let mut duplicates = 0;
    // Messages sent again after the failover. Those the new primary
    // logged from the resend carry possible-duplicate; no record of a
    // message sent once does.
    let mut marked = std::collections::BTreeSet::new();
    for sent in pending {
        let published = tokio::time::timeout(Duration::from_secs(30), sent)
            .await
            .unwrap_or_else(|_| panic!("{protocol}: a message is done within 30 s"))
            .expect("accepted");
        duplicates += u64::from(published.duplicate);
        if published.possible_duplicate {
            marked.insert(published.event);
        }
        history.acked.push(Acked {
            event: published.event,
            version: published.version,
            duplicate: published.duplicate,
        });
    }
    let recovered = stopped_at.unwrap().elapsed();
    let survivor = Client::connect(ClientConfig::new(cluster.servers[0].address.to_string()))
        .await
        .unwrap();
    let after = survivor.open_stream(&name).await.unwrap();
    assert_ne!(after.primary, info.primary, "{protocol}: a new primary");
    assert!(after.epoch > info.epoch, "{protocol}: a new epoch");
    assert_eq!(after.replicas.len(), 2, "{protocol}: the live replicas");
    let status: serde_json::Value =
        serde_json::from_str(&survivor.status().await.unwrap()).unwrap();
    let view = status["cluster"]["view"].as_u64().unwrap();
    assert!(view >= 4, "{protocol}: the stop made a new view: {status}");
    // Wait until both survivors commit everything, then judge their logs.
    let acknowledged = history.acked.iter().map(|a| a.version).max().unwrap();
    for server in &cluster.servers {
        let client = Client::connect(ClientConfig::new(server.address.to_string()))
            .await
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while client.open_stream(&name).await.unwrap().committed_version < acknowledged {
            assert!(
                Instant::now() < deadline,
                "{protocol}: server {} commits",
                server.id
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let data = crate::replication::data_folders(&cluster);
    drop(publisher);
    cluster.stop().await;
    let logs = crate::replication::replica_logs(&data, &name, info.id);
    let mut flagged_total = 0;
    for (id, data) in &data {
        let folder = data.join("streams").join(&name).join("log");
        let mut flagged = std::collections::BTreeSet::new();
        wal::inspect(&wal::FileStorage, &folder, info.id, &mut |record| {
            if record.header.flags & proto::FLAG_POSSIBLE_DUPLICATE != 0 {
                flagged.insert(record.header.event);
            }
        })
        .unwrap();
        assert!(
            flagged.is_subset(&marked),
            "{protocol}: server {id} flags records of messages sent once: {:?}",
            flagged.difference(&marked).collect::<Vec<_>>()
        );
        flagged_total = flagged_total.max(flagged.len());
    }
    let report = checker::check(std::slice::from_ref(&history), &logs, None);
    assert!(report.is_clean(), "{protocol}: {report}");
    assert_eq!(report.acknowledged, 600, "{protocol}: {report}");
    eprintln!(
        "{protocol}: all 600 acknowledged {:.0} ms after the stop, {duplicates} as duplicates, {} resent, {flagged_total} records flagged possible-duplicate",
        recovered.as_secs_f64() * 1e3,
        marked.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_protocol_fails_over_to_a_replica_with_every_acknowledged_version() {
    failover(Protocol::OneHopAckClient).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_other_versioned_protocol_fails_over_too() {
    for protocol in Protocol::ALL {
        if matches!(protocol, Protocol::OneHopAckClient | Protocol::Unversioned) {
            continue;
        }
        failover(protocol).await;
    }
}

/// Waits (up to 15 s) until the status of the server `client` talks to
/// passes `done`; returns it.
async fn wait_status(
    client: &Client,
    what: &str,
    done: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let status: serde_json::Value =
            serde_json::from_str(&client.status().await.unwrap()).unwrap();
        if done(&status) {
            return status;
        }
        assert!(Instant::now() < deadline, "never {what}: {status}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until the status shows `stream` in a state whose text starts
/// with `state`.
async fn wait_state(client: &Client, stream: &str, state: &str) {
    wait_status(client, &format!("{stream} {state}"), |status| {
        status["cluster"]["streams"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|s| s["name"] == stream)
            .and_then(|s| s["availability"].as_str())
            .is_some_and(|shown| shown.starts_with(state))
    })
    .await;
}

/// Submits `waited`, checks that it is not acknowledged within 500 ms
/// (`holder` would have taken it), starts server `server` again and
/// returns the acknowledgement, which must come within 15 s.
async fn held_until_started(
    publisher: &client::Publisher,
    cluster: &mut LocalCluster,
    server: u32,
    holder: &str,
) -> client::Published {
    let waiting = publisher.submit(b"", b"waited").await.unwrap();
    let mut waiting = Box::pin(waiting);
    assert!(
        tokio::time::timeout(Duration::from_millis(500), &mut waiting)
            .await
            .is_err(),
        "{holder} took a write"
    );
    cluster.start_server(server).await.unwrap();
    tokio::time::timeout(Duration::from_secs(15), waiting)
        .await
        .unwrap_or_else(|_| panic!("the write waiting on {holder} never landed"))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_below_its_requirement_goes_read_only_or_blocks_and_resumes_by_itself() {
    let folder = tempfile::tempdir().unwrap();
    let mut cluster = LocalCluster::start(3, folder.path(), |config| {
        fast(config);
        config.cluster.roles = if config.cluster.me == 1 {
            vec!["east".into()]
        } else {
            vec!["west".into()]
        };
    })
    .await
    .unwrap();
    let (client, info) =
        crate::harness::create_on_three(&cluster, "guarded", Protocol::OneHopAckClient).await;
    let requirement = (vec!["east".to_string()], 3, client::LossAction::ReadOnly);
    client
        .set_requirement("guarded", Some(requirement))
        .await
        .unwrap();
    // A requirement on a stream that does not exist is refused.
    let unknown = client
        .set_requirement(
            "nowhere",
            Some((Vec::new(), 1, client::LossAction::ReadOnly)),
        )
        .await;
    assert!(unknown.is_err());
    wait_state(&client, "guarded", "available").await;
    let publisher = crate::harness::publisher(&info, 8, 100).await;
    publisher.send(b"", b"before").await.unwrap();

    // A backup (not server 1, which the client talks to) goes away: two
    // in-sync replicas of the three required.
    let victim = if info.primary == 3 { 2 } else { 3 };
    cluster.stop_server(victim).await;
    wait_state(&client, "guarded", "read-only").await;
    let refused = tokio::time::timeout(Duration::from_secs(10), publisher.send(b"", b"refused"))
        .await
        .expect("a read-only stream answers at once");
    match refused {
        Err(client::ClientError::Server { code, message }) => {
            assert_eq!(code, client::ErrorCode::ReadOnly, "{message}");
            assert!(message.contains("in-sync"), "{message}");
        }
        other => panic!("a read-only stream took a write: {other:?}"),
    }
    // Reads go on.
    let stream = client.open_stream("guarded").await.unwrap();
    let records = client.fetch(stream.id, 1, 10).await.unwrap();
    assert_eq!(records.len(), 1);

    // It comes back, catches up, is in sync again: writes resume.
    cluster.start_server(victim).await.unwrap();
    wait_state(&client, "guarded", "available").await;
    publisher.send(b"", b"after").await.unwrap();

    // `block`: writes wait while the requirement is not met, and go
    // through once it is met again within the timeout.
    let blocking = (
        vec!["east".to_string()],
        3,
        client::LossAction::Block { timeout_ms: 20_000 },
    );
    client
        .set_requirement("guarded", Some(blocking))
        .await
        .unwrap();
    cluster.stop_server(victim).await;
    wait_state(&client, "guarded", "block").await;
    let waiting = publisher.submit(b"", b"waited").await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    cluster.start_server(victim).await.unwrap();
    let waited = tokio::time::timeout(Duration::from_secs(15), waiting)
        .await
        .expect("the blocked write completes once the requirement is met")
        .unwrap();
    assert_eq!(waited.version, 3);
    let status: serde_json::Value = serde_json::from_str(&client.status().await.unwrap()).unwrap();
    let transitions = status["cluster"]["transitions"].to_string();
    assert!(transitions.contains("read-only"), "{transitions}");
    assert!(transitions.contains("block"), "{transitions}");
    drop(publisher);
    cluster.stop().await;
}

/// `reconnect` (F9): while the requirement is not met the stream is
/// closed to writers (their writes are refused and their connections
/// closed; the client library reconnects and retries); once it is met
/// again the stream reopens in a new epoch under the same primary, every
/// member rejoins it by state flush, and the waiting write lands. The
/// three logs agree, each message once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnect_stream_closes_and_its_members_rejoin_by_state_flush_once_the_requirement_is_met(
) {
    let folder = tempfile::tempdir().unwrap();
    let mut cluster = LocalCluster::start(3, folder.path(), fast).await.unwrap();
    let (_creator, info) =
        crate::harness::create_on_three(&cluster, "reopened", Protocol::OneHopAckClient).await;
    let client = Client::connect(ClientConfig::new(cluster.address(info.primary).to_string()))
        .await
        .unwrap();
    let requirement = (Vec::new(), 3, client::LossAction::Reconnect);
    client
        .set_requirement("reopened", Some(requirement))
        .await
        .unwrap();
    wait_state(&client, "reopened", "available").await;
    let publisher = crate::harness::publisher(&info, 8, 100).await;
    let mut history = ClientHistory::default();
    let mut note = |payload: &[u8], published: client::Published| {
        history.sent.push(Sent {
            event: published.event,
            digest: checker::digest(b"", payload),
        });
        history.acked.push(Acked {
            event: published.event,
            version: published.version,
            duplicate: published.duplicate,
        });
        published.version
    };
    let first = publisher.send(b"", b"before").await.unwrap();
    assert_eq!(note(b"before", first), 1);

    let victim = (1..=3).find(|id| *id != info.primary).unwrap();
    cluster.stop_server(victim).await;
    wait_state(&client, "reopened", "reconnect").await;
    let waited = held_until_started(&publisher, &mut cluster, victim, "a closed stream").await;
    assert_eq!(note(b"waited", waited), 2);
    let after = publisher.send(b"", b"after").await.unwrap();
    assert_eq!(note(b"after", after), 3);
    wait_state(&client, "reopened", "available").await;
    let reopened = client.open_stream("reopened").await.unwrap();
    assert_eq!(reopened.primary, info.primary, "the same primary");
    assert!(reopened.epoch > info.epoch, "a new epoch: {reopened:?}");
    let status = client.status().await.unwrap();
    assert!(status.contains("reopened in epoch"), "{status}");

    // Every member holds the three messages, once each, in one order.
    let mut logs = Vec::new();
    for id in 1..=3 {
        let reader = Client::connect(ClientConfig::new(cluster.address(id).to_string()))
            .await
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(15);
        while reader
            .open_stream("reopened")
            .await
            .unwrap()
            .committed_version
            < 3
        {
            assert!(Instant::now() < deadline, "server {id} never caught up");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let records = crate::harness::fetch_all(&reader, reopened.id).await;
        logs.push(checker::ReplicaLog {
            replica: format!("server-{id}"),
            records: records
                .iter()
                .map(|r| checker::Logged {
                    version: r.version,
                    event: r.event,
                    digest: checker::digest(&r.key, &r.payload),
                })
                .collect(),
        });
    }
    let report = checker::check(std::slice::from_ref(&history), &logs, None);
    assert!(report.is_clean(), "{report}");
    drop(publisher);
    cluster.stop().await;
}

/// A fourth server that none of the first three was configured with joins
/// through them: it becomes a member (and a voter), links to the others,
/// and takes a replica of a stream, by placement or by refilling one lost;
/// its log ends up with every acknowledged version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_no_one_was_configured_with_joins_and_holds_a_replica() {
    let folder = tempfile::tempdir().unwrap();
    let mut cluster = LocalCluster::start(3, folder.path(), fast).await.unwrap();
    let added = cluster.add_server(folder.path(), fast).await.unwrap();
    assert_eq!(added, 4);
    let client = Client::connect(ClientConfig::new(cluster.address(1).to_string()))
        .await
        .unwrap();
    let status: serde_json::Value = serde_json::from_str(&client.status().await.unwrap()).unwrap();
    let members = status["cluster"]["members"].as_array().unwrap();
    assert_eq!(members.len(), 4, "{status}");

    let info = client
        .create_stream_with(
            "grown",
            DurabilityConfig::Sync,
            Protocol::OneHopAckClient,
            3,
        )
        .await
        .unwrap();
    let publisher = crate::harness::publisher(&info, 16, 200).await;
    let mut history = ClientHistory::default();
    let send = async |history: &mut ClientHistory, from: u64| {
        let mut pending = Vec::new();
        for index in from..from + 200 {
            let body = format!("message {index}").into_bytes();
            let sent = publisher.submit(b"", &body).await.unwrap();
            history.sent.push(Sent {
                event: sent.event,
                digest: checker::digest(b"", &body),
            });
            pending.push(sent);
        }
        for sent in pending {
            let published = tokio::time::timeout(Duration::from_secs(30), sent)
                .await
                .expect("acknowledged within 30 s")
                .unwrap();
            history.acked.push(Acked {
                event: published.event,
                version: published.version,
                duplicate: published.duplicate,
            });
        }
    };
    send(&mut history, 0).await;
    // A replica other than the new server and server 1 goes: if server 4
    // was not a replica, it refills the lost one.
    let victim = *info
        .replicas
        .iter()
        .map(|r| &r.id)
        .find(|id| **id != 4 && **id != 1)
        .unwrap();
    cluster.stop_server(victim).await;
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let placed = client.open_stream("grown").await.unwrap();
        if placed.replicas.iter().any(|r| r.id == 4)
            && placed.replicas.iter().all(|r| r.id != victim)
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "server 4 never held a replica: {placed:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    send(&mut history, 200).await;
    let acknowledged = history.acked.iter().map(|a| a.version).max().unwrap();
    let fourth = Client::connect(ClientConfig::new(cluster.address(4).to_string()))
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    while fourth
        .open_stream("grown")
        .await
        .map_or(0, |s| s.committed_version)
        < acknowledged
    {
        assert!(Instant::now() < deadline, "server 4 catches up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let placed = client.open_stream("grown").await.unwrap();
    let holders: Vec<(u32, std::path::PathBuf)> = cluster
        .servers
        .iter()
        .filter(|s| placed.replicas.iter().any(|r| r.id == s.id))
        .map(|s| (s.id, s.data.clone()))
        .collect();
    drop(publisher);
    cluster.stop().await;
    let logs = crate::replication::replica_logs(&holders, "grown", info.id);
    assert!(logs.len() >= 2);
    let report = checker::check(std::slice::from_ref(&history), &logs, None);
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.acknowledged, 400, "{report}");
}

/// Waits until the status shows a view of `members` members.
async fn wait_members(client: &Client, members: usize) -> serde_json::Value {
    wait_status(client, &format!("{members} members"), |status| {
        status["cluster"]["members"].as_array().map(Vec::len) == Some(members)
    })
    .await
}

/// A cluster grown to four voters loses two servers: with one of them
/// retired first, the other three voters are still a majority, so the
/// control plane removes the second one in a new view. Retiring a live
/// member is refused; retiring a server again changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retired_server_no_longer_counts_toward_the_majority() {
    let folder = tempfile::tempdir().unwrap();
    let mut cluster = LocalCluster::start(3, folder.path(), fast).await.unwrap();
    cluster.add_server(folder.path(), fast).await.unwrap();
    let client = Client::connect(ClientConfig::new(cluster.address(1).to_string()))
        .await
        .unwrap();
    let status = wait_members(&client, 4).await;
    assert_eq!(
        status["cluster"]["voters"].as_array().unwrap().len(),
        4,
        "{status}"
    );

    for live in [2, 1] {
        let refused = client.retire_server(live).await;
        assert!(
            matches!(
                refused,
                Err(client::ClientError::Server {
                    code: client::ErrorCode::InvalidArgument,
                    ..
                })
            ),
            "server {live} is live: {refused:?}"
        );
    }
    cluster.stop_server(4).await;
    wait_members(&client, 3).await;
    client.retire_server(4).await.unwrap();
    // Asked again, it is already done.
    client.retire_server(4).await.unwrap();
    let status: serde_json::Value = serde_json::from_str(&client.status().await.unwrap()).unwrap();
    let voters: Vec<u64> = status["cluster"]["voters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert_eq!(voters, vec![1, 2, 3]);

    // Two of the three voters left are a majority: losing server 3 still
    // makes a new view.
    cluster.stop_server(3).await;
    let status = wait_members(&client, 2).await;
    let ids: Vec<u64> = status["cluster"]["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_u64().unwrap())
        .collect();
    assert_eq!(ids, vec![1, 2]);
    cluster.stop().await;
}

/// No requirement set: a stream of three replicas needs two in sync. With
/// one backup gone it goes on (under-replicated, and `status` says so);
/// with both gone the primary alone acknowledges nothing and writes wait,
/// until a backup is back in sync. Five servers, so that the control
/// plane keeps its majority with two down; servers 4 and 5 hold no
/// streams (admin only), so no spare refills the lost replicas.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_default_writes_wait_for_a_majority_of_the_replicas_in_sync() {
    let folder = tempfile::tempdir().unwrap();
    let mut cluster = LocalCluster::start(5, folder.path(), |config| {
        fast(config);
        config.cluster.admin_only = config.cluster.me > 3;
    })
    .await
    .unwrap();
    let (_creator, info) =
        crate::harness::create_on_three(&cluster, "majority", Protocol::OneHopAckClient).await;
    // The client talks to the primary, which stays.
    let client = Client::connect(ClientConfig::new(cluster.address(info.primary).to_string()))
        .await
        .unwrap();
    let status = wait_status(&client, "the default requirement", |status| {
        status["cluster"]["streams"][0]["requirement"]
            .as_str()
            .is_some_and(|r| r.starts_with("2 of 3 in sync") && r.ends_with("(default)"))
    })
    .await;
    assert_eq!(status["cluster"]["under_replicated"], 0, "{status}");
    let publisher = crate::harness::publisher(&info, 8, 100).await;
    publisher.send(b"", b"first").await.unwrap();

    let mut backups = (1..=3).filter(|id| *id != info.primary);
    let (first, second) = (backups.next().unwrap(), backups.next().unwrap());
    cluster.stop_server(first).await;
    publisher.send(b"", b"two of three").await.unwrap();
    wait_status(&client, "one stream under-replicated", |status| {
        status["cluster"]["under_replicated"] == 1
    })
    .await;

    cluster.stop_server(second).await;
    wait_state(&client, "majority", "block").await;
    let waited = held_until_started(&publisher, &mut cluster, second, "the primary alone").await;
    assert_eq!(waited.version, 3);
    wait_state(&client, "majority", "available").await;
    drop(publisher);
    cluster.stop().await;
}
