//! The client side of the replication experiments (`bench patterns`,
//! `bench duplication`, `bench commit-interval`): the servers (each a
//! `stamplog server` child process by default, or all in one `stamplog
//! cluster` child with `--servers-as threads`), one admin connection per
//! server, replicated streams created on and deleted from
//! every replica, each replica's log counters read from its status, and the
//! publishing loop that keeps a window of messages in flight.
//!
//! The servers run in child processes so that the client's work (this
//! process, its own runtime) and the servers' work are apart, as they are
//! in the seeds' set-ups and in a deployment; all still share this
//! machine's cores.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use client::{
    Client, ClientConfig, ClientError, DurabilityConfig, ErrorCode, PendingPublish, Protocol,
    Publisher, StreamInfo, StreamOptions,
};
use indicatif::ProgressBar;
use tokio::sync::mpsc;

use crate::process::{ClusterOptions, Servers};

/// How long the replicas may take, after the client's last ack, to log
/// what the asynchronous protocols still copy in the background.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(20);

/// How many stream names [`Cluster::create_led_by`] tries before it gives
/// up finding one the cluster places on the wanted primary.
const PLACEMENT_ATTEMPTS_MAX: usize = 256;

/// How long the servers may take to see each other in the view.
const FORM_TIMEOUT: Duration = Duration::from_secs(30);

/// Durability of the replication experiments' streams.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Durability {
    /// Every replica acks after write + fdatasync, with group commit.
    Sync,
    /// No disk: the replicas keep records in memory.
    Memory,
    /// Sender-based logging: the log goes through a page buffer written in
    /// the background, and the client keeps each message until the
    /// primary's checkpoint covers it (forward protocols only).
    Sender,
}

/// The page buffer of the experiments' `sender` streams.
pub const SENDER_PAGES: u16 = 4;
pub const SENDER_PAGE_SIZE: u32 = 4 * 1024 * 1024;

impl Durability {
    pub fn name(self) -> &'static str {
        match self {
            Durability::Sync => "sync",
            Durability::Memory => "memory",
            Durability::Sender => "sender",
        }
    }

    pub fn config(self) -> DurabilityConfig {
        match self {
            Durability::Sync => DurabilityConfig::Sync,
            Durability::Memory => DurabilityConfig::Memory,
            Durability::Sender => DurabilityConfig::Sender {
                pages: SENDER_PAGES,
                page_size: SENDER_PAGE_SIZE,
            },
        }
    }
}

/// Parses a protocol name for a flag (`one-hop-ack-client`, `hybrid`, ...).
pub fn parse_protocol(text: &str) -> Result<Protocol, String> {
    text.trim().parse().map_err(|error| format!("{error}"))
}

/// One replica's log counters for one stream, from its server's status.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ReplicaLog {
    pub server: u32,
    pub appends: u64,
    pub syncs: u64,
    pub records_synced: u64,
    pub bytes_written: u64,
}

/// Records per fdatasync over all replicas, and bytes each record took
/// in the log (header, key and payload); `None` before the first sync.
pub fn batch_of(logs: &[ReplicaLog]) -> Option<(f64, f64)> {
    let syncs: u64 = logs.iter().map(|l| l.syncs).sum();
    let records: u64 = logs.iter().map(|l| l.records_synced).sum();
    let bytes: u64 = logs.iter().map(|l| l.bytes_written).sum();
    if syncs == 0 || records == 0 {
        return None;
    }
    Some((records as f64 / syncs as f64, bytes as f64 / records as f64))
}

/// The experiment's servers and one admin connection to each.
pub struct Cluster {
    servers: Servers,
    credentials: client::Credentials,
    admins: Vec<(u32, Client)>,
}

impl Cluster {
    /// Connects to every server of started servers, once every one of
    /// them sees all of them in the view.
    pub async fn connect(servers: Servers) -> anyhow::Result<Cluster> {
        let credentials = servers.credentials()?;
        let addresses = servers.addresses();
        let mut admins = Vec::with_capacity(addresses.len());
        for &(id, address) in &addresses {
            admins.push((id, connect_admin(address, &credentials).await?));
        }
        let cluster = Cluster {
            servers,
            credentials,
            admins,
        };
        cluster.wait_formed().await?;
        Ok(cluster)
    }

    /// Waits until every server's status names every server as a member
    /// (a lone server has no view and is formed at once).
    async fn wait_formed(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + FORM_TIMEOUT;
        for (id, admin) in &self.admins {
            loop {
                let status = admin
                    .status()
                    .await
                    .with_context(|| format!("cannot read the status of server {id}"))?;
                let document: serde_json::Value = serde_json::from_str(&status)
                    .with_context(|| format!("server {id} sent a status that is not JSON"))?;
                let members = document["cluster"]["members"].as_array().map(Vec::len);
                if self.admins.len() == 1 || members == Some(self.admins.len()) {
                    break;
                }
                ensure!(
                    Instant::now() < deadline,
                    "server {id} saw {members:?} members, not {}, after {FORM_TIMEOUT:?}",
                    self.admins.len()
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        Ok(())
    }

    /// The client address of server `server`.
    pub fn address(&self, server: u32) -> anyhow::Result<SocketAddr> {
        let addresses = self.servers.addresses();
        let found = addresses.iter().find(|(id, _)| *id == server);
        found
            .map(|(_, address)| *address)
            .with_context(|| format!("the cluster has no server {server}"))
    }

    /// What a client of the cluster connects with.
    pub fn credentials(&self) -> &client::Credentials {
        &self.credentials
    }

    /// The process id of each server (the same one for all when they run
    /// as threads of one process).
    pub fn pids(&self) -> Vec<(u32, u32)> {
        self.servers.pids()
    }

    /// The servers' ids, in the order the cluster printed them.
    pub fn server_ids(&self) -> Vec<u32> {
        self.admins.iter().map(|(id, _)| *id).collect()
    }

    fn admin(&self, server: u32) -> anyhow::Result<&Client> {
        self.admins
            .iter()
            .find(|(id, _)| *id == server)
            .map(|(_, client)| client)
            .with_context(|| format!("the cluster has no server {server}"))
    }

    /// Creates a stream through the first server, which creates the
    /// replica on every server of the set the cluster places it on.
    pub async fn create(
        &self,
        name: &str,
        durability: Durability,
        protocol: Protocol,
        replicas: u8,
    ) -> anyhow::Result<StreamInfo> {
        let (_, first) = &self.admins[0];
        first
            .create_stream_with(name, durability.config(), protocol, replicas)
            .await
            .with_context(|| {
                format!(
                    "cannot create stream {name} ({}, {}, {replicas} replicas)",
                    protocol.name(),
                    durability.name()
                )
            })
    }

    /// Creates a stream with `options` through the first server.
    pub async fn create_with(
        &self,
        name: &str,
        options: &StreamOptions,
    ) -> anyhow::Result<StreamInfo> {
        let (_, first) = &self.admins[0];
        first
            .create_stream_with_options(name, options)
            .await
            .with_context(|| format!("cannot create stream {name}"))
    }

    /// The replication part of stream `name`'s entry in server `server`'s
    /// status (its replica's state and counters).
    pub async fn replication_status(
        &self,
        server: u32,
        name: &str,
    ) -> anyhow::Result<serde_json::Value> {
        let status = self
            .admin(server)?
            .status()
            .await
            .with_context(|| format!("cannot read the status of server {server}"))?;
        Ok(stream_entry(&status, server, name)?["replication"].take())
    }

    /// Creates a stream named `<prefix>-<n>` whose primary is `primary`.
    ///
    /// The cluster places a stream by the hash of its name, so this tries
    /// names until one lands on `primary`, deleting the misses: the
    /// experiment decides where the load goes without knowing the hash.
    pub async fn create_led_by(
        &self,
        prefix: &str,
        durability: Durability,
        protocol: Protocol,
        replicas: u8,
        primary: u32,
    ) -> anyhow::Result<StreamInfo> {
        for attempt in 0..PLACEMENT_ATTEMPTS_MAX {
            let name = format!("{prefix}-{attempt}");
            let info = self.create(&name, durability, protocol, replicas).await?;
            if info.primary == primary {
                return Ok(info);
            }
            self.delete(&info).await?;
        }
        bail!("no name {prefix}-N placed a stream on primary {primary} in {PLACEMENT_ATTEMPTS_MAX} attempts")
    }

    /// Deletes the stream from every server of its replica set (a delete
    /// reaches only the server that gets it).
    pub async fn delete(&self, info: &StreamInfo) -> anyhow::Result<()> {
        for replica in &info.replicas {
            match self.admin(replica.id)?.delete_stream(&info.name).await {
                Ok(()) => {}
                Err(ClientError::Server {
                    code: ErrorCode::UnknownStream,
                    ..
                }) => {}
                Err(error) => {
                    return Err(error).with_context(|| {
                        format!("cannot delete {} on server {}", info.name, replica.id)
                    })
                }
            }
        }
        Ok(())
    }

    /// Each replica's log counters for the stream.
    pub async fn replica_logs(&self, info: &StreamInfo) -> anyhow::Result<Vec<ReplicaLog>> {
        let mut logs = Vec::with_capacity(info.replicas.len());
        for replica in &info.replicas {
            let status = self
                .admin(replica.id)?
                .status()
                .await
                .with_context(|| format!("cannot read the status of server {}", replica.id))?;
            logs.push(replica_log(&status, replica.id, &info.name)?);
        }
        Ok(logs)
    }

    /// Each replica's log counters once every replica holds `messages`
    /// records of the stream (and, for `sync`, has synced them), or after
    /// [`SETTLE_TIMEOUT`]; the flag says whether they settled.
    ///
    /// The asynchronous protocols ack before every replica has the record;
    /// waiting here keeps their background copying out of the next cell.
    pub async fn settled_replica_logs(
        &self,
        info: &StreamInfo,
        durability: Durability,
        messages: u64,
    ) -> anyhow::Result<(Vec<ReplicaLog>, bool)> {
        let deadline = Instant::now() + SETTLE_TIMEOUT;
        loop {
            let logs = self.replica_logs(info).await?;
            let settled = logs.iter().all(|log| {
                log.appends >= messages
                    && (durability == Durability::Memory || log.records_synced >= log.appends)
            });
            if settled || Instant::now() >= deadline {
                return Ok((logs, settled));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Closes the admin connections and stops the servers, each closing
    /// its logs as in service.
    pub fn stop(self) -> anyhow::Result<()> {
        drop(self.admins);
        self.servers.stop()
    }
}

async fn connect_admin(
    address: SocketAddr,
    credentials: &client::Credentials,
) -> anyhow::Result<Client> {
    let mut config = ClientConfig::new(address.to_string());
    config.credentials = credentials.clone();
    // Deleting a stream waits for its log to write what it holds, and a
    // status may wait behind a busy server: allow more than the default.
    config.request_timeout = Duration::from_secs(60);
    Client::connect(config)
        .await
        .with_context(|| format!("cannot connect to the cluster's server at {address}"))
}

/// Reads one stream's `log` counters out of a server's status document.
/// The entry of `stream` in server `server`'s status document.
fn stream_entry(status: &str, server: u32, stream: &str) -> anyhow::Result<serde_json::Value> {
    let document: serde_json::Value = serde_json::from_str(status)
        .with_context(|| format!("server {server} sent a status that is not JSON"))?;
    document["streams"]
        .as_array()
        .and_then(|streams| streams.iter().find(|s| s["name"] == stream))
        .cloned()
        .with_context(|| format!("server {server} has no stream {stream} in its status"))
}

fn replica_log(status: &str, server: u32, stream: &str) -> anyhow::Result<ReplicaLog> {
    let entry = stream_entry(status, server, stream)?;
    let log = &entry["log"];
    let field = |name: &str| -> anyhow::Result<u64> {
        log[name]
            .as_u64()
            .with_context(|| format!("server {server}'s status lacks log.{name} for {stream}"))
    };
    Ok(ReplicaLog {
        server,
        appends: field("appends")?,
        syncs: field("syncs")?,
        records_synced: field("records_synced")?,
        bytes_written: field("bytes_written")?,
    })
}

/// What one publishing run measured.
#[derive(Clone, Debug)]
pub struct PublishRun {
    /// Messages done (every one sent, unless the run failed).
    pub messages: usize,
    /// Messages some server answered as already logged: a retry after the
    /// publisher's timeout found the first copy.
    pub duplicates: usize,
    /// Each message's time from its submit to its completion, in
    /// microseconds, in submission order.
    pub latencies_us: Vec<f64>,
    pub started: Instant,
    pub finished: Instant,
}

impl PublishRun {
    pub fn seconds(&self) -> f64 {
        (self.finished - self.started).as_secs_f64()
    }
}

/// What clients that started together at `started` did, over all of
/// them: messages done, each one's latency, the time from the start to
/// the last ack.
#[derive(Clone, Debug)]
pub struct Together {
    pub messages: usize,
    pub duplicates: usize,
    pub latencies_us: Vec<f64>,
    pub seconds: f64,
}

impl Together {
    pub fn of(runs: &[PublishRun], started: Instant) -> Together {
        let finished = runs.iter().map(|r| r.finished).max().unwrap_or(started);
        Together {
            messages: runs.iter().map(|r| r.messages).sum(),
            duplicates: runs.iter().map(|r| r.duplicates).sum(),
            latencies_us: runs
                .iter()
                .flat_map(|r| r.latencies_us.iter().copied())
                .collect(),
            seconds: (finished - started).as_secs_f64(),
        }
    }

    pub fn messages_per_second(&self) -> f64 {
        self.messages as f64 / self.seconds
    }

    /// Payload megabytes (10^6) per second at `payload` bytes a message.
    pub fn megabytes_per_second(&self, payload: usize) -> f64 {
        (self.messages * payload) as f64 / self.seconds / 1e6
    }
}

/// Publishes `messages` copies of `payload`, message `i` through
/// `publishers[i % publishers.len()]`, each publisher keeping its window
/// (`window` messages) full; returns once every message is done.
pub async fn publish(
    publishers: &[Publisher],
    window: usize,
    payload: &[u8],
    messages: usize,
    bar: &ProgressBar,
) -> anyhow::Result<PublishRun> {
    ensure!(!publishers.is_empty(), "publishing needs a publisher");
    // The collector awaits completions in submission order; the bound
    // (room for every window and as much again) makes a lagging collector
    // slow the submitter instead of growing a queue.
    let bound = publishers.len() * window.max(1) * 2;
    let (sender, receiver) = mpsc::channel::<(Instant, PendingPublish)>(bound);
    let collector = tokio::spawn(collect(receiver, messages, bar.clone()));
    let started = Instant::now();
    for index in 0..messages {
        let publisher = &publishers[index % publishers.len()];
        let pending = publisher
            .submit(b"", payload)
            .await
            .context("the publisher refused a message")?;
        if sender.send((Instant::now(), pending)).await.is_err() {
            break;
        }
    }
    drop(sender);
    let (latencies_us, duplicates) = collector.await.context("the collector panicked")??;
    let finished = Instant::now();
    ensure!(
        latencies_us.len() == messages,
        "{} of {messages} messages were done",
        latencies_us.len()
    );
    Ok(PublishRun {
        messages: latencies_us.len(),
        duplicates,
        latencies_us,
        started,
        finished,
    })
}

async fn collect(
    mut receiver: mpsc::Receiver<(Instant, PendingPublish)>,
    messages: usize,
    bar: ProgressBar,
) -> anyhow::Result<(Vec<f64>, usize)> {
    let mut latencies = Vec::with_capacity(messages);
    let mut duplicates = 0;
    while let Some((submitted, pending)) = receiver.recv().await {
        let published = pending.await.context("a message was not acknowledged")?;
        latencies.push(submitted.elapsed().as_secs_f64() * 1e6);
        duplicates += usize::from(published.duplicate);
        bar.inc(1);
    }
    Ok((latencies, duplicates))
}

/// Sends `messages` copies of `payload` one at a time, each after the
/// previous one is done; returns each one's latency in microseconds.
pub async fn publish_one_at_a_time(
    publisher: &Arc<Publisher>,
    payload: &Arc<[u8]>,
    messages: usize,
    bar: &ProgressBar,
) -> anyhow::Result<Vec<f64>> {
    // In a task of the runtime, as an application's sends would be: the
    // worker that reads an ack runs the task it completes at once, where
    // a caller blocked outside the runtime would be one more thread to
    // wake for each answer.
    let (publisher, payload, bar) = (Arc::clone(publisher), Arc::clone(payload), bar.clone());
    tokio::spawn(async move {
        let mut latencies = Vec::with_capacity(messages);
        for _ in 0..messages {
            let started = Instant::now();
            publisher
                .send(b"", &payload)
                .await
                .context("a message was not acknowledged")?;
            latencies.push(started.elapsed().as_secs_f64() * 1e6);
            bar.inc(1);
        }
        Ok(latencies)
    })
    .await
    .context("the window-1 sends panicked")?
}

/// Starts `servers` servers as `options` say (by default each its own
/// `stamplog server` process, plain links, admin ports on), with their
/// data and logs in `<folder>/cluster`.
pub fn spawn_cluster(
    binary: &Path,
    servers: usize,
    folder: &Path,
    options: ClusterOptions,
) -> anyhow::Result<Servers> {
    Servers::start(binary, servers, folder, options)
}

/// A payload of `size` bytes that is not all zeros.
pub fn payload_of(size: usize) -> Vec<u8> {
    (0..size).map(|index| (index % 241) as u8).collect()
}

/// The stamplog binary to run: `--server-binary`, or this program.
pub fn binary_or_self(binary: &Option<PathBuf>) -> anyhow::Result<PathBuf> {
    match binary {
        Some(path) => Ok(path.clone()),
        None => std::env::current_exe().context("cannot find this program's path"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replica_log_reads_a_stream_from_the_status_document() {
        let status = r#"{"streams": [
            {"name": "other", "log": {"appends": 1, "syncs": 1, "records_synced": 1, "bytes_written": 9}},
            {"name": "s", "log": {"appends": 10, "syncs": 2, "records_synced": 10, "bytes_written": 1080, "mean_batch_records": 5.0}}
        ]}"#;
        let log = replica_log(status, 2, "s").unwrap();
        assert_eq!(
            log,
            ReplicaLog {
                server: 2,
                appends: 10,
                syncs: 2,
                records_synced: 10,
                bytes_written: 1080
            }
        );
        assert!(replica_log(status, 2, "missing").is_err());
        assert_eq!(batch_of(&[log, log]), Some((5.0, 108.0)));
        assert_eq!(batch_of(&[ReplicaLog::default()]), None);
    }

    #[test]
    fn protocols_parse_by_their_names() {
        assert_eq!(
            parse_protocol("one-hop-ack-client"),
            Ok(Protocol::OneHopAckClient)
        );
        assert!(parse_protocol("two-hop").is_err());
    }
}
