//! [`Control`]: one server's Raft node, the requests it serves, and the
//! tasks that keep the view honest (membership heartbeats and the leader's
//! failure detector).

use std::collections::{BTreeMap, BTreeSet};
use std::io::Cursor;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use openraft::error::{ClientWriteError, InitializeError, RaftError};
use openraft::{BasicNode, ChangeMembers, Raft, RaftMetrics, Snapshot};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};

use crate::config::ControlConfig;
use crate::detector::Detector;
use crate::error::ControlError;
use crate::log_store::LogStore;
use crate::machine::{Proposal, StateMachine};
use crate::network::{Network, Peers};
use crate::state::{Command, ControlState, Response, ServerId};
use crate::wire::{
    read_message, write_message, Committed, RaftErrorText, Refusal, Reply, Request,
    CONTROL_MESSAGE_MAX,
};
use crate::TypeConfig;

/// How long `propose` and `add_voter` keep trying to reach a leader.
const COMMIT_DEADLINE: Duration = Duration::from_secs(10);
/// The pause between two tries while no leader answers.
const RETRY_PAUSE: Duration = Duration::from_millis(50);

/// One server's member of the control plane. Cloning it is cheap; every
/// clone drives the same Raft node.
#[derive(Clone)]
pub struct Control {
    inner: Arc<Inner>,
}

struct Inner {
    id: ServerId,
    config: ControlConfig,
    raft: Raft<TypeConfig>,
    state: watch::Receiver<Arc<ControlState>>,
    /// The index of the last entry this server's state machine applied.
    applied: watch::Receiver<Option<u64>>,
    /// The initial voters' addresses: whom to ask while no leader is known.
    seeds: BTreeMap<ServerId, String>,
    peers: Peers,
    detector: Mutex<Detector>,
    stopped: watch::Sender<bool>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

/// What `propose` and `add_voter` ask of the leader.
#[derive(Clone, Debug)]
enum Operation {
    Propose(Proposal),
    AddVoter { id: ServerId, address: String },
    RemoveVoter { id: ServerId },
}

impl Operation {
    fn request(&self) -> Request {
        match self {
            Operation::Propose(proposal) => Request::Forward(proposal.clone()),
            Operation::AddVoter { id, address } => Request::AddVoter {
                id: *id,
                address: address.clone(),
            },
            Operation::RemoveVoter { id } => Request::RemoveVoter { id: *id },
        }
    }

    /// For people: what did not happen.
    fn describe(&self) -> String {
        match self {
            Operation::Propose(proposal) => format!("commit {}", command_name(&proposal.command)),
            Operation::AddVoter { id, address } => {
                format!("add server {id} at {address} as a voter")
            }
            Operation::RemoveVoter { id } => format!("retire server {id} from the voters"),
        }
    }
}

fn command_name(command: &Command) -> String {
    match command {
        Command::Join { id, .. } => format!("the join of server {id}"),
        Command::Remove { id, .. } => format!("the removal of server {id}"),
        Command::CreateStream { name, .. } => format!("the creation of stream {name:?}"),
        Command::DeleteStream { name } => format!("the deletion of stream {name:?}"),
        Command::SetRequirement { name, .. } => format!("the requirement of stream {name:?}"),
        Command::EpochStarted { name, .. } => format!("an epoch start of stream {name:?}"),
        Command::InSync { name, .. } => format!("an in-sync report of stream {name:?}"),
        Command::LogFailed { name, server, .. } => {
            format!("the failed log of server {server} for stream {name:?}")
        }
    }
}

/// Where the next try of an operation goes.
enum Route {
    /// This server leads.
    Local,
    /// To the server at this address.
    Remote(String),
    /// Nobody to ask yet.
    Nowhere,
}

impl Control {
    /// Opens (or creates) the Raft storage in `config.dir` and starts the
    /// node. `voters` maps every initial voter's id to its address (this
    /// server included). A node with no Raft state whose id is the
    /// smallest voter id forms the cluster with all `voters`; the others
    /// wait to be contacted. A node that has state never forms it again.
    pub async fn start(
        config: ControlConfig,
        voters: BTreeMap<ServerId, String>,
    ) -> Result<Control, ControlError> {
        let id = config.id;
        let raft_config = config.raft_config()?;
        if let Some(listed) = voters.get(&id).filter(|listed| **listed != config.address) {
            return Err(ControlError::Config {
                id,
                detail: format!(
                    "the voters list this server at {listed}, its address is {}",
                    config.address
                ),
            });
        }
        let dir = config.dir.clone();
        let opened = tokio::task::spawn_blocking(move || {
            let log = LogStore::open(&dir)?;
            let (machine, published) = StateMachine::open(&dir)?;
            Ok::<_, ControlError>((log, machine, published))
        })
        .await
        .map_err(|error| ControlError::Start {
            id,
            detail: format!("opening the storage: {error}"),
        })?;
        let (log, machine, published) = opened?;
        let pristine = log.is_pristine() && published.applied.borrow().is_none();
        let network = Network::new(id, config.rpc_timeout, config.dialer.clone());
        let raft = Raft::new(u64::from(id), Arc::new(raft_config), network, log, machine)
            .await
            .map_err(|error| ControlError::Start {
                id,
                detail: error.to_string(),
            })?;
        let forms_cluster = voters.keys().next() == Some(&id);
        if pristine && forms_cluster {
            if let Err(error) = initialize(&raft, id, &voters).await {
                let _ = raft.shutdown().await;
                return Err(error);
            }
        }
        let (stopped, _) = watch::channel(false);
        let peers = Peers::new(id, config.dialer.clone());
        let inner = Arc::new(Inner {
            id,
            detector: Mutex::new(Detector::new(config.suspect_timeout)),
            config,
            raft,
            state: published.state,
            applied: published.applied,
            seeds: voters,
            peers,
            stopped,
            tasks: Mutex::new(Vec::new()),
        });
        let tasks = vec![
            tokio::spawn(send_heartbeats(Arc::downgrade(&inner))),
            tokio::spawn(detect_failures(Arc::downgrade(&inner))),
        ];
        *inner.tasks.lock().expect("tasks lock") = tasks;
        Ok(Control { inner })
    }

    /// Commits a command and returns its response once this server's state
    /// machine has applied it, so [`Control::state`] shows its effect. A
    /// follower forwards it to the leader; it is tried again across leader
    /// changes for about 10 s, and applied once however often it was tried.
    pub async fn propose(&self, command: Command) -> Result<Response, ControlError> {
        let proposal = Proposal::new(command);
        let committed = self.until_committed(Operation::Propose(proposal)).await?;
        Ok(committed.response)
    }

    /// The applied state; it changes after every apply and after a
    /// snapshot is installed.
    pub fn state(&self) -> watch::Receiver<Arc<ControlState>> {
        self.inner.state.clone()
    }

    /// The current Raft leader as this server knows it.
    pub fn leader(&self) -> Option<ServerId> {
        let metrics = self.inner.raft.metrics();
        let leader = metrics.borrow().current_leader;
        leader.and_then(|id| ServerId::try_from(id).ok())
    }

    /// Adds a server that was not an initial voter: first as a learner
    /// that catches up, then as a voter. It can be called on any server,
    /// including the new one, which asks the voters it was started with.
    /// Returns once this server has applied the change.
    pub async fn add_voter(&self, id: ServerId, address: String) -> Result<(), ControlError> {
        self.until_committed(Operation::AddVoter { id, address })
            .await
            .map(|_| ())
    }

    /// Takes a server that has left the view for good out of the voters,
    /// so the cluster's majority no longer counts it. Refused while it is
    /// a member of the view, and for the last voter.
    pub async fn remove_voter(&self, id: ServerId) -> Result<(), ControlError> {
        self.until_committed(Operation::RemoveVoter { id })
            .await
            .map(|_| ())
    }

    /// The Raft voters, as this server knows them.
    pub fn voters(&self) -> Vec<ServerId> {
        let membership = self.inner.raft.metrics().borrow().membership_config.clone();
        membership
            .voter_ids()
            .filter_map(|id| ServerId::try_from(id).ok())
            .collect()
    }

    /// Serves one inbound control connection whose `ControlHello` has been
    /// read, until the peer closes it, it breaks, or this server stops.
    pub async fn serve(&self, stream: TcpStream) {
        self.serve_with(net::Link::Plain(stream), Vec::new()).await;
    }

    /// As [`Control::serve`], for a connection whose first bytes after
    /// the hello were already read (`read_ahead`) by the accepting server.
    pub async fn serve_with(&self, stream: net::Link, read_ahead: Vec<u8>) {
        let (reader, mut writer) = stream.into_split();
        let mut reader = Cursor::new(read_ahead).chain(reader);
        let mut stopped = self.inner.stopped.subscribe();
        loop {
            let read = tokio::select! {
                read = read_message::<_, Request>(&mut reader, CONTROL_MESSAGE_MAX) => read,
                _ = stopped.wait_for(|stopped| *stopped) => return,
            };
            // A broken or garbled connection is dropped; the peer dials again.
            let Ok(Some(request)) = read else {
                return;
            };
            let reply = tokio::select! {
                reply = self.answer(request) => reply,
                _ = stopped.wait_for(|stopped| *stopped) => return,
            };
            if write_message(&mut writer, &reply).await.is_err() {
                return;
            }
        }
    }

    /// Stops the node and its tasks; proposals under way fail with
    /// [`ControlError::Stopped`].
    pub async fn shutdown(&self) {
        self.inner.stopped.send_replace(true);
        let tasks = std::mem::take(&mut *self.inner.tasks.lock().expect("tasks lock"));
        for task in tasks {
            task.abort();
        }
        let _ = self.inner.raft.shutdown().await;
    }

    fn stopped_error(&self) -> ControlError {
        ControlError::Stopped { id: self.inner.id }
    }

    fn is_stopped(&self) -> bool {
        *self.inner.stopped.borrow()
    }

    /// Tries `operation` on the leader until it is committed and applied
    /// here, or the deadline passes.
    async fn until_committed(&self, operation: Operation) -> Result<Committed, ControlError> {
        let started = Instant::now();
        let deadline = started + COMMIT_DEADLINE;
        let mut hint: Option<String> = None;
        let mut seed_turn = 0usize;
        loop {
            if self.is_stopped() {
                return Err(self.stopped_error());
            }
            let outcome = match self.route(&mut hint, &mut seed_turn) {
                Route::Local => self.lead(&operation, deadline).await,
                Route::Remote(address) => self.forward(&operation, &address, deadline).await,
                Route::Nowhere => Err(Refusal::Failed(
                    "no leader known and no other voter to ask".to_string(),
                )),
            };
            let last = match outcome {
                Ok(committed) => {
                    self.wait_applied(committed.index, started, deadline)
                        .await?;
                    return Ok(committed);
                }
                Err(Refusal::NotLeader { leader }) => {
                    let last = match &leader {
                        Some((id, address)) => format!("redirected to server {id} at {address}"),
                        None => "asked a server that knows no leader".to_string(),
                    };
                    hint = leader.map(|(_, address)| address);
                    last
                }
                Err(Refusal::Failed(why)) => why,
                Err(Refusal::Refused(detail)) => {
                    return Err(ControlError::Refused {
                        id: self.inner.id,
                        what: operation.describe(),
                        detail,
                    })
                }
                Err(Refusal::Stopped) if self.is_stopped() => return Err(self.stopped_error()),
                Err(Refusal::Stopped) => "the server asked is stopping".to_string(),
            };
            if Instant::now() + RETRY_PAUSE >= deadline {
                return Err(ControlError::Unavailable {
                    id: self.inner.id,
                    what: operation.describe(),
                    waited_ms: started.elapsed().as_millis() as u64,
                    last,
                });
            }
            tokio::time::sleep(RETRY_PAUSE).await;
        }
    }

    fn route(&self, hint: &mut Option<String>, seed_turn: &mut usize) -> Route {
        let metrics = self.inner.raft.metrics();
        let metrics = metrics.borrow();
        match metrics.current_leader {
            Some(leader) if leader == u64::from(self.inner.id) => return Route::Local,
            Some(leader) => {
                if let Some(node) = metrics.membership_config.membership().get_node(&leader) {
                    return Route::Remote(node.addr.clone());
                }
            }
            None => {}
        }
        if let Some(address) = hint.take() {
            return Route::Remote(address);
        }
        let seeds: Vec<&String> = self
            .inner
            .seeds
            .iter()
            .filter(|(id, _)| **id != self.inner.id)
            .map(|(_, address)| address)
            .collect();
        if seeds.is_empty() {
            return Route::Nowhere;
        }
        *seed_turn += 1;
        Route::Remote(seeds[*seed_turn % seeds.len()].clone())
    }

    /// Sends `operation` to the server at `address`.
    async fn forward(
        &self,
        operation: &Operation,
        address: &str,
        deadline: Instant,
    ) -> Result<Committed, Refusal> {
        // A membership change waits for the new server to catch up, which
        // may take longer than one request's timeout.
        let timeout = match operation {
            Operation::Propose(_) => self.inner.config.rpc_timeout,
            Operation::AddVoter { .. } | Operation::RemoveVoter { .. } => {
                deadline.saturating_duration_since(Instant::now())
            }
        };
        let reply = self
            .inner
            .peers
            .request(address, &operation.request(), timeout)
            .await
            .map_err(|error| Refusal::Failed(error.to_string()))?;
        match reply {
            Reply::Committed(outcome) => outcome,
            other => Err(Refusal::Failed(format!(
                "{address} answered out of turn: {other:?}"
            ))),
        }
    }

    /// Carries out `operation` on this server, which believes it leads.
    async fn lead(&self, operation: &Operation, deadline: Instant) -> Result<Committed, Refusal> {
        let work = async {
            match operation {
                Operation::Propose(proposal) => self.write(proposal.clone()).await,
                Operation::AddVoter { id, address } => self.add(*id, address).await,
                Operation::RemoveVoter { id } => self.retire(*id).await,
            }
        };
        match tokio::time::timeout_at(deadline, work).await {
            Ok(outcome) => outcome,
            Err(_) => Err(Refusal::Failed(format!(
                "server {} led but did not commit in time",
                self.inner.id
            ))),
        }
    }

    async fn write(&self, proposal: Proposal) -> Result<Committed, Refusal> {
        match self.inner.raft.client_write(proposal).await {
            Ok(written) => Ok(Committed {
                response: written.data,
                index: written.log_id.index,
            }),
            Err(error) => Err(self.refusal(error)),
        }
    }

    /// Makes `id` a learner, waits for it to catch up, then a voter.
    async fn add(&self, id: ServerId, address: &str) -> Result<Committed, Refusal> {
        let node_id = u64::from(id);
        let membership = self.inner.raft.metrics().borrow().membership_config.clone();
        if let Some(node) = membership.membership().get_node(&node_id) {
            if node.addr != address {
                return Err(Refusal::Refused(format!(
                    "server {id} is already in the cluster at {}",
                    node.addr
                )));
            }
            let voter = membership.voter_ids().any(|voter| voter == node_id);
            if voter && membership.membership().get_joint_config().len() == 1 {
                let index = membership.log_id().map_or(0, |log_id| log_id.index);
                return Ok(Committed {
                    response: Response::Done,
                    index,
                });
            }
        }
        let node = BasicNode {
            addr: address.to_string(),
        };
        self.inner
            .raft
            .add_learner(node_id, node, true)
            .await
            .map_err(|error| self.refusal(error))?;
        let changed = self
            .inner
            .raft
            .change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([node_id])), false)
            .await
            .map_err(|error| self.refusal(error))?;
        Ok(Committed {
            response: Response::Done,
            index: changed.log_id.index,
        })
    }

    /// Takes `id` out of the voters (and the Raft nodes), once it has left
    /// the view: a member still in the view is refused, and so is the last
    /// voter.
    async fn retire(&self, id: ServerId) -> Result<Committed, Refusal> {
        if self.inner.state.borrow().members.contains_key(&id) {
            return Err(Refusal::Refused(format!(
                "server {id} is a member of the current view; stop it (and wait for it to be removed) first"
            )));
        }
        let node_id = u64::from(id);
        let membership = self.inner.raft.metrics().borrow().membership_config.clone();
        let voters: BTreeSet<u64> = membership.voter_ids().collect();
        if !voters.contains(&node_id) && membership.membership().get_node(&node_id).is_none() {
            let index = membership.log_id().map_or(0, |log_id| log_id.index);
            return Ok(Committed {
                response: Response::Done,
                index,
            });
        }
        if voters.len() == 1 && voters.contains(&node_id) {
            return Err(Refusal::Refused(format!(
                "server {id} is the last voter; the cluster needs one"
            )));
        }
        let changed = self
            .inner
            .raft
            .change_membership(
                ChangeMembers::RemoveVoters(BTreeSet::from([node_id])),
                false,
            )
            .await
            .map_err(|error| self.refusal(error))?;
        Ok(Committed {
            response: Response::Done,
            index: changed.log_id.index,
        })
    }

    fn refusal(&self, error: RaftError<u64, ClientWriteError<u64, BasicNode>>) -> Refusal {
        match error {
            RaftError::APIError(ClientWriteError::ForwardToLeader(forward)) => {
                let leader = forward
                    .leader_id
                    .and_then(|id| ServerId::try_from(id).ok())
                    .zip(forward.leader_node.map(|node| node.addr));
                Refusal::NotLeader { leader }
            }
            RaftError::APIError(ClientWriteError::ChangeMembershipError(error)) => {
                Refusal::Failed(format!("membership change: {error}"))
            }
            RaftError::Fatal(_) => Refusal::Stopped,
        }
    }

    /// Waits until this server's state machine has applied `index`.
    async fn wait_applied(
        &self,
        index: u64,
        started: Instant,
        deadline: Instant,
    ) -> Result<(), ControlError> {
        let mut applied = self.inner.applied.clone();
        let mut stopped = self.inner.stopped.subscribe();
        let reached = tokio::select! {
            reached = tokio::time::timeout_at(
                deadline,
                applied.wait_for(|applied| applied.is_some_and(|applied| applied >= index)),
            ) => reached,
            _ = stopped.wait_for(|stopped| *stopped) => return Err(self.stopped_error()),
        };
        match reached {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(_)) => Err(self.stopped_error()),
            Err(_) => Err(ControlError::Unavailable {
                id: self.inner.id,
                what: format!("apply log entry {index}, which the leader committed"),
                waited_ms: started.elapsed().as_millis() as u64,
                last: format!(
                    "this server has applied up to {:?}",
                    *self.inner.applied.borrow()
                ),
            }),
        }
    }

    /// The reply to one request from a peer.
    async fn answer(&self, request: Request) -> Reply {
        let raft = &self.inner.raft;
        match request {
            Request::AppendEntries(rpc) => {
                Reply::AppendEntries(raft.append_entries(rpc).await.map_err(RaftErrorText::of))
            }
            Request::Vote(rpc) => Reply::Vote(raft.vote(rpc).await.map_err(RaftErrorText::of)),
            Request::Snapshot { vote, meta, image } => {
                let data = serde_json::to_vec(&image).expect("images serialize");
                let snapshot = Snapshot {
                    meta,
                    snapshot: Box::new(Cursor::new(data)),
                };
                let installed = raft.install_full_snapshot(vote, snapshot).await;
                Reply::Snapshot(installed.map_err(RaftErrorText::of))
            }
            Request::Forward(proposal) => {
                let deadline = Instant::now() + self.inner.config.rpc_timeout;
                Reply::Committed(self.lead(&Operation::Propose(proposal), deadline).await)
            }
            Request::AddVoter { id, address } => {
                let deadline = Instant::now() + COMMIT_DEADLINE;
                let operation = Operation::AddVoter { id, address };
                Reply::Committed(self.lead(&operation, deadline).await)
            }
            Request::RemoveVoter { id } => {
                let deadline = Instant::now() + COMMIT_DEADLINE;
                Reply::Committed(self.lead(&Operation::RemoveVoter { id }, deadline).await)
            }
            Request::Heartbeat { id, join_view } => Reply::Heartbeat(self.heard(id, join_view)),
        }
    }

    fn heard(&self, id: ServerId, join_view: u64) -> Result<(), Refusal> {
        let metrics = self.inner.raft.metrics();
        let metrics = metrics.borrow();
        if metrics.current_leader != Some(u64::from(self.inner.id)) {
            return Err(Refusal::NotLeader {
                leader: known_leader(&metrics),
            });
        }
        let now = Instant::now().into_std();
        self.inner
            .detector
            .lock()
            .expect("detector lock")
            .heard(id, join_view, now);
        Ok(())
    }
}

fn known_leader(metrics: &RaftMetrics<u64, BasicNode>) -> Option<(ServerId, String)> {
    let leader = metrics.current_leader?;
    let node = metrics.membership_config.membership().get_node(&leader)?;
    Some((ServerId::try_from(leader).ok()?, node.addr.clone()))
}

/// Forms the cluster from `voters` on a pristine node.
async fn initialize(
    raft: &Raft<TypeConfig>,
    id: ServerId,
    voters: &BTreeMap<ServerId, String>,
) -> Result<(), ControlError> {
    let nodes: BTreeMap<u64, BasicNode> = voters
        .iter()
        .map(|(voter, address)| {
            let node = BasicNode {
                addr: address.clone(),
            };
            (u64::from(*voter), node)
        })
        .collect();
    match raft.initialize(nodes).await {
        Ok(()) | Err(RaftError::APIError(InitializeError::NotAllowed(_))) => Ok(()),
        Err(error) => Err(ControlError::Start {
            id,
            detail: format!("forming the cluster: {error}"),
        }),
    }
}

/// Every `heartbeat_interval`, a member tells the leader it is alive.
async fn send_heartbeats(inner: Weak<Inner>) {
    let Some(interval) = inner.upgrade().map(|inner| inner.config.heartbeat_interval) else {
        return;
    };
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        if *inner.stopped.borrow() {
            return;
        }
        let Some(join_view) = inner
            .state
            .borrow()
            .members
            .get(&inner.id)
            .map(|member| member.join_view)
        else {
            continue;
        };
        let leader = known_leader(&inner.raft.metrics().borrow());
        let Some((leader, address)) = leader else {
            continue;
        };
        if leader == inner.id {
            continue;
        }
        let request = Request::Heartbeat {
            id: inner.id,
            join_view,
        };
        // A lost heartbeat is made up by the next one; the leader only
        // acts after a whole suspect timeout of silence.
        let _ = inner
            .peers
            .heartbeat(&address, &request, inner.config.rpc_timeout)
            .await;
    }
}

/// On the leader, every `heartbeat_interval`: remove the members it has
/// not heard from for `suspect_timeout`.
async fn detect_failures(inner: Weak<Inner>) {
    let Some(interval) = inner.upgrade().map(|inner| inner.config.heartbeat_interval) else {
        return;
    };
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut led_term: Option<u64> = None;
    loop {
        ticker.tick().await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        if *inner.stopped.borrow() {
            return;
        }
        let (leader, term) = {
            let metrics = inner.raft.metrics();
            let metrics = metrics.borrow();
            (metrics.current_leader, metrics.current_term)
        };
        if leader != Some(u64::from(inner.id)) {
            led_term = None;
            continue;
        }
        let state = inner.state.borrow().clone();
        let now = Instant::now().into_std();
        let suspects = {
            let mut detector = inner.detector.lock().expect("detector lock");
            if led_term != Some(term) {
                detector.lead(now, &state.members);
                led_term = Some(term);
            }
            detector.suspects(now, &state.members, inner.id)
        };
        for suspect in suspects {
            let reason = format!("no heartbeat for {} ms", suspect.silent.as_millis());
            tracing::warn!(
                "control: removing server {} (joined in view {}): {reason}",
                suspect.id,
                suspect.join_view
            );
            let proposal = Proposal::new(Command::Remove {
                id: suspect.id,
                join_view: suspect.join_view,
                reason,
            });
            let raft = inner.raft.clone();
            let timeout = inner.config.suspect_timeout;
            let detector = Arc::downgrade(&inner);
            // A removal that did not commit is tried again at a later tick;
            // a repeated one is ignored by the state machine.
            tokio::spawn(async move {
                let written = tokio::time::timeout(timeout, raft.client_write(proposal)).await;
                if !matches!(written, Ok(Ok(_))) {
                    if let Some(inner) = detector.upgrade() {
                        let mut detector = inner.detector.lock().expect("detector lock");
                        detector.unname(suspect.id, suspect.join_view);
                    }
                }
            });
        }
    }
}
