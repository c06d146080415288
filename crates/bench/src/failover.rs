//! `bench failover` (F7): how long writes stop when a server dies or
//! pauses, and what the history checker says about every fault.
//!
//! A cluster of separate `stamplog server` processes on loopback (or, with
//! `--network namespaces`, each in a network namespace of its own on its
//! own address: `crate::network`) holds one stream (R = 3, or every
//! server when fewer). One publisher writes at a steady rate (`--rate`, or
//! as fast as its window allows with 0). At evenly spaced points of the
//! run a server is killed with SIGKILL: the stream's primary (`--victims
//! primary`), or any server, the primary half the time (`--victims
//! random`, the kill loop). The time to recover is from the fault to the
//! first acknowledgement of a message submitted after it (messages in
//! flight complete first, so this is the time until new writes are
//! acknowledged again). The killed server is started again on its port and
//! data (it joins as a new member and catches up), and the next fault
//! waits `--settle-ms` after that. With `--fault pause` the victim is
//! stopped with SIGSTOP for `--fault-ms` and let run again with SIGCONT
//! instead, with no restart: removed from the view while it was stopped,
//! it must come back by itself. The network faults (`partition`,
//! `one-way`, `flap`, `minority`) cut links around the victim for
//! `--fault-ms` and then heal them; `--fault mixed` runs every kind the
//! network allows in turn (the soak). After every fault the victim (and
//! the other servers the fault touched) is timed until it serves the
//! stream's newest placement, as a replica holding every version
//! acknowledged by then. Meanwhile one reader
//! per server subscribes there and keeps reading through its kills and
//! restarts, resuming after the last version it got. At the end every
//! replica's log is read back and the history checker judges them with the
//! publisher's history (lost, duplicated, divergent must all be 0) and with
//! what the readers saw (every delivery committed, in order, once).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use clap::Parser;
use client::{Client, ClientConfig, Protocol, Publisher, StreamInfo};
use report::plot::{Chart, Series};
use report::stats::Summary;
use report::Table;
use tokio::sync::watch;

use crate::network::Namespaces;
use crate::output::{self, Output, OutputArgs};
use crate::process::ProcessCluster;
use crate::progress;
use crate::replication::{binary_or_self, parse_protocol, Durability};
use crate::units::parse_bytes;

/// Which servers the experiment kills.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Victims {
    /// The stream's primary every time.
    Primary,
    /// The primary half the time, else another running server.
    Random,
}

/// What happens to the victim.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// SIGKILL, then the server is started again on its port and data.
    Kill,
    /// SIGSTOP for `--fault-ms`, then SIGCONT (a long GC pause, a VM
    /// migration, a stalled disk): no restart. A pause longer than the
    /// suspect timeout gets the server removed from the view; it must
    /// notice, join again as a new member and catch up by itself.
    Pause,
    /// The victim cut off from every other server, both ways, for
    /// `--fault-ms`, while clients still reach it (`--network
    /// namespaces`).
    Partition,
    /// The victim's packets to every other server dropped for
    /// `--fault-ms`; theirs still reach it (`--network namespaces`).
    OneWay,
    /// The link between the victim and one other server cut and mended
    /// every 250 ms for `--fault-ms` (`--network namespaces`).
    Flap,
    /// The victim and as many other servers as make a minority (one of
    /// five, none of three) cut off from the rest, both ways, for
    /// `--fault-ms`; clients reach both sides (`--network namespaces`).
    Minority,
    /// Every kind in turn, starting with a SIGKILL: SIGKILL and pause on
    /// loopback; with `--network namespaces` also partition, one-way,
    /// flap and minority. The soak's mix.
    Mixed,
}

impl Fault {
    fn name(self) -> &'static str {
        match self {
            Fault::Kill => "SIGKILL",
            Fault::Pause => "pause",
            Fault::Partition => "partition",
            Fault::OneWay => "one-way",
            Fault::Flap => "flap",
            Fault::Minority => "minority",
            Fault::Mixed => "mixed",
        }
    }

    /// A fault of the network, made in the router of the namespaces.
    pub fn needs_network(self) -> bool {
        matches!(
            self,
            Fault::Partition | Fault::OneWay | Fault::Flap | Fault::Minority
        )
    }

    /// Fault `number` (from 1) of a run of this kind.
    pub fn nth(self, number: u32, namespaces: bool) -> Fault {
        const LOOPBACK: [Fault; 2] = [Fault::Kill, Fault::Pause];
        const NAMESPACES: [Fault; 6] = [
            Fault::Kill,
            Fault::Pause,
            Fault::Partition,
            Fault::OneWay,
            Fault::Flap,
            Fault::Minority,
        ];
        let cycle: &[Fault] = if namespaces { &NAMESPACES } else { &LOOPBACK };
        match self {
            Fault::Mixed => cycle[(number.max(1) - 1) as usize % cycle.len()],
            fault => fault,
        }
    }
}

/// Where the servers run.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Network {
    /// Every server on a port of 127.0.0.1.
    Loopback,
    /// Each server in a network namespace of its own, on its own address
    /// (10.x.<id>.2), all joined by a router namespace where partitions
    /// are made (needs root and the `ip` tool; removed at the end).
    Namespaces,
}

/// How long each half-period of a flapping link lasts.
const FLAP_PERIOD: Duration = Duration::from_millis(250);

/// Options of `bench failover`.
#[derive(Parser, Debug, Clone)]
#[command(name = "failover")]
pub struct FailoverArgs {
    /// The stamplog binary to run as the servers (`<binary> server`)
    /// [default: this program].
    #[arg(long, value_name = "PATH")]
    pub server_binary: Option<PathBuf>,
    /// Server processes in the cluster.
    #[arg(long, default_value_t = 3)]
    pub servers: u32,
    /// Messages to send at least; the writer goes on past them until
    /// every kill has recovered, so each kill meets a live write load.
    #[arg(long, default_value_t = 20_000)]
    pub messages: u64,
    /// SIGKILLs, spread evenly over the run.
    #[arg(long, default_value_t = 10)]
    pub kills: u32,
    /// Whom to kill.
    #[arg(long, value_enum, default_value = "primary")]
    pub victims: Victims,
    /// What each fault does to its victim: `kill` (SIGKILL and a
    /// restart), `pause` (SIGSTOP, then SIGCONT, no restart), the network
    /// faults `partition`, `one-way`, `flap` and `minority` (with
    /// `--network namespaces`), or `mixed` (every kind in turn: a soak).
    #[arg(long, value_enum, default_value = "kill")]
    pub fault: Fault,
    /// How long a pause or a network fault lasts, in milliseconds.
    #[arg(long = "fault-ms", visible_alias = "pause-ms", default_value_t = 4_000)]
    pub fault_ms: u64,
    /// Where the servers run: `loopback` (127.0.0.1) or `namespaces` (each
    /// in its own network namespace and address; needed by the network
    /// faults).
    #[arg(long, value_enum, default_value = "loopback")]
    pub network: Network,
    /// Messages per second the writer offers (0: as fast as the window
    /// allows).
    #[arg(long, default_value_t = 2_000)]
    pub rate: u64,
    /// Messages in flight at most.
    #[arg(long, default_value_t = 64)]
    pub window: usize,
    /// Payload bytes of each message (units B, KB = 1000, KiB = 1024).
    #[arg(long, value_parser = parse_bytes, default_value = "1000")]
    pub payload: usize,
    /// The stream's replication protocol.
    #[arg(long, value_parser = parse_protocol, default_value = "one-hop-ack-client")]
    pub protocol: Protocol,
    /// Durability of the stream: `sync`, `memory` or `sender` (sender-based
    /// logging: the servers write partly filled pages every
    /// `--page-flush-ms` and take resends for `--sender-recovery-ms` after
    /// a restart; with `--servers 1` every kill restarts the one server,
    /// which recovers from its clients' copies).
    #[arg(long, value_enum, default_value = "sync")]
    pub durability: Durability,
    /// `sender`: the servers' page flush interval in milliseconds (the
    /// larger, the more a SIGKILL loses from the log and the clients must
    /// resend).
    #[arg(long, default_value_t = 20)]
    pub page_flush_ms: u64,
    /// `sender`: how long a restarted primary takes resends, in
    /// milliseconds.
    #[arg(long, default_value_t = 1_000)]
    pub sender_recovery_ms: u64,
    /// Milliseconds between a restart and the next kill.
    #[arg(long, default_value_t = 1_000)]
    pub settle_ms: u64,
    /// Seed of the random victims.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Keep the servers' data folders and logs (named at the end).
    #[arg(long)]
    pub keep: bool,
    #[command(flatten)]
    pub output: OutputArgs,
}

impl Default for FailoverArgs {
    fn default() -> Self {
        FailoverArgs::parse_from(["failover"])
    }
}

/// One kill.
#[derive(Clone, Debug)]
pub struct Kill {
    pub number: u32,
    pub fault: Fault,
    pub victim: u32,
    /// The other servers the fault touched: the victim's side of a
    /// minority partition, the far end of a flapping link.
    pub partners: Vec<u32>,
    pub was_primary: bool,
    /// Messages acknowledged when it happened.
    pub acknowledged_before: u64,
    /// From the kill to the first ack of a message submitted after it;
    /// `None` when none came within the timeout.
    pub recovery_ms: Option<f64>,
    /// The primary and epoch after the recovery.
    pub primary_after: u32,
    pub epoch_after: u64,
    /// From the victim's restart (or resume, or the network healed) until
    /// it and its partners serve the stream's newest placement, each a
    /// replica holding every version acknowledged before that point (or
    /// no longer one of its replicas); `None` when not within
    /// [`BACK_TIMEOUT`].
    pub back_ms: Option<f64>,
}

/// How long a restarted or resumed victim may take to be a complete
/// replica again.
pub const BACK_TIMEOUT: Duration = Duration::from_secs(10);

/// Everything `bench failover` measured.
#[derive(Clone, Debug)]
pub struct FailoverFigures {
    pub servers: u32,
    /// Where each server listened, by id.
    pub addresses: Vec<std::net::SocketAddr>,
    pub protocol: Protocol,
    pub durability: Durability,
    pub rate: u64,
    pub messages: u64,
    pub acknowledged: u64,
    /// Acks flagged duplicate: resent messages that had landed.
    pub duplicates: u64,
    pub seconds: f64,
    pub kills: Vec<Kill>,
    /// Over the kills that recovered, in milliseconds.
    pub recovery: Summary,
    /// Every kill of the primary, in milliseconds.
    pub primary_recovery: Summary,
    /// Over the victims that were complete again, in milliseconds.
    pub back: Summary,
    pub report: checker::Report,
    /// What the live readers saw, judged against the final logs.
    pub reads: checker::ReadReport,
}

/// What the live readers are told.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ReadUntil {
    /// Keep reading.
    Running,
    /// Read up to this version (the newest acknowledged), then stop.
    Version(u64),
    /// Stop now (the server holds no replica of the stream).
    Stop,
}

/// How long a reader may take to reach the newest acknowledged version
/// once the writing is over.
const READ_DRAIN: Duration = Duration::from_secs(30);

/// A live reader on one server: its id, the word that stops it, and the
/// task that returns what it read.
type LiveReader = (
    u32,
    watch::Sender<ReadUntil>,
    tokio::task::JoinHandle<checker::ReaderHistory>,
);

/// One live reader on one server: subscribes from version 1 and reads for
/// the whole run. A subscription that ends (the server was killed, holds
/// no replica yet) is opened again after the last version delivered, so
/// the history is one ordered sequence for the checker.
async fn read_live(
    id: u32,
    config: ClientConfig,
    stream: u64,
    mut until: watch::Receiver<ReadUntil>,
) -> checker::ReaderHistory {
    let mut history = checker::ReaderHistory {
        reader: format!("reader on server {id}"),
        delivered: Vec::new(),
    };
    let mut drain_deadline = None;
    let next =
        |history: &checker::ReaderHistory| history.delivered.last().map_or(1, |r| r.version + 1);
    loop {
        if reading_done(*until.borrow(), next(&history), &mut drain_deadline) {
            return history;
        }
        let subscribed = tokio::time::timeout(Duration::from_secs(2), async {
            let client = Client::connect(config.clone()).await?;
            let subscription = client.subscribe(stream, next(&history)).await?;
            Ok::<_, client::ClientError>((client, subscription))
        })
        .await;
        let Ok(Ok((_client, mut subscription))) = subscribed else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        loop {
            let item = tokio::select! {
                item = subscription.next() => Some(item),
                _ = until.changed() => None,
                _ = tokio::time::sleep(Duration::from_millis(200)) => None,
            };
            let Some(item) = item else {
                if reading_done(*until.borrow(), next(&history), &mut drain_deadline) {
                    return history;
                }
                continue;
            };
            match item {
                Some(Ok(record)) => history.delivered.push(checker::Logged {
                    version: record.version,
                    event: record.event,
                    digest: checker::digest(&record.key, &record.payload),
                }),
                // Ended: the stream is unknown there (yet), or the client
                // gave up on the server; open it again after a pause.
                Some(Err(_)) | None => break,
            }
            if reading_done(*until.borrow(), next(&history), &mut drain_deadline) {
                return history;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Whether a reader whose next version is `next` is done; the drain
/// deadline starts when it is first told the last version.
fn reading_done(until: ReadUntil, next: u64, deadline: &mut Option<Instant>) -> bool {
    match until {
        ReadUntil::Running => false,
        ReadUntil::Stop => true,
        ReadUntil::Version(last) => {
            let deadline = *deadline.get_or_insert_with(|| Instant::now() + READ_DRAIN);
            next > last || Instant::now() > deadline
        }
    }
}

/// Gives up on a recovery after this long.
const RECOVERY_TIMEOUT: Duration = Duration::from_secs(30);

pub fn run(args: FailoverArgs) -> anyhow::Result<FailoverFigures> {
    ensure!(
        (2..=9).contains(&args.servers)
            || (args.servers == 1 && args.durability == Durability::Sender),
        "--servers must be between 2 and 9 (1 only with --durability sender)"
    );
    ensure!(args.messages > 0, "--messages must be at least 1");
    ensure!(
        u64::from(args.kills) < args.messages,
        "--kills must be below --messages"
    );
    ensure!(args.window > 0, "--window must be at least 1");
    ensure!(
        args.payload >= 8,
        "--payload must be at least 8 bytes (the message number)"
    );
    ensure!(
        args.network == Network::Namespaces || !args.fault.needs_network(),
        "--fault {} needs --network namespaces",
        args.fault.name()
    );
    let binary = binary_or_self(&args.server_binary)?;
    let data = args.output.data_folder("failover")?;
    let extra: Vec<String> = if args.durability == Durability::Sender {
        vec![
            "--page-flush-ms".into(),
            args.page_flush_ms.to_string(),
            "--sender-recovery-ms".into(),
            args.sender_recovery_ms.to_string(),
        ]
    } else {
        Vec::new()
    };
    let network = match args.network {
        Network::Namespaces => Some(Namespaces::create(args.servers)?),
        Network::Loopback => None,
    };
    let cluster = ProcessCluster::start_in(&binary, data.path(), args.servers, &extra, network)?;
    let runtime = output::runtime()?;
    let figures = runtime.block_on(drive(&args, cluster));
    if args.keep {
        let kept = data.keep();
        println!("kept the servers' data and logs in {}", kept.display());
    }
    let figures = figures?;
    write_report(&args, &figures)?;
    Ok(figures)
}

/// What the collector tells the kill loop: acknowledged so far, and the
/// submit and completion times of the newest completion.
#[derive(Clone, Copy)]
struct Completed {
    acknowledged: u64,
    /// The highest version acknowledged so far.
    acknowledged_version: u64,
    submitted: Instant,
    completed: Instant,
}

impl Completed {
    /// Nothing acknowledged yet, at `start`.
    fn none(start: Instant) -> Completed {
        Completed {
            acknowledged: 0,
            acknowledged_version: 0,
            submitted: start,
            completed: start,
        }
    }
}

async fn drive(
    args: &FailoverArgs,
    mut cluster: ProcessCluster,
) -> anyhow::Result<FailoverFigures> {
    let name = "failover";
    let replicas = args.servers.min(3) as u8;
    let stream = create_stream(&cluster, name, args, replicas).await?;
    let config = cluster.publisher_config(args.window)?;
    let publisher = Arc::new(Publisher::connect(&stream, config).await?);
    let readers = start_readers(&cluster, stream.id)?;
    let started = Instant::now();
    let (completed_sender, mut completed) = watch::channel(Completed::none(started));
    let (to_collector, answers) = tokio::sync::mpsc::channel(args.window * 2);
    let kills_done = Arc::new(std::sync::atomic::AtomicBool::new(args.kills == 0));
    let writer = tokio::spawn(write_messages(
        Arc::clone(&publisher),
        Arc::clone(&kills_done),
        (args.messages, args.payload, args.rate),
        to_collector,
    ));
    let history = Arc::new(Mutex::new(checker::ClientHistory::default()));
    let duplicates = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let collector = tokio::spawn(collect_answers(
        answers,
        Arc::clone(&history),
        Arc::clone(&duplicates),
        completed_sender,
    ));
    let progress = progress::bar(u64::from(args.kills), "kills", args.output.quiet);
    let mut random = proto::Rng::new(args.seed);
    let mut kills = Vec::new();
    for number in 1..=args.kills {
        let point = args.messages * u64::from(number) / (u64::from(args.kills) + 1);
        if completed
            .wait_for(|c| c.acknowledged >= point)
            .await
            .is_err()
        {
            // The collector ended: say why.
            collector.await??;
            writer.await??;
            anyhow::bail!(
                "the writer stopped after {} acks",
                completed.borrow().acknowledged
            );
        }
        let kill = kill_one(
            &mut cluster,
            args,
            (name, number),
            &mut random,
            &mut completed,
        )
        .await?;
        progress.suspend(|| kill.print());
        kills.push(kill);
        tokio::time::sleep(Duration::from_millis(args.settle_ms)).await;
        progress.inc(1);
    }
    kills_done.store(true, std::sync::atomic::Ordering::Release);
    writer.await??;
    collector.await??;
    progress.finish_and_clear();
    let seconds = started.elapsed().as_secs_f64();
    let history = std::mem::take(&mut *history.lock().expect("history lock"));
    let final_info = placement(&cluster, name).await?;
    let addresses: Vec<(u32, String)> = final_info
        .replicas
        .iter()
        .map(|r| (r.id, r.address.clone()))
        .collect();
    let credentials = cluster.credentials()?;
    let (report, reads) = judge(readers, &addresses, &final_info, &history, &credentials).await?;
    let sent = history.sent.len() as u64;
    Ok(FailoverFigures {
        servers: args.servers,
        addresses: cluster.addresses.clone(),
        protocol: args.protocol,
        durability: args.durability,
        rate: args.rate,
        messages: sent,
        acknowledged: history.acked.len() as u64,
        duplicates: duplicates.load(std::sync::atomic::Ordering::Relaxed),
        seconds,
        recovery: recovery_summary(&kills, false),
        primary_recovery: recovery_summary(&kills, true),
        back: Summary::of(&kills.iter().filter_map(|k| k.back_ms).collect::<Vec<_>>()),
        kills,
        report,
        reads,
    })
}

/// A live reader on each running server, from the stream's start.
fn start_readers(cluster: &ProcessCluster, stream: u64) -> anyhow::Result<Vec<LiveReader>> {
    cluster
        .running()
        .into_iter()
        .map(|id| {
            let config = cluster.client_config(id)?;
            let (until, reading) = watch::channel(ReadUntil::Running);
            let task = tokio::spawn(read_live(id, config, stream, reading));
            Ok((id, until, task))
        })
        .collect()
}

/// The times until writes were acknowledged again, over every kill or
/// over the kills of the primary.
fn recovery_summary(kills: &[Kill], primary_only: bool) -> Summary {
    let times: Vec<f64> = kills
        .iter()
        .filter(|k| k.was_primary || !primary_only)
        .filter_map(|k| k.recovery_ms)
        .collect();
    Summary::of(&times)
}

/// Stops the live readers at the newest acknowledged version, reads every
/// replica's log, and judges the history and the reads against them.
async fn judge(
    readers: Vec<LiveReader>,
    addresses: &[(u32, String)],
    final_info: &StreamInfo,
    history: &checker::ClientHistory,
    credentials: &client::Credentials,
) -> anyhow::Result<(checker::Report, checker::ReadReport)> {
    let newest = history.acked.iter().map(|a| a.version).max().unwrap_or(0);
    let mut histories = Vec::new();
    for (id, until, task) in readers {
        // Readers on servers that hold no replica now stop at once (a
        // refill can have moved the stream away from them).
        if addresses.iter().any(|(holder, _)| *holder == id) {
            until.send_replace(ReadUntil::Version(newest));
        } else {
            until.send_replace(ReadUntil::Stop);
        }
        histories.push(task);
    }
    let (report, logs) = read_logs(
        addresses,
        final_info,
        std::slice::from_ref(history),
        credentials,
    )
    .await?;
    let mut read_histories = Vec::new();
    for task in histories {
        read_histories.push(task.await.context("a reader panicked")?);
    }
    let reads = checker::check_reads(&read_histories, &logs);
    Ok((report, reads))
}

/// One fault: chooses the victim, kills it with SIGKILL (or pauses it, or
/// cuts the network around it), waits until a message submitted after
/// the fault is acknowledged (or the timeout), starts the server again
/// (or resumes it, or heals the network), and waits until it is a
/// complete replica again.
async fn kill_one(
    cluster: &mut ProcessCluster,
    args: &FailoverArgs,
    (name, number): (&str, u32),
    random: &mut proto::Rng,
    completed: &mut watch::Receiver<Completed>,
) -> anyhow::Result<Kill> {
    let info = placement(cluster, name).await?;
    let victim = choose_victim(cluster, args.victims, info.primary, random);
    let acknowledged_before = completed.borrow().acknowledged;
    let alone = args.servers == 1;
    let fault = args.fault.nth(number, cluster.network().is_some());
    let partners = partners(cluster, fault, victim, random);
    start_fault(cluster, fault, victim, &partners)?;
    // Once the fault is in place: a message offered while `kill` ran can
    // still be acknowledged by the victim.
    let fault_at = Instant::now();
    if alone && fault == Fault::Kill {
        // No other server takes over: the one server comes back and
        // recovers what its log lost from the publisher's copies.
        tokio::task::block_in_place(|| cluster.start_server(victim))?;
    }
    // The time of the first completion after the fault, copied out of the
    // watch at once: a borrow held across an await would block the
    // collector's next update.
    let recovery = tokio::time::timeout(RECOVERY_TIMEOUT, async {
        let first = completed.wait_for(|c| c.submitted > fault_at).await;
        first.map(|c| c.completed)
    });
    let recovered = if fault == Fault::Kill {
        recovery.await
    } else if alone {
        // Nothing is acknowledged while the one server is stopped.
        hold_fault(cluster, fault, victim, &partners, args.fault_ms).await?;
        end_fault(cluster, fault, victim)?;
        recovery.await
    } else {
        let lasting = hold_fault(cluster, fault, victim, &partners, args.fault_ms);
        let (recovered, lasted) = tokio::join!(recovery, lasting);
        lasted?;
        end_fault(cluster, fault, victim)?;
        recovered
    };
    let recovery_ms = recovered
        .ok()
        .and_then(Result::ok)
        .map(|at| at.duration_since(fault_at).as_secs_f64() * 1e3);
    let after = placement(cluster, name).await?;
    if !alone && fault == Fault::Kill {
        tokio::task::block_in_place(|| cluster.start_server(victim))?;
    }
    let target = completed.borrow().acknowledged_version;
    let mut touched = partners.clone();
    touched.push(victim);
    let back_ms = wait_back(cluster, &touched, name, target).await;
    Ok(Kill {
        number,
        fault,
        victim,
        partners,
        was_primary: victim == info.primary,
        acknowledged_before,
        recovery_ms,
        primary_after: after.primary,
        epoch_after: after.epoch,
        back_ms,
    })
}

/// The other servers a fault touches: for a minority partition, enough
/// others to make the victim's side a minority; for a flapping link, the
/// server at its other end.
fn partners(
    cluster: &ProcessCluster,
    fault: Fault,
    victim: u32,
    random: &mut proto::Rng,
) -> Vec<u32> {
    let mut others: Vec<u32> = cluster
        .running()
        .into_iter()
        .filter(|id| *id != victim)
        .collect();
    let wanted = match fault {
        Fault::Flap => 1,
        Fault::Minority => (cluster.addresses.len().saturating_sub(1) / 2).saturating_sub(1),
        _ => 0,
    };
    let mut chosen = Vec::new();
    while chosen.len() < wanted && !others.is_empty() {
        let index = random.below(others.len() as u64) as usize;
        chosen.push(others.swap_remove(index));
    }
    chosen
}

/// Puts the fault in place: the signal, or the network's first cuts.
fn start_fault(
    cluster: &mut ProcessCluster,
    fault: Fault,
    victim: u32,
    partners: &[u32],
) -> anyhow::Result<()> {
    let servers = cluster.addresses.len() as u32;
    if fault == Fault::Kill {
        return tokio::task::block_in_place(|| cluster.kill(victim));
    }
    if fault == Fault::Pause {
        return cluster.pause(victim);
    }
    let network = cluster
        .network()
        .context("a network fault needs --network namespaces")?;
    match fault {
        Fault::Partition => network.partition(&[victim]),
        Fault::OneWay => (1..=servers)
            .filter(|id| *id != victim)
            .try_for_each(|other| network.cut(victim, other)),
        Fault::Minority => network.partition(&[&[victim], partners].concat()),
        _ => Ok(()),
    }
}

/// Lets a pause or a network fault last `fault_ms`; a flapping link is cut
/// and mended in turn meanwhile. A SIGKILL lasts no time.
async fn hold_fault(
    cluster: &ProcessCluster,
    fault: Fault,
    victim: u32,
    partners: &[u32],
    fault_ms: u64,
) -> anyhow::Result<()> {
    let until = Instant::now() + Duration::from_millis(fault_ms);
    match (fault, cluster.network(), partners.first()) {
        (Fault::Kill, _, _) => Ok(()),
        (Fault::Flap, Some(network), Some(&partner)) => {
            let mut cut = false;
            while Instant::now() < until {
                if cut {
                    network.mend(victim, partner)?;
                    network.mend(partner, victim)?;
                } else {
                    network.cut(victim, partner)?;
                    network.cut(partner, victim)?;
                }
                cut = !cut;
                tokio::time::sleep(FLAP_PERIOD.min(until - Instant::now())).await;
            }
            Ok(())
        }
        _ => {
            tokio::time::sleep_until(until.into()).await;
            Ok(())
        }
    }
}

/// Ends a pause (SIGCONT) or a network fault (every cut mended).
fn end_fault(cluster: &ProcessCluster, fault: Fault, victim: u32) -> anyhow::Result<()> {
    match (fault, cluster.network()) {
        (Fault::Pause, _) => cluster.resume(victim),
        (_, Some(network)) => network.heal(),
        _ => Ok(()),
    }
}

/// The server to kill: the primary, or with `Victims::Random` another
/// running server half the time.
fn choose_victim(
    cluster: &ProcessCluster,
    victims: Victims,
    primary: u32,
    random: &mut proto::Rng,
) -> u32 {
    let others: Vec<u32> = cluster
        .running()
        .into_iter()
        .filter(|id| *id != primary)
        .collect();
    match victims {
        Victims::Primary => primary,
        Victims::Random if others.is_empty() || random.coin() => primary,
        Victims::Random => others[random.below(others.len() as u64) as usize],
    }
}

/// Waits (up to [`BACK_TIMEOUT`]) until each server of `touched` answers
/// for the stream with its newest placement and, when it is one of the
/// replicas there, holds version `target`; the time it took, in
/// milliseconds. (A refill may have moved the stream away from a server
/// that was cut off; it is back once it knows.)
async fn wait_back(
    cluster: &ProcessCluster,
    touched: &[u32],
    name: &str,
    target: u64,
) -> Option<f64> {
    let started = Instant::now();
    for &server in touched {
        let Ok(config) = cluster.client_config(server) else {
            return None;
        };
        loop {
            if started.elapsed() >= BACK_TIMEOUT {
                return None;
            }
            let answer = tokio::time::timeout(Duration::from_secs(1), async {
                Client::connect(config.clone())
                    .await?
                    .open_stream(name)
                    .await
            })
            .await;
            let newest = tokio::time::timeout(Duration::from_secs(2), placement(cluster, name));
            if let (Ok(Ok(answer)), Ok(Ok(newest))) = (answer, newest.await) {
                if is_back(server, &answer, &newest, target) {
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    Some(started.elapsed().as_secs_f64() * 1e3)
}

/// Whether `server`'s `answer` for the stream shows it back: ready (not
/// joining) and knowing the newest placement, and holding `target` when
/// that placement names it (a server without a replica answers with the
/// placement).
fn is_back(server: u32, answer: &StreamInfo, newest: &StreamInfo, target: u64) -> bool {
    let replica = answer.replicas.iter().any(|r| r.id == server);
    answer.epoch >= newest.epoch && (!replica || answer.last_version >= target)
}

impl Kill {
    /// The kill's line on the terminal.
    fn print(&self) {
        let timed_out = || "never (timed out)".to_string();
        let partners: String = self
            .partners
            .iter()
            .map(|p| format!(" with server {p}"))
            .collect();
        println!(
            "fault {} ({}): server {}{}{partners} after {} acks; writes acknowledged again after {}; primary now server {} (epoch {}); server {} and partners complete again after {}",
            self.number,
            self.fault.name(),
            self.victim,
            if self.was_primary { " (the primary)" } else { "" },
            self.acknowledged_before,
            self.recovery_ms.map_or_else(timed_out, |ms| format!("{ms:.0} ms")),
            self.primary_after,
            self.epoch_after,
            self.victim,
            self.back_ms.map_or_else(timed_out, |ms| format!("{ms:.0} ms")),
        );
    }
}

/// The writer: `messages` payloads of `payload` bytes at `rate` a second
/// (0: as fast as the window allows), and on until the kills are done,
/// each handed to the collector with its pending answer.
async fn write_messages(
    publisher: Arc<Publisher>,
    kills_done: Arc<std::sync::atomic::AtomicBool>,
    (messages, payload, rate): (u64, usize, u64),
    to_collector: tokio::sync::mpsc::Sender<(checker::Sent, Instant, client::PendingPublish)>,
) -> anyhow::Result<()> {
    let mut pace = (rate > 0).then(|| {
        let mut interval = tokio::time::interval(Duration::from_secs_f64(1.0 / rate as f64));
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        interval
    });
    for index in 0.. {
        if index >= messages && kills_done.load(std::sync::atomic::Ordering::Acquire) {
            break;
        }
        if let Some(pace) = &mut pace {
            pace.tick().await;
        }
        let mut bytes = vec![(index % 251) as u8; payload];
        bytes[..8].copy_from_slice(&index.to_le_bytes());
        let digest = checker::digest(b"", &bytes);
        // Before the submit, which waits while the window is full: a
        // message counts as submitted after a fault only if the writer
        // offered it after the fault.
        let submitted = Instant::now();
        let pending = publisher.submit(b"", &bytes).await?;
        let sent = checker::Sent {
            event: pending.event,
            digest,
        };
        if to_collector.send((sent, submitted, pending)).await.is_err() {
            break;
        }
    }
    Ok(())
}

/// The collector: records each message sent and its answer in the
/// history, counts duplicates, and says how far the acks have come.
async fn collect_answers(
    mut answers: tokio::sync::mpsc::Receiver<(checker::Sent, Instant, client::PendingPublish)>,
    history: Arc<Mutex<checker::ClientHistory>>,
    duplicates: Arc<std::sync::atomic::AtomicU64>,
    completed_sender: watch::Sender<Completed>,
) -> anyhow::Result<()> {
    let mut acknowledged = 0;
    let mut acknowledged_version = 0;
    while let Some((sent, submitted, pending)) = answers.recv().await {
        history.lock().expect("history lock").sent.push(sent);
        let published = pending
            .await
            .with_context(|| format!("message {}", sent.event.sequence))?;
        acknowledged += 1;
        acknowledged_version = acknowledged_version.max(published.version);
        if published.duplicate {
            duplicates.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        history
            .lock()
            .expect("history lock")
            .acked
            .push(checker::Acked {
                event: sent.event,
                version: published.version,
                duplicate: published.duplicate,
            });
        completed_sender.send_replace(Completed {
            acknowledged,
            acknowledged_version,
            submitted,
            completed: Instant::now(),
        });
    }
    Ok(())
}

/// Creates the stream once the cluster has formed (its control plane
/// elects a leader and every server joins within a few seconds).
async fn create_stream(
    cluster: &ProcessCluster,
    name: &str,
    args: &FailoverArgs,
    replicas: u8,
) -> anyhow::Result<StreamInfo> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let admin = cluster.client_config(1)?;
    loop {
        let attempt = async {
            let client = Client::connect(admin.clone()).await?;
            client
                .create_stream_with(name, args.durability.config(), args.protocol, replicas)
                .await
        }
        .await;
        match attempt {
            Ok(info) => return Ok(info),
            Err(error) if Instant::now() > deadline => {
                return Err(error).context("creating the stream")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// The stream's placement as a running server reports it.
pub async fn placement(cluster: &ProcessCluster, name: &str) -> anyhow::Result<StreamInfo> {
    let deadline = Instant::now() + RECOVERY_TIMEOUT;
    loop {
        // Every running server is asked, and the newest epoch wins: a
        // server that has just come back may answer from an older view.
        let mut newest: Option<StreamInfo> = None;
        for id in cluster.running() {
            let config = cluster.client_config(id)?;
            let answer = tokio::time::timeout(Duration::from_secs(2), async {
                Client::connect(config).await?.open_stream(name).await
            })
            .await;
            if let Ok(Ok(info)) = answer {
                if info.primary != 0
                    && cluster.is_running(info.primary)
                    && newest.as_ref().is_none_or(|n| info.epoch > n.epoch)
                {
                    newest = Some(info);
                }
            }
        }
        if let Some(info) = newest {
            return Ok(info);
        }
        ensure!(
            Instant::now() < deadline,
            "no running server named a running primary of {name:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Reads the whole committed stream back from every replica (waiting for
/// each to commit every acknowledged version) and hands the logs, with the
/// clients' histories, to the history checker.
pub async fn read_back(
    replicas: &[(u32, String)],
    stream: &StreamInfo,
    histories: &[checker::ClientHistory],
    credentials: &client::Credentials,
) -> anyhow::Result<checker::Report> {
    Ok(read_logs(replicas, stream, histories, credentials).await?.0)
}

/// As [`read_back`], with the logs read.
pub async fn read_logs(
    replicas: &[(u32, String)],
    stream: &StreamInfo,
    histories: &[checker::ClientHistory],
    credentials: &client::Credentials,
) -> anyhow::Result<(checker::Report, Vec<checker::ReplicaLog>)> {
    let mut logs = Vec::new();
    let acknowledged = histories
        .iter()
        .flat_map(|h| h.acked.iter().map(|a| a.version))
        .max()
        .unwrap_or(0);
    for (id, address) in replicas {
        let config = ClientConfig {
            credentials: credentials.clone(),
            ..ClientConfig::new(address.clone())
        };
        let client = Client::connect(config).await?;
        // A replica that was just restarted catches up first.
        let deadline = Instant::now() + Duration::from_secs(60);
        let committed = loop {
            let committed = match client.open_stream(&stream.name).await {
                Ok(info) => info.committed_version,
                Err(_) => 0,
            };
            if committed >= acknowledged || Instant::now() > deadline {
                break committed;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let mut log = checker::ReplicaLog {
            replica: format!("server-{id}"),
            records: Vec::with_capacity(committed as usize),
        };
        let mut subscription = client.subscribe(stream.id, 1).await?;
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
        logs.push(log);
    }
    Ok((checker::check(histories, &logs, None), logs))
}

fn ms(value: Option<f64>) -> String {
    value.map_or("timed out".into(), |v| format!("{v:.0}"))
}

fn kills_table(figures: &FailoverFigures) -> Table {
    let mut table = Table::new(
        format!(
            "Failover: {} servers, {}, durability {}, {} msgs/s offered",
            figures.servers,
            figures.protocol.name(),
            figures.durability.name(),
            figures.rate
        ),
        &[
            "kill",
            "fault",
            "victim",
            "was primary",
            "acks before",
            "writes acked again after (ms)",
            "primary after",
            "epoch after",
            "victim complete again after (ms)",
        ],
    );
    for kill in &figures.kills {
        table.row(vec![
            kill.number.to_string(),
            kill.fault.name().to_string(),
            kill.victim.to_string(),
            kill.was_primary.to_string(),
            kill.acknowledged_before.to_string(),
            ms(kill.recovery_ms),
            kill.primary_after.to_string(),
            kill.epoch_after.to_string(),
            ms(kill.back_ms),
        ]);
    }
    table
}

/// The summary's rows about the kills: how many, and how long writes and
/// the victims took to come back.
fn kill_rows(figures: &FailoverFigures) -> Vec<(&'static str, String)> {
    let timed_out = figures
        .kills
        .iter()
        .filter(|k| k.recovery_ms.is_none())
        .count();
    vec![
        ("kills", figures.kills.len().to_string()),
        (
            "kills of the primary",
            figures
                .kills
                .iter()
                .filter(|k| k.was_primary)
                .count()
                .to_string(),
        ),
        ("recoveries timed out", timed_out.to_string()),
        (
            "victims not complete again within 10 s",
            figures
                .kills
                .iter()
                .filter(|k| k.back_ms.is_none())
                .count()
                .to_string(),
        ),
        (
            "victim complete again, max (ms)",
            format!("{:.0}", figures.back.max),
        ),
        (
            "recovery p50, every kill (ms)",
            format!("{:.0}", figures.recovery.p50),
        ),
        (
            "recovery max, every kill (ms)",
            format!("{:.0}", figures.recovery.max),
        ),
        (
            "recovery p50, primary kills (ms)",
            format!("{:.0}", figures.primary_recovery.p50),
        ),
        (
            "recovery max, primary kills (ms)",
            format!("{:.0}", figures.primary_recovery.max),
        ),
    ]
}

fn summary_table(figures: &FailoverFigures) -> Table {
    let report = &figures.report;
    let mut table = Table::new(
        "Failover summary and the history checker",
        &["figure", "value"],
    );
    let mut rows = kill_rows(figures);
    rows.extend([
        ("messages sent", figures.messages.to_string()),
        ("messages acknowledged", figures.acknowledged.to_string()),
        ("acks flagged duplicate", figures.duplicates.to_string()),
        ("seconds", format!("{:.1}", figures.seconds)),
    ]);
    for (name, value) in rows {
        table.row(vec![name.to_string(), value]);
    }
    for (name, count) in report.table_rows() {
        table.row(vec![name.to_string(), count.to_string()]);
    }
    let reads = &figures.reads;
    for (name, count) in [
        ("records the live readers got", reads.deliveries),
        ("reads out of order", reads.out_of_order),
        ("records read twice", reads.repeated),
        ("reads of records not in the log", reads.not_in_log),
    ] {
        table.row(vec![name.to_string(), count.to_string()]);
    }
    table
}

/// Everything `bench failover` measured, as the `--json` file holds it.
fn figures_json(figures: &FailoverFigures, kills: &Table, summary: &Table) -> serde_json::Value {
    let report = &figures.report;
    serde_json::json!({
        "experiment": "failover",
        "servers": figures.servers,
        "protocol": figures.protocol.name(),
        "durability": figures.durability.name(),
        "rate": figures.rate,
        "messages": figures.messages,
        "acknowledged": figures.acknowledged,
        "duplicates": figures.duplicates,
        "seconds": figures.seconds,
        "recovery_ms": figures.recovery.to_json(),
        "primary_recovery_ms": figures.primary_recovery.to_json(),
        "back_ms": figures.back.to_json(),
        "kills": figures.kills.iter().map(|k| serde_json::json!({
            "number": k.number,
            "fault": k.fault.name(),
            "victim": k.victim,
            "partners": k.partners,
            "was_primary": k.was_primary,
            "acknowledged_before": k.acknowledged_before,
            "recovery_ms": k.recovery_ms,
            "primary_after": k.primary_after,
            "epoch_after": k.epoch_after,
            "back_ms": k.back_ms,
        })).collect::<Vec<_>>(),
        "checker": {
            "lost": report.lost,
            "duplicated": report.duplicated,
            "divergent": report.divergent,
            "conflicting_versions": report.conflicting_versions,
            "misplaced_acks": report.misplaced_acks,
            "gaps": report.gaps,
            "reordered": report.reordered,
            "unknown_events": report.unknown_events,
            "logged_versions": report.logged_versions,
        },
        "reads": {
            "deliveries": figures.reads.deliveries,
            "out_of_order": figures.reads.out_of_order,
            "repeated": figures.reads.repeated,
            "not_in_log": figures.reads.not_in_log,
        },
        "tables": [kills.to_json(), summary.to_json()],
    })
}

fn write_report(args: &FailoverArgs, figures: &FailoverFigures) -> anyhow::Result<()> {
    let kills = kills_table(figures);
    let summary = summary_table(figures);
    print!("{}", kills.render());
    println!();
    print!("{}", summary.render());
    let mut output = Output::new(args.output.out_folder("failover"))?;
    output.csv("failover", &kills)?;
    output.csv("failover-summary", &summary)?;
    let mut chart = Chart::lines(
        "Time until writes are acknowledged again after a SIGKILL",
        "kill",
        "milliseconds",
    );
    for (label, primary) in [("primary killed", true), ("other server killed", false)] {
        let points: Vec<(f64, f64)> = figures
            .kills
            .iter()
            .filter(|k| k.was_primary == primary)
            .filter_map(|k| Some((f64::from(k.number), k.recovery_ms?)))
            .collect();
        if !points.is_empty() {
            chart.add(Series::new(label, points));
        }
    }
    output.png("failover", &chart)?;
    let json = figures_json(figures, &kills, &summary);
    output.json(args.output.json.as_deref(), &json)?;
    output.announce();
    Ok(())
}
