//! Replication: the protocols of seeds 001 and 002 as pure state machines.
//!
//! [`Replica`] is one stream on one server (primary or not); [`Producer`] is
//! one client session of one stream. Both take messages, log progress and
//! clock ticks, and return what to send and what to log, so the server, the
//! client library and the deterministic simulator run the same code.

mod message;
mod producer;
mod protocol;
mod replica;

pub use message::{
    Binding, Bytes, Content, Entry, Msg, Node, Refusal, ServerId, ACK_RUN_MAX, PAYLOAD_SPLIT_MIN,
};
pub use producer::{Acknowledged, Completion, Producer, ProducerSettings};
pub use protocol::{AckRule, Flow, HybridMode, Protocol, UnknownProtocol};
pub use replica::{ClusterView, Effect, Placement, Replica, ReplicaMetrics, ReplicaSettings};
