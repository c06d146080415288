//! The server's settings and their bounds.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use engine::replication::{ReplicaSettings, ServerId};
use wal::Storage;

/// One server of the cluster as the configuration names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    pub id: ServerId,
    /// `host:port` where the server listens for clients and peers.
    pub address: String,
}

/// The cluster: this server's id, every other server, and how membership
/// is watched. A cluster of more than one server runs the control plane.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterConfig {
    pub me: ServerId,
    /// The other servers (this one excluded).
    pub peers: Vec<Peer>,
    /// Role names this server offers (a stream may require roles).
    pub roles: Vec<String>,
    /// Holds no replicas and is never the lead member.
    pub admin_only: bool,
    /// How often every member tells the control plane's leader it is alive.
    pub heartbeat_interval: Duration,
    /// A member not heard from for this long is removed by a new view.
    pub suspect_timeout: Duration,
}

impl Default for ClusterConfig {
    /// A cluster of one: server 1 and no peers.
    fn default() -> Self {
        ClusterConfig {
            me: 1,
            peers: Vec::new(),
            roles: Vec::new(),
            admin_only: false,
            heartbeat_interval: Duration::from_millis(100),
            suspect_timeout: Duration::from_millis(700),
        }
    }
}

impl ClusterConfig {
    /// Every server id, sorted, this one included.
    pub fn server_ids(&self) -> Vec<ServerId> {
        let mut ids: Vec<ServerId> = self.peers.iter().map(|p| p.id).collect();
        ids.push(self.me);
        ids.sort_unstable();
        ids
    }

    /// Whether the cluster has more than one server (and so a control
    /// plane).
    pub fn is_multi(&self) -> bool {
        !self.peers.is_empty()
    }

    /// Why the configuration cannot work, if it cannot.
    pub fn problem(&self) -> Option<String> {
        if self.heartbeat_interval.is_zero() || self.suspect_timeout <= self.heartbeat_interval {
            return Some(format!(
                "suspect_timeout ({:?}) must exceed heartbeat_interval ({:?}), which must be above zero",
                self.suspect_timeout, self.heartbeat_interval
            ));
        }
        if self.me == 0 {
            return Some("server ids start at 1".into());
        }
        let ids = self.server_ids();
        if ids.windows(2).any(|pair| pair[0] == pair[1]) {
            return Some(format!("server ids must be distinct: {ids:?}"));
        }
        self.peers
            .iter()
            .find(|peer| peer.id == 0 || peer.address.is_empty())
            .map(|peer| format!("peer {} needs a nonzero id and an address", peer.id))
    }
}

/// TLS for a server: every connection to it and every link it opens is
/// TLS. Its certificate serves clients and, presented as a client
/// certificate, proves to the other servers that it is server `me` (it
/// must name `server-<id>.stamplog`, `net::tls::server_name`). Peers are
/// verified against `ca`; clients' certificates, optional, against `ca`
/// and `client_ca`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsSettings {
    pub identity: net::Identity,
    /// The cluster's CA (PEM).
    pub ca: PathBuf,
    /// Another CA whose client certificates are accepted (PEM).
    pub client_ca: Option<PathBuf>,
}

impl TlsSettings {
    /// The server's side of TLS.
    pub fn acceptor(&self) -> Result<net::Acceptor, net::tls::TlsError> {
        net::Acceptor::new(&self.identity, &self.ca, self.client_ca.as_deref())
    }

    /// The links this server opens: TLS trusting the cluster's CA,
    /// presenting the server's certificate.
    pub fn dialer(&self) -> Result<net::Dialer, net::tls::TlsError> {
        net::Dialer::tls(&self.ca, Some(&self.identity))
    }
}

/// Peer frames may be at least this large (64 MiB), whatever the message
/// limit.
pub const PEER_FRAME_BYTES_MIN: usize = 64 * 1024 * 1024;

/// Every limit has a name here; the CLI maps the TOML file and flags to it.
#[derive(Clone)]
pub struct ServerConfig {
    /// Where stream folders live.
    pub data_dir: PathBuf,
    /// The disk seam: the real file system, or a fault-injecting one in tests.
    pub storage: Arc<dyn Storage>,
    /// Largest key + payload of one message.
    pub message_bytes_max: usize,
    /// Connections served at once; more are refused with an error frame.
    pub connections_max: usize,
    /// Connections served at once from one IP address; more are refused
    /// with `Busy`.
    pub connections_per_address_max: usize,
    /// TLS on every link (see [`TlsSettings`]); `None`: plain TCP.
    pub tls: Option<TlsSettings>,
    /// The token file (see `auth`): with one, a client needs a token it
    /// holds, and each request the right it names. `None`: every client
    /// may do everything a client may.
    pub tokens: Option<PathBuf>,
    /// Appends of one connection waiting for their acknowledgement; past it
    /// the server stops reading from that connection (backpressure). Also
    /// the most replicated writes (`Submit`) one connection may have in
    /// flight on this server; past it they are refused with `Busy`.
    pub in_flight_per_connection_max: usize,
    /// Bytes (key + payload) of one connection's replicated writes in
    /// flight on this server; past it they are refused with `Busy`.
    pub bytes_in_flight_per_connection_max: usize,
    /// Frames queued for one connection's socket.
    pub outgoing_frames_max: usize,
    /// Subscriptions one connection may hold at once.
    pub subscriptions_per_connection_max: usize,
    /// Records a subscription may be granted as credit at once.
    pub subscription_credit_max: u32,
    /// Bytes of records in one `Deliver` or `Records` frame (more when one
    /// record alone is larger). Frames from the server are not bound by
    /// the client-frame limit announced in the handshake; clients accept
    /// server frames of up to 64 MiB.
    pub read_batch_bytes_max: usize,
    /// Time a client has to send its `Hello`.
    pub handshake_timeout: Duration,
    /// Defaults for every stream's log.
    pub segment_bytes_max: u64,
    pub pending_bytes_max: usize,
    pub page_flush_interval: Duration,
    pub memory_retain_bytes: usize,
    /// Keep per-record log latency samples (the logging experiment).
    pub sample_log_latency: bool,
    /// The admin HTTP port's address (`/metrics`, `/status`, the health
    /// checks, the status page). The server keeps metrics only when it
    /// has one; whoever starts the server binds it (`observe::serve_admin`).
    pub admin_listen: Option<std::net::SocketAddr>,
    /// Told of every group commit of every log (the metrics' log
    /// histograms); set by `ServerState::open` when it keeps metrics.
    pub(crate) log_observer: Option<Arc<dyn wal::SyncObserver>>,
    /// `sync` streams share one journal per server (`journal.wal` in the
    /// data folder): a round of many streams' records is one write and
    /// one fdatasync (see `wal::journal`). It rotates past this many
    /// bytes. 0: no journal, each log writes and syncs on its own.
    pub journal_bytes_max: u64,
    /// The folder of the journal file (`--journal-dir`: a device of its
    /// own, so that journaled bytes do not share the streams' disk);
    /// `None`: the data folder.
    pub journal_dir: Option<PathBuf>,
    /// While at most this many of the server's `sync` logs were busy in
    /// the journal's last 10 ms, a round of small batches writes each
    /// log's into its own segment and syncs it there, in parallel,
    /// rather than through the journal (`wal::JournalConfig::few_logs`).
    /// 0: rounds of several logs always go through the journal.
    pub journal_few_logs: usize,
    /// The journal, opened by `ServerState::open` when
    /// `journal_bytes_max` is not 0.
    pub(crate) journal: Option<Arc<wal::Journal>>,
    /// This server's id and its peers.
    pub cluster: ClusterConfig,
    /// The address peers and clients are told to reach this server at
    /// (`--advertise`: `HOST:PORT`, or `HOST` for the listener's port).
    /// `None`: see [`advertised_address`].
    pub advertise: Option<String>,
    /// Timeouts and bounds of the replication state machines.
    pub replication: ReplicaSettings,
    /// How often each stream's replication state sees the clock (gap
    /// repair, voids, heartbeats).
    pub tick_interval: Duration,
    /// Replication messages queued for one peer; past it they are dropped
    /// (the protocols repair what is lost) and counted.
    pub peer_queue_max: usize,
    /// When a plain peer link is read by a thread of its own and when by
    /// the runtime (`connection::peer`).
    pub peer_reading: PeerReading,
    /// Worker threads of the runtime the server runs on (`None`: one per
    /// CPU). Read by the program that builds the runtime (`stamplog
    /// server`); a server started on a runtime of its caller's runs on
    /// that one's workers.
    pub runtime_workers: Option<usize>,
    /// Records waiting for room in a stream's log; past it the stream
    /// refuses new messages with `Busy`.
    pub log_backlog_bytes_max: usize,
    /// How often each disk stream writes a checkpoint of its state (zero:
    /// never). A restart then replays only the log after the newest one.
    pub checkpoint_interval: Duration,
    /// A stream also writes a checkpoint once this many versions have been
    /// logged since its last one, checked every second (0: no such
    /// trigger).
    pub checkpoint_records: u64,
    /// How often a `sender` stream writes a checkpoint: its clients drop
    /// the copies it covers, so this bounds what they hold.
    pub sender_checkpoint_interval: Duration,
    /// Default retention of a stream whose meta file names none: keep at
    /// least this many bytes of log (0: no size limit).
    pub retain_bytes: u64,
    /// Default retention: delete segments closed this long ago (0: no age
    /// limit). Only segments a checkpoint covers are ever deleted.
    pub retain_ms: u64,
}

impl ServerConfig {
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        ServerConfig {
            data_dir: data_dir.into(),
            storage: Arc::new(wal::FileStorage),
            message_bytes_max: 1024 * 1024,
            connections_max: 1024,
            connections_per_address_max: 256,
            tokens: None,
            tls: None,
            in_flight_per_connection_max: 4096,
            bytes_in_flight_per_connection_max: 64 * 1024 * 1024,
            outgoing_frames_max: 1024,
            subscriptions_per_connection_max: 64,
            subscription_credit_max: 65_536,
            read_batch_bytes_max: 1024 * 1024,
            handshake_timeout: Duration::from_secs(10),
            segment_bytes_max: 64 * 1024 * 1024,
            pending_bytes_max: 32 * 1024 * 1024,
            page_flush_interval: Duration::from_millis(2),
            memory_retain_bytes: 64 * 1024 * 1024,
            sample_log_latency: false,
            admin_listen: None,
            log_observer: None,
            journal_bytes_max: 64 * 1024 * 1024,
            journal_dir: None,
            journal_few_logs: wal::JournalConfig::default().few_logs,
            journal: None,
            cluster: ClusterConfig::default(),
            advertise: None,
            replication: ReplicaSettings::default(),
            tick_interval: Duration::from_millis(10),
            peer_queue_max: 65_536,
            peer_reading: PeerReading::default(),
            runtime_workers: None,
            log_backlog_bytes_max: 64 * 1024 * 1024,
            checkpoint_interval: Duration::from_secs(10),
            checkpoint_records: 1_000_000,
            sender_checkpoint_interval: Duration::from_secs(1),
            retain_bytes: 0,
            retain_ms: 0,
        }
    }

    /// Largest frame the server accepts: one message plus its headers.
    pub fn frame_bytes_max(&self) -> usize {
        self.message_bytes_max + 1024
    }

    /// Largest frame the server accepts from a peer: a replication batch,
    /// or the state of a checkpoint sent to a replica that is behind.
    pub fn peer_frame_bytes_max(&self) -> usize {
        self.frame_bytes_max().max(PEER_FRAME_BYTES_MIN)
    }
}

/// When a plain peer link is read by a thread of its own that blocks in its
/// reads (quiet: a hop costs that one thread's wake-up) and when by the
/// runtime (busy: a worker finds the next bytes waiting), judged every 128
/// reads by the link's mean frames and records (those of its `Replicate`s)
/// per read. A link whose reads carry no record at all (acks, `Progress`)
/// goes to the runtime too; a TLS link is always read by the runtime.
/// docs/results.md, "A peer link read by whichever suits its traffic",
/// measures both ways.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PeerReading {
    /// Over this mean of frames, or of records, per read, a link on a
    /// thread goes to the runtime.
    pub busy_per_read: f64,
    /// Under this mean of frames and of records per read (and with some
    /// records), a link on the runtime goes back to a thread.
    pub quiet_per_read: f64,
}

impl Default for PeerReading {
    /// One stream at window 1 reads about one frame and at most one record
    /// a read; 100 streams about 10 frames on a thread and 15 on the
    /// runtime, one stream at window 256 one frame of a whole batch of
    /// records. The gap between the two marks keeps a link from going back
    /// and forth.
    fn default() -> Self {
        PeerReading {
            busy_per_read: 3.0,
            quiet_per_read: 1.5,
        }
    }
}

/// The address a server listening on `listening` announces to its peers
/// and clients: `advertise` when given (`HOST` alone takes the listener's
/// port); else the listener's own address; else, for a wildcard listener
/// (`0.0.0.0`, `[::]`), which nobody can connect to, the address this
/// host sends from toward its first reachable peer (a UDP socket is
/// connected to it, which sends nothing), or loopback for a server
/// without peers.
pub fn advertised_address(
    listening: SocketAddr,
    advertise: Option<&str>,
    peers: &[Peer],
) -> String {
    if let Some(advertise) = advertise {
        if let Ok(address) = advertise.parse::<SocketAddr>() {
            return address.to_string();
        }
        if let Ok(ip) = advertise.parse::<IpAddr>() {
            return SocketAddr::new(ip, listening.port()).to_string();
        }
        let host_and_port = advertise.rsplit_once(':').is_some_and(|(host, port)| {
            !host.is_empty() && !host.contains(':') && port.parse::<u16>().is_ok()
        });
        return if host_and_port {
            advertise.to_string()
        } else {
            format!("{advertise}:{}", listening.port())
        };
    }
    if !listening.ip().is_unspecified() {
        return listening.to_string();
    }
    let toward = peers.iter().find_map(|peer| sending_address(&peer.address));
    let ip = toward.unwrap_or(match listening {
        SocketAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
        SocketAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
    });
    SocketAddr::new(ip, listening.port()).to_string()
}

/// The local address this host sends from toward `peer` (`HOST:PORT`).
fn sending_address(peer: &str) -> Option<IpAddr> {
    let target = peer.to_socket_addrs().ok()?.next()?;
    let any: SocketAddr = match target {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let socket = std::net::UdpSocket::bind(any).ok()?;
    socket.connect(target).ok()?;
    let ip = socket.local_addr().ok()?.ip();
    (!ip.is_unspecified()).then_some(ip)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(address: &str) -> Peer {
        Peer {
            id: 2,
            address: address.to_string(),
        }
    }

    #[test]
    fn a_wildcard_listener_advertises_the_address_toward_its_peers() {
        let wildcard: SocketAddr = "0.0.0.0:7400".parse().unwrap();
        let peers = [peer("127.0.0.3:7401")];
        assert_eq!(advertised_address(wildcard, None, &peers), "127.0.0.1:7400");
        // No peer to look toward: loopback, never the wildcard.
        assert_eq!(advertised_address(wildcard, None, &[]), "127.0.0.1:7400");
        let wildcard6: SocketAddr = "[::]:7400".parse().unwrap();
        assert_eq!(advertised_address(wildcard6, None, &[]), "[::1]:7400");
    }

    #[test]
    fn a_given_address_wins_and_a_bare_host_takes_the_listeners_port() {
        let wildcard: SocketAddr = "0.0.0.0:7400".parse().unwrap();
        let bound: SocketAddr = "127.0.0.1:7402".parse().unwrap();
        assert_eq!(advertised_address(bound, None, &[]), "127.0.0.1:7402");
        for (given, advertised) in [
            ("10.0.0.5:9000", "10.0.0.5:9000"),
            ("10.0.0.5", "10.0.0.5:7400"),
            ("db-1.example:7400", "db-1.example:7400"),
            ("db-1.example", "db-1.example:7400"),
            ("fd00::5", "[fd00::5]:7400"),
        ] {
            assert_eq!(
                advertised_address(wildcard, Some(given), &[]),
                advertised,
                "--advertise {given}"
            );
        }
    }
}
