//! Outgoing control connections: openraft's `RaftNetwork` (append entries,
//! votes, snapshots), and this server's own requests to the leader
//! (forwarded commands, membership heartbeats, new voters).
//!
//! Each openraft replication stream owns one connection to its target;
//! [`Peers`] keeps two more per address, one for requests and one for
//! heartbeats, so a slow request never holds up the heartbeats that keep a
//! member in the view. A connection is dialed when first needed; one that
//! fails or times out is dropped and dialed again by the next request.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::error::{
    Fatal, InstallSnapshotError, NetworkError, RPCError, RaftError, ReplicationClosed,
    StreamingError, Unreachable,
};
use openraft::network::{Backoff, RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    SnapshotResponse, VoteRequest, VoteResponse,
};
use openraft::{AnyError, BasicNode, OptionalSend, Snapshot, StorageError, StorageIOError, Vote};

use crate::machine::Image;
use crate::state::ServerId;
use crate::wire::{
    dial, read_message, write_message, RaftErrorText, Reply, Request, CONTROL_MESSAGE_MAX,
};
use crate::TypeConfig;

/// Addresses [`Peers`] keeps connections to before it forgets idle ones.
const PEER_ADDRESSES_MAX: usize = 64;
/// How long openraft waits before it dials an unreachable peer again.
const UNREACHABLE_BACKOFF: Duration = Duration::from_millis(200);

/// How a request on a link failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LinkError {
    #[error("cannot reach {address}: {source}")]
    Unreachable {
        address: String,
        source: std::io::Error,
    },
    #[error("connection to {address} broke: {detail}")]
    Broken { address: String, detail: String },
    #[error("{address} did not answer within {timeout_ms} ms")]
    Timeout { address: String, timeout_ms: u128 },
}

/// One outgoing control connection to `address`.
pub(crate) struct Link {
    from: ServerId,
    dialer: net::Dialer,
    address: String,
    stream: Option<net::Link>,
}

impl Link {
    pub(crate) fn new((from, dialer): (ServerId, net::Dialer), address: String) -> Link {
        Link {
            from,
            dialer,
            address,
            stream: None,
        }
    }

    /// Sends `request` and reads its reply within `timeout`.
    pub(crate) async fn call(
        &mut self,
        request: &Request,
        timeout: Duration,
    ) -> Result<Reply, LinkError> {
        match tokio::time::timeout(timeout, self.exchange(request)).await {
            Ok(result) => result,
            Err(_) => Err(LinkError::Timeout {
                address: self.address.clone(),
                timeout_ms: timeout.as_millis(),
            }),
        }
    }

    /// Sends `request` and reads its reply. The connection is taken out of
    /// the link while in use, so a cancelled exchange drops it rather than
    /// leaving an unread reply for the next request. A kept connection
    /// that turns out dead (the peer restarted) is dialed again once.
    pub(crate) async fn exchange(&mut self, request: &Request) -> Result<Reply, LinkError> {
        if let Some(stream) = self.stream.take() {
            if let Ok(reply) = self.exchange_on(stream, request).await {
                return Ok(reply);
            }
        }
        let stream = dial(&self.dialer, &self.address, self.from)
            .await
            .map_err(|source| LinkError::Unreachable {
                address: self.address.clone(),
                source,
            })?;
        self.exchange_on(stream, request).await
    }

    async fn exchange_on(
        &mut self,
        mut stream: net::Link,
        request: &Request,
    ) -> Result<Reply, LinkError> {
        let broken = |detail: String| LinkError::Broken {
            address: self.address.clone(),
            detail,
        };
        write_message(&mut stream, request)
            .await
            .map_err(|error| broken(error.to_string()))?;
        let reply = read_message(&mut stream, CONTROL_MESSAGE_MAX)
            .await
            .map_err(|error| broken(error.to_string()))?
            .ok_or_else(|| broken("closed before answering".to_string()))?;
        self.stream = Some(stream);
        Ok(reply)
    }
}

/// The two connections this server keeps to one address for its own
/// requests.
struct PeerLinks {
    request: tokio::sync::Mutex<Link>,
    heartbeat: tokio::sync::Mutex<Link>,
}

/// This server's connections for its own requests, by address.
pub(crate) struct Peers {
    me: ServerId,
    dialer: net::Dialer,
    links: Mutex<HashMap<String, Arc<PeerLinks>>>,
}

impl Peers {
    pub(crate) fn new(me: ServerId, dialer: net::Dialer) -> Peers {
        Peers {
            me,
            dialer,
            links: Mutex::new(HashMap::new()),
        }
    }

    fn links(&self, address: &str) -> Arc<PeerLinks> {
        let mut links = self.links.lock().expect("peer links lock");
        if !links.contains_key(address) && links.len() >= PEER_ADDRESSES_MAX {
            links.retain(|_, peer| Arc::strong_count(peer) > 1);
        }
        links
            .entry(address.to_string())
            .or_insert_with(|| {
                Arc::new(PeerLinks {
                    request: tokio::sync::Mutex::new(Link::new(
                        (self.me, self.dialer.clone()),
                        address.to_string(),
                    )),
                    heartbeat: tokio::sync::Mutex::new(Link::new(
                        (self.me, self.dialer.clone()),
                        address.to_string(),
                    )),
                })
            })
            .clone()
    }

    /// Sends a request to `address`; `timeout` covers waiting for the
    /// connection as well.
    pub(crate) async fn request(
        &self,
        address: &str,
        request: &Request,
        timeout: Duration,
    ) -> Result<Reply, LinkError> {
        let links = self.links(address);
        let exchange = async { links.request.lock().await.exchange(request).await };
        within(address, timeout, exchange).await
    }

    /// Sends a heartbeat to `address` on its own connection.
    pub(crate) async fn heartbeat(
        &self,
        address: &str,
        request: &Request,
        timeout: Duration,
    ) -> Result<Reply, LinkError> {
        let links = self.links(address);
        let exchange = async { links.heartbeat.lock().await.exchange(request).await };
        within(address, timeout, exchange).await
    }
}

async fn within(
    address: &str,
    timeout: Duration,
    exchange: impl Future<Output = Result<Reply, LinkError>>,
) -> Result<Reply, LinkError> {
    match tokio::time::timeout(timeout, exchange).await {
        Ok(result) => result,
        Err(_) => Err(LinkError::Timeout {
            address: address.to_string(),
            timeout_ms: timeout.as_millis(),
        }),
    }
}

/// Makes openraft's connections to its peers.
pub(crate) struct Network {
    me: ServerId,
    rpc_timeout: Duration,
    dialer: net::Dialer,
}

impl Network {
    pub(crate) fn new(me: ServerId, rpc_timeout: Duration, dialer: net::Dialer) -> Network {
        Network {
            me,
            rpc_timeout,
            dialer,
        }
    }
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = RaftLink;

    async fn new_client(&mut self, _target: u64, node: &BasicNode) -> RaftLink {
        RaftLink {
            link: Link::new((self.me, self.dialer.clone()), node.addr.clone()),
            rpc_timeout: self.rpc_timeout,
        }
    }
}

/// One openraft connection to a peer.
pub(crate) struct RaftLink {
    link: Link,
    rpc_timeout: Duration,
}

fn rpc_error<E: std::error::Error>(error: LinkError) -> RPCError<u64, BasicNode, E> {
    match error {
        LinkError::Unreachable { .. } => RPCError::Unreachable(Unreachable::new(&error)),
        _ => RPCError::Network(NetworkError::new(&error)),
    }
}

/// The peer answered with an error: its Raft node is stopping. openraft
/// backs off from an unreachable peer, which is what this is.
fn remote_error<E: std::error::Error>(
    address: &str,
    error: RaftErrorText,
) -> RPCError<u64, BasicNode, E> {
    RPCError::Unreachable(Unreachable::new(&AnyError::error(format!(
        "{address} answered: {error}"
    ))))
}

fn unexpected<E: std::error::Error>(address: &str, reply: &Reply) -> RPCError<u64, BasicNode, E> {
    RPCError::Network(NetworkError::new(&AnyError::error(format!(
        "{address} answered out of turn: {reply:?}"
    ))))
}

impl RaftNetwork<TypeConfig> for RaftLink {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<u64>, RPCError<u64, BasicNode, RaftError<u64>>> {
        let reply = self
            .link
            .call(&Request::AppendEntries(rpc), self.rpc_timeout)
            .await
            .map_err(rpc_error)?;
        match reply {
            Reply::AppendEntries(Ok(response)) => Ok(response),
            Reply::AppendEntries(Err(error)) => Err(remote_error(&self.link.address, error)),
            other => Err(unexpected(&self.link.address, &other)),
        }
    }

    /// Never called: [`RaftLink::full_snapshot`] sends snapshots whole.
    async fn install_snapshot(
        &mut self,
        _rpc: InstallSnapshotRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<u64>,
        RPCError<u64, BasicNode, RaftError<u64, InstallSnapshotError>>,
    > {
        Err(RPCError::Unreachable(Unreachable::new(&AnyError::error(
            "the control plane sends snapshots whole, not in chunks",
        ))))
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<u64>,
        _option: RPCOption,
    ) -> Result<VoteResponse<u64>, RPCError<u64, BasicNode, RaftError<u64>>> {
        let reply = self
            .link
            .call(&Request::Vote(rpc), self.rpc_timeout)
            .await
            .map_err(rpc_error)?;
        match reply {
            Reply::Vote(Ok(response)) => Ok(response),
            Reply::Vote(Err(error)) => Err(remote_error(&self.link.address, error)),
            other => Err(unexpected(&self.link.address, &other)),
        }
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote<u64>,
        snapshot: Snapshot<TypeConfig>,
        cancel: impl Future<Output = ReplicationClosed> + OptionalSend + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<u64>, StreamingError<TypeConfig, Fatal<u64>>> {
        let image: Image =
            serde_json::from_slice(snapshot.snapshot.get_ref()).map_err(|error| {
                StorageError::from(StorageIOError::read_snapshot(
                    Some(snapshot.meta.signature()),
                    &error,
                ))
            })?;
        let request = Request::Snapshot {
            vote,
            meta: snapshot.meta,
            image,
        };
        let timeout = self.rpc_timeout.max(option.hard_ttl());
        let reply = tokio::select! {
            closed = cancel => return Err(StreamingError::Closed(closed)),
            reply = self.link.call(&request, timeout) => reply,
        };
        let streaming_error = |error: LinkError| match error {
            LinkError::Unreachable { .. } => StreamingError::Unreachable(Unreachable::new(&error)),
            _ => StreamingError::Network(NetworkError::new(&error)),
        };
        match reply.map_err(streaming_error)? {
            Reply::Snapshot(Ok(response)) => Ok(response),
            Reply::Snapshot(Err(error)) => Err(StreamingError::Unreachable(Unreachable::new(
                &AnyError::error(format!("{} answered: {error}", self.link.address)),
            ))),
            other => Err(StreamingError::Network(NetworkError::new(
                &AnyError::error(format!(
                    "{} answered out of turn: {other:?}",
                    self.link.address
                )),
            ))),
        }
    }

    fn backoff(&self) -> Backoff {
        Backoff::new(std::iter::repeat(UNREACHABLE_BACKOFF))
    }
}
