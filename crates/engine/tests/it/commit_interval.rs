//! The output commit interval: acks and reader visibility leave only at
//! boundaries (multiples of T on the replica's clock), for the batch of
//! versions taken in before the boundary, once the batch is durable.

use crate::{started_primary, three_servers};
use engine::replication::{
    Bytes, Content, Effect, Entry, Msg, Node, Placement, Protocol, Replica, ReplicaSettings,
};
use proto::EventId;

const CLIENT: u128 = 42;

fn settings(interval_ms: u64) -> ReplicaSettings {
    ReplicaSettings {
        commit_interval_ms: interval_ms,
        ..ReplicaSettings::default()
    }
}

fn write(sequence: u64) -> Msg {
    Msg::Write(Content {
        event: EventId {
            client: CLIENT,
            session: 1,
            sequence,
        },
        low_water: 1,
        key: Bytes::new(),
        payload: Bytes::from(vec![sequence as u8; 8]),
        resent: false,
    })
}

/// An `unversioned` stream on one server: every server is its own primary.
fn standalone(interval_ms: u64) -> Replica {
    let placement = Placement {
        replicas: vec![1],
        primary: 1,
        epoch: 1,
    };
    let mut replica = Replica::new(
        7,
        1,
        placement,
        Protocol::Unversioned,
        settings(interval_ms),
    );
    replica.start(0, &mut Vec::new());
    replica
}

/// Server 1, primary of a fresh stream on servers 1 to 3, once both
/// backups reported and its first epoch is recorded (at time 1).
fn primary(protocol: Protocol, interval_ms: u64) -> Replica {
    let primary = started_primary(protocol, settings(interval_ms));
    assert!(!primary.is_rejoining());
    primary
}

/// Versions acknowledged to the client (each message of a run).
fn acks(out: &[Effect]) -> Vec<u64> {
    out.iter()
        .flat_map(|effect| match effect {
            Effect::Send(Node::Client(CLIENT), msg) => Some(msg.acked().map(|(_, v)| v)),
            _ => None,
        })
        .flatten()
        .collect()
}

/// The newest visible version announced, if any.
fn visible(out: &[Effect]) -> Option<u64> {
    out.iter()
        .filter_map(|effect| match effect {
            Effect::Visible(version) => Some(*version),
            _ => None,
        })
        .next_back()
}

fn appended(out: &[Effect]) -> Vec<Entry> {
    out.iter()
        .filter_map(|effect| match effect {
            Effect::Append(entry) => Some(entry.clone()),
            _ => None,
        })
        .collect()
}

fn forwarded(out: &[Effect]) -> Vec<(u32, usize)> {
    out.iter()
        .filter_map(|effect| match effect {
            Effect::Send(Node::Server(to), Msg::Replicate { entries }) => {
                Some((*to, entries.len()))
            }
            _ => None,
        })
        .collect()
}

#[test]
fn nothing_is_released_before_the_boundary_even_when_durable() {
    let mut replica = standalone(20);
    let mut out = Vec::new();
    replica.on_client(CLIENT, write(1), 3, &mut out);
    replica.on_logged(1, 4, &mut out);
    assert_eq!(acks(&out), Vec::<u64>::new());
    assert_eq!(visible(&out), None);
    assert_eq!(replica.visible(), 0);
    assert_eq!(
        replica.wake_at(),
        Some(20),
        "asks for a tick at the boundary"
    );
    replica.on_tick(19, &mut out);
    assert_eq!(acks(&out), Vec::<u64>::new());

    replica.on_tick(20, &mut out);
    assert_eq!(acks(&out), vec![1]);
    assert_eq!(visible(&out), Some(1));
    assert_eq!(replica.wake_at(), None, "nothing waits for a boundary");
}

#[test]
fn a_batch_not_durable_at_its_boundary_is_released_whole_once_it_is() {
    let mut replica = standalone(20);
    let mut out = Vec::new();
    replica.on_client(CLIENT, write(1), 3, &mut out);
    replica.on_client(CLIENT, write(2), 5, &mut out);
    replica.on_tick(20, &mut out);
    assert_eq!(acks(&out), Vec::<u64>::new(), "the batch is not durable");
    replica.on_logged(1, 22, &mut out);
    assert_eq!(
        acks(&out),
        Vec::<u64>::new(),
        "half the batch is durable: nothing of it leaves"
    );
    assert_eq!(visible(&out), None);
    replica.on_logged(2, 25, &mut out);
    assert_eq!(acks(&out), vec![1, 2]);
    assert_eq!(visible(&out), Some(2));
}

#[test]
fn a_version_taken_in_after_the_boundary_waits_for_the_next_one() {
    let mut replica = standalone(20);
    let mut out = Vec::new();
    replica.on_client(CLIENT, write(1), 3, &mut out);
    // No tick ran at 20: the message at 21 closes the batch first.
    replica.on_client(CLIENT, write(2), 21, &mut out);
    replica.on_logged(2, 22, &mut out);
    assert_eq!(acks(&out), vec![1]);
    assert_eq!(visible(&out), Some(1));
    assert_eq!(replica.wake_at(), Some(40));
    out.clear();
    replica.on_tick(39, &mut out);
    assert_eq!(acks(&out), Vec::<u64>::new());
    replica.on_tick(41, &mut out);
    assert_eq!(acks(&out), vec![2]);
    assert_eq!(visible(&out), Some(2));
}

#[test]
fn a_zero_interval_acknowledges_as_soon_as_the_log_holds_the_version() {
    let mut replica = standalone(0);
    let mut out = Vec::new();
    replica.on_client(CLIENT, write(1), 3, &mut out);
    assert_eq!(replica.wake_at(), None);
    replica.on_logged(1, 4, &mut out);
    assert_eq!(acks(&out), vec![1]);
    assert_eq!(visible(&out), Some(1));
}

#[test]
fn one_hop_ack_client_forwards_at_once_and_every_replica_acks_at_its_boundary() {
    let protocol = Protocol::OneHopAckClient;
    let mut first = primary(protocol, 20);
    let mut out = Vec::new();
    first.on_client(CLIENT, write(1), 2, &mut out);
    assert_eq!(
        forwarded(&out),
        vec![(2, 1), (3, 1)],
        "replication traffic is not delayed"
    );
    let entries = appended(&out);
    first.on_logged(1, 3, &mut out);
    assert_eq!(acks(&out), Vec::<u64>::new());

    let mut backup = Replica::new(7, 2, three_servers(), protocol, settings(20));
    let mut backup_out = Vec::new();
    backup.start(0, &mut backup_out);
    backup.on_peer(1, Msg::Replicate { entries }, 3, &mut backup_out);
    backup_out.clear();
    backup.on_logged(1, 4, &mut backup_out);
    assert_eq!(acks(&backup_out), Vec::<u64>::new());
    let progress = backup_out.iter().any(|effect| {
        matches!(
            effect,
            Effect::Send(Node::Server(1), Msg::Progress { logged: 1, .. })
        )
    });
    assert!(progress, "the primary learns of the log at once");

    backup.on_tick(20, &mut backup_out);
    assert_eq!(acks(&backup_out), vec![1]);
    first.on_tick(20, &mut out);
    assert_eq!(acks(&out), vec![1]);
}

#[test]
fn server_sync_acknowledges_at_the_boundary_once_every_log_holds_the_batch() {
    let mut first = primary(Protocol::ServerSync, 20);
    let mut out = Vec::new();
    first.on_client(CLIENT, write(1), 2, &mut out);
    first.on_client(CLIENT, write(2), 2, &mut out);
    first.on_logged(2, 3, &mut out);
    first.on_peer(2, Msg::Progress { logged: 2, last: 2 }, 4, &mut out);
    first.on_tick(20, &mut out);
    assert_eq!(acks(&out), Vec::<u64>::new(), "server 3 does not hold it");
    first.on_peer(3, Msg::Progress { logged: 1, last: 2 }, 21, &mut out);
    assert_eq!(first.committed(), 1);
    assert_eq!(acks(&out), Vec::<u64>::new(), "only half the batch");
    assert_eq!(first.visible(), 0);

    first.on_peer(3, Msg::Progress { logged: 2, last: 2 }, 22, &mut out);
    assert_eq!(acks(&out), vec![1, 2]);
    assert_eq!(visible(&out), Some(2));
}

#[test]
fn server_sync_with_a_zero_interval_acknowledges_once_every_log_holds_it() {
    let mut first = primary(Protocol::ServerSync, 0);
    let mut out = Vec::new();
    first.on_client(CLIENT, write(1), 2, &mut out);
    first.on_logged(1, 3, &mut out);
    first.on_peer(2, Msg::Progress { logged: 1, last: 1 }, 4, &mut out);
    assert_eq!(acks(&out), Vec::<u64>::new());
    first.on_peer(3, Msg::Progress { logged: 1, last: 1 }, 5, &mut out);
    assert_eq!(acks(&out), vec![1]);
    assert_eq!(visible(&out), Some(1));
}

#[test]
fn a_duplicate_of_a_released_version_is_answered_at_once() {
    let mut replica = standalone(20);
    let mut out = Vec::new();
    replica.on_client(CLIENT, write(1), 3, &mut out);
    replica.on_logged(1, 4, &mut out);
    replica.on_tick(20, &mut out);
    assert_eq!(acks(&out), vec![1]);
    out.clear();
    replica.on_client(CLIENT, write(1), 25, &mut out);
    assert_eq!(acks(&out), vec![1], "its batch was released before");
}
