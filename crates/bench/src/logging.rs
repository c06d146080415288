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

use std::path::Path;
use std::time::Instant;

use anyhow::{ensure, Context};
use clap::Parser;
use client::{Client, DurabilityConfig, Producer};
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

/// Everything `bench logging` measured.
#[derive(Clone, Debug)]
pub struct LoggingFigures {
    pub rows: Vec<LoggingRow>,
}

/// Runs the experiment, prints its tables, writes its files.
pub fn run(args: LoggingArgs) -> anyhow::Result<LoggingFigures> {
    ensure!(!args.sizes.is_empty(), "--sizes needs at least one size");
    ensure!(args.messages > 0, "--messages must be at least 1");
    ensure!(
        args.sizes.iter().all(|size| *size <= 1024 * 1024),
        "sizes above 1 MiB exceed the server's message limit"
    );
    let data = args.output.data_folder("logging")?;
    let runtime = output::runtime()?;
    let samples = args.fdatasync_samples.unwrap_or(args.messages);
    let steps = args.sizes.len() * (samples + 2 * (args.messages + args.warmup));
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
    drop(client);
    runtime.block_on(server.stop())?;
    Ok(LoggingFigures { rows })
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
    latency.print();
    println!();
    end_to_end.print();
    let mut output = Output::new(args.output.out_folder("logging"))?;
    output.csv("logging", &latency)?;
    output.csv("logging-end-to-end", &end_to_end)?;
    output.png("logging", &log_density_chart(figures))?;
    output.png("logging-summary", &summary_chart(figures))?;
    output.png("logging-end-to-end", &end_to_end_density_chart(figures))?;
    let json = serde_json::json!({
        "experiment": "logging",
        "tables": [latency.to_json(), end_to_end.to_json()],
        "sizes": figures.rows.iter().map(row_json).collect::<Vec<_>>(),
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
