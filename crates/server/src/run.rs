//! The server's entry point: `run(listener, server, shutdown)` accepts
//! connections until `shutdown` completes, starts the membership task of a
//! cluster (or the peer links and stream tasks of a lone server), and stops
//! everything it started before it returns.

use std::future::Future;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::task::JoinSet;

use crate::state::ServerState;

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
    // Connections, peer links and stream tasks watch this to stop; `run`
    // then waits for each connection.
    let stop = server.stop.clone();
    let _ = stop.send(false);
    let stopping = stop.subscribe();
    if let Ok(address) = listener.local_addr() {
        server.set_address(address.to_string());
    }
    let mut membership = None;
    if server.config.cluster.is_multi() {
        // Peer links start once this process has joined (its links name
        // its incarnation), and its streams open then.
        membership = Some(tokio::spawn(crate::membership::run(
            Arc::clone(&server),
            stop.subscribe(),
        )));
    } else {
        server.router.start_links(stop.subscribe());
        for stream in server.streams() {
            stream.start_tasks(
                server.config.tick_interval,
                crate::stream::CheckpointSchedule::of(&server.config),
                stop.subscribe(),
            );
        }
    }
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((socket, _peer)) => {
                    let server = Arc::clone(&server);
                    connections.spawn(crate::connection::serve(socket, server, stopping.clone()));
                }
                Err(error) => {
                    // Out of file descriptors and the like: back off rather
                    // than spin, and keep serving the connections we have.
                    tracing::warn!("accept failed: {error}");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    let _ = stop.send(true);
    while connections.join_next().await.is_some() {}
    if let Some(membership) = membership {
        let _ = membership.await;
    }
    for stream in server.streams() {
        stream.stop_tasks().await;
    }
}
