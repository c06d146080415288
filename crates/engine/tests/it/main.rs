//! The engine's behaviour through its public API: events go in, effects
//! come out.

// A test stops at the first thing that is not as it expects.
#![allow(clippy::unwrap_used)]

mod ack_runs;
mod commit_interval;
mod producer;
mod sender;

use engine::replication::{Bytes, Content, Msg, Placement, Protocol, Replica, ReplicaSettings};
use proto::EventId;

/// Servers 1 (the primary), 2 and 3, in epoch 1.
fn three_servers() -> Placement {
    Placement {
        replicas: vec![1, 2, 3],
        primary: 1,
        epoch: 1,
    }
}

/// Session 1's message `sequence` of `client`.
fn event(client: u128, sequence: u64) -> EventId {
    EventId {
        client,
        session: 1,
        sequence,
    }
}

/// Session 1's message `sequence` of `client`, with 8 bytes of payload.
fn content(client: u128, sequence: u64) -> Content {
    Content {
        event: event(client, sequence),
        low_water: 1,
        key: Bytes::new(),
        payload: Bytes::from(vec![sequence as u8; 8]),
        resent: false,
    }
}

/// Server 1, primary of a fresh stream 7 on servers 1 to 3, once both
/// backups reported and its first epoch is recorded (at time 1).
fn started_primary(protocol: Protocol, settings: ReplicaSettings) -> Replica {
    let mut primary = Replica::new(7, 1, three_servers(), protocol, settings);
    let mut out = Vec::new();
    primary.start(0, &mut out);
    for id in [2, 3] {
        primary.on_peer(id, Msg::Progress { logged: 0, last: 0 }, 1, &mut out);
    }
    primary.epoch_recorded(1, 1, &mut out);
    primary
}
