//! The server's streams: recovered at start, created and deleted by
//! clients, looked up by name and by id.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Instant;

use proto::{DurabilityConfig, StreamInfo};
use tokio::sync::Semaphore;

use crate::config::ServerConfig;
use crate::stream::{stream_name_error, Stream, StreamMeta, META_FILE};

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
}

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

pub struct ServerState {
    pub config: ServerConfig,
    /// This server process's identity, new at every start.
    pub id: u128,
    pub started: Instant,
    streams: RwLock<Registry>,
    /// Bounds the connections served at once (`connections_max`).
    pub connection_slots: Arc<Semaphore>,
}

impl ServerState {
    /// Opens the data folder and recovers every stream in it.
    pub fn open(config: ServerConfig) -> Result<Arc<ServerState>, OpenError> {
        let storage = config.storage.clone();
        let streams_folder = config.data_dir.join("streams");
        let data_error = |source| OpenError::DataDir {
            path: streams_folder.clone(),
            source,
        };
        storage
            .create_dir_all(&streams_folder)
            .map_err(data_error)?;
        let mut registry = Registry::default();
        let mut names = storage.list(&streams_folder).map_err(data_error)?;
        names.sort();
        for name in names {
            let folder = streams_folder.join(&name);
            let meta_path = folder.join(META_FILE);
            if !storage.exists(&meta_path) {
                // A stream whose creation never finished: its meta file is
                // written last, so nothing was ever acknowledged in it.
                continue;
            }
            let stream_error = |reason: String| OpenError::Stream {
                path: folder.clone(),
                reason,
            };
            let bytes = wal::storage::read_all(storage.as_ref(), &meta_path)
                .map_err(|e| stream_error(e.to_string()))?;
            let meta: StreamMeta = serde_json::from_slice(&bytes)
                .map_err(|e| stream_error(format!("bad {META_FILE}: {e}")))?;
            if meta.format != 1 || meta.name != name {
                return Err(stream_error(format!(
                    "{META_FILE} has format {} and name {:?}; expected format 1 and the folder's name {name:?}",
                    meta.format, meta.name
                )));
            }
            if meta.durability != "memory" && !storage.exists(&folder.join("log")) {
                return Err(stream_error("its log folder is missing".into()));
            }
            let stream = Arc::new(Stream::open(&meta, &folder, &config).map_err(stream_error)?);
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
            id: proto::random_u128(),
            started: Instant::now(),
            connection_slots: Arc::new(Semaphore::new(config.connections_max)),
            config,
            streams: RwLock::new(registry),
        }))
    }

    pub fn stream_by_id(&self, id: u64) -> Option<Arc<Stream>> {
        self.streams
            .read()
            .expect("registry lock poisoned")
            .by_id
            .get(&id)
            .cloned()
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

    /// Creates a stream; blocking disk work, call from `spawn_blocking`.
    pub fn create_stream(
        &self,
        name: &str,
        durability: DurabilityConfig,
    ) -> Result<StreamInfo, StreamError> {
        use proto::ErrorCode;
        if let Some(problem) = stream_name_error(name) {
            return Err(StreamError::new(ErrorCode::InvalidArgument, problem));
        }
        let id = {
            let mut registry = self.streams.write().expect("registry lock poisoned");
            if registry.by_name.contains_key(name) || registry.busy_names.contains(name) {
                return Err(StreamError::new(
                    ErrorCode::StreamExists,
                    format!("stream {name:?} already exists (or is being created or deleted)"),
                ));
            }
            registry.busy_names.insert(name.to_string());
            loop {
                let candidate = proto::random_u128() as u64;
                if candidate != 0 && !registry.by_id.contains_key(&candidate) {
                    break candidate;
                }
            }
        };
        // The disk work runs without the registry lock, so appends to other
        // streams go on; the busy name keeps a create or delete of the same
        // name out of the folder meanwhile.
        let created = self.create_files(id, name, durability);
        let mut registry = self.streams.write().expect("registry lock poisoned");
        registry.busy_names.remove(name);
        let stream = Arc::new(created?);
        registry.by_id.insert(id, Arc::clone(&stream));
        registry
            .by_name
            .insert(name.to_string(), Arc::clone(&stream));
        Ok(stream.info())
    }

    fn create_files(
        &self,
        id: u64,
        name: &str,
        durability: DurabilityConfig,
    ) -> Result<Stream, StreamError> {
        use proto::ErrorCode;
        let meta = StreamMeta::new(id, name, durability);
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
            // A folder without a meta file (the registry has no such
            // stream) is what an interrupted create or delete leaves; none
            // of it was ever acknowledged, so it goes.
            storage.remove_dir_all(&folder).map_err(internal)?;
        }
        storage.create_dir_all(&folder).map_err(internal)?;
        // The new folder's entry, then its `log/` entry, are made durable
        // before anything in them is acknowledged.
        storage.sync_dir(&streams_folder).map_err(internal)?;
        let stream = Stream::open(&meta, &folder, &self.config).map_err(|reason| {
            let _ = storage.remove_dir_all(&folder);
            StreamError::new(ErrorCode::InvalidArgument, reason)
        })?;
        storage.sync_dir(&folder).map_err(internal)?;
        // The meta file is written last and atomically: a crash before it
        // leaves a folder that recovery skips, never a half-made stream.
        let bytes = serde_json::to_vec_pretty(&meta).expect("meta serialises");
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
        storage.remove_dir_all(&stream.folder).map_err(internal)?;
        let parent = stream
            .folder
            .parent()
            .expect("stream folders have a parent")
            .to_path_buf();
        storage.sync_dir(&parent).map_err(internal)?;
        Ok(())
    }

    /// The JSON status document: the server and every stream's counters.
    pub fn status_json(&self) -> serde_json::Value {
        let streams: Vec<serde_json::Value> = self
            .streams()
            .iter()
            .map(|stream| {
                let info = stream.info();
                let metrics = stream.log.metrics();
                let mean_batch = if metrics.syncs == 0 {
                    0.0
                } else {
                    metrics.records_synced as f64 / metrics.syncs as f64
                };
                serde_json::json!({
                    "name": info.name,
                    "id": info.id,
                    "durability": durability_name(info.durability),
                    "first_version": info.first_version,
                    "last_version": info.last_version,
                    "committed_version": info.committed_version,
                    "failed": stream.log.failure().map(|f| f.to_string()),
                    "dedupe_entries": stream.dedupe_entries(),
                    "log": {
                        "appends": metrics.appends,
                        "syncs": metrics.syncs,
                        "records_synced": metrics.records_synced,
                        "mean_batch_records": mean_batch,
                        "bytes_written": metrics.bytes_written,
                        "buffer_full_waits": metrics.buffer_full_waits,
                    },
                })
            })
            .collect();
        serde_json::json!({
            "server_id": format!("{:032x}", self.id),
            "uptime_seconds": self.started.elapsed().as_secs_f64(),
            "connections": self.config.connections_max - self.connection_slots.available_permits(),
            "streams": streams,
        })
    }
}

pub fn durability_name(durability: DurabilityConfig) -> String {
    match durability {
        DurabilityConfig::Memory => "memory".into(),
        DurabilityConfig::Sync => "sync".into(),
        DurabilityConfig::Paged { pages, page_size } => format!("paged({pages}x{page_size})"),
    }
}
