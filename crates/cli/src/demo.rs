//! `stamplog demo`: the whole promise in one run. A local cluster of three
//! server processes in a temporary folder takes a workload on a stream
//! replicated to all three with the default protocol (`one-hop-ack-client`);
//! midway a server (the primary first) is killed with SIGKILL: the control
//! plane removes it from the view, a replica holding every acknowledged
//! version becomes primary in a new epoch, and the client resends what was
//! not acknowledged there. The killed server is started again on its port
//! and rejoins as a new member; then every replica is read back and the
//! history checker judges them.

use std::time::{Duration, Instant};

use anyhow::Context;
use client::{Client, DurabilityConfig, Protocol, Publisher};
use indicatif::{ProgressBar, ProgressStyle};

use bench::failover::{placement, read_back};
use bench::process::ProcessCluster;

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
    /// How many times to kill a server with SIGKILL (and start it again on
    /// the same port and data), spread evenly over the run, the primary
    /// first and then the others in turn; 0 for none.
    #[arg(long, default_value_t = 1)]
    pub kills: u32,
    /// Servers in the cluster (the stream is replicated to 3 of them, or to
    /// all when fewer).
    #[arg(long, default_value_t = 3)]
    pub servers: u32,
    /// Keep the run's files in this folder (it must be empty or absent):
    /// server N's data in `DIR/server-N`, its stderr in
    /// `DIR/server-N-start-K.log`.
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
    /// Run the servers without TLS and tokens. By default the demo makes a
    /// CA, server certificates and an admin token in its folder
    /// (`security/`) and every link is TLS.
    #[arg(long)]
    pub insecure: bool,
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
    anyhow::ensure!(
        (1..=9).contains(&args.servers),
        "--servers must be between 1 and 9"
    );
    let binary = std::env::current_exe().context("finding the stamplog binary")?;
    let security = if args.insecure {
        None
    } else {
        Some(server::LocalSecurity::make(data, args.servers as usize)?)
    };
    let cluster =
        ProcessCluster::start_secure(&binary, data, args.servers, &[], (None, security.clone()))?;
    match &security {
        Some(security) => println!(
            "TLS on every link, tokens required: a client connects with --ca {} --token $(cat {})",
            security.ca.display(),
            security.folder.join("admin.token").display()
        ),
        None => println!("insecure: plain TCP, no tokens"),
    }
    for id in 1..=args.servers {
        println!(
            "server {id} started: pid {}, {} (data in {})",
            cluster.pid(id),
            cluster.address(id),
            data.join(format!("server-{id}")).display()
        );
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let outcome = runtime.block_on(drive(&args, cluster))?;
    print_outcome(&args, &outcome);
    anyhow::ensure!(
        outcome.report.is_clean(),
        "the history checker found violations:\n{}",
        outcome.report
    );
    Ok(())
}

async fn drive(args: &DemoArgs, mut cluster: ProcessCluster) -> anyhow::Result<DemoOutcome> {
    // The servers form the cluster (elect a control-plane leader, join)
    // within a few seconds of starting.
    let deadline = Instant::now() + Duration::from_secs(30);
    let admin = cluster.client_config(1)?;
    let stream = loop {
        let attempt = async {
            let client = Client::connect(admin.clone()).await?;
            client
                .create_stream_with(
                    "demo",
                    DurabilityConfig::Sync,
                    Protocol::OneHopAckClient,
                    args.servers.min(3) as u8,
                )
                .await
        }
        .await;
        match attempt {
            Ok(stream) => break stream,
            Err(error) if Instant::now() > deadline => {
                return Err(error).context("creating the demo stream")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    };
    let replicas: Vec<u32> = stream.replicas.iter().map(|r| r.id).collect();
    println!(
        "stream demo: protocol one-hop-ack-client, durability sync, primary server {}, replicas {replicas:?}",
        stream.primary
    );
    let publisher = Publisher::connect(&stream, cluster.publisher_config(args.window)?).await?;
    let progress = progress_bar(args.messages, args.quiet);
    let (acks, mut answers) = tokio::sync::mpsc::channel(args.window * 2);
    let (messages, size) = (args.messages, args.size);
    let sender = tokio::spawn(async move {
        for index in 0..messages {
            let mut payload = vec![(index % 251) as u8; size];
            payload[..8].copy_from_slice(&index.to_le_bytes());
            let digest = checker::digest(b"", &payload);
            let pending = publisher.submit(b"", &payload).await?;
            let sent = checker::Sent {
                event: pending.event,
                digest,
            };
            if acks.send((sent, Instant::now(), pending)).await.is_err() {
                break;
            }
        }
        anyhow::Ok(())
    });
    let started = Instant::now();
    // Kill number k (from 1) comes after k / (kills + 1) of the messages;
    // the primary goes first, then the other replicas in turn.
    let kill_points: Vec<u64> = (1..=u64::from(args.kills))
        .map(|k| args.messages * k / (u64::from(args.kills) + 1))
        .collect();
    let mut victims = replicas.clone();
    victims.sort_by_key(|id| *id != stream.primary);
    let mut outcome = DemoOutcome::default();
    let mut history = checker::ClientHistory::default();
    let mut down: Option<(u32, Instant)> = None;
    let mut restart_after = 0;
    let mut acked_at_kill = 0;
    let mut kills_done = 0;
    while let Some((sent, submitted, pending)) = answers.recv().await {
        history.sent.push(sent);
        let published = pending
            .await
            .with_context(|| format!("message {}", sent.event.sequence))?;
        history.acked.push(checker::Acked {
            event: sent.event,
            version: published.version,
            duplicate: published.duplicate,
        });
        outcome
            .latencies_us
            .push(submitted.elapsed().as_secs_f64() * 1e6);
        outcome.duplicate_answers += u64::from(published.duplicate);
        outcome.acknowledged += 1;
        progress.inc(1);
        if let Some((victim, killed_at)) = down {
            // Writes are acknowledged again: the failover is done; the
            // killed server comes back as a new member.
            if outcome.acknowledged >= restart_after {
                let now = placement(&cluster, "demo").await?;
                progress.suspend(|| {
                    println!(
                        "  primary is now server {} in epoch {}; {} acks since the kill ({:.0} ms)",
                        now.primary,
                        now.epoch,
                        outcome.acknowledged - acked_at_kill,
                        killed_at.elapsed().as_secs_f64() * 1e3
                    )
                });
                // Starting waits for the child's first line: off the async
                // workers' duty, on this one.
                tokio::task::block_in_place(|| cluster.start_server(victim))?;
                progress.suspend(|| {
                    println!(
                        "  server {victim} restarted: pid {}, {}; it rejoins as a new member and catches up",
                        cluster.pid(victim),
                        cluster.address(victim)
                    )
                });
                outcome.restarts += 1;
                down = None;
            }
        }
        // A kill point passed while a server was down waits for its
        // restart.
        let due = kill_points
            .get(kills_done)
            .is_some_and(|point| outcome.acknowledged >= *point);
        if down.is_none() && due {
            kills_done += 1;
            let current = placement(&cluster, "demo").await?;
            let next = victims[outcome.restarts as usize % victims.len()];
            // The primary first (whichever server it is now), then others.
            let victim = if outcome.restarts == 0 {
                current.primary
            } else {
                next
            };
            let role = if victim == current.primary {
                "the primary"
            } else {
                "a replica"
            };
            progress.suspend(|| {
                println!(
                    "killing server {victim} ({role}) with SIGKILL in epoch {} after {} acknowledgements",
                    current.epoch, outcome.acknowledged
                )
            });
            cluster.kill(victim)?;
            down = Some((victim, Instant::now()));
            acked_at_kill = outcome.acknowledged;
            restart_after = outcome.acknowledged + args.window as u64 + 1;
        }
    }
    sender.await??;
    outcome.seconds = started.elapsed().as_secs_f64();
    outcome.sent = args.messages;
    progress.finish_and_clear();
    if let Some((victim, _)) = down {
        tokio::task::block_in_place(|| cluster.start_server(victim))?;
        outcome.restarts += 1;
    }
    outcome.report = judge(&cluster, &history).await?;
    if let Some(path) = &args.history {
        std::fs::write(path, history.to_lines())
            .with_context(|| format!("writing the history to {}", path.display()))?;
    }
    drop(cluster);
    Ok(outcome)
}

/// Reads the demo stream back from every replica it has now and judges
/// the client's history against their logs.
async fn judge(
    cluster: &ProcessCluster,
    history: &checker::ClientHistory,
) -> anyhow::Result<checker::Report> {
    let last = placement(cluster, "demo").await?;
    let replicas: Vec<(u32, String)> = last
        .replicas
        .iter()
        .map(|r| (r.id, r.address.clone()))
        .collect();
    let histories = std::slice::from_ref(history);
    read_back(&replicas, &last, histories, &cluster.credentials()?).await
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
            "stamplog demo: {} servers, one-hop-ack-client, durability sync, {} SIGKILL and restart(s)",
            args.servers, outcome.restarts
        ),
        &["figure", "value"],
    );
    let rows = [
        ("messages sent", outcome.sent.to_string()),
        ("messages acknowledged", outcome.acknowledged.to_string()),
        ("payload bytes", args.size.to_string()),
        ("in flight (window)", args.window.to_string()),
        ("servers", args.servers.to_string()),
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
    ];
    for (name, value) in rows {
        table.row(vec![name.to_string(), value]);
    }
    for (name, count) in report.table_rows() {
        table.row(vec![name.to_string(), count.to_string()]);
    }
    print!("{}", table.render());
}
