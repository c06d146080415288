//! The server library's error types besides the wire's (`StreamError`
//! carries an `ErrorCode` to the client): why a stream would not open, why
//! a checkpoint task failed, why a peer did not create its replica, and why
//! a local cluster would not start; and why a server would not open its
//! data folder.

use engine::replication::{ServerId, UnknownProtocol};
use proto::{ErrorCode, UnknownDurability};
use std::time::Duration;

use std::path::PathBuf;

/// Why a stream's files could not be opened as a stream.
#[derive(Debug, thiserror::Error)]
pub enum StreamOpenError {
    #[error(transparent)]
    Durability(#[from] UnknownDurability),
    #[error(transparent)]
    Protocol(#[from] UnknownProtocol),
    #[error("this server ({me}) is not in the stream's replica set {replicas:?}")]
    NotAReplica {
        me: ServerId,
        replicas: Vec<ServerId>,
    },
    #[error("this durability holds records of at most {limit} bytes, less than a message of {needed} bytes needs; {setting}")]
    RecordTooLarge {
        limit: usize,
        needed: usize,
        setting: &'static str,
    },
    #[error(transparent)]
    Log(#[from] wal::LogError),
}

/// Why a checkpoint or retention pass did not finish.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("the {0} task failed: {1}")]
    Task(&'static str, tokio::task::JoinError),
    #[error(transparent)]
    Log(#[from] wal::LogError),
}

/// Why another server did not create its replica of a stream.
#[derive(Debug, thiserror::Error)]
pub enum RemoteCreateError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("refused ({code:?}): {message}")]
    Refused { code: ErrorCode, message: String },
    #[error("unexpected answer {0}")]
    Unexpected(String),
    #[error(transparent)]
    Frame(#[from] proto::FrameError),
    #[error("the server closed the connection")]
    Closed,
    #[error("no answer within {0:?}")]
    Timeout(Duration),
}

/// Why a replica set could not be chosen.
#[derive(Debug, thiserror::Error)]
#[error("a stream of {wanted} replicas needs {wanted} servers; the cluster has {servers}")]
pub struct PlaceError {
    pub wanted: usize,
    pub servers: usize,
}

/// Why a local cluster, or one of its servers, did not start.
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    #[error("{what}: {source}")]
    Listen {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Open(#[from] OpenError),
    #[error("server {0} did not join the cluster within 30 s")]
    NotJoined(u32),
    #[error("no server {0} in this cluster")]
    NoSuchServer(u32),
    #[error("{path}: {source}")]
    Security {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Tls(#[from] net::tls::TlsError),
}

#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("cannot use data folder {path}: {source}")]
    DataDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("stream in {path} cannot be opened: {reason}")]
    Stream { path: PathBuf, reason: String },
    #[error("bad cluster configuration: {0}")]
    Cluster(String),
    /// The server's journal could not be opened or redone (see
    /// `wal::journal`): a damaged journal names the byte.
    #[error("the journal cannot be opened: {0}")]
    Journal(#[source] wal::LogError),
    #[error(transparent)]
    Tokens(#[from] crate::auth::TokenFileError),
    #[error(transparent)]
    Tls(#[from] net::tls::TlsError),
}
