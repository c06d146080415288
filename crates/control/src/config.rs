//! The control plane's settings: where Raft keeps its files, and its clocks.

use std::path::PathBuf;
use std::time::Duration;

use crate::error::ControlError;
use crate::state::ServerId;

/// How one server runs its part of the control plane.
#[derive(Clone, Debug)]
pub struct ControlConfig {
    /// This server's id, which is also its Raft node id.
    pub id: ServerId,
    /// This server's listener address (`host:port`), as peers dial it.
    pub address: String,
    /// Where Raft keeps its vote, log and snapshots (created if missing),
    /// e.g. `<data_dir>/control`.
    pub dir: PathBuf,
    /// Membership heartbeats from every member to the Raft leader.
    pub heartbeat_interval: Duration,
    /// A member the leader has not heard from for this long is removed with
    /// `Command::Remove { id, join_view, reason }`.
    pub suspect_timeout: Duration,
    /// How often the Raft leader reaches its followers; it must stay well
    /// under `election_timeout_min`.
    pub raft_heartbeat: Duration,
    /// A follower that hears nothing from a leader for a random time in
    /// this range stands for election.
    pub election_timeout_min: Duration,
    /// The top of the election timeout's range.
    pub election_timeout_max: Duration,
    /// Every control request's timeout (dial, send and answer).
    pub rpc_timeout: Duration,
    /// The state is written to a snapshot, and the log before it dropped,
    /// every this many log entries.
    pub snapshot_entries: u64,
    /// Opens the connections to the other servers: TLS with this server's
    /// certificate when the cluster uses TLS.
    pub dialer: net::Dialer,
}

impl ControlConfig {
    /// The defaults: heartbeats every 100 ms, removal after 700 ms of
    /// silence, Raft heartbeats every 50 ms, elections after 150 to 300 ms,
    /// requests time out after 500 ms, a snapshot every 1000 entries.
    pub fn new(id: ServerId, address: impl Into<String>, dir: impl Into<PathBuf>) -> Self {
        ControlConfig {
            id,
            address: address.into(),
            dir: dir.into(),
            heartbeat_interval: Duration::from_millis(100),
            suspect_timeout: Duration::from_millis(700),
            raft_heartbeat: Duration::from_millis(50),
            election_timeout_min: Duration::from_millis(150),
            election_timeout_max: Duration::from_millis(300),
            rpc_timeout: Duration::from_millis(500),
            snapshot_entries: 1000,
            dialer: net::Dialer::plain(),
        }
    }

    /// The log entries a snapshot leaves in the log, so a follower that is
    /// only a little behind catches up from the log rather than a snapshot.
    pub(crate) fn entries_kept_after_snapshot(&self) -> u64 {
        (self.snapshot_entries / 4).min(250)
    }

    /// openraft's settings derived from these, once the failure detector's
    /// clocks are checked too.
    pub(crate) fn raft_config(&self) -> Result<openraft::Config, ControlError> {
        if self.heartbeat_interval.is_zero() || self.rpc_timeout.is_zero() {
            return Err(self.config_error(
                "heartbeat_interval and rpc_timeout must be above zero".to_string(),
            ));
        }
        if self.suspect_timeout <= self.heartbeat_interval {
            return Err(self.config_error(format!(
                "suspect_timeout ({} ms) must be longer than heartbeat_interval ({} ms), \
                 or every member would be removed between two heartbeats",
                self.suspect_timeout.as_millis(),
                self.heartbeat_interval.as_millis()
            )));
        }
        let milliseconds = |duration: Duration| duration.as_millis().max(1) as u64;
        let config = openraft::Config {
            cluster_name: "stamplog-control".to_string(),
            heartbeat_interval: milliseconds(self.raft_heartbeat),
            election_timeout_min: milliseconds(self.election_timeout_min),
            election_timeout_max: milliseconds(self.election_timeout_max),
            install_snapshot_timeout: milliseconds(self.rpc_timeout),
            snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(self.snapshot_entries.max(1)),
            max_in_snapshot_log_to_keep: self.entries_kept_after_snapshot(),
            ..openraft::Config::default()
        };
        config
            .validate()
            .map_err(|error| self.config_error(error.to_string()))
    }

    fn config_error(&self, detail: String) -> ControlError {
        ControlError::Config {
            id: self.id,
            detail,
        }
    }
}
