//! The server's entry point: `run(listener, server, shutdown)` accepts
//! connections until `shutdown` completes, starts the membership task of a
//! cluster (or the peer links and stream tasks of a lone server), and stops
//! everything it started before it returns.
//!
//! `run_rejoining` is `run` for a server of a cluster that outlives its
//! removal from the view: when the cluster removes it (it was suspected
//! while paused, cut off or slow), it closes everything, as a stop does,
//! and opens again from its folder, so that it joins as a new member,
//! cuts what the cluster does not agree with and catches up by state
//! flush, with no restart of the process and no operator. (Apache Geode's
//! auto-reconnect treats a member forced out of its distributed system the
//! same way: it closes the old cache and builds a new one; Geode docs,
//! "Handling Forced Cache Disconnection Using Autoreconnect".)

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tracing::Instrument;

use crate::error::OpenError;
use crate::state::ServerState;

/// How long a removed server waits for the last holders of its old state
/// (connections closing, a caller's clone) before it opens again.
const CLOSE_WAIT: Duration = Duration::from_secs(10);

/// Why one run of a server ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ended {
    Shutdown,
    Removed,
}

/// The server a process serves now: `run_rejoining` replaces it each time
/// the cluster removes the server and it opens again. Empty while it
/// opens.
#[derive(Clone, Default)]
pub struct CurrentServer(Arc<Mutex<Option<Arc<ServerState>>>>);

impl CurrentServer {
    pub fn new(server: Arc<ServerState>) -> CurrentServer {
        CurrentServer(Arc::new(Mutex::new(Some(server))))
    }

    /// The server now; `None` while it opens again.
    pub fn get(&self) -> Option<Arc<ServerState>> {
        self.0.lock().expect("current server lock").clone()
    }

    pub(crate) fn take(&self) -> Option<Arc<ServerState>> {
        self.0.lock().expect("current server lock").take()
    }

    fn set(&self, server: Arc<ServerState>) {
        *self.0.lock().expect("current server lock") = Some(server);
    }
}

/// Serves `listener` with the server in `current` until `shutdown`
/// completes; each time the cluster removes the server, closes it (every
/// connection, stream and log, as a stop does) and opens it again from
/// its data folder, in place in `current`. An error only when it cannot
/// open again.
pub async fn run_rejoining(
    listener: TcpListener,
    current: &CurrentServer,
    shutdown: impl Future<Output = ()>,
) -> Result<(), OpenError> {
    tokio::pin!(shutdown);
    loop {
        let Some(server) = current.get() else {
            return Ok(());
        };
        if serve(&listener, server, shutdown.as_mut()).await == Ended::Shutdown {
            return Ok(());
        }
        let old = current.take().expect("the server served");
        let config = old.config.clone();
        let me = config.cluster.me;
        let deadline = tokio::time::Instant::now() + CLOSE_WAIT;
        while Arc::strong_count(&old) > 1 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if Arc::strong_count(&old) > 1 {
            tracing::warn!("server {me}: its old state is still held; opening again anyway");
        }
        // Dropping the last reference closes the logs (joining their
        // threads): off the runtime.
        let _ = tokio::task::spawn_blocking(move || drop(old)).await;
        let opened = tokio::task::spawn_blocking(move || ServerState::open(config))
            .await
            .expect("opening does not panic")?;
        tracing::info!("server {me} opened again; joining the cluster as a new member");
        current.set(opened);
    }
}

/// Serves `listener` until `shutdown` completes, then closes every
/// connection and returns once all their tasks are gone, so the caller's
/// `Arc<ServerState>` is the last reference: dropping it writes what is
/// pending and closes the logs.
pub async fn run(
    listener: TcpListener,
    server: Arc<ServerState>,
    shutdown: impl Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    serve(&listener, server, shutdown.as_mut()).await;
}

/// One run of `server` on `listener`: until `shutdown` completes or the
/// cluster removes the server.
/// Starts a cluster member's membership task (returned), or a lone
/// server's peer links and stream tasks.
fn start_tasks(
    server: &Arc<ServerState>,
    stop: &tokio::sync::watch::Sender<bool>,
    span: &tracing::Span,
) -> Option<tokio::task::JoinHandle<()>> {
    if server.config.cluster.is_multi() {
        // Peer links start once this process has joined (its links name
        // its incarnation), and its streams open then.
        let membership = crate::membership::run(Arc::clone(server), stop.subscribe());
        return Some(tokio::spawn(membership.instrument(span.clone())));
    }
    server.router.start_links(stop.subscribe());
    for stream in server.streams() {
        stream.start_tasks(
            server.config.tick_interval,
            crate::stream::CheckpointSchedule::of(&server.config),
            stop.subscribe(),
        );
    }
    None
}

async fn serve(
    listener: &TcpListener,
    server: Arc<ServerState>,
    mut shutdown: Pin<&mut impl Future<Output = ()>>,
) -> Ended {
    let mut connections = JoinSet::new();
    // Connections, peer links and stream tasks watch this to stop; `run`
    // then waits for each connection.
    let stop = server.stop.clone();
    let _ = stop.send(false);
    let stopping = stop.subscribe();
    if let Ok(listening) = listener.local_addr() {
        let config = &server.config;
        let advertised = crate::config::advertised_address(
            listening,
            config.advertise.as_deref(),
            &config.cluster.peers,
        );
        server.set_address(advertised);
    }
    // Every event of this server's tasks names it: several servers may
    // run in one process (`stamplog cluster`, the tests).
    let span = tracing::info_span!("server", id = server.config.cluster.me);
    let membership = start_tasks(&server, &stop, &span);
    let mut removed = server.removed.subscribe();
    let ended = loop {
        tokio::select! {
            _ = &mut shutdown => break Ended::Shutdown,
            _ = async { removed.wait_for(|removed| *removed).await.is_ok() } => break Ended::Removed,
            accepted = listener.accept() => match accepted {
                Ok((socket, from)) => {
                    let server = Arc::clone(&server);
                    let connection = crate::connection::serve(socket, server, stopping.clone());
                    // Its events (a refused login, a broken frame) name
                    // the address it came from.
                    let span = tracing::info_span!(parent: &span, "connection", %from);
                    connections.spawn(connection.instrument(span));
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
    };
    let _ = stop.send(true);
    while connections.join_next().await.is_some() {}
    if let Some(membership) = membership {
        let _ = membership.await;
    }
    for stream in server.streams() {
        stream.stop_tasks().await;
    }
    ended
}
