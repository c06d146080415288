//! The scrape: every metric of `/metrics` that is not kept on the data
//! path is read here, from the server's state at the moment of the scrape
//! (the streams' logs and replication state, the control plane's view and
//! placements, the connection counters), and encoded with the data
//! path's histograms by prometheus-client. Names start with `stamplog_`,
//! carry their unit, and counters end in `_total` (docs/operations.md,
//! "Metrics", lists each one).

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Unit;

use crate::metrics::{Histogram, Metrics};
use crate::run::CurrentServer;
use crate::state::ServerState;
use crate::stream::{Stream, StreamGauges};

type Labels = Vec<(&'static str, String)>;

/// What one scrape reads of one server.
pub(crate) struct ServerCollector {
    pub(crate) current: CurrentServer,
}

impl fmt::Debug for ServerCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ServerCollector")
    }
}

impl Collector for ServerCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let Some(server) = self.current.get() else {
            return Ok(());
        };
        let mut out = Out {
            encoder: &mut encoder,
        };
        server_families(&server, &mut out)?;
        journal_families(&server, &mut out)?;
        let streams = server.streams();
        let snapshots: Vec<Snapshot> = streams.iter().map(Snapshot::of).collect();
        stream_families(&snapshots, &mut out)?;
        if let Some(metrics) = &server.metrics {
            metrics.retain_streams(|id| streams.iter().any(|s| s.id == id));
            data_path_families(metrics, &snapshots, &mut out)?;
        }
        cluster_families(&server, &mut out)
    }
}

/// One stream at the scrape.
struct Snapshot {
    id: u64,
    labels: Labels,
    gauges: StreamGauges,
    log: wal::LogMetrics,
    newest_checkpoint: u64,
    readers: (usize, u64),
    failed: bool,
}

impl Snapshot {
    fn of(stream: &Arc<Stream>) -> Snapshot {
        Snapshot {
            id: stream.id,
            labels: vec![
                ("stream", stream.name.clone()),
                ("protocol", stream.protocol.name().to_string()),
            ],
            gauges: stream.gauges(),
            log: stream.log.metrics(),
            newest_checkpoint: stream.log.checkpoints().first().copied().unwrap_or(0),
            readers: stream.reader_lag(),
            failed: stream.log.failure().is_some(),
        }
    }
}

/// The encoder, and a family per call.
struct Out<'a, 'b> {
    encoder: &'a mut DescriptorEncoder<'b>,
}

impl Out<'_, '_> {
    fn family<M: EncodeMetric>(
        &mut self,
        (name, help, unit): (&str, &str, Option<Unit>),
        kind: MetricType,
        samples: impl IntoIterator<Item = (Labels, M)>,
    ) -> fmt::Result {
        let mut family = self
            .encoder
            .encode_descriptor(name, help, unit.as_ref(), kind)?;
        let mut samples = samples.into_iter().peekable();
        if let Some((labels, _)) = samples.peek() {
            if labels.is_empty() {
                // A family of one unlabelled sample.
                let (_, metric) = samples.next().expect("peeked");
                return metric.encode(family);
            }
        }
        for (labels, metric) in samples {
            metric.encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }

    fn gauge(&mut self, name: &str, help: &str, unit: Option<Unit>, value: f64) -> fmt::Result {
        self.gauges(name, help, unit, [(Labels::new(), value)])
    }

    fn counter(&mut self, name: &str, help: &str, unit: Option<Unit>, value: u64) -> fmt::Result {
        self.counters(name, help, unit, [(Labels::new(), value)])
    }

    fn gauges(
        &mut self,
        name: &str,
        help: &str,
        unit: Option<Unit>,
        samples: impl IntoIterator<Item = (Labels, f64)>,
    ) -> fmt::Result {
        let samples = samples.into_iter().map(|(l, v)| (l, ConstGauge::new(v)));
        self.family((name, help, unit), MetricType::Gauge, samples)
    }

    fn counters(
        &mut self,
        name: &str,
        help: &str,
        unit: Option<Unit>,
        samples: impl IntoIterator<Item = (Labels, u64)>,
    ) -> fmt::Result {
        let samples = samples.into_iter().map(|(l, v)| (l, ConstCounter::new(v)));
        self.family((name, help, unit), MetricType::Counter, samples)
    }

    fn histogram(
        &mut self,
        name: &str,
        help: &str,
        unit: Option<Unit>,
        h: &Histogram,
    ) -> fmt::Result {
        self.family(
            (name, help, unit),
            MetricType::Histogram,
            [(Labels::new(), h)],
        )
    }
}

/// The runtime the server runs on: its workers (none outside a runtime).
fn runtime_family(out: &mut Out) -> fmt::Result {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return Ok(());
    };
    out.gauge(
        "stamplog_runtime_workers",
        "Worker threads of the runtime this server runs on (runtime_workers).",
        None,
        runtime.metrics().num_workers() as f64,
    )
}

/// The server's own numbers: uptime, connections, refusals, bytes.
fn server_families(server: &ServerState, out: &mut Out) -> fmt::Result {
    out.gauge(
        "stamplog_uptime",
        "Time since this server opened its data folder.",
        Some(Unit::Seconds),
        server.started.elapsed().as_secs_f64(),
    )?;
    out.gauge(
        "stamplog_ready",
        "1 when the server is in the view and every replica it holds is in sync (what /health/ready answers).",
        None,
        if super::http::is_ready(server) { 1.0 } else { 0.0 },
    )?;
    runtime_family(out)?;
    out.gauge(
        "stamplog_connections",
        "Client and peer connections served now.",
        None,
        (server.config.connections_max - server.connection_slots.available_permits()) as f64,
    )?;
    out.counter(
        "stamplog_logins_refused",
        "Hellos refused for a wrong, revoked or missing token.",
        None,
        load(&server.logins_refused),
    )?;
    out.counter(
        "stamplog_tls_refused",
        "Connections refused by TLS (a failed handshake, or a server's hello without its certificate).",
        None,
        load(&server.tls_refused),
    )?;
    out.counter(
        "stamplog_writes_busy",
        "Replicated writes refused with Busy for their connection's writes or bytes in flight.",
        None,
        load(&server.writes_busy),
    )?;
    let router = &server.router.metrics;
    out.counter(
        "stamplog_peer_messages_sent",
        "Replication messages sent to peers.",
        None,
        load(&router.peer_sent),
    )?;
    out.counter(
        "stamplog_peer_messages_dropped",
        "Replication messages dropped because a peer's queue was full (the protocols repair them).",
        None,
        load(&router.peer_dropped),
    )?;
    out.gauge(
        "stamplog_damaged_copies",
        "Copies of streams this server could not open, kept in <data>/damaged/ for an operator to look at.",
        None,
        server.damaged_copies() as f64,
    )?;
    out.counter(
        "stamplog_client_messages_dropped",
        "Messages for a client dropped because its connection was gone or its queue full (it resends).",
        None,
        load(&router.client_dropped),
    )
}

/// The server's journal, when it has one.
fn journal_families(server: &ServerState, out: &mut Out) -> fmt::Result {
    let Some(journal) = server.journal_metrics() else {
        return Ok(());
    };
    out.counter(
        "stamplog_journal_rounds",
        "Rounds written to the journal: several streams' small batches in one write and one fdatasync.",
        None,
        journal.rounds,
    )?;
    out.counter(
        "stamplog_journal_records",
        "Records the journal's rounds carried.",
        None,
        journal.records,
    )?;
    out.counter(
        "stamplog_journal_written",
        "Bytes of frames written to the journal.",
        Some(Unit::Bytes),
        journal.bytes,
    )?;
    out.counter(
        "stamplog_journal_direct_writes",
        "Batches written past the journal into their own segment and synced there (a stream alone in its round, 32 KiB or more, or any while few streams are busy).",
        None,
        journal.direct_writes,
    )?;
    out.counter(
        "stamplog_journal_in_place_writes",
        "Of the direct writes, those the connection's reader that appended the record made itself, without waking the journal's thread (a record alone, its stream alone on the journal).",
        None,
        journal.in_place_writes,
    )?;
    out.counter(
        "stamplog_journal_rotations",
        "Times the journal synced the segments it wrote through the page cache and started again.",
        None,
        journal.rotations,
    )
}

/// Each stream's numbers, labelled with its name and protocol.
fn stream_families(streams: &[Snapshot], out: &mut Out) -> fmt::Result {
    out.gauges(
        "stamplog_stream_last_version",
        "The newest version this replica holds.",
        None,
        each(streams, |s| s.gauges.last_version as f64),
    )?;
    out.gauges(
        "stamplog_stream_committed_version",
        "The newest version this replica knows to be committed (readers see up to it).",
        None,
        each(streams, |s| s.gauges.committed_version as f64),
    )?;
    out.gauges(
        "stamplog_stream_is_primary",
        "1 on the stream's primary.",
        None,
        each(streams, |s| u8::from(s.gauges.is_primary) as f64),
    )?;
    log_families(streams, out)?;
    replica_families(streams, out)?;
    reader_families(streams, out)
}

/// `value` of each stream, labelled with its name and protocol.
fn each<T>(streams: &[Snapshot], value: impl Fn(&Snapshot) -> T) -> Vec<(Labels, T)> {
    streams
        .iter()
        .map(|s| (s.labels.clone(), value(s)))
        .collect()
}

/// Each stream's log: appends, group commits, bytes, buffer-full waits.
fn log_families(streams: &[Snapshot], out: &mut Out) -> fmt::Result {
    out.counters(
        "stamplog_log_appends",
        "Records appended to the stream's log on this server.",
        None,
        each(streams, |s| s.log.appends),
    )?;
    out.counters(
        "stamplog_log_fdatasyncs",
        "Group commits (write + fdatasync, or page writes) of the stream's log.",
        None,
        each(streams, |s| s.log.syncs),
    )?;
    out.counters(
        "stamplog_log_written",
        "Bytes written to the stream's log.",
        Some(Unit::Bytes),
        each(streams, |s| s.log.bytes_written),
    )?;
    out.counters(
        "stamplog_log_buffer_full_waits",
        "Paged logs: appends that found every page full and waited (seed 004's buffer-full events).",
        None,
        each(streams, |s| s.log.buffer_full_waits),
    )?;
    out.gauges(
        "stamplog_log_failed",
        "1 when the stream's log on this server has failed (a write or fsync failed): free the disk and restart the server.",
        None,
        each(streams, |s| if s.failed { 1.0 } else { 0.0 }),
    )?;
    out.gauges(
        "stamplog_log_buffer_full_ratio",
        "Paged logs: buffer-full waits per page written, since the stream opened.",
        None,
        each(streams, |s| {
            s.log.buffer_full_waits as f64 / s.log.syncs.max(1) as f64
        }),
    )?;
    Ok(())
}

/// Each stream's replica: dedupe, held acknowledgements and messages,
/// sender-held versions, the newest checkpoint.
fn replica_families(streams: &[Snapshot], out: &mut Out) -> fmt::Result {
    out.counters(
        "stamplog_dedupe_hits",
        "Writes answered from the dedupe table: a retry given its original version, flagged duplicate.",
        None,
        each(streams, |s| s.gauges.duplicates),
    )?;
    out.gauges(
        "stamplog_dedupe_entries",
        "Event ids the stream's dedupe table holds.",
        None,
        each(streams, |s| s.gauges.dedupe_entries as f64),
    )?;
    out.gauges(
        "stamplog_pending_acks",
        "Acknowledgements held back: waiting for the log, the other replicas or the commit interval's boundary.",
        None,
        each(streams, |s| s.gauges.pending_acks as f64),
    )?;
    out.gauges(
        "stamplog_held_messages",
        "Messages held back by the replica (out of order, not yet bound, reserved versions).",
        None,
        each(streams, |s| s.gauges.held as f64),
    )?;
    out.gauges(
        "stamplog_sender_unconfirmed_messages",
        "Sender-based logging: versions given to clients whose copies this server has not confirmed durable (the clients hold them).",
        None,
        each(streams, |s| s.gauges.awaiting_confirmation as f64),
    )?;
    out.gauges(
        "stamplog_checkpoint_version",
        "The version the stream's newest checkpoint covers (0: none).",
        None,
        each(streams, |s| s.newest_checkpoint as f64),
    )?;
    Ok(())
}

/// Each stream's readers on this server, and a hybrid stream's choice.
fn reader_families(streams: &[Snapshot], out: &mut Out) -> fmt::Result {
    out.gauges(
        "stamplog_subscriptions",
        "Subscriptions reading the stream on this server.",
        None,
        each(streams, |s| s.readers.0 as f64),
    )?;
    out.gauges(
        "stamplog_subscription_lag_records",
        "Records between the stream's visible version and the furthest-behind subscription on this server.",
        None,
        each(streams, |s| s.readers.1 as f64),
    )?;
    let hybrid = streams.iter().filter_map(|s| {
        let client_async = s.gauges.hybrid_client_async?;
        Some(
            [
                ("server-sync", !client_async),
                ("client-async", client_async),
            ]
            .map(|(mode, on)| {
                let mut labels = s.labels.clone();
                labels.push(("mode", mode.to_string()));
                (labels, u8::from(on) as f64)
            }),
        )
    });
    out.gauges(
        "stamplog_hybrid_mode",
        "Hybrid streams: 1 for the protocol the primary now chooses (server-sync or client-async).",
        None,
        hybrid.flatten().collect::<Vec<_>>(),
    )
}

/// The histograms and counters the data path keeps.
fn data_path_families(metrics: &Metrics, streams: &[Snapshot], out: &mut Out) -> fmt::Result {
    let acks = metrics.ack_histograms();
    let labelled = acks.iter().filter_map(|(id, histogram)| {
        let stream = streams.iter().find(|s| s.id == *id)?;
        Some((stream.labels.clone(), &**histogram))
    });
    out.family(
        (
            "stamplog_ack_latency",
            "Writes this server acknowledged (Append and Submit): from the write's arrival to its acknowledgement leaving.",
            Some(Unit::Seconds),
        ),
        MetricType::Histogram,
        labelled.collect::<Vec<_>>(),
    )?;
    out.histogram(
        "stamplog_log_fdatasync",
        "One group commit: the write and fdatasync of a batch, every log of this server.",
        Some(Unit::Seconds),
        &metrics.log.sync_seconds,
    )?;
    out.histogram(
        "stamplog_log_records_per_fdatasync",
        "Records one group commit made durable.",
        None,
        &metrics.log.records_per_sync,
    )?;
    out.histogram(
        "stamplog_log_append_to_durable",
        "Each record: from its append to the log to its batch being durable.",
        Some(Unit::Seconds),
        &metrics.log.append_to_durable,
    )?;
    out.counters(
        "stamplog_requests_refused",
        "Answers refused with an error, by its code.",
        None,
        metrics
            .refused_by_code()
            .into_iter()
            .map(|(code, n)| (vec![("code", format!("{code:?}"))], n)),
    )?;
    out.counter(
        "stamplog_client_received",
        "Bytes read from client connections.",
        Some(Unit::Bytes),
        load(&metrics.client_bytes_in),
    )?;
    out.counter(
        "stamplog_client_sent",
        "Bytes written to client connections (answers, records, deliveries).",
        Some(Unit::Bytes),
        load(&metrics.client_bytes_out),
    )?;
    out.counter(
        "stamplog_peer_received",
        "Bytes read from peers' replication links.",
        Some(Unit::Bytes),
        load(&metrics.peer_bytes_in),
    )?;
    peer_link_families(metrics, out)
}

/// How peers' links came and are read (`connection::peer`).
fn peer_link_families(metrics: &Metrics, out: &mut Out) -> fmt::Result {
    out.counter(
        "stamplog_peer_links_accepted",
        "Links peers opened to this server (each reconnection counts).",
        None,
        load(&metrics.peer_links_accepted),
    )?;
    out.counters(
        "stamplog_peer_links_handed",
        "Peer links handed to a thread of their own (to=thread) or to the runtime (to=runtime) as their traffic changed.",
        None,
        [
            ("thread", &metrics.peer_links_to_thread),
            ("runtime", &metrics.peer_links_to_runtime),
        ]
        .map(|(to, counter)| (vec![("to", to.to_string())], load(counter))),
    )
}

/// A counter's value now.
fn load(counter: &std::sync::atomic::AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}

/// The control plane's view, as this server's copy of it has it.
fn cluster_families(server: &ServerState, out: &mut Out) -> fmt::Result {
    let Some(control) = server.control.get() else {
        return Ok(());
    };
    let state = Arc::clone(&control.state().borrow());
    out.gauge(
        "stamplog_view",
        "The cluster's view number (grows with every membership change).",
        None,
        state.view as f64,
    )?;
    out.gauge(
        "stamplog_members",
        "Members of the view.",
        None,
        state.members.len() as f64,
    )?;
    out.gauge(
        "stamplog_lead_member",
        "The server id of the view's lead member (0: none).",
        None,
        state.lead_member().map_or(0.0, |m| m.id as f64),
    )?;
    out.gauge(
        "stamplog_under_replicated_streams",
        "Streams with fewer in-sync replicas than replicas.",
        None,
        state
            .streams
            .values()
            .filter(|p| p.is_under_replicated())
            .count() as f64,
    )?;
    placement_families(&state, out)
}

/// Each stream's placement, as the control plane has it (the same on
/// every server), labelled with the stream's name.
fn placement_families(state: &control::ControlState, out: &mut Out) -> fmt::Result {
    let placed = |value: fn(&control::StreamPlacement) -> f64| {
        state
            .streams
            .values()
            .map(move |p| (vec![("stream", p.name.clone())], value(p)))
            .collect::<Vec<_>>()
    };
    out.gauges(
        "stamplog_stream_replicas",
        "Servers the stream is placed on.",
        None,
        placed(|p| p.replicas.len() as f64),
    )?;
    out.gauges(
        "stamplog_stream_in_sync_replicas",
        "Replicas that hold every acknowledged version.",
        None,
        placed(|p| p.in_sync.len() as f64),
    )?;
    out.gauges(
        "stamplog_stream_primary",
        "The server id of the stream's primary (0: none).",
        None,
        placed(|p| p.primary.map_or(0.0, |id| id as f64)),
    )?;
    out.gauges(
        "stamplog_stream_epoch",
        "The stream's epoch: a new one at every failover or reopen.",
        None,
        placed(|p| p.epoch as f64),
    )?;
    out.counters(
        "stamplog_stream_failovers",
        "Epochs whose primary began stamping after the stream's first: failovers and reopens.",
        None,
        state.streams.values().map(|p| {
            (
                vec![("stream", p.name.clone())],
                p.epochs.len().saturating_sub(1) as u64,
            )
        }),
    )
}
