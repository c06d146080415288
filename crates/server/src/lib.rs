//! stamplog's server runtime: accepts connections, runs the handshake, cuts
//! frames, and carries out what the pure `engine` decides on the logs of
//! `wal`.
//!
//! The entry point takes a listener and a shutdown future,
//! [`run`]`(listener, server, shutdown)`, so tests bind port 0 and drive the
//! real server.
//!
//! Each stream runs the replication state machine of its protocol
//! (`engine::replication::Replica`); this crate carries out what it decides:
//! log appends, messages to peers over peer links, acknowledgements to
//! client connections, and the visible version readers may see.
//!
//! Invariant: a message is acknowledged only once its log holds it by the
//! stream's durability rule (for `sync`, once its record is durable);
//! readers never see a record past the stream's visible (committed and
//! logged) version.

pub mod auth;
mod config;
mod connection;
mod error;
mod files;
mod local;
mod membership;
mod metrics;
pub mod observe;
mod outgoing;
mod replication;
mod run;
mod state;
mod stream;
mod subscription;
mod wire;

pub use config::{advertised_address, ClusterConfig, Peer, PeerReading, ServerConfig, TlsSettings};
pub use error::{
    CheckpointError, LocalError, OpenError, PlaceError, RemoteCreateError, StreamOpenError,
};
pub use files::{raise_open_files_limit, OpenFiles};
pub use local::{LocalCluster, LocalSecurity, LocalServer};
pub use replication::Router;
pub use run::{run, run_rejoining, CurrentServer};
pub use state::{ServerState, DAMAGED_FOLDER, DEFAULT_REPLICAS};
pub use stream::{now_ms, stream_name_error, Stream, StreamGauges, StreamMeta};
pub use wire::check_peer_message;
