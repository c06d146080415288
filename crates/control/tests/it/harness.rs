//! Control nodes on 127.0.0.1 in temporary folders, each with its own
//! listener that reads the `ControlHello` and hands the connection over, as
//! the server's listener does.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use control::{read_hello, Command, Control, ControlConfig, ControlState, ServerId, StreamConfig};
use proto::Frame;
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// How long a test waits for the cluster to reach a state before failing.
pub const PATIENCE: Duration = Duration::from_secs(8);

pub struct Node {
    pub id: ServerId,
    pub address: String,
    pub dir: PathBuf,
    pub control: Control,
    accept: JoinHandle<()>,
}

impl Node {
    /// Starts a node on `listener` with the default settings.
    pub async fn start(
        id: ServerId,
        listener: TcpListener,
        dir: PathBuf,
        voters: &BTreeMap<ServerId, String>,
    ) -> Node {
        let address = listener.local_addr().expect("address").to_string();
        let config = ControlConfig::new(id, address.clone(), dir.clone());
        Node::start_with(config, listener, voters).await
    }

    pub async fn start_with(
        config: ControlConfig,
        listener: TcpListener,
        voters: &BTreeMap<ServerId, String>,
    ) -> Node {
        let (id, address, dir) = (config.id, config.address.clone(), config.dir.clone());
        let control = Control::start(config, voters.clone())
            .await
            .expect("control starts");
        let accept = tokio::spawn(accept(listener, control.clone(), id % 2 == 0));
        Node {
            id,
            address,
            dir,
            control,
            accept,
        }
    }

    /// Stops the node and closes its listener; returns its address and folder.
    pub async fn stop(self) -> (String, PathBuf) {
        self.control.shutdown().await;
        self.accept.abort();
        let _ = self.accept.await;
        (self.address, self.dir)
    }

    pub fn state(&self) -> Arc<ControlState> {
        self.control.state().borrow().clone()
    }

    pub fn join(&self) -> Command {
        Command::Join {
            id: self.id,
            address: self.address.clone(),
            roles: Vec::new(),
            admin_only: false,
            nonce: 0,
        }
    }
}

/// Accepts control connections. Odd servers read exactly the hello
/// (`read_hello`, then `serve`); even ones read ahead as the server's
/// listener does and hand over what followed the hello (`serve_with`).
async fn accept(listener: TcpListener, control: Control, read_ahead: bool) {
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            return;
        };
        let control = control.clone();
        tokio::spawn(async move {
            if read_ahead {
                if let Some(rest) = read_past_hello(&mut stream).await {
                    control.serve_with(net::Link::Plain(stream), rest).await;
                }
            } else if read_hello(&mut stream, Duration::from_secs(2))
                .await
                .is_ok()
            {
                control.serve(stream).await;
            }
        });
    }
}

/// Reads in chunks until the first frame, a `ControlHello`, has arrived;
/// returns the bytes read after it.
async fn read_past_hello(stream: &mut TcpStream) -> Option<Vec<u8>> {
    let mut bytes = Vec::new();
    let mut chunk = [0u8; 1024];
    loop {
        match Frame::decode(&bytes, 1024) {
            Ok(Some((Frame::ControlHello { .. }, used))) => return Some(bytes.split_off(used)),
            Ok(None) => {}
            _ => return None,
        }
        let read = stream.read(&mut chunk).await.ok()?;
        if read == 0 {
            return None;
        }
        bytes.extend_from_slice(&chunk[..read]);
    }
}

pub async fn bind() -> TcpListener {
    TcpListener::bind("127.0.0.1:0").await.expect("bind")
}

/// Binds `count` listeners and names them servers 1..=count.
pub async fn listeners(count: u32) -> (Vec<TcpListener>, BTreeMap<ServerId, String>) {
    let mut listeners = Vec::new();
    let mut voters = BTreeMap::new();
    for id in 1..=count {
        let listener = bind().await;
        voters.insert(id, listener.local_addr().expect("address").to_string());
        listeners.push(listener);
    }
    (listeners, voters)
}

/// A cluster of `count` voters in `root`.
pub async fn cluster(count: u32, root: &tempfile::TempDir) -> Vec<Node> {
    let (listeners, voters) = listeners(count).await;
    let mut nodes = Vec::new();
    for (id, listener) in (1..).zip(listeners) {
        let dir = root.path().join(format!("server-{id}"));
        nodes.push(Node::start(id, listener, dir, &voters).await);
    }
    nodes
}

/// Every node proposes its own join, and all agree on the view.
pub async fn join_all(nodes: &[Node]) {
    for node in nodes {
        node.control.propose(node.join()).await.expect("join");
        assert!(
            node.state().members.contains_key(&node.id),
            "server {} sees its own join when propose returns",
            node.id
        );
    }
    let count = nodes.len();
    wait_until("every node sees every join", || {
        nodes.iter().all(|node| node.state().members.len() == count)
    })
    .await;
}

/// Polls `condition` until it holds, or fails the test after [`PATIENCE`].
pub async fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Awaits `future`, failing the test after [`PATIENCE`].
pub async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(PATIENCE, future)
        .await
        .unwrap_or_else(|_| panic!("timed out: {what}"))
}

/// The node that leads, as the others agree.
pub async fn leader(nodes: &[Node]) -> ServerId {
    let mut found = None;
    wait_until("the nodes agree on a leader", || {
        let first = nodes[0].control.leader();
        found = first;
        first.is_some() && nodes.iter().all(|node| node.control.leader() == first)
    })
    .await;
    found.expect("a leader")
}

pub fn stream_config() -> StreamConfig {
    StreamConfig {
        protocol: "one-hop-ack-client".to_string(),
        durability: "sync".to_string(),
        pages: 0,
        page_size: 0,
        replicas: 0,
        requirement: None,
        commit_interval_ms: 0,
        retain_bytes: 0,
        retain_ms: 0,
    }
}
