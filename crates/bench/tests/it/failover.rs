//! The kill loop on real processes: 3- and 5-server clusters of separate
//! `stamplog server` processes on 127.0.0.1, a writer at a steady rate,
//! random servers (the primary half the time) killed with SIGKILL and
//! started again, and the history checker on every replica at the end.

use bench::failover::{self, FailoverArgs, Fault, Network, Victims};
use bench::replication::Durability;
use client::Protocol;

use crate::{assert_files, quiet_output, read_json, stamplog_binary};

fn kill_loop(servers: u32, kills: u32, protocol: Protocol, seed: u64) {
    kill_loop_with(servers, kills, protocol, Durability::Sync, seed);
}

/// The loops' common settings: three servers, 1,000 messages/s of 200
/// bytes, 32 in flight, random victims killed with SIGKILL.
pub(crate) fn base_args(folder: &std::path::Path) -> FailoverArgs {
    FailoverArgs {
        server_binary: Some(stamplog_binary()),
        servers: 3,
        messages: 3_000,
        kills: 4,
        victims: Victims::Random,
        fault: Fault::Kill,
        fault_ms: 0,
        network: Network::Loopback,
        rate: 1_000,
        window: 32,
        payload: 200,
        protocol: Protocol::OneHopAckClient,
        durability: Durability::Sync,
        page_flush_ms: 50,
        sender_recovery_ms: 800,
        settle_ms: 300,
        seed: 1,
        keep: false,
        output: quiet_output(folder),
    }
}

fn kill_loop_with(servers: u32, kills: u32, protocol: Protocol, durability: Durability, seed: u64) {
    let folder = tempfile::tempdir().unwrap();
    let args = FailoverArgs {
        servers,
        kills,
        protocol,
        durability,
        seed,
        ..base_args(folder.path())
    };
    let figures = failover::run(args).unwrap();
    let report = &figures.report;
    assert!(report.is_clean(), "{servers} servers, {protocol}: {report}");
    let reads = &figures.reads;
    assert!(reads.is_clean(), "{servers} servers, {protocol}: {reads}");
    // Every server ran a reader for the whole loop; the ones on the final
    // replicas read to the newest acknowledged version.
    assert!(
        reads.deliveries >= figures.acknowledged,
        "{servers} servers, {protocol}: {reads}"
    );
    assert_eq!(figures.kills.len(), kills as usize);
    for kill in &figures.kills {
        assert!(
            kill.recovery_ms.is_some(),
            "writes were acknowledged again after every kill: {kill:?}"
        );
        assert_ne!(kill.primary_after, 0, "{kill:?}");
    }
    if durability == Durability::Sender {
        // Every acknowledged message is in the final log at its version
        // (the checker's lost count is 0 above), including those the
        // restarted server's log had lost and its clients resent.
        let json = read_json(&folder.path().join("figures.json"));
        assert_eq!(json["durability"], "sender");
    }
    let primaries = figures.kills.iter().filter(|k| k.was_primary).count();
    assert!(primaries >= 1, "the primary was killed at least once");
    assert!(figures.acknowledged >= 3_000 && figures.acknowledged == figures.messages);
    assert_eq!(report.acknowledged, figures.acknowledged);
    assert_files(
        &folder.path().join("out"),
        &["failover.csv", "failover-summary.csv", "failover.png"],
    );
    let json = read_json(&folder.path().join("figures.json"));
    assert_eq!(json["checker"]["lost"], 0);
    assert_eq!(json["reads"]["not_in_log"], 0);
    assert_eq!(json["kills"].as_array().unwrap().len(), kills as usize);
}

/// Pauses (SIGSTOP, then SIGCONT) of the primary longer than the suspect
/// timeout: the cluster removes the paused server and fails over; the
/// server, running again, finds itself out of the view, joins as a new
/// member, cuts what the cluster does not agree with and catches up, with
/// no restart.
#[test]
fn paused_primaries_rejoin_by_themselves_with_nothing_lost() {
    let folder = tempfile::tempdir().unwrap();
    let args = FailoverArgs {
        messages: 4_000,
        kills: 3,
        victims: Victims::Primary,
        fault: Fault::Pause,
        fault_ms: 2_000,
        ..base_args(folder.path())
    };
    let figures = failover::run(args).unwrap();
    let report = &figures.report;
    assert!(report.is_clean(), "{report}");
    assert!(figures.reads.is_clean(), "{}", figures.reads);
    assert_eq!(report.acknowledged, figures.acknowledged);
    assert_eq!(figures.acknowledged, figures.messages);
    assert_eq!(figures.kills.len(), 3);
    for kill in &figures.kills {
        assert_eq!(kill.fault, Fault::Pause);
        assert!(kill.was_primary, "{kill:?}");
        assert!(kill.recovery_ms.is_some(), "writes resumed: {kill:?}");
        // Within `BACK_TIMEOUT` (10 s) of SIGCONT, the paused server was
        // one of the stream's replicas again and held every version
        // acknowledged by then, without a restart.
        assert!(kill.back_ms.is_some(), "the server came back: {kill:?}");
        assert!(
            kill.epoch_after > 1,
            "the pause failed the stream over: {kill:?}"
        );
    }
    let json = read_json(&folder.path().join("figures.json"));
    assert_eq!(json["kills"][0]["fault"], "pause");
    assert!(json["kills"][0]["back_ms"].is_number());
}

/// The soak's mix: SIGKILLs and pauses in turn, of random servers.
#[test]
fn a_mix_of_kills_and_pauses_loses_and_duplicates_nothing() {
    let folder = tempfile::tempdir().unwrap();
    let args = FailoverArgs {
        messages: 4_000,
        fault: Fault::Mixed,
        fault_ms: 1_500,
        seed: 2,
        ..base_args(folder.path())
    };
    let figures = failover::run(args).unwrap();
    assert!(figures.report.is_clean(), "{}", figures.report);
    assert!(figures.reads.is_clean(), "{}", figures.reads);
    assert_eq!(figures.acknowledged, figures.messages);
    let faults: Vec<Fault> = figures.kills.iter().map(|k| k.fault).collect();
    assert_eq!(
        faults,
        [Fault::Kill, Fault::Pause, Fault::Kill, Fault::Pause],
        "kills and pauses in turn"
    );
    for kill in &figures.kills {
        assert!(kill.recovery_ms.is_some(), "{kill:?}");
        assert!(kill.back_ms.is_some(), "{kill:?}");
    }
}

#[test]
fn three_servers_survive_a_kill_loop_with_nothing_lost_duplicated_or_divergent() {
    kill_loop(3, 6, Protocol::OneHopAckClient, 7);
}

/// Sender-based logging on one server: each SIGKILL loses what the page
/// buffer held (written every 50 ms), the server comes back, asks the
/// publisher for its copies and puts them back at their versions.
#[test]
fn a_sender_logged_server_killed_and_restarted_loses_nothing_acknowledged() {
    kill_loop_with(1, 4, Protocol::OneHopAckClient, Durability::Sender, 3);
}

/// Sender-based logging with replication: a killed primary's replicas
/// hold every fully logged message; the publisher resends the rest.
#[test]
fn a_sender_logged_cluster_survives_a_kill_loop() {
    kill_loop_with(3, 6, Protocol::OneHopAckClient, Durability::Sender, 5);
}

#[test]
fn five_servers_survive_a_kill_loop_with_nothing_lost_duplicated_or_divergent() {
    kill_loop(5, 6, Protocol::ServerSync, 11);
}
