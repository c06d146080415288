//! `stamplog demo`: the whole promise in one run. A local server in a
//! temporary folder takes a workload; midway it is killed with SIGKILL and
//! started again on the same port; the client reconnects and resends what
//! was not acknowledged; then everything is read back and checked.

use std::time::{Duration, Instant};

use anyhow::Context;
use client::{Client, ClientConfig, DurabilityConfig};
use indicatif::{ProgressBar, ProgressStyle};

use bench::process::ServerProcess;

#[derive(clap::Args, Debug)]
pub struct DemoArgs {
    /// Messages to send.
    #[arg(long, default_value_t = 50_000)]
    pub messages: u64,
    /// Payload bytes per message.
    #[arg(long, default_value_t = 1024)]
    pub size: usize,
    /// Messages in flight.
    #[arg(long, default_value_t = 256)]
    pub window: usize,
    /// How many times to kill the server with SIGKILL (and start it again
    /// on the same port and data), spread evenly over the run; 0 for none.
    #[arg(long, default_value_t = 1)]
    pub kills: u32,
    /// Keep the run's files in this folder (it must be empty or absent):
    /// the server's data in `DIR/server`, its stderr in `DIR/server-N.log`.
    /// Without it, a temporary folder is used and removed.
    #[arg(long)]
    pub data: Option<std::path::PathBuf>,
    /// Write the client's history (every message sent, every ack) to this
    /// file, for `stamplog check`.
    #[arg(long)]
    pub history: Option<std::path::PathBuf>,
    /// Hide the progress bar.
    #[arg(long)]
    pub quiet: bool,
}

/// What the demo measured and checked.
#[derive(Debug, Default)]
pub struct DemoOutcome {
    pub sent: u64,
    pub acknowledged: u64,
    pub duplicate_answers: u64,
    /// The history checker's verdict on the client's history and the log.
    pub report: checker::Report,
    pub seconds: f64,
    pub latencies_us: Vec<f64>,
    pub restarts: u32,
}

pub fn run(args: DemoArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.messages > 0, "--messages must be at least 1");
    anyhow::ensure!(
        args.size >= 8,
        "--size must be at least 8 bytes (the message number)"
    );
    anyhow::ensure!(
        u64::from(args.kills) < args.messages,
        "--kills must be below --messages"
    );
    let temporary;
    let data = match &args.data {
        Some(folder) => {
            let empty =
                std::fs::read_dir(folder).map_or(true, |mut entries| entries.next().is_none());
            anyhow::ensure!(empty, "--data {} must be empty or absent", folder.display());
            std::fs::create_dir_all(folder)
                .with_context(|| format!("creating {}", folder.display()))?;
            folder.clone()
        }
        None => {
            temporary = tempfile::Builder::new()
                .prefix("stamplog-demo-")
                .tempdir_in(std::env::temp_dir())?;
            temporary.path().to_path_buf()
        }
    };
    let data = data.as_path();
    let server = start_server(data, "127.0.0.1:0", 1)?;
    println!(
        "server started: pid {}, {} (data in {})",
        server.id(),
        server.address,
        data.display()
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let outcome = runtime.block_on(drive(&args, server, data))?;
    print_outcome(&args, &outcome);
    anyhow::ensure!(
        outcome.report.is_clean(),
        "the history checker found violations:\n{}",
        outcome.report
    );
    Ok(())
}

async fn drive(
    args: &DemoArgs,
    server: ServerProcess,
    data: &std::path::Path,
) -> anyhow::Result<DemoOutcome> {
    let address = server.address;
    let mut config = ClientConfig::new(address.to_string());
    config.window = args.window;
    let client = Client::connect(config).await?;
    let stream = client.create_stream("demo", DurabilityConfig::Sync).await?;
    let progress = progress_bar(args.messages, args.quiet);
    let (acks, mut answers) = tokio::sync::mpsc::channel(args.window * 2);
    let mut producer = client.producer(stream.id);
    let (messages, size, client_id) = (args.messages, args.size, client.client_id());
    let sender = tokio::spawn(async move {
        for index in 0..messages {
            let mut payload = vec![(index % 251) as u8; size];
            payload[..8].copy_from_slice(&index.to_le_bytes());
            let sent = checker::Sent {
                event: checker::EventId {
                    client: client_id,
                    session: producer.session(),
                    sequence: producer.next_sequence(),
                },
                digest: checker::digest(b"", &payload),
            };
            let pending = producer.submit(b"", &payload).await?;
            if acks.send((sent, Instant::now(), pending)).await.is_err() {
                break;
            }
        }
        anyhow::Ok(())
    });
    let started = Instant::now();
    // Kill number k (from 1) comes after k / (kills + 1) of the messages.
    let kill_points: Vec<u64> = (1..=u64::from(args.kills))
        .map(|k| args.messages * k / (u64::from(args.kills) + 1))
        .collect();
    let mut server = Some(server);
    let mut outcome = DemoOutcome::default();
    let mut history = checker::ClientHistory::default();
    while let Some((sent, submitted, pending)) = answers.recv().await {
        history.sent.push(sent);
        let ack = pending
            .await
            .with_context(|| format!("message {}", sent.event.sequence))?;
        history.acked.push(checker::Acked {
            event: sent.event,
            version: ack.version,
            duplicate: ack.duplicate,
        });
        outcome
            .latencies_us
            .push(submitted.elapsed().as_secs_f64() * 1e6);
        outcome.duplicate_answers += u64::from(ack.duplicate);
        outcome.acknowledged += 1;
        progress.inc(1);
        if kill_points.contains(&outcome.acknowledged) {
            if let Some(running) = server.take() {
                progress.suspend(|| {
                    println!(
                        "killing the server (SIGKILL) after {} acknowledgements",
                        outcome.acknowledged
                    )
                });
                running.kill()?;
                let data = data.to_path_buf();
                let listen = address.to_string();
                let start = outcome.restarts + 2;
                let restarted =
                    tokio::task::spawn_blocking(move || start_server(&data, &listen, start))
                        .await??;
                progress.suspend(|| {
                    println!(
                        "server restarted: pid {}, {}",
                        restarted.id(),
                        restarted.address
                    )
                });
                outcome.restarts += 1;
                server = Some(restarted);
            }
        }
    }
    sender.await??;
    outcome.seconds = started.elapsed().as_secs_f64();
    outcome.sent = args.messages;
    progress.finish_and_clear();
    outcome.report = check(&client, stream.id, &history).await?;
    if let Some(path) = &args.history {
        std::fs::write(path, history.to_lines())
            .with_context(|| format!("writing the history to {}", path.display()))?;
    }
    drop(server);
    Ok(outcome)
}

/// Starts `stamplog server` from this very binary, its stderr going to a
/// file in the data folder (one per start).
fn start_server(data: &std::path::Path, listen: &str, start: u32) -> anyhow::Result<ServerProcess> {
    let binary = std::env::current_exe().context("finding the stamplog binary")?;
    let log = data.join(format!("server-{start}.log"));
    ServerProcess::spawn(&binary, &data.join("server"), listen, &log)
}

/// Reads the whole committed stream back and hands it, with the client's
/// history, to the history checker.
async fn check(
    client: &Client,
    stream: u64,
    history: &checker::ClientHistory,
) -> anyhow::Result<checker::Report> {
    let committed = client.open_stream("demo").await?.committed_version;
    let mut log = checker::ReplicaLog {
        replica: "server".into(),
        records: Vec::with_capacity(committed as usize),
    };
    let mut subscription = client.subscribe(stream, 1).await?;
    while log.records.last().map_or(0, |r| r.version) < committed {
        let record = tokio::time::timeout(Duration::from_secs(30), subscription.next())
            .await
            .context("reading back timed out")?
            .context("the subscription ended early")??;
        log.records.push(checker::Logged {
            version: record.version,
            event: record.event,
            digest: checker::digest(&record.key, &record.payload),
        });
    }
    Ok(checker::check(
        std::slice::from_ref(history),
        std::slice::from_ref(&log),
        Some(committed),
    ))
}

fn progress_bar(total: u64, quiet: bool) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} sending [{bar:40}] {pos}/{len} {per_sec} eta {eta}",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    bar
}

fn print_outcome(args: &DemoArgs, outcome: &DemoOutcome) {
    let report = &outcome.report;
    let summary = report::stats::Summary::of(&outcome.latencies_us);
    let rate = outcome.acknowledged as f64 / outcome.seconds;
    let mut table = report::Table::new(
        format!(
            "stamplog demo: one server, durability sync, {} SIGKILL and restart(s)",
            outcome.restarts
        ),
        &["figure", "value"],
    );
    let rows = [
        ("messages sent", outcome.sent.to_string()),
        ("messages acknowledged", outcome.acknowledged.to_string()),
        ("payload bytes", args.size.to_string()),
        ("in flight (window)", args.window.to_string()),
        ("server kills and restarts", outcome.restarts.to_string()),
        ("seconds", format!("{:.2}", outcome.seconds)),
        ("messages/s", format!("{rate:.0}")),
        ("MB/s", format!("{:.1}", rate * args.size as f64 / 1e6)),
        ("ack latency p50 (µs)", format!("{:.0}", summary.p50)),
        ("ack latency p90 (µs)", format!("{:.0}", summary.p90)),
        ("ack latency p99 (µs)", format!("{:.0}", summary.p99)),
        ("ack latency max (µs)", format!("{:.0}", summary.max)),
        (
            "answers flagged duplicate (resent after the kill)",
            outcome.duplicate_answers.to_string(),
        ),
        (
            "messages in the log checked",
            report.logged_versions.to_string(),
        ),
        ("lost acknowledged messages", report.lost.to_string()),
        (
            "duplicated messages in the log",
            report.duplicated.to_string(),
        ),
        (
            "versions holding two messages",
            report.conflicting_versions.to_string(),
        ),
        (
            "acks whose version holds another message",
            report.misplaced_acks.to_string(),
        ),
        ("gaps in versions", report.gaps.to_string()),
        ("records out of order", report.reordered.to_string()),
        ("records nobody sent", report.unknown_events.to_string()),
    ];
    for (name, value) in rows {
        table.row(vec![name.to_string(), value]);
    }
    table.print();
}
