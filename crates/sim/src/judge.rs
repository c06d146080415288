//! The end of a run: the history checker over the logs and the clients'
//! histories, then liveness, convergence and the replicas' own counters.

use std::collections::BTreeSet;

use checker::{Acked, ClientHistory, Logged, ReplicaLog, Report};
use engine::replication::{AckRule, Entry, Protocol};
use proto::EventId;

use crate::config::Sabotage;
use crate::outcome::{ClientState, Outcome, ReplicaState};
use crate::servers::metrics_of;
use crate::trace::show;
use crate::world::{Server, World};

/// Judges the world as the run left it.
pub(crate) fn judge(mut world: World<'_>) -> Outcome {
    world.counters.end_ms = world.now;
    world.counters.heal_ms = world.heal_at;
    sabotage(&mut world);
    let reports = if world.aborted {
        Vec::new()
    } else {
        check_histories(&mut world)
    };
    for (name, report) in &reports {
        if !report.is_clean() {
            let counts: Vec<String> = report
                .violations()
                .iter()
                .filter(|(_, count)| *count > 0)
                .map(|(what, count)| format!("{what} {count}"))
                .collect();
            world.fail(format!("history check of {name}: {}", counts.join(", ")));
        }
    }
    if !world.aborted {
        check_liveness(&mut world);
        if world.config.protocol != Protocol::Unversioned {
            check_convergence(&mut world);
        }
    }
    for index in 0..world.servers.len() {
        let (id, metrics) = (world.servers[index].id, metrics_of(&world.servers[index]));
        if metrics.conflicts > 0 {
            world.fail(format!(
                "server {id} logged {} events again at another version (conflicts)",
                metrics.conflicts
            ));
        }
        world.counters.voided += metrics.voided;
        world.counters.gap_requests += metrics.gap_requests;
        world.counters.duplicates += metrics.duplicates;
        world.counters.resent_placed += metrics.resent_placed;
    }
    Outcome {
        seed: world.config.seed,
        protocol: world.config.protocol,
        reports,
        counters: world.counters,
        replicas: world.servers.iter().map(replica_state).collect(),
        clients: world
            .clients
            .iter()
            .map(|c| ClientState {
                client: c.id,
                slot: c.slot,
                quota: c.quota,
                sent: c.sent.len() as u32,
                acked: c.acknowledged.len() as u32,
                refused: c.refused,
                in_flight: c.producer.in_flight(),
                crashed: c.crashed,
            })
            .collect(),
        failures: world.take_failures(),
        trace: std::mem::take(&mut world.trace),
        trace_hash: world.hash,
    }
}

/// The after-the-run sabotage: changes a log before it is judged.
fn sabotage(world: &mut World<'_>) {
    let Some(sabotage) = world.config.sabotage else {
        return;
    };
    let (server, version, corrupt) = match sabotage {
        Sabotage::DropRecord { server, version } => (server, version, false),
        Sabotage::CorruptRecord { server, version } => (server, version, true),
        Sabotage::SkipAppend { .. } => return,
    };
    let Some(state) = world.servers.iter_mut().find(|s| s.id == server) else {
        return;
    };
    let Some(position) = state.log.iter().position(|e| e.version() == version) else {
        return;
    };
    if corrupt {
        let entry = &state.log[position];
        let record = entry.record();
        let mut payload = record.payload.to_vec();
        match payload.first_mut() {
            Some(byte) => *byte ^= 0xff,
            None => payload.push(0xff),
        }
        let header = entry.header;
        let key = record.key.to_vec();
        state.log[position] = Entry::new(header, &key, &payload);
    } else {
        state.log.remove(position);
    }
    let what = if corrupt { "corrupts" } else { "drops" };
    world.note(|| format!("sabotage: {what} version {version} of server {server}'s log"));
}

/// The checker's verdicts: all logs together, or for `unversioned` each
/// server's log with the acknowledgements that server gave. Acknowledged
/// messages lost within the protocol's documented loss window (a primary
/// alone had them when it crashed) are counted, set aside, and the rest
/// judged again.
fn check_histories(world: &mut World<'_>) -> Vec<(String, Report)> {
    let logs: Vec<ReplicaLog> = world.servers.iter().map(replica_log).collect();
    if world.config.protocol == Protocol::Unversioned {
        return world
            .servers
            .iter()
            .zip(&logs)
            .map(|(server, log)| {
                let histories = histories(world, |from| from == Some(server.id), |_| true);
                let name = format!("server {}", server.id);
                (
                    name,
                    checker::check(&histories, std::slice::from_ref(log), None),
                )
            })
            .collect();
    }
    let all = histories(world, |_| true, |_| true);
    let report = checker::check(&all, &logs, None);
    if report.lost == 0 && report.misplaced_acks == 0 {
        return vec![("all replicas".to_string(), report)];
    }
    let window = lost_in_window(world, &logs);
    let admitted: BTreeSet<EventId> = admitted_losses(world, &logs)
        .into_iter()
        .filter(|event| !window.contains(event))
        .collect();
    if window.is_empty() && admitted.is_empty() {
        return vec![("all replicas".to_string(), report)];
    }
    world.counters.acked_lost_in_window = window.len() as u64;
    world.counters.admitted_losses = admitted.len() as u64;
    let judged = histories(
        world,
        |_| true,
        |event| !window.contains(event) && !admitted.contains(event),
    );
    let aside = match (window.is_empty(), admitted.is_empty()) {
        (false, true) => "acknowledged messages lost within the loss window set aside",
        (true, false) => "admitted sender-logging losses set aside",
        _ => "acknowledged messages lost within the loss window and admitted sender-logging losses set aside",
    };
    vec![(
        format!("all replicas, {aside}"),
        checker::check(&judged, &logs, None),
    )]
}

/// The logged (event, version) pairs of every log.
fn logged_pairs(logs: &[ReplicaLog]) -> BTreeSet<(EventId, u64)> {
    logs.iter()
        .flat_map(|log| log.records.iter().map(|r| (r.event, r.version)))
        .collect()
}

/// Sender-based logging keeps its promises for one failure at a time: an
/// acknowledged message that the primary's log had not synced may live
/// only in its client's copy (when the primary counted no backup that
/// holds it), and a client that crashes while a server crash has cost
/// the log that message takes the last copy with it. Admitted here, and
/// only here: an acknowledged message that no log holds at its version,
/// of a client process that crashed, acknowledged before a server crash
/// (or delivered after it, within the network's longest delay) at a
/// version past the newest checkpoint announced by then, where the
/// client crashed before the first checkpoint announced after that
/// server crash (after it, the copies it held were taken back or
/// covered).
fn admitted_losses(world: &World<'_>, logs: &[ReplicaLog]) -> BTreeSet<EventId> {
    if !world.config.sender || world.sender_crashes.is_empty() {
        return BTreeSet::new();
    }
    let logged = logged_pairs(logs);
    // An acknowledgement sent before the crash may arrive this late.
    let late = world.config.straggler_ms_max.max(world.config.delay_ms_max);
    let mut admitted = BTreeSet::new();
    for client in world.clients.iter() {
        let Some(crashed_at) = client.crashed_at else {
            continue;
        };
        for ((event, acknowledged), &acked_at) in client.acknowledged.iter().zip(&client.acked_at) {
            let version = acknowledged.version;
            if logged.contains(&(*event, version)) {
                continue;
            }
            let exposed = world.sender_crashes.iter().any(|crash| {
                let settled = world
                    .checkpoint_times
                    .iter()
                    .copied()
                    .find(|&at| at > crash.at_ms)
                    .unwrap_or(u64::MAX);
                acked_at <= crash.at_ms + late && version > crash.checkpoint && crashed_at < settled
            });
            if exposed {
                admitted.insert(*event);
            }
        }
    }
    admitted
}

/// Acknowledged messages that no log holds at the version they were
/// acknowledged at (none at all, or a straggling copy stamped again by a
/// later primary), where the protocol's loss window allows it: stamped
/// under a rule that acknowledges before the other replicas log
/// (`server-async`, `client-async` and a `hybrid` stream's client-async
/// messages), in a run where a server crashed.
fn lost_in_window(world: &World<'_>, logs: &[ReplicaLog]) -> BTreeSet<EventId> {
    if world.counters.server_crashes == 0 {
        return BTreeSet::new();
    }
    let logged = logged_pairs(logs);
    world
        .clients
        .iter()
        .flat_map(|c| c.acknowledged.iter())
        .filter(|(event, acknowledged)| !logged.contains(&(*event, acknowledged.version)))
        .map(|(event, _)| *event)
        .filter(|event| {
            matches!(
                world.stamped_rules.get(event),
                Some(AckRule::PrimaryOnly | AckRule::FirstReplica)
            )
        })
        .collect()
}

/// Every client's sends, and its acknowledgements filtered by `take`
/// (called with the acking server, or `None` for the version the producer
/// reported) and by `judged` (the event). Each server's ack is judged on
/// its own, so an ack that names another version than the rest is caught.
fn histories(
    world: &World<'_>,
    take: impl Fn(Option<u32>) -> bool,
    judged: impl Fn(&EventId) -> bool,
) -> Vec<ClientHistory> {
    world
        .clients
        .iter()
        .map(|client| {
            let mut acked = Vec::new();
            for (event, acknowledged) in &client.acknowledged {
                if !judged(event) {
                    continue;
                }
                let duplicate = acknowledged.duplicate;
                if take(None) {
                    acked.push(Acked {
                        event: *event,
                        version: acknowledged.version,
                        duplicate,
                    });
                }
                for &(server, version) in &acknowledged.acks {
                    if take(Some(server)) {
                        acked.push(Acked {
                            event: *event,
                            version,
                            duplicate,
                        });
                    }
                }
            }
            ClientHistory {
                sent: client.sent.clone(),
                acked,
            }
        })
        .collect()
}

fn replica_log(server: &Server) -> ReplicaLog {
    ReplicaLog {
        replica: format!("server {}", server.id),
        records: server
            .log
            .iter()
            .map(|entry| {
                let record = entry.record();
                Logged {
                    version: entry.version(),
                    event: record.header.event,
                    digest: checker::digest(record.key, record.payload),
                }
            })
            .collect(),
    }
}

/// Every message of a client that did not crash was acknowledged.
fn check_liveness(world: &mut World<'_>) {
    let mut failures = Vec::new();
    for client in world.clients.iter().filter(|c| !c.crashed) {
        let (sent, acked) = (client.sent.len() as u32, client.acknowledged.len() as u32);
        if sent < client.quota || acked < sent || client.refused > 0 {
            let stuck: Vec<String> = client
                .sent
                .iter()
                .filter(|s| !client.acknowledged.iter().any(|(e, _)| *e == s.event))
                .take(5)
                .map(|s| show(&s.event))
                .collect();
            failures.push(format!(
                "client {:x} (slot {}) did not finish: quota {}, sent {sent}, acknowledged {acked}, refused {}; first unfinished: {}",
                client.id,
                client.slot,
                client.quota,
                client.refused,
                stuck.join(" ")
            ));
        }
    }
    let counters = &world.counters;
    if counters.failovers > 0 && counters.acked_after_last_failover == 0 {
        failures.push(format!(
            "no write was acknowledged after the last failover (at {} ms)",
            counters.last_failover_ms
        ));
    }
    for failure in failures {
        world.fail(failure);
    }
}

/// Every log ends where the primary's does, every version is visible, and
/// the replicas hold the same bytes under each version.
fn check_convergence(world: &mut World<'_>) {
    let mut failures = Vec::new();
    let primary = world
        .primary()
        .map(|p| &world.servers[p as usize - 1])
        .filter(|s| s.replica.is_some());
    let Some(primary) = primary else {
        world.fail("no running primary at the end".to_string());
        return;
    };
    let primary_last = primary.replica.as_ref().map_or(0, |r| r.last_version());
    for server in &world.servers {
        let Some(replica) = server.replica.as_ref() else {
            failures.push(format!("server {} does not run at the end", server.id));
            continue;
        };
        let last = replica.last_version();
        let length = server.log.len() as u64;
        if last != primary_last || length != last {
            failures.push(format!(
                "server {} did not converge: last version {last}, log length {length}, primary's last version {primary_last}",
                server.id
            ));
        }
        if server.visible != last || server.durable != length {
            failures.push(format!(
                "server {}: visible {} and durable {} at the end, last version {last}",
                server.id, server.visible, server.durable
            ));
        }
        let differing = server
            .log
            .iter()
            .zip(&primary.log)
            .find(|(mine, theirs)| !world.same_record(mine, theirs));
        if let Some((mine, _)) = differing {
            failures.push(format!(
                "server {} holds other bytes than the primary at version {}",
                server.id,
                mine.version()
            ));
        }
    }
    for failure in failures {
        world.fail(failure);
    }
}

fn replica_state(server: &Server) -> ReplicaState {
    let replica = server.replica.as_ref();
    ReplicaState {
        server: server.id,
        running: replica.is_some(),
        last_version: replica.map_or(0, |r| r.last_version()),
        logged: replica.map_or(0, |r| r.logged()),
        committed: replica.map_or(0, |r| r.committed()),
        visible: server.visible,
        log_length: server.log.len() as u64,
        held: replica.map_or(0, |r| r.held()),
        metrics: metrics_of(server),
    }
}
