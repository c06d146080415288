//! The control plane as the simulated servers see it: the real
//! [`ControlState`] applies commands in one total order (a Raft log), each
//! after a seeded commit delay, and every server and client sees each
//! applied state after its own delay, states in order.

use std::sync::Arc;

use control::state::{Command, ControlState, Response, StreamConfig, StreamPlacement};
use engine::replication::{Protocol, ServerId};

/// The agreed state and every state it went through.
pub(crate) struct ControlPlane {
    /// `states[i]` is the state after the `i`-th applied command; the
    /// first is the cluster as set up (every server joined, the stream
    /// created).
    states: Vec<Arc<ControlState>>,
    /// The stream's name in the control state.
    pub(crate) name: String,
    /// When the newest proposed command commits: later proposals commit
    /// no earlier, so commands apply in the order proposed.
    commit_at: u64,
    /// Commits and observations scheduled and not yet done.
    pub(crate) in_flight: usize,
}

impl ControlPlane {
    /// Servers `1..=servers` join, and the stream is created on all of
    /// them with server 1 first (the primary of epoch 1).
    pub(crate) fn new(servers: u32, protocol: Protocol) -> ControlPlane {
        let mut state = ControlState::default();
        for id in 1..=servers {
            let response = state.apply(Command::Join {
                id,
                address: address(id),
                roles: Vec::new(),
                admin_only: false,
                nonce: 0,
            });
            assert!(matches!(response, Response::Joined { .. }), "{response:?}");
        }
        // The placement starts at a position given by the name's hash:
        // take the first name that starts at server 1.
        let name = (0..)
            .map(|n| format!("stream-{n}"))
            .find(|name| {
                control::state::name_hash(name.as_bytes()).is_multiple_of(u64::from(servers))
            })
            .expect("some name hashes to every position");
        let config = StreamConfig {
            protocol: protocol.name().to_string(),
            durability: "sync".to_string(),
            pages: 0,
            page_size: 0,
            replicas: servers as usize,
            requirement: None,
            commit_interval_ms: 0,
            retain_bytes: 0,
            retain_ms: 0,
        };
        let response = state.apply(Command::CreateStream {
            name: name.clone(),
            config,
        });
        assert!(matches!(response, Response::Stream(_)), "{response:?}");
        let placed = &state.streams[&name];
        assert_eq!(placed.primary, Some(1), "the name was chosen for it");
        ControlPlane {
            states: vec![Arc::new(state)],
            name,
            commit_at: 0,
            in_flight: 0,
        }
    }

    /// The newest applied state and its index.
    pub(crate) fn latest(&self) -> (usize, Arc<ControlState>) {
        let index = self.states.len() - 1;
        (index, Arc::clone(&self.states[index]))
    }

    pub(crate) fn state(&self, index: usize) -> Arc<ControlState> {
        Arc::clone(&self.states[index])
    }

    /// The stream's placement in the newest state.
    pub(crate) fn placed(&self) -> &StreamPlacement {
        self.states[self.states.len() - 1]
            .streams
            .get(&self.name)
            .expect("the stream is never deleted")
    }

    /// When a command proposed `now` and taking `delay` to commit does
    /// commit: never before an earlier proposal.
    pub(crate) fn commit_time(&mut self, now: u64, delay: u64) -> u64 {
        self.commit_at = self.commit_at.max(now + delay);
        self.commit_at
    }

    /// Applies the next command of the log; returns its response and the
    /// new state's index.
    pub(crate) fn apply(&mut self, command: Command) -> (Response, usize) {
        let mut state = ControlState::clone(&self.states[self.states.len() - 1]);
        let response = state.apply(command);
        self.states.push(Arc::new(state));
        (response, self.states.len() - 1)
    }
}

/// A server's listener address in the control state.
pub(crate) fn address(id: ServerId) -> String {
    format!("sim-server-{id}")
}
