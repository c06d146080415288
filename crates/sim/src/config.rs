//! What one run simulates: the world's size, the workload and the fault
//! schedule. [`SimConfig::from_seed`] derives all of it from one number.

use engine::replication::{ProducerSettings, Protocol, ReplicaSettings, ServerId};
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
    /// Times when one server is cut off from every other node, or from
    /// one peer: every message between them is lost (until the heal, like
    /// every drop). The control plane is never cut off.
    pub partitions: Vec<Partition>,
    /// Server crashes, in time order, each followed by a restart, and
    /// never two servers down at once.
    pub server_crashes: Vec<ServerCrash>,
    /// Chance (per mille) that a crashed server's disk kept part of the
    /// log's unsynced tail (written, not yet synced or reported).
    pub keep_unsynced_permille: u32,
    /// How fast the control plane agrees on commands and servers see them.
    pub control: ControlTiming,
    /// A writer that starts after the last server restart, so writes must
    /// be acknowledged again after the last failover.
    pub late_client: Option<LateClient>,
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
    /// Sender-based message logging (durability `sender`, the forward-flow
    /// protocols only): sets `replica.sender_logging` and
    /// `producer.sender_logging` (see [`SimConfig::with_sender_logging`]).
    /// A server reports its log `on_logged` as soon as it appends and
    /// `on_synced` when the disk syncs; its primary announces checkpoints
    /// every `checkpoint_ms`, and a restarted primary asks its clients for
    /// the copies they hold.
    pub sender: bool,
    /// Sender-based logging: how often the primary announces the newest
    /// checkpoint (its log's synced prefix, as far as it is visible).
    pub checkpoint_ms: u64,
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

/// A server cut off during `from_ms..to_ms` from every other node
/// (`peer: None`) or from one other server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Partition {
    pub server: ServerId,
    pub peer: Option<ServerId>,
    pub from_ms: u64,
    pub to_ms: u64,
}

/// A planned server crash: the process loses its memory and keeps its
/// log's durable prefix; a new process starts `restart_after_ms` later.
/// With `log_fails`, the log fails instead (a full disk): the process
/// goes on, but the stream stops on it (its replica hears and sends
/// nothing more, its log reports nothing more synced), and it tells the
/// control plane (`LogFailed`); `restart_after_ms` later it is restarted
/// with a working log, as an operator would.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServerCrash {
    pub target: CrashTarget,
    pub at_ms: u64,
    pub restart_after_ms: u64,
    pub log_fails: bool,
}

/// Which server a crash takes, chosen when it happens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CrashTarget {
    /// The stream's primary as the control plane names it.
    Primary,
    /// A live replica other than the primary, drawn at random.
    Backup,
}

/// The control plane's timing. All zeros: every command is agreed and
/// seen by every server at the instant it is proposed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ControlTiming {
    /// A proposed command is applied after `commit_ms_min..=commit_ms_max`
    /// (a Raft commit), in the order proposed.
    pub commit_ms_min: u64,
    pub commit_ms_max: u64,
    /// Each server and client sees an applied state after its own delay
    /// of `0..=observe_lag_ms_max`, states in order.
    pub observe_lag_ms_max: u64,
    /// The failure detector removes a crashed process this long after its
    /// crash (unless it has joined again by then).
    pub suspect_timeout_ms: u64,
}

/// A client process that starts `after_ms` after the last planned
/// server restart and sends `messages` messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LateClient {
    pub after_ms: u64,
    pub messages: u32,
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

/// Salts the generator that decides sender-based logging (chosen so that
/// the seeds pinned by the tests, 3, 5 and 7, keep their runs).
const SENDER_SALT: u64 = 0x5e4d_e710_5eed_0048;
/// Draws which planned crashes are log failures instead.
const LOG_FAILURE_SALT: u64 = 0x10f4_11ed_5eed_0003;

impl SimConfig {
    /// The settings the simulation's replicas use: timeouts small enough
    /// that repairs happen within a short run.
    pub fn replica_settings() -> ReplicaSettings {
        ReplicaSettings {
            gap_timeout_ms: 30,
            reserve_timeout_ms: 200,
            unbound_timeout_ms: 2_000,
            heartbeat_ms: 20,
            heartbeat_max_ms: 320,
            held_max: 4_096,
            unbound_max: 4_096,
            need_batch: 64,
            active_window_ms: 200,
            commit_interval_ms: 0,
            sender_logging: false,
            sender_recovery_ms: 300,
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
        let crashes = client_crashes(&mut rng, clients, messages_per_client);
        let partitions = partitions(&mut rng, messages_per_client);
        let window = rng.between(1, 16) as usize;
        let mut replica = SimConfig::replica_settings();
        replica.need_batch = [1, 4, 16, 64][rng.below(4) as usize];
        // Small bounds in some runs, so the overflow paths run too.
        replica.held_max = [8, 64, 4_096][rng.below(3) as usize];
        replica.unbound_max = [8, 64, 4_096][rng.below(3) as usize];
        let mut config = SimConfig {
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
            server_crashes: Vec::new(),
            keep_unsynced_permille: 0,
            control: ControlTiming::default(),
            late_client: None,
            tick_ms: 10,
            heal_margin_ms: 200,
            heal_deadline_ms: 60_000,
            drain_ms: 60_000,
            events_max: 5_000_000,
            replica,
            producer: ProducerSettings {
                retry_ms: 100,
                sender_logging: false,
                ..ProducerSettings::default()
            },
            sender: false,
            checkpoint_ms: 200,
            sabotage: None,
            trace: false,
        };
        config.draw_sender_logging(seed);
        config
    }

    /// Sender-based logging in about half the runs of the protocols that
    /// support it, drawn from `seed` apart from the other knobs.
    fn draw_sender_logging(&mut self, seed: u64) {
        // Sender-based logging in about half the runs of the protocols
        // that support it, from a generator of its own so the other knobs
        // stay what they were (and seeds pinned before it keep their runs).
        let mut sender = Rng::new(seed ^ SENDER_SALT);
        if sender.chance(500) && SimConfig::supports_sender_logging(self.protocol) {
            *self = self.clone().with_sender_logging();
            // The page writer syncs in the background: sometimes soon,
            // sometimes long after the clients confirmed.
            self.sync_delay_ms_max = [5, 50, 300][sender.below(3) as usize];
            self.checkpoint_ms = [50, 200, 500][sender.below(3) as usize];
        }
    }

    /// The protocols with sender-based logging: the forward-flow ones
    /// (`hybrid` excepted).
    pub fn supports_sender_logging(protocol: Protocol) -> bool {
        matches!(
            protocol,
            Protocol::OneHop
                | Protocol::OneHopAckClient
                | Protocol::ServerAsync
                | Protocol::ServerSync
        )
    }

    /// The same run with sender-based message logging on (replicas and
    /// producers), a recovery window of a second (a restarted primary asks
    /// its clients for their copies every 50 ms meanwhile, so a copy is
    /// lost to dropped messages alone only with a vanishing chance), and
    /// the fault schedule kept to one failure at a time (see
    /// [`SimConfig::keep_sender_faults_apart`]).
    pub fn with_sender_logging(mut self) -> SimConfig {
        assert!(
            SimConfig::supports_sender_logging(self.protocol),
            "{} has no sender-based logging",
            self.protocol
        );
        self.sender = true;
        self.replica.sender_logging = true;
        self.replica.sender_recovery_ms = 1_000;
        self.producer.sender_logging = true;
        self.keep_sender_faults_apart();
        self
    }

    /// Sender-based logging promises nothing when a restarted primary
    /// cannot hear its clients while it takes their copies back: a
    /// partition that cuts a server off from every node (its clients too)
    /// is a second failure then, as a client crash is (which the judge
    /// admits instead, see `admitted_losses`). So a sender run keeps only
    /// the partitions of that kind that are over before the first server
    /// crash (partitions between servers stay).
    pub fn keep_sender_faults_apart(&mut self) {
        if !self.sender {
            return;
        }
        // A sender log's failure is not modelled: its process crashes.
        for crash in &mut self.server_crashes {
            crash.log_fails = false;
        }
        if let Some(first) = self.server_crashes.iter().map(|c| c.at_ms).min() {
            self.partitions
                .retain(|p| p.peer.is_some() || p.to_ms <= first);
        }
    }

    /// The seed's run of [`SimConfig::from_seed`] with server faults
    /// added: one to three crashes, of the primary most often, a quarter
    /// of them log failures instead (`ServerCrash::log_fails`), each
    /// restarted, before or after the failure detector removes it, with
    /// never two servers down at once; a control plane that takes time to
    /// agree and servers that see its state late; partitions between two
    /// servers; an unsynced log tail that partly survives a crash; and a
    /// writer that starts after the last restart. A sender run keeps its
    /// faults one at a time ([`SimConfig::keep_sender_faults_apart`]).
    pub fn failover_from_seed(seed: u64, protocol: Protocol) -> SimConfig {
        let mut config = SimConfig::from_seed(seed, protocol);
        let mut rng = Rng::new(seed ^ 0x0fa1_10e5_5eed_0002);
        config.messages_per_client = rng.between(20, 120) as u32;
        let suspect_timeout_ms = rng.between(50, 500);
        let commit_ms_max = if rng.chance(100) {
            0
        } else {
            rng.between(1, 30)
        };
        config.control = ControlTiming {
            commit_ms_min: commit_ms_max / 3,
            commit_ms_max,
            observe_lag_ms_max: if rng.chance(300) {
                0
            } else {
                rng.between(1, 50)
            },
            suspect_timeout_ms,
        };
        let crashes = match rng.below(20) {
            0..=9 => 1,
            10..=16 => 2,
            _ => 3,
        };
        let active_ms = u64::from(config.messages_per_client) * 8;
        let first_ms = rng.between(10, active_ms + config.client_start_ms_max);
        config.server_crashes =
            server_crashes(seed, &mut rng, (crashes, first_ms), suspect_timeout_ms);
        if rng.chance(300) {
            for _ in 0..rng.between(1, 2) {
                let server = rng.between(1, 3) as ServerId;
                let from_ms = rng.between(0, active_ms);
                config.partitions.push(Partition {
                    server,
                    peer: Some(server % 3 + 1),
                    from_ms,
                    to_ms: from_ms + rng.between(10, 1_000),
                });
            }
        }
        config.keep_unsynced_permille = if rng.chance(500) {
            0
        } else {
            rng.between(200, 1_000) as u32
        };
        config.late_client = Some(LateClient {
            after_ms: suspect_timeout_ms + rng.between(100, 500),
            messages: rng.between(5, 20) as u32,
        });
        config.keep_sender_faults_apart();
        config
    }

    /// When the last planned server restart happens (0 without crashes).
    pub fn last_restart_ms(&self) -> u64 {
        self.server_crashes
            .iter()
            .map(|c| c.at_ms + c.restart_after_ms)
            .max()
            .unwrap_or(0)
    }
}

/// `crashes` planned server crashes from `first_ms` on, each restarted
/// before or after the detector's `suspect_timeout_ms`, never two at
/// once; a quarter are log failures instead, drawn apart so that a
/// seed's other faults stay what they were.
fn server_crashes(
    seed: u64,
    rng: &mut Rng,
    (crashes, first_ms): (u64, u64),
    suspect_timeout_ms: u64,
) -> Vec<ServerCrash> {
    let mut logs = Rng::new(seed ^ LOG_FAILURE_SALT);
    let mut at_ms = first_ms;
    let mut planned = Vec::new();
    for _ in 0..crashes {
        let target = if rng.chance(650) {
            CrashTarget::Primary
        } else {
            CrashTarget::Backup
        };
        // Some processes come back before the detector removes them.
        let restart_after_ms = if rng.chance(250) {
            rng.between(0, suspect_timeout_ms)
        } else {
            rng.between(suspect_timeout_ms, suspect_timeout_ms + 1_000)
        };
        planned.push(ServerCrash {
            target,
            at_ms,
            restart_after_ms,
            log_fails: logs.chance(250),
        });
        at_ms += restart_after_ms + rng.between(1, 600);
    }
    planned
}

/// Clients that crash (and maybe come back) in some runs.
fn client_crashes(rng: &mut Rng, clients: usize, messages_per_client: u32) -> Vec<ClientCrash> {
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
    crashes
}

/// Servers cut off from everyone for a while, in some runs.
fn partitions(rng: &mut Rng, messages_per_client: u32) -> Vec<Partition> {
    let mut partitions = Vec::new();
    if rng.chance(300) {
        for _ in 0..rng.between(1, 3) {
            let from_ms = rng.between(0, u64::from(messages_per_client) * 8);
            partitions.push(Partition {
                server: rng.between(1, 3) as u32,
                peer: None,
                from_ms,
                to_ms: from_ms + rng.between(10, 1_000),
            });
        }
    }
    partitions
}
