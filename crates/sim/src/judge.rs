//! The end of a run: the history checker over the logs and the clients'
//! histories, then liveness, convergence and the replicas' own counters.

use std::sync::Arc;

use checker::{Acked, ClientHistory, Logged, ReplicaLog, Report};
use engine::replication::{Entry, Protocol};

use crate::config::Sabotage;
use crate::outcome::{ClientState, Outcome, ReplicaState};
use crate::world::{show, Server, World};

/// Judges the world as the run left it.
pub(crate) fn judge(mut world: World<'_>) -> Outcome {
    world.counters.end_ms = world.now;
    world.counters.heal_ms = world.heal_at;
    sabotage(&mut world);
    let reports = if world.aborted {
        Vec::new()
    } else {
        check_histories(&world)
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
        let (id, metrics) = (
            world.servers[index].id,
            world.servers[index].replica.metrics(),
        );
        if metrics.conflicts > 0 {
            world.fail(format!(
                "server {id} logged {} events again at another version (conflicts)",
                metrics.conflicts
            ));
        }
        world.counters.voided += metrics.voided;
        world.counters.gap_requests += metrics.gap_requests;
        world.counters.duplicates += metrics.duplicates;
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
/// server's log with the acknowledgements that server gave.
fn check_histories(world: &World<'_>) -> Vec<(String, Report)> {
    let logs: Vec<ReplicaLog> = world.servers.iter().map(replica_log).collect();
    if world.config.protocol == Protocol::Unversioned {
        return world
            .servers
            .iter()
            .zip(&logs)
            .map(|(server, log)| {
                let histories = histories(world, |from| from == Some(server.id));
                let name = format!("server {}", server.id);
                (
                    name,
                    checker::check(&histories, std::slice::from_ref(log), None),
                )
            })
            .collect();
    }
    let histories = histories(world, |_| true);
    vec![(
        "all replicas".to_string(),
        checker::check(&histories, &logs, None),
    )]
}

/// Every client's sends, and its acknowledgements filtered by `take`
/// (called with the acking server, or `None` for the version the producer
/// reported). Each server's ack is judged on its own, so an ack that names
/// another version than the rest is caught.
fn histories(world: &World<'_>, take: impl Fn(Option<u32>) -> bool) -> Vec<ClientHistory> {
    world
        .clients
        .iter()
        .map(|client| {
            let mut acked = Vec::new();
            for (event, acknowledged) in &client.acknowledged {
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
    for failure in failures {
        world.fail(failure);
    }
}

/// Every log ends where the primary's does, every version is visible, and
/// the replicas hold the same bytes under each version.
fn check_convergence(world: &mut World<'_>) {
    let mut failures = Vec::new();
    let primary = &world.servers[0];
    let primary_last = primary.replica.last_version();
    for server in &world.servers {
        let last = server.replica.last_version();
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
        let differing = server.log.iter().zip(&primary.log).find(|(mine, theirs)| {
            !Arc::ptr_eq(&mine.bytes, &theirs.bytes) && mine.bytes != theirs.bytes
        });
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
    let replica = &server.replica;
    ReplicaState {
        server: server.id,
        last_version: replica.last_version(),
        logged: replica.logged(),
        committed: replica.committed(),
        visible: server.visible,
        log_length: server.log.len() as u64,
        held: replica.held(),
        metrics: replica.metrics(),
    }
}
