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
use crate::error::LocalError;
use crate::run::CurrentServer;
use crate::state::ServerState;

/// One running server of a [`LocalCluster`].
pub struct LocalServer {
    pub id: u32,
    pub address: SocketAddr,
    pub data: PathBuf,
    current: CurrentServer,
    /// The admin HTTP port, when the configuration asks for one.
    pub admin: Option<crate::observe::AdminServer>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl LocalServer {
    /// The server's state now (it is opened anew each time the cluster
    /// removes the server and it joins again).
    pub fn state(&self) -> Arc<ServerState> {
        self.current().expect("the server is open")
    }

    /// [`state`](Self::state), or `None` while the server opens again.
    pub fn current(&self) -> Option<Arc<ServerState>> {
        self.current.get()
    }

    /// Opens the data folder and serves `listener` on this runtime.
    fn run(
        id: u32,
        listener: TcpListener,
        config: ServerConfig,
    ) -> Result<LocalServer, LocalError> {
        let address = listener.local_addr().map_err(|source| LocalError::Listen {
            what: "the listener's address".to_string(),
            source,
        })?;
        let data = config.data_dir.clone();
        let admin_listen = config.admin_listen;
        let current = CurrentServer::new(ServerState::open(config)?);
        let admin = match admin_listen {
            Some(admin_address) => {
                let bound = std::net::TcpListener::bind(admin_address)
                    .and_then(|listener| {
                        listener.set_nonblocking(true)?;
                        TcpListener::from_std(listener)
                    })
                    .and_then(|listener| crate::observe::serve_admin(listener, current.clone()));
                Some(bound.map_err(|source| LocalError::Listen {
                    what: format!("the admin port {admin_address}"),
                    source,
                })?)
            }
            None => None,
        };
        let (stop, stopped) = oneshot::channel();
        let serving = current.clone();
        let task = tokio::spawn(async move {
            let ran = crate::run_rejoining(listener, &serving, async {
                let _ = stopped.await;
            })
            .await;
            if let Err(error) = ran {
                tracing::warn!("a local server could not open again: {error}");
            }
        });
        Ok(LocalServer {
            id,
            address,
            data,
            current,
            admin,
            stop: Some(stop),
            task: Some(task),
        })
    }

    /// Returns once the server has joined the cluster (at most 30 s).
    async fn joined(&self) -> Result<(), LocalError> {
        let state = self.state();
        let ready = tokio::time::timeout(std::time::Duration::from_secs(30), state.wait_ready());
        ready.await.map_err(|_| LocalError::NotJoined(self.id))
    }

    /// Stops serving and closes the logs (pending records are written).
    pub async fn stop(mut self) {
        if let Some(admin) = self.admin.take() {
            admin.stop().await;
        }
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
        let state = self.current.take();
        // The last reference closes every log; closing joins the log
        // threads, so it happens off the runtime.
        let _ = tokio::task::spawn_blocking(move || drop(state)).await;
    }
}

/// Server `id`'s configuration: data in `<folder>/server-<id>`, and every
/// server of `addresses` but itself (the `id`-th) as a peer.
/// A listener on a free loopback port.
async fn bind_loopback() -> Result<TcpListener, LocalError> {
    TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|source| LocalError::Listen {
            what: "binding a loopback port".to_string(),
            source,
        })
}

fn config_for(folder: &Path, id: u32, addresses: &[SocketAddr]) -> ServerConfig {
    let mut config = ServerConfig::new(folder.join(format!("server-{id}")));
    config.cluster = ClusterConfig {
        me: id,
        peers: addresses
            .iter()
            .enumerate()
            .filter(|(index, _)| *index as u32 + 1 != id)
            .map(|(index, address)| Peer {
                id: index as u32 + 1,
                address: address.to_string(),
            })
            .collect(),
        ..ClusterConfig::default()
    };
    config
}

/// TLS certificates and an admin token for a local cluster, kept in
/// `<folder>/security`: the CA (`ca.pem`), each server's certificate and
/// key, a client certificate, the token file (`tokens.toml`) and the admin
/// token itself (`admin.token`, readable by its owner only, so a client on
/// this machine can use it). Made once; a folder that has them keeps them.
#[derive(Clone, Debug)]
pub struct LocalSecurity {
    pub folder: PathBuf,
    pub ca: PathBuf,
    pub tokens: PathBuf,
    pub admin_token: String,
    /// The client certificate the CA issued.
    pub client: net::Identity,
}

impl LocalSecurity {
    /// Makes (or finds) the security material of servers 1..=`servers`
    /// under `<folder>/security`.
    pub fn make(folder: &Path, servers: usize) -> Result<LocalSecurity, LocalError> {
        let security = folder.join("security");
        let token_path = security.join("admin.token");
        let tokens = security.join("tokens.toml");
        let ids: Vec<u32> = (1..=servers as u32).collect();
        let missing = |id: &u32| !security.join(format!("server-{id}.pem")).exists();
        if !token_path.exists() || ids.iter().any(missing) {
            net::tls::make_certificates(&security, &ids, &[])?;
            let token = crate::auth::new_token();
            let rights = [
                (crate::auth::Right::Admin, "*"),
                (crate::auth::Right::Produce, "*"),
                (crate::auth::Right::Consume, "*"),
            ];
            let entry = crate::auth::token_entry_toml("admin", &token, &rights);
            write_secret(&tokens, &entry)?;
            write_secret(&token_path, &token)?;
        }
        let admin_token = std::fs::read_to_string(&token_path)
            .map_err(|source| LocalError::Security {
                path: token_path.clone(),
                source,
            })?
            .trim()
            .to_string();
        Ok(LocalSecurity {
            ca: security.join("ca.pem"),
            client: net::Identity {
                certificate: security.join("client.pem"),
                key: security.join("client-key.pem"),
            },
            folder: security,
            tokens,
            admin_token,
        })
    }

    /// Turns TLS and the token file on in a server's configuration (its
    /// certificate is the one made for `config.cluster.me`).
    pub fn apply(&self, config: &mut ServerConfig) {
        config.tls = Some(crate::config::TlsSettings {
            identity: self.server_identity(config.cluster.me),
            ca: self.ca.clone(),
            client_ca: None,
        });
        config.tokens = Some(self.tokens.clone());
    }

    /// Server `id`'s certificate and key.
    pub fn server_identity(&self, id: u32) -> net::Identity {
        net::Identity {
            certificate: self.folder.join(format!("server-{id}.pem")),
            key: self.folder.join(format!("server-{id}-key.pem")),
        }
    }

    /// A client's credentials: the admin token over TLS trusting the CA.
    pub fn admin_dialer(&self) -> Result<net::Dialer, LocalError> {
        Ok(net::Dialer::tls(&self.ca, None)?)
    }
}

/// Writes a file readable by its owner only.
fn write_secret(path: &Path, text: &str) -> Result<(), LocalError> {
    Ok(net::tls::write_file(path, text.as_bytes(), true)?)
}

pub struct LocalCluster {
    /// The running servers, by id.
    pub servers: Vec<LocalServer>,
    addresses: Vec<SocketAddr>,
    /// Each server's configuration, to start it again.
    configs: Vec<ServerConfig>,
}

impl LocalCluster {
    /// Starts `count` servers with ids 1..=count, data in
    /// `<folder>/server-<id>`, each configured by `configure` after the
    /// defaults and the cluster settings are filled in.
    pub async fn start(
        count: usize,
        folder: &Path,
        configure: impl Fn(&mut ServerConfig),
    ) -> Result<LocalCluster, LocalError> {
        let mut listeners = Vec::with_capacity(count);
        for _ in 0..count {
            listeners.push(bind_loopback().await?);
        }
        let addresses: Vec<SocketAddr> = listeners
            .iter()
            .map(|l| l.local_addr().expect("bound listener"))
            .collect();
        let mut servers = Vec::with_capacity(count);
        let mut configs = Vec::with_capacity(count);
        for (index, listener) in listeners.into_iter().enumerate() {
            let id = index as u32 + 1;
            let mut config = config_for(folder, id, &addresses);
            configure(&mut config);
            configs.push(config.clone());
            servers.push(LocalServer::run(id, listener, config)?);
        }
        for server in &servers {
            server.joined().await?;
        }
        Ok(LocalCluster {
            servers,
            addresses,
            configs,
        })
    }

    /// The address of server `id`.
    pub fn address(&self, id: u32) -> SocketAddr {
        self.addresses[id as usize - 1]
    }

    /// Stops server `id` (its process, as far as the cluster can tell:
    /// its heartbeats end and its links close).
    pub async fn stop_server(&mut self, id: u32) {
        if let Some(position) = self.servers.iter().position(|s| s.id == id) {
            self.servers.remove(position).stop().await;
        }
    }

    /// Starts server `id` again on its address and data, as a new
    /// process; returns once it has joined.
    pub async fn start_server(&mut self, id: u32) -> Result<(), LocalError> {
        let address = self.address(id);
        let listener = TcpListener::bind(address)
            .await
            .map_err(|source| LocalError::Listen {
                what: format!("binding {address} again"),
                source,
            })?;
        let server = LocalServer::run(id, listener, self.configs[id as usize - 1].clone())?;
        server.joined().await?;
        self.servers.push(server);
        self.servers.sort_by_key(|s| s.id);
        Ok(())
    }

    /// Starts one more server, with the next id, that no other server is
    /// configured with: its peers are the servers so far, which it
    /// contacts to join (as `stamplog server --peer` does for a server
    /// added to a running cluster). Returns its id once it has joined.
    pub async fn add_server(
        &mut self,
        folder: &Path,
        configure: impl Fn(&mut ServerConfig),
    ) -> Result<u32, LocalError> {
        let listener = bind_loopback().await?;
        let address = listener.local_addr().expect("bound listener");
        let id = self.addresses.len() as u32 + 1;
        let mut config = config_for(folder, id, &self.addresses);
        configure(&mut config);
        self.addresses.push(address);
        self.configs.push(config.clone());
        let server = LocalServer::run(id, listener, config)?;
        server.joined().await?;
        self.servers.push(server);
        Ok(id)
    }

    /// Stops every server.
    pub async fn stop(self) {
        for server in self.servers {
            server.stop().await;
        }
    }
}
