//! The server's streams: recovered at start, created and deleted by
//! clients, looked up by name and by id.

mod cluster;
mod status;

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Instant;

use engine::replication::{Placement, Protocol, ServerId};
use proto::{DurabilityConfig, Frame, ReplicaAddress, StreamInfo};
use tokio::io::AsyncWriteExt;
use tokio::sync::{watch, Semaphore};

use crate::auth::Tokens;
use crate::config::ServerConfig;
use crate::error::{OpenError, RemoteCreateError};
use crate::replication::Router;
use crate::stream::{stream_name_error, Stream, StreamMeta, META_FILE};

/// Replicas of a stream when the creator does not say.
pub const DEFAULT_REPLICAS: usize = 3;

/// Why a stream operation failed, with the protocol's error code.
#[derive(Debug)]
pub struct StreamError {
    pub code: proto::ErrorCode,
    pub message: String,
}

impl StreamError {
    fn new(code: proto::ErrorCode, message: impl Into<String>) -> Self {
        StreamError {
            code,
            message: message.into(),
        }
    }
}

#[derive(Default)]
struct Registry {
    by_name: HashMap<String, Arc<Stream>>,
    by_id: HashMap<u64, Arc<Stream>>,
    /// Names whose folder a create or delete is working on.
    busy_names: HashSet<String>,
}

/// How long a delete waits for the stream's log to write what it holds.
const STREAM_DRAIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// Where copies of streams that could not be opened are kept, in the
/// data folder.
pub const DAMAGED_FOLDER: &str = "damaged";

pub struct ServerState {
    pub config: ServerConfig,
    /// This server process's identity, new at every start.
    pub id: u128,
    pub started: Instant,
    streams: RwLock<Registry>,
    /// Bounds the connections served at once (`connections_max`).
    pub connection_slots: Arc<Semaphore>,
    /// Connections served now per client IP address
    /// (`connections_per_address_max`).
    pub(crate) per_address: Mutex<HashMap<IpAddr, usize>>,
    /// The newest link each peer opened to this server, with what ends it
    /// when a newer one comes (`connection::peer::NewestPeerLink`).
    pub(crate) peer_links: Mutex<HashMap<ServerId, Arc<tokio::sync::Notify>>>,
    /// The server's side of TLS, when it has TLS.
    pub(crate) acceptor: Option<net::Acceptor>,
    /// The token file, when the server has one.
    pub tokens: Option<Arc<Tokens>>,
    /// Hellos refused for a wrong, revoked or missing token.
    pub logins_refused: AtomicU64,
    /// Connections refused by TLS: a failed TLS handshake, or a hello
    /// speaking for a server without that server's certificate.
    pub tls_refused: AtomicU64,
    /// Requests refused for a missing right.
    pub requests_unauthorized: AtomicU64,
    /// Replicated writes refused with `Busy` for their connection's
    /// writes or bytes in flight.
    pub writes_busy: AtomicU64,
    /// The data path's instruments, when the server has an admin port
    /// (`observe`).
    pub metrics: Option<Arc<crate::metrics::Metrics>>,
    /// Carries replication messages to peers and clients.
    pub router: Arc<Router>,
    /// The address this server serves on (set when it starts serving).
    address: RwLock<String>,
    /// Fires when the server shuts down; background tasks watch it.
    pub(crate) stop: watch::Sender<bool>,
    /// The control plane (a cluster of more than one server).
    pub(crate) control: OnceLock<control::Control>,
    /// Streams found on disk that wait for this server to join the view
    /// (a multi-server cluster opens them only then, placed as the
    /// control plane says).
    pub(crate) pending: Mutex<Vec<(StreamMeta, PathBuf)>>,
    /// True once this server has joined and opened its streams.
    pub(crate) ready: watch::Sender<bool>,
    /// Set when the cluster has removed this server's incarnation from
    /// the view (it was suspected while paused, cut off or slow): the
    /// server stops serving, and `run_rejoining` opens it again as a new
    /// member.
    pub(crate) removed: watch::Sender<bool>,
}

impl ServerState {
    /// Opens the data folder and recovers every stream in it.
    pub fn open(mut config: ServerConfig) -> Result<Arc<ServerState>, OpenError> {
        crate::files::raise_and_log();
        let metrics = crate::metrics::Metrics::for_config(&mut config);
        let (acceptor, dialer, tokens) = security_of(&config)?;
        let router = Arc::new(Router::new(&config.cluster, config.peer_queue_max, dialer));
        let storage = config.storage.clone();
        check_and_open_journal(&mut config)?;
        let streams_folder = config.data_dir.join("streams");
        let data_error = |source| OpenError::DataDir {
            path: streams_folder.clone(),
            source,
        };
        storage
            .create_dir_all(&streams_folder)
            .map_err(data_error)?;
        let mut registry = Registry::default();
        let mut pending = Vec::new();
        let mut names = storage.list(&streams_folder).map_err(data_error)?;
        names.sort();
        for name in names {
            let folder = streams_folder.join(&name);
            let stream_error = |reason: String| OpenError::Stream {
                path: folder.clone(),
                reason,
            };
            let Some(meta) = read_meta(storage.as_ref(), &folder, &name)? else {
                continue;
            };
            if config.cluster.is_multi() {
                pending.push((meta, folder));
                continue;
            }
            let stream = Arc::new(
                Stream::open(&meta, &folder, &config, Arc::clone(&router), None)
                    .map_err(|e| stream_error(e.to_string()))?,
            );
            stream.recover_senders();
            if registry.by_id.contains_key(&stream.id) {
                return Err(stream_error(format!(
                    "stream id {} is used twice",
                    stream.id
                )));
            }
            registry.by_id.insert(stream.id, Arc::clone(&stream));
            registry.by_name.insert(stream.name.clone(), stream);
        }
        Ok(Arc::new(ServerState {
            metrics,
            per_address: Mutex::default(),
            acceptor,
            tokens,
            logins_refused: AtomicU64::new(0),
            tls_refused: AtomicU64::new(0),
            requests_unauthorized: AtomicU64::new(0),
            writes_busy: AtomicU64::new(0),
            control: OnceLock::new(),
            pending: Mutex::new(pending),
            ready: watch::channel(!config.cluster.is_multi()).0,
            removed: watch::channel(false).0,
            id: proto::random_u128(),
            started: Instant::now(),
            connection_slots: Arc::new(Semaphore::new(config.connections_max)),
            peer_links: Mutex::default(),
            config,
            streams: RwLock::new(registry),
            router,
            address: RwLock::new(String::new()),
            stop: watch::channel(false).0,
        }))
    }

    /// The address clients reach this server on.
    pub fn address(&self) -> String {
        self.address.read().expect("address lock").clone()
    }

    pub(crate) fn set_address(&self, address: String) {
        *self.address.write().expect("address lock") = address;
    }

    /// Waits until this server has joined the cluster and opened its
    /// streams (at once for a single server).
    pub async fn wait_ready(&self) {
        let mut ready = self.ready.subscribe();
        let _ = ready.wait_for(|ready| *ready).await;
    }

    pub fn is_ready(&self) -> bool {
        *self.ready.borrow()
    }

    /// Whether a stream this server does not hold is about to be opened
    /// or created here: it is joining, or the control plane places it here.
    pub fn expects_stream(&self, id: u64) -> bool {
        if !self.is_ready() {
            return true;
        }
        if self
            .pending
            .lock()
            .expect("pending lock")
            .iter()
            .any(|(meta, _)| meta.id == id)
        {
            return true;
        }
        let me = self.config.cluster.me;
        self.control_state().is_some_and(|state| {
            state
                .streams
                .values()
                .any(|placed| placed.id == id && placed.replicas.contains(&me))
        })
    }

    /// The control plane, when this server runs one (a multi-server
    /// cluster, once started).
    pub fn control(&self) -> Option<&control::Control> {
        self.control.get()
    }

    /// The control plane's applied state, when there is a control plane.
    pub fn control_state(&self) -> Option<Arc<control::ControlState>> {
        self.control.get().map(|c| Arc::clone(&c.state().borrow()))
    }

    /// The client address of a server of the cluster.
    pub(crate) fn address_of(&self, id: ServerId) -> String {
        if id == self.config.cluster.me {
            return self.address();
        }
        if let Some(member) = self
            .control_state()
            .and_then(|state| state.members.get(&id).cloned())
        {
            return member.address;
        }
        self.config
            .cluster
            .peers
            .iter()
            .find(|peer| peer.id == id)
            .map_or_else(String::new, |peer| peer.address.clone())
    }

    /// The replica set as clients reach it.
    fn addresses(&self, placement: &Placement) -> Vec<ReplicaAddress> {
        placement
            .replicas
            .iter()
            .map(|&id| ReplicaAddress {
                id,
                address: self.address_of(id),
            })
            .collect()
    }

    /// How clients see a stream: its state here and its placement.
    pub fn stream_info(&self, stream: &Stream) -> StreamInfo {
        let placement = stream.placement();
        StreamInfo {
            id: stream.id,
            name: stream.name.clone(),
            durability: stream.durability,
            first_version: stream.log.first_version(),
            last_version: stream.log.last_version(),
            committed_version: stream.visible_version(),
            protocol: stream.protocol.code(),
            epoch: placement.epoch,
            primary: placement.primary,
            replicas: self.addresses(&placement),
            commit_interval_ms: stream.commit_interval_ms(),
        }
    }

    /// Creates this server's replica of a stream described by `info`;
    /// blocking disk work, call from `spawn_blocking`.
    pub fn create_replica(
        self: &Arc<Self>,
        info: &StreamInfo,
        retention: proto::RetentionConfig,
    ) -> Result<StreamInfo, StreamError> {
        use proto::ErrorCode;
        let invalid = |problem: String| StreamError::new(ErrorCode::InvalidArgument, problem);
        let protocol = Protocol::from_code(info.protocol)
            .ok_or_else(|| invalid(format!("unknown protocol code {}", info.protocol)))?;
        // The same stream may be in creation here already (a multi-server
        // cluster creates a replica both on request and when this server
        // sees the placement): wait for it.
        let deadline = Instant::now() + std::time::Duration::from_secs(10);
        loop {
            if let Some(existing) = self.stream_by_name(&info.name) {
                if existing.id == info.id {
                    return Ok(self.stream_info(&existing));
                }
                break;
            }
            let busy = self
                .streams
                .read()
                .expect("registry lock poisoned")
                .busy_names
                .contains(&info.name);
            if !busy || Instant::now() > deadline {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        let placement = Placement {
            replicas: info.replicas.iter().map(|r| r.id).collect(),
            primary: info.primary,
            epoch: info.epoch,
        };
        if !placement.replicas.contains(&self.config.cluster.me) {
            return Err(invalid(format!(
                "server {} is not in the replica set {:?}",
                self.config.cluster.me, placement.replicas
            )));
        }
        if !placement.replicas.contains(&placement.primary) {
            return Err(invalid("the primary is not in the replica set".into()));
        }
        if info.commit_interval_ms > control::state::COMMIT_INTERVAL_MS_MAX {
            return Err(invalid(control::state::commit_interval_error(
                info.commit_interval_ms,
            )));
        }
        let stream = self.create_stream_with(info, protocol, &placement, retention)?;
        Ok(self.stream_info(&stream))
    }

    /// Registers a stream opened from disk and starts its tasks.
    pub(crate) fn insert_opened(&self, stream: Arc<Stream>) {
        let mut registry = self.streams.write().expect("registry lock poisoned");
        registry.by_id.insert(stream.id, Arc::clone(&stream));
        registry
            .by_name
            .insert(stream.name.clone(), Arc::clone(&stream));
        drop(registry);
        stream.start_tasks(
            self.config.tick_interval,
            crate::stream::CheckpointSchedule::of(&self.config),
            self.stop.subscribe(),
        );
    }

    /// A stream with nothing logged yet, as clients see it.
    fn new_stream_info(
        &self,
        id: u64,
        name: &str,
        durability: DurabilityConfig,
        protocol: Protocol,
        placement: &Placement,
    ) -> StreamInfo {
        StreamInfo {
            id,
            name: name.to_string(),
            durability,
            first_version: 1,
            last_version: 0,
            committed_version: 0,
            protocol: protocol.code(),
            epoch: placement.epoch,
            primary: placement.primary,
            replicas: self.addresses(placement),
            commit_interval_ms: 0,
        }
    }

    /// A placed stream as clients see it (before this server holds it).
    pub(crate) fn info_for(
        &self,
        placed: &control::StreamPlacement,
        placement: &Placement,
    ) -> StreamInfo {
        let durability = StreamMeta {
            format: 1,
            id: placed.id,
            name: placed.name.clone(),
            durability: placed.config.durability.clone(),
            pages: placed.config.pages,
            page_size: placed.config.page_size,
            protocol: placed.config.protocol.clone(),
            replicas: Vec::new(),
            primary: 0,
            epoch: placed.epoch,
            retain_bytes: None,
            retain_ms: None,
            commit_interval_ms: placed.config.commit_interval_ms,
        }
        .durability()
        .unwrap_or(DurabilityConfig::Sync);
        let protocol = placed
            .config
            .protocol
            .parse::<Protocol>()
            .unwrap_or(Protocol::OneHopAckClient);
        let mut info =
            self.new_stream_info(placed.id, &placed.name, durability, protocol, placement);
        info.commit_interval_ms = placed.config.commit_interval_ms;
        info
    }

    /// A stream this server holds no replica of, as the control plane
    /// places it: its live replicas, primary and epoch. Its versions are
    /// 0 (this server holds none; a replica has them).
    pub fn placed_info(&self, name: &str) -> Option<StreamInfo> {
        let state = self.control_state()?;
        let placed = state.streams.get(name)?;
        Some(self.info_for(placed, &placed.live_view(&state).placement))
    }

    pub fn stream_by_id(&self, id: u64) -> Option<Arc<Stream>> {
        self.streams
            .read()
            .expect("registry lock poisoned")
            .by_id
            .get(&id)
            .cloned()
    }

    /// What the server's journal did, when it has one.
    pub fn journal_metrics(&self) -> Option<wal::JournalMetrics> {
        self.config
            .journal
            .as_ref()
            .map(|journal| journal.metrics())
    }

    pub fn stream_by_name(&self, name: &str) -> Option<Arc<Stream>> {
        self.streams
            .read()
            .expect("registry lock poisoned")
            .by_name
            .get(name)
            .cloned()
    }

    pub fn streams(&self) -> Vec<Arc<Stream>> {
        let registry = self.streams.read().expect("registry lock poisoned");
        let mut streams: Vec<_> = registry.by_name.values().cloned().collect();
        streams.sort_by(|a, b| a.name.cmp(&b.name));
        streams
    }

    /// Creates a stream with the given id and placement on this server;
    /// blocking disk work.
    fn create_stream_with(
        self: &Arc<Self>,
        info: &StreamInfo,
        protocol: Protocol,
        placement: &Placement,
        retention: proto::RetentionConfig,
    ) -> Result<Arc<Stream>, StreamError> {
        use proto::ErrorCode;
        let (name, id) = (info.name.as_str(), info.id);
        if let Some(problem) = stream_name_error(name) {
            return Err(StreamError::new(ErrorCode::InvalidArgument, problem));
        }
        {
            let mut registry = self.streams.write().expect("registry lock poisoned");
            if registry.by_name.contains_key(name) || registry.busy_names.contains(name) {
                return Err(StreamError::new(
                    ErrorCode::StreamExists,
                    format!("stream {name:?} already exists (or is being created or deleted)"),
                ));
            }
            if registry.by_id.contains_key(&id) {
                return Err(StreamError::new(
                    ErrorCode::StreamExists,
                    format!("stream id {id} is in use"),
                ));
            }
            registry.busy_names.insert(name.to_string());
        }
        // The disk work runs without the registry lock, so appends to other
        // streams go on; the busy name keeps a create or delete of the same
        // name out of the folder meanwhile.
        let mut meta = StreamMeta::new(id, name, info.durability, protocol, placement);
        meta.commit_interval_ms = info.commit_interval_ms;
        meta.retain_bytes = (retention.bytes != 0).then_some(retention.bytes);
        meta.retain_ms = (retention.ms != 0).then_some(retention.ms);
        let created = self.create_files(&meta);
        let mut registry = self.streams.write().expect("registry lock poisoned");
        registry.busy_names.remove(name);
        let stream = Arc::new(created?);
        registry.by_id.insert(id, Arc::clone(&stream));
        registry
            .by_name
            .insert(name.to_string(), Arc::clone(&stream));
        drop(registry);
        if tokio::runtime::Handle::try_current().is_ok() {
            stream.start_tasks(
                self.config.tick_interval,
                crate::stream::CheckpointSchedule::of(&self.config),
                self.stop.subscribe(),
            );
        }
        Ok(stream)
    }

    fn create_files(&self, meta: &StreamMeta) -> Result<Stream, StreamError> {
        use proto::ErrorCode;
        let name = meta.name.as_str();
        let streams_folder = self.config.data_dir.join("streams");
        let folder = streams_folder.join(name);
        let storage = self.config.storage.as_ref();
        let internal = |e: std::io::Error| {
            StreamError::new(
                ErrorCode::Internal,
                format!("creating stream {name:?}: {e}"),
            )
        };
        if storage.exists(&folder) {
            match read_meta(storage, &folder, name) {
                // A folder without a meta file (the registry has no such
                // stream) is what an interrupted create or delete leaves,
                // and one of another id an older stream's of this name,
                // deleted since: none of it is this stream's, so it goes.
                Ok(None) => storage.remove_dir_all(&folder).map_err(internal)?,
                Ok(Some(found)) if found.id != meta.id => {
                    storage.remove_dir_all(&folder).map_err(internal)?
                }
                // This stream's own copy, which this server did not open
                // (a damaged log; or left closed when the server stopped
                // being a replica, and placed here again since): it may
                // hold what no other replica does, so it is set aside,
                // never deleted.
                _ => set_aside(storage, &self.config.data_dir, &folder, meta).map_err(internal)?,
            }
        }
        storage.create_dir_all(&folder).map_err(internal)?;
        // The new folder's entry, then its `log/` entry, are made durable
        // before anything in them is acknowledged.
        storage.sync_dir(&streams_folder).map_err(internal)?;
        let stream = Stream::open(meta, &folder, &self.config, Arc::clone(&self.router), None)
            .map_err(|reason| {
                let _ = storage.remove_dir_all(&folder);
                StreamError::new(ErrorCode::InvalidArgument, reason.to_string())
            })?;
        storage.sync_dir(&folder).map_err(internal)?;
        // The meta file is written last and atomically: a crash before it
        // leaves a folder that recovery skips, never a half-made stream.
        let bytes = serde_json::to_vec_pretty(meta).expect("meta serialises");
        wal::storage::write_atomically(storage, &folder.join(META_FILE), &bytes)
            .map_err(internal)?;
        Ok(stream)
    }

    /// Deletes a stream and its files; blocking disk work.
    pub fn delete_stream(&self, name: &str) -> Result<(), StreamError> {
        use proto::ErrorCode;
        let stream = {
            let mut registry = self.streams.write().expect("registry lock poisoned");
            let stream = registry.by_name.remove(name).ok_or_else(|| {
                StreamError::new(
                    ErrorCode::UnknownStream,
                    format!("no stream named {name:?}"),
                )
            })?;
            registry.by_id.remove(&stream.id);
            registry.busy_names.insert(name.to_string());
            stream
        };
        let deleted = self.delete_files(&stream);
        self.streams
            .write()
            .expect("registry lock poisoned")
            .busy_names
            .remove(name);
        deleted
    }

    fn delete_files(&self, stream: &Stream) -> Result<(), StreamError> {
        use proto::ErrorCode;
        // Refuse further appends and let the log write what it holds, so
        // its I/O thread touches no file once the folder is gone.
        stream.close_for_delete(STREAM_DRAIN_TIMEOUT);
        let storage = self.config.storage.as_ref();
        let name = &stream.name;
        let internal = |e: std::io::Error| {
            StreamError::new(
                ErrorCode::Internal,
                format!("deleting stream {name:?}: {e}"),
            )
        };
        // The meta file goes first, so a crash mid-delete leaves a folder
        // that recovery skips rather than a stream with missing segments.
        storage
            .remove_file(&stream.folder.join(META_FILE))
            .map_err(internal)?;
        storage.sync_dir(&stream.folder).map_err(internal)?;
        if let Some(journal) = &self.config.journal {
            // No frame of the journal may write old bytes into the files
            // of a stream created again under this name.
            journal.rotate().map_err(|e| {
                StreamError::new(
                    ErrorCode::Internal,
                    format!("deleting stream {name:?}: {e}"),
                )
            })?;
        }
        storage.remove_dir_all(&stream.folder).map_err(internal)?;
        let parent = stream
            .folder
            .parent()
            .expect("stream folders have a parent")
            .to_path_buf();
        storage.sync_dir(&parent).map_err(internal)?;
        Ok(())
    }
}

/// Refuses a bad cluster configuration, then opens the server's journal
/// when it has one, redoing what it holds into the streams' files before
/// any of them opens.
fn check_and_open_journal(config: &mut ServerConfig) -> Result<(), OpenError> {
    if let Some(problem) = config.cluster.problem() {
        return Err(OpenError::Cluster(problem));
    }
    if config.journal_bytes_max == 0 {
        return Ok(());
    }
    let journal_config = wal::JournalConfig {
        bytes_max: config.journal_bytes_max,
        few_logs: config.journal_few_logs,
    };
    let root = &config.data_dir;
    let folder = config.journal_dir.as_deref().unwrap_or(root);
    let (journal, redo) =
        wal::Journal::open_in(config.storage.clone(), root, folder, journal_config)
            .map_err(OpenError::Journal)?;
    if redo.frames > 0 || redo.skipped > 0 {
        tracing::info!(
            frames = redo.frames,
            bytes = redo.bytes,
            files = redo.files,
            skipped = redo.skipped,
            "redid the journal into the streams' files"
        );
    }
    config.journal = Some(Arc::new(journal));
    Ok(())
}

impl ServerState {
    /// Copies set aside in `<data>/damaged/` (see [`set_aside`]); 0 when
    /// the folder cannot be listed (none was ever set aside).
    pub(crate) fn damaged_copies(&self) -> usize {
        let folder = self.config.data_dir.join(DAMAGED_FOLDER);
        let names = self.config.storage.list(&folder);
        names.map_or(0, |names| names.len())
    }
}

/// Moves a copy of stream `meta` that could not be opened out of the
/// streams' folder, to `<data>/damaged/<name>-<id>-<unix seconds>`, for
/// the operator to look at; a fresh replica then takes its place.
fn set_aside(
    storage: &dyn wal::Storage,
    data_dir: &std::path::Path,
    folder: &std::path::Path,
    meta: &StreamMeta,
) -> std::io::Result<()> {
    let damaged = data_dir.join(DAMAGED_FOLDER);
    storage.create_dir_all(&damaged)?;
    let seconds = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_secs());
    let stem = format!("{}-{}-{seconds}", meta.name, meta.id);
    let target = (0..)
        .map(|n| match n {
            0 => damaged.join(&stem),
            n => damaged.join(format!("{stem}.{n}")),
        })
        .find(|path| !storage.exists(path))
        .expect("a free name");
    storage.rename(folder, &target)?;
    storage.sync_dir(&damaged)?;
    storage.sync_dir(folder.parent().expect("stream folders have a parent"))?;
    tracing::warn!(
        "stream {:?}: the copy this server did not open (a damaged log, or one left from \
         before it was a replica again) is kept in {}; a new replica catches up from its peers",
        meta.name,
        target.display()
    );
    Ok(())
}

/// The meta file of the stream folder `folder` named `name`, checked;
/// `None` for a stream whose creation never finished (its meta file is
/// written last, so nothing was ever acknowledged in it).
fn read_meta(
    storage: &dyn wal::Storage,
    folder: &std::path::Path,
    name: &str,
) -> Result<Option<StreamMeta>, OpenError> {
    let problem = |reason: String| OpenError::Stream {
        path: folder.to_path_buf(),
        reason,
    };
    let meta_path = folder.join(META_FILE);
    if !storage.exists(&meta_path) {
        return Ok(None);
    }
    let bytes = wal::storage::read_all(storage, &meta_path).map_err(|e| problem(e.to_string()))?;
    let meta: StreamMeta =
        serde_json::from_slice(&bytes).map_err(|e| problem(format!("bad {META_FILE}: {e}")))?;
    if meta.format != 1 || meta.name != name {
        return Err(problem(format!(
            "{META_FILE} has format {} and name {:?}; expected format 1 and the folder's name {name:?}",
            meta.format, meta.name
        )));
    }
    if meta.durability != "memory" && !storage.exists(&folder.join("log")) {
        return Err(problem("its log folder is missing".into()));
    }
    Ok(Some(meta))
}

/// A multi-server cluster's server that has not joined yet.
fn joining() -> StreamError {
    StreamError::new(
        proto::ErrorCode::Busy,
        "this server is joining the cluster; retry in a moment",
    )
}

/// Why a stream cannot use this durability with this protocol, if it
/// cannot. Sender-based logging has one receiver, the primary, which
/// stamps each message and forwards it: only the forward-flow protocols
/// fit. In the others the client carries the message to every replica
/// itself (each would be a receiver with its own copy to confirm), and a
/// `hybrid` stream moves into such a flow (client-async) by itself.
pub fn sender_logging_error(durability: DurabilityConfig, protocol: Protocol) -> Option<String> {
    use engine::replication::{Flow, HybridMode};
    let forward =
        protocol != Protocol::Hybrid && protocol.flow(HybridMode::ServerSync) == Flow::Forward;
    (matches!(durability, DurabilityConfig::Sender { .. }) && !forward).then(|| {
        format!(
            "durability sender needs a protocol where the primary forwards each message (one-hop, one-hop-ack-client, server-async, server-sync); {protocol} sends from the client to every replica"
        )
    })
}

pub fn durability_name(durability: DurabilityConfig) -> String {
    match durability {
        DurabilityConfig::Memory => "memory".into(),
        DurabilityConfig::Sync => "sync".into(),
        DurabilityConfig::Paged { pages, page_size } => format!("paged({pages}x{page_size})"),
        DurabilityConfig::Sender { pages, page_size } => format!("sender({pages}x{page_size})"),
    }
}

/// The server's side of TLS, how it dials the others, and its token file.
type Security = (Option<net::Acceptor>, net::Dialer, Option<Arc<Tokens>>);

/// The server's [`Security`], as its configuration says.
fn security_of(config: &ServerConfig) -> Result<Security, OpenError> {
    let (acceptor, dialer) = match &config.tls {
        Some(tls) => (Some(tls.acceptor()?), tls.dialer()?),
        None => (None, net::Dialer::plain()),
    };
    let tokens = match &config.tokens {
        Some(path) => Some(Arc::new(Tokens::open(path)?)),
        None => None,
    };
    Ok((acceptor, dialer, tokens))
}

/// FNV-1a of the stream name: a stable spread of streams over servers.
fn name_hash(bytes: &[u8]) -> u64 {
    let mut hash = 0xcbf2_9ce4_8422_2325u64;
    for &byte in bytes {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

/// Asks another server to create its replica of a stream.
async fn remote_create(
    (me, dialer, address): (ServerId, &net::Dialer, &str),
    info: &StreamInfo,
    retention: proto::RetentionConfig,
    timeout: std::time::Duration,
) -> Result<(), RemoteCreateError> {
    let work = async {
        let mut socket = dialer.connect(address).await?;
        let mut out = Vec::new();
        Frame::ServerHello {
            version: proto::PROTOCOL_VERSION,
            from: me,
            client: proto::random_u128(),
        }
        .encode(&mut out);
        Frame::CreateReplica {
            request: 1,
            info: info.clone(),
            retention,
        }
        .encode(&mut out);
        socket.write_all(&out).await?;
        let mut buffer = proto::FrameBuffer::new();
        loop {
            match buffer.next_frame(64 * 1024 * 1024) {
                Ok(Some(Frame::HelloOk { .. })) => continue,
                Ok(Some(Frame::StreamInfo { .. })) => return Ok(()),
                Ok(Some(Frame::Error { code, message, .. })) => {
                    return Err(RemoteCreateError::Refused { code, message })
                }
                Ok(Some(other)) => return Err(RemoteCreateError::Unexpected(format!("{other:?}"))),
                Ok(None) => {}
                Err(error) => return Err(error.into()),
            }
            let count = net::read_into(&mut socket, buffer.receiving(), 64 * 1024).await?;
            if count == 0 {
                return Err(RemoteCreateError::Closed);
            }
        }
    };
    tokio::time::timeout(timeout, work)
        .await
        .map_err(|_| RemoteCreateError::Timeout(timeout))?
}
