//! The Rust client library of stamplog.
//!
//! A [`Client`] holds a control connection to one server of the cluster:
//! it creates, lists and opens streams, reads them, and reports status. A
//! [`Publisher`] sends messages to one stream whatever its replication
//! protocol: it connects to every replica, runs the client side of the
//! protocol, and keeps each message until the protocol's ack rule is met,
//! resending it with the same event id after a timeout, so a message that
//! had landed is answered with its original version and the `duplicate`
//! flag instead of being logged twice (seed 000's application-level
//! reliable messaging: the sender keeps a copy until the explicit
//! acknowledgement).
//!
//! ```no_run
//! use client::{Client, ClientConfig, DurabilityConfig, Protocol, Publisher, PublisherConfig};
//!
//! # async fn example() -> Result<(), client::ClientError> {
//! let client = Client::connect(ClientConfig::new("127.0.0.1:7400")).await?;
//! // Three replicas; the default protocol: the primary stamps and
//! // forwards, every replica acks the client.
//! let stream = client
//!     .create_stream_with("orders", DurabilityConfig::Sync, Protocol::OneHopAckClient, 3)
//!     .await?;
//! let publisher = Publisher::connect(&stream, PublisherConfig::default()).await?;
//! // One message, waiting until every replica has it on disk:
//! let done = publisher.send(b"order-1", b"two apples").await?;
//! println!("version {} acked by {:?}", done.version, done.acks);
//! // Many in flight: submit returns once the message is sent; the answer
//! // comes later.
//! let mut pending = Vec::new();
//! for number in 0..1000u32 {
//!     pending.push(publisher.submit(b"", &number.to_le_bytes()).await?);
//! }
//! for answer in pending {
//!     answer.await?;
//! }
//! // Read everything from version 1 on, in order, each once, from the
//! // server this client is connected to (any replica will do).
//! let mut subscription = client.subscribe(stream.id, 1).await?;
//! while let Some(record) = subscription.next().await {
//!     let record = record?;
//!     println!("{} -> {} bytes", record.version, record.payload.len());
//! #   break;
//! }
//! # Ok(())
//! # }
//! ```
//!
//! [`Producer`] is the single-server path (`Append`), answered by the
//! primary alone; the server accepts it only on streams whose ack rule the
//! primary's answer meets (one replica, or `one-hop`, `server-sync`,
//! `server-async`). The logging experiment uses it for its echo replies.

mod driver;
mod producer;
mod publisher;
mod subscription;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use proto::Frame;
pub use proto::{AckLevel, DurabilityConfig, ErrorCode, EventId, RetentionConfig, StreamInfo};
use tokio::sync::{mpsc, oneshot, Semaphore};

pub use engine::replication::{HybridMode, Protocol};
pub use producer::{Ack, PendingAck, Producer};
pub use publisher::{PendingPublish, Published, Publisher, PublisherConfig, PUBLISHER_WINDOW_MAX};
pub use subscription::{ReceivedRecord, Subscription};

/// What a stream of a cluster does while its requirement is not met.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LossAction {
    /// Writes are refused (`ReadOnly`); reads go on.
    ReadOnly,
    /// Writes wait (refused with `Busy`, so publishers retry) up to
    /// `timeout_ms`, then are refused as read-only.
    Block { timeout_ms: u32 },
    /// Writers' connections are closed; they reconnect and retry.
    Reconnect,
}

use driver::Command;

/// How a new stream is set up; everything here is fixed at creation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamOptions {
    pub durability: DurabilityConfig,
    /// Replication protocol (`one-hop-ack-client` by default).
    pub protocol: Protocol,
    /// Replica count; 0 picks the default (3, or the cluster's size if
    /// smaller).
    pub replicas: u8,
    /// The output commit interval T in milliseconds (at most 10,000): acks
    /// and deliveries are released only at multiples of T, for what the
    /// servers took in before, once it is durable. 0 (the default) acks as
    /// soon as the group commit is durable.
    pub commit_interval_ms: u32,
    /// The stream's own retention: keep at least `bytes` of log, delete
    /// segments closed `ms` ago (only segments two checkpoints cover). 0
    /// leaves the server's default for that limit.
    pub retention: RetentionConfig,
}

impl StreamOptions {
    /// The defaults, with the given durability.
    pub fn new(durability: DurabilityConfig) -> StreamOptions {
        StreamOptions {
            durability,
            protocol: Protocol::OneHopAckClient,
            replicas: 0,
            commit_interval_ms: 0,
            retention: RetentionConfig::default(),
        }
    }
}

#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// `host:port` of the server.
    pub address: String,
    /// The client id in every event id; random per client when `None`.
    pub client_id: Option<u128>,
    /// Appends in flight (sent, not yet acknowledged) across the client.
    pub window: usize,
    /// Records a subscription buffers before the server must wait.
    pub subscription_buffer: u32,
    /// How long a control request (create, open, list, status, fetch)
    /// waits for its answer.
    pub request_timeout: Duration,
    /// How long one connection attempt may take.
    pub connect_timeout: Duration,
    /// Delay before the first reconnection attempt; it doubles up to
    /// `reconnect_delay_max`.
    pub reconnect_delay_min: Duration,
    pub reconnect_delay_max: Duration,
}

impl ClientConfig {
    pub fn new(address: impl Into<String>) -> Self {
        ClientConfig {
            address: address.into(),
            client_id: None,
            window: 256,
            subscription_buffer: 1024,
            request_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(5),
            reconnect_delay_min: Duration::from_millis(20),
            reconnect_delay_max: Duration::from_secs(1),
        }
    }
}

#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum ClientError {
    #[error("cannot connect to {address}: {reason}")]
    Connect { address: String, reason: String },
    #[error("server refused ({code:?}): {message}")]
    Server { code: ErrorCode, message: String },
    #[error(
        "the connection broke before the answer came; the request may or may not have taken effect"
    )]
    Disconnected,
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("the client is closed")]
    Closed,
    #[error("unexpected answer from the server: {0}")]
    Protocol(String),
    #[error("invalid configuration: {0}")]
    Config(String),
}

pub(crate) struct Inner {
    pub(crate) config: ClientConfig,
    pub(crate) client_id: u128,
    pub(crate) commands: mpsc::UnboundedSender<Command>,
    /// Bounds the appends in flight (`window`).
    pub(crate) window: Arc<Semaphore>,
    next_request: AtomicU64,
    next_session: AtomicU64,
}

impl Inner {
    pub(crate) fn next_request(&self) -> u64 {
        self.next_request.fetch_add(1, Ordering::Relaxed)
    }
}

/// A connection to one server; cheap to clone.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

impl Client {
    /// Connects (the first attempt must succeed, so a wrong address is an
    /// error at once) and starts the task that keeps the connection.
    pub async fn connect(config: ClientConfig) -> Result<Client, ClientError> {
        let client_id = config.client_id.unwrap_or_else(proto::random_u128);
        let connection = driver::connect(&config, client_id).await?;
        let (commands, receiver) = mpsc::unbounded_channel();
        let inner = Arc::new(Inner {
            window: Arc::new(Semaphore::new(config.window.max(1))),
            config: config.clone(),
            client_id,
            commands,
            next_request: AtomicU64::new(1),
            next_session: AtomicU64::new(1),
        });
        tokio::spawn(driver::Driver::new(config, client_id, receiver).run(connection));
        Ok(Client { inner })
    }

    pub fn client_id(&self) -> u128 {
        self.inner.client_id
    }

    /// A producer: one session of this client, with its own sequence.
    pub fn producer(&self, stream: u64) -> Producer {
        let session = self.inner.next_session.fetch_add(1, Ordering::Relaxed);
        Producer::new(Arc::clone(&self.inner), stream, session)
    }

    /// A producer with a chosen session and first sequence, for a process
    /// that resumes a session it persisted.
    pub fn producer_with_session(&self, stream: u64, session: u64, next_sequence: u64) -> Producer {
        Producer::resume(Arc::clone(&self.inner), stream, session, next_sequence)
    }

    pub(crate) async fn request(
        &self,
        build: impl FnOnce(u64) -> Frame,
    ) -> Result<Frame, ClientError> {
        let request = self.inner.next_request();
        let (reply, answer) = oneshot::channel();
        let frame = build(request).to_bytes();
        self.inner
            .commands
            .send(Command::Request {
                request,
                frame,
                reply,
            })
            .map_err(|_| ClientError::Closed)?;
        let timeout = self.inner.config.request_timeout;
        match tokio::time::timeout(timeout, answer).await {
            Err(_) => Err(ClientError::Timeout(timeout)),
            Ok(Err(_)) => Err(ClientError::Closed),
            Ok(Ok(result)) => result,
        }
    }

    /// Creates a stream with the default protocol (`one-hop-ack-client`)
    /// and replica count (3, or the cluster's size if smaller).
    pub async fn create_stream(
        &self,
        name: &str,
        durability: DurabilityConfig,
    ) -> Result<StreamInfo, ClientError> {
        self.create_stream_with(name, durability, Protocol::OneHopAckClient, 0)
            .await
    }

    /// Creates a stream with a chosen protocol and replica count (0: the
    /// default, 3 or the cluster's size if smaller). The server that gets
    /// the request creates the replica on every server of the set.
    pub async fn create_stream_with(
        &self,
        name: &str,
        durability: DurabilityConfig,
        protocol: Protocol,
        replicas: u8,
    ) -> Result<StreamInfo, ClientError> {
        let options = StreamOptions {
            protocol,
            replicas,
            ..StreamOptions::new(durability)
        };
        self.create_stream_with_options(name, &options).await
    }

    /// Creates a stream with every setting fixed at creation, the output
    /// commit interval included.
    pub async fn create_stream_with_options(
        &self,
        name: &str,
        options: &StreamOptions,
    ) -> Result<StreamInfo, ClientError> {
        let name = name.to_string();
        expect_info(
            self.request(|request| Frame::CreateStream {
                request,
                name,
                durability: options.durability,
                protocol: options.protocol.code(),
                replicas: options.replicas,
                commit_interval_ms: options.commit_interval_ms,
                retention: options.retention,
            })
            .await?,
        )
    }

    pub async fn open_stream(&self, name: &str) -> Result<StreamInfo, ClientError> {
        let name = name.to_string();
        expect_info(
            self.request(|request| Frame::OpenStream { request, name })
                .await?,
        )
    }

    pub async fn delete_stream(&self, name: &str) -> Result<(), ClientError> {
        let name = name.to_string();
        match self
            .request(|request| Frame::DeleteStream { request, name })
            .await?
        {
            Frame::Ok { .. } => Ok(()),
            other => Err(ClientError::Protocol(format!("{other:?}"))),
        }
    }

    /// Takes a server that has left the cluster for good (stopped, and
    /// removed from the view) out of the control plane's voters, so the
    /// cluster's majority no longer counts it. A server still in the view,
    /// the last voter, and the server asked are refused.
    pub async fn retire_server(&self, server: u32) -> Result<(), ClientError> {
        match self
            .request(|request| Frame::RetireServer { request, server })
            .await?
        {
            Frame::Ok { .. } => Ok(()),
            other => Err(ClientError::Protocol(format!("{other:?}"))),
        }
    }

    /// Sets what a stream of a cluster requires of its live in-sync
    /// replicas (`roles` they must cover, `min_in_sync` of them) and what
    /// it does while that is not met: [`LossAction::ReadOnly`] refuses
    /// writes, [`LossAction::Block`] makes them wait up to its timeout,
    /// [`LossAction::Reconnect`] closes writers' connections. `None`
    /// clears it. The stream resumes by itself once it is met again.
    pub async fn set_requirement(
        &self,
        name: &str,
        requirement: Option<(Vec<String>, u16, LossAction)>,
    ) -> Result<(), ClientError> {
        let name = name.to_string();
        let (roles, min_in_sync, action, block_ms) = match requirement {
            None => (Vec::new(), 0, 0, 0),
            Some((roles, min, LossAction::ReadOnly)) => (roles, min, 1, 0),
            Some((roles, min, LossAction::Block { timeout_ms })) => (roles, min, 2, timeout_ms),
            Some((roles, min, LossAction::Reconnect)) => (roles, min, 3, 0),
        };
        match self
            .request(|request| Frame::SetRequirement {
                request,
                name,
                min_in_sync,
                action,
                block_ms,
                roles,
            })
            .await?
        {
            Frame::Ok { .. } => Ok(()),
            other => Err(ClientError::Protocol(format!("{other:?}"))),
        }
    }

    pub async fn list_streams(&self) -> Result<Vec<StreamInfo>, ClientError> {
        match self
            .request(|request| Frame::ListStreams { request })
            .await?
        {
            Frame::StreamList { streams, .. } => Ok(streams),
            other => Err(ClientError::Protocol(format!("{other:?}"))),
        }
    }

    /// The server's status document (JSON).
    pub async fn status(&self) -> Result<String, ClientError> {
        match self.request(|request| Frame::Status { request }).await? {
            Frame::StatusReply { json, .. } => Ok(json),
            other => Err(ClientError::Protocol(format!("{other:?}"))),
        }
    }

    /// Reads up to `max_records` committed records from version `from` on.
    pub async fn fetch(
        &self,
        stream: u64,
        from: u64,
        max_records: u32,
    ) -> Result<Vec<ReceivedRecord>, ClientError> {
        let answer = self
            .request(|request| Frame::Fetch {
                request,
                stream,
                from,
                max_records,
                max_bytes: 1024 * 1024,
            })
            .await?;
        match answer {
            Frame::Records { records, .. } => Ok(proto::frame::iter_records(&records)
                .map(ReceivedRecord::from)
                .collect()),
            other => Err(ClientError::Protocol(format!("{other:?}"))),
        }
    }

    /// Subscribes to committed records from version `from` on. The
    /// subscription survives reconnections and resumes after the last
    /// record it delivered.
    pub async fn subscribe(&self, stream: u64, from: u64) -> Result<Subscription, ClientError> {
        Subscription::start(Arc::clone(&self.inner), stream, from.max(1))
    }
}

fn expect_info(frame: Frame) -> Result<StreamInfo, ClientError> {
    match frame {
        Frame::StreamInfo { info, .. } => Ok(info),
        other => Err(ClientError::Protocol(format!("{other:?}"))),
    }
}
