//! The control plane: membership views, stream placement and stream
//! configuration as entries of a replicated log, agreed through Raft
//! (openraft). Every server runs a [`Control`]: it keeps the Raft vote, log
//! and snapshots in its own folder, speaks to its peers over control
//! connections (opened by `Frame::ControlHello`), applies committed
//! [`Command`]s to a [`ControlState`], and runs the failure detector that
//! removes members the leader no longer hears from.

mod config;
mod detector;
mod error;
mod files;
mod log_store;
mod machine;
mod network;
mod node;
pub mod state;
mod wire;

pub use config::ControlConfig;
pub use error::ControlError;
pub use node::Control;
pub use state::{
    Availability, Command, ControlState, EpochRecord, LossAction, Member, Requirement, Response,
    ServerId, StreamConfig, StreamPlacement, Transition, WriteRefusal,
};
pub use wire::{check_request, read_hello, CONTROL_MESSAGE_MAX};

openraft::declare_raft_types!(
    /// openraft's types for the control log: its entries carry [`Command`]s
    /// (in proposals), nodes are `u64` server ids with their `host:port`.
    pub(crate) TypeConfig:
        D = machine::Proposal,
        R = Response,
        SnapshotData = std::io::Cursor<Vec<u8>>,
);
