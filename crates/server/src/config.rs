//! The server's settings and their bounds.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use wal::Storage;

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
    /// Appends of one connection waiting for their acknowledgement; past it
    /// the server stops reading from that connection (backpressure).
    pub in_flight_per_connection_max: usize,
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
}

impl ServerConfig {
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        ServerConfig {
            data_dir: data_dir.into(),
            storage: Arc::new(wal::FileStorage),
            message_bytes_max: 1024 * 1024,
            connections_max: 1024,
            in_flight_per_connection_max: 4096,
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
        }
    }

    /// Largest frame the server accepts: one message plus its headers.
    pub fn frame_bytes_max(&self) -> usize {
        self.message_bytes_max + 1024
    }
}
