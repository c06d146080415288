//! `bench throughput`: what group commit buys (F1).
//!
//! One server, a `stamplog server` child process by default (or a
//! `stamplog cluster --servers 1` child with `--servers-as threads`), and
//! one client over loopback; for every payload size, durability mode and
//! window (appends in flight), the client streams messages and records
//! each one's ack latency, from the moment it is handed to the connection
//! to its acknowledgement. For `sync` the stream's log
//! tells how many records each fdatasync carried. The product target: at
//! 1 KiB and window 256, `sync` reaches at least 0.70 of `memory`'s rate.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use clap::Parser;
use client::{Client, ClientConfig, DurabilityConfig, PendingAck};
use indicatif::ProgressBar;
use report::plot::{Chart, Series};
use report::stats::Summary;
use report::Table;
use tokio::sync::mpsc;

use crate::output::{self, Output, OutputArgs};
use crate::process::{ClusterOptions, ServersAs};
use crate::progress;
use crate::replication::{binary_or_self, spawn_cluster, Cluster, ReplicaLog};
use crate::units::{fixed, format_bytes, parse_bytes};

/// Durability modes the experiment compares.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Mode {
    /// Ack after write + fdatasync, with group commit.
    Sync,
    /// Seed 004's page buffer (`--pages` × `--page-size`), ack from memory.
    Paged,
    /// No disk at all.
    Memory,
}

impl Mode {
    pub fn name(&self) -> &'static str {
        match self {
            Mode::Sync => "sync",
            Mode::Paged => "paged",
            Mode::Memory => "memory",
        }
    }
}

/// Options of `bench throughput`.
#[derive(Parser, Debug, Clone)]
#[command(name = "throughput")]
pub struct ThroughputArgs {
    /// The stamplog binary to run as the server [default: this program].
    #[arg(long, value_name = "PATH")]
    pub server_binary: Option<PathBuf>,
    /// Where the server runs: `processes` (a `stamplog server` process,
    /// as deployed) or `threads` (a `stamplog cluster --servers 1`
    /// process).
    #[arg(long, value_enum, default_value_t = ServersAs::Processes)]
    pub servers_as: ServersAs,
    /// Payload sizes, comma separated (units B, KB = 1000, KiB = 1024).
    #[arg(long, value_delimiter = ',', value_parser = parse_bytes, default_value = "100,1024,10240")]
    pub sizes: Vec<usize>,
    /// Durability modes, comma separated.
    #[arg(
        long,
        value_delimiter = ',',
        value_enum,
        default_value = "sync,paged,memory"
    )]
    pub modes: Vec<Mode>,
    /// Windows (appends in flight), comma separated.
    #[arg(long, value_delimiter = ',', default_value = "1,16,256")]
    pub windows: Vec<usize>,
    /// Messages per cell (size × mode × window).
    #[arg(long, default_value_t = 50_000)]
    pub messages: usize,
    /// Messages per cell with window 1, where every message waits for the
    /// previous one's ack (and, for sync, its fdatasync).
    #[arg(long, default_value_t = 1000)]
    pub window_one_messages: usize,
    /// Pages of the `paged` mode's log buffer.
    #[arg(long, default_value_t = 2)]
    pub pages: u16,
    /// Bytes of one page of the `paged` mode (at least a largest message
    /// plus its header: 1 MiB + 1 KiB).
    #[arg(long, value_parser = parse_bytes, default_value = "4MiB")]
    pub page_size: usize,
    #[command(flatten)]
    pub output: OutputArgs,
}

impl Default for ThroughputArgs {
    fn default() -> Self {
        ThroughputArgs::parse_from(["throughput"])
    }
}

impl ThroughputArgs {
    fn messages_for(&self, window: usize) -> usize {
        if window <= 1 {
            self.window_one_messages
        } else {
            self.messages
        }
    }
}

/// The figures of one cell.
#[derive(Clone, Debug)]
pub struct Cell {
    pub size: usize,
    pub mode: Mode,
    pub window: usize,
    /// Messages acknowledged (all that were sent).
    pub messages: usize,
    pub seconds: f64,
    pub messages_per_second: f64,
    /// Payload megabytes (10^6) per second.
    pub megabytes_per_second: f64,
    /// Ack latency in microseconds.
    pub latency: Summary,
    pub syncs: u64,
    pub records_synced: u64,
    /// Records per fdatasync (sync) or per page write (paged).
    pub mean_batch: f64,
    pub syncs_per_second: f64,
}

/// Everything `bench throughput` measured.
#[derive(Clone, Debug)]
pub struct ThroughputFigures {
    pub cells: Vec<Cell>,
}

impl ThroughputFigures {
    /// sync messages/s over memory messages/s for one size and window.
    pub fn sync_over_memory(&self, size: usize, window: usize) -> Option<f64> {
        let rate = |mode: Mode| {
            self.cells
                .iter()
                .find(|c| c.size == size && c.window == window && c.mode == mode)
                .map(|c| c.messages_per_second)
        };
        Some(rate(Mode::Sync)? / rate(Mode::Memory)?)
    }
}

/// Runs the experiment, prints its tables, writes its files.
pub fn run(args: ThroughputArgs) -> anyhow::Result<ThroughputFigures> {
    ensure!(
        !args.sizes.is_empty() && !args.modes.is_empty() && !args.windows.is_empty(),
        "--sizes, --modes and --windows each need at least one value"
    );
    ensure!(
        args.messages > 0 && args.window_one_messages > 0,
        "message counts must be at least 1"
    );
    ensure!(
        args.sizes.iter().all(|size| *size <= 1024 * 1024),
        "sizes above 1 MiB exceed the server's message limit"
    );
    let data = args.output.data_folder("throughput")?;
    let runtime = output::runtime()?;
    let total: usize = args
        .windows
        .iter()
        .map(|w| args.messages_for(*w))
        .sum::<usize>()
        * args.sizes.len()
        * args.modes.len();
    let bar = progress::bar(total as u64, "throughput", args.output.quiet);
    let cells = runtime.block_on(measure(&args, data.path(), &bar))?;
    bar.finish_and_clear();
    let figures = ThroughputFigures { cells };
    write_report(&args, &figures)?;
    Ok(figures)
}

async fn measure(
    args: &ThroughputArgs,
    folder: &Path,
    bar: &ProgressBar,
) -> anyhow::Result<Vec<Cell>> {
    let binary = binary_or_self(&args.server_binary)?;
    let options = ClusterOptions {
        servers_as: args.servers_as,
        ..ClusterOptions::default()
    };
    let server = Cluster::connect(spawn_cluster(&binary, 1, folder, options)?).await?;
    let mut cells = Vec::new();
    for &size in &args.sizes {
        for &mode in &args.modes {
            for &window in &args.windows {
                bar.set_message(format!(
                    "{} {} window {window}",
                    format_bytes(size),
                    mode.name()
                ));
                cells.push(run_cell(&server, args, size, mode, window, bar).await?);
            }
        }
    }
    server.stop()?;
    Ok(cells)
}

fn durability(args: &ThroughputArgs, mode: Mode) -> DurabilityConfig {
    match mode {
        Mode::Sync => DurabilityConfig::Sync,
        Mode::Memory => DurabilityConfig::Memory,
        Mode::Paged => DurabilityConfig::Paged {
            pages: args.pages,
            page_size: args.page_size as u32,
        },
    }
}

async fn run_cell(
    server: &Cluster,
    args: &ThroughputArgs,
    size: usize,
    mode: Mode,
    window: usize,
    bar: &ProgressBar,
) -> anyhow::Result<Cell> {
    let mut config = ClientConfig::new(server.address(1)?.to_string());
    config.window = window.max(1);
    config.credentials = server.credentials().clone();
    let client = Client::connect(config)
        .await
        .context("cannot connect to the server")?;
    let name = format!("throughput-{}-{size}-{window}", mode.name());
    let info = client
        .create_stream(&name, durability(args, mode))
        .await
        .with_context(|| format!("cannot create stream {name}"))?;
    let messages = args.messages_for(window);
    let (latencies, elapsed) =
        stream_messages(&client, info.id, size, window, messages, bar).await?;
    let metrics = settled_metrics(server, &info, mode).await?;
    // The cell's log is of no further use; deleting it keeps the disk from
    // filling over many cells.
    client
        .delete_stream(&name)
        .await
        .with_context(|| format!("cannot delete stream {name}"))?;
    let seconds = elapsed.as_secs_f64();
    Ok(Cell {
        size,
        mode,
        window,
        messages: latencies.len(),
        seconds,
        messages_per_second: latencies.len() as f64 / seconds,
        megabytes_per_second: (latencies.len() * size) as f64 / seconds / 1e6,
        latency: Summary::of(&latencies),
        syncs: metrics.syncs,
        records_synced: metrics.records_synced,
        mean_batch: if metrics.syncs == 0 {
            0.0
        } else {
            metrics.records_synced as f64 / metrics.syncs as f64
        },
        syncs_per_second: metrics.syncs as f64 / seconds,
    })
}

/// The log's counters, from the server's status, once every appended
/// record is counted as synced.
///
/// The log publishes the durable version (which releases the acks) just
/// before it adds the batch to its counters, and a `paged` log writes its
/// last, partly filled page only after its flush interval; so the counters
/// read at the last ack may be a batch short. Waits up to a second.
async fn settled_metrics(
    server: &Cluster,
    info: &client::StreamInfo,
    mode: Mode,
) -> anyhow::Result<ReplicaLog> {
    let deadline = Instant::now() + Duration::from_secs(1);
    loop {
        let logs = server.replica_logs(info).await?;
        let metrics = *logs.first().context("the stream has no replica")?;
        let settled = mode == Mode::Memory || metrics.records_synced >= metrics.appends;
        if settled || Instant::now() >= deadline {
            return Ok(metrics);
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Submits `messages` payloads of `size` bytes with up to `window` in
/// flight; returns each ack latency in microseconds and the time from the
/// first submit to the last ack.
async fn stream_messages(
    client: &Client,
    stream: u64,
    size: usize,
    window: usize,
    messages: usize,
    bar: &ProgressBar,
) -> anyhow::Result<(Vec<f64>, Duration)> {
    let mut producer = client.producer(stream);
    let payload: Vec<u8> = (0..size).map(|index| (index % 241) as u8).collect();
    // The collector awaits acks in submission order; the channel is bounded
    // so a lagging collector slows the producer instead of growing a queue.
    let (sender, receiver) = mpsc::channel::<(Instant, PendingAck)>(window.max(1) * 2);
    let collector = tokio::spawn(collect_acks(receiver, messages, bar.clone()));
    let started = Instant::now();
    for _ in 0..messages {
        let pending = producer
            .submit(b"", &payload)
            .await
            .context("submit failed")?;
        if sender.send((Instant::now(), pending)).await.is_err() {
            break;
        }
    }
    drop(sender);
    let latencies = collector.await.context("the ack collector panicked")??;
    let elapsed = started.elapsed();
    ensure!(
        latencies.len() == messages,
        "{} of {messages} messages were acknowledged",
        latencies.len()
    );
    Ok((latencies, elapsed))
}

async fn collect_acks(
    mut receiver: mpsc::Receiver<(Instant, PendingAck)>,
    messages: usize,
    bar: ProgressBar,
) -> anyhow::Result<Vec<f64>> {
    let mut latencies = Vec::with_capacity(messages);
    while let Some((submitted, pending)) = receiver.recv().await {
        pending.await.context("a message was not acknowledged")?;
        latencies.push(submitted.elapsed().as_secs_f64() * 1e6);
        bar.inc(1);
    }
    Ok(latencies)
}

/// One row per cell.
pub fn cells_table(figures: &ThroughputFigures) -> Table {
    let mut table = Table::new(
        "Throughput and ack latency per payload size, durability and window",
        &[
            "size",
            "mode",
            "window",
            "messages",
            "msgs/s",
            "MB/s",
            "ack p50 µs",
            "ack p99 µs",
            "records per sync",
            "syncs/s",
        ],
    );
    for cell in &figures.cells {
        let logged = cell.mode != Mode::Memory;
        table.row(vec![
            format_bytes(cell.size),
            cell.mode.name().to_string(),
            cell.window.to_string(),
            cell.messages.to_string(),
            fixed(cell.messages_per_second, 0),
            fixed(cell.megabytes_per_second, 2),
            fixed(cell.latency.p50, 1),
            fixed(cell.latency.p99, 1),
            if logged {
                fixed(cell.mean_batch, 1)
            } else {
                "-".into()
            },
            if logged {
                fixed(cell.syncs_per_second, 0)
            } else {
                "-".into()
            },
        ]);
    }
    table
}

/// sync / memory messages/s for every size and window measured in both.
pub fn ratio_table(figures: &ThroughputFigures) -> Table {
    let mut table = Table::new(
        "Group commit: sync msgs/s over memory msgs/s (target >= 0.70 at 1 KiB, window 256)",
        &[
            "size",
            "window",
            "sync msgs/s",
            "memory msgs/s",
            "sync / memory",
        ],
    );
    let mut pairs: BTreeMap<(usize, usize), ()> = BTreeMap::new();
    for cell in &figures.cells {
        pairs.insert((cell.size, cell.window), ());
    }
    for &(size, window) in pairs.keys() {
        let rate = |mode: Mode| {
            figures
                .cells
                .iter()
                .find(|c| c.size == size && c.window == window && c.mode == mode)
                .map(|c| c.messages_per_second)
        };
        if let (Some(sync), Some(memory)) = (rate(Mode::Sync), rate(Mode::Memory)) {
            table.row(vec![
                format_bytes(size),
                window.to_string(),
                fixed(sync, 0),
                fixed(memory, 0),
                fixed(sync / memory, 2),
            ]);
        }
    }
    table
}

fn write_report(args: &ThroughputArgs, figures: &ThroughputFigures) -> anyhow::Result<()> {
    let cells = cells_table(figures);
    let ratios = ratio_table(figures);
    print!("{}", cells.render());
    println!();
    print!("{}", ratios.render());
    let mut output = Output::new(args.output.out_folder("throughput"))?;
    output.csv("throughput", &cells)?;
    output.csv("throughput-ratio", &ratios)?;
    let headline = if args.sizes.contains(&1024) {
        1024
    } else {
        args.sizes[0]
    };
    output.png("throughput", &rate_chart(figures, headline))?;
    for &size in &args.sizes {
        output.png(
            &format!("throughput-{}", format_bytes(size)),
            &rate_chart(figures, size),
        )?;
    }
    let json = serde_json::json!({
        "experiment": "throughput",
        "tables": [cells.to_json(), ratios.to_json()],
        "cells": figures.cells.iter().map(cell_json).collect::<Vec<_>>(),
    });
    output.json(args.output.json.as_deref(), &json)?;
    output.announce();
    Ok(())
}

fn cell_json(cell: &Cell) -> serde_json::Value {
    serde_json::json!({
        "size_bytes": cell.size,
        "mode": cell.mode.name(),
        "window": cell.window,
        "messages": cell.messages,
        "seconds": cell.seconds,
        "messages_per_second": cell.messages_per_second,
        "megabytes_per_second": cell.megabytes_per_second,
        "ack_latency_us": cell.latency.to_json(),
        "syncs": cell.syncs,
        "records_synced": cell.records_synced,
        "mean_batch": cell.mean_batch,
        "syncs_per_second": cell.syncs_per_second,
    })
}

/// Messages/s against the window, one line per mode, for one size.
fn rate_chart(figures: &ThroughputFigures, size: usize) -> Chart {
    let mut chart = Chart::lines(
        format!("Throughput at {} per message", format_bytes(size)),
        "window (appends in flight)",
        "messages/s",
    );
    chart.log_x = true;
    let mut modes: Vec<Mode> = figures.cells.iter().map(|c| c.mode).collect();
    modes.dedup();
    modes.sort();
    modes.dedup();
    for mode in modes {
        let points = figures
            .cells
            .iter()
            .filter(|c| c.size == size && c.mode == mode)
            .map(|c| (c.window as f64, c.messages_per_second))
            .collect();
        chart.add(Series::new(mode.name(), points));
    }
    chart
}
