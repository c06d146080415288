//! Starts and stops a real server in the test's runtime.

use std::net::SocketAddr;
use std::sync::Arc;

use server::{ServerConfig, ServerState};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub struct TestServer {
    pub address: SocketAddr,
    pub state: Arc<ServerState>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl TestServer {
    /// Starts a server on `address` (port 0 for any).
    pub async fn start_at(config: ServerConfig, address: SocketAddr) -> TestServer {
        let state = ServerState::open(config).expect("server opens");
        let listener = TcpListener::bind(address).await.expect("bind");
        let address = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(server::run(listener, Arc::clone(&state), async {
            let _ = stopped.await;
        }));
        TestServer {
            address,
            state,
            stop: Some(stop),
            task: Some(task),
        }
    }

    pub async fn start(config: ServerConfig) -> TestServer {
        TestServer::start_at(config, "127.0.0.1:0".parse().unwrap()).await
    }

    /// Stops serving and closes the logs (pending records are written).
    pub async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        self.task.take().unwrap().await.unwrap();
        let state = self.state;
        // The last reference closes every log; do it off the runtime since
        // closing joins the log threads.
        tokio::task::spawn_blocking(move || drop(state))
            .await
            .unwrap();
    }

    pub fn client_config(&self) -> client::ClientConfig {
        client::ClientConfig::new(self.address.to_string())
    }
}

// ---------------------------------------------------------------------
// Helpers for restart, bad_input, faults and property tests.

/// A server configuration whose storage is `storage` (an in-memory
/// fault-injecting file system), with its data under `/stamplog`.
pub fn fault_config(storage: &wal::fault::FaultStorage) -> ServerConfig {
    let mut config = ServerConfig::new("/stamplog");
    config.storage = Arc::new(storage.clone());
    config
}

/// A client configuration that reconnects quickly.
pub fn quick_client_config(address: SocketAddr) -> client::ClientConfig {
    let mut config = client::ClientConfig::new(address.to_string());
    config.reconnect_delay_min = std::time::Duration::from_millis(10);
    config.reconnect_delay_max = std::time::Duration::from_millis(100);
    config
}

/// Reads every record of `stream` from version 1 on through `fetch`, in
/// bounded pages, until a page comes back empty.
pub async fn fetch_all(client: &client::Client, stream: u64) -> Vec<client::ReceivedRecord> {
    let mut records: Vec<client::ReceivedRecord> = Vec::new();
    for _ in 0..100_000 {
        let from = records.last().map_or(1, |r| r.version + 1);
        let page = client.fetch(stream, from, 1000).await.expect("fetch");
        if page.is_empty() {
            return records;
        }
        records.extend(page);
    }
    panic!("fetch_all did not reach the end of the stream");
}

/// [`fetch_all`] once at least `count` records are visible, or after 10 s.
/// A replica's ack does not wait for the commit point (`one-hop-ack-client`
/// acks from every replica), so a reader that fetches right after its
/// last ack may find it visible only one `Progress` and one `Commit`
/// later (docs/protocols.md, "Commit and reading"). The caller still
/// checks exactly what came back.
pub async fn fetch_visible(
    client: &client::Client,
    stream: u64,
    count: usize,
) -> Vec<client::ReceivedRecord> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let records = fetch_all(client, stream).await;
        if records.len() >= count || std::time::Instant::now() >= deadline {
            return records;
        }
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
}

/// One record as read straight from a stream's log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoggedRecord {
    pub version: u64,
    pub event: proto::EventId,
    pub key: Vec<u8>,
    pub payload: Vec<u8>,
}

/// Reads every durable record of the stream named `name` of `state`
/// straight from its log (blocking; call from `spawn_blocking` or a
/// synchronous context). Retention may go on deleting the log's head
/// meanwhile: a read it overtook starts again from the new oldest
/// version, so what it returns is one whole run of the log.
pub fn read_log(state: &ServerState, name: &str) -> Vec<LoggedRecord> {
    let stream = state.stream_by_name(name).expect("the stream exists");
    let mut records = Vec::new();
    let mut next = stream.log.first_version();
    for _ in 0..1_000_000 {
        let mut bytes = Vec::new();
        let count = match stream.log.read(next, 1000, 1 << 20, &mut bytes) {
            Ok(count) => count,
            Err(wal::ReadError::Retained { oldest, .. }) => {
                records.clear();
                next = oldest;
                continue;
            }
            Err(error) => panic!("log read: {error}"),
        };
        if count == 0 {
            return records;
        }
        for record in proto::frame::iter_records(&bytes) {
            records.push(LoggedRecord {
                version: record.header.version,
                event: record.header.event,
                key: record.key.to_vec(),
                payload: record.payload.to_vec(),
            });
        }
        next += count as u64;
    }
    panic!("read_log did not reach the end of the log");
}

/// Connects a raw socket and completes the handshake.
pub async fn raw_hello(address: SocketAddr) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let mut socket = tokio::net::TcpStream::connect(address)
        .await
        .expect("connect");
    let hello = proto::Frame::Hello {
        version: proto::PROTOCOL_VERSION,
        client: 0xC0FFEE,
        token: String::new(),
    };
    socket.write_all(&hello.to_bytes()).await.expect("hello");
    let (frames, _) = read_frames(&mut socket, 1, std::time::Duration::from_secs(5)).await;
    assert!(
        matches!(frames.first(), Some(proto::Frame::HelloOk { .. })),
        "handshake answer: {frames:?}"
    );
    socket
}

/// Reads frames until `count` have arrived, the server closes the
/// connection, or `limit` passes. Returns the frames and whether the
/// connection was closed (end of file or reset).
pub async fn read_frames<S: tokio::io::AsyncRead + Unpin>(
    socket: &mut S,
    count: usize,
    limit: std::time::Duration,
) -> (Vec<proto::Frame>, bool) {
    use tokio::io::AsyncReadExt;
    let deadline = tokio::time::Instant::now() + limit;
    let mut bytes: Vec<u8> = Vec::new();
    let mut frames = Vec::new();
    let mut scratch = vec![0u8; 64 * 1024];
    loop {
        loop {
            match proto::Frame::decode(&bytes, 64 << 20) {
                Ok(Some((frame, used))) => {
                    bytes.drain(..used);
                    frames.push(frame);
                }
                Ok(None) => break,
                Err(error) => panic!("the server sent an undecodable frame: {error}"),
            }
        }
        if frames.len() >= count {
            return (frames, false);
        }
        match tokio::time::timeout_at(deadline, socket.read(&mut scratch)).await {
            Err(_) => return (frames, false),
            Ok(Ok(0)) | Ok(Err(_)) => return (frames, true),
            Ok(Ok(read)) => bytes.extend_from_slice(&scratch[..read]),
        }
    }
}

/// Names of threads that panicked since the hook was installed.
static PANICKED_THREADS: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// Installs (once) a panic hook that remembers the name of every thread
/// that panics, then calls the previous hook.
pub fn record_panics() {
    static INSTALL: std::sync::Once = std::sync::Once::new();
    INSTALL.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let name = std::thread::current()
                .name()
                .unwrap_or("unnamed")
                .to_string();
            if let Ok(mut names) = PANICKED_THREADS.lock() {
                names.push(name);
            }
            previous(info);
        }));
    });
}

/// Panics recorded on threads whose name satisfies `matches`.
pub fn panics_where(matches: impl Fn(&str) -> bool) -> usize {
    PANICKED_THREADS
        .lock()
        .map(|names| names.iter().filter(|n| matches(n)).count())
        .unwrap_or(0)
}

/// Asserts that both a fetch and a subscription from version 1 of `stream`
/// are refused with `VersionUnavailable`, naming `oldest` as the oldest
/// version the log still holds.
pub async fn assert_version_1_unavailable(client: &client::Client, stream: u64, oldest: u64) {
    use client::{ClientError, ErrorCode};
    match client.fetch(stream, 1, 10).await {
        Err(ClientError::Server {
            code: ErrorCode::VersionUnavailable,
            message,
        }) => assert!(
            message.contains(&format!("oldest available is {oldest}")),
            "{message}"
        ),
        other => panic!("fetch from version 1: {other:?}"),
    }
    let mut subscription = client.subscribe(stream, 1).await.unwrap();
    let first = tokio::time::timeout(std::time::Duration::from_secs(5), subscription.next())
        .await
        .expect("an answer within 5 s");
    match first {
        Some(Err(ClientError::Server {
            code: ErrorCode::VersionUnavailable,
            message,
        })) => assert!(message.contains(&oldest.to_string()), "{message}"),
        other => panic!("subscribe from version 1: {other:?}"),
    }
}

/// Waits until `condition` holds, checking every 2 ms, for at most
/// `limit`; fails the test naming `what` past it.
pub async fn wait_until(limit: std::time::Duration, what: &str, condition: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + limit;
    while !condition() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
}

/// A publisher of the stream `info` with `window` messages in flight that
/// resends after `retry_ms`.
pub async fn publisher(
    info: &client::StreamInfo,
    window: usize,
    retry_ms: u64,
) -> client::Publisher {
    let config = client::PublisherConfig {
        window,
        retry: std::time::Duration::from_millis(retry_ms),
        ..client::PublisherConfig::default()
    };
    client::Publisher::connect(info, config).await.unwrap()
}

/// Settings that make failures noticed fast: heartbeats every 50 ms, a
/// member removed after 400 ms, gaps repaired after 30 ms.
pub fn fast(config: &mut server::ServerConfig) {
    config.cluster.heartbeat_interval = std::time::Duration::from_millis(50);
    config.cluster.suspect_timeout = std::time::Duration::from_millis(400);
    config.replication.gap_timeout_ms = 30;
}

/// A client of server 1 of `cluster`, and a `sync` stream named `name`
/// of three replicas under `protocol` that it created.
pub async fn create_on_three(
    cluster: &server::LocalCluster,
    name: &str,
    protocol: client::Protocol,
) -> (client::Client, client::StreamInfo) {
    let address = cluster.address(1).to_string();
    let client = client::Client::connect(client::ClientConfig::new(address))
        .await
        .unwrap();
    let info = client
        .create_stream_with(name, proto::DurabilityConfig::Sync, protocol, 3)
        .await
        .unwrap();
    (client, info)
}
