//! What a run produced: the checker's verdicts, the end state of every
//! replica and client, counters, and the failures found.

use std::fmt;

use checker::Report;
use engine::replication::{Protocol, ReplicaMetrics, ServerId};

/// The result of [`crate::run`]. Equal configs give equal outcomes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub seed: u64,
    pub protocol: Protocol,
    /// The checker's verdicts: one over all replicas, or (for
    /// `unversioned`, where each server versions on its own) one per server.
    pub reports: Vec<(String, Report)>,
    pub counters: Counters,
    pub replicas: Vec<ReplicaState>,
    pub clients: Vec<ClientState>,
    /// Every broken rule, in words; empty when the run passed.
    pub failures: Vec<String>,
    /// One line per event when [`crate::SimConfig::trace`] is set.
    pub trace: Vec<String>,
    /// A hash of every event processed (time, kind, nodes, message), so
    /// two runs that differ anywhere differ here.
    pub trace_hash: u64,
}

impl Outcome {
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }
}

/// Counts over the whole run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Distinct messages the clients sent (not counting retries).
    pub messages_sent: u64,
    /// Messages whose producer reported them done with an acknowledgement.
    pub messages_acked: u64,
    /// Messages a producer gave up on with a refusal.
    pub messages_refused: u64,
    /// Network messages handed to the network, dropped, delivered twice,
    /// delivered very late, and addressed to a crashed client.
    pub network_sent: u64,
    pub network_dropped: u64,
    pub network_duplicated: u64,
    /// Messages delayed far beyond the usual delay.
    pub network_stragglers: u64,
    pub network_undeliverable: u64,
    pub client_crashes: u64,
    pub client_restarts: u64,
    /// Server processes crashed and started again.
    pub server_crashes: u64,
    pub server_restarts: u64,
    /// Logs that failed under a running process (each process is then
    /// restarted, so it counts among the crashes too).
    pub log_failures: u64,
    /// Records a crashed server's disk kept past what its log had reported
    /// synced (written, not yet synced), and versions restarted servers
    /// dropped because no other replica agreed with them.
    pub unsynced_kept: u64,
    pub truncated: u64,
    /// Commands proposed to the control plane, and changes of primary
    /// (new epochs) it made.
    pub control_commands: u64,
    pub failovers: u64,
    /// When the last failover was applied, and messages done since.
    pub last_failover_ms: u64,
    pub acked_after_last_failover: u64,
    /// Acknowledged messages lost within the protocol's loss window: no
    /// log holds them at the acknowledged version, because the primary
    /// alone held them when it crashed (`server-async`, `client-async`, a
    /// `hybrid` stream's client-async messages).
    pub acked_lost_in_window: u64,
    /// Sender-based logging: acknowledged messages lost because their
    /// client crashed while a server crash had cost the primary's log
    /// what only that client still held (two failures at once: a client
    /// and a server). See `judge::admitted_losses`.
    pub admitted_losses: u64,
    /// Sender-based logging: checkpoints the primaries announced, and
    /// messages restarted primaries took back from their clients' copies
    /// at the versions the clients held.
    pub checkpoints: u64,
    pub resent_placed: u64,
    /// Sums of the replicas' metrics.
    pub voided: u64,
    pub gap_requests: u64,
    pub duplicates: u64,
    /// Records appended to all the servers' logs together.
    pub appends: u64,
    /// When drops stopped, when the last message was done, when the run
    /// ended (simulated milliseconds).
    pub heal_ms: u64,
    pub completion_ms: u64,
    pub end_ms: u64,
    pub events: u64,
}

/// One server's state at the end of the run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaState {
    pub server: ServerId,
    /// A process of the server runs the stream at the end.
    pub running: bool,
    pub last_version: u64,
    pub logged: u64,
    pub committed: u64,
    pub visible: u64,
    pub log_length: u64,
    /// Messages still held back (out of order, unbound, reserved).
    pub held: usize,
    pub metrics: ReplicaMetrics,
}

/// One client process at the end of the run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientState {
    pub client: u128,
    /// The slot it serves (a replacement shares its predecessor's slot).
    pub slot: usize,
    pub quota: u32,
    pub sent: u32,
    pub acked: u32,
    pub refused: u32,
    pub in_flight: usize,
    pub crashed: bool,
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verdict = if self.passed() { "passed" } else { "FAILED" };
        writeln!(f, "{} seed {}: {verdict}", self.protocol, self.seed)?;
        writeln!(f, "{:#?}", self.counters)?;
        for r in &self.replicas {
            writeln!(
                f,
                "server {}{}: last {} logged {} committed {} visible {} log {} held {} {:?}",
                r.server,
                if r.running { "" } else { " (not running)" },
                r.last_version,
                r.logged,
                r.committed,
                r.visible,
                r.log_length,
                r.held,
                r.metrics
            )?;
        }
        for c in &self.clients {
            writeln!(
                f,
                "client {:x} (slot {}): quota {} sent {} acked {} refused {} in flight {}{}",
                c.client,
                c.slot,
                c.quota,
                c.sent,
                c.acked,
                c.refused,
                c.in_flight,
                if c.crashed { " CRASHED" } else { "" }
            )?;
        }
        for (name, report) in &self.reports {
            write!(f, "{name}: {report}")?;
        }
        for failure in &self.failures {
            writeln!(f, "failure: {failure}")?;
        }
        Ok(())
    }
}
