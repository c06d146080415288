//! The machine's own limits beside a replicated figure (`bench patterns`):
//! for each payload of a `sync` one-hop-ack-client run, what the disk
//! allows the replicas' logs (one writer per replica, each writing and
//! fdatasyncing, as the log does, batches of the size the logs formed) and
//! what the loopback allows the flow (one connection per hop, the
//! record's bytes on each), both measured in the same run, once the disk
//! has written back what came before.

use std::path::Path;

use anyhow::Context;
use indicatif::ProgressBar;
use report::stats::Summary;
use report::Table;

use client::{Protocol, Publisher, PublisherConfig};

use crate::fdatasync;
use crate::loopback::{self, LoopbackLimit};
use crate::replication::{batch_of, payload_of, publish, Cluster, Durability};
use crate::units::{fixed, format_bytes};

/// Bytes each loopback connection carries in a measurement.
const LOOPBACK_BYTES: usize = 256 * 1024 * 1024;

/// What the disk allows the replicas' logs at the batch size they used.
#[derive(Clone, Debug)]
pub struct DiskLimit {
    pub writers: usize,
    /// Records per batch (the logs' mean records per fdatasync).
    pub batch_records: f64,
    pub batch_bytes: usize,
    pub syncs_per_writer: usize,
    pub seconds: f64,
    /// Batches per second per writer × records per batch.
    pub messages_per_second: f64,
    /// One write + fdatasync of one batch, in microseconds.
    pub sync_latency: Summary,
}

impl DiskLimit {
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "writers": self.writers,
            "batch_records": self.batch_records,
            "batch_bytes": self.batch_bytes,
            "syncs_per_writer": self.syncs_per_writer,
            "seconds": self.seconds,
            "messages_per_second": self.messages_per_second,
            "sync_latency_us": self.sync_latency.to_json(),
        })
    }
}

/// The disk's and the loopback's limits at one payload.
#[derive(Clone, Debug)]
pub struct PayloadLimits {
    pub payload: usize,
    pub disk: DiskLimit,
    pub loopback: LoopbackLimit,
}

impl PayloadLimits {
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "payload_bytes": self.payload,
            "disk": self.disk.to_json(),
            "loopback": {
                "connections": self.loopback.connections,
                "record_bytes": self.loopback.record_bytes,
                "bytes_per_second": self.loopback.bytes_per_second,
                "messages_per_second": self.loopback.messages_per_second(),
            },
        })
    }
}

/// The batches the logs formed at one payload.
#[derive(Clone, Copy, Debug)]
pub struct Batch {
    pub payload: usize,
    /// Mean records per fdatasync over the replicas' logs.
    pub records: f64,
    /// Bytes each record takes in a log.
    pub record_bytes: f64,
}

/// The limits at `batch`'s payload, with `replicas` disk writers and
/// loopback connections, `syncs` batches per writer, the disk's files in
/// `folder`; the disk first writes back every dirty page.
pub fn measure(
    batch: Batch,
    replicas: usize,
    syncs: usize,
    folder: &Path,
    bar: &ProgressBar,
) -> anyhow::Result<PayloadLimits> {
    let batch_bytes = (batch.records * batch.record_bytes).round().max(1.0) as usize;
    bar.set_message(format!(
        "limits at {}: disk, {} per sync",
        format_bytes(batch.payload),
        format_bytes(batch_bytes)
    ));
    write_back()?;
    let written =
        fdatasync::concurrent_batches(folder, replicas, batch_bytes, syncs, &|| bar.inc(1))?;
    let syncs_done = written.latencies_us.len() as f64 / replicas as f64;
    let disk = DiskLimit {
        writers: replicas,
        batch_records: batch.records,
        batch_bytes,
        syncs_per_writer: syncs,
        seconds: written.seconds,
        messages_per_second: syncs_done * batch.records / written.seconds,
        sync_latency: Summary::of(&written.latencies_us),
    };
    let record = batch.record_bytes.round().max(1.0) as usize;
    let loopback = loopback::measure(replicas, record, LOOPBACK_BYTES)?;
    // What the probe wrote is written back before the cells start.
    write_back()?;
    Ok(PayloadLimits {
        payload: batch.payload,
        disk,
        loopback,
    })
}

/// A calibration burst: `messages` of `payload` bytes through one
/// publisher with `config`.
pub struct Burst {
    pub payload: usize,
    pub messages: usize,
    pub config: PublisherConfig,
}

/// The limits at a burst's payload, on a rested disk: the burst goes to a
/// `sync` one-hop-ack-client stream of its own on `cluster` to show the
/// batch size the replicas' logs form at that payload; the stream is
/// deleted, and the limits are measured at that batch size with `probe`
/// (disk writers and loopback connections, batches per writer, the
/// disk's folder). `None` when the logs reported no batch.
pub async fn calibrate(
    cluster: &Cluster,
    burst: Burst,
    (replicas, syncs, folder): (usize, usize, &Path),
    bar: &ProgressBar,
) -> anyhow::Result<Option<PayloadLimits>> {
    let payload = burst.payload;
    bar.set_message(format!("limits at {}: calibration", format_bytes(payload)));
    let name = format!("calibration-{payload}");
    let info = cluster
        .create(
            &name,
            Durability::Sync,
            Protocol::OneHopAckClient,
            replicas as u8,
        )
        .await?;
    let window = burst.config.window;
    let publisher = Publisher::connect(&info, burst.config)
        .await
        .with_context(|| format!("cannot connect a publisher to {name}"))?;
    let bytes = payload_of(payload);
    let publishers = std::slice::from_ref(&publisher);
    publish(
        publishers,
        window,
        &bytes,
        burst.messages,
        &ProgressBar::hidden(),
    )
    .await
    .with_context(|| format!("publishing to {name} failed"))?;
    drop(publisher);
    let (logs, _) = cluster
        .settled_replica_logs(&info, Durability::Sync, burst.messages as u64)
        .await?;
    cluster.delete(&info).await?;
    let Some((records, record_bytes)) = batch_of(&logs) else {
        return Ok(None);
    };
    let batch = Batch {
        payload,
        records,
        record_bytes,
    };
    measure(batch, replicas, syncs, folder, bar).map(Some)
}

/// Has the kernel write back every dirty page (`sync`), so that what the
/// cells wrote does not slow the disk's measurement.
fn write_back() -> anyhow::Result<()> {
    let status = std::process::Command::new("sync")
        .status()
        .context("cannot run sync")?;
    anyhow::ensure!(status.success(), "sync failed: {status}");
    Ok(())
}

/// A rate the service reached at one payload: (payload, msgs/s, MB/s).
pub type Rate = (usize, f64, f64);

/// One row per payload: the `rates` the service reached beside the disk's
/// and the loopback's limits, and the fraction of each it reached.
pub fn table(limits: &[PayloadLimits], rates: &[Rate]) -> Table {
    let mut table = Table::new(
        "one-hop-ack-client, sync, against the machine's limits measured in this run",
        &[
            "payload",
            "msgs/s",
            "MB/s",
            "disk limit msgs/s",
            "of disk",
            "loopback limit msgs/s",
            "of loopback",
        ],
    );
    for limit in limits {
        let Some(&(_, rate, megabytes)) = rates.iter().find(|r| r.0 == limit.payload) else {
            continue;
        };
        let loopback = limit.loopback.messages_per_second();
        table.row(vec![
            format_bytes(limit.payload),
            fixed(rate, 0),
            fixed(megabytes, 1),
            fixed(limit.disk.messages_per_second, 0),
            fixed(rate / limit.disk.messages_per_second, 2),
            fixed(loopback, 0),
            fixed(rate / loopback, 2),
        ]);
    }
    table
}
