//! What one run simulates: the world's size, the workload and the fault
//! schedule. [`SimConfig::from_seed`] derives all of it from one number.

use engine::replication::{ProducerSettings, Protocol, ReplicaSettings};
use engine::DedupeLimits;

use crate::rng::Rng;

/// Every knob of one run. A run depends on nothing else, so a config (and
/// therefore a seed, through [`SimConfig::from_seed`]) replays it exactly.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimConfig {
    /// Drives every random choice of the run (delays, drops, content).
    pub seed: u64,
    pub protocol: Protocol,
    /// Servers in the one placement: replicas `1..=servers`, primary 1.
    pub servers: u32,
    /// Client processes at the start (each one producer session).
    pub clients: usize,
    /// Messages each client slot sends in total (a replacement process
    /// sends what its crashed predecessor had not sent yet).
    pub messages_per_client: u32,
    /// Each first client process starts at a random time in
    /// `0..=client_start_ms_max`; staggered starts change how many clients
    /// are active while the run goes on (`hybrid` switches on that).
    pub client_start_ms_max: u64,
    /// Messages a client keeps in flight at most.
    pub window: usize,
    /// Each network message is delivered after `0..=delay_ms_max`.
    pub delay_ms_max: u64,
    /// Chance (per mille) that a network message is lost, until the heal.
    pub drop_permille: u32,
    /// Chance (per mille) that a network message is a straggler: delivered
    /// after `straggler_ms_max / 10..=straggler_ms_max` instead, long after
    /// timeouts, retries and repairs that it races with.
    pub straggler_permille: u32,
    pub straggler_ms_max: u64,
    /// Chance (per mille) that a network message is delivered twice.
    pub duplicate_permille: u32,
    /// A log append becomes durable after `0..=sync_delay_ms_max`.
    pub sync_delay_ms_max: u64,
    /// Client crashes: which slot, when, and whether a new process follows.
    pub crashes: Vec<ClientCrash>,
    /// Times when one server is cut off: every message to or from it is
    /// lost (until the heal, like every drop).
    pub partitions: Vec<Partition>,
    /// Servers and producers get `on_tick` this often.
    pub tick_ms: u64,
    /// Drops stop this long after every live client has sent its last
    /// message.
    pub heal_margin_ms: u64,
    /// Drops stop at this time at the latest, even if clients are stuck.
    pub heal_deadline_ms: u64,
    /// After the heal the run goes on at most this long to converge (it
    /// stops earlier once quiescent). Generous on purpose: a backup repairs
    /// at most `need_batch` records per `gap_timeout_ms`, so with a batch
    /// of 1 a backlog of a few hundred versions takes tens of seconds.
    pub drain_ms: u64,
    /// Events processed at most (a guard against a livelock).
    pub events_max: u64,
    pub replica: ReplicaSettings,
    pub producer: ProducerSettings,
    /// A deliberate fault in the harness itself, to prove that the checks
    /// catch it. `None` in every real run.
    pub sabotage: Option<Sabotage>,
    /// Keep a line per event in [`crate::Outcome::trace`].
    pub trace: bool,
}

/// A planned client crash.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClientCrash {
    /// The client slot (`0..clients`); only its first process crashes.
    pub client: usize,
    pub at_ms: u64,
    /// A new process with a fresh client id takes over this long after the
    /// crash; `None`: the slot stays dead.
    pub restart_after_ms: Option<u64>,
}

/// A server cut off from every other node during `from_ms..to_ms`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Partition {
    pub server: u32,
    pub from_ms: u64,
    pub to_ms: u64,
}

/// Harness faults that a correct core cannot cause; the tests use them to
/// show that the judge fails a run that breaks a guarantee.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sabotage {
    /// Remove this version's record from this server's log after the run,
    /// before judging.
    DropRecord { server: u32, version: u64 },
    /// Flip a byte of this version's payload on this server after the run.
    CorruptRecord { server: u32, version: u64 },
    /// The server's simulated log silently ignores the append of this
    /// version (a lost write).
    SkipAppend { server: u32, version: u64 },
}

impl SimConfig {
    /// The settings the simulation's replicas use: timeouts small enough
    /// that repairs happen within a short run.
    pub fn replica_settings() -> ReplicaSettings {
        ReplicaSettings {
            gap_timeout_ms: 30,
            reserve_timeout_ms: 200,
            unbound_timeout_ms: 2_000,
            heartbeat_ms: 20,
            held_max: 4_096,
            unbound_max: 4_096,
            need_batch: 64,
            active_window_ms: 200,
            dedupe: DedupeLimits::default(),
        }
    }

    /// Every knob drawn from `seed`; the same seed gives the same config.
    pub fn from_seed(seed: u64, protocol: Protocol) -> SimConfig {
        // Knobs come from their own generator so the run's draws (which
        // start from `seed` itself) do not repeat them.
        let mut rng = Rng::new(seed ^ 0x00c0_ffee_5eed_0001);
        let clients = rng.between(1, 4) as usize;
        let messages_per_client = rng.between(20, 200) as u32;
        let drop_permille = if rng.chance(250) {
            0
        } else {
            rng.between(1, 200) as u32
        };
        let duplicate_permille = if rng.chance(500) {
            0
        } else {
            rng.between(1, 50) as u32
        };
        let straggler_permille = if rng.chance(500) {
            0
        } else {
            rng.between(1, 50) as u32
        };
        let mut crashes = Vec::new();
        if rng.chance(400) {
            for client in 0..clients {
                if rng.chance(500) {
                    crashes.push(ClientCrash {
                        client,
                        at_ms: rng.between(0, u64::from(messages_per_client) * 8),
                        restart_after_ms: rng.chance(500).then(|| rng.between(0, 100)),
                    });
                }
            }
        }
        let mut partitions = Vec::new();
        if rng.chance(300) {
            for _ in 0..rng.between(1, 3) {
                let from_ms = rng.between(0, u64::from(messages_per_client) * 8);
                partitions.push(Partition {
                    server: rng.between(1, 3) as u32,
                    from_ms,
                    to_ms: from_ms + rng.between(10, 1_000),
                });
            }
        }
        let window = rng.between(1, 16) as usize;
        let mut replica = SimConfig::replica_settings();
        replica.need_batch = [1, 4, 16, 64][rng.below(4) as usize];
        // Small bounds in some runs, so the overflow paths run too.
        replica.held_max = [8, 64, 4_096][rng.below(3) as usize];
        replica.unbound_max = [8, 64, 4_096][rng.below(3) as usize];
        SimConfig {
            seed,
            protocol,
            servers: 3,
            clients,
            messages_per_client,
            client_start_ms_max: if rng.chance(500) {
                20
            } else {
                rng.between(100, 2_000)
            },
            window,
            delay_ms_max: rng.between(0, 20),
            drop_permille,
            straggler_permille,
            straggler_ms_max: 500,
            duplicate_permille,
            sync_delay_ms_max: rng.between(0, 5),
            crashes,
            partitions,
            tick_ms: 10,
            heal_margin_ms: 200,
            heal_deadline_ms: 60_000,
            drain_ms: 60_000,
            events_max: 5_000_000,
            replica,
            producer: ProducerSettings { retry_ms: 100 },
            sabotage: None,
            trace: false,
        }
    }
}
