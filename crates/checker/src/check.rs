//! The checking passes behind [`check`].

use std::collections::{HashMap, HashSet};

use proto::EventId;

use crate::{ClientHistory, Logged, ReplicaLog, Report};

/// Judges the clients' histories against every replica's log of one stream
/// and counts the violations; the crate docs define each count.
///
/// `committed`, when given, limits the check to versions at or below it
/// (the uncommitted tail above may still change). The result depends only
/// on the input, so a failing seed reproduces exactly.
///
/// # Panics
///
/// If one replica's log has more than `u32::MAX` records or there are more
/// than `u32::MAX` replicas or distinct event ids: far beyond any test.
pub fn check(clients: &[ClientHistory], replicas: &[ReplicaLog], committed: Option<u64>) -> Report {
    let mut report = Report::default();
    let mut events = Events::new(replicas.len());
    let acks = collect_clients(clients, &mut events, &mut report);
    let logs = Logs::filter(replicas, committed, &mut report);
    sweep_versions(replicas, &logs, &mut events, &mut report);
    judge_lost(clients, replicas, &logs, &mut events, &mut report);
    judge_acks(&acks, replicas, &logs, &events, &mut report);
    report
}

/// What the checker knows about one event id.
#[derive(Default)]
struct EventInfo {
    /// The digest of the first send; others, if different, are in
    /// `Events::extra_digests`.
    sent_digest: Option<u64>,
    /// The smallest version the event was acknowledged at.
    min_ack: Option<u64>,
    /// The smallest version any replica logs it at.
    first_version: Option<u64>,
    /// Already counted in `duplicated`.
    duplicated: bool,
    /// Already judged by `judge_lost`.
    judged: bool,
}

/// Every event id seen anywhere, with a dense index so that per-event data
/// (including which replicas hold it, as a bitset) sits in flat vectors.
struct Events {
    index: HashMap<EventId, u32>,
    ids: Vec<EventId>,
    info: Vec<EventInfo>,
    extra_digests: HashMap<u32, Vec<u64>>,
    /// `words` u64s per event: bit r set when replica r logs the event.
    holders: Vec<u64>,
    words: usize,
}

impl Events {
    fn new(replicas: usize) -> Self {
        Self {
            index: HashMap::new(),
            ids: Vec::new(),
            info: Vec::new(),
            extra_digests: HashMap::new(),
            holders: Vec::new(),
            words: replicas.div_ceil(64).max(1),
        }
    }

    fn slot(&mut self, event: EventId) -> usize {
        if let Some(&idx) = self.index.get(&event) {
            return idx as usize;
        }
        let idx = u32::try_from(self.ids.len()).expect("fewer than 2^32 event ids");
        self.index.insert(event, idx);
        self.ids.push(event);
        self.info.push(EventInfo::default());
        self.holders.resize(self.holders.len() + self.words, 0);
        idx as usize
    }

    fn record_sent(&mut self, idx: usize, digest: u64) {
        match self.info[idx].sent_digest {
            None => self.info[idx].sent_digest = Some(digest),
            Some(first) if first == digest => {}
            Some(_) => {
                let extra = self.extra_digests.entry(idx as u32).or_default();
                if !extra.contains(&digest) {
                    extra.push(digest);
                }
            }
        }
    }

    /// Whether some client sent this event with this content.
    fn was_sent(&self, idx: usize, digest: u64) -> bool {
        match self.info[idx].sent_digest {
            None => false,
            Some(first) if first == digest => true,
            Some(_) => self
                .extra_digests
                .get(&(idx as u32))
                .is_some_and(|extra| extra.contains(&digest)),
        }
    }

    /// Whether a logged record of this event with this digest is the
    /// message an ack of the event promises: its content was sent, or no
    /// content was recorded for the event at all.
    fn matches_ack(&self, idx: usize, digest: u64) -> bool {
        self.info[idx].sent_digest.is_none() || self.was_sent(idx, digest)
    }

    fn set_holder(&mut self, idx: usize, replica: usize) {
        self.holders[idx * self.words + replica / 64] |= 1 << (replica % 64);
    }

    fn holds(&self, idx: usize, replica: usize) -> bool {
        self.holders[idx * self.words + replica / 64] & (1 << (replica % 64)) != 0
    }

    fn logged_anywhere(&self, idx: usize) -> bool {
        self.holders[idx * self.words..(idx + 1) * self.words]
            .iter()
            .any(|word| *word != 0)
    }
}

/// Registers every sent message and acknowledgement; returns the distinct
/// (version, event index) pairs acknowledged, sorted.
fn collect_clients(
    clients: &[ClientHistory],
    events: &mut Events,
    report: &mut Report,
) -> Vec<(u64, u32)> {
    for client in clients {
        for sent in &client.sent {
            let idx = events.slot(sent.event);
            events.record_sent(idx, sent.digest);
        }
    }
    let mut acks = Vec::new();
    for client in clients {
        for ack in &client.acked {
            let idx = events.slot(ack.event);
            let info = &mut events.info[idx];
            if info.min_ack.is_none() {
                report.acknowledged += 1;
            }
            info.min_ack = Some(info.min_ack.map_or(ack.version, |v| v.min(ack.version)));
            acks.push((ack.version, idx as u32));
        }
    }
    acks.sort_unstable();
    acks.dedup();
    acks
}

/// One checked record: where it sits in its replica's log.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Entry {
    version: u64,
    replica: u32,
    position: u32,
}

/// The checked records of all replicas, sorted by version, then replica,
/// then log position; and each replica's last checked version.
struct Logs {
    entries: Vec<Entry>,
    last: Vec<u64>,
    /// `last`, sorted, to count the replicas that reach a version.
    last_sorted: Vec<u64>,
}

impl Logs {
    /// Applies the `committed` filter, counts `reordered` in log order and
    /// sorts what remains by version.
    fn filter(replicas: &[ReplicaLog], committed: Option<u64>, report: &mut Report) -> Self {
        u32::try_from(replicas.len()).expect("fewer than 2^32 replicas");
        let total = replicas.iter().map(|r| r.records.len()).sum();
        let mut entries = Vec::with_capacity(total);
        let mut last = Vec::with_capacity(replicas.len());
        for (r, log) in replicas.iter().enumerate() {
            u32::try_from(log.records.len()).expect("fewer than 2^32 records per replica");
            let mut previous: Option<u64> = None;
            let mut highest = 0;
            for (position, record) in log.records.iter().enumerate() {
                if committed.is_some_and(|c| record.version > c) {
                    continue;
                }
                if let Some(before) = previous {
                    if record.version <= before {
                        report.reordered += 1;
                        report.example(|| {
                            format!(
                                "reordered: replica {} logs version {} after version {} (position {position})",
                                log.replica, record.version, before
                            )
                        });
                    }
                }
                previous = Some(record.version);
                highest = highest.max(record.version);
                entries.push(Entry {
                    version: record.version,
                    replica: r as u32,
                    position: position as u32,
                });
            }
            last.push(highest);
        }
        entries.sort_unstable();
        let mut last_sorted = last.clone();
        last_sorted.sort_unstable();
        Self {
            entries,
            last,
            last_sorted,
        }
    }

    /// How many replicas' logs reach `version`.
    fn reaching(&self, version: u64) -> usize {
        self.last_sorted.len() - self.last_sorted.partition_point(|&l| l < version)
    }

    fn record<'a>(replicas: &'a [ReplicaLog], entry: &Entry) -> &'a Logged {
        &replicas[entry.replica as usize].records[entry.position as usize]
    }

    /// The entries at one version each, in version order.
    fn groups(&self) -> impl Iterator<Item = &[Entry]> {
        self.entries.chunk_by(|a, b| a.version == b.version)
    }
}

/// One pass over the versions in order: `logged_versions`, `gaps`,
/// `conflicting_versions`, `divergent`, `duplicated` and `unknown_events`,
/// and which replicas hold each event (for `judge_lost`).
fn sweep_versions(replicas: &[ReplicaLog], logs: &Logs, events: &mut Events, report: &mut Report) {
    let mut previous_held: Vec<Option<u64>> = vec![None; replicas.len()];
    let mut reported_unknown: HashSet<(EventId, u64)> = HashSet::new();
    // Per version: distinct messages, and each replica's first record.
    let mut messages: Vec<(EventId, u64)> = Vec::new();
    let mut holdings: Vec<(usize, EventId, u64)> = Vec::new();
    for group in logs.groups() {
        let version = group[0].version;
        report.logged_versions += 1;
        messages.clear();
        holdings.clear();
        for entry in group {
            let r = entry.replica as usize;
            let record = Logs::record(replicas, entry);
            let message = (record.event, record.digest);
            if !messages.contains(&message) {
                messages.push(message);
            }
            if holdings.last().is_none_or(|h| h.0 != r) {
                holdings.push((r, record.event, record.digest));
                if let Some(before) = previous_held[r] {
                    let missing = version - before - 1;
                    if missing > 0 {
                        report.gaps += missing;
                        report.example(|| {
                            format!(
                                "gap: replica {} misses versions {}..={}",
                                replicas[r].replica,
                                before + 1,
                                version - 1
                            )
                        });
                    }
                }
                previous_held[r] = Some(version);
            }
            let idx = events.slot(record.event);
            events.set_holder(idx, r);
            let info = &mut events.info[idx];
            match info.first_version {
                None => info.first_version = Some(version),
                Some(first) if first != version && !info.duplicated => {
                    info.duplicated = true;
                    report.duplicated += 1;
                    report.example(|| {
                        format!(
                            "duplicated: event {} at versions {first} and {version} (replica {})",
                            show(&record.event),
                            replicas[r].replica
                        )
                    });
                }
                Some(_) => {}
            }
            if record.event.client != crate::VOID_CLIENT
                && !events.was_sent(idx, record.digest)
                && reported_unknown.insert(message)
            {
                report.unknown_events += 1;
                report.example(|| {
                    format!(
                        "unknown: version {version} on replica {} holds event {} digest {:#018x}, which no client sent",
                        replicas[r].replica,
                        show(&record.event),
                        record.digest
                    )
                });
            }
        }
        judge_version(version, &messages, &holdings, (replicas, logs), report);
    }
}

/// One version across the replicas: `conflict` when it holds more than one
/// message, `divergent` when replicas hold different ones or one whose log
/// goes past it lacks it.
fn judge_version(
    version: u64,
    messages: &[(EventId, u64)],
    holdings: &[(usize, EventId, u64)],
    (replicas, logs): (&[ReplicaLog], &Logs),
    report: &mut Report,
) {
    if messages.len() > 1 {
        report.conflicting_versions += 1;
        report.example(|| {
            let list: Vec<String> = messages
                .iter()
                .map(|(e, d)| format!("{} digest {d:#018x}", show(e)))
                .collect();
            format!(
                "conflict: version {version} holds {} messages: {}",
                messages.len(),
                list.join("; ")
            )
        });
    }
    let (r0, e0, d0) = holdings[0];
    let differing = holdings.iter().find(|h| (h.1, h.2) != (e0, d0));
    let reaching = logs.reaching(version);
    if let Some(&(r1, e1, d1)) = differing {
        report.divergent += 1;
        report.example(|| {
            format!(
                "divergent: version {version} is event {} digest {d0:#018x} on replica {} but event {} digest {d1:#018x} on replica {}",
                show(&e0),
                replicas[r0].replica,
                show(&e1),
                replicas[r1].replica
            )
        });
    } else if holdings.len() < reaching {
        report.divergent += 1;
        report.example(|| {
            let missing: Vec<&str> = (0..replicas.len())
                .filter(|&r| logs.last[r] >= version && !holdings.iter().any(|h| h.0 == r))
                .map(|r| replicas[r].replica.as_str())
                .collect();
            format!(
                "divergent: version {version} is on replica {} but missing from {} whose logs go past it",
                replicas[r0].replica,
                missing.join(", ")
            )
        });
    }
}

/// `lost`, judged once per acknowledged event, in the clients' order.
fn judge_lost(
    clients: &[ClientHistory],
    replicas: &[ReplicaLog],
    logs: &Logs,
    events: &mut Events,
    report: &mut Report,
) {
    for ack in clients.iter().flat_map(|c| &c.acked) {
        let idx = events.slot(ack.event);
        if events.info[idx].judged {
            continue;
        }
        events.info[idx].judged = true;
        let version = events.info[idx].min_ack.expect("acknowledged");
        if !events.logged_anywhere(idx) {
            report.lost += 1;
            report.example(|| {
                format!(
                    "lost: event {} acknowledged at version {version} is on no replica",
                    show(&ack.event)
                )
            });
            continue;
        }
        let missing =
            (0..replicas.len()).find(|&r| logs.last[r] >= version && !events.holds(idx, r));
        if let Some(r) = missing {
            report.lost += 1;
            report.example(|| {
                format!(
                    "lost: event {} acknowledged at version {version} is missing from replica {} whose log reaches version {}",
                    show(&ack.event),
                    replicas[r].replica,
                    logs.last[r]
                )
            });
        }
    }
}

/// `misplaced_acks`: walks the sorted acknowledgement pairs alongside the
/// sorted log entries.
fn judge_acks(
    acks: &[(u64, u32)],
    replicas: &[ReplicaLog],
    logs: &Logs,
    events: &Events,
    report: &mut Report,
) {
    let entries = &logs.entries;
    let mut start = 0;
    for &(version, idx) in acks {
        let idx = idx as usize;
        let event = events.ids[idx];
        while start < entries.len() && entries[start].version < version {
            start += 1;
        }
        let end = start + entries[start..].partition_point(|e| e.version == version);
        let group = &entries[start..end];
        let wrong = group.iter().find(|entry| {
            let record = Logs::record(replicas, entry);
            record.event != event || !events.matches_ack(idx, record.digest)
        });
        if let Some(entry) = wrong {
            let record = Logs::record(replicas, entry);
            report.misplaced_acks += 1;
            report.example(|| {
                format!(
                    "misplaced ack: event {} acknowledged at version {version}, but replica {} holds event {} digest {:#018x} there",
                    show(&event),
                    replicas[entry.replica as usize].replica,
                    show(&record.event),
                    record.digest
                )
            });
            continue;
        }
        let here = group
            .iter()
            .any(|entry| Logs::record(replicas, entry).event == event);
        if !here && events.logged_anywhere(idx) {
            report.misplaced_acks += 1;
            let logged_at = events.info[idx].first_version.expect("logged");
            report.example(|| {
                format!(
                    "misplaced ack: event {} acknowledged at version {version}, but logged at version {logged_at}",
                    show(&event)
                )
            });
        }
    }
}

/// An event id in examples: client (hex) / session / sequence.
fn show(event: &EventId) -> String {
    format!("{:x}/{}/{}", event.client, event.session, event.sequence)
}
