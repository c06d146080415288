//! A cluster of servers in one process on loopback: `stamplog cluster`,
//! the demo, the experiments and the tests start one with a line.
//!
//! Every server binds its listener first (port 0 unless given), so the
//! cluster configuration can name every address before any server starts.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::config::{ClusterConfig, Peer, ServerConfig};
use crate::state::{OpenError, ServerState};

/// One running server of a [`LocalCluster`].
pub struct LocalServer {
    pub id: u32,
    pub address: SocketAddr,
    pub data: PathBuf,
    pub state: Arc<ServerState>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl LocalServer {
    /// Stops serving and closes the logs (pending records are written).
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
        let state = self.state;
        // The last reference closes every log; closing joins the log
        // threads, so it happens off the runtime.
        let _ = tokio::task::spawn_blocking(move || drop(state)).await;
    }
}

pub struct LocalCluster {
    pub servers: Vec<LocalServer>,
}

impl LocalCluster {
    /// Starts `count` servers with ids 1..=count, data in
    /// `<folder>/server-<id>`, each configured by `configure` after the
    /// defaults and the cluster settings are filled in.
    pub async fn start(
        count: usize,
        folder: &Path,
        configure: impl Fn(&mut ServerConfig),
    ) -> Result<LocalCluster, String> {
        let mut listeners = Vec::with_capacity(count);
        for _ in 0..count {
            let listener = TcpListener::bind("127.0.0.1:0")
                .await
                .map_err(|e| format!("binding a loopback port: {e}"))?;
            listeners.push(listener);
        }
        let addresses: Vec<SocketAddr> = listeners
            .iter()
            .map(|l| l.local_addr().expect("bound listener"))
            .collect();
        let mut servers = Vec::with_capacity(count);
        for (index, listener) in listeners.into_iter().enumerate() {
            let id = index as u32 + 1;
            let data = folder.join(format!("server-{id}"));
            let mut config = ServerConfig::new(&data);
            config.cluster = ClusterConfig {
                me: id,
                peers: addresses
                    .iter()
                    .enumerate()
                    .filter(|(other, _)| *other != index)
                    .map(|(other, address)| Peer {
                        id: other as u32 + 1,
                        address: address.to_string(),
                    })
                    .collect(),
                ..ClusterConfig::default()
            };
            configure(&mut config);
            let state = ServerState::open(config).map_err(|e: OpenError| e.to_string())?;
            let (stop, stopped) = oneshot::channel();
            let task = tokio::spawn(crate::run(listener, Arc::clone(&state), async {
                let _ = stopped.await;
            }));
            servers.push(LocalServer {
                id,
                address: addresses[index],
                data,
                state,
                stop: Some(stop),
                task: Some(task),
            });
        }
        for server in &servers {
            let ready = tokio::time::timeout(
                std::time::Duration::from_secs(30),
                server.state.wait_ready(),
            );
            if ready.await.is_err() {
                return Err(format!(
                    "server {} did not join the cluster within 30 s",
                    server.id
                ));
            }
        }
        Ok(LocalCluster { servers })
    }

    /// The address of server `id`.
    pub fn address(&self, id: u32) -> SocketAddr {
        self.servers[id as usize - 1].address
    }

    /// Stops every server.
    pub async fn stop(self) {
        for server in self.servers {
            server.stop().await;
        }
    }
}
