//! Deterministic simulation of stamplog's replication: the real
//! [`Replica`](engine::replication::Replica) and
//! [`Producer`](engine::replication::Producer) state machines, run over a
//! simulated network and simulated logs, all driven by one `u64` seed and
//! judged by the history checker.
//!
//! # The model
//!
//! - **World.** `servers` servers (3 by default) hold one stream. The
//!   control plane places it: the real
//!   [`ControlState`](control::state::ControlState) applies commands in
//!   one total order, each after a seeded commit delay, and each server and
//!   client sees every applied state after its own delay (all at once
//!   under the default timing). Servers follow it as the real server does:
//!   `reconfigure` on a new placement or in-sync set, `epoch_recorded` once
//!   their epoch is recorded, and `EpochStarted` and `InSync` proposed as
//!   commands. `clients` client processes (1 to 4) each run one producer
//!   session with a random nonzero client id and send
//!   `messages_per_client` messages with random keys (0–16 bytes) and
//!   payloads (0–64 bytes), keeping at most `window` in flight.
//! - **Time** is integer milliseconds. One queue holds every future event,
//!   ordered by (time, insertion order), so equal times keep a fixed order.
//!   Servers and producers get `on_tick` every `tick_ms`.
//! - **Network.** Every message (client to server, server to server, server
//!   to client) arrives after a random delay of `0..=delay_ms_max`, so
//!   messages overtake each other. Until the heal, each one is lost with
//!   probability `drop_permille`, and a partition cuts one server off from
//!   every other node, or from one peer, for a while. At any time a message may arrive twice
//!   (`duplicate_permille`) or very late (`straggler_permille`, up to
//!   `straggler_ms_max`), after the timeouts, retries and repairs it races.
//! - **Logs.** Each server's log is a `Vec` of entries. An append must be
//!   the next version (a violation is reported as a failure and ends the
//!   run); it becomes durable after `0..=sync_delay_ms_max`, in append
//!   order, and only then does the replica hear `on_logged`. `Serve` reads
//!   the records the log has and sends them as one `Replicate`.
//! - **Sender-based logging** (`SimConfig::sender`, about half the seeds
//!   of `one-hop`, `one-hop-ack-client`, `server-async` and `server-sync`,
//!   with longer syncs): as the real server drives a `sender` stream, the
//!   replica hears `on_logged` as soon as its log appends and `on_synced`
//!   when the disk syncs; producers confirm versions and keep copies. Every
//!   `checkpoint_ms` the primary announces `Checkpointed` through its
//!   log's synced prefix as far as it is visible, to every client that has
//!   written, and remembers it on its disk. A restarted process calls
//!   `recover_senders` with that checkpoint after `start`; as primary it
//!   asks every client to resend its copies (`Checkpointed` with
//!   `resend`), again every 50 ms while it recovers (a window of a second),
//!   as a client that reconnects is asked again. Sender runs keep faults
//!   one at a time: a partition that cuts a server off from every node
//!   (its clients too) happens only before the first server crash.
//! - **Bounds.** Some runs give the replicas tiny hold-back bounds and
//!   small repair batches, so the overflow and repair paths run.
//! - **Server crashes** ([`SimConfig::failover_from_seed`]). The
//!   primary (most often) or a backup crashes: its process loses every
//!   in-memory state, and its disk keeps the log's durable prefix (what was
//!   reported logged) and, in some runs, part of the unsynced tail. Never
//!   two servers are down at once. The failure detector removes the member
//!   after its timeout; the control plane fails over to a live in-sync
//!   replica in a new epoch. A new process starts after a seeded delay,
//!   joins, cuts its log after `truncate_after`, replays it into a new
//!   replica, starts it, and follows the placement. Messages to or from a
//!   process that has died or restarted since they were sent are lost.
//!   A quarter of the planned crashes (outside sender runs) are log
//!   failures instead: the process goes on, but the stream stops on it
//!   (its replica hears and sends nothing more, its log reports nothing
//!   more synced), it proposes `LogFailed` as the real server does, the
//!   control plane takes its copy out of the stream (a primary's in a
//!   failover), and later the process is restarted with a working log,
//!   as after a crash.
//! - **Failover for clients.** A client that sees a new placement hands it
//!   to its producer (`Producer::reconfigure`, as the client library's
//!   publisher does), which sends every unfinished message again, same
//!   event id and content, marked resent when the epoch changed. A writer
//!   starting after the last restart checks that writes are acknowledged
//!   again.
//! - **Client crashes.** A planned crash stops a client process for good:
//!   it sends nothing more and its messages in flight are abandoned. A new
//!   process with a fresh client id may take over the slot's remaining
//!   messages.
//! - **Heal and drain.** Once every live client has sent its last message,
//!   drops stop after `heal_margin_ms` (at `heal_deadline_ms` at the
//!   latest). The run ends when every live client is done and the logs
//!   agree, or `drain_ms` after the heal.
//!
//! # What is judged
//!
//! While running: a server acknowledges only what its log holds durably
//! (and under the all-replica rule of `one-hop`, `server-sync` and a
//! `hybrid` write in server-sync mode, the primary only what every log it
//! counts holds); the visible version never goes back, never passes the durable
//! log (with sender-based logging, "durable" is everything the log has
//! taken, synced or not: its clients hold copies of the rest), and never shows a version that fewer logs hold (with the same
//! bytes) than the commit quorum the primary fixed when it stamped it, at
//! most the logs it counts. At the end: the history
//! checker finds no violation in the clients' histories against the logs
//! (for `unversioned`, each server separately, with the acknowledgements it
//! gave); every message of a client that did not crash was acknowledged;
//! for the versioned protocols every log ends at the primary's last
//! version, holds the primary's bytes, and is visible to its end; after a
//! failover, some write was acknowledged; and no replica counted a
//! conflict. Where a protocol's documented loss window allows it
//! (`server-async`, `client-async`, a `hybrid` stream's client-async
//! messages: acknowledged by one log before the others hold it), an
//! acknowledged message that no log holds at its version after a server
//! crash is counted in `acked_lost_in_window` and set aside; everything
//! else is judged as usual. Sender-based logging keeps its promises for
//! one failure at a time: an acknowledged message that no log holds at its
//! version, of a client process that crashed, acknowledged before a server
//! crash (or in flight then) at a version past the newest checkpoint
//! announced by then, whose client crashed before the first checkpoint
//! announced after that server crash, is counted in `admitted_losses` and
//! set aside the same way. A panic in the state machines is a failure
//! too, with the seed.
//!
//! # Replaying a seed
//!
//! [`SimConfig::from_seed`] derives every knob from the seed, and the
//! simulator reads no clock, starts no thread and iterates no hash map, so
//! a seed and a protocol replay a run exactly:
//!
//! ```text
//! STAMPLOG_SIM_SEED=<seed> STAMPLOG_SIM_PROTOCOL=<name> \
//!     cargo test -p sim --test it seeds::replay -- --nocapture
//! ```
//!
//! prints the config, the outcome and the trace of that run (`failover::replay`
//! for a seed of the server-crash sweep, `STAMPLOG_SIM_SENDER=1` added for
//! a seed of `failover::sender_logging_survives_failover`)
//! (`STAMPLOG_SIM_TRACE=<lines>` sets how many of the last trace lines are
//! shown, `STAMPLOG_SIM_SERVERS=<n>` replays a 1- or 5-server run of the
//! tests). `STAMPLOG_SIM_SEEDS=<n>` and `STAMPLOG_SIM_FIRST_SEED=<s>` widen
//! the seed range of the protocol tests for a longer search.
//!
//! [`Sabotage`] breaks the harness on purpose (a record dropped from a log,
//! a corrupted record, a lost append); the tests use it to show that the
//! judge fails such runs.

mod config;
mod control;
mod judge;
mod outcome;
mod rng;
mod servers;
mod trace;
mod world;

use std::panic::{self, AssertUnwindSafe};

pub use config::{
    ClientCrash, ControlTiming, CrashTarget, LateClient, Partition, Sabotage, ServerCrash,
    SimConfig,
};
pub use outcome::{ClientState, Counters, Outcome, ReplicaState};

/// Runs one simulation and judges it. Never panics on a bug in the state
/// machines: a panic becomes a failure of the outcome, so the seed that
/// found it is reported.
pub fn run(config: &SimConfig) -> Outcome {
    let mut world = world::World::new(config);
    let result = panic::catch_unwind(AssertUnwindSafe(|| world.run()));
    if let Err(panic) = result {
        let message = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic without a message".to_string());
        let now = world.now;
        world.fail(format!("panic at {now} ms: {message}"));
        world.aborted = true;
    }
    judge::judge(world)
}
