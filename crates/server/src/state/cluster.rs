//! Cluster-wide operations a client asks any server for: placing and
//! creating a replicated stream (through the control plane when there is
//! one, on every replica), deleting it, setting its requirement, and
//! retiring a server.

use super::*;
use crate::error::PlaceError;

impl ServerState {
    /// Chooses a stream's replica set: `replicas` consecutive servers of
    /// the sorted id list, starting at a position given by the name's hash,
    /// so streams spread over the cluster; the first is the primary.
    pub fn place(&self, name: &str, replicas: usize) -> Result<Placement, PlaceError> {
        let ids = self.config.cluster.server_ids();
        let count = if replicas == 0 {
            DEFAULT_REPLICAS.min(ids.len())
        } else {
            replicas
        };
        if count > ids.len() {
            return Err(PlaceError {
                wanted: count,
                servers: ids.len(),
            });
        }
        let start = (name_hash(name.as_bytes()) % ids.len() as u64) as usize;
        let chosen: Vec<ServerId> = (0..count).map(|i| ids[(start + i) % ids.len()]).collect();
        Ok(Placement {
            primary: chosen[0],
            replicas: chosen,
            epoch: 1,
        })
    }

    /// Creates a stream on every server of its replica set: this one on
    /// disk, the others through a `CreateReplica` request.
    pub async fn create_replicated(
        self: &Arc<Self>,
        name: &str,
        durability: DurabilityConfig,
        protocol: Protocol,
        replicas: usize,
        (commit_interval_ms, retention): (u32, proto::RetentionConfig),
    ) -> Result<StreamInfo, StreamError> {
        use proto::ErrorCode;
        if let Some(problem) = stream_name_error(name) {
            return Err(StreamError::new(ErrorCode::InvalidArgument, problem));
        }
        if commit_interval_ms > control::state::COMMIT_INTERVAL_MS_MAX {
            return Err(StreamError::new(
                ErrorCode::InvalidArgument,
                control::state::commit_interval_error(commit_interval_ms),
            ));
        }
        if let Some(problem) = sender_logging_error(durability, protocol) {
            return Err(StreamError::new(ErrorCode::InvalidArgument, problem));
        }
        if self.config.cluster.is_multi() {
            return match self.control.get() {
                Some(control) if self.is_ready() => {
                    let options = (
                        durability,
                        protocol,
                        replicas,
                        commit_interval_ms,
                        retention,
                    );
                    self.create_through_control(control, name, options).await
                }
                _ => Err(joining()),
            };
        }
        let placement = self
            .place(name, replicas)
            .map_err(|problem| StreamError::new(ErrorCode::InvalidArgument, problem.to_string()))?;
        let id = loop {
            let candidate = proto::random_u128() as u64;
            if candidate != 0 && self.stream_by_id(candidate).is_none() {
                break candidate;
            }
        };
        let mut info = self.new_stream_info(id, name, durability, protocol, &placement);
        info.commit_interval_ms = commit_interval_ms;
        for replica in &info.replicas {
            self.create_one(replica, &info, retention).await?;
        }
        Ok(info)
    }

    /// Creates the replica of `info` on `replica`: here, or on another
    /// server by its `CreateReplica` request.
    async fn create_one(
        self: &Arc<Self>,
        replica: &proto::ReplicaAddress,
        info: &StreamInfo,
        retention: proto::RetentionConfig,
    ) -> Result<(), StreamError> {
        if replica.id == self.config.cluster.me {
            let server = Arc::clone(self);
            let local = info.clone();
            tokio::task::spawn_blocking(move || server.create_replica(&local, retention))
                .await
                .expect("create_replica does not panic")?;
            return Ok(());
        }
        remote_create(
            (
                self.config.cluster.me,
                &self.router.dialer,
                &replica.address,
            ),
            info,
            retention,
            self.config.handshake_timeout,
        )
        .await
        .map_err(|problem| {
            StreamError::new(
                proto::ErrorCode::Internal,
                format!(
                    "creating the replica of {:?} on server {} at {}: {problem}",
                    info.name, replica.id, replica.address
                ),
            )
        })
    }

    /// A multi-server cluster: the control plane places the stream (an
    /// entry of its log); then each live replica creates its files, and
    /// one that cannot be reached now creates them when it sees the entry.
    pub(super) async fn create_through_control(
        self: &Arc<Self>,
        control: &control::Control,
        name: &str,
        (durability, protocol, replicas, commit_interval_ms, retention): (
            DurabilityConfig,
            Protocol,
            usize,
            u32,
            proto::RetentionConfig,
        ),
    ) -> Result<StreamInfo, StreamError> {
        use proto::ErrorCode;
        let (mode, pages, page_size) = durability.parts();
        let command = control::Command::CreateStream {
            name: name.to_string(),
            config: control::StreamConfig {
                protocol: protocol.name().to_string(),
                durability: mode.to_string(),
                pages,
                page_size,
                replicas,
                requirement: None,
                commit_interval_ms,
                retain_bytes: retention.bytes,
                retain_ms: retention.ms,
            },
        };
        let placed = match control.propose(command).await {
            Ok(control::Response::Stream(placed)) => placed,
            Ok(control::Response::Refused(why)) => {
                let code = if why.contains("exists") {
                    ErrorCode::StreamExists
                } else {
                    ErrorCode::InvalidArgument
                };
                return Err(StreamError::new(code, why));
            }
            Ok(other) => {
                return Err(StreamError::new(
                    ErrorCode::Internal,
                    format!("the control plane answered {other:?}"),
                ))
            }
            Err(error) => {
                return Err(StreamError::new(
                    ErrorCode::Internal,
                    format!("the control plane could not place {name:?}: {error}"),
                ))
            }
        };
        let state = control.state().borrow().clone();
        let placement = placed.live_view(&state).placement;
        let mut info = self.new_stream_info(placed.id, name, durability, protocol, &placement);
        info.commit_interval_ms = placed.config.commit_interval_ms;
        for replica in &info.replicas {
            if let Err(problem) = self.create_one(replica, &info, retention).await {
                tracing::warn!(
                    "{}; server {} makes it once it sees the placement and can (it tries again on its own)",
                    problem.message,
                    replica.id
                );
            }
        }
        Ok(info)
    }

    /// Deletes a stream: on a multi-server cluster through the control
    /// plane (every replica then deletes its files), else here.
    pub async fn delete_replicated(self: &Arc<Self>, name: &str) -> Result<(), StreamError> {
        use proto::ErrorCode;
        if self.config.cluster.is_multi() {
            let Some(control) = self.control.get().filter(|_| self.is_ready()) else {
                return Err(joining());
            };
            let command = control::Command::DeleteStream {
                name: name.to_string(),
            };
            return match control.propose(command).await {
                Ok(control::Response::Done) => Ok(()),
                Ok(control::Response::Refused(why)) => {
                    Err(StreamError::new(ErrorCode::UnknownStream, why))
                }
                Ok(other) => Err(StreamError::new(
                    ErrorCode::Internal,
                    format!("the control plane answered {other:?}"),
                )),
                Err(error) => Err(StreamError::new(
                    ErrorCode::Internal,
                    format!("the control plane could not delete {name:?}: {error}"),
                )),
            };
        }
        let server = Arc::clone(self);
        let name = name.to_string();
        tokio::task::spawn_blocking(move || server.delete_stream(&name))
            .await
            .expect("delete_stream does not panic")
    }

    /// Sets (or clears) a stream's requirement and loss action, through
    /// the control plane; a single server has none to keep.
    pub async fn set_requirement(
        &self,
        name: &str,
        requirement: Option<control::Requirement>,
    ) -> Result<(), StreamError> {
        use proto::ErrorCode;
        if !self.config.cluster.is_multi() {
            return Err(StreamError::new(
                ErrorCode::InvalidArgument,
                "a server without peers has no replicas to require; requirements apply to a cluster",
            ));
        }
        let Some(control) = self.control.get().filter(|_| self.is_ready()) else {
            return Err(joining());
        };
        let command = control::Command::SetRequirement {
            name: name.to_string(),
            requirement,
        };
        match control.propose(command).await {
            Ok(control::Response::Done) => Ok(()),
            Ok(control::Response::Refused(why)) => {
                let code = if why.starts_with("no stream") {
                    ErrorCode::UnknownStream
                } else {
                    ErrorCode::InvalidArgument
                };
                Err(StreamError::new(code, why))
            }
            Ok(other) => Err(StreamError::new(
                ErrorCode::Internal,
                format!("the control plane answered {other:?}"),
            )),
            Err(error) => Err(StreamError::new(
                ErrorCode::Internal,
                format!("the control plane could not set the requirement: {error}"),
            )),
        }
    }

    /// Takes a server that has left the view for good out of the control
    /// plane's voters.
    pub async fn retire_server(&self, server: ServerId) -> Result<(), StreamError> {
        use proto::ErrorCode;
        let Some(control) = self.control.get().filter(|_| self.is_ready()) else {
            return Err(if self.config.cluster.is_multi() {
                joining()
            } else {
                StreamError::new(
                    ErrorCode::InvalidArgument,
                    "a server without peers has no control plane",
                )
            });
        };
        if server == self.config.cluster.me {
            return Err(StreamError::new(
                ErrorCode::InvalidArgument,
                format!("server {server} is this one; ask another server to retire it"),
            ));
        }
        match control.remove_voter(server).await {
            Ok(()) => Ok(()),
            Err(error @ control::ControlError::Refused { .. }) => Err(StreamError::new(
                ErrorCode::InvalidArgument,
                error.to_string(),
            )),
            Err(error) => Err(StreamError::new(ErrorCode::Internal, error.to_string())),
        }
    }
}
