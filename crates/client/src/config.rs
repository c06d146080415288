//! What a client is configured with, and how a new stream is set up.

use std::time::Duration;

use engine::replication::Protocol;
use proto::{DurabilityConfig, RetentionConfig};

#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// `host:port` of the server.
    pub address: String,
    /// The client id in every event id; random per client when `None`.
    pub client_id: Option<u128>,
    /// What the client proves itself with.
    pub credentials: Credentials,
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
    /// This configuration for the server at `address`.
    pub fn to(&self, address: &str) -> ClientConfig {
        ClientConfig {
            address: address.to_string(),
            ..self.clone()
        }
    }

    pub fn new(address: impl Into<String>) -> Self {
        ClientConfig {
            address: address.into(),
            client_id: None,
            credentials: Credentials::default(),
            window: 256,
            subscription_buffer: 1024,
            request_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(5),
            reconnect_delay_min: Duration::from_millis(20),
            reconnect_delay_max: Duration::from_secs(1),
        }
    }
}

/// What a client proves itself with to a server.
#[derive(Clone, Debug, Default)]
pub struct Credentials {
    /// The token presented in `Hello` (empty: none). A server with a token
    /// file refuses a client without one it holds, and each request the
    /// token has no right for.
    pub token: String,
    /// How connections are opened: plain TCP, or TLS trusting a CA (and
    /// presenting a client certificate if the server asks for one), made
    /// with `net::Dialer::tls`.
    pub dialer: net::Dialer,
}

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
