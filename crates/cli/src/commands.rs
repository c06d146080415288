//! The client commands: `send`, `tail`, `status` and `streams`.

use std::io::BufRead;

use anyhow::Context;
use client::{Client, ClientConfig, DurabilityConfig, Protocol, Publisher, PublisherConfig};

/// Where the server is.
#[derive(clap::Args, Debug, Clone)]
pub struct ServerAddress {
    /// Server address (host:port).
    #[arg(
        long,
        short = 's',
        default_value = "127.0.0.1:7400",
        env = "STAMPLOG_SERVER"
    )]
    pub server: String,
    /// The token to present (a server with a token file needs one; see
    /// `stamplog token`).
    #[arg(
        long,
        env = "STAMPLOG_TOKEN",
        hide_env_values = true,
        default_value = ""
    )]
    pub token: String,
    /// Connect with TLS, trusting the CA in this PEM file (the server's
    /// certificate must name the host of --server).
    #[arg(long, env = "STAMPLOG_CA", value_name = "FILE")]
    pub ca: Option<std::path::PathBuf>,
    /// A client certificate (PEM) to present, for a server that verifies
    /// client certificates; needs --cert-key and --ca.
    #[arg(
        long,
        env = "STAMPLOG_CERT",
        value_name = "FILE",
        requires = "cert_key"
    )]
    pub cert: Option<std::path::PathBuf>,
    /// The client certificate's private key (PEM). (`--key` is the
    /// message key of `send`.)
    #[arg(
        long,
        env = "STAMPLOG_CERT_KEY",
        value_name = "FILE",
        requires = "cert"
    )]
    pub cert_key: Option<std::path::PathBuf>,
}

impl ServerAddress {
    /// What the client proves itself with: the token, and TLS when a CA
    /// is given.
    pub fn credentials(&self) -> anyhow::Result<client::Credentials> {
        let identity = match (&self.cert, &self.cert_key) {
            (Some(certificate), Some(key)) => Some(net::Identity {
                certificate: certificate.clone(),
                key: key.clone(),
            }),
            _ => None,
        };
        let dialer = match &self.ca {
            Some(ca) => net::Dialer::tls(ca, identity.as_ref())?,
            None => {
                anyhow::ensure!(identity.is_none(), "--cert and --cert-key need --ca");
                net::Dialer::plain()
            }
        };
        Ok(client::Credentials {
            token: self.token.clone(),
            dialer,
        })
    }
}

/// A durability mode and its settings.
#[derive(clap::Args, Debug, Clone)]
pub struct DurabilityArgs {
    /// `sync`: ack after write + fdatasync (group commit); nothing
    /// acknowledged is lost by a crash. `paged`: ack once copied into a
    /// page buffer of `--pages` x `--page-size` bytes written in the
    /// background; a crash loses at most what the pages held. `sender`:
    /// sender-based logging: the primary returns each message's version at
    /// once, the client confirms it and keeps the message until the
    /// primary's checkpoint covers it, and the log is written through the
    /// page buffer; a crash of the server alone loses nothing acknowledged
    /// (forward protocols only: one-hop, one-hop-ack-client, server-async,
    /// server-sync). `memory`: no disk; a crash or restart loses
    /// everything.
    #[arg(long, default_value = "sync", value_parser = ["sync", "paged", "sender", "memory"])]
    pub durability: String,
    /// Pages of the `paged` or `sender` buffer.
    #[arg(long, default_value_t = 2)]
    pub pages: u16,
    /// Bytes per page of the `paged` or `sender` buffer; must hold the
    /// largest message.
    #[arg(long, default_value_t = 4 * 1024 * 1024)]
    pub page_size: u32,
}

impl DurabilityArgs {
    pub fn config(&self) -> DurabilityConfig {
        match self.durability.as_str() {
            "memory" => DurabilityConfig::Memory,
            "paged" => DurabilityConfig::Paged {
                pages: self.pages,
                page_size: self.page_size,
            },
            "sender" => DurabilityConfig::Sender {
                pages: self.pages,
                page_size: self.page_size,
            },
            _ => DurabilityConfig::Sync,
        }
    }
}

/// How a new stream is replicated.
#[derive(clap::Args, Debug, Clone)]
pub struct ReplicationArgs {
    /// Replication protocol. Seed 001's patterns: `unversioned` (baseline,
    /// no shared version), `version-request`, `returns-version`, `one-hop`,
    /// `one-hop-ack-client` (default: the primary stamps and forwards,
    /// every replica acks the client), `broadcast-tag`. Seed 002's
    /// duplication protocols: `server-async` (acked once the primary logged
    /// it: a primary lost before its replicas copy it loses acknowledged
    /// messages), `server-sync`, `client-async` (done at the first replica's
    /// ack: the same loss window), `client-sync`, `hybrid`.
    /// docs/protocols.md has each flow and loss window.
    #[arg(long, default_value = "one-hop-ack-client")]
    pub protocol: Protocol,
    /// Replicas of the stream (0: 3, or every server of a smaller cluster).
    #[arg(long, default_value_t = 0)]
    pub replicas: u8,
}

#[derive(clap::Args, Debug)]
pub struct SendArgs {
    #[command(flatten)]
    pub address: ServerAddress,
    /// Stream to send to.
    #[arg(long)]
    pub stream: String,
    /// Create the stream first if it does not exist.
    #[arg(long)]
    pub create: bool,
    #[command(flatten)]
    pub durability: DurabilityArgs,
    #[command(flatten)]
    pub replication: ReplicationArgs,
    /// Messages in flight at most.
    #[arg(long, default_value_t = 64)]
    pub window: usize,
    /// Key of every message sent.
    #[arg(long, default_value = "")]
    pub key: String,
    /// Messages to send; without any, each line of standard input is one.
    pub messages: Vec<String>,
}

#[derive(clap::Args, Debug)]
pub struct TailArgs {
    #[command(flatten)]
    pub address: ServerAddress,
    /// Stream to read.
    #[arg(long)]
    pub stream: String,
    /// First version to print.
    #[arg(long, default_value_t = 1)]
    pub from: u64,
    /// Stop after this many messages (default: all committed so far, or
    /// forever with --follow).
    #[arg(long)]
    pub count: Option<u64>,
    /// Keep waiting for new messages.
    #[arg(long, short = 'f')]
    pub follow: bool,
}

#[derive(clap::Args, Debug)]
pub struct StatusArgs {
    #[command(flatten)]
    pub address: ServerAddress,
    /// Print the whole status document as JSON (every counter) instead of
    /// the summary.
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args, Debug)]
pub struct RetireArgs {
    #[command(flatten)]
    pub address: ServerAddress,
    /// The id of the server to retire. It must be stopped, and removed from
    /// the view (after `suspect_ms`), first.
    pub id: u32,
}

#[derive(clap::Args, Debug)]
pub struct StreamsArgs {
    #[command(flatten)]
    pub address: ServerAddress,
    #[command(subcommand)]
    pub action: StreamsAction,
}

#[derive(clap::Subcommand, Debug)]
pub enum StreamsAction {
    /// List the streams with their versions.
    List,
    /// Create a stream on every server of its replica set.
    Create {
        name: String,
        #[command(flatten)]
        durability: DurabilityArgs,
        #[command(flatten)]
        replication: ReplicationArgs,
        /// The output commit interval T in milliseconds (0 to 10,000):
        /// acks and deliveries leave only at multiples of T, for what the
        /// servers took in before, once it is durable. Costs about T/2 of
        /// ack latency on average; 0 acks at each group commit.
        #[arg(long, default_value_t = 0, value_name = "MS")]
        commit_interval_ms: u32,
        /// Retention: keep at least this many bytes of log; older whole
        /// segments that two checkpoints cover are deleted (units B, KB,
        /// MB, GB, KiB, MiB, GiB) [default: the server's retain_bytes].
        #[arg(long, value_parser = parse_size, value_name = "BYTES")]
        retain_bytes: Option<u64>,
        /// Retention: delete whole segments closed this many milliseconds
        /// ago that two checkpoints cover [default: the server's
        /// retain_ms].
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..), value_name = "MS")]
        retain_ms: Option<u64>,
    },
    /// Delete a stream and its log.
    Delete { name: String },
    /// Set what a stream of a cluster requires of its live in-sync
    /// replicas, and what it does while that is not met; it resumes by
    /// itself once the requirement is met again. By default a stream of R
    /// replicas requires a majority of them in sync (R = 3: 2) and blocks
    /// writes for up to 30 s, then refuses them, while fewer are;
    /// `--min-in-sync 1` lets it go on with one. `status` shows the
    /// stream's requirement, its in-sync set and every transition.
    Require {
        name: String,
        /// A role some live in-sync replica must have; repeat for each.
        #[arg(long = "role", value_name = "NAME")]
        roles: Vec<String>,
        /// Live in-sync replicas needed at least.
        #[arg(long, default_value_t = 1)]
        min_in_sync: u16,
        /// `read-only`: writes are refused, reads go on. `block`: writes
        /// wait up to --block-ms, then are refused. `reconnect`: writers'
        /// connections are closed; they come back and retry.
        #[arg(long, value_enum, default_value = "read-only")]
        action: ActionArg,
        /// How long `block` holds writes.
        #[arg(long, default_value_t = 5_000)]
        block_ms: u32,
        /// Remove the stream's own requirement instead: the default
        /// majority applies again.
        #[arg(long, conflicts_with_all = ["roles", "min_in_sync", "action", "block_ms"])]
        clear: bool,
    },
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum ActionArg {
    ReadOnly,
    Block,
    Reconnect,
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the runtime")
}

async fn connect(address: &ServerAddress) -> anyhow::Result<Client> {
    let mut config = ClientConfig::new(address.server.clone());
    config.credentials = address.credentials()?;
    // A command-line user wants an answer, not endless retries.
    config.request_timeout = std::time::Duration::from_secs(10);
    Ok(Client::connect(config).await?)
}

pub fn send(args: SendArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.window >= 1, "--window must be at least 1");
    runtime()?.block_on(async {
        let client = connect(&args.address).await?;
        let stream = match client.open_stream(&args.stream).await {
            Ok(info) => info,
            Err(client::ClientError::Server {
                code: client::ErrorCode::UnknownStream,
                ..
            }) if args.create => {
                client
                    .create_stream_with(
                        &args.stream,
                        args.durability.config(),
                        args.replication.protocol,
                        args.replication.replicas,
                    )
                    .await?
            }
            Err(error) => {
                return Err(error).with_context(|| format!("opening stream {:?}", args.stream))
            }
        };
        let publisher = Publisher::connect(
            &stream,
            PublisherConfig {
                window: args.window,
                credentials: args.address.credentials()?,
                ..PublisherConfig::default()
            },
        )
        .await
        .context("connecting to the stream's replicas")?;
        let messages: Box<dyn Iterator<Item = std::io::Result<String>>> =
            if args.messages.is_empty() {
                Box::new(std::io::stdin().lock().lines())
            } else {
                Box::new(args.messages.into_iter().map(Ok))
            };
        let mut pending = std::collections::VecDeque::new();
        for message in messages {
            let message = message.context("reading standard input")?;
            pending.push_back(
                publisher
                    .submit(args.key.as_bytes(), message.as_bytes())
                    .await?,
            );
            // Print answers as they come, keeping the window full.
            while pending.len() >= args.window {
                print_published(pending.pop_front().expect("not empty").await?);
            }
        }
        for published in pending {
            print_published(published.await?);
        }
        Ok(())
    })
}

fn print_published(published: client::Published) {
    let duplicate = if published.duplicate {
        " duplicate"
    } else {
        ""
    };
    let servers: Vec<String> = published
        .acks
        .iter()
        .map(|(server, _)| server.to_string())
        .collect();
    println!(
        "version {} acked by servers {}{duplicate}",
        published.version,
        servers.join(",")
    );
}

pub fn tail(args: TailArgs) -> anyhow::Result<()> {
    runtime()?.block_on(async {
        let client = connect(&args.address).await?;
        let stream = client.open_stream(&args.stream).await?;
        let end = match (args.count, args.follow) {
            (Some(count), _) => args.from.saturating_add(count).saturating_sub(1),
            (None, true) => u64::MAX,
            (None, false) => stream.committed_version,
        };
        if end < args.from {
            return Ok(());
        }
        let mut subscription = client.subscribe(stream.id, args.from).await?;
        while let Some(record) = subscription.next().await {
            let record = record?;
            println!(
                "{}\t{}\t{}",
                record.version,
                String::from_utf8_lossy(&record.key),
                String::from_utf8_lossy(&record.payload)
            );
            if record.version >= end {
                break;
            }
        }
        Ok(())
    })
}

pub fn status(args: StatusArgs) -> anyhow::Result<()> {
    runtime()?.block_on(async {
        let client = connect(&args.address).await?;
        let json: serde_json::Value = serde_json::from_str(&client.status().await?)?;
        if args.json {
            println!("{}", serde_json::to_string_pretty(&json)?);
        } else {
            print_status(&json);
        }
        Ok(())
    })
}

pub fn retire(args: RetireArgs) -> anyhow::Result<()> {
    runtime()?.block_on(async {
        let client = connect(&args.address).await?;
        client.retire_server(args.id).await?;
        println!(
            "server {} is no longer a voter of the control plane",
            args.id
        );
        Ok(())
    })
}

pub fn streams(args: StreamsArgs) -> anyhow::Result<()> {
    runtime()?.block_on(async {
        let client = connect(&args.address).await?;
        match args.action {
            StreamsAction::List => {
                let mut table = report::Table::new(
                    "streams",
                    &[
                        "name",
                        "id",
                        "durability",
                        "protocol",
                        "primary",
                        "replicas",
                        "first",
                        "last",
                        "committed",
                        "commit interval ms",
                    ],
                );
                for info in client.list_streams().await? {
                    let protocol = Protocol::from_code(info.protocol)
                        .map_or_else(|| format!("code {}", info.protocol), |p| p.to_string());
                    let replicas: Vec<String> =
                        info.replicas.iter().map(|r| r.id.to_string()).collect();
                    table.row(vec![
                        info.name,
                        format!("{:016x}", info.id),
                        format!("{:?}", info.durability),
                        protocol,
                        info.primary.to_string(),
                        replicas.join(","),
                        info.first_version.to_string(),
                        info.last_version.to_string(),
                        info.committed_version.to_string(),
                        info.commit_interval_ms.to_string(),
                    ]);
                }
                print!("{}", table.render());
            }
            StreamsAction::Create {
                name,
                durability,
                replication,
                commit_interval_ms,
                retain_bytes,
                retain_ms,
            } => {
                let options = client::StreamOptions {
                    durability: durability.config(),
                    protocol: replication.protocol,
                    replicas: replication.replicas,
                    commit_interval_ms,
                    retention: client::RetentionConfig {
                        bytes: retain_bytes.unwrap_or(0),
                        ms: retain_ms.unwrap_or(0),
                    },
                };
                let info = client.create_stream_with_options(&name, &options).await?;
                let replicas: Vec<String> = info
                    .replicas
                    .iter()
                    .map(|r| format!("{}@{}", r.id, r.address))
                    .collect();
                println!(
                    "created {} ({:016x}, {:?}, {}, primary {}, replicas {}, commit interval {} ms)",
                    info.name,
                    info.id,
                    info.durability,
                    replication.protocol,
                    info.primary,
                    replicas.join(" "),
                    info.commit_interval_ms
                );
            }
            StreamsAction::Delete { name } => {
                client.delete_stream(&name).await?;
                println!("deleted {name}");
            }
            StreamsAction::Require {
                name,
                roles,
                min_in_sync,
                action,
                block_ms,
                clear,
            } => require(&client, &name, roles, min_in_sync, (action, block_ms), clear).await?,
        }
        Ok(())
    })
}

/// `streams require`: sets (or clears) a stream's requirement.
async fn require(
    client: &client::Client,
    name: &str,
    roles: Vec<String>,
    min_in_sync: u16,
    (action, block_ms): (ActionArg, u32),
    clear: bool,
) -> anyhow::Result<()> {
    let action = match action {
        ActionArg::ReadOnly => client::LossAction::ReadOnly,
        ActionArg::Block => client::LossAction::Block {
            timeout_ms: block_ms,
        },
        ActionArg::Reconnect => client::LossAction::Reconnect,
    };
    let requirement = (!clear).then(|| (roles.clone(), min_in_sync, action));
    client.set_requirement(name, requirement).await?;
    if clear {
        println!("{name} requires the default: a majority of its replicas in sync, else block");
    } else {
        println!(
            "{name} requires {min_in_sync} live in-sync replicas and roles {roles:?}; loss action {action:?}"
        );
    }
    Ok(())
}

/// A status value as a table cell: strings bare, null as `-`.
fn text(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => "-".to_string(),
        other => other.to_string(),
    }
}

/// The status summary: this server, the cluster's view (members, lead
/// member, control-plane leader), every stream's placement, the latest
/// transitions, and this server's replicas.
fn print_status(json: &serde_json::Value) {
    println!(
        "server {} at {}, up {:.0} s, {} connections",
        text(&json["member"]),
        text(&json["address"]),
        json["uptime_seconds"].as_f64().unwrap_or(0.0),
        text(&json["connections"])
    );
    let cluster = &json["cluster"];
    if cluster.is_null() {
        println!("a cluster of one (no control plane)");
    } else {
        print_cluster(cluster);
    }
    print_replicas(json);
}

/// The cluster's view, members, placement and latest transitions.
fn print_cluster(cluster: &serde_json::Value) {
    println!(
        "view {}; this process joined in view {}; lead member: server {}; control-plane leader: server {}",
        text(&cluster["view"]),
        text(&cluster["incarnation"]),
        text(&cluster["lead_member"]),
        text(&cluster["leader"])
    );
    print_members(cluster);
    print_placement(cluster);
    let transitions = cluster["transitions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    println!("latest transitions:");
    for transition in transitions.iter().rev().take(12).rev() {
        println!(
            "  view {}: {}",
            text(&transition["view"]),
            text(&transition["what"])
        );
    }
}

/// Every member: id, member id, join view, roles.
fn print_members(cluster: &serde_json::Value) {
    let mut members = report::Table::new(
        "members",
        &[
            "id",
            "member (address/join view)",
            "join view",
            "roles",
            "admin only",
        ],
    );
    for member in cluster["members"].as_array().into_iter().flatten() {
        let roles: Vec<String> = member["roles"]
            .as_array()
            .into_iter()
            .flatten()
            .map(text)
            .collect();
        members.row(vec![
            text(&member["id"]),
            text(&member["member"]),
            text(&member["join_view"]),
            roles.join(","),
            text(&member["admin_only"]),
        ]);
    }
    print!("{}", members.render());
}

/// Every stream's placement, and how many are under-replicated.
fn print_placement(cluster: &serde_json::Value) {
    print!("{}", placement_table(cluster).render());
    println!(
        "under-replicated streams: {}",
        text(&cluster["under_replicated"])
    );
}

/// Every stream's placement: its servers, those in sync, and those whose
/// log failed (out of the stream until they restart).
fn placement_table(cluster: &serde_json::Value) -> report::Table {
    let mut placements = report::Table::new(
        "placement",
        &[
            "stream",
            "protocol",
            "primary",
            "epoch",
            "replicas",
            "in sync",
            "log failed on",
            "requirement",
            "state",
        ],
    );
    for stream in cluster["streams"].as_array().into_iter().flatten() {
        placements.row(vec![
            text(&stream["name"]),
            text(&stream["protocol"]),
            text(&stream["primary"]),
            text(&stream["epoch"]),
            text(&stream["replicas"]),
            text(&stream["in_sync"]),
            text(&stream["failed"]),
            text(&stream["requirement"]),
            text(&stream["availability"]),
        ]);
    }
    placements
}

/// This server's replicas: versions, commit interval, readers.
fn print_replicas(json: &serde_json::Value) {
    print!("{}", replicas_table(json).render());
}

/// This server's replicas, each with its log's state (`ok`, or why it
/// failed), versions, commit interval and readers.
fn replicas_table(json: &serde_json::Value) -> report::Table {
    let mut local = report::Table::new(
        "replicas on this server",
        &[
            "stream",
            "log",
            "epoch",
            "primary",
            "logged",
            "committed",
            "visible",
            "rejoining",
            "commit interval ms",
            "readers",
            "reader lag",
        ],
    );
    for stream in json["streams"].as_array().into_iter().flatten() {
        let replication = &stream["replication"];
        let log = match &stream["failed"] {
            serde_json::Value::Null => "ok".to_string(),
            why => format!("failed: {}", text(why)),
        };
        local.row(vec![
            text(&stream["name"]),
            log,
            text(&replication["epoch"]),
            text(&replication["primary"]),
            text(&replication["logged_version"]),
            text(&replication["committed_version"]),
            text(&replication["visible_version"]),
            text(&replication["rejoining"]),
            text(&replication["commit_interval_ms"]),
            text(&stream["subscriptions"]),
            text(&stream["subscription_lag"]),
        ]);
    }
    local
}

/// A byte count of at least 1 with an optional unit (B, KB = 1000,
/// KiB = 1024, and MB, MiB, GB, GiB likewise).
fn parse_size(text: &str) -> Result<u64, String> {
    match bench::units::parse_bytes(text)? {
        0 => {
            Err("retention must be at least 1 byte (omit the flag for the server's default)".into())
        }
        bytes => Ok(bytes as u64),
    }
}

#[cfg(test)]
mod size_tests {
    use super::parse_size;

    #[test]
    fn sizes_take_decimal_and_binary_units_and_refuse_zero_and_junk() {
        assert_eq!(parse_size("500"), Ok(500));
        assert_eq!(parse_size("2KB"), Ok(2_000));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("3 MiB"), Ok(3 << 20));
        assert!(parse_size("0").is_err());
        assert!(parse_size("5XB").is_err());
        assert!(parse_size("lots").is_err());
    }
}

#[cfg(test)]
mod status_tests {
    use super::{placement_table, replicas_table};

    #[test]
    fn status_shows_which_replicas_logs_failed_and_why() {
        let cluster = serde_json::json!({"streams": [
            {"name": "orders", "replicas": [1, 3], "in_sync": [1], "failed": [2]},
            {"name": "quiet", "replicas": [1, 2, 3], "in_sync": [1, 2, 3], "failed": []},
        ]});
        let placements = placement_table(&cluster);
        let column = |table: &report::Table, row: usize, name: &str| {
            let at = table.columns().iter().position(|c| c == name).unwrap();
            table.rows()[row][at].clone()
        };
        assert_eq!(column(&placements, 0, "log failed on"), "[2]");
        assert_eq!(column(&placements, 1, "log failed on"), "[]");
        let server = serde_json::json!({"streams": [
            {"name": "orders", "failed": "No space left on device", "replication": {}},
            {"name": "quiet", "failed": null, "replication": {}},
        ]});
        let replicas = replicas_table(&server);
        assert_eq!(
            column(&replicas, 0, "log"),
            "failed: No space left on device"
        );
        assert_eq!(column(&replicas, 1, "log"), "ok");
    }
}
