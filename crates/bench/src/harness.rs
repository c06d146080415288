//! Starts and stops a real server inside the experiment's runtime, on
//! 127.0.0.1 port 0, the way the server's own tests do.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use server::{ServerConfig, ServerState};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A server serving on a loopback port until [`InProcessServer::stop`].
pub struct InProcessServer {
    pub address: SocketAddr,
    pub state: Arc<ServerState>,
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

impl InProcessServer {
    /// Opens the server's state from `config` and starts serving.
    pub async fn start(config: ServerConfig) -> anyhow::Result<InProcessServer> {
        let data_dir = config.data_dir.clone();
        let state = ServerState::open(config)
            .with_context(|| format!("cannot open a server in {}", data_dir.display()))?;
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("cannot bind a loopback port")?;
        let address = listener.local_addr()?;
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(server::run(listener, Arc::clone(&state), async {
            let _ = stopped.await;
        }));
        Ok(InProcessServer {
            address,
            state,
            stop,
            task,
        })
    }

    /// A client configuration pointing at this server.
    pub fn client_config(&self, window: usize) -> client::ClientConfig {
        let mut config = client::ClientConfig::new(self.address.to_string());
        config.window = window.max(1);
        config
    }

    /// Stops serving and closes the logs, writing what is pending.
    pub async fn stop(self) -> anyhow::Result<()> {
        let _ = self.stop.send(());
        self.task.await.context("the server task panicked")?;
        let state = self.state;
        // Dropping the last reference closes every log, which joins the log
        // threads: do it off the runtime so no worker blocks.
        tokio::task::spawn_blocking(move || drop(state))
            .await
            .context("closing the server's logs panicked")?;
        Ok(())
    }
}
