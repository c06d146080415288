//! Starts and stops a real server in the test's runtime.

use std::net::SocketAddr;
use std::sync::Arc;

use server::{ServerConfig, ServerState};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub struct TestServer {
    pub address: SocketAddr,
    pub state: Arc<ServerState>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl TestServer {
    /// Starts a server on `address` (port 0 for any).
    pub async fn start_at(config: ServerConfig, address: SocketAddr) -> TestServer {
        let state = ServerState::open(config).expect("server opens");
        let listener = TcpListener::bind(address).await.expect("bind");
        let address = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(server::run(listener, Arc::clone(&state), async {
            let _ = stopped.await;
        }));
        TestServer {
            address,
            state,
            stop: Some(stop),
            task: Some(task),
        }
    }

    pub async fn start(config: ServerConfig) -> TestServer {
        TestServer::start_at(config, "127.0.0.1:0".parse().unwrap()).await
    }

    /// Stops serving and closes the logs (pending records are written).
    pub async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        self.task.take().unwrap().await.unwrap();
        let state = self.state;
        // The last reference closes every log; do it off the runtime since
        // closing joins the log threads.
        tokio::task::spawn_blocking(move || drop(state))
            .await
            .unwrap();
    }

    pub fn client_config(&self) -> client::ClientConfig {
        client::ClientConfig::new(self.address.to_string())
    }
}
