//! The server's status document (`Status`, `stamplog status --json`): its
//! streams with their replication state, and the cluster's view, members
//! and placements when there is a control plane.

use super::*;

impl ServerState {
    /// The JSON status document: the server and every stream's counters.
    pub fn status_json(&self) -> serde_json::Value {
        let streams: Vec<serde_json::Value> = self
            .streams()
            .iter()
            .map(|stream| {
                let info = self.stream_info(stream);
                let metrics = stream.log.metrics();
                let (readers, lag) = stream.reader_lag();
                let mean_batch = if metrics.syncs == 0 {
                    0.0
                } else {
                    metrics.records_synced as f64 / metrics.syncs as f64
                };
                serde_json::json!({
                    "name": info.name,
                    "id": info.id,
                    "durability": durability_name(info.durability),
                    "retention": {
                        "bytes": stream.retention.bytes,
                        "ms": stream.retention.ms,
                    },
                    "first_version": info.first_version,
                    "last_version": info.last_version,
                    "committed_version": info.committed_version,
                    "failed": stream.log.failure().map(|f| f.to_string()),
                    "dedupe_entries": stream.dedupe_entries(),
                    "checkpoints": stream.log.checkpoints(),
                    "subscriptions": readers,
                    "subscription_lag": lag,
                    "replication": stream.replication_status(),
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
            "member": self.config.cluster.me,
            "address": self.address(),
            "peers": self.config.cluster.peers.iter().map(|p| serde_json::json!({"id": p.id, "address": p.address})).collect::<Vec<_>>(),
            "peer_messages_sent": self.router.metrics.peer_sent.load(std::sync::atomic::Ordering::Relaxed),
            "peer_messages_dropped": self.router.metrics.peer_dropped.load(std::sync::atomic::Ordering::Relaxed),
            "client_messages_dropped": self.router.metrics.client_dropped.load(std::sync::atomic::Ordering::Relaxed),
            "uptime_seconds": self.started.elapsed().as_secs_f64(),
            "connections": self.config.connections_max - self.connection_slots.available_permits(),
            "logins_refused": self.logins_refused.load(std::sync::atomic::Ordering::Relaxed),
            "requests_unauthorized": self.requests_unauthorized.load(std::sync::atomic::Ordering::Relaxed),
            "writes_busy": self.writes_busy.load(std::sync::atomic::Ordering::Relaxed),
            "streams": streams,
            "cluster": self.cluster_json(),
        })
    }

    /// The control plane's view for `status`: view, members, lead
    /// member, leader, placements and the latest transitions.
    pub(super) fn cluster_json(&self) -> serde_json::Value {
        let Some(control) = self.control.get() else {
            return serde_json::Value::Null;
        };
        let state = Arc::clone(&control.state().borrow());
        serde_json::json!({
            "view": state.view,
            "incarnation": self.router.incarnation(),
            "leader": control.leader(),
            "voters": control.voters(),
            "lead_member": state.lead_member().map(|m| m.id),
            "members": state.members.values().map(|m| serde_json::json!({
                "id": m.id,
                "address": m.address,
                "join_view": m.join_view,
                "member": control::state::member_name(m),
                "roles": m.roles,
                "admin_only": m.admin_only,
            })).collect::<Vec<_>>(),
            "under_replicated": state.streams.values().filter(|p| p.is_under_replicated()).count(),
            "streams": state.streams.values().map(|p| serde_json::json!({
                "name": p.name,
                "protocol": p.config.protocol,
                "replicas": p.replicas,
                "in_sync": p.in_sync,
                // Servers whose log of the stream failed (out of it until
                // they restart).
                "failed": p.failed.iter().map(|&(id, _)| id).collect::<Vec<_>>(),
                "requirement": control::state::describe_requirement(p),
                "primary": p.primary,
                "epoch": p.epoch,
                "availability": control::state::describe(&p.availability),
                "epochs": p.epochs.iter().map(|r| serde_json::json!({
                    "epoch": r.epoch,
                    "first_version": r.first_version,
                    "members": r.members,
                })).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
            "transitions": state.transitions.iter().map(|t| serde_json::json!({
                "view": t.view,
                "what": t.what,
            })).collect::<Vec<_>>(),
        })
    }
}
