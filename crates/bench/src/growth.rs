//! `bench growth`: the cost per message as one stream's log grows, from
//! empty to `--records` records (issue 20, item 4).
//!
//! `--replicas` `stamplog server` processes (one by default, so the disk
//! holds one copy of the log) and one `sync` one-hop-ack-client stream
//! with R = `--replicas`. One client keeps `--window` messages in flight
//! and writes the log full in slices of `--slice` messages; each slice is
//! timed on its own and charged the CPU time the client and the servers
//! used for it (`cpu::CpuClock`). The table shows the first slice, those
//! that start at 1, 10 and 100 million records (where the log has them)
//! and the last, each as a ratio of the first; the CSV has every slice.
//!
//! What grows with the log: its segments (a new one every
//! `segment_bytes_max`), the checkpoints written every million records,
//! the dedupe table (bounded per client), and whatever an index or a scan
//! would add. The disk needs about `--records` × (payload + key + 80)
//! bytes per replica (80: a record's header): 100 million records of
//! 100 B take 18 GB.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{ensure, Context};
use clap::Parser;
use client::{Protocol, Publisher, PublisherConfig};
use report::stats::Summary;
use report::Table;

use crate::cpu::{CpuClock, CpuPerMessage};
use crate::output::{self, Output, OutputArgs};
use crate::process::{ClusterOptions, ServersAs};
use crate::progress;
use crate::replication::{binary_or_self, payload_of, publish, spawn_cluster, Cluster, Durability};
use crate::units::{fixed, format_bytes, parse_bytes};

/// Options of `bench growth`.
#[derive(Parser, Debug, Clone)]
#[command(name = "growth")]
pub struct GrowthArgs {
    /// The stamplog binary to run as the servers [default: this program].
    #[arg(long, value_name = "PATH")]
    pub server_binary: Option<PathBuf>,
    /// Where the servers run: `processes` (each its own `stamplog server`
    /// process, as deployed) or `threads` (one `stamplog cluster`
    /// process).
    #[arg(long, value_enum, default_value_t = ServersAs::Processes)]
    pub servers_as: ServersAs,
    /// Records the log grows to.
    #[arg(long, default_value_t = 100_000_000)]
    pub records: u64,
    /// Messages per timed slice.
    #[arg(long, default_value_t = 1_000_000)]
    pub slice: usize,
    /// Payload bytes of each message (units B, KB, KiB).
    #[arg(long, value_parser = parse_bytes, default_value = "100B")]
    pub payload: usize,
    /// Replicas of the stream, each on a server process of its own.
    #[arg(long, default_value_t = 1)]
    pub replicas: u8,
    /// Messages in flight.
    #[arg(long, default_value_t = 256)]
    pub window: usize,
    /// A publisher resends what is not acknowledged after this long.
    #[arg(long, default_value_t = 2000)]
    pub retry_ms: u64,
    #[command(flatten)]
    pub output: OutputArgs,
}

impl Default for GrowthArgs {
    fn default() -> Self {
        GrowthArgs::parse_from(["growth"])
    }
}

/// One timed slice of messages.
#[derive(Clone, Debug)]
pub struct GrowthSlice {
    /// Records in the log when the slice started.
    pub records_before: u64,
    pub messages: usize,
    pub messages_per_second: f64,
    /// Each message's submit to acknowledgement, µs.
    pub latency: Summary,
    pub cpu: CpuPerMessage,
}

/// Everything `bench growth` measured.
#[derive(Clone, Debug)]
pub struct GrowthFigures {
    pub slices: Vec<GrowthSlice>,
}

impl GrowthFigures {
    /// The slices the table shows: the first, those starting at 1, 10
    /// and 100 million records, and the last.
    pub fn shown(&self) -> Vec<&GrowthSlice> {
        let marks = [1_000_000u64, 10_000_000, 100_000_000];
        let last = self.slices.len().saturating_sub(1);
        let shown = self.slices.iter().enumerate().filter(|(index, slice)| {
            let end = slice.records_before + slice.messages as u64;
            let marked = marks
                .iter()
                .any(|&mark| slice.records_before <= mark && mark < end);
            *index == 0 || *index == last || marked
        });
        shown.map(|(_, slice)| slice).collect()
    }
}

/// Runs the experiment, prints its table, writes its files.
pub fn run(args: GrowthArgs) -> anyhow::Result<GrowthFigures> {
    ensure!(
        args.records > 0 && args.slice > 0 && args.window > 0,
        "--records, --slice and --window must be at least 1"
    );
    ensure!(args.replicas >= 1, "--replicas must be at least 1");
    let binary = binary_or_self(&args.server_binary)?;
    let data = args.output.data_folder("growth")?;
    let runtime = output::runtime()?;
    let options = ClusterOptions {
        servers_as: args.servers_as,
        ..ClusterOptions::default()
    };
    let servers = spawn_cluster(&binary, usize::from(args.replicas), data.path(), options)?;
    let cluster = runtime.block_on(Cluster::connect(servers))?;
    let figures = runtime.block_on(grow(&cluster, &args))?;
    cluster.stop()?;
    drop(runtime);
    write_report(&args, &figures)?;
    Ok(figures)
}

async fn grow(cluster: &Cluster, args: &GrowthArgs) -> anyhow::Result<GrowthFigures> {
    let (durability, protocol) = (Durability::Sync, Protocol::OneHopAckClient);
    let info = cluster
        .create("growth", durability, protocol, args.replicas)
        .await?;
    let config = PublisherConfig {
        window: args.window,
        credentials: cluster.credentials().clone(),
        retry: Duration::from_millis(args.retry_ms.max(1)),
        ..PublisherConfig::default()
    };
    let publisher = Publisher::connect(&info, config)
        .await
        .context("cannot connect a publisher to the growth stream")?;
    let publishers = std::slice::from_ref(&publisher);
    let payload = payload_of(args.payload);
    let bar = progress::bar(args.records, "growth", args.output.quiet);
    let mut slices = Vec::new();
    let mut written = 0u64;
    while written < args.records {
        let messages = (args.records - written).min(args.slice as u64) as usize;
        let clock = CpuClock::start(&cluster.pids())?;
        let run = publish(publishers, args.window, &payload, messages, &bar)
            .await
            .with_context(|| format!("publishing after {written} records failed"))?;
        let cpu = clock.per_message(run.messages, info.primary)?;
        slices.push(GrowthSlice {
            records_before: written,
            messages: run.messages,
            messages_per_second: run.messages as f64 / run.seconds(),
            latency: Summary::of(&run.latencies_us),
            cpu,
        });
        written += run.messages as u64;
    }
    bar.finish_and_clear();
    drop(publisher);
    cluster.delete(&info).await?;
    Ok(GrowthFigures { slices })
}

/// One row per slice (`all`) or per shown slice, each against the first.
pub fn table(figures: &GrowthFigures, args: &GrowthArgs, all: bool) -> Table {
    let title = format!(
        "Cost per message as the log grows: {} payloads, R = {}, sync one-hop-ack-client, window {}, slices of {} messages",
        format_bytes(args.payload),
        args.replicas,
        args.window,
        args.slice
    );
    let columns = [
        "records before",
        "msgs/s",
        "p50 µs",
        "p99 µs",
        "servers CPU µs/msg",
        "client CPU µs/msg",
        "rate / first",
        "servers CPU / first",
    ];
    let mut table = Table::new(title, &columns);
    let Some(first) = figures.slices.first() else {
        return table;
    };
    let rows: Vec<&GrowthSlice> = match all {
        true => figures.slices.iter().collect(),
        false => figures.shown(),
    };
    for slice in rows {
        table.row(vec![
            slice.records_before.to_string(),
            fixed(slice.messages_per_second, 0),
            fixed(slice.latency.p50, 0),
            fixed(slice.latency.p99, 0),
            fixed(slice.cpu.servers, 2),
            fixed(slice.cpu.client, 2),
            fixed(slice.messages_per_second / first.messages_per_second, 3),
            fixed(
                slice.cpu.servers / first.cpu.servers.max(f64::MIN_POSITIVE),
                3,
            ),
        ]);
    }
    table
}

fn write_report(args: &GrowthArgs, figures: &GrowthFigures) -> anyhow::Result<()> {
    let shown = table(figures, args, false);
    print!("{}", shown.render());
    let mut output = Output::new(args.output.out_folder("growth"))?;
    let every = table(figures, args, true);
    output.csv("growth", &every)?;
    let json = serde_json::json!({
        "experiment": "growth",
        "payload_bytes": args.payload,
        "replicas": args.replicas,
        "window": args.window,
        "slice": args.slice,
        "table": every.to_json(),
    });
    output.json(args.output.json.as_deref(), &json)?;
    output.announce();
    Ok(())
}
