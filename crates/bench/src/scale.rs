//! `bench scale`: many streams and many clients on separate server
//! processes (F17, issue 20).
//!
//! Three `stamplog server` processes (`--servers`), and for each count of
//! streams S (`--streams`, by default 1, 10 and 100, one-hop-ack-client,
//! `--durability` `sync` by default, R = 3, placed by the cluster across
//! the servers)
//! and each count of clients C (`--clients`: 1, 4, 16), C clients start
//! together, each with a client id of its own, one connection to each
//! server (`--connections client`; `publisher` gives each publisher its
//! own, for comparison) and one publisher per stream it writes (stream j is written by client j mod C, and when
//! there are fewer streams than clients, client c writes stream c mod S),
//! each client keeping `--window` messages in flight over its streams:
//! each publisher keeps its share of the window full on its own
//! (`window_shares`, shares that add up to the whole window), with a
//! share of the client's messages in proportion (`message_shares`).
//! The figure is the aggregate rate (`--messages` over the time from the
//! start to the last ack), beside the disk's and the loopback's limits at
//! the payload, measured first on a rested disk (`limits::calibrate`),
//! the CPU per message the clients and the servers used for it, and the
//! bytes the servers wrote to storage per message (`cpu::CpuClock`). With
//! `--rounds` every cell runs that many times (the counts of streams in
//! reverse order every other round); a cell's rate is the median, and its
//! fraction of one stream the median of the rounds' paired ratios.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use clap::Parser;
use client::{Protocol, Publisher, PublisherConfig, PublisherLinks, StreamInfo};
use indicatif::ProgressBar;
use report::stats::{lower_median, Summary};
use report::Table;

use crate::cpu::{CpuClock, CpuPerMessage};
use crate::limits::{self, PayloadLimits};
use crate::output::{self, Output, OutputArgs};
use crate::process::{ClusterOptions, ServersAs};
use crate::progress;
use crate::replication::{
    binary_or_self, payload_of, publish, spawn_cluster, Cluster, Durability, PublishRun, Together,
};
use crate::units::{fixed, format_bytes, parse_bytes, parse_switch};

/// Messages of the calibration burst that shows the logs' batch size.
const CALIBRATION_MESSAGES: usize = 20_000;

/// Options of `bench scale`.
#[derive(Parser, Debug, Clone)]
#[command(name = "scale")]
pub struct ScaleArgs {
    /// The stamplog binary to run as the servers [default: this program].
    #[arg(long, value_name = "PATH")]
    pub server_binary: Option<PathBuf>,
    /// Where the servers run: `processes` (each its own `stamplog server`
    /// process, as deployed) or `threads` (one `stamplog cluster`
    /// process).
    #[arg(long, value_enum, default_value_t = ServersAs::Processes)]
    pub servers_as: ServersAs,
    /// Servers in the cluster.
    #[arg(long, default_value_t = 3)]
    pub servers: usize,
    /// Replicas of each stream.
    #[arg(long, default_value_t = 3)]
    pub replicas: u8,
    /// Counts of streams, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "1,10,100")]
    pub streams: Vec<usize>,
    /// Counts of clients, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16")]
    pub clients: Vec<usize>,
    /// Payload bytes of each message (units B, KB, KiB).
    #[arg(long, value_parser = parse_bytes, default_value = "1KB")]
    pub payload: usize,
    /// Messages each client keeps in flight over its streams.
    #[arg(long, default_value_t = 256)]
    pub window: usize,
    /// Durability of the streams: `sync` (each replica acks after its
    /// fdatasync), `memory` (no disk: what the streams cost without their
    /// logs' I/O) or `sender` (sender-based logging).
    #[arg(long, value_enum, default_value = "sync")]
    pub durability: Durability,
    /// Whether each server's `sync` logs share its journal (`on`, as by
    /// default) or each writes and fdatasyncs on its own (`off`).
    #[arg(long, value_parser = parse_switch, action = clap::ArgAction::Set, default_value = "on", value_name = "on|off")]
    pub journal: bool,
    /// Worker threads of each server's runtime (`stamplog server
    /// --runtime-workers`): servers that share this machine's cores may
    /// run better with a share each (docs/results.md, "One runtime worker
    /// per server, measured again"). Servers as processes only.
    /// [default: the server's, one per CPU]
    #[arg(long, value_name = "N")]
    pub server_workers: Option<usize>,
    /// Whose connections carry the messages: `client` (a client's
    /// publishers share one connection per server, `PublisherLinks`) or
    /// `publisher` (each publisher connects to its replicas on its own).
    #[arg(long, value_enum, default_value_t = Connections::Client)]
    pub connections: Connections,
    /// Messages per cell, over all its clients.
    #[arg(long, default_value_t = 200_000)]
    pub messages: usize,
    /// Rounds of every cell, the order of the counts of streams reversed
    /// every other round: a cell's rate is the median of its rounds, and
    /// its fraction of one stream the median of each round's ratio to
    /// the one-stream cell of the same round (so a slow spell of the
    /// machine moves both sides of a ratio)
    #[arg(long, default_value_t = 1)]
    pub rounds: usize,
    /// Batches each disk-limit writer writes and syncs.
    #[arg(long, default_value_t = 300)]
    pub disk_syncs: usize,
    /// A publisher resends what is not acknowledged after this long.
    #[arg(long, default_value_t = 2000)]
    pub retry_ms: u64,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// Whose connections carry a client's messages.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Connections {
    /// One connection per server for all of a client's publishers.
    Client,
    /// Connections of each publisher's own.
    Publisher,
}

impl Default for ScaleArgs {
    fn default() -> Self {
        ScaleArgs::parse_from(["scale"])
    }
}

/// One count of streams and clients.
#[derive(Clone, Debug)]
pub struct ScaleCell {
    pub streams: usize,
    pub clients: usize,
    pub messages: usize,
    pub seconds: f64,
    pub messages_per_second: f64,
    pub megabytes_per_second: f64,
    /// Each message's time from its submit to its acknowledgement, µs.
    pub latency: Summary,
    /// CPU µs per message of all the clients (this process) and of all
    /// the servers together.
    pub cpu: CpuPerMessage,
    /// Bytes the servers wrote to storage per message, all replicas
    /// together (`None` where `/proc/<pid>/io` cannot be read).
    pub disk_bytes_per_message: Option<f64>,
    /// Each round's rate, in run order; `messages_per_second` is their
    /// median, and the other figures are the median round's.
    pub round_rates: Vec<f64>,
    /// The median of each round's rate over the rate of one stream with
    /// as many clients in the same round; `None` without that cell.
    pub of_one_stream: Option<f64>,
}

/// Everything `bench scale` measured.
#[derive(Clone, Debug)]
pub struct ScaleFigures {
    pub cells: Vec<ScaleCell>,
    pub limits: Option<PayloadLimits>,
}

impl ScaleFigures {
    pub fn cell(&self, streams: usize, clients: usize) -> Option<&ScaleCell> {
        let mut cells = self.cells.iter();
        cells.find(|c| c.streams == streams && c.clients == clients)
    }
}

/// Runs the experiment, prints its table, writes its files.
pub fn run(args: ScaleArgs) -> anyhow::Result<ScaleFigures> {
    ensure!(
        !args.streams.is_empty() && !args.clients.is_empty(),
        "--streams and --clients each need at least one count"
    );
    ensure!(
        args.streams.iter().chain(&args.clients).all(|n| *n > 0),
        "counts of streams and clients must be at least 1"
    );
    ensure!(
        args.messages > 0 && args.window > 0 && args.rounds > 0,
        "--messages, --window and --rounds must be at least 1"
    );
    ensure!(
        (1..=args.servers).contains(&usize::from(args.replicas)),
        "--replicas must be between 1 and --servers"
    );
    let binary = binary_or_self(&args.server_binary)?;
    let data = args.output.data_folder("scale")?;
    let runtime = output::runtime()?;
    let options = ClusterOptions {
        servers_as: args.servers_as,
        journal: args.journal,
        runtime_workers: args.server_workers,
        ..ClusterOptions::default()
    };
    let servers = spawn_cluster(&binary, args.servers, data.path(), options)?;
    let cluster = runtime.block_on(Cluster::connect(servers))?;
    let total = (args.messages * args.streams.len() * args.clients.len() * args.rounds) as u64;
    let bar = progress::bar(total, "scale", args.output.quiet);
    let burst = limits::Burst {
        payload: args.payload,
        messages: CALIBRATION_MESSAGES.min(args.messages),
        config: publisher_config(&args, &cluster, args.window),
    };
    let probe = (usize::from(args.replicas), args.disk_syncs, data.path());
    let limits = runtime.block_on(limits::calibrate(&cluster, burst, probe, &bar))?;
    let mut rounds: Vec<Vec<ScaleCell>> = Vec::with_capacity(args.rounds);
    for round in 0..args.rounds {
        let mut order = args.streams.clone();
        if round % 2 == 1 {
            order.reverse();
        }
        let mut cells = Vec::new();
        for streams in order {
            for &clients in &args.clients {
                bar.set_message(format!(
                    "round {} of {}: {streams} streams, {clients} clients",
                    round + 1,
                    args.rounds
                ));
                cells.push(runtime.block_on(run_cell(&cluster, &args, streams, clients, &bar))?);
            }
        }
        rounds.push(cells);
    }
    let cells = pool_rounds(&args, &rounds);
    cluster.stop()?;
    drop(runtime);
    bar.finish_and_clear();
    let figures = ScaleFigures { cells, limits };
    write_report(&args, &figures)?;
    Ok(figures)
}

/// Each cell of `args`'s counts over `rounds`: the median round's figures
/// with every round's rate, and the median of its paired ratios to one
/// stream (the lower median for an even count, so no round counts twice).
fn pool_rounds(args: &ScaleArgs, rounds: &[Vec<ScaleCell>]) -> Vec<ScaleCell> {
    let find = |round: &[ScaleCell], streams: usize, clients: usize| {
        let cell = round
            .iter()
            .find(|c| c.streams == streams && c.clients == clients);
        cell.expect("every round runs every cell").clone()
    };
    let mut cells = Vec::new();
    for &streams in &args.streams {
        for &clients in &args.clients {
            let runs: Vec<ScaleCell> = rounds.iter().map(|r| find(r, streams, clients)).collect();
            let round_rates: Vec<f64> = runs.iter().map(|c| c.messages_per_second).collect();
            let median = lower_median(&round_rates);
            let of_one_stream = args.streams.contains(&1).then(|| {
                let ratios = rounds.iter().zip(&runs).map(|(round, cell)| {
                    cell.messages_per_second / find(round, 1, clients).messages_per_second
                });
                lower_median(&ratios.collect::<Vec<_>>())
            });
            let middle = runs
                .iter()
                .find(|c| c.messages_per_second == median)
                .expect("the median is a round's rate");
            cells.push(ScaleCell {
                round_rates,
                of_one_stream,
                ..middle.clone()
            });
        }
    }
    cells
}

fn publisher_config(args: &ScaleArgs, cluster: &Cluster, window: usize) -> PublisherConfig {
    PublisherConfig {
        window: window.max(1),
        credentials: cluster.credentials().clone(),
        retry: Duration::from_millis(args.retry_ms.max(1)),
        client_id: Some(proto::random_u128()),
        ..PublisherConfig::default()
    }
}

/// The streams client `client` of `clients` writes, of `streams`.
pub fn streams_of(client: usize, clients: usize, streams: usize) -> Vec<usize> {
    if streams < clients {
        return vec![client % streams];
    }
    (client..streams).step_by(clients).collect()
}

/// A client's window of `window` messages split among its `publishers`:
/// shares that differ by at most one and add up to the whole window
/// (so 100 streams of one client keep 256 in flight, as one stream does,
/// not 100 × 2), each at least 1.
pub fn window_shares(window: usize, publishers: usize) -> Vec<usize> {
    (0..publishers)
        .map(|index| (window / publishers + usize::from(index < window % publishers)).max(1))
        .collect()
}

/// `messages` split in proportion to `windows` (whole messages, the
/// remainder one each to the first), so that publishers with their
/// shares of a window finish together.
pub fn message_shares(messages: usize, windows: &[usize]) -> Vec<usize> {
    let total: usize = windows.iter().sum();
    let mut shares: Vec<usize> = windows.iter().map(|w| messages * w / total).collect();
    let left = messages - shares.iter().sum::<usize>();
    for share in shares.iter_mut().take(left) {
        *share += 1;
    }
    shares
}

async fn run_cell(
    cluster: &Cluster,
    args: &ScaleArgs,
    streams: usize,
    clients: usize,
    bar: &ProgressBar,
) -> anyhow::Result<ScaleCell> {
    let mut infos: Vec<StreamInfo> = Vec::with_capacity(streams);
    for index in 0..streams {
        let name = format!("scale-{streams}s-{clients}c-{index}");
        let (durability, protocol) = (args.durability, Protocol::OneHopAckClient);
        infos.push(
            cluster
                .create(&name, durability, protocol, args.replicas)
                .await?,
        );
    }
    let groups = connect_clients(cluster, args, &infos, clients).await?;
    let payload = Arc::new(payload_of(args.payload));
    let clock = CpuClock::start(&cluster.pids())?;
    let started = Instant::now();
    // Each publisher keeps its share of its client's window full on its
    // own, with its share of the client's messages: one late ack holds
    // back its stream only, as with independent writers of many streams,
    // and the client's whole window stays in flight.
    let mut tasks = Vec::new();
    for (client, publishers) in groups.into_iter().enumerate() {
        let messages = args.messages / clients + usize::from(client < args.messages % clients);
        let windows: Vec<usize> = publishers.iter().map(|(_, window)| *window).collect();
        let shares = message_shares(messages, &windows);
        for ((publisher, window), messages) in publishers.into_iter().zip(shares) {
            let (payload, bar) = (Arc::clone(&payload), bar.clone());
            tasks.push(tokio::spawn(async move {
                publish(&[publisher], window, &payload, messages, &bar).await
            }));
        }
    }
    let mut runs: Vec<PublishRun> = Vec::with_capacity(tasks.len());
    for task in tasks {
        runs.push(task.await.context("a client task panicked")??);
    }
    let messages: usize = runs.iter().map(|run| run.messages).sum();
    // Streams have primaries on every server: only the sums by side mean
    // anything here.
    let cpu = clock.per_message(messages, 0)?;
    let disk_bytes_per_message = clock.written_per_message(messages);
    for info in &infos {
        cluster.delete(info).await?;
    }
    let together = Together::of(&runs, started);
    Ok(ScaleCell {
        streams,
        clients,
        messages: together.messages,
        seconds: together.seconds,
        messages_per_second: together.messages_per_second(),
        megabytes_per_second: together.megabytes_per_second(args.payload),
        latency: Summary::of(&together.latencies_us),
        cpu,
        disk_bytes_per_message,
        round_rates: vec![together.messages_per_second()],
        of_one_stream: None,
    })
}

/// Each client's publishers, one per stream it writes (`streams_of`),
/// each with its share of the client's window (`window_shares`).
async fn connect_clients(
    cluster: &Cluster,
    args: &ScaleArgs,
    infos: &[StreamInfo],
    clients: usize,
) -> anyhow::Result<Vec<Vec<(Publisher, usize)>>> {
    let mut groups = Vec::with_capacity(clients);
    for client in 0..clients {
        let mine = streams_of(client, clients, infos.len());
        // One client id and one connection per server for all of a
        // client's publishers; its window shared among them, whole.
        let windows = window_shares(args.window, mine.len());
        let config = publisher_config(args, cluster, windows[0]);
        let shared = PublisherLinks::new(&config);
        let mut publishers = Vec::with_capacity(mine.len());
        for (index, window) in mine.into_iter().zip(windows) {
            let links = match args.connections {
                Connections::Client => shared.clone(),
                Connections::Publisher => PublisherLinks::new(&config),
            };
            let config = PublisherConfig {
                window,
                ..config.clone()
            };
            let publisher = Publisher::connect_over(&links, &infos[index], config)
                .await
                .with_context(|| format!("cannot connect a publisher to {}", infos[index].name))?;
            publishers.push((publisher, window));
        }
        groups.push(publishers);
    }
    Ok(groups)
}

/// One row per cell: the aggregate rate, its latency, and its fraction of
/// the disk's limit and of one stream written by as many clients.
pub fn table(figures: &ScaleFigures, args: &ScaleArgs) -> Table {
    let disk = figures.limits.as_ref().map(|l| l.disk.messages_per_second);
    let title = format!(
        "Streams and clients: {} servers{}, R = {}, {} one-hop-ack-client, {} payloads, window {} per client, {}; disk limit {} msgs/s, loopback limit {} msgs/s",
        args.servers,
        if args.journal { "" } else { " without journals" },
        args.replicas,
        args.durability.name(),
        format_bytes(args.payload),
        args.window,
        match args.connections {
            Connections::Client => "one connection per client and server",
            Connections::Publisher => "connections of each publisher's own",
        },
        disk.map_or("-".into(), |d| fixed(d, 0)),
        figures
            .limits
            .as_ref()
            .map_or("-".into(), |l| fixed(l.loopback.messages_per_second(), 0)),
    );
    let rounds = if args.rounds > 1 {
        format!(", median of {} rounds", args.rounds)
    } else {
        String::new()
    };
    let title = format!("{title}{rounds}");
    let columns = [
        "streams",
        "clients",
        "msgs/s",
        "rounds' msgs/s",
        "MB/s",
        "p50 µs",
        "p99 µs",
        "servers CPU µs/msg",
        "clients CPU µs/msg",
        "servers disk KB/msg",
        "of disk",
        "of 1 stream",
    ];
    let mut table = Table::new(title, &columns);
    for cell in &figures.cells {
        let rates: Vec<String> = cell.round_rates.iter().map(|r| fixed(*r, 0)).collect();
        table.row(vec![
            cell.streams.to_string(),
            cell.clients.to_string(),
            fixed(cell.messages_per_second, 0),
            rates.join(" "),
            fixed(cell.megabytes_per_second, 1),
            fixed(cell.latency.p50, 0),
            fixed(cell.latency.p99, 0),
            fixed(cell.cpu.servers, 1),
            fixed(cell.cpu.client, 1),
            cell.disk_bytes_per_message
                .map_or("-".into(), |b| fixed(b / 1000.0, 1)),
            disk.map_or("-".into(), |d| fixed(cell.messages_per_second / d, 2)),
            cell.of_one_stream.map_or("-".into(), |o| fixed(o, 2)),
        ]);
    }
    table
}

fn write_report(args: &ScaleArgs, figures: &ScaleFigures) -> anyhow::Result<()> {
    let table = table(figures, args);
    print!("{}", table.render());
    let mut output = Output::new(args.output.out_folder("scale"))?;
    output.csv("scale", &table)?;
    let mut chart = report::plot::Chart::lines("Aggregate rate", "streams", "msgs/s");
    for &clients in &args.clients {
        let points = figures.cells.iter().filter(|c| c.clients == clients);
        let points = points
            .map(|c| (c.streams as f64, c.messages_per_second))
            .collect();
        let name = format!("{clients} clients");
        chart.add(report::plot::Series::new(name, points));
    }
    output.png("scale", &chart)?;
    let cells: Vec<serde_json::Value> = figures
        .cells
        .iter()
        .map(|c| {
            serde_json::json!({
                "streams": c.streams, "clients": c.clients, "messages": c.messages,
                "seconds": c.seconds, "messages_per_second": c.messages_per_second,
                "megabytes_per_second": c.megabytes_per_second, "latency_us": c.latency.to_json(),
                "round_messages_per_second": c.round_rates, "of_one_stream": c.of_one_stream,
                "cpu_us_per_message": { "servers": c.cpu.servers, "clients": c.cpu.client },
                "servers_disk_bytes_per_message": c.disk_bytes_per_message,
            })
        })
        .collect();
    let json = serde_json::json!({
        "experiment": "scale",
        "payload_bytes": args.payload,
        "window": args.window,
        "rounds": args.rounds,
        "replicas": args.replicas,
        "connections": format!("{:?}", args.connections).to_lowercase(),
        "journal": args.journal,
        "limits": figures.limits.as_ref().map(PayloadLimits::to_json),
        "table": table.to_json(),
        "cells": cells,
    });
    output.json(args.output.json.as_deref(), &json)?;
    output.announce();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{message_shares, streams_of, window_shares};

    #[test]
    fn a_clients_window_is_split_whole_among_its_publishers() {
        assert_eq!(window_shares(256, 1), [256]);
        let shares = window_shares(256, 100);
        assert_eq!(shares.iter().sum::<usize>(), 256);
        assert_eq!(shares.iter().filter(|w| **w == 3).count(), 56);
        assert_eq!(shares.iter().filter(|w| **w == 2).count(), 44);
        assert_eq!(window_shares(256, 7).iter().sum::<usize>(), 256);
        assert_eq!(window_shares(2, 4), [1, 1, 1, 1], "at least one each");
    }

    #[test]
    fn a_clients_messages_follow_its_publishers_windows() {
        assert_eq!(message_shares(10, &[256]), [10]);
        assert_eq!(message_shares(10, &[3, 2]), [6, 4]);
        let windows = window_shares(256, 100);
        let shares = message_shares(150_000, &windows);
        assert_eq!(shares.iter().sum::<usize>(), 150_000);
        assert!(shares[0] >= 1_757 && shares[99] <= 1_172, "{shares:?}");
        assert_eq!(message_shares(3, &[1, 1, 1, 1]), [1, 1, 1, 0]);
    }

    #[test]
    fn every_stream_has_a_writer_and_every_client_a_stream() {
        assert_eq!(streams_of(0, 4, 10), [0, 4, 8]);
        assert_eq!(streams_of(3, 4, 10), [3, 7]);
        assert_eq!(streams_of(5, 16, 1), [0]);
        assert_eq!(streams_of(12, 16, 10), [2]);
        for (clients, streams) in [(1, 1), (4, 10), (16, 100), (16, 10), (4, 1)] {
            let mut written: Vec<usize> = (0..clients)
                .flat_map(|c| streams_of(c, clients, streams))
                .collect();
            written.sort_unstable();
            written.dedup();
            assert_eq!(
                written,
                (0..streams).collect::<Vec<_>>(),
                "{clients} {streams}"
            );
        }
    }
}
