//! The control plane's replicated state: membership views, stream
//! placement and stream configuration. Every server applies the same
//! committed [`Command`]s in the same order to a [`ControlState`], so
//! [`ControlState::apply`] is deterministic: no clocks, no randomness, no
//! I/O. The data path never waits on it; servers read the applied state
//! and reconfigure their streams.
//!
//! Members. A member is one process: its server id (the Raft node id,
//! stable with its data folder), its address and the view in which it
//! joined. A restarted process joins again and gets a new join view, so
//! it is a new member; its former incarnation leaves in the same view.
//! Views only grow: the view number is part of the replicated state, which
//! Raft keeps on disk.
//!
//! Placement. A stream has a replica set (the servers holding its log), an
//! in-sync subset (replicas that hold every acknowledged version), a
//! primary chosen from the live in-sync replicas, and an epoch that grows
//! with every change of primary. The epoch records ([`EpochRecord`]) say
//! at which version each epoch's primary began and whose logs it had
//! taken into account, so a replica coming back knows which tail of its
//! log no one else agrees with.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use engine::replication::{ClusterView, Placement};
use serde::{Deserialize, Serialize};

/// A server's configured id (also its Raft node id).
pub type ServerId = u32;

/// Transitions kept for `status`.
pub const TRANSITIONS_KEPT: usize = 64;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    pub id: ServerId,
    /// `host:port` of the server's listener.
    pub address: String,
    /// The view in which this process joined: with the address, the
    /// member's identity.
    pub join_view: u64,
    pub roles: Vec<String>,
    /// Admin-only servers hold no replicas and are never the lead member.
    pub admin_only: bool,
    /// Random per process: a retried `Join` of the same process is not a
    /// new member.
    #[serde(default)]
    pub nonce: u128,
}

/// What a stream does while its requirement is not met.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "action")]
pub enum LossAction {
    /// Writes are refused; reads go on.
    ReadOnly,
    /// Writes wait up to `timeout_ms` for the requirement, then fail.
    Block { timeout_ms: u64 },
    /// Clients are disconnected and reconnect once it is met again.
    Reconnect,
}

/// Roles a stream's live in-sync replicas must cover, and how many of
/// them there must be at least.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Requirement {
    pub roles: Vec<String>,
    pub min_in_sync: usize,
    pub action: LossAction,
}

/// Whether a stream takes writes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "state")]
pub enum Availability {
    Available,
    /// No live in-sync replica: nobody can be primary without risking
    /// acknowledged versions. It returns when one comes back.
    NoPrimary,
    /// The requirement is not met; the loss action applies.
    Degraded {
        action: LossAction,
        why: String,
    },
}

/// The versions from which an epoch's primary stamped, and the replicas
/// whose logs it had taken into account (or that joined empty during it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpochRecord {
    pub epoch: u64,
    pub first_version: u64,
    pub members: Vec<ServerId>,
}

/// How long the default requirement's `block` holds writes before it
/// refuses them.
pub const DEFAULT_BLOCK_MS: u64 = 30_000;

/// The longest output commit interval a stream may have: acks wait up to
/// this long, so a longer one would only look like a stalled server.
pub const COMMIT_INTERVAL_MS_MAX: u32 = 10_000;

/// Why an output commit interval is refused.
pub fn commit_interval_error(commit_interval_ms: u32) -> String {
    format!(
        "commit interval {commit_interval_ms} ms exceeds the limit of {COMMIT_INTERVAL_MS_MAX} ms"
    )
}

/// A stream's configuration, fixed at creation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamConfig {
    /// Protocol name (`one-hop-ack-client`, ...).
    pub protocol: String,
    /// Durability as the server names it (`sync`, `memory`, `paged`).
    pub durability: String,
    pub pages: u16,
    pub page_size: u32,
    /// Replicas wanted (R).
    pub replicas: usize,
    pub requirement: Option<Requirement>,
    /// The output commit interval in milliseconds (0: none); absent in
    /// entries written before it existed.
    #[serde(default)]
    pub commit_interval_ms: u32,
    /// The stream's own retention: bytes of log kept, and the age of
    /// segments deleted (0: the server's default; absent in entries
    /// written before it existed).
    #[serde(default)]
    pub retain_bytes: u64,
    #[serde(default)]
    pub retain_ms: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamPlacement {
    pub id: u64,
    pub name: String,
    pub config: StreamConfig,
    /// Servers holding the stream's log, in preference order.
    pub replicas: Vec<ServerId>,
    /// Replicas that hold every acknowledged version. Always contains the
    /// primary when there is one.
    pub in_sync: Vec<ServerId>,
    pub primary: Option<ServerId>,
    /// The join view of the primary's process: when it changes (the
    /// process restarted) the stream fails over as if it had left.
    pub primary_join_view: u64,
    pub epoch: u64,
    /// Epochs whose primary has begun stamping, oldest first.
    pub epochs: Vec<EpochRecord>,
    /// While the current epoch is not recorded: the live replicas whose
    /// tails its primary takes into account (those live when it was
    /// chosen; a server that joins later waits for the record and is cut
    /// back by it).
    #[serde(default)]
    pub epoch_members: Vec<ServerId>,
    /// Replicas added by a refill that have not caught up yet: whatever
    /// an old copy of theirs holds is dropped.
    #[serde(default)]
    pub fresh: Vec<ServerId>,
    /// Replicas whose log failed (`Command::LogFailed`), by server and
    /// the join view of the process whose log it was: that process holds
    /// no live replica of the stream, as if it had left; the same server
    /// joined again (restarted, its log working) is live again.
    #[serde(default)]
    pub failed: Vec<(ServerId, u64)>,
    pub availability: Availability,
}

impl StreamPlacement {
    /// The requirement that applies: the stream's own (`streams
    /// require`), or by default a majority of its R replicas in sync, writes
    /// blocked for up to [`DEFAULT_BLOCK_MS`] (then refused) while fewer
    /// are, so that an acknowledgement never stands on fewer replicas than
    /// the stream promises without anyone having said so. `unversioned`
    /// streams have no default: every replica is its own primary.
    pub fn requirement(&self) -> Option<Requirement> {
        if let Some(own) = &self.config.requirement {
            return Some(own.clone());
        }
        if self.is_unversioned() {
            return None;
        }
        Some(Requirement {
            roles: Vec::new(),
            min_in_sync: self.config.replicas.max(1) / 2 + 1,
            action: LossAction::Block {
                timeout_ms: DEFAULT_BLOCK_MS,
            },
        })
    }

    /// Whether fewer replicas are in sync than the stream asked for (R).
    pub fn is_under_replicated(&self) -> bool {
        self.in_sync.len() < self.config.replicas
    }

    /// The version after which `server`'s log of this stream may hold
    /// versions nobody else agrees with, or `None` when all of it is
    /// consistent. A server's log is consistent with every epoch record
    /// that lists it; from the first later record on, the primary did not
    /// know its tail, so everything past that record's start is dropped.
    pub fn truncate_after(&self, server: ServerId) -> Option<u64> {
        if self.is_unversioned() {
            // Every server versions its own log: nothing to agree on.
            return None;
        }
        if self.fresh.contains(&server) {
            return Some(0);
        }
        let last_known = self
            .epochs
            .iter()
            .rposition(|record| record.members.contains(&server));
        let next = match last_known {
            Some(index) => self.epochs.get(index + 1),
            None => self.epochs.first(),
        }?;
        Some(next.first_version.saturating_sub(1))
    }
}

impl StreamPlacement {
    /// Whether `id`'s copy of the stream is live: the server is a member
    /// and the log of its current process has not failed.
    pub fn holds_live(&self, members: &BTreeMap<ServerId, Member>, id: ServerId) -> bool {
        holds_live(&self.failed, members, id)
    }

    /// `unversioned`: every replica is its own primary.
    pub fn is_unversioned(&self) -> bool {
        self.config.protocol == "unversioned"
    }

    /// Whether the current epoch's primary has begun stamping.
    pub fn is_recorded(&self) -> bool {
        self.epochs.last().is_some_and(|r| r.epoch == self.epoch)
    }

    /// Whether `server` may open its copy now: a server the unrecorded
    /// epoch's primary does not wait for opens once the epoch's record
    /// says where to cut its log.
    pub fn may_open(&self, server: ServerId) -> bool {
        self.is_unversioned()
            || self.is_recorded()
            || self.primary == Some(server)
            || self.epoch_members.contains(&server)
    }

    /// The data path's view of this placement in `state`: the live
    /// replicas (members of the view) in preference order, the primary (0
    /// when there is none) and the epoch; the live in-sync replicas; the
    /// backups whose tails a new primary takes; whether the epoch is
    /// recorded. Every server hands it to `Replica::follow`.
    pub fn live_view(&self, state: &ControlState) -> ClusterView {
        let live: Vec<ServerId> = self
            .replicas
            .iter()
            .copied()
            .filter(|id| self.holds_live(&state.members, *id))
            .collect();
        let in_sync = self
            .in_sync
            .iter()
            .copied()
            .filter(|id| live.contains(id))
            .collect();
        let consider = if self.is_recorded() {
            live.clone()
        } else {
            self.epoch_members
                .iter()
                .copied()
                .filter(|id| live.contains(id))
                .collect()
        };
        ClusterView {
            placement: Placement {
                replicas: live,
                primary: self.primary.unwrap_or(0),
                epoch: self.epoch,
            },
            in_sync,
            consider,
            epoch_recorded: self.epochs.iter().any(|r| r.epoch == self.epoch),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Transition {
    pub view: u64,
    pub what: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ControlState {
    /// Grows with every membership change; never reset.
    pub view: u64,
    pub members: BTreeMap<ServerId, Member>,
    pub streams: BTreeMap<String, StreamPlacement>,
    /// The newest transitions (views, failovers, loss actions), oldest
    /// first, at most [`TRANSITIONS_KEPT`].
    pub transitions: VecDeque<Transition>,
}

/// An entry of the control log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// A process joins (or rejoins: its former incarnation leaves).
    Join {
        id: ServerId,
        address: String,
        roles: Vec<String>,
        admin_only: bool,
        /// Random per process (see [`Member::nonce`]).
        nonce: u128,
    },
    /// A member is removed (suspected by the failure detector, or asked
    /// to leave). Ignored unless `join_view` names the current incarnation.
    Remove {
        id: ServerId,
        join_view: u64,
        reason: String,
    },
    CreateStream {
        name: String,
        config: StreamConfig,
    },
    DeleteStream {
        name: String,
    },
    /// Sets (or clears) what a stream requires of its live in-sync
    /// replicas, and its loss action.
    SetRequirement {
        name: String,
        requirement: Option<Requirement>,
    },
    /// A stream's primary has taken its replicas' tails into account and
    /// stamps from `first_version` in `epoch`.
    EpochStarted {
        name: String,
        epoch: u64,
        first_version: u64,
        members: Vec<ServerId>,
    },
    /// A replica has caught up with the primary of `epoch`. `join_view`
    /// names the process that reported it (the incarnation of its link),
    /// when known: a report of a process that has left since is ignored,
    /// for the server's new process has not caught up.
    InSync {
        name: String,
        epoch: u64,
        server: ServerId,
        #[serde(default)]
        join_view: Option<u64>,
    },
    /// A replica's log failed (a write or fsync error, such as a full
    /// disk) and takes no more records: the replica leaves the stream's
    /// in-sync set, and a primary hands over to a live in-sync replica.
    /// Ignored unless `join_view` names the server's current incarnation,
    /// and while no other in-sync replica is live.
    LogFailed {
        name: String,
        server: ServerId,
        join_view: u64,
        reason: String,
    },
}

/// The result of applying a command.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Response {
    /// A member joined in this view.
    Joined {
        view: u64,
    },
    Stream(Box<StreamPlacement>),
    Done,
    /// Nothing changed (a stale or repeated command).
    Ignored(String),
    /// The command is invalid (for people).
    Refused(String),
}

impl ControlState {
    /// The oldest member that may lead (not admin-only).
    pub fn lead_member(&self) -> Option<&Member> {
        self.members
            .values()
            .filter(|m| !m.admin_only)
            .min_by_key(|m| (m.join_view, m.id))
    }

    pub fn is_member(&self, id: ServerId, join_view: u64) -> bool {
        self.members
            .get(&id)
            .is_some_and(|member| member.join_view == join_view)
    }

    pub fn apply(&mut self, command: Command) -> Response {
        match command {
            Command::Join {
                id,
                address,
                roles,
                admin_only,
                nonce,
            } => self.join(id, address, (roles, admin_only), nonce),
            Command::Remove {
                id,
                join_view,
                reason,
            } => self.remove(id, join_view, reason),
            Command::CreateStream { name, config } => self.create_stream(name, config),
            Command::SetRequirement { name, requirement } => {
                self.set_requirement(name, requirement)
            }
            Command::DeleteStream { name } => match self.streams.remove(&name) {
                Some(_) => {
                    self.record(format!("stream {name:?} deleted"));
                    Response::Done
                }
                None => Response::Refused(format!("no stream named {name:?}")),
            },
            Command::EpochStarted {
                name,
                epoch,
                first_version,
                members,
            } => self.epoch_started(name, epoch, first_version, members),
            Command::InSync {
                name,
                epoch,
                server,
                join_view,
            } => self.in_sync(name, epoch, server, join_view),
            Command::LogFailed {
                name,
                server,
                join_view,
                reason,
            } => self.log_failed(name, (server, join_view), reason),
        }
    }

    /// A process joins: a new member, with the next view as its join view
    /// (a server that was a member rejoins as a new one; the old leaves).
    fn join(
        &mut self,
        id: ServerId,
        address: String,
        (roles, admin_only): (Vec<String>, bool),
        nonce: u128,
    ) -> Response {
        if id == 0 {
            return Response::Refused("server ids start at 1".into());
        }
        if let Some(current) = self.members.get(&id) {
            if nonce != 0 && current.nonce == nonce {
                // The same process asking again.
                return Response::Joined {
                    view: current.join_view,
                };
            }
        }
        if let Some(other) = self
            .members
            .values()
            .find(|m| m.address == address && m.id != id)
        {
            return Response::Refused(format!(
                "address {address} belongs to member {} (server {})",
                member_name(other),
                other.id
            ));
        }
        self.view += 1;
        let rejoin = self.members.contains_key(&id);
        let member = Member {
            id,
            address,
            join_view: self.view,
            roles,
            admin_only,
            nonce,
        };
        let what = if rejoin {
            format!("{} joined again (a new member)", member_name(&member))
        } else {
            format!("{} joined", member_name(&member))
        };
        self.members.insert(id, member);
        self.record(what);
        if rejoin {
            self.departed(id);
        }
        self.reconcile();
        Response::Joined { view: self.view }
    }

    /// A member leaves the view (the detector, or an operator).
    fn remove(&mut self, id: ServerId, join_view: u64, reason: String) -> Response {
        if !self.is_member(id, join_view) {
            return Response::Ignored(format!(
                "server {id} joined in view {join_view} is not a member"
            ));
        }
        self.view += 1;
        let member = self.members.remove(&id).expect("checked");
        self.record(format!("{} left: {reason}", member_name(&member)));
        self.departed(id);
        self.reconcile();
        Response::Done
    }

    fn set_requirement(&mut self, name: String, requirement: Option<Requirement>) -> Response {
        if let Some(problem) = requirement.as_ref().and_then(requirement_problem) {
            return Response::Refused(problem);
        }
        let Some(stream) = self.streams.get_mut(&name) else {
            return Response::Refused(format!("no stream named {name:?}"));
        };
        let what = match &requirement {
            Some(r) => format!(
                "stream {name:?} requires {} in-sync replicas and roles {:?}; loss action {}",
                r.min_in_sync,
                r.roles,
                action_name(r.action)
            ),
            None => format!("stream {name:?} requires nothing"),
        };
        stream.config.requirement = requirement;
        self.record(what);
        self.reconcile();
        Response::Done
    }

    /// A stream's new primary took its replicas' tails: the epoch's record.
    fn epoch_started(
        &mut self,
        name: String,
        epoch: u64,
        first_version: u64,
        members: Vec<ServerId>,
    ) -> Response {
        let Some(stream) = self.streams.get_mut(&name) else {
            return Response::Ignored(format!("no stream named {name:?}"));
        };
        if stream.epoch != epoch || stream.epochs.iter().any(|r| r.epoch == epoch) {
            return Response::Ignored(format!(
                "epoch {epoch} of {name:?} is not the current unstarted epoch"
            ));
        }
        stream.epochs.push(EpochRecord {
            epoch,
            first_version,
            members,
        });
        stream.epoch_members.clear();
        let what = format!(
            "stream {name:?} epoch {epoch}: primary {} stamps from version {first_version}",
            stream.primary.unwrap_or(0)
        );
        self.record(what);
        Response::Done
    }

    /// A replica caught up with the epoch's primary (state flush done).
    fn in_sync(
        &mut self,
        name: String,
        epoch: u64,
        server: ServerId,
        join_view: Option<u64>,
    ) -> Response {
        let live = self
            .members
            .get(&server)
            .is_some_and(|member| join_view.is_none_or(|reported| reported == member.join_view));
        let Some(stream) = self.streams.get_mut(&name) else {
            return Response::Ignored(format!("no stream named {name:?}"));
        };
        if stream.epoch != epoch
            || !live
            || !stream.replicas.contains(&server)
            || stream.in_sync.contains(&server)
        {
            return Response::Ignored(format!(
                "server {server} cannot join {name:?}'s in-sync set in epoch {epoch}"
            ));
        }
        stream.in_sync.push(server);
        // Caught up from this epoch's primary: its log now agrees
        // with this epoch's.
        stream.fresh.retain(|&id| id != server);
        if let Some(record) = stream.epochs.last_mut() {
            if record.epoch == epoch && !record.members.contains(&server) {
                record.members.push(server);
            }
        }
        let what = format!("stream {name:?}: server {server} is in sync");
        self.record(what);
        self.reconcile();
        Response::Done
    }

    /// A replica's log failed: for this stream its process counts as
    /// departed, though the server stays a member for its other streams.
    /// It leaves the in-sync set; a primary is replaced by the next live
    /// in-sync replica in a new epoch, and a spare member refills the set
    /// (`reconcile`). The same server joined again (restarted, its log
    /// working) comes back as a departed member does.
    fn log_failed(
        &mut self,
        name: String,
        (server, join_view): (ServerId, u64),
        reason: String,
    ) -> Response {
        let live = self.is_member(server, join_view);
        let members = &self.members;
        let Some(stream) = self.streams.get_mut(&name) else {
            return Response::Ignored(format!("no stream named {name:?}"));
        };
        if !live || !stream.in_sync.contains(&server) {
            return Response::Ignored(format!(
                "server {server} joined in view {join_view} is not in {name:?}'s in-sync set"
            ));
        }
        let others_live = stream
            .in_sync
            .iter()
            .any(|&other| other != server && stream.holds_live(members, other));
        if !others_live {
            return Response::Ignored(format!(
                "server {server} is {name:?}'s only live in-sync replica"
            ));
        }
        stream.in_sync.retain(|&other| other != server);
        // Not live any more: `reconcile` replaces a primary and refills.
        stream.failed.push((server, join_view));
        let what = format!(
            "stream {name:?}: server {server} left the in-sync set ({} of {} replicas in sync): its log failed: {reason}",
            stream.in_sync.len(),
            stream.replicas.len()
        );
        self.record(what);
        self.reconcile();
        Response::Done
    }

    fn create_stream(&mut self, name: String, config: StreamConfig) -> Response {
        if self.streams.contains_key(&name) {
            return Response::Refused(format!("a stream named {name:?} exists"));
        }
        if config.commit_interval_ms > COMMIT_INTERVAL_MS_MAX {
            return Response::Refused(commit_interval_error(config.commit_interval_ms));
        }
        let eligible: Vec<ServerId> = self
            .members
            .values()
            .filter(|m| !m.admin_only)
            .map(|m| m.id)
            .collect();
        let count = if config.replicas == 0 {
            3.min(eligible.len())
        } else {
            config.replicas
        };
        if count == 0 || count > eligible.len() {
            return Response::Refused(format!(
                "a stream of {count} replicas needs {count} servers; the view has {}",
                eligible.len()
            ));
        }
        let hash = name_hash(name.as_bytes());
        let start = (hash % eligible.len() as u64) as usize;
        let replicas: Vec<ServerId> = (0..count)
            .map(|i| eligible[(start + i) % eligible.len()])
            .collect();
        let mut id = hash ^ self.view.rotate_left(32);
        while id == 0 || self.streams.values().any(|s| s.id == id) {
            id = id.wrapping_mul(0x9e37_79b9_7f4a_7c15).wrapping_add(1);
        }
        let primary = replicas[0];
        let placement = StreamPlacement {
            id,
            name: name.clone(),
            config: StreamConfig {
                replicas: count,
                ..config
            },
            in_sync: replicas.clone(),
            primary: Some(primary),
            primary_join_view: self.members[&primary].join_view,
            epoch: 1,
            epochs: vec![EpochRecord {
                epoch: 1,
                first_version: 1,
                members: replicas.clone(),
            }],
            replicas,
            epoch_members: Vec::new(),
            fresh: Vec::new(),
            failed: Vec::new(),
            availability: Availability::Available,
        };
        self.streams.insert(name.clone(), placement);
        self.record(format!("stream {name:?} created"));
        self.reconcile();
        Response::Stream(Box::new(self.streams[&name].clone()))
    }

    /// Server `id`'s former process has gone: it no longer counts as in
    /// sync wherever another live in-sync replica carries on without it.
    fn departed(&mut self, id: ServerId) {
        let members = &self.members;
        let mut shrunk = Vec::new();
        for stream in self.streams.values_mut() {
            if !stream.in_sync.contains(&id) {
                continue;
            }
            let others_live = stream
                .in_sync
                .iter()
                .any(|&other| other != id && members.contains_key(&other));
            if others_live {
                stream.in_sync.retain(|&other| other != id);
                shrunk.push(format!(
                    "stream {:?}: server {id} left the in-sync set ({} of {} replicas in sync)",
                    stream.name,
                    stream.in_sync.len(),
                    stream.replicas.len()
                ));
            }
        }
        for what in shrunk {
            self.record(what);
        }
    }

    /// Brings every stream's placement in line with the view: a primary
    /// that is gone is replaced, lost replicas are refilled from spare
    /// members, and availability follows the requirement.
    fn reconcile(&mut self) {
        let mut notes = Vec::new();
        let members = &self.members;
        for stream in self.streams.values_mut() {
            // A failure noted of a process that has left since is over.
            stream
                .failed
                .retain(|&(id, view)| members.get(&id).is_some_and(|m| m.join_view == view));
            let failed = stream.failed.clone();
            let live = |id: &ServerId| holds_live(&failed, members, *id);
            replace_primary(stream, members, &live, &mut notes);
            stream.epoch_members.retain(|id| live(id));
            // Refill: a replica that is gone and out of sync leaves the
            // set (it holds nothing anyone needs); a spare member, or the
            // same server when it comes back, takes its place. A server
            // some epoch record lists keeps its log up to where the epoch
            // records stop agreeing with it (`truncate_after`) and copies
            // only the rest; any other starts fresh, from an empty log.
            let live_count = stream.replicas.iter().filter(|id| live(id)).count();
            if live_count < stream.config.replicas {
                let mut spares: Vec<&Member> = members
                    .values()
                    .filter(|m| !m.admin_only && !stream.replicas.contains(&m.id))
                    .collect();
                spares.sort_by_key(|m| {
                    name_hash(&[stream.name.as_bytes(), &m.id.to_le_bytes()].concat())
                });
                let wanted = stream.config.replicas - live_count;
                let chosen: Vec<ServerId> = spares.into_iter().take(wanted).map(|m| m.id).collect();
                let in_sync = &stream.in_sync;
                stream
                    .replicas
                    .retain(|id| live(id) || in_sync.contains(id));
                let replicas = &stream.replicas;
                stream.fresh.retain(|id| replicas.contains(id));
                for spare in chosen {
                    stream.replicas.push(spare);
                    if !stream.epochs.iter().any(|r| r.members.contains(&spare)) {
                        stream.fresh.push(spare);
                    }
                    notes.push(format!(
                        "stream {:?}: server {spare} added to the replica set",
                        stream.name
                    ));
                }
            }
            settle_availability(stream, members, &mut notes);
        }
        for note in notes {
            self.record(note);
        }
    }

    fn record(&mut self, what: String) {
        if self.transitions.len() == TRANSITIONS_KEPT {
            self.transitions.pop_front();
        }
        self.transitions.push_back(Transition {
            view: self.view,
            what,
        });
    }
}

/// Brings `stream.availability` in line with its requirement and the live
/// members, noting a change; a `reconnect` stream whose requirement is met
/// again reopens in a new epoch under the same primary, which takes every
/// live replica's tail and brings each in line (state flush) before it
/// stamps again: the members rejoin it.
fn settle_availability(
    stream: &mut StreamPlacement,
    members: &BTreeMap<ServerId, Member>,
    notes: &mut Vec<String>,
) {
    let availability = availability(stream, members);
    if availability == stream.availability {
        return;
    }
    notes.push(format!(
        "stream {:?}: {}",
        stream.name,
        describe(&availability)
    ));
    let closed = matches!(
        stream.availability,
        Availability::Degraded {
            action: LossAction::Reconnect,
            ..
        }
    );
    stream.availability = availability;
    if closed && stream.availability == Availability::Available {
        stream.epoch += 1;
        stream.epoch_members = stream
            .replicas
            .iter()
            .copied()
            .filter(|id| members.contains_key(id))
            .collect();
        notes.push(format!(
            "stream {:?} reopened in epoch {}: its members rejoin by state flush",
            stream.name, stream.epoch
        ));
    }
}

fn availability(stream: &StreamPlacement, members: &BTreeMap<ServerId, Member>) -> Availability {
    if stream.primary.is_none() {
        return Availability::NoPrimary;
    }
    let Some(requirement) = stream.requirement() else {
        return Availability::Available;
    };
    let live_in_sync: Vec<&Member> = stream
        .in_sync
        .iter()
        .filter_map(|id| members.get(id))
        .collect();
    let mut missing = Vec::new();
    if live_in_sync.len() < requirement.min_in_sync {
        missing.push(format!(
            "{} in-sync replicas of {} required",
            live_in_sync.len(),
            requirement.min_in_sync
        ));
    }
    let roles: BTreeSet<&str> = live_in_sync
        .iter()
        .flat_map(|m| m.roles.iter().map(String::as_str))
        .collect();
    for role in &requirement.roles {
        if !roles.contains(role.as_str()) {
            missing.push(format!("no in-sync replica has role {role:?}"));
        }
    }
    if missing.is_empty() {
        Availability::Available
    } else {
        Availability::Degraded {
            action: requirement.action,
            why: missing.join("; "),
        }
    }
}

/// Why a requirement cannot be met by any placement, if it cannot.
fn requirement_problem(requirement: &Requirement) -> Option<String> {
    if requirement.min_in_sync > 16 {
        return Some("min_in_sync is at most 16".into());
    }
    if requirement.roles.len() > 16
        || requirement
            .roles
            .iter()
            .any(|r| r.is_empty() || r.len() > 64)
    {
        return Some("at most 16 roles, each of 1 to 64 characters".into());
    }
    None
}

/// What a stream requires of its in-sync replicas, as `status` says it;
/// `(default)` when it is the default majority.
pub fn describe_requirement(stream: &StreamPlacement) -> String {
    let Some(requirement) = stream.requirement() else {
        return "nothing".to_string();
    };
    let roles = if requirement.roles.is_empty() {
        String::new()
    } else {
        format!(" with roles {:?}", requirement.roles)
    };
    format!(
        "{} of {} in sync{roles}, else {}{}",
        requirement.min_in_sync,
        stream.config.replicas,
        action_name(requirement.action),
        if stream.config.requirement.is_none() {
            " (default)"
        } else {
            ""
        }
    )
}

/// A loss action's name, as flags and `status` give it.
pub fn action_name(action: LossAction) -> String {
    match action {
        LossAction::ReadOnly => "read-only".to_string(),
        LossAction::Block { timeout_ms } => format!("block (up to {timeout_ms} ms)"),
        LossAction::Reconnect => "reconnect".to_string(),
    }
}

/// Why a stream refuses writes now (its loss action while its requirement
/// is not met).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WriteRefusal {
    /// `read-only`, or `block` past its timeout: refused until the
    /// requirement is met again.
    ReadOnly(String),
    /// `block` within its timeout: the writer should wait and retry.
    Blocked(String),
    /// `reconnect`: the writer should reconnect later.
    Reconnect(String),
}

impl Availability {
    /// The stream's loss-action gate: whether a write is refused now, and
    /// how, when the availability has held for `held_ms`. The server asks
    /// it before each write; the decision is this one function.
    pub fn write_refusal(&self, held_ms: u64) -> Option<WriteRefusal> {
        let Availability::Degraded { action, why } = self else {
            return None;
        };
        Some(match *action {
            LossAction::ReadOnly => WriteRefusal::ReadOnly(why.clone()),
            LossAction::Block { timeout_ms } if held_ms < timeout_ms => {
                WriteRefusal::Blocked(why.clone())
            }
            LossAction::Block { timeout_ms } => {
                WriteRefusal::ReadOnly(format!("{why}; blocked for more than {timeout_ms} ms"))
            }
            LossAction::Reconnect => WriteRefusal::Reconnect(why.clone()),
        })
    }
}

/// For people: what an availability means.
pub fn describe(availability: &Availability) -> String {
    match availability {
        Availability::Available => "available".into(),
        Availability::NoPrimary => "no live in-sync replica".into(),
        Availability::Degraded { action, why } => format!("{}: {why}", action_name(*action)),
    }
}

/// `address/join-view`: how a member is named.
pub fn member_name(member: &Member) -> String {
    format!("{}/{}", member.address, member.join_view)
}

/// FNV-1a: a stable spread of streams over servers.
pub fn name_hash(bytes: &[u8]) -> u64 {
    let mut hash = 0xcbf2_9ce4_8422_2325u64;
    for &byte in bytes {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

/// Whether `id`'s copy is live: a member whose current process's log is
/// not among `failed` ([`StreamPlacement::holds_live`]).
fn holds_live(
    failed: &[(ServerId, u64)],
    members: &BTreeMap<ServerId, Member>,
    id: ServerId,
) -> bool {
    members
        .get(&id)
        .is_some_and(|member| !failed.contains(&(id, member.join_view)))
}

/// A stream's primary that is not current (gone, failed, or of a
/// former process) is replaced by the first live in-sync replica in a
/// new epoch, whose tails it takes from the live replicas; with none,
/// the stream has no primary and writes wait.
fn replace_primary(
    stream: &mut StreamPlacement,
    members: &BTreeMap<ServerId, Member>,
    live: &impl Fn(&ServerId) -> bool,
    notes: &mut Vec<String>,
) {
    let primary_current = stream.primary.is_some_and(|p| {
        live(&p)
            && members
                .get(&p)
                .is_some_and(|m| m.join_view == stream.primary_join_view)
    });
    if !primary_current {
        let next = stream
            .replicas
            .iter()
            .copied()
            .find(|id| live(id) && stream.in_sync.contains(id));
        match next {
            Some(next) => {
                stream.epoch += 1;
                stream.primary = Some(next);
                stream.primary_join_view = members[&next].join_view;
                stream.epoch_members = stream
                    .replicas
                    .iter()
                    .copied()
                    .filter(|id| live(id))
                    .collect();
                notes.push(format!(
                    "stream {:?} failed over: primary {next} in epoch {}",
                    stream.name, stream.epoch
                ));
            }
            None if stream.primary.is_some() => {
                stream.primary = None;
                notes.push(format!(
                    "stream {:?} has no live in-sync replica; writes wait for one",
                    stream.name
                ));
            }
            None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn join(state: &mut ControlState, id: ServerId, nonce: u128) -> u64 {
        let command = Command::Join {
            id,
            address: format!("127.0.0.1:{}", 7400 + id),
            roles: vec![format!("zone-{id}")],
            admin_only: false,
            nonce,
        };
        match state.apply(command) {
            Response::Joined { view } => view,
            other => panic!("{other:?}"),
        }
    }

    fn config(replicas: usize) -> StreamConfig {
        StreamConfig {
            protocol: "one-hop-ack-client".into(),
            durability: "sync".into(),
            pages: 0,
            page_size: 0,
            replicas,
            requirement: None,
            commit_interval_ms: 0,
            retain_bytes: 0,
            retain_ms: 0,
        }
    }

    #[test]
    fn a_commit_interval_over_the_limit_is_refused_and_one_within_is_kept() {
        let mut state = cluster(3);
        let too_long = StreamConfig {
            commit_interval_ms: COMMIT_INTERVAL_MS_MAX + 1,
            ..config(3)
        };
        let response = state.apply(Command::CreateStream {
            name: "slow".into(),
            config: too_long,
        });
        assert!(
            matches!(&response, Response::Refused(why) if why.contains("commit interval")),
            "{response:?}"
        );
        let within = StreamConfig {
            commit_interval_ms: 20,
            ..config(3)
        };
        let Response::Stream(placed) = state.apply(Command::CreateStream {
            name: "batched".into(),
            config: within,
        }) else {
            panic!("not placed");
        };
        assert_eq!(placed.config.commit_interval_ms, 20);
    }

    /// Entries written before the commit interval existed lack the field.
    #[test]
    fn a_stream_config_without_a_commit_interval_reads_as_zero() {
        let mut json = serde_json::to_value(config(3)).unwrap();
        json.as_object_mut().unwrap().remove("commit_interval_ms");
        let read: StreamConfig = serde_json::from_value(json).unwrap();
        assert_eq!(read, config(3));
    }

    fn cluster(servers: ServerId) -> ControlState {
        let mut state = ControlState::default();
        for id in 1..=servers {
            join(&mut state, id, u128::from(id));
        }
        state
    }

    fn remove(state: &mut ControlState, id: ServerId) {
        let join_view = state.members[&id].join_view;
        let command = Command::Remove {
            id,
            join_view,
            reason: "test".into(),
        };
        assert_eq!(state.apply(command), Response::Done);
    }

    #[test]
    fn views_grow_a_retried_join_is_not_a_new_member_and_stale_removals_are_ignored() {
        let mut state = cluster(3);
        assert_eq!(state.view, 3);
        assert_eq!(join(&mut state, 2, 2), 2, "the same process asking again");
        assert_eq!(state.view, 3);
        let again = join(&mut state, 2, 99);
        assert_eq!((again, state.view), (4, 4), "a new process is a new member");
        let stale = Command::Remove {
            id: 2,
            join_view: 2,
            reason: "late".into(),
        };
        assert!(matches!(state.apply(stale), Response::Ignored(_)));
        assert_eq!(state.lead_member().map(|m| m.id), Some(1));
    }

    /// Creates stream "s" of three replicas; its placement.
    fn create_s(state: &mut ControlState) -> StreamPlacement {
        let Response::Stream(placed) = state.apply(Command::CreateStream {
            name: "s".into(),
            config: config(3),
        }) else {
            panic!("not placed")
        };
        *placed
    }

    fn log_failed(state: &mut ControlState, id: ServerId) -> Response {
        state.apply(Command::LogFailed {
            name: "s".into(),
            server: id,
            join_view: state.members[&id].join_view,
            reason: "No space left on device".into(),
        })
    }

    #[test]
    fn a_replica_whose_log_failed_leaves_the_in_sync_set_and_a_primary_hands_over() {
        let mut state = cluster(3);
        let placed = create_s(&mut state);
        let primary = placed.primary.unwrap();
        let backup = *placed.replicas.iter().find(|&&id| id != primary).unwrap();
        // A backup: for this stream its process is gone, as a departed
        // member's is (no spare to refill the set here); its server stays
        // a member, and the primary and the epoch stay.
        assert_eq!(log_failed(&mut state, backup), Response::Done);
        let stream = &state.streams["s"];
        assert!(!stream.in_sync.contains(&backup));
        assert!(!stream
            .live_view(&state)
            .placement
            .replicas
            .contains(&backup));
        assert!(state.members.contains_key(&backup));
        assert_eq!((stream.primary, stream.epoch), (Some(primary), 1));
        assert!(
            state
                .transitions
                .iter()
                .any(|t| t.what.contains("its log failed: No space")),
            "{:?}",
            state.transitions
        );
        // The primary: the last other in-sync replica takes over in a new
        // epoch, and takes no tail from the failed replicas.
        assert_eq!(log_failed(&mut state, primary), Response::Done);
        let stream = &state.streams["s"];
        let next = stream.primary.unwrap();
        assert!(next != primary && next != backup, "{next}");
        assert_eq!(stream.epoch, 2);
        assert_eq!(stream.in_sync, vec![next]);
        assert!(!stream.is_recorded());
        assert_eq!(stream.live_view(&state).consider, vec![next]);
        // The only live in-sync replica stays, failed or not: the stream
        // has nowhere else to go. A former incarnation is not heard.
        assert!(matches!(log_failed(&mut state, next), Response::Ignored(_)));
        assert_eq!(state.streams["s"].in_sync, vec![next]);
        let stale = Command::LogFailed {
            name: "s".into(),
            server: next,
            join_view: state.members[&next].join_view + 100,
            reason: "late".into(),
        };
        assert!(matches!(state.apply(stale), Response::Ignored(_)));
        // The backup's server restarts with a log that works: a replica
        // again, it catches up and is in sync.
        join(&mut state, backup, 77);
        let stream = &state.streams["s"];
        assert!(
            !stream.failed.iter().any(|&(id, _)| id == backup),
            "{:?}",
            stream.failed
        );
        assert!(stream
            .live_view(&state)
            .placement
            .replicas
            .contains(&backup));
        let rejoined = Command::InSync {
            name: "s".into(),
            epoch: stream.epoch,
            server: backup,
            join_view: None,
        };
        assert_eq!(state.apply(rejoined), Response::Done);
        assert!(state.streams["s"].in_sync.contains(&backup));
    }

    #[test]
    fn a_spare_member_takes_the_place_of_a_replica_whose_log_failed() {
        let mut state = cluster(4);
        let placed = create_s(&mut state);
        let backup = *placed
            .replicas
            .iter()
            .find(|&&id| Some(id) != placed.primary)
            .unwrap();
        let spare = (1..=4).find(|id| !placed.replicas.contains(id)).unwrap();
        assert_eq!(log_failed(&mut state, backup), Response::Done);
        let replicas = state.streams["s"].live_view(&state).placement.replicas;
        assert!(
            replicas.contains(&spare) && !replicas.contains(&backup),
            "{replicas:?}"
        );
    }

    #[test]
    fn a_lost_primary_is_replaced_by_a_live_in_sync_replica_in_a_new_epoch() {
        let mut state = cluster(3);
        let placed = create_s(&mut state);
        let primary = placed.primary.unwrap();
        remove(&mut state, primary);
        let stream = &state.streams["s"];
        assert_eq!(stream.epoch, 2);
        let next = stream.primary.unwrap();
        assert_ne!(next, primary);
        assert!(!stream.in_sync.contains(&primary), "acks go on without it");
        assert!(!stream.is_recorded());
        assert!(!stream.epoch_members.contains(&primary));
        // The new primary stamps from 41, having taken both live logs.
        let backup = *stream.epoch_members.iter().find(|id| **id != next).unwrap();
        let started = Command::EpochStarted {
            name: "s".into(),
            epoch: 2,
            first_version: 41,
            members: stream.epoch_members.clone(),
        };
        assert_eq!(state.apply(started), Response::Done);
        // A backup whose process restarts before anyone noticed keeps its
        // place: its log is one the epoch took.
        join(&mut state, backup, 55);
        let stream = &state.streams["s"];
        assert!(stream.replicas.contains(&backup));
        assert_eq!(stream.truncate_after(backup), None);
        // The old primary left the set out of sync; back, it keeps what
        // epoch 1 wrote before epoch 2 began and copies the rest.
        join(&mut state, primary, 77);
        let stream = &state.streams["s"];
        assert!(stream.replicas.contains(&primary));
        assert_eq!(stream.truncate_after(primary), Some(40));
        assert_eq!(stream.truncate_after(next), None);
        assert!(stream.may_open(primary));
        assert_eq!(stream.primary, Some(next), "the primary stays");
        // A report from the process before this one does not count.
        let stale = Command::InSync {
            name: "s".into(),
            epoch: 2,
            server: primary,
            join_view: Some(1),
        };
        assert!(matches!(state.apply(stale), Response::Ignored(_)));
        assert!(!state.streams["s"].in_sync.contains(&primary));
        let view = state.members[&primary].join_view;
        let back = Command::InSync {
            name: "s".into(),
            epoch: 2,
            server: primary,
            join_view: Some(view),
        };
        assert_eq!(state.apply(back), Response::Done);
        assert!(state.streams["s"].in_sync.contains(&primary));
    }

    #[test]
    fn the_last_in_sync_replica_stays_in_sync_and_nobody_else_leads() {
        let mut state = cluster(2);
        state.apply(Command::CreateStream {
            name: "s".into(),
            config: config(2),
        });
        let primary = state.streams["s"].primary.unwrap();
        let backup = if primary == 1 { 2 } else { 1 };
        remove(&mut state, backup);
        remove(&mut state, primary);
        let stream = &state.streams["s"];
        assert_eq!(stream.in_sync, vec![primary]);
        assert_eq!(stream.primary, None);
        assert_eq!(stream.availability, Availability::NoPrimary);
        // The backup comes back first: it may lack acknowledged versions.
        join(&mut state, backup, 5);
        assert_eq!(state.streams["s"].primary, None);
        join(&mut state, primary, 6);
        assert_eq!(state.streams["s"].primary, Some(primary));
    }

    #[test]
    fn a_spare_refills_a_lost_replica_and_starts_empty() {
        let mut state = cluster(4);
        state.apply(Command::CreateStream {
            name: "s".into(),
            config: config(3),
        });
        let replicas = state.streams["s"].replicas.clone();
        let spare = (1..=4).find(|id| !replicas.contains(id)).unwrap();
        let lost = *replicas
            .iter()
            .find(|id| Some(**id) != state.streams["s"].primary)
            .unwrap();
        remove(&mut state, lost);
        let stream = &state.streams["s"];
        assert!(stream.replicas.contains(&spare) && !stream.replicas.contains(&lost));
        assert_eq!(stream.truncate_after(spare), Some(0), "an old copy goes");
        assert!(!stream.in_sync.contains(&spare));
    }

    #[test]
    fn a_requirement_degrades_the_stream_and_lifts_when_met_again() {
        let mut state = cluster(3);
        state.apply(Command::CreateStream {
            name: "s".into(),
            config: config(3),
        });
        let requirement = Requirement {
            roles: vec!["zone-3".into()],
            min_in_sync: 3,
            action: LossAction::Block { timeout_ms: 500 },
        };
        let set = Command::SetRequirement {
            name: "s".into(),
            requirement: Some(requirement),
        };
        assert_eq!(state.apply(set), Response::Done);
        assert_eq!(state.streams["s"].availability, Availability::Available);
        remove(&mut state, 3);
        match &state.streams["s"].availability {
            Availability::Degraded { action, why } => {
                assert_eq!(*action, LossAction::Block { timeout_ms: 500 });
                assert!(why.contains("zone-3") && why.contains("2 in-sync"), "{why}");
            }
            other => panic!("{other:?}"),
        }
        join(&mut state, 3, 9);
        let epoch = state.streams["s"].epoch;
        state.apply(Command::InSync {
            name: "s".into(),
            epoch,
            server: 3,
            join_view: None,
        });
        assert_eq!(state.streams["s"].availability, Availability::Available);
        let text: Vec<&str> = state.transitions.iter().map(|t| t.what.as_str()).collect();
        assert!(
            text.iter().any(|t| t.contains("block (up to 500 ms)")),
            "{text:?}"
        );
    }

    /// `reconnect`: the stream closes while its requirement is not met
    /// and reopens in a new epoch, under the same primary, once it is met
    /// again; `block` resumes in the same epoch.
    #[test]
    fn a_reconnect_stream_reopens_in_a_new_epoch_and_a_blocked_one_does_not() {
        for (action, reopens) in [
            (LossAction::Reconnect, true),
            (LossAction::Block { timeout_ms: 500 }, false),
        ] {
            let mut state = cluster(3);
            state.apply(Command::CreateStream {
                name: "s".into(),
                config: config(3),
            });
            let requirement = Requirement {
                roles: Vec::new(),
                min_in_sync: 3,
                action,
            };
            state.apply(Command::SetRequirement {
                name: "s".into(),
                requirement: Some(requirement),
            });
            let (epoch, primary) = (state.streams["s"].epoch, state.streams["s"].primary);
            let backup = if primary == Some(3) { 2 } else { 3 };
            remove(&mut state, backup);
            assert!(matches!(
                state.streams["s"].availability,
                Availability::Degraded { .. }
            ));
            assert_eq!(state.streams["s"].epoch, epoch, "closing keeps the epoch");
            join(&mut state, backup, 9);
            state.apply(Command::InSync {
                name: "s".into(),
                epoch,
                server: backup,
                join_view: None,
            });
            let stream = &state.streams["s"];
            assert_eq!(stream.availability, Availability::Available);
            assert_eq!(stream.primary, primary, "the same primary");
            let expected = if reopens { epoch + 1 } else { epoch };
            assert_eq!(stream.epoch, expected, "{action:?}");
            if reopens {
                // Every live replica's tail is taken in the new epoch.
                assert_eq!(stream.epoch_members.len(), 3);
                let text: Vec<&str> = state.transitions.iter().map(|t| t.what.as_str()).collect();
                assert!(
                    text.iter().any(|t| t.contains("reopened in epoch")),
                    "{text:?}"
                );
            }
        }
    }

    #[test]
    fn by_default_a_stream_needs_a_majority_of_its_replicas_in_sync() {
        let mut state = cluster(3);
        state.apply(Command::CreateStream {
            name: "s".into(),
            config: config(3),
        });
        let primary = state.streams["s"].primary.unwrap();
        let mut backups = (1..=3).filter(|id| *id != primary);
        let (first, second) = (backups.next().unwrap(), backups.next().unwrap());
        // One of three gone: two in sync, a majority; writes go on, and
        // the shrink is recorded.
        remove(&mut state, first);
        let stream = &state.streams["s"];
        assert_eq!(stream.availability, Availability::Available);
        assert!(stream.is_under_replicated());
        let text: Vec<&str> = state.transitions.iter().map(|t| t.what.as_str()).collect();
        assert!(
            text.iter()
                .any(|t| t.contains("left the in-sync set (2 of 3 replicas in sync)")),
            "{text:?}"
        );
        // Two of three gone: the primary alone is not a majority; writes
        // block, then are refused.
        remove(&mut state, second);
        match &state.streams["s"].availability {
            Availability::Degraded { action, why } => {
                assert_eq!(
                    *action,
                    LossAction::Block {
                        timeout_ms: DEFAULT_BLOCK_MS
                    }
                );
                assert!(why.contains("1 in-sync replicas of 2 required"), "{why}");
            }
            other => panic!("{other:?}"),
        }
        // Said explicitly, one in-sync replica is enough.
        let one = Requirement {
            roles: Vec::new(),
            min_in_sync: 1,
            action: LossAction::ReadOnly,
        };
        state.apply(Command::SetRequirement {
            name: "s".into(),
            requirement: Some(one),
        });
        assert_eq!(state.streams["s"].availability, Availability::Available);
        // Cleared, the default majority applies again.
        state.apply(Command::SetRequirement {
            name: "s".into(),
            requirement: None,
        });
        assert!(matches!(
            state.streams["s"].availability,
            Availability::Degraded { .. }
        ));
    }
}

#[cfg(test)]
mod gate_tests {
    use super::*;

    fn degraded(action: LossAction) -> Availability {
        Availability::Degraded {
            action,
            why: "1 in-sync replica of the 2 required".into(),
        }
    }

    /// The loss-action gate: open while available (or without a primary,
    /// where the replica refuses by itself), `read-only` refuses at once,
    /// `block` asks writers to wait until its timeout and then refuses,
    /// `reconnect` sends them away.
    #[test]
    fn the_gate_refuses_writes_as_the_loss_action_says() {
        assert_eq!(Availability::Available.write_refusal(10_000), None);
        assert_eq!(Availability::NoPrimary.write_refusal(10_000), None);
        let why = "1 in-sync replica of the 2 required".to_string();
        assert_eq!(
            degraded(LossAction::ReadOnly).write_refusal(0),
            Some(WriteRefusal::ReadOnly(why.clone()))
        );
        let block = degraded(LossAction::Block { timeout_ms: 500 });
        assert_eq!(
            block.write_refusal(0),
            Some(WriteRefusal::Blocked(why.clone()))
        );
        assert_eq!(
            block.write_refusal(499),
            Some(WriteRefusal::Blocked(why.clone()))
        );
        assert_eq!(
            block.write_refusal(500),
            Some(WriteRefusal::ReadOnly(format!(
                "{why}; blocked for more than 500 ms"
            )))
        );
        assert_eq!(
            degraded(LossAction::Reconnect).write_refusal(0),
            Some(WriteRefusal::Reconnect(why))
        );
    }
}
