//! Runs every in-process benchmark with tiny parameters, so none can rot,
//! and checks the flags parse as documented. The replication experiments
//! (`patterns`, `duplication`) run against the real `stamplog` binary.

// A test stops at the first thing that is not as it expects.
#![allow(clippy::unwrap_used)]

mod commit_interval;
mod duplication;
mod failover;
mod growth;
mod journal;
mod links;
mod metrics;
mod partitions;
mod patterns;
mod scale;
mod sender;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use bench::logging::LoggingArgs;
use bench::paged::{self, PagedArgs};
use bench::throughput::{self, ThroughputArgs};
use bench::BenchCommand;
use clap::{CommandFactory, Parser};

/// Stands in for the `stamplog bench` command line.
#[derive(Parser, Debug)]
struct BenchLine {
    #[command(subcommand)]
    command: BenchCommand,
}

/// Points the output, the JSON file and the data folder into `folder`.
fn quiet_output(folder: &Path) -> bench::output::OutputArgs {
    bench::output::OutputArgs {
        out: Some(folder.join("out")),
        json: Some(folder.join("figures.json")),
        data: Some(folder.join("data")),
        quiet: true,
    }
}

fn assert_files(folder: &Path, names: &[&str]) {
    for name in names {
        let path = folder.join(name);
        let length = std::fs::metadata(&path)
            .unwrap_or_else(|error| panic!("{} is missing: {error}", path.display()))
            .len();
        assert!(length > 0, "{} is empty", path.display());
    }
}

/// The `stamplog` binary the replication experiments run as their cluster:
/// `$STAMPLOG_BINARY` when set, otherwise the one in this test's own target
/// folder and profile, which cargo builds first (a no-op when it is fresh).
///
/// `CARGO_BIN_EXE_stamplog` exists only in the `cli` package's tests, and
/// `cargo test -p bench` does not build another package's binary, so the
/// test asks cargo for it; cargo holds no lock while tests run.
/// A runtime of two workers, as a client application's, for the tests
/// that drive a server process from this thread.
fn two_worker_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn stamplog_binary() -> PathBuf {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY
        .get_or_init(|| {
            if let Some(path) = std::env::var_os("STAMPLOG_BINARY") {
                return PathBuf::from(path);
            }
            // This test runs as <target>/<profile folder>/deps/it-<hash>.
            let test = std::env::current_exe().expect("the test knows its path");
            let profile_folder = test
                .parent()
                .and_then(Path::parent)
                .expect("tests run from <target>/<profile>/deps");
            let target = profile_folder
                .parent()
                .expect("profile folders have a parent");
            let profile = match profile_folder.file_name().and_then(|n| n.to_str()) {
                Some("debug") => "dev",
                Some(other) => other,
                None => panic!("bad profile folder {}", profile_folder.display()),
            };
            let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
            let output = Command::new(cargo)
                .args([
                    "build",
                    "--quiet",
                    "-p",
                    "cli",
                    "--bin",
                    "stamplog",
                    "--profile",
                ])
                .arg(profile)
                .arg("--target-dir")
                .arg(target)
                .output()
                .expect("cargo runs");
            assert!(
                output.status.success(),
                "cannot build stamplog (set STAMPLOG_BINARY to use a built one):\n{}",
                String::from_utf8_lossy(&output.stderr)
            );
            profile_folder.join("stamplog")
        })
        .clone()
}

fn read_json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn logging_with_tiny_parameters_writes_its_files_and_sane_figures() {
    let folder = tempfile::tempdir().unwrap();
    let args = LoggingArgs {
        sizes: vec![1000],
        messages: 30,
        warmup: 5,
        fdatasync_samples: Some(20),
        modes_size: 1000,
        modes_messages: 300,
        modes_latency_messages: 20,
        window: 32,
        rounds: 2,
        output: quiet_output(folder.path()),
    };
    let figures = bench::logging::run(args).unwrap();
    let modes: Vec<&str> = figures.modes.iter().map(|m| m.mode).collect();
    assert_eq!(modes, ["memory", "sync", "paged", "sender"]);
    for mode in &figures.modes {
        assert_eq!(mode.rounds.len(), 2, "{mode:?}");
        assert!(mode.messages_per_second > 0.0, "{mode:?}");
        assert_eq!(mode.latency.count, 20, "{mode:?}");
    }
    assert_eq!(figures.modes[0].throughput_overhead_percent, 0.0);
    assert_eq!(figures.rows.len(), 1);
    let row = &figures.rows[0];
    assert_eq!(row.size, 1000);
    assert_eq!(row.replies, 30);
    assert_eq!(
        row.log_latency.count, 30,
        "one log sample per measured message"
    );
    assert_eq!(row.fdatasync.count, 20);
    for summary in [
        &row.log_latency,
        &row.fdatasync,
        &row.end_to_end_logging,
        &row.end_to_end_no_logging,
    ] {
        assert!(
            summary.min > 0.0 && summary.p50 <= summary.p99,
            "{summary:?}"
        );
    }
    assert!(row.ratio_p50.is_finite() && row.ratio_p50 > 0.0);
    // The reply leaves only after the record is durable.
    assert!(row.end_to_end_logging.p50 >= row.log_latency.min);
    let out = folder.path().join("out");
    assert_files(
        &out,
        &[
            "logging.csv",
            "logging-end-to-end.csv",
            "logging.png",
            "logging-summary.png",
            "logging-end-to-end.png",
            "logging-modes.csv",
            "logging-modes.png",
        ],
    );
    let json = read_json(&folder.path().join("figures.json"));
    assert_eq!(json["sizes"][0]["replies"], 30);
}

#[test]
fn paged_with_tiny_parameters_counts_every_append_and_waits_at_every_switch_with_one_page() {
    let folder = tempfile::tempdir().unwrap();
    let args = PagedArgs {
        messages: 3000,
        size: 1024,
        compute_us: 1.0,
        page_size: 64 * 1024,
        pages: vec![1, 3],
        flush_interval_ms: 100,
        output: quiet_output(folder.path()),
    };
    let figures = paged::run(args).unwrap();
    let labels: Vec<&str> = figures.modes.iter().map(|m| m.label.as_str()).collect();
    assert_eq!(
        labels,
        ["no logging", "buffering only", "64KiBx1", "64KiBx3"]
    );
    for mode in &figures.modes {
        assert!(mode.run_seconds > 0.0);
        assert!(mode.buffer_full_waits <= mode.page_switches, "{mode:?}");
        if mode.mode != paged::Mode::NoLogging {
            assert_eq!(mode.appends, 3000);
            assert!(mode.page_switches > 0);
        }
    }
    // One page is synchronous writing: the page being written is the only
    // one, so every switch must wait (the seed's 100%).
    let one_page = &figures.modes[2];
    assert_eq!(one_page.buffer_full_waits, one_page.page_switches);
    assert_eq!(one_page.buffer_full_rate_percent, 100.0);
    assert!(one_page.pages_written >= 1);
    assert!(figures.modes[0].overhead_vs_no_logging_percent.abs() < 1e-9);
    let out = folder.path().join("out");
    assert_files(&out, &["paged.csv", "paged.png", "paged-buffer-full.png"]);
    let json = read_json(&folder.path().join("figures.json"));
    assert_eq!(json["modes"].as_array().unwrap().len(), 4);
}

#[test]
fn throughput_with_tiny_parameters_acknowledges_every_message() {
    let folder = tempfile::tempdir().unwrap();
    let args = ThroughputArgs {
        server_binary: Some(stamplog_binary()),
        servers_as: bench::process::ServersAs::Processes,
        sizes: vec![100],
        modes: vec![throughput::Mode::Sync, throughput::Mode::Memory],
        windows: vec![1, 8],
        messages: 200,
        window_one_messages: 40,
        pages: 2,
        page_size: 4 * 1024 * 1024,
        output: quiet_output(folder.path()),
    };
    let figures = throughput::run(args).unwrap();
    assert_eq!(figures.cells.len(), 4);
    for cell in &figures.cells {
        let expected = if cell.window == 1 { 40 } else { 200 };
        assert_eq!(cell.messages, expected, "{cell:?}");
        assert_eq!(cell.latency.count, expected);
        assert!(cell.messages_per_second > 0.0 && cell.megabytes_per_second > 0.0);
        assert!(cell.latency.p50 <= cell.latency.p99);
        if cell.mode == throughput::Mode::Sync {
            assert_eq!(cell.records_synced, expected as u64, "{cell:?}");
            assert!(cell.syncs >= 1 && cell.mean_batch >= 1.0);
        }
    }
    let ratio = figures.sync_over_memory(100, 8).unwrap();
    assert!(ratio.is_finite() && ratio > 0.0);
    let out = folder.path().join("out");
    assert_files(
        &out,
        &[
            "throughput.csv",
            "throughput-ratio.csv",
            "throughput.png",
            "throughput-100B.png",
        ],
    );
    let json = read_json(&folder.path().join("figures.json"));
    assert_eq!(json["cells"].as_array().unwrap().len(), 4);
}

#[test]
fn bench_command_line_is_consistent_and_parses_lists_with_units() {
    BenchLine::command().debug_assert();
    let line = BenchLine::parse_from([
        "bench",
        "logging",
        "--sizes",
        "100,1KB,4KiB",
        "--messages",
        "7",
        "--quiet",
    ]);
    match line.command {
        BenchCommand::Logging(args) => {
            assert_eq!(args.sizes, [100, 1000, 4096]);
            assert_eq!(args.messages, 7);
            assert!(args.output.quiet);
        }
        other => panic!("parsed as {other:?}"),
    }
    let line = BenchLine::parse_from(["bench", "throughput", "--modes", "memory,paged"]);
    match line.command {
        BenchCommand::Throughput(args) => {
            assert_eq!(
                args.modes,
                [throughput::Mode::Memory, throughput::Mode::Paged]
            );
            assert_eq!(args.windows, [1, 16, 256]);
        }
        other => panic!("parsed as {other:?}"),
    }
    assert!(BenchLine::try_parse_from(["bench", "paged", "--page-size", "lots"]).is_err());
    let admin =
        |value: &str| match BenchLine::try_parse_from(["bench", "patterns", "--admin", value]) {
            Ok(BenchLine {
                command: BenchCommand::Patterns(args),
            }) => Ok(args.admin),
            Ok(other) => panic!("parsed as {other:?}"),
            Err(error) => Err(error.to_string()),
        };
    assert_eq!(admin("off"), Ok(false));
    assert_eq!(admin("on"), Ok(true));
    assert!(admin("maybe").is_err());
    assert!(
        bench::PatternsArgs::default().admin,
        "the admin ports are on by default"
    );
}

#[test]
fn defaults_match_the_documented_workloads() {
    let logging = LoggingArgs::default();
    assert_eq!(logging.sizes, [100, 1000, 10_000, 100_000]);
    let paged = PagedArgs::default();
    assert_eq!(paged.pages, [1, 2, 3]);
    let memory = bench::MemoryArgs::default();
    assert_eq!(memory.messages, 1_000_000);
    assert_eq!(memory.window, 256);
    assert_eq!(
        paged
            .output
            .out_folder("paged")
            .to_str()
            .unwrap()
            .replace('\\', "/"),
        "bench-out/paged"
    );
}

#[test]
fn server_process_reads_the_address_and_is_killed_on_drop() {
    use std::os::unix::fs::PermissionsExt;
    let folder = tempfile::tempdir().unwrap();
    let script = folder.path().join("fake-server");
    std::fs::write(
        &script,
        "#!/bin/sh\necho \"listening on 127.0.0.1:4321\"\nexec sleep 30\n",
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let process = bench::process::ServerProcess::spawn(
        &script,
        &folder.path().join("data"),
        "127.0.0.1:0",
        &folder.path().join("stderr.log"),
    )
    .unwrap();
    assert_eq!(process.address.to_string(), "127.0.0.1:4321");
    let pid = process.id();
    assert!(bench::process::memory_usage(pid).unwrap().resident_kib > 0);
    drop(process);
    assert!(
        bench::process::memory_usage(pid).is_err(),
        "the child is gone"
    );
}

#[test]
fn server_process_that_prints_something_else_is_an_error() {
    use std::os::unix::fs::PermissionsExt;
    let folder = tempfile::tempdir().unwrap();
    let script = folder.path().join("bad-server");
    std::fs::write(&script, "#!/bin/sh\necho oops >&2\necho hello\n").unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let error = bench::process::ServerProcess::spawn(
        &script,
        &folder.path().join("data"),
        "127.0.0.1:0",
        &folder.path().join("stderr.log"),
    )
    .err()
    .expect("a server without the listening line is refused");
    let message = format!("{error:#}");
    assert!(
        message.contains("hello") && message.contains("oops"),
        "{message}"
    );
}

#[test]
fn replication_experiments_parse_their_flags_and_default_to_the_seeds_workloads() {
    let line = BenchLine::parse_from([
        "bench",
        "patterns",
        "--payloads",
        "100,1KB",
        "--durability",
        "memory",
        "--patterns",
        "one-hop,broadcast-tag",
    ]);
    match line.command {
        BenchCommand::Patterns(args) => {
            assert_eq!(args.payloads, [100, 1000]);
            assert_eq!(args.durability, [bench::replication::Durability::Memory]);
            assert_eq!(
                args.patterns,
                [client::Protocol::OneHop, client::Protocol::BroadcastTag]
            );
        }
        other => panic!("parsed as {other:?}"),
    }
    let line = BenchLine::parse_from(["bench", "duplication", "--clients", "1,3"]);
    match line.command {
        BenchCommand::Duplication(args) => assert_eq!(args.clients, [1, 3]),
        other => panic!("parsed as {other:?}"),
    }
    assert!(BenchLine::try_parse_from(["bench", "patterns", "--patterns", "two-hop"]).is_err());

    let patterns = bench::PatternsArgs::default();
    assert_eq!(patterns.messages, 1_000_000);
    assert_eq!(patterns.payloads, [100, 1000, 3000, 10_000]);
    assert_eq!(patterns.patterns, client::Protocol::PATTERNS);
    assert_eq!(patterns.window, 256);
    assert_eq!(patterns.latency_messages, 2000);
    let duplication = bench::DuplicationArgs::default();
    assert_eq!(duplication.clients, [1, 2, 4, 8]);
    assert_eq!(duplication.protocols, client::Protocol::DUPLICATION);
    assert_eq!((duplication.servers, duplication.replicas), (4, 2));
    assert_eq!(duplication.payload, 1000);
    assert_eq!(duplication.durability, bench::replication::Durability::Sync);
}

/// Writes an executable shell script standing in for `stamplog`.
fn fake_binary(folder: &Path, name: &str, script: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = folder.join(name);
    std::fs::write(&path, script).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// `ClusterProcess::spawn` of a fake binary just written. A child that
/// another test's thread forks meanwhile holds the file open for writing
/// until it execs (`ETXTBSY`, "Text file busy"), so that start is tried
/// again for up to a second.
fn spawn_fake(
    binary: &Path,
    servers: usize,
    folder: &Path,
) -> anyhow::Result<bench::process::ClusterProcess> {
    let mut tries = 0;
    loop {
        let spawned = bench::process::ClusterProcess::spawn(
            binary,
            servers,
            &folder.join("data"),
            &folder.join("stderr.log"),
        );
        match spawned {
            Err(error) if format!("{error:#}").contains("Text file busy") && tries < 50 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            other => return other,
        }
    }
}

#[test]
fn cluster_process_reads_every_server_address_and_is_killed_on_drop() {
    let folder = tempfile::tempdir().unwrap();
    let script = fake_binary(
        folder.path(),
        "fake-cluster",
        "#!/bin/sh\n\
         echo \"server 1 listening on 127.0.0.1:4001\"\n\
         echo \"server 2 listening on 127.0.0.1:4002\"\n\
         echo \"cluster ready: 2 servers, data in $5\"\n\
         exec sleep 30\n",
    );
    let process = spawn_fake(&script, 2, folder.path()).unwrap();
    let servers: Vec<String> = process
        .servers
        .iter()
        .map(|(id, address)| format!("{id}={address}"))
        .collect();
    assert_eq!(servers, ["1=127.0.0.1:4001", "2=127.0.0.1:4002"]);
    let pid = process.id();
    drop(process);
    assert!(
        bench::process::memory_usage(pid).is_err(),
        "the child is gone"
    );
}

#[test]
fn cluster_process_that_exits_early_or_announces_too_few_servers_is_an_error() {
    let folder = tempfile::tempdir().unwrap();
    let exits = fake_binary(
        folder.path(),
        "exits",
        "#!/bin/sh\necho \"no such flag\" >&2\nexit 2\n",
    );
    let spawn = |binary: &Path| {
        spawn_fake(binary, 3, folder.path())
            .err()
            .expect("the cluster is refused")
    };
    let message = format!("{:#}", spawn(&exits));
    assert!(
        message.contains("exited") && message.contains("no such flag"),
        "{message}"
    );
    let short = fake_binary(
        folder.path(),
        "short",
        "#!/bin/sh\necho \"server 1 listening on 127.0.0.1:4001\"\necho \"cluster ready: 1 servers\"\nexec sleep 30\n",
    );
    let message = format!("{:#}", spawn(&short));
    assert!(message.contains("announced 1 servers"), "{message}");
}
