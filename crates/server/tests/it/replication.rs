//! Every replication protocol on a three-server cluster in this process,
//! through the client library's `Publisher`, judged by the history
//! checker: a steady writer, a writer killed mid-stream, and readers on
//! every replica.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use checker::{Acked, ClientHistory, Logged, ReplicaLog, Sent};
use client::{Client, ClientConfig, Protocol, Publisher, PublisherConfig};
use proto::DurabilityConfig;
use server::LocalCluster;

/// Reads one replica's log of `stream` from its data folder, read-only.
pub fn replica_log(data: &Path, name: &str, stream: u64, label: String) -> ReplicaLog {
    let folder = data.join("streams").join(name).join("log");
    let mut records = Vec::new();
    wal::inspect(&wal::FileStorage, &folder, stream, &mut |record| {
        records.push(Logged {
            version: record.header.version,
            event: record.header.event,
            digest: checker::digest(record.key, record.payload),
        })
    })
    .unwrap_or_else(|error| panic!("reading {}: {error}", folder.display()));
    ReplicaLog {
        replica: label,
        records,
    }
}

/// Each server's id and data folder, to read the logs once it stopped.
pub fn data_folders(cluster: &LocalCluster) -> Vec<(u32, std::path::PathBuf)> {
    cluster
        .servers
        .iter()
        .map(|s| (s.id, s.data.clone()))
        .collect()
}

/// The logs of stream `name` (id `stream`) in each of `folders`, labelled
/// `server-<id>`.
pub fn replica_logs(
    folders: &[(u32, std::path::PathBuf)],
    name: &str,
    stream: u64,
) -> Vec<ReplicaLog> {
    folders
        .iter()
        .map(|(id, folder)| replica_log(folder, name, stream, format!("server-{id}")))
        .collect()
}

fn payload(writer: u64, index: u64) -> Vec<u8> {
    let mut body = format!(
        "writer {writer} message {index} {}",
        "x".repeat((index % 50) as usize)
    )
    .into_bytes();
    // Every sixteenth message large enough that the client and the
    // primary send it as it is, a part of their send, not a copy.
    if index % 16 == 7 {
        body.resize(4096 + (index as usize * 977) % 16_000, b'y');
    }
    body
}

/// Sends `count` messages with `window` in flight; records the history.
pub async fn write(
    publisher: &Publisher,
    writer: u64,
    count: u64,
    history: &mut ClientHistory,
    acks_by_server: &mut Vec<(u32, Acked)>,
) {
    let mut pending = Vec::new();
    for index in 0..count {
        let body = payload(writer, index);
        let sent = publisher.submit(b"k", &body).await.unwrap();
        history.sent.push(Sent {
            event: sent.event,
            digest: checker::digest(b"k", &body),
        });
        pending.push(sent);
    }
    for sent in pending {
        let published = tokio::time::timeout(Duration::from_secs(30), sent)
            .await
            .expect("a message is done within 30 s")
            .expect("accepted");
        history.acked.push(Acked {
            event: published.event,
            version: published.version,
            duplicate: published.duplicate,
        });
        for (server, version) in published.acks {
            acks_by_server.push((
                server,
                Acked {
                    event: published.event,
                    version,
                    duplicate: published.duplicate,
                },
            ));
        }
    }
}

async fn run_protocol(protocol: Protocol, cluster: &LocalCluster, client: &Client) {
    let name = format!("p-{protocol}");
    let info = client
        .create_stream_with(&name, DurabilityConfig::Sync, protocol, 3)
        .await
        .unwrap();
    assert_eq!(info.replicas.len(), 3);
    let mut history = ClientHistory::default();
    let mut acks_by_server = Vec::new();
    let steady = crate::harness::publisher(&info, 32, 200).await;
    write(&steady, 1, 200, &mut history, &mut acks_by_server).await;
    // A writer that dies mid-stream: messages in flight are abandoned,
    // some landed on some replicas, some nowhere.
    let doomed = Publisher::connect(&info, PublisherConfig::default())
        .await
        .unwrap();
    for index in 0..40u64 {
        let body = payload(2, index);
        let sent = doomed.submit(b"k", &body).await.unwrap();
        history.sent.push(Sent {
            event: sent.event,
            digest: checker::digest(b"k", &body),
        });
    }
    drop(doomed);
    write(&steady, 1, 100, &mut history, &mut acks_by_server).await;
    // Let the replicas repair what the dead writer left (gaps, voids).
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Readers on every replica see committed versions in order, once.
    for server in &cluster.servers {
        let reader = Client::connect(ClientConfig::new(server.address.to_string()))
            .await
            .unwrap();
        let records = reader.fetch(info.id, 1, 10_000).await.unwrap();
        // In order, each once; void versions (a dead writer's reservations)
        // are skipped, so a version may be missing but never repeat.
        for pair in records.windows(2) {
            assert!(
                pair[0].version < pair[1].version,
                "{protocol} on server {}",
                server.id
            );
        }
        assert!(
            records.iter().all(|r| r.event.client != 0),
            "{protocol}: a reader saw a void record"
        );
        assert!(
            records.len() >= 300 || protocol == Protocol::Unversioned,
            "{protocol}: server {} shows {} records",
            server.id,
            records.len()
        );
    }
    drop(steady);
    judge(protocol, cluster, &name, info.id, &history, &acks_by_server);
}

pub fn judge(
    protocol: Protocol,
    cluster: &LocalCluster,
    name: &str,
    stream: u64,
    history: &ClientHistory,
    acks_by_server: &[(u32, Acked)],
) {
    let logs: Vec<ReplicaLog> = cluster
        .servers
        .iter()
        .map(|s| replica_log(&s.data, name, stream, format!("server-{}", s.id)))
        .collect();
    if protocol == Protocol::Unversioned {
        // No shared version: each replica is judged with its own acks.
        for (server, log) in cluster.servers.iter().zip(logs) {
            let own = ClientHistory {
                sent: history.sent.clone(),
                acked: acks_by_server
                    .iter()
                    .filter(|(id, _)| *id == server.id)
                    .map(|(_, ack)| *ack)
                    .collect(),
            };
            let report = checker::check(&[own], &[log], None);
            assert!(
                report.is_clean(),
                "{protocol} server {}: {report}",
                server.id
            );
        }
        return;
    }
    let report = checker::check(std::slice::from_ref(history), &logs, None);
    assert!(report.is_clean(), "{protocol}: {report}");
    assert!(report.logged_versions >= 300, "{protocol}: {report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_protocol_replicates_one_version_on_every_replica() {
    let folder = tempfile::tempdir().unwrap();
    let cluster = LocalCluster::start(3, folder.path(), |config| {
        config.replication.gap_timeout_ms = 30;
        config.replication.reserve_timeout_ms = 300;
    })
    .await
    .unwrap();
    let client = Client::connect(ClientConfig::new(cluster.address(1).to_string()))
        .await
        .unwrap();
    let client = Arc::new(client);
    for protocol in Protocol::ALL {
        run_protocol(protocol, &cluster, &client).await;
    }
    // Flushes the logs, then judges again from the files.
    cluster.stop().await;
}

/// A window past what a server keeps per session for deduplication is
/// refused up front (it could deadlock); the largest one works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publisher_window_past_the_dedupe_bound_is_refused_and_the_bound_itself_works() {
    let folder = tempfile::tempdir().unwrap();
    let cluster = LocalCluster::start(1, folder.path(), |_| {}).await.unwrap();
    let client = Client::connect(ClientConfig::new(cluster.address(1).to_string()))
        .await
        .unwrap();
    let info = client
        .create_stream("window", DurabilityConfig::Sync)
        .await
        .unwrap();
    let config = |window| PublisherConfig {
        window,
        ..PublisherConfig::default()
    };
    for window in [0, client::PUBLISHER_WINDOW_MAX + 1] {
        match Publisher::connect(&info, config(window)).await {
            Err(client::ClientError::Config(message)) => {
                assert!(message.contains("65536"), "{message}")
            }
            Err(other) => panic!("window {window}: {other}"),
            Ok(_) => panic!("window {window} was taken"),
        }
    }
    let publisher = Publisher::connect(&info, config(client::PUBLISHER_WINDOW_MAX))
        .await
        .unwrap();
    let published = publisher.send(b"", b"one").await.unwrap();
    assert_eq!(published.version, 1);
    drop(publisher);
    cluster.stop().await;
}

/// The acknowledgements of one stream's messages, by the number of
/// messages the `Acked` runs among `frames` cover.
fn acked_of(frames: &[proto::Frame], stream: u64) -> u64 {
    frames
        .iter()
        .map(|frame| match frame {
            proto::Frame::Acked {
                stream: of, more, ..
            } if *of == stream => u64::from(*more) + 1,
            _ => 0,
        })
        .sum()
}

/// A client with a connection per stream to a server (a publisher per
/// stream) gets each acknowledgement on the connections that opened or
/// wrote to its stream, and a connection that did neither with any stream
/// still gets them all: one stream's acks do not go down every
/// connection of the client. A stream no connection opened goes down
/// every one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streams_acks_go_to_the_client_connections_that_opened_it() {
    use crate::harness::{create_on_three, raw_hello, read_frames};
    use tokio::io::AsyncWriteExt;
    let folder = tempfile::tempdir().unwrap();
    let cluster = LocalCluster::start(3, folder.path(), |_| {}).await.unwrap();
    let (_client, a) = create_on_three(&cluster, "routed-a", Protocol::OneHopAckClient).await;
    let (_client, b) = create_on_three(&cluster, "routed-b", Protocol::OneHopAckClient).await;
    // A backup of both streams: its acks reach the client only through the
    // router.
    let backup = (1..=3)
        .find(|id| *id != a.primary && *id != b.primary)
        .expect("three servers, two primaries");
    let address = cluster.address(backup);
    let open = |name: &str| {
        proto::Frame::OpenStream {
            request: 1,
            name: name.to_string(),
        }
        .to_bytes()
    };
    let mut only_a = raw_hello(address).await;
    only_a.write_all(&open("routed-a")).await.unwrap();
    let mut only_b = raw_hello(address).await;
    only_b.write_all(&open("routed-b")).await.unwrap();
    let mut neither = raw_hello(address).await;
    for socket in [&mut only_a, &mut only_b] {
        let (frames, _) = read_frames(socket, 1, Duration::from_secs(5)).await;
        assert!(
            matches!(frames.first(), Some(proto::Frame::StreamInfo { .. })),
            "{frames:?}"
        );
    }
    // The raw connections' client id.
    let config = PublisherConfig {
        client_id: Some(0xC0FFEE),
        retry: Duration::from_secs(30),
        ..PublisherConfig::default()
    };
    for info in [&a, &b] {
        let publisher = Publisher::connect(info, config.clone()).await.unwrap();
        for index in 0..5u8 {
            publisher.send(b"", &[index]).await.unwrap();
        }
    }
    let quiet = Duration::from_millis(500);
    let (frames_a, _) = read_frames(&mut only_a, usize::MAX, quiet).await;
    let (frames_b, _) = read_frames(&mut only_b, usize::MAX, quiet).await;
    let (frames_all, _) = read_frames(&mut neither, usize::MAX, quiet).await;
    assert_eq!(
        (acked_of(&frames_a, a.id), acked_of(&frames_a, b.id)),
        (5, 0),
        "{frames_a:?}"
    );
    assert_eq!(
        (acked_of(&frames_b, a.id), acked_of(&frames_b, b.id)),
        (0, 5),
        "{frames_b:?}"
    );
    assert_eq!(
        (acked_of(&frames_all, a.id), acked_of(&frames_all, b.id)),
        (5, 5),
        "{frames_all:?}"
    );
    // A stream none of the client's connections here opened or wrote to
    // (a connection the client shares among its streams whose
    // `OpenStream` has not arrived yet): its acks go down every one of
    // them, not nowhere.
    let mut c = None;
    for attempt in 0..6 {
        let name = format!("routed-c{attempt}");
        let (_client, info) = create_on_three(&cluster, &name, Protocol::OneHopAckClient).await;
        if info.primary != backup {
            c = Some(info);
            break;
        }
    }
    let c = c.expect("a stream led by another server");
    let mut writer = raw_hello(cluster.address(c.primary)).await;
    let mut submit = Vec::new();
    proto::frame::SubmitFields {
        stream: c.id,
        kind: proto::frame::SUBMIT_WRITE,
        version: 0,
        epoch: 0,
        session: 1,
        sequence: 1,
        low_water: 1,
    }
    .encode(&mut submit, b"", b"unannounced");
    writer.write_all(&submit).await.unwrap();
    let (written, _) = read_frames(&mut writer, 1, Duration::from_secs(5)).await;
    assert_eq!(
        acked_of(&written, c.id),
        1,
        "the primary's ack: {written:?}"
    );
    for (name, socket) in [
        ("a", &mut only_a),
        ("b", &mut only_b),
        ("neither", &mut neither),
    ] {
        let (frames, _) = read_frames(socket, usize::MAX, quiet).await;
        assert_eq!(acked_of(&frames, c.id), 1, "{name}: {frames:?}");
    }
    cluster.stop().await;
}

/// An idle publisher's background task stops ticking (a publisher per
/// stream, many of them idle, would otherwise wake 100 times a second
/// each); a send, and a link going down, start it again, and messages
/// sent after it parked are done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_publisher_parks_its_timer_and_wakes_for_a_send_or_a_broken_link() {
    let folder = tempfile::tempdir().unwrap();
    let mut cluster = LocalCluster::start(3, folder.path(), |_| {}).await.unwrap();
    let (_client, info) =
        crate::harness::create_on_three(&cluster, "parked", Protocol::OneHopAckClient).await;
    let publisher = crate::harness::publisher(&info, 16, 500).await;
    for round in 0..3u8 {
        for index in 0..5u8 {
            let payload = [round, index];
            let sent = tokio::time::timeout(Duration::from_secs(10), publisher.send(b"", &payload));
            sent.await
                .expect("done while the timer was parked")
                .unwrap();
        }
        // Parked within a few ticks of the last ack; then still.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let before = publisher.ticks();
        tokio::time::sleep(Duration::from_millis(300)).await;
        let after = publisher.ticks();
        assert!(
            after - before <= 1,
            "round {round}: {before} -> {after} ticks while idle"
        );
    }
    // A backup going down wakes the timer: it ticks while a link is down.
    let backup = (1..=3).find(|id| *id != info.primary).unwrap();
    let before = publisher.ticks();
    cluster.stop_server(backup).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let after = publisher.ticks();
    assert!(
        after >= before + 10,
        "{before} -> {after} ticks with a link down"
    );
    drop(publisher);
    cluster.stop().await;
}

/// An idle stream's clock rests between heartbeats instead of ticking
/// every tick (1,000 idle streams on three servers took 0.8 of a core
/// ticking), and its heartbeats, telling nothing new, come ever less often
/// up to `heartbeat_max_ms` (at 50 ms each, 3,000 idle replicas sent
/// 60,000 a second); the heartbeats still go, and a write after the rest
/// is done and found on every replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_streams_clock_rests_between_heartbeats_and_wakes_for_a_write() {
    let folder = tempfile::tempdir().unwrap();
    let cluster = LocalCluster::start(3, folder.path(), |_| {}).await.unwrap();
    let (_client, info) =
        crate::harness::create_on_three(&cluster, "resting", Protocol::OneHopAckClient).await;
    let publisher = crate::harness::publisher(&info, 16, 500).await;
    let tick = server::ServerConfig::new(folder.path()).tick_interval;
    let settings = engine::replication::ReplicaSettings::default();
    let streams: Vec<_> = cluster
        .servers
        .iter()
        .map(|server| server.state().stream_by_name("resting").unwrap())
        .collect();
    let ticks = || streams.iter().map(|s| s.clock_ticks()).collect::<Vec<_>>();
    let mut last_version = 0;
    for round in 0..2u8 {
        for index in 0..5u8 {
            let payload = [round, index];
            let sent = publisher.send(b"", &payload);
            let ack = tokio::time::timeout(Duration::from_secs(10), sent)
                .await
                .expect("a write after a rest is done")
                .unwrap();
            last_version = ack.version;
        }
        // The waits double from the base to the cap (50 + 100 + 200 +
        // 400 ms before the first of 800) within two caps of the last ack.
        let cap = Duration::from_millis(settings.heartbeat_max_ms);
        tokio::time::sleep(2 * cap).await;
        let before = ticks();
        let window = 2 * cap;
        tokio::time::sleep(window).await;
        let after = ticks();
        let every_tick = (window.as_millis() / tick.as_millis()) as u64;
        let every_heartbeat = window.as_millis() as u64 / settings.heartbeat_ms;
        let at_the_cap = window.as_millis() as u64 / settings.heartbeat_max_ms;
        for (server, (before, after)) in before.iter().zip(&after).enumerate() {
            let ticked = after - before;
            assert!(
                ticked <= 2 * (at_the_cap + 1),
                "round {round}, server {}: {ticked} ticks in {window:?} at rest ({every_tick} at every tick, {every_heartbeat} at every base heartbeat)",
                server + 1
            );
            assert!(
                ticked >= 1,
                "round {round}, server {}: no tick in {window:?}: the heartbeats stopped",
                server + 1
            );
        }
    }
    assert_eq!(last_version, 10);
    for stream in &streams {
        assert_eq!(
            stream.visible_version(),
            10,
            "every replica has every write"
        );
    }
    drop(publisher);
    cluster.stop().await;
}

/// The sample `series` summed over the servers of `cluster` (each with an
/// admin port).
async fn summed(cluster: &LocalCluster, series: &str) -> f64 {
    let mut sum = 0.0;
    for server in &cluster.servers {
        let admin = crate::observe::admin_address(cluster, server.id);
        let (_, metrics) = crate::observe::http_get(admin, "/metrics").await;
        sum += crate::observe::sample(&metrics, series)
            .unwrap_or_else(|| panic!("no {series} in server {}'s metrics", server.id));
    }
    sum
}

/// `stamplog_peer_links_handed{to="<to>"}` over the servers of `cluster`.
async fn links_handed(cluster: &LocalCluster, to: &str) -> f64 {
    let series = format!("stamplog_peer_links_handed_total{{to=\"{to}\"}}");
    summed(cluster, &series).await
}

/// A peer link is read by a thread of its own while quiet and by the
/// runtime while busy (`connection::peer`), and handed between the two
/// with the bytes it read and not yet cut. Here the marks are set so that
/// a link with more than one frame a read changes ways at every look (128
/// reads) while records flow: one stream at window 1, then 24 streams at
/// once at window 64, then one at window 1 again. Every stream's history across the changes
/// is judged by the checker: nothing lost, repeated or out of order on any
/// replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_links_change_ways_with_their_traffic_and_lose_nothing() {
    let folder = tempfile::tempdir().unwrap();
    let cluster = LocalCluster::start(3, folder.path(), |config| {
        config.admin_listen = Some(std::net::SocketAddr::from(([127, 0, 0, 1], 0)));
        // Busy past 1 frame or record a read, quiet under 4: a link whose
        // reads hold one frame of at most one record stays on its thread;
        // with 1 to 4 it changes at every look.
        config.peer_reading = server::PeerReading {
            busy_per_read: 1.0,
            quiet_per_read: 4.0,
        };
    })
    .await
    .unwrap();
    let client = Client::connect(ClientConfig::new(cluster.address(1).to_string()))
        .await
        .unwrap();
    let mut streams = Vec::new();
    for index in 0..24 {
        let name = format!("ways-{index}");
        let info = client
            .create_stream_with(&name, DurabilityConfig::Sync, Protocol::OneHopAckClient, 3)
            .await
            .unwrap();
        streams.push((name, info, ClientHistory::default(), Vec::new()));
    }
    type Written = (String, client::StreamInfo, ClientHistory, Vec<(u32, Acked)>);
    // One message at a time, each given time to settle: a frame a read.
    async fn quiet(stream: &mut Written) {
        let publisher = crate::harness::publisher(&stream.1, 1, 200).await;
        for _ in 0..300 {
            write(&publisher, 1, 1, &mut stream.2, &mut stream.3).await;
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    // Every server has a link from each of the two others.
    let accepted = "stamplog_peer_links_accepted_total";
    assert_eq!(summed(&cluster, accepted).await, 6.0);
    quiet(&mut streams[0]).await;

    let mut busy = tokio::task::JoinSet::new();
    for (writer, mut stream) in streams.drain(..).enumerate() {
        busy.spawn(async move {
            let publisher = crate::harness::publisher(&stream.1, 64, 200).await;
            write(&publisher, writer as u64, 600, &mut stream.2, &mut stream.3).await;
            stream
        });
    }
    streams = busy.join_all().await;
    streams.sort_by_key(|stream| stream.1.id);
    let to_runtime = links_handed(&cluster, "runtime").await;
    let to_thread = links_handed(&cluster, "thread").await;
    assert!(
        to_runtime >= 4.0,
        "{to_runtime} links handed to the runtime"
    );
    assert!(
        to_thread >= 2.0,
        "{to_thread} links handed back to a thread"
    );

    quiet(&mut streams[0]).await;
    // No link broke: a hand-over that lost or repeated a byte would have
    // cut a frame wrong and closed its link, and its peer dialled again.
    assert_eq!(summed(&cluster, accepted).await, 6.0);
    // Judged once the servers stopped and their logs hold every record.
    let folders = data_folders(&cluster);
    drop(client);
    cluster.stop().await;
    for (name, info, history, _) in &streams {
        let logs = replica_logs(&folders, name, info.id);
        let report = checker::check(std::slice::from_ref(history), &logs, None);
        assert!(report.is_clean(), "{name}: {report}");
        assert_eq!(
            report.acknowledged,
            history.sent.len() as u64,
            "{name}: {report}"
        );
    }
}
