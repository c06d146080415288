//! `bench logging`: seed 000's pessimistic logging experiment (Figures
//! 2.14-2.16).
//!
//! One client sends request messages to one in-process server, one at a
//! time (window 1), and waits for the reply of the same length (the server
//! echoes the payload in the acknowledgement). With durability `sync` the
//! reply leaves only after the record is written and fdatasynced; with
//! `memory` nothing touches the disk. The server samples each record's
//! logging latency (append to durable). In the same run, on the same disk,
//! the experiment measures a bare write + fdatasync of a record of each
//! size: the physical limit the logging latency is judged against (the
//! product target: median at most 1.5 times the bare median).
//!
//! Seed 000's cost comparison in one table: the four durability modes
//! through the replicated publisher (one server, R = 1), each with a
//! saturated throughput run (`--window` messages in flight) and a window-1
//! end-to-end latency run, as overheads against `memory` (no logging):
//! `sync` (write + fdatasync per group commit), `paged` (seed 004's page
//! buffer, acked from memory), and `sender` (sender-based logging: the
//! primary returns the version at once, the client confirms and keeps the
//! message until the next checkpoint, the log goes through the page
//! buffer). The modes run in turns, `--rounds` times, and each figure is
//! the median of its rounds. A mode's throughput overhead is the median of
//! its rounds' ratios to the `memory` run of the same round: the runs of
//! one round are seconds apart, so a shared machine's drift, which moves
//! whole rounds, cancels in the ratio.

use std::path::Path;
use std::time::Instant;

use anyhow::{ensure, Context};
use clap::Parser;
use client::{Client, DurabilityConfig, PendingPublish, Producer, Publisher, PublisherConfig};
use indicatif::ProgressBar;
use report::plot::{Chart, Series};
use report::stats::{density, Summary};
use report::Table;

use crate::harness::InProcessServer;
use crate::output::{self, Output, OutputArgs};
use crate::units::{fixed, format_bytes, micros, parse_bytes};
use crate::{fdatasync, progress};

/// Bins of each probability density plot.
const DENSITY_BINS: usize = 40;

/// Options of `bench logging`.
#[derive(Parser, Debug, Clone)]
#[command(name = "logging")]
pub struct LoggingArgs {
    /// Message sizes, comma separated (units B, KB = 1000, KiB = 1024).
    #[arg(long, value_delimiter = ',', value_parser = parse_bytes,
          default_value = "100,1KB,10KB,100KB")]
    pub sizes: Vec<usize>,
    /// Measured request/reply messages per size and durability mode.
    #[arg(long, default_value_t = 2000)]
    pub messages: usize,
    /// Messages sent first and left out of every figure, so connection
    /// setup and the first segment's creation do not count.
    #[arg(long, default_value_t = 50)]
    pub warmup: usize,
    /// Bare write + fdatasync samples per size [default: --messages].
    #[arg(long)]
    pub fdatasync_samples: Option<usize>,
    /// The modes comparison: message size.
    #[arg(long, value_parser = parse_bytes, default_value = "1KB")]
    pub modes_size: usize,
    /// The modes comparison: messages of each throughput run.
    #[arg(long, default_value_t = 200_000)]
    pub modes_messages: usize,
    /// The modes comparison: messages of each window-1 latency run.
    #[arg(long, default_value_t = 2_000)]
    pub modes_latency_messages: usize,
    /// The modes comparison: messages in flight in the throughput runs.
    #[arg(long, default_value_t = 256)]
    pub window: usize,
    /// The modes comparison: rounds of the four modes, in turns (a
    /// shared machine's runs seconds apart differ by tens of percent; the
    /// median of many rounds is what holds still).
    #[arg(long, default_value_t = 11)]
    pub rounds: usize,
    #[command(flatten)]
    pub output: OutputArgs,
}

impl Default for LoggingArgs {
    fn default() -> Self {
        LoggingArgs::parse_from(["logging"])
    }
}

/// The figures of one message size; latencies in microseconds.
#[derive(Clone, Debug)]
pub struct LoggingRow {
    pub size: usize,
    /// Server side, append to durable, of the measured `sync` messages.
    pub log_latency: Summary,
    /// A bare write + fdatasync of one record of this size.
    pub fdatasync: Summary,
    /// `log_latency.p50 / fdatasync.p50` (target: at most 1.5).
    pub ratio_p50: f64,
    /// `log_latency.p99 / fdatasync.p50` (target: at most 4).
    pub ratio_p99: f64,
    /// Client side, send to reply, with durability `sync`.
    pub end_to_end_logging: Summary,
    /// Client side, send to reply, with durability `memory`.
    pub end_to_end_no_logging: Summary,
    /// Replies received in the measured part of each mode.
    pub replies: usize,
    /// The raw samples behind the densities.
    pub log_samples: Vec<f64>,
    pub end_to_end_logging_samples: Vec<f64>,
    pub end_to_end_no_logging_samples: Vec<f64>,
}

/// One durability mode in the modes comparison (medians of the rounds).
#[derive(Clone, Debug)]
pub struct ModeRow {
    pub mode: &'static str,
    pub messages_per_second: f64,
    /// Window-1 end-to-end latency, microseconds (the median round's).
    pub latency: Summary,
    /// Against `memory`, in percent: throughput lost (the median of the
    /// rounds' ratios to the same round's `memory` run), latency added.
    pub throughput_overhead_percent: f64,
    pub latency_overhead_percent: f64,
    /// Each round's throughput, for the record.
    pub rounds: Vec<f64>,
}

/// Everything `bench logging` measured.
#[derive(Clone, Debug)]
pub struct LoggingFigures {
    pub rows: Vec<LoggingRow>,
    /// The four durability modes, `memory` first.
    pub modes: Vec<ModeRow>,
}

impl LoggingFigures {
    pub fn mode(&self, name: &str) -> Option<&ModeRow> {
        self.modes.iter().find(|m| m.mode == name)
    }
}

/// The modes compared, `memory` (the baseline) first.
fn compared_modes() -> [(&'static str, DurabilityConfig); 4] {
    [
        ("memory", DurabilityConfig::Memory),
        ("sync", DurabilityConfig::Sync),
        (
            "paged",
            DurabilityConfig::Paged {
                pages: 2,
                page_size: 4 * 1024 * 1024,
            },
        ),
        (
            "sender",
            DurabilityConfig::Sender {
                pages: crate::replication::SENDER_PAGES,
                page_size: crate::replication::SENDER_PAGE_SIZE,
            },
        ),
    ]
}

/// Runs the experiment, prints its tables, writes its files.
pub fn run(args: LoggingArgs) -> anyhow::Result<LoggingFigures> {
    ensure!(!args.sizes.is_empty(), "--sizes needs at least one size");
    ensure!(args.messages > 0, "--messages must be at least 1");
    ensure!(
        args.modes_messages > 0 && args.modes_latency_messages > 0 && args.rounds > 0,
        "--modes-messages, --modes-latency-messages and --rounds must be at least 1"
    );
    ensure!(args.window > 0, "--window must be at least 1");
    ensure!(
        args.modes_size <= 1024 * 1024,
        "--modes-size above 1 MiB exceeds the server's message limit"
    );
    ensure!(
        args.sizes.iter().all(|size| *size <= 1024 * 1024),
        "sizes above 1 MiB exceed the server's message limit"
    );
    let data = args.output.data_folder("logging")?;
    let runtime = output::runtime()?;
    let samples = args.fdatasync_samples.unwrap_or(args.messages);
    let steps = args.sizes.len() * (samples + 2 * (args.messages + args.warmup))
        + args.rounds * 4 * (args.modes_messages + args.modes_latency_messages);
    let bar = progress::bar(steps as u64, "logging", args.output.quiet);
    let figures = measure(&args, data.path(), &runtime, &bar)?;
    bar.finish_and_clear();
    write_report(&args, &figures)?;
    Ok(figures)
}

fn measure(
    args: &LoggingArgs,
    folder: &Path,
    runtime: &tokio::runtime::Runtime,
    bar: &ProgressBar,
) -> anyhow::Result<LoggingFigures> {
    let mut config = server::ServerConfig::new(folder.join("server"));
    config.sample_log_latency = true;
    let server = runtime.block_on(InProcessServer::start(config))?;
    let client = runtime
        .block_on(Client::connect(server.client_config(1)))
        .context("cannot connect to the in-process server")?;
    let samples = args.fdatasync_samples.unwrap_or(args.messages);
    let mut rows = Vec::new();
    for &size in &args.sizes {
        bar.set_message(format!("{} fdatasync", format_bytes(size)));
        let bare = fdatasync::measure(folder, size, samples, || bar.inc(1))?;
        bar.set_message(format!("{} sync", format_bytes(size)));
        let logging = runtime.block_on(request_reply(
            &client,
            &server,
            size,
            DurabilityConfig::Sync,
            args,
            bar,
        ))?;
        bar.set_message(format!("{} memory", format_bytes(size)));
        let no_logging = runtime.block_on(request_reply(
            &client,
            &server,
            size,
            DurabilityConfig::Memory,
            args,
            bar,
        ))?;
        rows.push(row(size, &bare, logging, no_logging));
    }
    let modes = runtime.block_on(compare_modes(&client, args, bar))?;
    drop(client);
    runtime.block_on(server.stop())?;
    Ok(LoggingFigures { rows, modes })
}

/// The modes comparison: every mode once per round, in turns, so a slow
/// spell of the machine hits them alike.
async fn compare_modes(
    client: &Client,
    args: &LoggingArgs,
    bar: &ProgressBar,
) -> anyhow::Result<Vec<ModeRow>> {
    let modes = compared_modes();
    let mut throughput: Vec<Vec<f64>> = vec![Vec::new(); modes.len()];
    let mut latency: Vec<Vec<Summary>> = vec![Vec::new(); modes.len()];
    let payload: Vec<u8> = (0..args.modes_size)
        .map(|index| (index % 251) as u8)
        .collect();
    for round in 0..args.rounds {
        for (index, (name, durability)) in modes.iter().enumerate() {
            bar.set_message(format!("modes: {name}, round {}", round + 1));
            let stream = format!("modes-{name}-{round}");
            let options = client::StreamOptions::new(*durability);
            let info = client
                .create_stream_with_options(&stream, &options)
                .await
                .with_context(|| format!("cannot create stream {stream}"))?;
            let config = PublisherConfig {
                window: args.window,
                ..PublisherConfig::default()
            };
            let publisher = Publisher::connect(&info, config).await?;
            let started = Instant::now();
            let mut pending = std::collections::VecDeque::with_capacity(args.window);
            for _ in 0..args.modes_messages {
                if pending.len() >= args.window {
                    let answer: PendingPublish = pending.pop_front().expect("full");
                    answer.await.context("a message was not acknowledged")?;
                    bar.inc(1);
                }
                pending.push_back(publisher.submit(b"", &payload).await?);
            }
            for answer in pending {
                answer.await.context("a message was not acknowledged")?;
                bar.inc(1);
            }
            throughput[index].push(args.modes_messages as f64 / started.elapsed().as_secs_f64());
            let mut samples = Vec::with_capacity(args.modes_latency_messages);
            for _ in 0..args.modes_latency_messages {
                let sent = Instant::now();
                publisher
                    .send(b"", &payload)
                    .await
                    .context("a message was not acknowledged")?;
                samples.push(sent.elapsed().as_secs_f64() * 1e6);
                bar.inc(1);
            }
            latency[index].push(Summary::of(&samples));
            drop(publisher);
            client.delete_stream(&stream).await?;
        }
    }
    let median = |values: &[f64]| {
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        sorted[sorted.len() / 2]
    };
    let median_summary = |summaries: &[Summary]| {
        let mut sorted = summaries.to_vec();
        sorted.sort_by(|a, b| a.mean.total_cmp(&b.mean));
        sorted[sorted.len() / 2]
    };
    let base_latency = median_summary(&latency[0]).mean;
    Ok(modes
        .iter()
        .enumerate()
        .map(|(index, (name, _))| {
            let messages_per_second = median(&throughput[index]);
            let latency = median_summary(&latency[index]);
            let ratios: Vec<f64> = throughput[index]
                .iter()
                .zip(&throughput[0])
                .map(|(mode, memory)| mode / memory)
                .collect();
            ModeRow {
                mode: name,
                messages_per_second,
                latency,
                throughput_overhead_percent: (1.0 - median(&ratios)) * 100.0,
                latency_overhead_percent: (latency.mean / base_latency - 1.0) * 100.0,
                rounds: throughput[index].clone(),
            }
        })
        .collect())
}

/// Seed 000's cost comparison: the four modes against no logging.
pub fn modes_table(args: &LoggingArgs, figures: &LoggingFigures) -> Table {
    let mut table = Table::new(
        format!(
            "Durability modes against no logging ({} messages, one server, R = 1; throughput with {} in flight, median of {} rounds, overhead the median of each round's ratio to its memory run; latency with 1 in flight, µs)",
            format_bytes(args.modes_size),
            args.window,
            args.rounds
        ),
        &[
            "mode",
            "msgs/s",
            "throughput overhead",
            "latency mean",
            "latency p50",
            "latency p99",
            "latency overhead (mean)",
        ],
    );
    for row in &figures.modes {
        table.row(vec![
            row.mode.to_string(),
            fixed(row.messages_per_second, 0),
            format!("{}%", fixed(row.throughput_overhead_percent, 1)),
            fixed(row.latency.mean, 1),
            fixed(row.latency.p50, 1),
            fixed(row.latency.p99, 1),
            format!("{}%", fixed(row.latency_overhead_percent, 1)),
        ]);
    }
    table
}

/// What one request/reply run returns: server-side logging latencies and
/// client-side end-to-end latencies, both in microseconds.
struct RunSamples {
    log: Vec<f64>,
    end_to_end: Vec<f64>,
}

fn row(size: usize, bare: &[f64], logging: RunSamples, no_logging: RunSamples) -> LoggingRow {
    let log_latency = Summary::of(&logging.log);
    let fdatasync = Summary::of(bare);
    LoggingRow {
        size,
        log_latency,
        fdatasync,
        ratio_p50: log_latency.p50 / fdatasync.p50,
        ratio_p99: log_latency.p99 / fdatasync.p50,
        end_to_end_logging: Summary::of(&logging.end_to_end),
        end_to_end_no_logging: Summary::of(&no_logging.end_to_end),
        replies: logging.end_to_end.len().min(no_logging.end_to_end.len()),
        log_samples: logging.log,
        end_to_end_logging_samples: logging.end_to_end,
        end_to_end_no_logging_samples: no_logging.end_to_end,
    }
}

/// Sends warm-up then measured messages one at a time on a new stream of
/// `durability`, each waiting for its echoed reply.
async fn request_reply(
    client: &Client,
    server: &InProcessServer,
    size: usize,
    durability: DurabilityConfig,
    args: &LoggingArgs,
    bar: &ProgressBar,
) -> anyhow::Result<RunSamples> {
    let label = match durability {
        DurabilityConfig::Sync => "sync",
        _ => "memory",
    };
    let name = format!("logging-{label}-{size}");
    let info = client
        .create_stream(&name, durability)
        .await
        .with_context(|| format!("cannot create stream {name}"))?;
    let stream = server
        .state
        .stream_by_name(&name)
        .with_context(|| format!("the server does not know stream {name}"))?;
    let mut producer = client.producer(info.id);
    producer.set_echo(true);
    let payload: Vec<u8> = (0..size).map(|index| (index % 253) as u8).collect();
    for _ in 0..args.warmup {
        send_and_check(&mut producer, &payload).await?;
        bar.inc(1);
    }
    // Every warm-up reply left after its sample was taken, so this drops
    // exactly the warm-up samples.
    stream.log.take_latency_samples();
    let mut end_to_end = Vec::with_capacity(args.messages);
    for _ in 0..args.messages {
        let started = Instant::now();
        send_and_check(&mut producer, &payload).await?;
        end_to_end.push(started.elapsed().as_secs_f64() * 1e6);
        bar.inc(1);
    }
    let log = stream
        .log
        .take_latency_samples()
        .into_iter()
        .map(micros)
        .collect();
    Ok(RunSamples { log, end_to_end })
}

async fn send_and_check(producer: &mut Producer, payload: &[u8]) -> anyhow::Result<()> {
    let ack = producer
        .send(b"", payload)
        .await
        .context("a request went unanswered")?;
    ensure!(
        ack.echo.len() == payload.len(),
        "the reply has {} bytes, the request {}",
        ack.echo.len(),
        payload.len()
    );
    Ok(())
}

/// The logging-latency table (Figure 2.14's numbers, against fdatasync).
pub fn latency_table(figures: &LoggingFigures) -> Table {
    let mut table = Table::new(
        "Logging latency (server, append to durable) against a bare write + fdatasync, µs",
        &[
            "size",
            "log mean",
            "log std dev",
            "log p50",
            "log p99",
            "fdatasync p50",
            "fdatasync p99",
            "p50 / fdatasync p50",
            "p99 / fdatasync p50",
        ],
    );
    for row in &figures.rows {
        table.row(vec![
            format_bytes(row.size),
            fixed(row.log_latency.mean, 1),
            fixed(row.log_latency.std_dev, 1),
            fixed(row.log_latency.p50, 1),
            fixed(row.log_latency.p99, 1),
            fixed(row.fdatasync.p50, 1),
            fixed(row.fdatasync.p99, 1),
            fixed(row.ratio_p50, 2),
            fixed(row.ratio_p99, 2),
        ]);
    }
    table
}

/// The end-to-end table (Figures 2.15 and 2.16's numbers).
pub fn end_to_end_table(figures: &LoggingFigures) -> Table {
    let mut table = Table::new(
        "End-to-end latency (client, request to reply of the same length), µs",
        &[
            "size",
            "logging mean",
            "logging p50",
            "logging p99",
            "no logging mean",
            "no logging p50",
            "no logging p99",
            "overhead of logging (mean)",
        ],
    );
    for row in &figures.rows {
        let with = &row.end_to_end_logging;
        let without = &row.end_to_end_no_logging;
        table.row(vec![
            format_bytes(row.size),
            fixed(with.mean, 1),
            fixed(with.p50, 1),
            fixed(with.p99, 1),
            fixed(without.mean, 1),
            fixed(without.p50, 1),
            fixed(without.p99, 1),
            format!("{}%", fixed((with.mean / without.mean - 1.0) * 100.0, 1)),
        ]);
    }
    table
}

fn write_report(args: &LoggingArgs, figures: &LoggingFigures) -> anyhow::Result<()> {
    let latency = latency_table(figures);
    let end_to_end = end_to_end_table(figures);
    let modes = modes_table(args, figures);
    print!("{}", latency.render());
    println!();
    print!("{}", end_to_end.render());
    println!();
    print!("{}", modes.render());
    let mut output = Output::new(args.output.out_folder("logging"))?;
    output.csv("logging", &latency)?;
    output.csv("logging-end-to-end", &end_to_end)?;
    output.csv("logging-modes", &modes)?;
    output.png("logging-modes", &modes_chart(figures))?;
    output.png("logging", &log_density_chart(figures))?;
    output.png("logging-summary", &summary_chart(figures))?;
    output.png("logging-end-to-end", &end_to_end_density_chart(figures))?;
    let json = serde_json::json!({
        "experiment": "logging",
        "tables": [latency.to_json(), end_to_end.to_json(), modes.to_json()],
        "sizes": figures.rows.iter().map(row_json).collect::<Vec<_>>(),
        "modes": figures.modes.iter().map(|row| serde_json::json!({
            "mode": row.mode,
            "messages_per_second": row.messages_per_second,
            "rounds_messages_per_second": row.rounds,
            "throughput_overhead_percent": row.throughput_overhead_percent,
            "latency_us": row.latency.to_json(),
            "latency_overhead_percent": row.latency_overhead_percent,
        })).collect::<Vec<_>>(),
    });
    output.json(args.output.json.as_deref(), &json)?;
    output.announce();
    Ok(())
}

fn row_json(row: &LoggingRow) -> serde_json::Value {
    serde_json::json!({
        "size_bytes": row.size,
        "log_latency_us": row.log_latency.to_json(),
        "fdatasync_us": row.fdatasync.to_json(),
        "ratio_p50": row.ratio_p50,
        "ratio_p99": row.ratio_p99,
        "end_to_end_logging_us": row.end_to_end_logging.to_json(),
        "end_to_end_no_logging_us": row.end_to_end_no_logging.to_json(),
        "replies": row.replies,
    })
}

/// Figure 2.14: one density of the logging latency per message size. The
/// x axis is logarithmic because 100 B and 100 KB differ tenfold or more.
fn log_density_chart(figures: &LoggingFigures) -> Chart {
    let mut chart = Chart::lines(
        "Probability density of the logging latency",
        "logging latency (µs)",
        "density",
    );
    chart.log_x = true;
    for row in &figures.rows {
        chart.add(Series::new(
            format_bytes(row.size),
            density(&row.log_samples, DENSITY_BINS),
        ));
    }
    chart
}

/// Figure 2.16: densities of the end-to-end latency, with and without
/// logging, per size.
fn end_to_end_density_chart(figures: &LoggingFigures) -> Chart {
    let mut chart = Chart::lines(
        "Probability density of the end-to-end latency",
        "end-to-end latency (µs)",
        "density",
    );
    chart.log_x = true;
    for row in &figures.rows {
        let size = format_bytes(row.size);
        chart.add(Series::new(
            format!("{size} logging"),
            density(&row.end_to_end_logging_samples, DENSITY_BINS),
        ));
        chart.add(Series::new(
            format!("{size} no logging"),
            density(&row.end_to_end_no_logging_samples, DENSITY_BINS),
        ));
    }
    chart
}

/// The modes comparison: each mode's overheads against `memory`.
fn modes_chart(figures: &LoggingFigures) -> Chart {
    let categories = figures.modes.iter().map(|row| row.mode.to_string());
    let mut chart = Chart::bars(
        "Overhead of each durability mode against no logging",
        "durability mode",
        "overhead (%)",
        categories.collect(),
    );
    let series = |name: &str, pick: fn(&ModeRow) -> f64| {
        let points = figures.modes.iter().enumerate();
        Series::new(name, points.map(|(i, row)| (i as f64, pick(row))).collect())
    };
    chart.add(series("throughput lost", |row| {
        row.throughput_overhead_percent
    }));
    chart.add(series("latency added (mean)", |row| {
        row.latency_overhead_percent
    }));
    chart
}

/// Figure 2.15: mean logging latency and mean end-to-end latency with and
/// without logging, per size.
fn summary_chart(figures: &LoggingFigures) -> Chart {
    let categories = figures.rows.iter().map(|row| format_bytes(row.size));
    let mut chart = Chart::bars(
        "Mean logging and end-to-end latency",
        "message size",
        "mean latency (µs)",
        categories.collect(),
    );
    chart.log_y = true;
    let series = |name: &str, pick: fn(&LoggingRow) -> f64| {
        let points = figures.rows.iter().enumerate();
        Series::new(name, points.map(|(i, row)| (i as f64, pick(row))).collect())
    };
    chart.add(series("logging", |row| row.log_latency.mean));
    chart.add(series("fdatasync", |row| row.fdatasync.mean));
    chart.add(series("end-to-end, logging", |row| {
        row.end_to_end_logging.mean
    }));
    chart.add(series("end-to-end, no logging", |row| {
        row.end_to_end_no_logging.mean
    }));
    chart
}
