//! Partitions with real processes (issue 17): every server a separate
//! `stamplog server` process in a network namespace of its own, on its own
//! address (10.x.<id>.2), joined through a router namespace where the
//! test cuts links (`bench::network`). A writer at a steady rate and a
//! reader on every server run through each fault; at the end the history
//! checker judges every replica's log and every read: 0 lost, 0
//! duplicated, 0 divergent, and every server touched by a fault complete
//! again within 10 s of the heal.
//!
//! Namespaces need root and the `ip` tool. Where they cannot be made the
//! tests say so on stderr and skip, unless `STAMPLOG_REQUIRE_NETNS` is set
//! (CI sets it), when they fail.

use std::sync::Mutex;

use bench::failover::{self, FailoverArgs, FailoverFigures, Fault, Network, Victims};
use bench::network::{Namespaces, REQUIRE_ENV};

use crate::failover::base_args;

/// One namespace cluster at a time: each is five to seven processes on a
/// machine of two cores.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Runs the fault loop in namespaces, or says why not and returns `None`.
fn run_in_namespaces(
    servers: u32,
    fault: Fault,
    victims: Victims,
    kills: u32,
) -> Option<FailoverFigures> {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(why) = Namespaces::unavailable() {
        assert!(
            std::env::var_os(REQUIRE_ENV).is_none(),
            "{REQUIRE_ENV} is set, but network namespaces cannot be made here: {why}"
        );
        eprintln!("SKIPPED: the partition tests need network namespaces: {why}");
        return None;
    }
    let folder = tempfile::tempdir().unwrap();
    let args = FailoverArgs {
        servers,
        messages: 1_000 * u64::from(kills + 1),
        kills,
        victims,
        fault,
        fault_ms: 2_500,
        network: Network::Namespaces,
        settle_ms: 500,
        ..base_args(folder.path())
    };
    let figures = failover::run(args).unwrap();
    assert_clean(&figures);
    Some(figures)
}

/// What every scenario must show: the checker's counts all 0, every
/// acknowledged message read by the readers, every fault recovered, and
/// every server it touched a complete replica again within 10 s.
fn assert_clean(figures: &FailoverFigures) {
    let report = &figures.report;
    assert!(report.is_clean(), "{report}");
    assert!(figures.reads.is_clean(), "{}", figures.reads);
    assert_eq!(report.acknowledged, figures.acknowledged);
    assert_eq!(
        figures.acknowledged, figures.messages,
        "every message acknowledged"
    );
    for kill in &figures.kills {
        assert!(kill.recovery_ms.is_some(), "writes resumed: {kill:?}");
        assert!(
            kill.back_ms.is_some(),
            "complete again within 10 s: {kill:?}"
        );
    }
}

/// The primary cut off from both of its replicas, while its clients still
/// reach it. It cannot gather the majority its acknowledgements need, so
/// it acknowledges nothing its replicas do not hold (0 lost: every
/// acknowledged message is in every final replica); the others fail the
/// stream over to a new epoch; healed, the old primary finds itself out of
/// the view, is fenced by the new epoch and comes back as a replica.
#[test]
fn a_primary_cut_off_from_its_replicas_acknowledges_nothing_alone_and_is_fenced_on_heal() {
    let Some(figures) = run_in_namespaces(3, Fault::Partition, Victims::Primary, 2) else {
        return;
    };
    let mut epoch = 1;
    for kill in &figures.kills {
        assert!(kill.was_primary, "{kill:?}");
        assert_ne!(kill.primary_after, kill.victim, "a new primary: {kill:?}");
        assert!(
            kill.epoch_after > epoch,
            "a new epoch fences the old primary: {kill:?}"
        );
        epoch = kill.epoch_after;
    }
}

/// Five servers, the primary and one other on the minority side: the
/// minority cannot change the view or the in-sync set, the majority fails
/// over and refills the stream, and both minority servers rejoin.
#[test]
fn a_minority_partition_of_five_servers_loses_nothing() {
    let Some(figures) = run_in_namespaces(5, Fault::Minority, Victims::Primary, 1) else {
        return;
    };
    let kill = &figures.kills[0];
    assert_eq!(
        kill.partners.len(),
        1,
        "two of five on the minority side: {kill:?}"
    );
    assert_ne!(kill.primary_after, kill.victim, "{kill:?}");
}

/// The link between the primary and one backup cut and mended every
/// 250 ms: retransmissions ride it out or the view changes; either way
/// nothing is lost or duplicated.
#[test]
fn a_flapping_link_loses_and_duplicates_nothing() {
    let Some(figures) = run_in_namespaces(3, Fault::Flap, Victims::Primary, 2) else {
        return;
    };
    assert!(figures.kills.iter().all(|k| k.partners.len() == 1));
}

/// The primary's packets to the other servers dropped, theirs to it
/// delivered: it hears the cluster but cannot answer it.
#[test]
fn a_one_way_partition_loses_and_duplicates_nothing() {
    let Some(figures) = run_in_namespaces(3, Fault::OneWay, Victims::Primary, 2) else {
        return;
    };
    assert!(figures.kills.iter().all(|k| k.epoch_after > 1));
}

/// Every kind of fault in turn (SIGKILL, pause, partition, one-way, flap,
/// minority) of random servers, on three distinct addresses.
#[test]
fn every_kind_of_fault_in_turn_on_three_distinct_addresses() {
    let Some(figures) = run_in_namespaces(3, Fault::Mixed, Victims::Random, 6) else {
        return;
    };
    let hosts: std::collections::BTreeSet<_> = figures.addresses.iter().map(|a| a.ip()).collect();
    assert_eq!(
        hosts.len(),
        3,
        "three distinct addresses: {:?}",
        figures.addresses
    );
    assert!(hosts.iter().all(|h| !h.is_loopback()), "{hosts:?}");
    let faults: Vec<Fault> = figures.kills.iter().map(|k| k.fault).collect();
    assert_eq!(
        faults,
        [
            Fault::Kill,
            Fault::Pause,
            Fault::Partition,
            Fault::OneWay,
            Fault::Flap,
            Fault::Minority
        ]
    );
}

/// `bench soak` sized by time: 0.1 minutes at 1,000 messages a second
/// with 20 faults a minute is the failover loop with 6,000 messages and two
/// faults (a SIGKILL and a pause, the mix's first two), judged clean.
#[test]
fn a_short_soak_is_the_fault_loop_sized_by_time_and_judged_clean() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let folder = tempfile::tempdir().unwrap();
    let args = bench::SoakArgs {
        server_binary: Some(crate::stamplog_binary()),
        minutes: 0.1,
        faults_per_minute: 20.0,
        fault_ms: 1_000,
        servers: 3,
        rate: 1_000,
        payload: 100,
        network: Some(Network::Loopback),
        seed: 3,
        output: crate::quiet_output(folder.path()),
    };
    let loop_args = bench::soak::failover_args(&args, Network::Loopback).unwrap();
    assert_eq!(loop_args.messages, 6_000);
    assert_eq!(loop_args.kills, 2);
    assert_eq!(loop_args.fault, Fault::Mixed);
    let figures = bench::soak::run(args).unwrap();
    assert_clean(&figures);
    let faults: Vec<Fault> = figures.kills.iter().map(|k| k.fault).collect();
    assert_eq!(faults, [Fault::Kill, Fault::Pause]);
}
