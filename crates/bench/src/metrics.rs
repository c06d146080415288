//! `bench metrics`: how long a Prometheus scrape of `/metrics` takes on
//! servers that hold many streams (F15).
//!
//! Separate server processes (`stamplog server`, one per server, each with
//! its admin port on a loopback port the cluster reserved) form a
//! cluster. Once every server's `/health/ready` says it is in the view,
//! the experiment creates `--streams` replicated streams (R =
//! `--replicas`, so with the defaults every server holds a replica of
//! each), acknowledges one message on each so that every stream has its
//! ack-latency histogram, then scrapes every server's `/metrics`
//! `--scrapes` times, one after another, and reports the time from the
//! request to the last byte of the answer (p50, p99, max), the answer's
//! size and its samples.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use clap::Parser;
use client::{Client, DurabilityConfig, Protocol, Publisher};
use report::plot::{Chart, Series};
use report::stats::Summary;
use report::Table;

use crate::output::{self, Output, OutputArgs};
use crate::process::ProcessCluster;
use crate::progress;
use crate::replication::binary_or_self;
use crate::units::fixed;

/// How long one scrape may take before the experiment gives up on it.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(30);

/// How long the servers may take to join the cluster.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// Options of `bench metrics`.
#[derive(Parser, Debug, Clone)]
#[command(name = "metrics")]
pub struct MetricsArgs {
    /// The stamplog binary to run as the servers [default: this program].
    #[arg(long, value_name = "PATH")]
    pub server_binary: Option<PathBuf>,
    /// Server processes in the cluster.
    #[arg(long, default_value_t = 3)]
    pub servers: u32,
    /// Streams to create (each with one acknowledged message).
    #[arg(long, default_value_t = 1000)]
    pub streams: u32,
    /// Replicas of each stream.
    #[arg(long, default_value_t = 3)]
    pub replicas: u8,
    /// Scrapes of each server's `/metrics`.
    #[arg(long, default_value_t = 50)]
    pub scrapes: usize,
    #[command(flatten)]
    pub output: OutputArgs,
}

impl Default for MetricsArgs {
    fn default() -> Self {
        MetricsArgs::parse_from(["metrics"])
    }
}

/// One server's scrapes.
#[derive(Clone, Debug)]
pub struct ServerScrapes {
    pub server: u32,
    /// Streams this server holds a replica of (its `stamplog_stream_last_version` samples).
    pub streams: usize,
    /// The last answer's size and its samples (lines that are not comments).
    pub bytes: usize,
    pub samples: usize,
    /// Each scrape's time, request to last byte, in milliseconds.
    pub milliseconds: Vec<f64>,
}

impl ServerScrapes {
    pub fn summary(&self) -> Summary {
        Summary::of(&self.milliseconds)
    }
}

/// Everything `bench metrics` measured.
#[derive(Clone, Debug)]
pub struct MetricsFigures {
    pub streams: u32,
    /// Seconds to create the streams and acknowledge a message on each.
    pub setup_seconds: f64,
    pub servers: Vec<ServerScrapes>,
}

/// Runs the experiment, prints its table, writes its files.
pub fn run(args: MetricsArgs) -> anyhow::Result<MetricsFigures> {
    ensure!(args.servers >= 1, "--servers must be at least 1");
    ensure!(args.streams >= 1, "--streams must be at least 1");
    ensure!(args.scrapes >= 1, "--scrapes must be at least 1");
    ensure!(
        (1..=args.servers).contains(&u32::from(args.replicas)),
        "--replicas must be between 1 and --servers"
    );
    let binary = binary_or_self(&args.server_binary)?;
    let data = args.output.data_folder("metrics")?;
    let cluster = ProcessCluster::start(&binary, data.path(), args.servers, &[])?;
    let admins = (1..=args.servers)
        .map(|id| cluster.admin_address(id))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let runtime = output::runtime()?;
    for (id, admin) in (1..).zip(&admins) {
        runtime.block_on(wait_ready(id, *admin))?;
    }
    let started = Instant::now();
    runtime.block_on(create_streams(&args, &cluster))?;
    let setup_seconds = started.elapsed().as_secs_f64();
    let bar = progress::bar(
        args.scrapes as u64 * admins.len() as u64,
        "scrapes",
        args.output.quiet,
    );
    let mut servers = Vec::with_capacity(admins.len());
    for (id, admin) in (1..).zip(&admins) {
        servers.push(runtime.block_on(scrape(id, *admin, args.scrapes, &bar))?);
    }
    bar.finish_and_clear();
    drop(cluster);
    let figures = MetricsFigures {
        streams: args.streams,
        setup_seconds,
        servers,
    };
    write_report(&args, &figures)?;
    Ok(figures)
}

/// Waits until server `id`'s `/health/ready` answers 200: it is in the
/// view (streams can be created).
async fn wait_ready(id: u32, admin: SocketAddr) -> anyhow::Result<()> {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        let answer = server::observe::get(admin, "/health/ready", SCRAPE_TIMEOUT).await;
        match answer {
            Ok((200, _)) => return Ok(()),
            Ok((_, why)) if Instant::now() > deadline => {
                anyhow::bail!("server {id} was not ready within {READY_TIMEOUT:?}: {why}")
            }
            Err(error) if Instant::now() > deadline => {
                return Err(error).with_context(|| format!("server {id}'s /health/ready"))
            }
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// Creates the streams through server 1 and acknowledges one message on
/// each through a publisher (its replicas' links closed after).
async fn create_streams(args: &MetricsArgs, cluster: &ProcessCluster) -> anyhow::Result<()> {
    let client = Client::connect(cluster.client_config(1)?)
        .await
        .context("cannot connect to server 1")?;
    let bar = progress::bar(u64::from(args.streams), "streams", args.output.quiet);
    for index in 0..args.streams {
        let name = format!("scraped-{index:05}");
        let info = client
            .create_stream_with(
                &name,
                DurabilityConfig::Sync,
                Protocol::OneHopAckClient,
                args.replicas,
            )
            .await
            .with_context(|| format!("cannot create stream {name}"))?;
        let publisher = Publisher::connect(&info, cluster.publisher_config(1)?)
            .await
            .with_context(|| format!("cannot reach the replicas of stream {name}"))?;
        publisher
            .send(b"", b"one message")
            .await
            .with_context(|| format!("stream {name} did not acknowledge"))?;
        bar.inc(1);
    }
    bar.finish_and_clear();
    Ok(())
}

/// Scrapes `/metrics` of one server `scrapes` times in a row.
async fn scrape(
    server: u32,
    admin: SocketAddr,
    scrapes: usize,
    bar: &indicatif::ProgressBar,
) -> anyhow::Result<ServerScrapes> {
    let mut milliseconds = Vec::with_capacity(scrapes);
    let mut last = String::new();
    for _ in 0..scrapes {
        let started = Instant::now();
        let (code, body) = server::observe::get(admin, "/metrics", SCRAPE_TIMEOUT)
            .await
            .with_context(|| format!("scraping server {server} at {admin}"))?;
        milliseconds.push(started.elapsed().as_secs_f64() * 1e3);
        ensure!(
            code == 200,
            "server {server}'s /metrics answered {code}: {body}"
        );
        last = body;
        bar.inc(1);
    }
    let samples = last
        .lines()
        .filter(|line| !line.starts_with('#') && !line.is_empty())
        .count();
    let streams = last
        .lines()
        .filter(|line| line.starts_with("stamplog_stream_last_version{"))
        .count();
    Ok(ServerScrapes {
        server,
        streams,
        bytes: last.len(),
        samples,
        milliseconds,
    })
}

/// One row per server: its streams, the answer, the scrape times.
pub fn table(figures: &MetricsFigures, args: &MetricsArgs) -> Table {
    let title = format!(
        "/metrics of {} server processes holding {} streams (R = {}), {} scrapes each; \
         setup {} s",
        figures.servers.len(),
        figures.streams,
        args.replicas,
        args.scrapes,
        fixed(figures.setup_seconds, 1)
    );
    let mut table = Table::new(
        title,
        &[
            "server",
            "streams held",
            "answer KiB",
            "samples",
            "p50 ms",
            "p99 ms",
            "max ms",
        ],
    );
    for server in &figures.servers {
        let summary = server.summary();
        table.row(vec![
            server.server.to_string(),
            server.streams.to_string(),
            fixed(server.bytes as f64 / 1024.0, 1),
            server.samples.to_string(),
            fixed(summary.p50, 2),
            fixed(summary.p99, 2),
            fixed(summary.max, 2),
        ]);
    }
    table
}

fn write_report(args: &MetricsArgs, figures: &MetricsFigures) -> anyhow::Result<()> {
    let table = table(figures, args);
    print!("{}", table.render());
    let mut output = Output::new(args.output.out_folder("metrics"))?;
    output.csv("metrics", &table)?;
    let mut chart = Chart::lines("Scrapes of /metrics", "scrape", "milliseconds");
    for server in &figures.servers {
        let points = (1..).zip(&server.milliseconds);
        let points = points.map(|(index, ms)| (f64::from(index), *ms)).collect();
        chart.add(Series::new(format!("server {}", server.server), points));
    }
    output.png("metrics", &chart)?;
    let servers: Vec<serde_json::Value> = figures
        .servers
        .iter()
        .map(|server| {
            serde_json::json!({
                "server": server.server, "streams": server.streams, "bytes": server.bytes,
                "samples": server.samples, "milliseconds": server.summary().to_json(),
            })
        })
        .collect();
    let json = serde_json::json!({
        "experiment": "metrics",
        "streams": figures.streams,
        "replicas": args.replicas,
        "setup_seconds": figures.setup_seconds,
        "table": table.to_json(),
        "servers": servers,
    });
    output.json(args.output.json.as_deref(), &json)?;
    output.announce();
    Ok(())
}
