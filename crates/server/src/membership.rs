//! A multi-server cluster's membership, as the control plane agrees it:
//! joining, opening the streams found on disk once the view is known,
//! and following every change of placement (failover, refill, in-sync
//! sets, epoch records) on this server's replicas.
//!
//! Order at start: the control plane opens (Raft, from its folder); this
//! process joins, which makes it a new member with a new join view (its
//! incarnation, which its peer links announce); only then are its streams
//! opened, each cut back to the versions the cluster agrees with
//! (`StreamPlacement::truncate_after`), and placed as the control plane
//! says. Until then the server answers clients with `Busy`.
//!
//! A replica placed here that cannot be made (a disk error, no file
//! descriptor left) is tried again on a timer, 250 ms after the failure
//! and then at doubling waits up to 8 s, and at every change of the
//! state: its stream waits for it, and nothing else may change the
//! state to try it again.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use control::{Command, Control, ControlConfig, ControlState, Response};
use tokio::sync::watch;

use crate::replication::ControlEvent;
use crate::state::ServerState;
use crate::stream::Stream;

/// The first wait before a stream event's proposal is tried again; each
/// failure after it doubles the wait, up to the cap. There is no last
/// try: the stream may wait on the event (a failed log's replica stays
/// in sync until the control plane hears of it), so it is proposed
/// until the control plane takes it or it no longer matters.
const EVENT_RETRY_AFTER: Duration = Duration::from_millis(50);
const EVENT_RETRY_AFTER_MAX: Duration = Duration::from_secs(2);
/// How long a proposal goes untaken before a warning says so (once).
const EVENT_WARN_AFTER: Duration = Duration::from_secs(30);
/// The first wait before a replica that could not be made is tried
/// again; each failure after it doubles the wait, up to the cap.
const REMAKE_AFTER: Duration = Duration::from_millis(250);
const REMAKE_AFTER_MAX: Duration = Duration::from_secs(8);

/// Runs the membership of `server` until `stop` fires.
pub(crate) async fn run(server: Arc<ServerState>, mut stop: watch::Receiver<bool>) {
    let Some(control) = start_control(&server).await else {
        return;
    };
    let _ = server.control.set(control.clone());
    let joined = match become_voter(&server, &control, &mut stop).await {
        true => join(&server, &control, &mut stop).await,
        false => None,
    };
    let Some(view) = joined else {
        control.shutdown().await;
        return;
    };
    server.router.set_incarnation(view);
    server.router.start_links(stop.clone());
    let state = Arc::clone(&control.state().borrow());
    open_pending_apart(&server, Arc::clone(&state)).await;
    let mut applied = HashSet::new();
    let mut remake = Remake::default();
    remake.after(follow(&server, &state, &mut applied).await);
    server.ready.send_replace(true);
    tracing::info!(
        "server {} joined the cluster in view {view} ({} members)",
        server.config.cluster.me,
        state.members.len()
    );
    // Transitions from here on are logged as they are applied.
    let mut noted = state.transitions.back().cloned();
    let mut events = server.router.take_events().expect("membership runs once");
    let proposing = Proposing::default();
    let mut watched = control.state();
    loop {
        // `None`: the wait to make a replica again has passed.
        let woke = tokio::select! {
            _ = stop.wait_for(|s| *s) => break,
            changed = watched.changed() => Some(changed.is_ok()),
            Some(event) = events.recv() => {
                proposing.start(&server, &control, event);
                continue;
            }
            _ = remake.due() => None,
        };
        let Some(changed) = woke else {
            let state = Arc::clone(&watched.borrow());
            remake.after(follow(&server, &state, &mut applied).await);
            continue;
        };
        if !changed {
            break;
        }
        let state = Arc::clone(&watched.borrow_and_update());
        log_transitions(&state, &mut noted);
        if removed(&state, server.config.cluster.me, view) {
            tracing::warn!(
                "server {} joined in view {view} was removed from the view (now view {}); \
                 closing to join again as a new member",
                server.config.cluster.me,
                state.view
            );
            server.ready.send_replace(false);
            server.removed.send_replace(true);
            break;
        }
        remake.after(follow(&server, &state, &mut applied).await);
    }
    control.shutdown().await;
}

/// When `follow` tries again the replicas placed here that it could not
/// make: never while every one is made, else after a wait that doubles
/// with each failure in a row.
#[derive(Default)]
struct Remake {
    at: Option<tokio::time::Instant>,
    wait: Duration,
}

impl Remake {
    /// Notes a `follow`'s outcome: whether a replica is still unmade.
    fn after(&mut self, unmade: bool) {
        if !unmade {
            *self = Remake::default();
            return;
        }
        self.wait = (self.wait * 2).clamp(REMAKE_AFTER, REMAKE_AFTER_MAX);
        self.at = Some(tokio::time::Instant::now() + self.wait);
    }

    /// Ready once the wait has passed; pending forever while nothing is
    /// to be made again.
    async fn due(&self) {
        match self.at {
            Some(at) => tokio::time::sleep_until(at).await,
            None => std::future::pending().await,
        }
    }
}

/// Logs each transition of `state` after `noted` (the last one logged)
/// as an event with its view and kind: `warn` for what an operator must
/// look at (a member left, a replica fell out of the in-sync set, a
/// stream without a live in-sync replica, a requirement unmet), `info`
/// for the rest (joins, failovers, epochs, catching up, reopening).
fn log_transitions(state: &ControlState, noted: &mut Option<control::Transition>) {
    let start = noted
        .as_ref()
        .and_then(|last| state.transitions.iter().rposition(|t| t == last))
        .map_or(0, |index| index + 1);
    for transition in state.transitions.iter().skip(start) {
        let (kind, warn) = transition_kind(&transition.what);
        let view = transition.view;
        if warn {
            tracing::warn!(view, kind, "{}", transition.what);
        } else {
            tracing::info!(view, kind, "{}", transition.what);
        }
    }
    *noted = state.transitions.back().cloned();
}

/// A transition's kind, from its text, and whether it is a warning.
fn transition_kind(what: &str) -> (&'static str, bool) {
    const KINDS: [(&str, &str, bool); 10] = [
        (" left the in-sync set", "in-sync-shrunk", true),
        (" left: ", "member-left", true),
        ("no live in-sync replica", "no-primary", true),
        (" required", "requirement-unmet", true),
        (" failed over", "failover", false),
        (" reopened in epoch", "reopened", false),
        (" stamps from version", "epoch-started", false),
        (" is in sync", "in-sync", false),
        (" joined", "member-joined", false),
        (" added to the replica set", "replica-added", false),
    ];
    KINDS
        .iter()
        .find(|(text, _, _)| what.contains(text))
        .map_or(("change", false), |&(_, kind, warn)| (kind, warn))
}

/// Whether the cluster removed the incarnation of `me` that joined in
/// view `joined`: the state has seen that join (its view is at least
/// `joined`) and holds no member `me` of that view. A state that has not
/// caught up with the join yet says nothing.
pub(crate) fn removed(state: &ControlState, me: control::state::ServerId, joined: u64) -> bool {
    state.view >= joined && state.members.get(&me).map(|m| m.join_view) != Some(joined)
}

/// Starts this server's control plane, with the configured servers as
/// the voters it knows.
async fn start_control(server: &ServerState) -> Option<Control> {
    let cluster = &server.config.cluster;
    let me = cluster.me;
    let mut voters = BTreeMap::new();
    voters.insert(me, server.address());
    for peer in &cluster.peers {
        voters.insert(peer.id, peer.address.clone());
    }
    let mut config =
        ControlConfig::new(me, server.address(), server.config.data_dir.join("control"));
    config.heartbeat_interval = cluster.heartbeat_interval;
    config.suspect_timeout = cluster.suspect_timeout;
    config.dialer = server.router.dialer.clone();
    match Control::start(config, voters).await {
        Ok(control) => Some(control),
        Err(error) => {
            tracing::warn!("the control plane did not start: {error}");
            None
        }
    }
}

/// Makes this server a voter: a server the others were not configured
/// with becomes one through the servers it was given as peers; for one
/// that already is, this is a no-op once a leader answers. `false` when
/// the server stops first.
async fn become_voter(
    server: &ServerState,
    control: &Control,
    stop: &mut watch::Receiver<bool>,
) -> bool {
    let me = server.config.cluster.me;
    loop {
        let added = tokio::select! {
            added = control.add_voter(me, server.address()) => added,
            _ = stop.wait_for(|s| *s) => return false,
        };
        match added {
            Ok(()) => return true,
            Err(error @ control::ControlError::Refused { .. }) => {
                // Listed under another spelling of its address: it is a
                // voter already, or an operator has to look.
                tracing::warn!("{error}; joining as configured");
                return true;
            }
            Err(control::ControlError::Stopped { .. }) => return false,
            Err(error) => {
                tracing::warn!("joining the control plane: {error}; retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

/// Joins the view as a new member (a new incarnation); returns the view
/// it joined in, or `None` when the server stops first.
async fn join(
    server: &ServerState,
    control: &Control,
    stop: &mut watch::Receiver<bool>,
) -> Option<u64> {
    let cluster = &server.config.cluster;
    let join = Command::Join {
        id: cluster.me,
        address: server.address(),
        roles: cluster.roles.clone(),
        admin_only: cluster.admin_only,
        nonce: proto::random_u128() | 1,
    };
    loop {
        let attempt = tokio::select! {
            attempt = control.propose(join.clone()) => attempt,
            _ = stop.wait_for(|s| *s) => return None,
        };
        match attempt {
            Ok(Response::Joined { view }) => return Some(view),
            Ok(other) => {
                tracing::warn!("joining the cluster was refused: {other:?}; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// [`open_pending`] on a thread that may block.
async fn open_pending_apart(server: &Arc<ServerState>, state: Arc<ControlState>) {
    let server = Arc::clone(server);
    let _ = tokio::task::spawn_blocking(move || open_pending(&server, &state)).await;
}

/// Opens the streams found on disk, each cut back to what the cluster
/// agrees with and placed as the control plane says. Blocking disk work.
fn open_pending(server: &Arc<ServerState>, state: &ControlState) {
    let me = server.config.cluster.me;
    let pending = std::mem::take(&mut *server.pending.lock().expect("pending lock"));
    for (meta, folder) in pending {
        if let Some(placed) = state.streams.get(&meta.name).filter(|p| p.id == meta.id) {
            if placed.replicas.contains(&me) && !placed.may_open(me) {
                // The new primary does not wait for this copy: open it once
                // the epoch's record says where to cut it.
                server
                    .pending
                    .lock()
                    .expect("pending lock")
                    .push((meta, folder));
                continue;
            }
        }
        let Some(placed) = state.streams.get(&meta.name).filter(|p| p.id == meta.id) else {
            tracing::warn!(
                "stream {:?} in {} is not in the cluster's placement; left closed",
                meta.name,
                folder.display()
            );
            continue;
        };
        if !placed.replicas.contains(&me) {
            tracing::warn!(
                "this server is no longer a replica of {:?}; its copy is left closed",
                meta.name
            );
            continue;
        }
        if let Some(after) = placed.truncate_after(me) {
            if meta.durability != "memory" && !cut_back(server, &meta, &folder, after) {
                continue;
            }
        }
        let placement = placed.live_view(state).placement;
        match Stream::open(
            &meta,
            &folder,
            &server.config,
            Arc::clone(&server.router),
            Some(placement),
        ) {
            Ok(stream) => {
                stream.recover_senders();
                server.insert_opened(Arc::new(stream))
            }
            // Still placed here: `follow` sets the copy aside and makes
            // a new replica (`ServerState::create_replica`).
            Err(reason) => tracing::warn!("stream {:?} cannot be opened: {reason}", meta.name),
        }
    }
}

/// Brings this server's replicas in line with the control plane's state;
/// returns whether a replica placed here could not be made (to be tried
/// again, `Remake`).
async fn follow(
    server: &Arc<ServerState>,
    state: &ControlState,
    applied: &mut HashSet<String>,
) -> bool {
    let me = server.config.cluster.me;
    let mut unmade = false;
    // Servers that joined without being in this one's configuration.
    for member in state.members.values() {
        server.router.add_peer(member.id, &member.address);
    }
    let waiting = !server.pending.lock().expect("pending lock").is_empty();
    if waiting {
        open_pending_apart(server, Arc::new(state.clone())).await;
    }
    for placed in state.streams.values() {
        if !placed.replicas.contains(&me) || !state.members.contains_key(&me) {
            continue;
        }
        let view = placed.live_view(state);
        let placement = &view.placement;
        let pending = server
            .pending
            .lock()
            .expect("pending lock")
            .iter()
            .any(|(meta, _)| meta.name == placed.name);
        let stream = match server.stream_by_name(&placed.name) {
            Some(stream) if stream.id == placed.id => stream,
            Some(_) => continue,
            None if placement.primary == 0 || pending => continue,
            None => match make_replica(server, placed, placement).await {
                Some(stream) => stream,
                None => {
                    unmade = true;
                    continue;
                }
            },
        };
        stream.set_availability(&placed.availability);
        stream.follow(&view);
        applied.insert(placed.name.clone());
    }
    // Streams the cluster deleted: ones this loop placed before (a
    // replica created on request may be ahead of this server's state).
    for stream in server.streams() {
        if !state.streams.contains_key(&stream.name) && applied.contains(&stream.name) {
            applied.remove(&stream.name);
            let deleter = Arc::clone(server);
            let name = stream.name.clone();
            let _ = tokio::task::spawn_blocking(move || deleter.delete_stream(&name)).await;
        }
    }
    unmade
}

/// Makes this server's replica of `placed`, placed here by a refill or
/// created while this server was unreachable: an empty replica that
/// catches up. `None` if it cannot be made now (warned).
async fn make_replica(
    server: &Arc<ServerState>,
    placed: &control::StreamPlacement,
    placement: &engine::replication::Placement,
) -> Option<Arc<Stream>> {
    let info = server.info_for(placed, placement);
    let retention = proto::RetentionConfig {
        bytes: placed.config.retain_bytes,
        ms: placed.config.retain_ms,
    };
    let creator = Arc::clone(server);
    let created = tokio::task::spawn_blocking(move || creator.create_replica(&info, retention));
    match created.await {
        Ok(Ok(_)) => server.stream_by_name(&placed.name),
        Ok(Err(error)) => {
            tracing::warn!(
                "cannot create the replica of {:?}: {}; trying again",
                placed.name,
                error.message
            );
            None
        }
        Err(_) => None,
    }
}

/// The command that carries `event` for `server`, the stream it is
/// about, and the epoch it belongs to (retries stop once the stream has
/// moved on from it; `None`: tried whatever the epoch).
fn command_of(server: &ServerState, event: ControlEvent) -> (Command, String, Option<u64>) {
    match event {
        ControlEvent::EpochStarted {
            stream,
            epoch,
            first_version,
            members,
        } => (
            Command::EpochStarted {
                name: stream.clone(),
                epoch,
                first_version,
                members,
            },
            stream,
            Some(epoch),
        ),
        ControlEvent::InSync {
            stream,
            epoch,
            server,
            join_view,
        } => (
            Command::InSync {
                name: stream.clone(),
                epoch,
                server,
                join_view,
            },
            stream,
            Some(epoch),
        ),
        // Tried until the control plane takes it, whatever the epoch: the
        // stream waits for this replica while it is in sync.
        ControlEvent::LogFailed { stream, reason } => (
            Command::LogFailed {
                name: stream.clone(),
                server: server.config.cluster.me,
                join_view: server.router.incarnation(),
                reason,
            },
            stream,
            None,
        ),
    }
}

/// Carries a stream's event to the control plane, retrying while the
/// control plane has no leader, however long that lasts, until it takes
/// the event, refuses it, or the event no longer matters ([`moot`]).
/// `_entry` holds the command's place among those under way until the
/// task ends.
async fn propose_event(
    server: Arc<ServerState>,
    control: Control,
    (command, stream, epoch): (Command, String, Option<u64>),
    _entry: ProposingEntry,
) {
    // The copy the event is about: a stream deleted and made again under
    // its name is another.
    let id = server.stream_by_name(&stream).map(|local| local.id);
    let started = tokio::time::Instant::now();
    let mut pause = EVENT_RETRY_AFTER;
    let mut warned = false;
    let mut stop = server.stop.subscribe();
    loop {
        if *stop.borrow() {
            // The server stops (or closes to join again): the event is
            // its old incarnation's, and this task must not keep it open.
            return;
        }
        let error = match control.propose(command.clone()).await {
            Ok(_) => {
                // The record may have been there already (a stream's first
                // epoch): no state change will say so, so look now.
                let state = Arc::clone(&control.state().borrow());
                if let (Some(placed), Some(local)) =
                    (state.streams.get(&stream), server.stream_by_name(&stream))
                {
                    if local.id == placed.id {
                        local.follow_record(&placed.live_view(&state));
                    }
                }
                return;
            }
            Err(error @ control::ControlError::Refused { .. }) => {
                tracing::warn!("the control plane refused {command:?}: {error}");
                return;
            }
            Err(error) => error,
        };
        if !warned && started.elapsed() >= EVENT_WARN_AFTER {
            warned = true;
            tracing::warn!(
                "the control plane has not taken {command:?} in {:?}, still trying: {error}",
                started.elapsed()
            );
        }
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        pause = (pause * 2).min(EVENT_RETRY_AFTER_MAX);
        // Looked at only once a try failed (the state this server has
        // applied may not show the epoch yet at first): the stream may
        // have moved on, gone or been made again meanwhile.
        if moot(&control.state().borrow(), &command, (&stream, id), epoch) {
            return;
        }
    }
}

/// The stream events' commands being proposed: an event whose command is
/// under way already (a replica in sync again for the same epoch while
/// the control plane has no leader) starts no second task, so the tasks
/// are at most the distinct commands, however long a leader is missing.
#[derive(Clone, Default)]
struct Proposing(Arc<std::sync::Mutex<Vec<Command>>>);

/// A command's place in [`Proposing`], given up when dropped.
struct ProposingEntry {
    proposing: Proposing,
    command: Command,
}

impl Proposing {
    /// Proposes `event`'s command in a task of its own, unless that
    /// command is under way already.
    fn start(&self, server: &Arc<ServerState>, control: &Control, event: ControlEvent) {
        let (command, stream, epoch) = command_of(server, event);
        if let Some(entry) = self.enter(&command) {
            let event = (command, stream, epoch);
            tokio::spawn(propose_event(
                Arc::clone(server),
                control.clone(),
                event,
                entry,
            ));
        }
    }

    /// The command's place, or `None` if it is under way already.
    fn enter(&self, command: &Command) -> Option<ProposingEntry> {
        let mut under_way = self.0.lock().expect("proposing lock");
        if under_way.contains(command) {
            return None;
        }
        under_way.push(command.clone());
        Some(ProposingEntry {
            proposing: self.clone(),
            command: command.clone(),
        })
    }
}

impl Drop for ProposingEntry {
    fn drop(&mut self) {
        let mut under_way = self.proposing.0.lock().expect("proposing lock");
        if let Some(at) = under_way.iter().position(|c| *c == self.command) {
            under_way.swap_remove(at);
        }
    }
}

/// Whether a stream event the control plane has not taken yet no longer
/// needs to be: an epoch's event once the stream is in another epoch (or
/// gone), a failed log once its stream (`name`, `id`) is gone or the
/// state records the failure.
fn moot(
    state: &ControlState,
    command: &Command,
    (name, id): (&str, Option<u64>),
    epoch: Option<u64>,
) -> bool {
    let placed = state.streams.get(name);
    if let Some(epoch) = epoch {
        return placed.map(|s| s.epoch) != Some(epoch);
    }
    match (command, placed) {
        (_, None) => true,
        (_, Some(placed)) if Some(placed.id) != id => true,
        (
            Command::LogFailed {
                server, join_view, ..
            },
            Some(placed),
        ) => placed.failed.contains(&(*server, *join_view)),
        _ => false,
    }
}

/// Drops the versions after `after` from the closed log of `meta` in
/// `folder`; false (and a warning) when it cannot.
fn cut_back(
    server: &ServerState,
    meta: &crate::stream::StreamMeta,
    folder: &std::path::Path,
    after: u64,
) -> bool {
    // The journal may name this log's files: it rotates first, so that no
    // redo writes the cut versions back.
    if let Some(journal) = &server.config.journal {
        if let Err(error) = journal.rotate() {
            tracing::warn!("stream {:?} cannot be cut back: {error}", meta.name);
            return false;
        }
    }
    let log = folder.join("log");
    match wal::truncate_after(server.config.storage.as_ref(), &log, meta.id, after) {
        Ok(0) => true,
        Ok(dropped) => {
            tracing::info!(
                "stream {:?}: dropped {dropped} versions after {after} that no other replica agrees with",
                meta.name
            );
            true
        }
        Err(error) => {
            tracing::warn!("stream {:?} cannot be cut back: {error}", meta.name);
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_replica_made_again_waits_longer_after_each_failure_and_not_once_made() {
        let mut remake = Remake::default();
        assert!(remake.at.is_none(), "nothing to make: never due");
        let mut waits = Vec::new();
        for _ in 0..8 {
            let started = tokio::time::Instant::now();
            remake.after(true);
            remake.due().await;
            waits.push(started.elapsed().as_millis());
        }
        assert_eq!(waits, [250, 500, 1000, 2000, 4000, 8000, 8000, 8000]);
        remake.after(false);
        assert!(remake.at.is_none(), "every replica made: not due again");
        let never = tokio::time::timeout(Duration::from_secs(3600), remake.due()).await;
        assert!(never.is_err(), "due with nothing to make");
        remake.after(true);
        assert_eq!(
            remake.wait, REMAKE_AFTER,
            "a new failure starts at the base"
        );
    }

    #[test]
    fn a_command_under_way_is_not_proposed_twice_until_its_task_ends() {
        let proposing = Proposing::default();
        let in_sync = |epoch| Command::InSync {
            name: "s".to_string(),
            epoch,
            server: 2,
            join_view: Some(4),
        };
        let first = proposing.enter(&in_sync(1)).expect("nothing under way");
        assert!(
            proposing.enter(&in_sync(1)).is_none(),
            "the same, under way"
        );
        let other = proposing.enter(&in_sync(2)).expect("another epoch's");
        drop(first);
        let again = proposing
            .enter(&in_sync(1))
            .expect("ended: may start again");
        drop((again, other));
        assert!(proposing.0.lock().unwrap().is_empty());
    }
}
