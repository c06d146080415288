//! `bench memory`: the server's memory stays bounded under load (F16).
//!
//! The stamplog server runs as a child process (`<binary> server --listen
//! 127.0.0.1:0 --data DIR`). A writer streams messages into a `sync` stream
//! with a window of 256 while a slow reader, which sleeps now and then,
//! follows the stream through a subscription. Every 100 ms the experiment
//! reads the child's resident memory and peak (VmRSS, VmHWM) and how far
//! the reader lags behind the acknowledged messages. A server that queued
//! records for the slow reader without bound would show it here.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use clap::Parser;
use client::{Client, ClientConfig, DurabilityConfig, PendingAck, Subscription};
use indicatif::ProgressBar;
use report::plot::{Chart, Series};
use report::Table;
use tokio::sync::mpsc;

use crate::output::{self, Output, OutputArgs};
use crate::process::{memory_usage, ServerProcess};
use crate::progress;
use crate::units::{fixed, format_bytes, parse_bytes};

/// Options of `bench memory`.
#[derive(Parser, Debug, Clone)]
#[command(name = "memory")]
pub struct MemoryArgs {
    /// The stamplog binary to run as the server [default: this program].
    #[arg(long, value_name = "PATH")]
    pub server_binary: Option<PathBuf>,
    /// Messages the writer sends.
    #[arg(long, default_value_t = 1_000_000)]
    pub messages: u64,
    /// Payload bytes of each message (units B, KB, KiB, MB, MiB).
    #[arg(long, value_parser = parse_bytes, default_value = "1KiB")]
    pub size: usize,
    /// Messages the writer keeps in flight.
    #[arg(long, default_value_t = 256)]
    pub window: usize,
    /// The slow reader sleeps this many milliseconds...
    #[arg(long, default_value_t = 1)]
    pub reader_pause_ms: u64,
    /// ...every this many records (0: it never sleeps).
    #[arg(long, default_value_t = 100)]
    pub reader_pause_every: u64,
    /// Milliseconds between two samples of the server's memory.
    #[arg(long, default_value_t = 100)]
    pub sample_interval_ms: u64,
    #[command(flatten)]
    pub output: OutputArgs,
}

impl Default for MemoryArgs {
    fn default() -> Self {
        MemoryArgs::parse_from(["memory"])
    }
}

/// One sample of the server's memory and of the reader's lag.
#[derive(Clone, Copy, Debug, Default)]
pub struct MemorySample {
    /// Since the writer started.
    pub seconds: f64,
    pub resident_kib: u64,
    pub peak_kib: u64,
    /// Messages acknowledged to the writer so far.
    pub acknowledged: u64,
    /// Records the reader has taken so far.
    pub read: u64,
}

impl MemorySample {
    /// Acknowledged messages the reader has not read yet.
    pub fn lag(&self) -> u64 {
        self.acknowledged.saturating_sub(self.read)
    }
}

/// Everything `bench memory` measured.
#[derive(Clone, Debug)]
pub struct MemoryFigures {
    pub messages: u64,
    pub seconds: f64,
    pub messages_per_second: f64,
    pub megabytes_per_second: f64,
    /// Resident memory before the first message.
    pub start_resident_kib: u64,
    /// The most the server ever held resident (VmHWM at the end).
    pub peak_kib: u64,
    /// Resident memory once every message was acknowledged.
    pub final_resident_kib: u64,
    /// The largest lag of the reader seen in any sample, in records.
    pub lag_max: u64,
    /// The reader's lag when the writer finished.
    pub lag_at_end: u64,
    /// Records the reader had read when the writer finished.
    pub read_at_end: u64,
    pub samples: Vec<MemorySample>,
}

/// Progress shared by the writer, the reader and the sampler.
#[derive(Default)]
struct Counters {
    acknowledged: AtomicU64,
    read: AtomicU64,
}

/// Runs the experiment, prints its table, writes its files.
pub fn run(args: MemoryArgs) -> anyhow::Result<MemoryFigures> {
    ensure!(args.messages > 0, "--messages must be at least 1");
    ensure!(
        args.size <= 1024 * 1024,
        "--size above 1 MiB exceeds the server's message limit"
    );
    let binary = match &args.server_binary {
        Some(path) => path.clone(),
        None => std::env::current_exe().context("cannot find this program's path")?,
    };
    let data = args.output.data_folder("memory")?;
    let server = ServerProcess::spawn(
        &binary,
        &data.path().join("server"),
        "127.0.0.1:0",
        &data.path().join("server-stderr.log"),
    )?;
    let runtime = output::runtime()?;
    let bar = progress::bar(args.messages, "memory", args.output.quiet);
    let counters = Arc::new(Counters::default());
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let sampler = spawn_sampler(server.id(), &args, &counters, &stop, started)?;
    let outcome = runtime.block_on(stream_through(&args, server.address, &counters, &bar));
    stop.store(true, Ordering::Relaxed);
    let samples = sampler
        .join()
        .map_err(|_| anyhow::anyhow!("the memory sampler panicked"))?;
    bar.finish_and_clear();
    let elapsed = outcome?;
    server.kill()?;
    drop(runtime);
    let figures = figures_of(&args, elapsed, samples?)?;
    write_report(&args, &figures)?;
    Ok(figures)
}

/// Samples the server's memory every `--sample-interval-ms` until `stop`,
/// then once more, so the last sample is taken after the writer finished.
fn spawn_sampler(
    pid: u32,
    args: &MemoryArgs,
    counters: &Arc<Counters>,
    stop: &Arc<AtomicBool>,
    started: Instant,
) -> anyhow::Result<JoinHandle<anyhow::Result<Vec<MemorySample>>>> {
    let interval = Duration::from_millis(args.sample_interval_ms.max(1));
    let (counters, stop) = (Arc::clone(counters), Arc::clone(stop));
    let sampler = move || {
        let mut samples = Vec::new();
        loop {
            let finished = stop.load(Ordering::Relaxed);
            let usage = memory_usage(pid)?;
            samples.push(MemorySample {
                seconds: started.elapsed().as_secs_f64(),
                resident_kib: usage.resident_kib,
                peak_kib: usage.peak_kib,
                acknowledged: counters.acknowledged.load(Ordering::Relaxed),
                read: counters.read.load(Ordering::Relaxed),
            });
            if finished {
                return Ok(samples);
            }
            std::thread::sleep(interval);
        }
    };
    std::thread::Builder::new()
        .name("memory-sampler".into())
        .spawn(sampler)
        .context("cannot start the memory sampler")
}

/// Creates the stream, attaches the slow reader, and streams every message;
/// returns the time from the first submit to the last acknowledgement.
async fn stream_through(
    args: &MemoryArgs,
    address: std::net::SocketAddr,
    counters: &Arc<Counters>,
    bar: &ProgressBar,
) -> anyhow::Result<Duration> {
    let mut config = ClientConfig::new(address.to_string());
    config.window = args.window.max(1);
    let writer = Client::connect(config)
        .await
        .context("cannot connect the writer")?;
    let info = writer
        .create_stream("memory", DurabilityConfig::Sync)
        .await
        .context("cannot create the stream")?;
    let reader_client = Client::connect(ClientConfig::new(address.to_string()))
        .await
        .context("cannot connect the reader")?;
    let subscription = reader_client
        .subscribe(info.id, 1)
        .await
        .context("cannot subscribe")?;
    let reader = tokio::spawn(slow_reader(
        subscription,
        args.clone(),
        Arc::clone(counters),
    ));
    let (sender, receiver) = mpsc::channel::<PendingAck>(args.window.max(1) * 2);
    let collector = tokio::spawn(count_acks(receiver, Arc::clone(counters), bar.clone()));
    let mut producer = writer.producer(info.id);
    let payload: Vec<u8> = (0..args.size).map(|index| (index % 239) as u8).collect();
    let started = Instant::now();
    for _ in 0..args.messages {
        let pending = producer
            .submit(b"", &payload)
            .await
            .context("submit failed")?;
        if sender.send(pending).await.is_err() {
            break;
        }
    }
    drop(sender);
    collector.await.context("the ack counter panicked")??;
    let elapsed = started.elapsed();
    // The reader is not waited for: how far behind it is now is the point.
    if reader.is_finished() {
        reader.await.context("the reader panicked")??;
    } else {
        reader.abort();
    }
    Ok(elapsed)
}

async fn count_acks(
    mut receiver: mpsc::Receiver<PendingAck>,
    counters: Arc<Counters>,
    bar: ProgressBar,
) -> anyhow::Result<()> {
    while let Some(pending) = receiver.recv().await {
        pending.await.context("a message was not acknowledged")?;
        counters.acknowledged.fetch_add(1, Ordering::Relaxed);
        bar.inc(1);
    }
    Ok(())
}

async fn slow_reader(
    mut subscription: Subscription,
    args: MemoryArgs,
    counters: Arc<Counters>,
) -> anyhow::Result<()> {
    let pause = Duration::from_millis(args.reader_pause_ms);
    let mut read = 0u64;
    while read < args.messages {
        let Some(record) = subscription.next().await else {
            break;
        };
        record.context("the subscription failed")?;
        read += 1;
        counters.read.store(read, Ordering::Relaxed);
        if args.reader_pause_every > 0 && read.is_multiple_of(args.reader_pause_every) {
            tokio::time::sleep(pause).await;
        }
    }
    Ok(())
}

fn figures_of(
    args: &MemoryArgs,
    elapsed: Duration,
    samples: Vec<MemorySample>,
) -> anyhow::Result<MemoryFigures> {
    let first = *samples.first().context("no memory sample was taken")?;
    let last = *samples.last().context("no memory sample was taken")?;
    let seconds = elapsed.as_secs_f64();
    Ok(MemoryFigures {
        messages: last.acknowledged,
        seconds,
        messages_per_second: last.acknowledged as f64 / seconds,
        megabytes_per_second: (last.acknowledged as f64 * args.size as f64) / seconds / 1e6,
        start_resident_kib: first.resident_kib,
        peak_kib: samples.iter().map(|s| s.peak_kib).max().unwrap_or(0),
        final_resident_kib: last.resident_kib,
        lag_max: samples.iter().map(MemorySample::lag).max().unwrap_or(0),
        lag_at_end: last.lag(),
        read_at_end: last.read,
        samples,
    })
}

fn mebibytes(kib: u64) -> String {
    fixed(kib as f64 / 1024.0, 1)
}

/// One row: the run's memory, rate and lag.
pub fn table(figures: &MemoryFigures, args: &MemoryArgs) -> Table {
    let title = format!(
        "Server memory: {} messages of {} (sync, window {}), reader pausing {} ms every {} records",
        figures.messages,
        format_bytes(args.size),
        args.window,
        args.reader_pause_ms,
        args.reader_pause_every
    );
    let mut table = Table::new(
        title,
        &[
            "messages",
            "seconds",
            "msgs/s",
            "MB/s",
            "start RSS MiB",
            "peak RSS MiB",
            "final RSS MiB",
            "reader lag max",
            "reader lag at end",
            "read at end",
        ],
    );
    table.row(vec![
        figures.messages.to_string(),
        fixed(figures.seconds, 2),
        fixed(figures.messages_per_second, 0),
        fixed(figures.megabytes_per_second, 2),
        mebibytes(figures.start_resident_kib),
        mebibytes(figures.peak_kib),
        mebibytes(figures.final_resident_kib),
        figures.lag_max.to_string(),
        figures.lag_at_end.to_string(),
        figures.read_at_end.to_string(),
    ]);
    table
}

fn write_report(args: &MemoryArgs, figures: &MemoryFigures) -> anyhow::Result<()> {
    let table = table(figures, args);
    print!("{}", table.render());
    let mut output = Output::new(args.output.out_folder("memory"))?;
    output.csv("memory", &table)?;
    output.png("memory", &resident_chart(figures))?;
    output.png("memory-lag", &lag_chart(figures))?;
    let samples: Vec<serde_json::Value> = figures
        .samples
        .iter()
        .map(|s| {
            serde_json::json!({
                "seconds": s.seconds, "resident_kib": s.resident_kib, "peak_kib": s.peak_kib,
                "acknowledged": s.acknowledged, "read": s.read,
            })
        })
        .collect();
    let json = serde_json::json!({
        "experiment": "memory",
        "size_bytes": args.size,
        "window": args.window,
        "table": table.to_json(),
        "samples": samples,
    });
    output.json(args.output.json.as_deref(), &json)?;
    output.announce();
    Ok(())
}

fn resident_chart(figures: &MemoryFigures) -> Chart {
    let mut chart = Chart::lines("Server resident memory", "seconds", "MiB");
    let points = |pick: fn(&MemorySample) -> u64| {
        let samples = figures.samples.iter();
        samples
            .map(|s| (s.seconds, pick(s) as f64 / 1024.0))
            .collect()
    };
    chart.add(Series::new("RSS", points(|s| s.resident_kib)));
    chart.add(Series::new("peak RSS", points(|s| s.peak_kib)));
    chart
}

fn lag_chart(figures: &MemoryFigures) -> Chart {
    let mut chart = Chart::lines("Slow reader", "seconds", "records");
    let points = |pick: fn(&MemorySample) -> u64| {
        let samples = figures.samples.iter();
        samples.map(|s| (s.seconds, pick(s) as f64)).collect()
    };
    chart.add(Series::new("acknowledged", points(|s| s.acknowledged)));
    chart.add(Series::new("read", points(|s| s.read)));
    chart.add(Series::new("lag", points(MemorySample::lag)));
    chart
}
