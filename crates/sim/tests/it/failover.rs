//! Server crashes and failover under every protocol: the seeds of
//! `SimConfig::failover_from_seed` crash the primary (most often) and
//! backups, restart them, and run the control plane's failover, judged by
//! the checker, liveness and convergence. About half the seeds of the
//! forward-flow protocols run with sender-based logging, and
//! `sender_logging_survives_failover` forces it on for every seed of
//! `one-hop-ack-client` and `server-sync`, on 3, 1 and 5 servers.
//!
//! `STAMPLOG_SIM_SEEDS=<n>` and `STAMPLOG_SIM_FIRST_SEED=<s>` widen the
//! seed range, as for the fault seeds; a failing seed replays with
//!
//! ```text
//! STAMPLOG_SIM_SEED=<seed> STAMPLOG_SIM_PROTOCOL=<name> \
//!     cargo test -p sim --test it failover::replay -- --nocapture
//! ```

use std::ops::Range;
use std::time::Instant;

use engine::replication::Protocol;
use sim::{run, CrashTarget, Outcome, ServerCrash, SimConfig};

/// Seeds per protocol in an ordinary test run (11 protocols).
const SEEDS_PER_PROTOCOL: u64 = 40;
/// Failing seeds described in full in one panic message.
const FAILURES_SHOWN: usize = 5;

fn env_u64(name: &str) -> Option<u64> {
    let text = std::env::var(name).ok()?;
    Some(
        text.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={text:?} is not a number")),
    )
}

fn replay_command(protocol: Protocol, seed: u64) -> String {
    format!(
        "STAMPLOG_SIM_SEED={seed} STAMPLOG_SIM_PROTOCOL={protocol} cargo test -p sim --test it failover::replay -- --nocapture"
    )
}

/// What a sweep saw, summed over its seeds.
#[derive(Default)]
struct Sweep {
    acked: u64,
    crashes: u64,
    /// Of the crashes, logs that failed under a running process.
    log_failures: u64,
    failovers: u64,
    truncated: u64,
    lost_in_window: u64,
    /// Runs with sender-based logging, their checkpoints, copies taken
    /// back by restarted primaries, and admitted losses (a client and a
    /// server crash at once).
    sender_runs: u64,
    checkpoints: u64,
    resent_placed: u64,
    admitted_losses: u64,
    /// The first seeds with admitted losses, to replay and read.
    admitted_seeds: Vec<u64>,
    failed: Vec<Outcome>,
}

fn sweep(protocol: Protocol, seeds: Range<u64>) -> Sweep {
    sweep_configs(seeds, |seed| SimConfig::failover_from_seed(seed, protocol))
}

fn sweep_configs(seeds: Range<u64>, make: impl Fn(u64) -> SimConfig) -> Sweep {
    let mut sweep = Sweep::default();
    for seed in seeds {
        let config = make(seed);
        let outcome = run(&config);
        let counters = &outcome.counters;
        if config.sender {
            sweep.sender_runs += 1;
        }
        sweep.checkpoints += counters.checkpoints;
        sweep.resent_placed += counters.resent_placed;
        sweep.admitted_losses += counters.admitted_losses;
        if counters.admitted_losses > 0 && sweep.admitted_seeds.len() < FAILURES_SHOWN {
            sweep.admitted_seeds.push(seed);
        }
        sweep.acked += counters.messages_acked;
        sweep.crashes += counters.server_crashes;
        sweep.log_failures += counters.log_failures;
        sweep.failovers += counters.failovers;
        sweep.truncated += counters.truncated;
        sweep.lost_in_window += counters.acked_lost_in_window;
        if !outcome.passed() {
            sweep.failed.push(outcome);
        }
    }
    sweep
}

/// Runs the protocol's failover seeds; panics naming every failing seed
/// and how to replay it.
fn survives_failover(protocol: Protocol) {
    let first = env_u64("STAMPLOG_SIM_FIRST_SEED").unwrap_or(0);
    let count = env_u64("STAMPLOG_SIM_SEEDS").unwrap_or(SEEDS_PER_PROTOCOL);
    let started = Instant::now();
    let sweep = sweep(protocol, first..first + count);
    report(protocol, "failover", first, count, &sweep, started, "");
}

/// Prints what a sweep saw and panics naming every failing seed.
fn report(
    protocol: Protocol,
    what: &str,
    first: u64,
    count: u64,
    sweep: &Sweep,
    started: Instant,
    replay_env: &str,
) {
    eprintln!(
        "{protocol} {what}: {count} seeds from {first}, {} server crashes ({} of them log failures), {} failovers, {} versions truncated, {} messages acknowledged, {} lost within the loss window, {} with sender logging ({} checkpoints, {} copies taken back, {} admitted losses), {} failed, {:.1?}",
        sweep.crashes,
        sweep.log_failures,
        sweep.failovers,
        sweep.truncated,
        sweep.acked,
        sweep.lost_in_window,
        sweep.sender_runs,
        sweep.checkpoints,
        sweep.resent_placed,
        sweep.admitted_losses,
        sweep.failed.len(),
        started.elapsed()
    );
    if !sweep.admitted_seeds.is_empty() {
        eprintln!(
            "{protocol} {what}: seeds with admitted losses include {:?}",
            sweep.admitted_seeds
        );
    }
    if !may_lose_acknowledged(protocol) {
        assert_eq!(sweep.lost_in_window, 0, "{protocol} promises no loss");
    }
    if sweep.failed.is_empty() {
        return;
    }
    let mut message = format!(
        "{protocol} {what}: {} of {count} seeds failed: {:?}\n",
        sweep.failed.len(),
        sweep.failed.iter().map(|o| o.seed).collect::<Vec<_>>()
    );
    for outcome in sweep.failed.iter().take(FAILURES_SHOWN) {
        message.push_str(&format!(
            "\n{protocol} seed {} failed:\n  {}\n  replay: {replay_env}{}\n",
            outcome.seed,
            outcome.failures.join("\n  "),
            replay_command(protocol, outcome.seed)
        ));
    }
    panic!("{message}");
}

/// Seeds per protocol of the sender-logging sweep in an ordinary run.
const SENDER_SEEDS: u64 = 40;

/// The failover seed with sender-based logging on, whatever the seed
/// draws, on `servers` servers (with one, a restarted primary takes its
/// clients' copies back: no other replica holds them).
fn sender_config(seed: u64, protocol: Protocol, servers: u32) -> SimConfig {
    let mut config = SimConfig::failover_from_seed(seed, protocol);
    config.servers = servers;
    if config.sender {
        config
    } else {
        config.with_sender_logging()
    }
}

/// Sender-based logging (durability `sender`) under server crashes,
/// failover and client crashes, forced on for every seed: nothing
/// acknowledged is lost, reordered or given two versions, except the
/// admitted losses of a client crash together with a server crash.
/// Each seed runs on 3, 1 and 5 servers. `STAMPLOG_SIM_SEEDS` and
/// `STAMPLOG_SIM_FIRST_SEED` widen the range, `STAMPLOG_SIM_PROTOCOL`
/// sweeps another forward-flow protocol instead; a failing seed replays with
/// `STAMPLOG_SIM_SENDER=1 STAMPLOG_SIM_SERVERS=<n>` added to the failover
/// replay.
#[test]
fn sender_logging_survives_failover() {
    let first = env_u64("STAMPLOG_SIM_FIRST_SEED").unwrap_or(0);
    let count = env_u64("STAMPLOG_SIM_SEEDS").unwrap_or(SENDER_SEEDS);
    let protocols = match std::env::var("STAMPLOG_SIM_PROTOCOL") {
        Ok(name) => vec![name
            .parse::<Protocol>()
            .unwrap_or_else(|error| panic!("{error}"))],
        Err(_) => vec![Protocol::OneHopAckClient, Protocol::ServerSync],
    };
    for protocol in protocols {
        for servers in [3, 1, 5] {
            let started = Instant::now();
            let sweep = sweep_configs(first..first + count, |seed| {
                sender_config(seed, protocol, servers)
            });
            assert_eq!(sweep.sender_runs, count);
            report(
                protocol,
                &format!("sender failover, {servers} servers"),
                first,
                count,
                &sweep,
                started,
                &format!("STAMPLOG_SIM_SENDER=1 STAMPLOG_SIM_SERVERS={servers} "),
            );
        }
    }
}

/// The protocols whose acknowledgement may come from one log alone, so a
/// crash of that server can lose an acknowledged message
/// (`docs/protocols.md`, loss windows).
fn may_lose_acknowledged(protocol: Protocol) -> bool {
    matches!(
        protocol,
        Protocol::ServerAsync | Protocol::ClientAsync | Protocol::Hybrid
    )
}

macro_rules! failover_tests {
    ($($name:ident => $protocol:expr,)*) => {
        $(
            #[test]
            fn $name() {
                survives_failover($protocol);
            }
        )*
    };
}

failover_tests! {
    unversioned_survives_server_crashes => Protocol::Unversioned,
    version_request_survives_failover => Protocol::VersionRequest,
    returns_version_survives_failover => Protocol::ReturnsVersion,
    one_hop_survives_failover => Protocol::OneHop,
    one_hop_ack_client_survives_failover => Protocol::OneHopAckClient,
    broadcast_tag_survives_failover => Protocol::BroadcastTag,
    server_async_survives_failover => Protocol::ServerAsync,
    server_sync_survives_failover => Protocol::ServerSync,
    client_async_survives_failover => Protocol::ClientAsync,
    client_sync_survives_failover => Protocol::ClientSync,
    hybrid_survives_failover => Protocol::Hybrid,
}

#[test]
fn every_protocol_has_a_failover_test() {
    assert_eq!(Protocol::ALL.len(), 11);
}

/// Replays the failover seed named by `STAMPLOG_SIM_SEED` (protocol by
/// `STAMPLOG_SIM_PROTOCOL`, default `one-hop-ack-client`; sender-based
/// logging forced on by `STAMPLOG_SIM_SENDER=1`, then on
/// `STAMPLOG_SIM_SERVERS` servers, default 3) with a trace. Without the
/// seed it does nothing.
#[test]
fn replay() {
    let Some(seed) = env_u64("STAMPLOG_SIM_SEED") else {
        eprintln!("set STAMPLOG_SIM_SEED (and STAMPLOG_SIM_PROTOCOL) to replay a run");
        return;
    };
    let protocol = std::env::var("STAMPLOG_SIM_PROTOCOL")
        .map(|name| {
            name.parse::<Protocol>()
                .unwrap_or_else(|error| panic!("{error}"))
        })
        .unwrap_or(Protocol::OneHopAckClient);
    let lines = env_u64("STAMPLOG_SIM_TRACE").unwrap_or(300) as usize;
    let config = if env_u64("STAMPLOG_SIM_SENDER").is_some_and(|on| on != 0) {
        let servers = env_u64("STAMPLOG_SIM_SERVERS").unwrap_or(3) as u32;
        sender_config(seed, protocol, servers)
    } else {
        SimConfig::failover_from_seed(seed, protocol)
    };
    crate::replay_with_trace(config, lines, &format!("{protocol} failover seed {seed}"));
}

#[test]
fn the_same_failover_seed_gives_the_same_outcome() {
    for protocol in Protocol::ALL {
        let config = SimConfig::failover_from_seed(7, protocol);
        assert_eq!(
            run(&config),
            run(&config),
            "{protocol} failover seed 7 is not deterministic"
        );
    }
}

/// A calm run whose primary crashes once and comes back before the
/// failure detector removes it: its join replaces its former incarnation
/// and the stream fails over at once.
fn primary_crash(protocol: Protocol) -> SimConfig {
    let mut config = SimConfig::failover_from_seed(5, protocol);
    config.drop_permille = 0;
    config.crashes.clear();
    config.partitions.clear();
    config.clients = 2;
    config.client_start_ms_max = 20;
    config.messages_per_client = 60;
    config.control.suspect_timeout_ms = 400;
    config.server_crashes = vec![ServerCrash {
        target: CrashTarget::Primary,
        at_ms: 150,
        restart_after_ms: 100,
        log_fails: false,
    }];
    config
}

#[test]
fn a_crashed_primary_fails_over_and_writes_go_on() {
    for protocol in Protocol::ALL {
        let outcome = run(&primary_crash(protocol));
        assert!(outcome.passed(), "{outcome}");
        let counters = &outcome.counters;
        assert_eq!(counters.server_crashes, 1, "{outcome}");
        assert_eq!(counters.server_restarts, 1, "{outcome}");
        assert!(counters.failovers >= 1, "{outcome}");
        assert!(counters.acked_after_last_failover > 0, "{outcome}");
    }
}

/// The same calm run, but the primary's log fails (a full disk) while
/// its process goes on: the control plane takes its copy out of the
/// stream and fails over, writes go on, and the process restarted later
/// with a working log catches up. A backup's failure, the same.
#[test]
fn a_primary_or_backup_whose_log_fails_is_left_out_and_writes_go_on() {
    for protocol in Protocol::ALL {
        for target in [CrashTarget::Primary, CrashTarget::Backup] {
            let mut config = primary_crash(protocol);
            config.server_crashes[0].target = target;
            config.server_crashes[0].log_fails = true;
            let outcome = run(&config);
            assert!(outcome.passed(), "{protocol} {target:?}: {outcome}");
            let counters = &outcome.counters;
            assert_eq!(counters.log_failures, 1, "{outcome}");
            assert_eq!(counters.server_restarts, 1, "{outcome}");
            if target == CrashTarget::Primary && protocol != Protocol::Unversioned {
                assert!(counters.failovers >= 1, "{protocol}: {outcome}");
            }
        }
    }
}

/// Failover seeds that found bugs outside the simulator, pinned so they
/// stay found: each fails until its bug is fixed. They depend on
/// `SimConfig::failover_from_seed` drawing its knobs as it does now.
const FAILOVER_BUG_SEEDS: [(Protocol, u64, &str); 4] = [
    (
        Protocol::BroadcastTag,
        26,
        "control: the refill that puts a returning server back into the replica set also adds it \
         to the current epoch record's members, so truncate_after gives None and it keeps a tail \
         the new primary stamped over",
    ),
    (
        Protocol::OneHopAckClient,
        7,
        "server: a removed server whose Join is applied before the new epoch's record opens with \
         truncate_after = None, keeps the tail the record leaves out, and is declared in sync on it \
         (its first crash also meets the refill bug)",
    ),
    (
        Protocol::ReturnsVersion,
        0,
        "engine: after a failover a duplicate Stamped names the new epoch, and a backup builds the \
         record of a version stamped earlier with its own epoch: other bytes under one version",
    ),
    (
        Protocol::Hybrid,
        42,
        "engine: reconfigure keeps the commit point learned from the former primary, so versions \
         the new primary stamps again become visible before their commit quorum holds them",
    ),
];

fn failover_bug_seed_passes(index: usize) {
    let (protocol, seed, bug) = FAILOVER_BUG_SEEDS[index];
    let outcome = run(&SimConfig::failover_from_seed(seed, protocol));
    assert!(
        outcome.passed(),
        "{protocol} failover seed {seed} found: {bug}\n{}\nreplay: {}",
        outcome.failures.join("\n"),
        replay_command(protocol, seed)
    );
}

#[test]
fn a_refilled_returning_replica_drops_the_tail_the_new_epoch_replaced() {
    failover_bug_seed_passes(0);
}

#[test]
fn a_replica_that_joins_before_the_new_epoch_is_recorded_drops_its_stale_tail() {
    failover_bug_seed_passes(1);
}

#[test]
fn a_version_stamped_before_a_failover_has_the_same_bytes_on_every_replica() {
    failover_bug_seed_passes(2);
}

#[test]
fn versions_stamped_in_a_new_epoch_wait_for_their_commit_quorum() {
    failover_bug_seed_passes(3);
}

/// Forced sender-logging seeds (`sender_config`) that found bugs in the
/// engine, pinned so they stay found: each fails until its bug is fixed.
/// They depend on `SimConfig::failover_from_seed` drawing its knobs as
/// it does now.
const SENDER_BUG_SEEDS: [(Protocol, u64, u32, &str); 2] = [
    (
        Protocol::OneHopAckClient,
        1,
        3,
        "engine: a resend of a logged message (Placed, with the version its client holds) sent \
         no Reack to the backups, so a backup's lost ack was never repaired and the client waited \
         forever",
    ),
    (
        Protocol::OneHopAckClient,
        26,
        1,
        "engine: a restarted primary turned resent copies past unbound_max away with Busy, which a \
         producer ignores for a copy it holds, and voided their versions: acknowledged messages \
         lost with every client alive",
    ),
];

#[test]
fn seeds_that_found_sender_logging_bugs_pass() {
    for (protocol, seed, servers, bug) in SENDER_BUG_SEEDS {
        let outcome = run(&sender_config(seed, protocol, servers));
        assert!(
            outcome.passed(),
            "{protocol} sender seed {seed} on {servers} servers found: {bug}\n{}\nreplay: STAMPLOG_SIM_SENDER=1 STAMPLOG_SIM_SERVERS={servers} {}",
            outcome.failures.join("\n"),
            replay_command(protocol, seed)
        );
    }
}

/// A client that crashes while the only server is down takes the copies
/// the server's log had not synced with it: the judge admits exactly
/// those losses, counts them, and passes the run.
#[test]
fn a_client_crash_during_a_server_crash_is_an_admitted_loss() {
    let config = sender_config(1217, Protocol::ServerSync, 1);
    let outcome = run(&config);
    assert_eq!(outcome, run(&config), "sender runs are deterministic");
    assert!(outcome.passed(), "{outcome}");
    let counters = &outcome.counters;
    assert!(counters.client_crashes > 0 && counters.server_crashes > 0);
    assert!(counters.admitted_losses > 0, "{outcome}");
    assert!(counters.resent_placed > 0, "{outcome}");
}
