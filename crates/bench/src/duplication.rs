//! `bench duplication`: seed 002's Table II, the four duplication
//! protocols and the hybrid against no duplication (F4).
//!
//! Four servers run as `stamplog server` processes of their own
//! (`--servers-as threads`: one `stamplog cluster --servers 4` process);
//! 1 to 8 clients run in this process, each with its own client id and its
//! own `Publisher`s, and all start together. The figure is the aggregate
//! write throughput (messages/s and payload MB/s, every client's messages
//! over the time from the start to the last ack), for `server-async`,
//! `server-sync`, `client-async`, `client-sync`, `hybrid`, and "no
//! duplication" (R = 1 streams, one-hop-ack-client: the seed's PVFS with
//! half the nodes). Each protocol's throughput is also given in percent of
//! no duplication's at the same client count, as the seed's table does.
//!
//! Layout: the messages are striped over `--streams` streams (default 2),
//! R = 2 each, placed so their primaries differ: with four servers, stream
//! 1 on servers 1 (primary) and 2, stream 2 on servers 3 and 4, so
//! servers 1 and 3 form the primary group and 2 and 4 the backup group,
//! and every client writes to every stream (message i to stream i mod S),
//! as a PVFS client writes a striped file to every server. We chose this
//! over the two simpler layouts the brief names:
//! - a stream per client would spread the load too, but the hybrid counts
//!   the active clients of a stream, so with one client per stream it
//!   would always see 1 client against 2 servers and never switch, and
//!   the server-driven protocols would never face a primary loaded by
//!   many clients, which is what the seed measures;
//! - all clients on one stream keeps both, but leaves two of the four
//!   servers idle. `--streams 1` gives that layout.
//!
//! The no-duplication baseline uses the same stripes with R = 1 on the
//! same primaries. Each client has one publisher per stream, each with
//! `--window` messages in flight. The asynchronous protocols ack before
//! the backup has the record; after each cell the experiment waits until
//! every replica has logged every message, so background copying does not
//! leak into the next cell (the wait is not timed).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use clap::Parser;
use client::{HybridMode, Protocol, Publisher, PublisherConfig, StreamInfo};
use indicatif::ProgressBar;
use report::plot::{Chart, Series};
use report::stats::Summary;
use report::Table;

use crate::output::{self, Output, OutputArgs};
use crate::process::{ClusterOptions, ServersAs};
use crate::progress;
use crate::replication::{
    binary_or_self, parse_protocol, payload_of, publish, spawn_cluster, Cluster, Durability,
    PublishRun, Together,
};
use crate::units::{fixed, format_bytes, parse_bytes};

/// Options of `bench duplication`.
#[derive(Parser, Debug, Clone)]
#[command(name = "duplication")]
pub struct DuplicationArgs {
    /// The stamplog binary to run as the cluster (`<binary> cluster
    /// --servers N`) [default: this program].
    #[arg(long, value_name = "PATH")]
    pub server_binary: Option<PathBuf>,
    /// Servers in the cluster.
    #[arg(long, default_value_t = 4)]
    pub servers: usize,
    /// Replicas of each duplicated stream: a primary and its backups.
    #[arg(long, default_value_t = 2)]
    pub replicas: u8,
    /// Streams the messages are striped over, each led by a different
    /// server (1: every client on one stream).
    #[arg(long, default_value_t = 2)]
    pub streams: usize,
    /// Client counts, comma separated; each count is one run per protocol.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
    pub clients: Vec<usize>,
    /// Protocols, comma separated; no duplication (R = 1) always runs as
    /// the baseline.
    #[arg(
        long,
        value_delimiter = ',',
        value_parser = parse_protocol,
        default_value = "server-async,server-sync,client-async,client-sync,hybrid"
    )]
    pub protocols: Vec<Protocol>,
    /// Messages each client sends per run.
    #[arg(long, default_value_t = 100_000)]
    pub messages: usize,
    /// Payload bytes of each message (units B, KB = 1000, KiB = 1024).
    #[arg(long, value_parser = parse_bytes, default_value = "1000")]
    pub payload: usize,
    /// Durability of the streams: `sync` (ack after fdatasync) or `memory`.
    #[arg(long, value_enum, default_value = "sync")]
    pub durability: Durability,
    /// Messages in flight per publisher (each client has one per stream).
    #[arg(long, default_value_t = 256)]
    pub window: usize,
    /// Milliseconds after which a publisher sends a message that is not
    /// done again (with the same event id).
    #[arg(long, default_value_t = 500)]
    pub retry_ms: u64,
    /// Where the servers run: `processes` (each its own `stamplog server`
    /// process, as deployed) or `threads` (one `stamplog cluster`
    /// process, as these figures were measured before).
    #[arg(long, value_enum, default_value_t = ServersAs::Processes)]
    pub servers_as: ServersAs,
    #[command(flatten)]
    pub output: OutputArgs,
}

impl Default for DuplicationArgs {
    fn default() -> Self {
        DuplicationArgs::parse_from(["duplication"])
    }
}

/// One line of the table: a duplication protocol, or the baseline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    /// R = 1 streams, one-hop-ack-client.
    NoDuplication,
    Duplicated(Protocol),
}

impl Variant {
    pub fn label(self) -> &'static str {
        match self {
            Variant::NoDuplication => "no duplication",
            Variant::Duplicated(protocol) => protocol.name(),
        }
    }

    fn protocol(self) -> Protocol {
        match self {
            Variant::NoDuplication => Protocol::OneHopAckClient,
            Variant::Duplicated(protocol) => protocol,
        }
    }

    fn replicas(self, args: &DuplicationArgs) -> u8 {
        match self {
            Variant::NoDuplication => 1,
            Variant::Duplicated(_) => args.replicas,
        }
    }

    /// A short form for stream names.
    fn slug(self) -> &'static str {
        match self {
            Variant::NoDuplication => "none",
            Variant::Duplicated(protocol) => protocol.name(),
        }
    }
}

/// The figures of one variant at one client count.
#[derive(Clone, Debug)]
pub struct DuplicationCell {
    pub clients: usize,
    pub variant: Variant,
    /// Messages done, over every client (all that were sent).
    pub messages: usize,
    /// Messages a retry found already logged.
    pub duplicates: usize,
    /// From the start of every client to the last ack.
    pub seconds: f64,
    pub messages_per_second: f64,
    /// Payload megabytes (10^6) per second, over every client.
    pub megabytes_per_second: f64,
    /// Time from submit to done, in microseconds, every client's.
    pub latency: Summary,
    /// This cell's messages/s in percent of no duplication's at the same
    /// client count.
    pub percent_of_baseline: Option<f64>,
    /// For `hybrid`: the mode the publishers last learned from the
    /// primaries (`mixed` when they disagree).
    pub hybrid_mode: Option<String>,
    /// Every replica had logged every message within the settle timeout.
    pub settled: bool,
}

/// Everything `bench duplication` measured.
#[derive(Clone, Debug)]
pub struct DuplicationFigures {
    pub servers: usize,
    pub replicas: u8,
    pub streams: usize,
    pub payload: usize,
    pub messages_per_client: usize,
    /// Messages in flight per publisher.
    pub window: usize,
    pub durability: Durability,
    pub cells: Vec<DuplicationCell>,
}

impl DuplicationFigures {
    pub fn cell(&self, clients: usize, variant: Variant) -> Option<&DuplicationCell> {
        self.cells
            .iter()
            .find(|c| c.clients == clients && c.variant == variant)
    }

    fn variants(&self) -> Vec<Variant> {
        let mut variants: Vec<Variant> = Vec::new();
        for cell in &self.cells {
            if !variants.contains(&cell.variant) {
                variants.push(cell.variant);
            }
        }
        variants
    }

    fn client_counts(&self) -> Vec<usize> {
        let mut counts: Vec<usize> = self.cells.iter().map(|c| c.clients).collect();
        counts.sort_unstable();
        counts.dedup();
        counts
    }
}

/// Runs the experiment, prints its tables, writes its files.
pub fn run(args: DuplicationArgs) -> anyhow::Result<DuplicationFigures> {
    validate(&args)?;
    let binary = binary_or_self(&args.server_binary)?;
    let data = args.output.data_folder("duplication")?;
    let variants = variants(&args);
    let total: usize = args.clients.iter().sum::<usize>() * args.messages * variants.len();
    let bar = progress::bar(total as u64, "duplication", args.output.quiet);
    let runtime = output::runtime()?;
    let process = spawn_cluster(
        &binary,
        args.servers,
        data.path(),
        ClusterOptions {
            servers_as: args.servers_as,
            ..ClusterOptions::default()
        },
    )?;
    let cluster = runtime.block_on(Cluster::connect(process))?;
    let mut cells = Vec::new();
    for &clients in &args.clients {
        for &variant in &variants {
            bar.set_message(format!("{} clients, {}", clients, variant.label()));
            cells.push(runtime.block_on(run_cell(&cluster, &args, clients, variant, &bar))?);
        }
    }
    cluster.stop()?;
    drop(runtime);
    bar.finish_and_clear();
    fill_percentages(&mut cells);
    let figures = DuplicationFigures {
        servers: args.servers,
        replicas: args.replicas,
        streams: args.streams,
        payload: args.payload,
        messages_per_client: args.messages,
        window: args.window,
        durability: args.durability,
        cells,
    };
    write_report(&args, &figures)?;
    Ok(figures)
}

fn validate(args: &DuplicationArgs) -> anyhow::Result<()> {
    ensure!(
        args.durability != Durability::Sender,
        "bench duplication runs the client-driven protocols too; sender-based logging applies to the forward protocols only"
    );
    ensure!(
        !args.clients.is_empty() && args.clients.iter().all(|c| *c > 0),
        "--clients needs at least one count, each at least 1"
    );
    ensure!(
        (1..=64).contains(&args.servers),
        "--servers must be between 1 and 64"
    );
    ensure!(
        args.replicas >= 1 && usize::from(args.replicas) <= args.servers,
        "--replicas must be between 1 and --servers"
    );
    ensure!(
        args.streams >= 1 && args.streams <= args.servers,
        "--streams must be between 1 and --servers"
    );
    ensure!(
        args.messages >= args.streams,
        "--messages must give every stream at least one message"
    );
    ensure!(args.window > 0, "--window must be at least 1");
    ensure!(
        args.payload <= 1024 * 1024,
        "--payload above 1 MiB exceeds the server's message limit"
    );
    Ok(())
}

/// The baseline first, then the protocols in the order given.
fn variants(args: &DuplicationArgs) -> Vec<Variant> {
    let mut variants = vec![Variant::NoDuplication];
    variants.extend(args.protocols.iter().map(|p| Variant::Duplicated(*p)));
    variants
}

/// The primary of stripe `index`: the servers split evenly among the
/// stripes, so with 4 servers and 2 stripes, servers 1 and 3.
fn primary_of(servers: &[u32], stripes: usize, index: usize) -> u32 {
    servers[index * servers.len() / stripes]
}

/// Messages of one client that land on stripe `index` (message i goes to
/// stripe i mod S).
fn messages_on_stripe(messages: usize, stripes: usize, index: usize) -> usize {
    messages / stripes + usize::from(index < messages % stripes)
}

async fn run_cell(
    cluster: &Cluster,
    args: &DuplicationArgs,
    clients: usize,
    variant: Variant,
    bar: &ProgressBar,
) -> anyhow::Result<DuplicationCell> {
    let servers = cluster.server_ids();
    let mut stripes: Vec<StreamInfo> = Vec::with_capacity(args.streams);
    for index in 0..args.streams {
        let prefix = format!("dup-{}-{clients}c-s{index}", variant.slug());
        let info = cluster
            .create_led_by(
                &prefix,
                args.durability,
                variant.protocol(),
                variant.replicas(args),
                primary_of(&servers, args.streams, index),
            )
            .await?;
        stripes.push(info);
    }
    let mut groups = Vec::with_capacity(clients);
    for _ in 0..clients {
        groups.push(connect_client(&stripes, args).await?);
    }
    let payload = Arc::new(payload_of(args.payload));
    let started = Instant::now();
    let tasks: Vec<_> = groups
        .into_iter()
        .map(|publishers| {
            let (payload, bar) = (Arc::clone(&payload), bar.clone());
            let (window, messages) = (args.window, args.messages);
            tokio::spawn(async move {
                let run = publish(&publishers, window, &payload, messages, &bar).await;
                (run, publishers)
            })
        })
        .collect();
    let mut runs: Vec<PublishRun> = Vec::with_capacity(clients);
    let mut modes = Vec::new();
    for task in tasks {
        let (run, publishers) = task.await.context("a client task panicked")?;
        runs.push(run.with_context(|| format!("a client of {} failed", variant.label()))?);
        modes.extend(publishers.iter().map(Publisher::hybrid_mode));
    }
    let settled = settle_and_delete(cluster, args, &stripes, clients).await?;
    let together = Together::of(&runs, started);
    Ok(DuplicationCell {
        clients,
        variant,
        messages: together.messages,
        duplicates: together.duplicates,
        seconds: together.seconds,
        messages_per_second: together.messages_per_second(),
        megabytes_per_second: together.megabytes_per_second(args.payload),
        latency: Summary::of(&together.latencies_us),
        percent_of_baseline: None,
        hybrid_mode: (variant == Variant::Duplicated(Protocol::Hybrid)).then(|| mode_label(&modes)),
        settled,
    })
}

/// One client: a fresh client id and one publisher per stripe.
async fn connect_client(
    stripes: &[StreamInfo],
    args: &DuplicationArgs,
) -> anyhow::Result<Vec<Publisher>> {
    let config = PublisherConfig {
        window: args.window,
        retry: Duration::from_millis(args.retry_ms.max(1)),
        client_id: Some(proto::random_u128()),
        ..PublisherConfig::default()
    };
    let mut publishers = Vec::with_capacity(stripes.len());
    for info in stripes {
        let publisher = Publisher::connect(info, config.clone())
            .await
            .with_context(|| format!("cannot connect a publisher to {}", info.name))?;
        publishers.push(publisher);
    }
    Ok(publishers)
}

/// Waits until every replica of every stripe has logged its messages,
/// then deletes the stripes; true when all settled in time.
async fn settle_and_delete(
    cluster: &Cluster,
    args: &DuplicationArgs,
    stripes: &[StreamInfo],
    clients: usize,
) -> anyhow::Result<bool> {
    let mut settled = true;
    for (index, info) in stripes.iter().enumerate() {
        let expected = clients * messages_on_stripe(args.messages, stripes.len(), index);
        let (_, done) = cluster
            .settled_replica_logs(info, args.durability, expected as u64)
            .await?;
        settled &= done;
        cluster.delete(info).await?;
    }
    Ok(settled)
}

/// The hybrid's mode as its publishers last learned it.
fn mode_label(modes: &[Option<HybridMode>]) -> String {
    let name = |mode: &Option<HybridMode>| match mode {
        Some(HybridMode::ServerSync) => "server-sync",
        Some(HybridMode::ClientAsync) => "client-async",
        None => "unknown",
    };
    match modes.first() {
        Some(first) if modes.iter().all(|m| m == first) => name(first).to_string(),
        Some(_) => "mixed".to_string(),
        None => "unknown".to_string(),
    }
}

fn fill_percentages(cells: &mut [DuplicationCell]) {
    let baselines: Vec<(usize, f64)> = cells
        .iter()
        .filter(|c| c.variant == Variant::NoDuplication)
        .map(|c| (c.clients, c.messages_per_second))
        .collect();
    for cell in cells {
        cell.percent_of_baseline = baselines
            .iter()
            .find(|(clients, _)| *clients == cell.clients)
            .map(|(_, base)| 100.0 * cell.messages_per_second / base);
    }
}

/// Seed 002's Table II: MB/s and percent of no duplication per client
/// count, one row per protocol.
pub fn ratio_table(figures: &DuplicationFigures) -> Table {
    let counts = figures.client_counts();
    let mut columns = vec!["protocol".to_string()];
    for clients in &counts {
        columns.push(format!("{clients}c MB/s"));
        columns.push(format!("{clients}c %"));
    }
    let column_refs: Vec<&str> = columns.iter().map(String::as_str).collect();
    let mut table = Table::new(
        format!(
            "Aggregate write MB/s and % of no duplication per client count ({} servers, R = {}, {} streams, {} payload, {}; seed 002 Table II)",
            figures.servers,
            figures.replicas,
            figures.streams,
            format_bytes(figures.payload),
            figures.durability.name()
        ),
        &column_refs,
    );
    for variant in figures.variants() {
        let mut row = vec![variant.label().to_string()];
        for &clients in &counts {
            match figures.cell(clients, variant) {
                Some(cell) => {
                    row.push(fixed(cell.megabytes_per_second, 1));
                    row.push(
                        cell.percent_of_baseline
                            .map_or_else(|| "-".into(), |p| fixed(p, 0)),
                    );
                }
                None => row.extend(["-".to_string(), "-".to_string()]),
            }
        }
        table.row(row);
    }
    table
}

/// One row per client count and protocol with every figure.
pub fn cells_table(figures: &DuplicationFigures) -> Table {
    let mut table = Table::new(
        format!(
            "Aggregate write throughput: {} messages per client, {} in flight per publisher",
            figures.messages_per_client, figures.window
        ),
        &[
            "clients",
            "protocol",
            "messages",
            "seconds",
            "msgs/s",
            "MB/s",
            "% of no dup",
            "ack p50 µs",
            "ack p99 µs",
            "duplicates",
            "hybrid mode",
            "settled",
        ],
    );
    for cell in &figures.cells {
        table.row(vec![
            cell.clients.to_string(),
            cell.variant.label().to_string(),
            cell.messages.to_string(),
            fixed(cell.seconds, 3),
            fixed(cell.messages_per_second, 0),
            fixed(cell.megabytes_per_second, 2),
            cell.percent_of_baseline
                .map_or_else(|| "-".into(), |p| fixed(p, 0)),
            fixed(cell.latency.p50, 0),
            fixed(cell.latency.p99, 0),
            cell.duplicates.to_string(),
            cell.hybrid_mode.clone().unwrap_or_else(|| "-".into()),
            if cell.settled { "yes" } else { "no" }.to_string(),
        ]);
    }
    table
}

fn write_report(args: &DuplicationArgs, figures: &DuplicationFigures) -> anyhow::Result<()> {
    let cells = cells_table(figures);
    let ratios = ratio_table(figures);
    print!("{}", cells.render());
    println!();
    print!("{}", ratios.render());
    let mut output = Output::new(args.output.out_folder("duplication"))?;
    output.csv("duplication", &cells)?;
    output.csv("duplication-ratio", &ratios)?;
    output.png("duplication", &throughput_chart(figures))?;
    output.png("duplication-ratio", &percent_chart(figures))?;
    let json = serde_json::json!({
        "experiment": "duplication",
        "servers": figures.servers,
        "replicas": figures.replicas,
        "streams": figures.streams,
        "payload_bytes": figures.payload,
        "messages_per_client": figures.messages_per_client,
        "window": figures.window,
        "durability": figures.durability.name(),
        "tables": [cells.to_json(), ratios.to_json()],
        "cells": figures.cells.iter().map(cell_json).collect::<Vec<_>>(),
    });
    output.json(args.output.json.as_deref(), &json)?;
    output.announce();
    Ok(())
}

fn cell_json(cell: &DuplicationCell) -> serde_json::Value {
    serde_json::json!({
        "clients": cell.clients,
        "protocol": cell.variant.label(),
        "messages": cell.messages,
        "duplicates": cell.duplicates,
        "seconds": cell.seconds,
        "messages_per_second": cell.messages_per_second,
        "megabytes_per_second": cell.megabytes_per_second,
        "percent_of_no_duplication": cell.percent_of_baseline,
        "ack_latency_us": cell.latency.to_json(),
        "hybrid_mode": cell.hybrid_mode,
        "settled": cell.settled,
    })
}

/// Aggregate messages/s against clients, one line per protocol.
fn throughput_chart(figures: &DuplicationFigures) -> Chart {
    let mut chart = Chart::lines(
        format!(
            "Aggregate write throughput, {} servers, R = {}, {}",
            figures.servers,
            figures.replicas,
            format_bytes(figures.payload)
        ),
        "clients",
        "messages/s",
    );
    for variant in figures.variants() {
        let points = figures
            .cells
            .iter()
            .filter(|c| c.variant == variant)
            .map(|c| (c.clients as f64, c.messages_per_second))
            .collect();
        chart.add(Series::new(variant.label(), points));
    }
    chart
}

/// Percent of no duplication against clients, one line per protocol.
fn percent_chart(figures: &DuplicationFigures) -> Chart {
    let mut chart = Chart::lines(
        "Throughput in % of no duplication",
        "clients",
        "% of no duplication",
    );
    for variant in figures.variants() {
        let points = figures
            .cells
            .iter()
            .filter(|c| c.variant == variant)
            .filter_map(|c| Some((c.clients as f64, c.percent_of_baseline?)))
            .collect();
        chart.add(Series::new(variant.label(), points));
    }
    chart
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stripes_take_evenly_spaced_primaries_and_share_the_messages() {
        let servers = [1, 2, 3, 4];
        assert_eq!(primary_of(&servers, 2, 0), 1);
        assert_eq!(primary_of(&servers, 2, 1), 3);
        assert_eq!(primary_of(&servers, 1, 0), 1);
        assert_eq!(primary_of(&servers, 4, 3), 4);
        assert_eq!(messages_on_stripe(5, 2, 0), 3);
        assert_eq!(messages_on_stripe(5, 2, 1), 2);
        assert_eq!(messages_on_stripe(4, 1, 0), 4);
    }

    #[test]
    fn hybrid_mode_label_says_mixed_when_publishers_disagree() {
        let sync = Some(HybridMode::ServerSync);
        let asynchronous = Some(HybridMode::ClientAsync);
        assert_eq!(mode_label(&[sync, sync]), "server-sync");
        assert_eq!(mode_label(&[asynchronous]), "client-async");
        assert_eq!(mode_label(&[sync, asynchronous]), "mixed");
        assert_eq!(mode_label(&[None]), "unknown");
    }
}
