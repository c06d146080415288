//! `stamplog server`: the settings (a TOML file, every key overridable by a
//! flag of the same name) and the process around `server::run`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use serde::Deserialize;

/// Run a server. Settings come from `--config FILE` (TOML), and any flag
/// given overrides the file's key of the same name (dashes for
/// underscores).
#[derive(clap::Args, Debug, Default)]
pub struct ServerArgs {
    /// TOML file with any of the keys below.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Address to listen on; port 0 picks a free port. The first line the
    /// server prints is `listening on ADDRESS`. [default: 127.0.0.1:7400]
    #[arg(long)]
    pub listen: Option<String>,
    /// Folder for the streams' logs. [default: ./stamplog-data]
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Largest key + payload of one message, in bytes. [default: 1048576]
    #[arg(long)]
    pub message_bytes_max: Option<usize>,
    /// Connections served at once. [default: 1024]
    #[arg(long)]
    pub connections_max: Option<usize>,
    /// Connections served at once from one IP address; more are refused
    /// with `Busy`. [default: 256]
    #[arg(long)]
    pub connections_per_address_max: Option<usize>,
    /// Subscriptions one connection may hold at once. [default: 64]
    #[arg(long)]
    pub subscriptions_per_connection_max: Option<usize>,
    /// Token file (TOML, docs/security.md): a client must present a token
    /// it holds, and each request needs the right the token has for its
    /// stream (`produce`, `consume`, `admin`). The file is read again
    /// when it changes. [default: none, every client may do everything]
    #[arg(long, value_name = "FILE")]
    pub tokens: Option<PathBuf>,
    /// TLS: this server's certificate (PEM). It must name
    /// `server-<id>.stamplog` (the other servers check it) and the hosts
    /// clients reach it at; `stamplog certs` makes one. With --tls-key and
    /// --tls-ca, every connection to and from the server is TLS.
    /// [default: none, plain TCP]
    #[arg(long, value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// TLS: the certificate's private key (PEM).
    #[arg(long, value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
    /// TLS: the cluster's CA (PEM); the other servers' certificates must
    /// be issued by it.
    #[arg(long, value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
    /// TLS: a CA whose client certificates are accepted too (clients may
    /// also present none and rely on their token). [default: none]
    #[arg(long, value_name = "FILE")]
    pub tls_client_ca: Option<PathBuf>,
    /// Serve on an address other than loopback without TLS or without a
    /// token file: anyone who reaches the port can then read, write and
    /// delete every stream. Only for a network you trust entirely.
    #[arg(long)]
    pub insecure: bool,
    /// Appends of one connection awaiting their ack before the server stops
    /// reading from it; also the replicated writes one connection may have
    /// in flight before more are refused with Busy. [default: 4096]
    #[arg(long)]
    pub in_flight_per_connection_max: Option<usize>,
    /// Bytes of one connection's replicated writes in flight before more
    /// are refused with Busy (the client retries). [default: 67108864]
    #[arg(long)]
    pub bytes_in_flight_per_connection_max: Option<usize>,
    /// A log segment is closed past this size, in bytes. [default: 67108864]
    #[arg(long)]
    pub segment_bytes_max: Option<u64>,
    /// `sync` streams: bytes waiting for the next group commit before
    /// appends wait. [default: 33554432]
    #[arg(long)]
    pub pending_bytes_max: Option<usize>,
    /// `sync` streams share one journal, `journal.wal` in the data folder:
    /// a group commit of many streams' records is one write and one
    /// fdatasync, the records reaching their own logs through the page
    /// cache. The journal rotates (syncs those logs, starts again) past
    /// this many bytes (at least 65536). 0: no journal; each stream's
    /// log writes and fdatasyncs on its own. [default: 67108864]
    #[arg(long)]
    pub journal_bytes_max: Option<u64>,
    /// The folder of the journal file, `journal.wal`: a device of its
    /// own keeps the journal's writes off the streams' disk (each
    /// journaled byte otherwise reaches that disk twice). Each server
    /// needs its own. [default: the data folder]
    #[arg(long, value_name = "DIR")]
    pub journal_dir: Option<PathBuf>,
    /// While at most this many `sync` streams of the server were busy in
    /// the journal's last 10 ms, each writes and fdatasyncs its own log's
    /// small batches, in parallel, rather than through the journal: with
    /// few streams that costs the disk less than writing every byte
    /// twice. 0: the journal takes every round of several streams'
    /// small batches. [default: 12]
    #[arg(long, value_name = "N")]
    pub journal_few_logs: Option<usize>,
    /// Worker threads of the server's runtime, which reads the
    /// connections and runs the streams' steps (the logs have threads of
    /// their own). Servers that share a host's cores run best with a
    /// share each (docs/operations.md). [default: one per CPU]
    #[arg(long, value_name = "N")]
    pub runtime_workers: Option<usize>,
    /// `paged` streams: a partly filled page is written after this many
    /// milliseconds. [default: 2]
    #[arg(long)]
    pub page_flush_ms: Option<u64>,
    /// `memory` streams: bytes of messages kept for readers. [default: 67108864]
    #[arg(long)]
    pub memory_retain_bytes: Option<usize>,
    /// Disk streams: write a checkpoint of each stream's state this often,
    /// in milliseconds, so a restart replays only the log after it
    /// (0: never by time); each stream at a phase of its own, so that
    /// streams do not write theirs all at once. [default: 10000]
    #[arg(long)]
    pub checkpoint_interval_ms: Option<u64>,
    /// Disk streams: also write a checkpoint once this many versions were
    /// logged since the last one (0: never by count). [default: 1000000]
    #[arg(long)]
    pub checkpoint_records: Option<u64>,
    /// `sender` streams: write a checkpoint this often, in milliseconds;
    /// clients drop the copies of messages it covers, so this bounds what
    /// they hold. [default: 1000]
    #[arg(long)]
    pub sender_checkpoint_ms: Option<u64>,
    /// `sender` streams: after a restart, the primary takes its clients'
    /// copies for this many milliseconds before it places them, voids the
    /// versions no one resent and takes new messages. [default: 3000]
    #[arg(long)]
    pub sender_recovery_ms: Option<u64>,
    /// Retention of streams that set none: keep at least this many bytes
    /// of log; older whole segments that a checkpoint covers are deleted
    /// (0: no size limit). [default: 0]
    #[arg(long)]
    pub retain_bytes: Option<u64>,
    /// Retention of streams that set none: delete whole segments closed
    /// this many milliseconds ago that a checkpoint covers (0: no age
    /// limit). [default: 0]
    #[arg(long)]
    pub retain_ms: Option<u64>,
    /// The admin HTTP port: `/metrics` (Prometheus), `/status` (JSON),
    /// `/health/live`, `/health/ready` and `/` (the status page); the
    /// server prints its URL on stderr. `off` serves none and keeps no
    /// metrics. It has no TLS and no tokens: keep it on loopback or a
    /// private network. [default: 127.0.0.1:0, a free loopback port]
    #[arg(long, value_name = "ADDRESS|off")]
    pub admin_listen: Option<String>,
    /// This server's id in the cluster (1 and up). [default: 1]
    #[arg(long)]
    pub id: Option<u32>,
    /// The address other servers and clients reach this one at, as
    /// `HOST:PORT` or `HOST` (the listener's port); needed when the server
    /// listens on 0.0.0.0 or [::] behind an address it cannot see, or under
    /// a name. [default: the listen address; for 0.0.0.0 or [::], this
    /// host's address toward its first peer]
    #[arg(long, value_name = "HOST[:PORT]")]
    pub advertise: Option<String>,
    /// Another server of the cluster, as `ID=HOST:PORT`; repeat for each.
    /// Every server must be started with the same set (its own id with
    /// `--id`, the others with `--peer`). The file's form is
    /// `peers = [{ id = 2, address = "127.0.0.1:7401" }]`. [default: none,
    /// a cluster of one]
    #[arg(long = "peer", value_name = "ID=HOST:PORT")]
    pub peers: Vec<String>,
    /// A role this server offers (a stream may require roles); repeat for
    /// each. The file's form is `roles = ["east", "ssd"]`. [default: none]
    #[arg(long = "role", value_name = "NAME")]
    pub roles: Vec<String>,
    /// The server holds no replicas and is never the lead member (it
    /// still votes in the control plane). [default: false]
    #[arg(long)]
    pub admin_only: bool,
    /// Milliseconds between a member's heartbeats to the control plane's
    /// leader. [default: 100]
    #[arg(long)]
    pub heartbeat_ms: Option<u64>,
    /// A member not heard from for this many milliseconds is removed by a
    /// new view (and its streams fail over). [default: 700]
    #[arg(long)]
    pub suspect_ms: Option<u64>,
    /// Stop, as on SIGTERM, when standard input reaches its end: for a
    /// server started by another program with a pipe as its input, so
    /// that it stops when that program ends, however it ends (the
    /// benchmarks and the demo start theirs so). With an input that is
    /// already at its end (`/dev/null`) it stops at once.
    #[arg(long, env = "STAMPLOG_STOP_AT_STDIN_END")]
    pub stop_at_stdin_end: bool,
}

/// A peer as the TOML file gives it.
#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
struct PeerEntry {
    id: u32,
    address: String,
}

/// Parses `ID=HOST:PORT`.
pub fn parse_peer(text: &str) -> anyhow::Result<server::Peer> {
    let (id, address) = text
        .split_once('=')
        .with_context(|| format!("peer {text:?} is not of the form ID=HOST:PORT"))?;
    let id: u32 = id
        .trim()
        .parse()
        .with_context(|| format!("peer {text:?}: the id must be a positive number"))?;
    anyhow::ensure!(id >= 1, "peer {text:?}: server ids start at 1");
    anyhow::ensure!(
        address.contains(':'),
        "peer {text:?}: the address must be HOST:PORT"
    );
    Ok(server::Peer {
        id,
        address: address.trim().to_string(),
    })
}

/// The TOML file: the same keys as the flags, with underscores.
#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
struct ServerFile {
    listen: Option<String>,
    admin_listen: Option<String>,
    advertise: Option<String>,
    data: Option<PathBuf>,
    message_bytes_max: Option<usize>,
    connections_max: Option<usize>,
    connections_per_address_max: Option<usize>,
    subscriptions_per_connection_max: Option<usize>,
    tokens: Option<PathBuf>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    tls_ca: Option<PathBuf>,
    tls_client_ca: Option<PathBuf>,
    insecure: Option<bool>,
    in_flight_per_connection_max: Option<usize>,
    bytes_in_flight_per_connection_max: Option<usize>,
    segment_bytes_max: Option<u64>,
    pending_bytes_max: Option<usize>,
    journal_bytes_max: Option<u64>,
    journal_dir: Option<PathBuf>,
    journal_few_logs: Option<usize>,
    runtime_workers: Option<usize>,
    page_flush_ms: Option<u64>,
    memory_retain_bytes: Option<usize>,
    checkpoint_interval_ms: Option<u64>,
    checkpoint_records: Option<u64>,
    sender_checkpoint_ms: Option<u64>,
    sender_recovery_ms: Option<u64>,
    retain_bytes: Option<u64>,
    retain_ms: Option<u64>,
    id: Option<u32>,
    peers: Option<Vec<PeerEntry>>,
    roles: Option<Vec<String>>,
    admin_only: Option<bool>,
    heartbeat_ms: Option<u64>,
    suspect_ms: Option<u64>,
}

/// Resolves flags over the file over the defaults.
pub fn resolve(args: &ServerArgs) -> anyhow::Result<(String, server::ServerConfig)> {
    let mut file = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading config file {}", path.display()))?;
            toml::from_str::<ServerFile>(&text)
                .with_context(|| format!("config file {}", path.display()))?
        }
        None => ServerFile::default(),
    };
    let listen = args
        .listen
        .clone()
        .or(file.listen.take())
        .unwrap_or_else(|| "127.0.0.1:7400".into());
    let data = args
        .data
        .clone()
        .or(file.data.take())
        .unwrap_or_else(|| PathBuf::from("stamplog-data"));
    let mut config = server::ServerConfig::new(data);
    macro_rules! merge {
        ($field:ident) => {
            if let Some(value) = args.$field.or(file.$field) {
                config.$field = value;
            }
        };
    }
    merge!(message_bytes_max);
    merge!(connections_max);
    merge!(connections_per_address_max);
    merge!(subscriptions_per_connection_max);
    merge!(in_flight_per_connection_max);
    merge!(bytes_in_flight_per_connection_max);
    merge!(segment_bytes_max);
    merge!(pending_bytes_max);
    merge!(journal_bytes_max);
    merge!(journal_few_logs);
    if let Some(folder) = args.journal_dir.clone().or(file.journal_dir.take()) {
        config.journal_dir = Some(folder);
    }
    config.runtime_workers = args.runtime_workers.or(file.runtime_workers);
    merge!(memory_retain_bytes);
    merge!(checkpoint_records);
    merge!(retain_bytes);
    merge!(retain_ms);
    if let Some(milliseconds) = args.checkpoint_interval_ms.or(file.checkpoint_interval_ms) {
        config.checkpoint_interval = Duration::from_millis(milliseconds);
    }
    if let Some(milliseconds) = args.sender_checkpoint_ms.or(file.sender_checkpoint_ms) {
        config.sender_checkpoint_interval = Duration::from_millis(milliseconds.max(1));
    }
    if let Some(milliseconds) = args.sender_recovery_ms.or(file.sender_recovery_ms) {
        config.replication.sender_recovery_ms = milliseconds;
    }
    if let Some(milliseconds) = args.page_flush_ms.or(file.page_flush_ms) {
        config.page_flush_interval = Duration::from_millis(milliseconds);
    }
    resolve_cluster(args, &mut file, &mut config)?;
    resolve_security(args, &mut file, &mut config, &listen)?;
    config.admin_listen = admin_address(
        args.admin_listen
            .clone()
            .or(file.admin_listen.take())
            .as_deref(),
    )?;
    check(&config)?;
    Ok((listen, config))
}

/// Refuses settings no server can run with.
fn check(config: &server::ServerConfig) -> anyhow::Result<()> {
    if let Some(problem) = config.cluster.problem() {
        anyhow::bail!("cluster settings: {problem}");
    }
    anyhow::ensure!(
        config.message_bytes_max >= 1,
        "message_bytes_max must be at least 1"
    );
    anyhow::ensure!(
        config.journal_bytes_max == 0 || config.journal_bytes_max >= 64 * 1024,
        "journal_bytes_max must be 0 (no journal) or at least 65536"
    );
    anyhow::ensure!(
        config.connections_max >= 1 && config.connections_per_address_max >= 1,
        "connections_max and connections_per_address_max must be at least 1"
    );
    anyhow::ensure!(
        config.in_flight_per_connection_max >= 1 && config.bytes_in_flight_per_connection_max >= 1,
        "in_flight_per_connection_max and bytes_in_flight_per_connection_max must be at least 1"
    );
    if let Some(workers) = config.runtime_workers {
        anyhow::ensure!(
            (1..=RUNTIME_WORKERS_MAX).contains(&workers),
            "runtime_workers must be between 1 and {RUNTIME_WORKERS_MAX} (got {workers})"
        );
    }
    Ok(())
}

/// The most worker threads a server's runtime may be given.
const RUNTIME_WORKERS_MAX: usize = 1024;

/// The runtime a server runs on: `workers` worker threads, or one per CPU.
fn server_runtime(workers: Option<usize>) -> anyhow::Result<tokio::runtime::Runtime> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(workers) = workers {
        builder.worker_threads(workers);
    }
    builder.enable_all().build().context("starting the runtime")
}

/// The cluster's settings (id, peers, roles, advertised address, failure
/// detection), flags over the file.
fn resolve_cluster(
    args: &ServerArgs,
    file: &mut ServerFile,
    config: &mut server::ServerConfig,
) -> anyhow::Result<()> {
    config.cluster.me = args.id.or(file.id).unwrap_or(1);
    config.cluster.peers = if args.peers.is_empty() {
        file.peers
            .take()
            .unwrap_or_default()
            .into_iter()
            .map(|p| server::Peer {
                id: p.id,
                address: p.address,
            })
            .collect()
    } else {
        args.peers
            .iter()
            .map(|text| parse_peer(text))
            .collect::<anyhow::Result<_>>()?
    };
    config.cluster.roles = if args.roles.is_empty() {
        file.roles.take().unwrap_or_default()
    } else {
        args.roles.clone()
    };
    if let Some(role) = config
        .cluster
        .roles
        .iter()
        .find(|role| role.is_empty() || role.len() > 64)
    {
        anyhow::bail!("role {role:?}: a role name has 1 to 64 characters");
    }
    config.cluster.admin_only = args.admin_only || file.admin_only.unwrap_or(false);
    config.advertise = args.advertise.clone().or(file.advertise.take());
    if let Some(advertise) = &config.advertise {
        anyhow::ensure!(
            !advertise.trim().is_empty() && !advertise.contains(char::is_whitespace),
            "--advertise {advertise:?} is not a HOST or HOST:PORT"
        );
    }
    if let Some(milliseconds) = args.heartbeat_ms.or(file.heartbeat_ms) {
        config.cluster.heartbeat_interval = Duration::from_millis(milliseconds);
    }
    if let Some(milliseconds) = args.suspect_ms.or(file.suspect_ms) {
        config.cluster.suspect_timeout = Duration::from_millis(milliseconds);
    }
    Ok(())
}

/// TLS and the token file, flags over the file; a server that would
/// listen beyond loopback without both is refused unless `insecure`.
fn resolve_security(
    args: &ServerArgs,
    file: &mut ServerFile,
    config: &mut server::ServerConfig,
    listen: &str,
) -> anyhow::Result<()> {
    config.tokens = args.tokens.clone().or(file.tokens.take());
    let cert = args.tls_cert.clone().or(file.tls_cert.take());
    let key = args.tls_key.clone().or(file.tls_key.take());
    let ca = args.tls_ca.clone().or(file.tls_ca.take());
    let client_ca = args.tls_client_ca.clone().or(file.tls_client_ca.take());
    config.tls = match (cert, key, ca) {
        (Some(certificate), Some(key), Some(ca)) => Some(server::TlsSettings {
            identity: net::Identity { certificate, key },
            ca,
            client_ca,
        }),
        (None, None, None) => {
            anyhow::ensure!(
                client_ca.is_none(),
                "--tls-client-ca needs TLS (--tls-cert, --tls-key, --tls-ca)"
            );
            None
        }
        _ => anyhow::bail!("TLS needs all three of --tls-cert, --tls-key and --tls-ca"),
    };
    let insecure = args.insecure || file.insecure.unwrap_or(false);
    if !insecure && (config.tls.is_none() || config.tokens.is_none()) && !is_loopback(listen) {
        anyhow::bail!(
            "refusing to listen on {listen} without TLS and a token file: anyone who reaches it could read, write and delete every stream. Give --tls-cert, --tls-key, --tls-ca and --tokens (docs/security.md), listen on loopback, or start with --insecure on a network you trust"
        );
    }
    Ok(())
}

/// The admin port's address: `None` for `off`, a free loopback port by
/// default.
fn admin_address(flag: Option<&str>) -> anyhow::Result<Option<std::net::SocketAddr>> {
    match flag.map(str::trim) {
        None => Ok(Some(std::net::SocketAddr::from(([127, 0, 0, 1], 0)))),
        Some("off") => Ok(None),
        Some(address) => address.parse().map(Some).with_context(|| {
            format!("--admin-listen {address:?} is not an IP:PORT (such as 127.0.0.1:9464) or off")
        }),
    }
}

/// Whether `listen` (`HOST:PORT`) is a loopback address (`localhost`
/// counts; a name that is not cannot be checked and is not).
fn is_loopback(listen: &str) -> bool {
    if let Ok(address) = listen.parse::<std::net::SocketAddr>() {
        return address.ip().is_loopback();
    }
    listen
        .rsplit_once(':')
        .is_some_and(|(host, _)| host == "localhost")
}

pub fn run(args: ServerArgs) -> anyhow::Result<()> {
    let (listen, config) = resolve(&args)?;
    let data = config.data_dir.clone();
    let (advertise, peers) = (config.advertise.clone(), config.cluster.peers.clone());
    let admin_listen = config.admin_listen;
    let runtime = server_runtime(config.runtime_workers)?;
    let current = server::CurrentServer::new(
        server::ServerState::open(config)
            .with_context(|| format!("opening data folder {}", data.display()))?,
    );
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(&listen)
            .await
            .with_context(|| format!("listening on {listen}"))?;
        let address = listener.local_addr()?;
        println!("listening on {address}");
        let advertised = server::advertised_address(address, advertise.as_deref(), &peers);
        eprintln!(
            "stamplog server {} on {address} (reached at {advertised}), data in {}",
            env!("CARGO_PKG_VERSION"),
            data.display()
        );
        let admin = match admin_listen {
            Some(admin_address) => {
                let admin_listener = tokio::net::TcpListener::bind(admin_address)
                    .await
                    .with_context(|| format!("--admin-listen {admin_address}"))?;
                let admin = server::observe::serve_admin(admin_listener, current.clone())?;
                eprintln!(
                    "admin port {} (metrics at {}metrics)",
                    admin.url(),
                    admin.url()
                );
                Some(admin)
            }
            None => None,
        };
        // A server the cluster removes (paused, cut off) opens again in
        // place and joins as a new member.
        let stop = shutdown_signal(args.stop_at_stdin_end);
        let served = server::run_rejoining(listener, &current, stop)
            .await
            .with_context(|| format!("opening data folder {} again", data.display()));
        if let Some(admin) = admin {
            admin.stop().await;
        }
        served
    })?;
    drop(runtime);
    // Dropping the last reference closes the logs: pending records are
    // written and synced before the process exits.
    drop(current);
    eprintln!("stamplog server stopped");
    Ok(())
}

/// SIGINT or SIGTERM, or with `stdin_end` the end of standard input
/// (`--stop-at-stdin-end`). Standard input is read on a thread of its
/// own, outside the runtime, so a read still waiting never holds up the
/// runtime's shutdown.
pub async fn shutdown_signal(stdin_end: bool) {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler");
    let input_ends = async {
        if !stdin_end {
            return std::future::pending().await;
        }
        let (ended, end) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name("stdin-end".into())
            .spawn(move || {
                input_end(std::io::stdin());
                let _ = ended.send(());
            })
            .expect("a thread to read standard input");
        let _ = end.await;
        eprintln!("standard input ended: stopping");
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
        _ = input_ends => {}
    }
}

/// Reads `input` to its end (or to an error reading it other than an
/// interruption), throwing the bytes away.
fn input_end(mut input: impl std::io::Read) {
    let mut buffer = [0u8; 512];
    loop {
        match input.read(&mut buffer) {
            Ok(0) => return,
            Ok(_) => {}
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_input_end_comes_when_the_writer_closes_its_side_and_not_before() {
        let (reader, mut writer) = std::io::pipe().unwrap();
        let ended = std::thread::spawn(move || input_end(reader));
        std::io::Write::write_all(&mut writer, b"bytes are not the end").unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!ended.is_finished(), "input still open");
        drop(writer);
        ended.join().unwrap();
    }

    /// A config file holding `text`, in a folder that lasts as long as the
    /// returned guard.
    fn config_file(text: &str) -> (tempfile::TempDir, PathBuf) {
        let folder = tempfile::tempdir().unwrap();
        let path = folder.path().join("stamplog.toml");
        std::fs::write(&path, text).unwrap();
        (folder, path)
    }

    #[test]
    fn checkpoint_and_retention_keys_come_from_the_file_and_flags_override_them() {
        let (_folder, path) = config_file(
            "checkpoint_interval_ms = 500\ncheckpoint_records = 7\nretain_bytes = 1000\nretain_ms = 5\n",
        );
        let args = ServerArgs {
            config: Some(path),
            retain_ms: Some(60_000),
            ..ServerArgs::default()
        };
        let (_, config) = resolve(&args).unwrap();
        assert_eq!(config.checkpoint_interval, Duration::from_millis(500));
        assert_eq!(config.checkpoint_records, 7);
        assert_eq!(config.retain_bytes, 1000);
        assert_eq!(config.retain_ms, 60_000, "the flag overrides the file");
        let (_, defaults) = resolve(&ServerArgs::default()).unwrap();
        assert_eq!(defaults.checkpoint_interval, Duration::from_secs(10));
        assert_eq!((defaults.retain_bytes, defaults.retain_ms), (0, 0));
    }

    #[test]
    fn journal_few_logs_comes_from_the_file_or_the_flag() {
        let (_folder, path) = config_file("journal_few_logs = 3\n");
        let from_file = ServerArgs {
            config: Some(path.clone()),
            ..ServerArgs::default()
        };
        assert_eq!(resolve(&from_file).unwrap().1.journal_few_logs, 3);
        let flag = ServerArgs {
            config: Some(path),
            journal_few_logs: Some(0),
            ..ServerArgs::default()
        };
        assert_eq!(resolve(&flag).unwrap().1.journal_few_logs, 0);
        let (_, defaults) = resolve(&ServerArgs::default()).unwrap();
        assert_eq!(defaults.journal_few_logs, 12);
    }

    #[test]
    fn runtime_workers_come_from_the_file_or_the_flag_and_none_is_refused() {
        let (_folder, path) = config_file("runtime_workers = 2\n");
        let from_file = ServerArgs {
            config: Some(path.clone()),
            ..ServerArgs::default()
        };
        assert_eq!(resolve(&from_file).unwrap().1.runtime_workers, Some(2));
        let flag = ServerArgs {
            config: Some(path),
            runtime_workers: Some(1),
            ..ServerArgs::default()
        };
        assert_eq!(resolve(&flag).unwrap().1.runtime_workers, Some(1));
        let (_, defaults) = resolve(&ServerArgs::default()).unwrap();
        assert_eq!(defaults.runtime_workers, None, "one per CPU");
        for workers in [0, RUNTIME_WORKERS_MAX + 1] {
            let bad = ServerArgs {
                runtime_workers: Some(workers),
                ..ServerArgs::default()
            };
            let error = resolve(&bad).err().expect("refused").to_string();
            assert!(
                error.contains("runtime_workers must be between 1"),
                "{error}"
            );
        }
    }

    #[test]
    fn a_server_beyond_loopback_needs_tls_and_tokens_or_insecure() {
        let open = ServerArgs {
            listen: Some("0.0.0.0:7400".into()),
            ..ServerArgs::default()
        };
        let error = resolve(&open).err().expect("refused").to_string();
        assert!(error.contains("without TLS and a token file"), "{error}");
        let insecure = ServerArgs {
            insecure: true,
            ..open
        };
        assert!(resolve(&insecure).is_ok());
        for listen in ["127.0.0.1:7400", "[::1]:7400", "localhost:7400"] {
            let args = ServerArgs {
                listen: Some(listen.into()),
                ..ServerArgs::default()
            };
            assert!(resolve(&args).is_ok(), "{listen}");
        }
        let half = ServerArgs {
            tls_cert: Some("cert.pem".into()),
            ..ServerArgs::default()
        };
        let error = resolve(&half).err().expect("refused").to_string();
        assert!(error.contains("all three"), "{error}");
    }
}
