//! `Client`: a connection to one server, with the control requests
//! (create, open, list, delete, status, fetch) and the factories of
//! producers and subscriptions.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use engine::replication::Protocol;
use proto::{DurabilityConfig, Frame, StreamInfo};
use tokio::sync::{mpsc, oneshot, Semaphore};

use crate::command::{Command, ReceivedRecord};
use crate::config::{ClientConfig, LossAction, StreamOptions};
use crate::driver;
use crate::error::ClientError;
use crate::inner::Inner;
use crate::link;
use crate::producer::Producer;
use crate::subscription::Subscription;

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
        let connection = link::connect(&config, client_id).await?;
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
