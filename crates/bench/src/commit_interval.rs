//! `bench commit-interval`: seed 003's sensitivity analysis of the output
//! commit interval (ReViveI/O: throughput overhead below 5% for checkpoint
//! intervals of 20 to 160 ms; response time; space overhead = bandwidth ×
//! interval).
//!
//! A cluster of `--replicas` servers runs as child processes on loopback
//! (one `stamplog server` each, or one `stamplog cluster` with
//! `--servers-as threads`; one server by default), as a service runs apart
//! from its clients: in one process the client's and the server's tasks
//! would share one runtime's workers, and where the scheduler put them
//! moved a run's throughput by half. For each interval T and each of the
//! two phases a stream is created with `commit_interval_ms = T` and
//! durability `sync`, and publishers write to it (`--publishers` in the
//! throughput phase, one in the latency phase), as the seed measured
//! throughput (TPC-C, saturated) and response time (WebStone) apart:
//!
//! 1. **Throughput**: `--messages` payloads as fast as the window allows
//!    (`--window` in flight). Measured in the steady state, so neither the
//!    start nor the final boundary's wait (up to T with nothing left to
//!    send) counts. With T > 0 acks leave in releases at boundaries (a gap
//!    of T/2 or more before an ack starts one): the span runs from the
//!    first release that starts after the warm-up to the last release that
//!    started while the publisher was still sending, and counts the acks
//!    of the releases in between, so it holds whole intervals. With T = 0,
//!    from the ack of the first message after the warm-up to the last ack
//!    that arrived while the publisher was still sending. A saturated closed
//!    loop's latency is only the window over the rate (Little's law), so
//!    this phase reports no latency.
//! 2. **Latency**: `--latency-messages` payloads offered at a fixed rate
//!    (`--rate`, by default a tenth of the first interval's throughput: a
//!    moderate load, as the seed measured response time apart from its
//!    saturated runs), with the same window. Each ack latency runs from the
//!    moment the message is handed to the connection to the moment it is
//!    done by its protocol's ack rule. At a boundary, every ack of the
//!    interval leaves at once (rate × T of them) and the client takes them
//!    one after another, so at higher rates the mean rises by T/2 plus
//!    half that burst's time (docs/results.md).
//!
//! The list of intervals runs `--rounds` times, reversed every other round,
//! so a shared machine's drift hits every interval alike: throughput is the
//! median of the rounds, latency pools every round's messages. The ratio
//! to the first interval is the median of the rounds' own ratios (each
//! round's run of T against the same round's run of the first interval).
//!
//! The space overhead is the seed's bandwidth × T (with the throughput
//! phase's bandwidth): the payload bytes one interval's acks hold back. The
//! experiment also reports the most acks the primary held back at once
//! (waiting for the log or a boundary) in the latency phase, in messages
//! and payload bytes: the `pending_acks_peak` the primary keeps for the
//! latency phase's stream.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use clap::Parser;
use client::{PendingPublish, Protocol, Publisher, PublisherConfig, StreamOptions};
use indicatif::ProgressBar;
use report::plot::{Chart, Series};
use report::stats::Summary;
use report::Table;
use tokio::sync::mpsc;

use crate::output::{self, Output, OutputArgs};
use crate::process::{ClusterOptions, ServersAs};
use crate::progress;
use crate::replication::{binary_or_self, parse_protocol, spawn_cluster, Cluster};
use crate::units::{fixed, format_bytes, parse_bytes};

/// The latency phase's default offered rate, as a share of the first
/// interval's throughput.
const LATENCY_RATE_SHARE: f64 = 0.1;

/// Acks per progress bar update.
const PROGRESS_STEP: usize = 1024;

/// Options of `bench commit-interval`.
#[derive(Parser, Debug, Clone)]
#[command(name = "commit-interval")]
pub struct CommitIntervalArgs {
    /// The stamplog binary to run as the cluster (`<binary> cluster
    /// --servers <replicas>`) [default: this program].
    #[arg(long, value_name = "PATH")]
    pub server_binary: Option<PathBuf>,
    /// Output commit intervals T in milliseconds, comma separated; the
    /// first is the baseline the others are compared with (0: ack at each
    /// group commit).
    #[arg(long, value_delimiter = ',', default_value = "0,5,20,50,100,160")]
    pub intervals: Vec<u32>,
    /// Messages of the throughput phase, per interval: at about 350,000
    /// msgs/s a round lasts about three seconds, since shorter ones spread by
    /// 15 % or more on a shared machine.
    #[arg(long, default_value_t = 1_000_000)]
    pub messages: usize,
    /// Messages of the latency phase, per interval: at the default rate
    /// (about 38,000 msgs/s here) some 1.6 s, ten intervals of 160 ms, so
    /// where the boundaries fall does not decide the mean.
    #[arg(long, default_value_t = 60_000)]
    pub latency_messages: usize,
    /// Messages per second offered in the latency phase [default: a
    /// tenth of the first interval's throughput].
    #[arg(long)]
    pub rate: Option<f64>,
    /// Times the whole list of intervals runs, in order and then reversed
    /// in turn, so the drift of a shared machine hits every interval
    /// alike; throughput is the median of the rounds, latency pools them.
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
    /// Messages at the start of each phase left out of its figures.
    #[arg(long, default_value_t = 5_000)]
    pub warmup: usize,
    /// Payload bytes of each message (units B, KB = 1000, KiB = 1024).
    #[arg(long, value_parser = parse_bytes, default_value = "1KB")]
    pub size: usize,
    /// Messages in flight at most, up to 65,536 (what a server keeps per
    /// session for deduplication). It must hold what arrives in one
    /// interval plus one group commit and the time to take a boundary's
    /// burst of acks (rate × (T + commit time + burst)), or the publisher
    /// stalls on every boundary and throughput drops: at 270,000 msgs/s
    /// one 160 ms interval is 43,000 messages.
    #[arg(long, default_value_t = 65_536)]
    pub window: usize,
    /// Publishers (sessions) of the throughput phase, each with `--window`
    /// in flight and its share of the messages: one session holds at most
    /// 65,536 unanswered messages, fewer than a long interval needs at
    /// full speed (rate × (T + a group commit + the burst of acks)), and
    /// the seed's throughput runs had many clients. The latency phase
    /// uses one.
    #[arg(long, default_value_t = 2)]
    pub publishers: usize,
    /// Servers in the cluster, and replicas of each stream (R).
    #[arg(long, default_value_t = 1)]
    pub replicas: u8,
    /// The streams' replication protocol.
    #[arg(long, value_parser = parse_protocol, default_value = "one-hop-ack-client")]
    pub protocol: Protocol,
    /// Where the servers run: `processes` (each its own `stamplog server`
    /// process, as deployed) or `threads` (one `stamplog cluster`
    /// process, as these figures were measured before).
    #[arg(long, value_enum, default_value_t = ServersAs::Processes)]
    pub servers_as: ServersAs,
    #[command(flatten)]
    pub output: OutputArgs,
}

impl Default for CommitIntervalArgs {
    fn default() -> Self {
        CommitIntervalArgs::parse_from(["commit-interval"])
    }
}

/// The figures of one interval.
#[derive(Clone, Debug)]
pub struct IntervalRow {
    pub interval_ms: u32,
    /// Messages acknowledged in both phases (all that were sent).
    pub messages: usize,
    /// Steady-state messages per second of the throughput phase, the
    /// median of the rounds.
    pub messages_per_second: f64,
    /// Each round's steady-state messages per second, in run order.
    pub round_rates: Vec<f64>,
    /// Payload megabytes (10^6) per second.
    pub megabytes_per_second: f64,
    /// Throughput against the baseline: the median of each round's ratio
    /// to the baseline's run in the same round.
    pub throughput_ratio: f64,
    /// Ack latency of the latency phase's messages after the warm-up, in
    /// milliseconds.
    pub latency_ms: Summary,
    /// Messages per second offered in the latency phase.
    pub offered_rate: f64,
    /// Mean latency minus the baseline's mean, in milliseconds.
    pub mean_increase_ms: f64,
    /// `mean_increase_ms` over T/2 (the expected cost: a message waits half
    /// an interval for its boundary on average); `None` for T = 0.
    pub increase_over_half_interval: Option<f64>,
    /// The seed's space overhead: payload bandwidth × T, in bytes.
    pub held_per_interval_bytes: f64,
    /// Peak acks the primary held back at once in the latency phase
    /// (waiting for the log, the other replicas or a boundary): the most
    /// of any round.
    pub peak_held_acks: usize,
    /// Each round's peak, in run order: one stall of the disk raises one
    /// round's, so the rounds' least says what the interval holds when
    /// nothing stalls.
    pub round_peak_held_acks: Vec<usize>,
    /// `peak_held_acks` × payload bytes.
    pub peak_held_bytes: usize,
    /// Seconds of the steady-state span the throughput is measured over.
    pub span_seconds: f64,
}

/// Everything `bench commit-interval` measured.
#[derive(Clone, Debug)]
pub struct CommitIntervalFigures {
    pub rows: Vec<IntervalRow>,
}

impl CommitIntervalFigures {
    pub fn row(&self, interval_ms: u32) -> Option<&IntervalRow> {
        self.rows.iter().find(|row| row.interval_ms == interval_ms)
    }
}

/// Runs the experiment, prints its table, writes its files.
pub fn run(args: CommitIntervalArgs) -> anyhow::Result<CommitIntervalFigures> {
    ensure!(!args.intervals.is_empty(), "--intervals needs at least one");
    ensure!(
        args.intervals.iter().all(|t| *t <= 10_000),
        "intervals above 10,000 ms are refused by the server"
    );
    ensure!(
        args.messages > args.warmup + 1 && args.latency_messages > args.warmup + 1,
        "--messages and --latency-messages must exceed --warmup by at least 2"
    );
    ensure!(
        args.rate.is_none_or(|rate| rate > 0.0),
        "--rate must be above 0"
    );
    ensure!(args.replicas >= 1, "--replicas must be at least 1");
    ensure!(args.rounds >= 1, "--rounds must be at least 1");
    ensure!(args.window >= 1, "--window must be at least 1");
    ensure!(
        args.publishers >= 1 && args.publishers <= args.messages,
        "--publishers must be at least 1 and at most --messages"
    );
    ensure!(
        args.size <= 1024 * 1024,
        "sizes above 1 MiB exceed the server's message limit"
    );
    let binary = binary_or_self(&args.server_binary)?;
    let data = args.output.data_folder("commit-interval")?;
    let runtime = output::runtime()?;
    let process = spawn_cluster(
        &binary,
        usize::from(args.replicas),
        data.path(),
        ClusterOptions {
            servers_as: args.servers_as,
            ..ClusterOptions::default()
        },
    )?;
    let cluster = runtime.block_on(Cluster::connect(process))?;
    let total =
        ((args.messages + args.latency_messages) * args.intervals.len() * args.rounds) as u64;
    let bar = progress::bar(total, "interval", args.output.quiet);
    let runs = runtime.block_on(measure(&args, &cluster, &bar))?;
    bar.finish_and_clear();
    cluster.stop()?;
    let figures = CommitIntervalFigures {
        rows: rows_of(&runs, &args),
    };
    write_report(&args, &figures)?;
    Ok(figures)
}

/// What one phase observed.
struct Phase {
    /// Submit and ack instants of every message. From one publisher, in
    /// submission order, so `submitted[i]` and `acked[i]` are one
    /// message's (the latency phase has one publisher); merged from
    /// several (`merge`), each list in time order and no longer paired.
    submitted: Vec<Instant>,
    acked: Vec<Instant>,
    /// When the last message was handed to the connection.
    last_submit: Instant,
}

/// What one interval's run observed.
struct Run {
    interval_ms: u32,
    saturated: Phase,
    paced: Phase,
    offered_rate: f64,
    peak_held_acks: usize,
}

async fn measure(
    args: &CommitIntervalArgs,
    cluster: &Cluster,
    bar: &ProgressBar,
) -> anyhow::Result<Vec<Run>> {
    let mut runs: Vec<Run> = Vec::new();
    for round in 0..args.rounds {
        let mut order = args.intervals.clone();
        if round % 2 == 1 {
            order.reverse();
        }
        for interval_ms in order {
            let rate = args.rate.or_else(|| {
                let first = runs.first()?;
                Some(
                    steady_rate(&first.saturated, args.warmup, first.interval_ms).0
                        * LATENCY_RATE_SHARE,
                )
            });
            runs.push(run_interval(cluster, args, interval_ms, rate, bar).await?);
        }
    }
    Ok(runs)
}

async fn run_interval(
    cluster: &Cluster,
    args: &CommitIntervalArgs,
    interval_ms: u32,
    rate: Option<f64>,
    bar: &ProgressBar,
) -> anyhow::Result<Run> {
    bar.set_message(format!("T = {interval_ms} ms, throughput"));
    let name = format!("commit-interval-{interval_ms}");
    let phase = PhaseSpec {
        messages: args.messages,
        publishers: args.publishers,
        rate: None,
    };
    let (saturated, _) = run_phase(cluster, args, &name, interval_ms, phase, bar).await?;
    let offered_rate = rate.unwrap_or_else(|| {
        steady_rate(&saturated, args.warmup, interval_ms).0 * LATENCY_RATE_SHARE
    });
    bar.set_message(format!(
        "T = {interval_ms} ms, latency at {offered_rate:.0} msgs/s"
    ));
    let name = format!("commit-interval-{interval_ms}-latency");
    let phase = PhaseSpec {
        messages: args.latency_messages,
        publishers: 1,
        rate: Some(offered_rate),
    };
    let (paced, peak_held_acks) = run_phase(cluster, args, &name, interval_ms, phase, bar).await?;
    Ok(Run {
        interval_ms,
        saturated,
        paced,
        offered_rate,
        peak_held_acks,
    })
}

/// What one phase sends.
#[derive(Clone, Copy)]
struct PhaseSpec {
    messages: usize,
    /// Sessions sending at once, each its share of the messages.
    publishers: usize,
    /// Messages per second offered in all; `None`: as fast as the window
    /// allows.
    rate: Option<f64>,
}

/// One phase on a stream of its own, created for it and deleted after:
/// what it observed (every publisher's acks in time order), and the most
/// acks the primary held at once.
async fn run_phase(
    cluster: &Cluster,
    args: &CommitIntervalArgs,
    name: &str,
    interval_ms: u32,
    phase: PhaseSpec,
    bar: &ProgressBar,
) -> anyhow::Result<(Phase, usize)> {
    let options = StreamOptions {
        protocol: args.protocol,
        replicas: args.replicas,
        commit_interval_ms: interval_ms,
        ..StreamOptions::new(client::DurabilityConfig::Sync)
    };
    let info = cluster.create_with(name, &options).await?;
    let mut senders = tokio::task::JoinSet::new();
    for index in 0..phase.publishers {
        let publisher = Publisher::connect(
            &info,
            PublisherConfig {
                window: args.window,
                // Acks wait up to T by design: no resend before several
                // intervals have passed.
                retry: Duration::from_millis(5_000 + 4 * u64::from(interval_ms)),
                ..PublisherConfig::default()
            },
        )
        .await
        .with_context(|| format!("cannot connect a publisher to {name}"))?;
        let share = phase.messages / phase.publishers
            + usize::from(index < phase.messages % phase.publishers);
        let rate = phase.rate.map(|rate| rate / phase.publishers as f64);
        let (args, bar) = (args.clone(), bar.clone());
        senders.spawn(async move { stream_messages(&publisher, &args, share, rate, &bar).await });
    }
    let mut phases = Vec::with_capacity(phase.publishers);
    while let Some(sent) = senders.join_next().await {
        phases.push(sent.context("a publisher's task panicked")?);
    }
    let replication = cluster.replication_status(info.primary, name).await?;
    let peak = replication["pending_acks_peak"]
        .as_u64()
        .with_context(|| format!("the status of {name} lacks pending_acks_peak"))?;
    // The run's log is of no further use; deleting it keeps the disk from
    // filling over many runs.
    cluster.delete(&info).await?;
    let phases = phases.into_iter().collect::<anyhow::Result<Vec<_>>>()?;
    Ok((merge(phases), peak as usize))
}

/// Several publishers' phases as one, each list of instants in time order:
/// the lists no longer pair a message's submit with its ack, so only the
/// throughput phase, which reads the acks alone, has several.
fn merge(mut phases: Vec<Phase>) -> Phase {
    if phases.len() == 1 {
        return phases.pop().expect("one");
    }
    let last_submit = phases
        .iter()
        .map(|p| p.last_submit)
        .max()
        .expect("at least one publisher");
    let (mut submitted, mut acked) = (Vec::new(), Vec::new());
    for phase in phases {
        submitted.extend(phase.submitted);
        acked.extend(phase.acked);
    }
    submitted.sort_unstable();
    acked.sort_unstable();
    Phase {
        submitted,
        acked,
        last_submit,
    }
}

/// Publishes `messages` payloads with up to `--window` in flight, as fast
/// as that allows or at `rate` messages per second; returns each message's
/// submit and ack instants and the last submit.
async fn stream_messages(
    publisher: &Publisher,
    args: &CommitIntervalArgs,
    messages: usize,
    rate: Option<f64>,
    bar: &ProgressBar,
) -> anyhow::Result<Phase> {
    let payload: Vec<u8> = (0..args.size).map(|index| (index % 251) as u8).collect();
    // The collector awaits acks in submission order; the channel is bounded
    // so a lagging collector slows the publisher instead of growing a queue.
    let (sender, receiver) = mpsc::channel::<PendingPublish>(args.window * 2);
    let collector = tokio::spawn(collect_acks(receiver, messages, bar.clone()));
    let mut submitted = Vec::with_capacity(messages);
    let started = tokio::time::Instant::now();
    for index in 0..messages {
        if let Some(rate) = rate {
            let due = started + Duration::from_secs_f64(index as f64 / rate);
            if due > tokio::time::Instant::now() {
                tokio::time::sleep_until(due).await;
            }
        }
        let pending = publisher
            .submit(b"", &payload)
            .await
            .context("submit failed")?;
        submitted.push(Instant::now());
        if sender.send(pending).await.is_err() {
            break;
        }
    }
    let last_submit = Instant::now();
    drop(sender);
    let acked = collector.await.context("the ack collector panicked")??;
    ensure!(
        acked.len() == messages,
        "{} of {messages} messages were acknowledged",
        acked.len(),
    );
    Ok(Phase {
        submitted,
        acked,
        last_submit,
    })
}

async fn collect_acks(
    mut receiver: mpsc::Receiver<PendingPublish>,
    messages: usize,
    bar: ProgressBar,
) -> anyhow::Result<Vec<Instant>> {
    let mut acked = Vec::with_capacity(messages);
    while let Some(pending) = receiver.recv().await {
        pending.await.context("a message was not acknowledged")?;
        acked.push(Instant::now());
        // The bar moves in steps: one update per message would add its
        // cost to every measured latency.
        if acked.len() % PROGRESS_STEP == 0 {
            bar.inc(PROGRESS_STEP as u64);
        }
    }
    bar.inc((acked.len() % PROGRESS_STEP) as u64);
    Ok(acked)
}

/// Steady-state messages per second and the span's seconds (the module's
/// notes say which span).
fn steady_rate(run: &Phase, warmup: usize, interval_ms: u32) -> (f64, f64) {
    if interval_ms > 0 {
        // The first ack of each release: the acks before it are T/2 or
        // more older.
        let gap = Duration::from_secs_f64(f64::from(interval_ms) / 2e3);
        let starts: Vec<usize> = (1..run.acked.len())
            .filter(|&index| {
                index >= warmup
                    && run.acked[index] <= run.last_submit
                    && run.acked[index].saturating_duration_since(run.acked[index - 1]) >= gap
            })
            .collect();
        if let (Some(&first), Some(&last)) = (starts.first(), starts.last()) {
            let span = run.acked[last]
                .saturating_duration_since(run.acked[first])
                .as_secs_f64();
            if last > first && span > 0.0 {
                return ((last - first) as f64 / span, span);
            }
        }
    }
    let first = warmup.min(run.acked.len() - 1);
    let last = run
        .acked
        .iter()
        .rposition(|at| *at <= run.last_submit)
        .filter(|last| *last > first)
        .unwrap_or(run.acked.len() - 1);
    let span = run.acked[last]
        .saturating_duration_since(run.acked[first])
        .as_secs_f64();
    if last <= first || span <= 0.0 {
        let whole = run
            .acked
            .last()
            .expect("acked")
            .saturating_duration_since(run.submitted[0])
            .as_secs_f64();
        return (run.acked.len() as f64 / whole.max(1e-9), whole);
    }
    ((last - first) as f64 / span, span)
}

/// One interval's runs over every round, pooled.
struct Pooled {
    interval_ms: u32,
    rates: Vec<f64>,
    median_rate: f64,
    span_seconds: f64,
    latency: Summary,
    offered_rate: f64,
    messages: usize,
    peak_held_acks: Vec<usize>,
}

fn pool(interval_ms: u32, runs: &[&Run], warmup: usize) -> Pooled {
    let measured: Vec<(f64, f64)> = runs
        .iter()
        .map(|run| steady_rate(&run.saturated, warmup, run.interval_ms))
        .collect();
    let rates: Vec<f64> = measured.iter().map(|(rate, _)| *rate).collect();
    let median_rate = report::stats::lower_median(&rates);
    let latencies: Vec<f64> = runs
        .iter()
        .flat_map(|run| {
            let paced = &run.paced;
            paced.submitted.iter().zip(&paced.acked).skip(warmup)
        })
        .map(|(sent, acked)| acked.saturating_duration_since(*sent).as_secs_f64() * 1e3)
        .collect();
    Pooled {
        interval_ms,
        rates,
        median_rate,
        span_seconds: measured.iter().map(|(_, span)| span).sum(),
        latency: Summary::of(&latencies),
        offered_rate: runs[0].offered_rate,
        messages: runs
            .iter()
            .map(|run| run.saturated.acked.len() + run.paced.acked.len())
            .sum(),
        peak_held_acks: runs.iter().map(|run| run.peak_held_acks).collect(),
    }
}

fn rows_of(runs: &[Run], args: &CommitIntervalArgs) -> Vec<IntervalRow> {
    let mut intervals: Vec<u32> = Vec::new();
    for run in runs {
        if !intervals.contains(&run.interval_ms) {
            intervals.push(run.interval_ms);
        }
    }
    let pooled: Vec<Pooled> = intervals
        .iter()
        .map(|&interval_ms| {
            let of_interval: Vec<&Run> = runs
                .iter()
                .filter(|run| run.interval_ms == interval_ms)
                .collect();
            pool(interval_ms, &of_interval, args.warmup)
        })
        .collect();
    let base = &pooled[0];
    pooled
        .iter()
        .map(|pooled| {
            let rate = pooled.median_rate;
            let half = f64::from(pooled.interval_ms) / 2.0;
            let increase = pooled.latency.mean - base.latency.mean;
            let bandwidth = rate * args.size as f64;
            let peak = pooled.peak_held_acks.iter().copied().max().unwrap_or(0);
            IntervalRow {
                interval_ms: pooled.interval_ms,
                messages: pooled.messages,
                messages_per_second: rate,
                round_rates: pooled.rates.clone(),
                megabytes_per_second: bandwidth / 1e6,
                throughput_ratio: paired_ratio(&pooled.rates, &base.rates),
                latency_ms: pooled.latency,
                offered_rate: pooled.offered_rate,
                mean_increase_ms: increase,
                increase_over_half_interval: (pooled.interval_ms > 0).then(|| increase / half),
                held_per_interval_bytes: bandwidth * f64::from(pooled.interval_ms) / 1e3,
                peak_held_acks: peak,
                round_peak_held_acks: pooled.peak_held_acks.clone(),
                peak_held_bytes: peak * args.size,
                span_seconds: pooled.span_seconds,
            }
        })
        .collect()
}

/// The median of each round's ratio of `rates` to the first interval's
/// rate in the same round (the lower median for an even count): whole
/// rounds move with a shared machine's drift, and the ratio cancels it.
fn paired_ratio(rates: &[f64], base: &[f64]) -> f64 {
    let ratios: Vec<f64> = rates
        .iter()
        .zip(base)
        .map(|(rate, base)| rate / base)
        .collect();
    report::stats::lower_median(&ratios)
}

/// The seed's sensitivity table: one row per interval.
pub fn table(figures: &CommitIntervalFigures, args: &CommitIntervalArgs) -> Table {
    let offered = figures.rows.first().map_or(0.0, |row| row.offered_rate);
    let title = format!(
        "Output commit interval: {} of {} per interval and round for throughput (median of {} rounds), {} at {} msgs/s for latency; R = {}, {}, window {}, durability sync",
        args.messages,
        format_bytes(args.size),
        args.rounds,
        args.latency_messages,
        fixed(offered, 0),
        args.replicas,
        args.protocol.name(),
        args.window
    );
    let mut table = Table::new(
        title,
        &[
            "T ms",
            "msgs/s",
            "rounds' msgs/s",
            "vs first",
            "MB/s",
            "p50 ms",
            "p99 ms",
            "mean ms",
            "mean increase ms",
            "T/2 ms",
            "increase / (T/2)",
            "held per interval (bandwidth × T)",
            "peak held acks (latency phase)",
            "peak held bytes",
        ],
    );
    for row in &figures.rows {
        table.row(vec![
            row.interval_ms.to_string(),
            fixed(row.messages_per_second, 0),
            row.round_rates
                .iter()
                .map(|rate| fixed(*rate, 0))
                .collect::<Vec<_>>()
                .join(" "),
            fixed(row.throughput_ratio, 3),
            fixed(row.megabytes_per_second, 1),
            fixed(row.latency_ms.p50, 2),
            fixed(row.latency_ms.p99, 2),
            fixed(row.latency_ms.mean, 2),
            fixed(row.mean_increase_ms, 2),
            fixed(f64::from(row.interval_ms) / 2.0, 1),
            row.increase_over_half_interval
                .map_or_else(|| "-".to_string(), |ratio| fixed(ratio, 2)),
            megabytes(row.held_per_interval_bytes),
            row.peak_held_acks.to_string(),
            megabytes(row.peak_held_bytes as f64),
        ]);
    }
    table
}

fn megabytes(bytes: f64) -> String {
    format!("{} MB", fixed(bytes / 1e6, 2))
}

fn write_report(args: &CommitIntervalArgs, figures: &CommitIntervalFigures) -> anyhow::Result<()> {
    let table = table(figures, args);
    print!("{}", table.render());
    let mut output = Output::new(args.output.out_folder("commit-interval"))?;
    output.csv("commit-interval", &table)?;
    output.png("commit-interval-throughput", &throughput_chart(figures))?;
    output.png("commit-interval-latency", &latency_chart(figures))?;
    let json = serde_json::json!({
        "experiment": "commit-interval",
        "messages": args.messages,
        "latency_messages": args.latency_messages,
        "warmup": args.warmup,
        "rounds": args.rounds,
        "size_bytes": args.size,
        "window": args.window,
        "replicas": args.replicas,
        "protocol": args.protocol.name(),
        "table": table.to_json(),
        "rows": figures.rows.iter().map(row_json).collect::<Vec<_>>(),
    });
    output.json(args.output.json.as_deref(), &json)?;
    output.announce();
    Ok(())
}

fn row_json(row: &IntervalRow) -> serde_json::Value {
    serde_json::json!({
        "interval_ms": row.interval_ms,
        "messages": row.messages,
        "messages_per_second": row.messages_per_second,
        "round_messages_per_second": row.round_rates,
        "megabytes_per_second": row.megabytes_per_second,
        "throughput_ratio": row.throughput_ratio,
        "ack_latency_ms": row.latency_ms.to_json(),
        "offered_rate": row.offered_rate,
        "mean_increase_ms": row.mean_increase_ms,
        "increase_over_half_interval": row.increase_over_half_interval,
        "held_per_interval_bytes": row.held_per_interval_bytes,
        "peak_held_acks": row.peak_held_acks,
        "round_peak_held_acks": row.round_peak_held_acks,
        "peak_held_bytes": row.peak_held_bytes,
        "span_seconds": row.span_seconds,
    })
}

/// Messages/s against T, with the 5% band of the seed's target.
fn throughput_chart(figures: &CommitIntervalFigures) -> Chart {
    let mut chart = Chart::lines(
        "Throughput against the output commit interval",
        "interval T (ms)",
        "messages/s",
    );
    let points = |pick: &dyn Fn(&IntervalRow) -> f64| {
        let rows = figures.rows.iter();
        rows.map(|row| (f64::from(row.interval_ms), pick(row)))
            .collect()
    };
    chart.add(Series::new(
        "measured",
        points(&|row| row.messages_per_second),
    ));
    let base = figures.rows[0].messages_per_second;
    chart.add(Series::new(
        "95% of the first interval's",
        points(&|_| base * 0.95),
    ));
    chart
}

/// Ack latency against T, with the expectation: the first interval's mean
/// plus T/2.
fn latency_chart(figures: &CommitIntervalFigures) -> Chart {
    let mut chart = Chart::lines(
        "Ack latency against the output commit interval",
        "interval T (ms)",
        "ack latency (ms)",
    );
    let points = |pick: &dyn Fn(&IntervalRow) -> f64| {
        let rows = figures.rows.iter();
        rows.map(|row| (f64::from(row.interval_ms), pick(row)))
            .collect()
    };
    chart.add(Series::new("p50", points(&|row| row.latency_ms.p50)));
    chart.add(Series::new("p99", points(&|row| row.latency_ms.p99)));
    chart.add(Series::new("mean", points(&|row| row.latency_ms.mean)));
    let base = figures.rows[0].latency_ms.mean;
    chart.add(Series::new(
        "first mean + T/2",
        points(&|row| base + f64::from(row.interval_ms) / 2.0),
    ));
    chart
}
