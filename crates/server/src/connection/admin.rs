//! A connection's administrative requests: creating, deleting and
//! opening streams, their requirements, retiring servers, listing and
//! status. Each answers with one frame.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use engine::replication::Protocol;
use proto::{DurabilityConfig, ErrorCode, Frame, RetentionConfig, StreamInfo};

use super::Connection;
use crate::auth::{Right, Unauthorized};
use crate::state::StreamError;

impl Connection {
    /// An administrative request.
    pub(super) async fn handle_admin(&mut self, frame: Frame) -> bool {
        if let Err((request, refused)) = self.admit_admin(&frame) {
            self.server
                .requests_unauthorized
                .fetch_add(1, Ordering::Relaxed);
            return self.unauthorized(request, refused).await;
        }
        match frame {
            Frame::CreateStream {
                request,
                name,
                durability,
                protocol,
                replicas,
                commit_interval_ms,
                retention,
            } => {
                let options = (commit_interval_ms, retention);
                self.create_stream(request, name, durability, protocol, replicas, options)
                    .await
            }
            Frame::CreateReplica {
                request,
                info,
                retention,
            } => self.create_replica(request, info, retention).await,
            Frame::DeleteStream { request, name } => self.delete_stream(request, name).await,
            Frame::SetRequirement {
                request,
                name,
                min_in_sync,
                action,
                block_ms,
                roles,
            } => {
                self.set_requirement(request, name, (min_in_sync, action, block_ms), roles)
                    .await
            }
            Frame::RetireServer { request, server } => self.retire_server(request, server).await,
            Frame::OpenStream { request, name } => self.open_stream(request, name).await,
            Frame::ListStreams { request } => self.list_streams(request).await,
            Frame::Status { request } => self.status(request).await,
            other => self.not_a_request(&other).await,
        }
    }

    /// Whether the connection may make an administrative request: `admin`
    /// on the stream for creating, deleting and requirements, on every
    /// stream (`*`) for retiring a server, any right on it for opening
    /// it; `CreateReplica` only from another server. `Err`: the request's
    /// number and why not.
    fn admit_admin(&mut self, frame: &Frame) -> Result<(), (u64, Unauthorized)> {
        let access = &mut self.access;
        let checked = match frame {
            Frame::CreateStream { request, name, .. }
            | Frame::DeleteStream { request, name }
            | Frame::SetRequirement { request, name, .. } => {
                (*request, access.check(Right::Admin, name))
            }
            Frame::RetireServer { request, .. } => (*request, access.check_all(Right::Admin)),
            Frame::CreateReplica { request, .. } if !access.is_server() => {
                let message =
                    "create-replica is a request between servers; a client link may not send it";
                (*request, Err(Unauthorized(message.into())))
            }
            Frame::OpenStream { request, name } if !access.may_see(name) => {
                let message = format!("the connection's token has no right on stream {name:?}");
                (*request, Err(Unauthorized(message)))
            }
            _ => return Ok(()),
        };
        match checked {
            (_, Ok(())) => Ok(()),
            (request, Err(refused)) => Err((request, refused)),
        }
    }

    pub(super) async fn create_stream(
        &mut self,
        request: u64,
        name: String,
        durability: DurabilityConfig,
        protocol: u8,
        replicas: u8,
        options: (u32, RetentionConfig),
    ) -> bool {
        let protocol = if protocol == 0 {
            Some(Protocol::OneHopAckClient)
        } else {
            Protocol::from_code(protocol)
        };
        let Some(protocol) = protocol else {
            let message = "unknown protocol code".to_string();
            return self
                .outgoing
                .error(request, ErrorCode::InvalidArgument, message)
                .await;
        };
        let result = self
            .server
            .create_replicated(&name, durability, protocol, replicas as usize, options)
            .await;
        self.outgoing.send(&info_or_error(request, result)).await
    }

    /// A peer's request to hold a replica of a stream it creates.
    pub(super) async fn create_replica(
        &mut self,
        request: u64,
        info: StreamInfo,
        retention: RetentionConfig,
    ) -> bool {
        let server = Arc::clone(&self.server);
        let result =
            tokio::task::spawn_blocking(move || server.create_replica(&info, retention)).await;
        let result = result.expect("create_replica does not panic");
        self.outgoing.send(&info_or_error(request, result)).await
    }

    pub(super) async fn delete_stream(&mut self, request: u64, name: String) -> bool {
        let result = self.server.delete_replicated(&name).await;
        self.outgoing.send(&done_or_error(request, result)).await
    }

    /// `rule`: the minimum in-sync count, the loss action's code and its
    /// block timeout.
    pub(super) async fn set_requirement(
        &mut self,
        request: u64,
        name: String,
        rule: (u16, u8, u32),
        roles: Vec<String>,
    ) -> bool {
        let (min_in_sync, action, block_ms) = rule;
        let action = match action {
            0 => None,
            1 => Some(control::LossAction::ReadOnly),
            2 => Some(control::LossAction::Block {
                timeout_ms: u64::from(block_ms),
            }),
            3 => Some(control::LossAction::Reconnect),
            other => {
                let message = format!("unknown loss action {other}");
                return self
                    .outgoing
                    .error(request, ErrorCode::InvalidArgument, message)
                    .await;
            }
        };
        let requirement = action.map(|action| control::Requirement {
            roles,
            min_in_sync: usize::from(min_in_sync),
            action,
        });
        let result = self.server.set_requirement(&name, requirement).await;
        self.outgoing.send(&done_or_error(request, result)).await
    }

    pub(super) async fn retire_server(&mut self, request: u64, server: u32) -> bool {
        let result = self.server.retire_server(server).await;
        self.outgoing.send(&done_or_error(request, result)).await
    }

    pub(super) async fn open_stream(&mut self, request: u64, name: String) -> bool {
        if !self.server.is_ready() {
            let message =
                format!("this server is joining the cluster; {name:?} is not open here yet: retry");
            return self.outgoing.error(request, ErrorCode::Busy, message).await;
        }
        // A server without a replica answers with the stream's placement,
        // so a client that knows any one server finds the replicas; so
        // does one whose copy failed (it follows the placement no more).
        let info = match self.server.stream_by_name(&name) {
            Some(stream) if stream.log.failure().is_some() => self
                .server
                .placed_info(&name)
                .or_else(|| Some(self.server.stream_info(&stream))),
            Some(stream) => Some(self.server.stream_info(&stream)),
            None => self.server.placed_info(&name),
        };
        match info {
            Some(info) => {
                self.declare(info.id);
                self.outgoing
                    .send(&Frame::StreamInfo { request, info })
                    .await
            }
            None => {
                let message = format!("no stream named {name:?}");
                self.outgoing
                    .error(request, ErrorCode::UnknownStream, message)
                    .await
            }
        }
    }

    pub(super) async fn list_streams(&mut self, request: u64) -> bool {
        let streams = self
            .server
            .streams()
            .iter()
            .filter(|s| self.access.may_see(&s.name))
            .map(|s| self.server.stream_info(s))
            .collect();
        self.outgoing
            .send(&Frame::StreamList { request, streams })
            .await
    }

    pub(super) async fn status(&mut self, request: u64) -> bool {
        let json = self.server.status_json().to_string();
        self.outgoing
            .send(&Frame::StatusReply { request, json })
            .await
    }
}

fn info_or_error(request: u64, result: Result<StreamInfo, StreamError>) -> Frame {
    match result {
        Ok(info) => Frame::StreamInfo { request, info },
        Err(error) => Frame::Error {
            request,
            code: error.code,
            message: error.message,
        },
    }
}

/// `Ok`, or the error with its code, in answer to `request`.
fn done_or_error(request: u64, result: Result<(), StreamError>) -> Frame {
    match result {
        Ok(()) => Frame::Ok { request },
        Err(error) => Frame::Error {
            request,
            code: error.code,
            message: error.message,
        },
    }
}
