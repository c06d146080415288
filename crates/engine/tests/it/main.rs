//! The engine's behaviour through its public API: events go in, effects
//! come out.

mod ack_runs;
mod commit_interval;
mod producer;
mod sender;

use engine::replication::{Bytes, Content, Placement};
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
