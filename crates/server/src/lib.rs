//! stamplog's server runtime: accepts connections, runs the handshake, cuts
//! frames, and carries out what the pure `engine` decides on the logs of
//! `wal`.
//!
//! The entry point takes a listener and a shutdown future,
//! [`run`]`(listener, server, shutdown)`, so tests bind port 0 and drive the
//! real server.
//!
//! Invariant: an append is acknowledged only once its stream's ack rule is
//! met (for `sync`, once its record is durable); readers never see a record
//! past the durable version.

mod config;
mod connection;
mod state;
mod stream;
mod subscription;

pub use config::ServerConfig;
pub use state::{OpenError, ServerState};
pub use stream::{stream_name_error, Stream};

use std::future::Future;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::task::JoinSet;

/// Serves `listener` until `shutdown` completes, then closes every
/// connection and returns once all their tasks are gone, so the caller's
/// `Arc<ServerState>` is the last reference: dropping it writes what is
/// pending and closes the logs.
pub async fn run(
    listener: TcpListener,
    server: Arc<ServerState>,
    shutdown: impl Future<Output = ()>,
) {
    let mut connections = JoinSet::new();
    // Connections watch this to stop; `run` then waits for each of them.
    let (stop, stopping) = tokio::sync::watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((socket, _peer)) => {
                    let server = Arc::clone(&server);
                    connections.spawn(connection::serve(socket, server, stopping.clone()));
                }
                Err(error) => {
                    // Out of file descriptors and the like: back off rather
                    // than spin, and keep serving the connections we have.
                    eprintln!("stamplog: accept failed: {error}");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    let _ = stop.send(true);
    while connections.join_next().await.is_some() {}
}
