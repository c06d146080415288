//! The binary's commands end to end: server, streams, send, tail, status,
//! demo, and clear errors for bad input.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Output, Stdio};

const BINARY: &str = env!("CARGO_BIN_EXE_stamplog");

/// A `stamplog server` process on a free port; killed when dropped.
struct Server {
    child: Child,
    address: String,
}

impl Server {
    fn start(extra: &[&str]) -> (Server, tempfile::TempDir) {
        Server::start_by(Command::new(BINARY), extra)
    }

    /// `command` runs `stamplog` with the arguments it is given (the
    /// binary itself, or a shell that sets something up first).
    fn start_by(command: Command, extra: &[&str]) -> (Server, tempfile::TempDir) {
        Server::start_with(command, extra, Stdio::null())
    }

    /// [`start_by`](Self::start_by), with the server's stderr going to
    /// `stderr`.
    fn start_with(
        mut command: Command,
        extra: &[&str],
        stderr: Stdio,
    ) -> (Server, tempfile::TempDir) {
        let data = tempfile::tempdir().unwrap();
        let mut child = command
            .args(["server", "--listen", "127.0.0.1:0", "--data"])
            .arg(data.path())
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let address = line
            .trim()
            .strip_prefix("listening on ")
            .expect("first line names the address")
            .to_string();
        (Server { child, address }, data)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_server_told_to_stop_at_the_end_of_its_input_stops_when_the_pipe_closes() {
    // As the benchmarks start theirs (the setting in the environment):
    // the parent holds the pipe, and its end, however it comes, closes it.
    let mut command = Command::new(BINARY);
    command
        .stdin(Stdio::piped())
        .env("STAMPLOG_STOP_AT_STDIN_END", "true");
    let (mut server, _data) = Server::start_by(command, &[]);
    let mut input = server.child.stdin.take().unwrap();
    input.write_all(b"anything\n").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(
        server.child.try_wait().unwrap().is_none(),
        "the server runs while its input is open"
    );
    drop(input);
    let status = stopped(&mut server.child, "when its input ended");
    assert!(status.success(), "a clean stop: {status}");
    // With its input still open, SIGTERM stops it as before: the read
    // that waits holds nothing up.
    let mut command = Command::new(BINARY);
    command.stdin(Stdio::piped());
    let (mut server, _data) = Server::start_by(command, &["--stop-at-stdin-end"]);
    let _input = server.child.stdin.take().unwrap();
    let pid = server.child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let status = stopped(&mut server.child, "on SIGTERM with its input open");
    assert!(status.success(), "a clean stop: {status}");
}

/// Waits up to 20 s for `child` to exit.
fn stopped(child: &mut Child, when: &str) -> std::process::ExitStatus {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the server did not stop {when}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

fn run(args: &[&str], input: Option<&str>) -> Output {
    let mut child = Command::new(BINARY)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    if let Some(text) = input {
        stdin.write_all(text.as_bytes()).unwrap();
    }
    drop(stdin);
    child.wait_with_output().unwrap()
}

/// Runs `stamplog` with `args`, which it must refuse, saying `reason`.
fn assert_refused(args: &[&str], reason: &str) {
    let refused = run(args, None);
    assert!(!refused.status.success(), "{args:?} was taken");
    let said = text(&refused.stderr);
    assert!(said.contains(reason), "{said}");
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn send_then_tail_prints_every_message_with_its_version() {
    let (server, _data) = Server::start(&[]);
    let address = server.address.as_str();
    let sent = run(
        &[
            "send",
            "-s",
            address,
            "--stream",
            "greetings",
            "--create",
            "hello",
            "world",
        ],
        None,
    );
    assert!(sent.status.success(), "{}", text(&sent.stderr));
    let lines: Vec<String> = text(&sent.stdout).lines().map(str::to_string).collect();
    assert_eq!(lines.len(), 2);
    assert!(
        lines[0].starts_with("version 1 ") && lines[0].contains("acked by servers 1"),
        "{lines:?}"
    );
    let piped = run(
        &["send", "-s", address, "--stream", "greetings"],
        Some("third\nfourth\n"),
    );
    assert!(piped.status.success(), "{}", text(&piped.stderr));
    assert!(text(&piped.stdout).contains("version 4 "));
    let tailed = run(&["tail", "-s", address, "--stream", "greetings"], None);
    assert!(tailed.status.success(), "{}", text(&tailed.stderr));
    let payloads: Vec<String> = text(&tailed.stdout)
        .lines()
        .map(|line| line.split('\t').next_back().unwrap().to_string())
        .collect();
    assert_eq!(payloads, vec!["hello", "world", "third", "fourth"]);
    let status = run(&["status", "--json", "-s", address], None);
    let json: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(json["streams"][0]["name"], "greetings");
    assert_eq!(json["streams"][0]["last_version"], 4);
}

#[test]
fn a_local_cluster_forms_without_a_server_refusing_its_peers_control_connections() {
    // The servers start together: one asks the others for votes before
    // their control planes are up. Each waits for its own rather than
    // refusing the connection with an error its peer cannot read.
    let data = tempfile::tempdir().unwrap();
    let log = tempfile::NamedTempFile::new().unwrap();
    let mut child = Command::new(BINARY)
        .args([
            "cluster",
            "--servers",
            "3",
            "--insecure",
            "--no-admin",
            "--data",
        ])
        .arg(data.path().join("cluster"))
        .stdout(Stdio::piped())
        .stderr(log.reopen().unwrap())
        .spawn()
        .unwrap();
    let mut ready = false;
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        if line.unwrap().starts_with("cluster ready") {
            ready = true;
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    let log = std::fs::read_to_string(log.path()).unwrap();
    // Ready: every server joined. The refusals came before, during the
    // first election.
    assert!(ready, "{log}");
    assert!(!log.contains("does not parse"), "{log}");
}

#[test]
fn a_server_announces_the_address_it_is_told_to_advertise() {
    // Another loopback address than the one it listens on, with the
    // listener's port: what peers and clients are told to dial.
    let (server, _data) = Server::start(&["--advertise", "127.0.0.9"]);
    let address = server.address.as_str();
    let port = address.rsplit_once(':').unwrap().1;
    let status = run(&["status", "--json", "-s", address], None);
    let json: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(json["address"], format!("127.0.0.9:{port}"), "{json}");
    assert_refused(&["server", "--advertise", "a b"], "--advertise");
}

#[test]
fn streams_are_created_listed_and_deleted_from_the_command_line() {
    let (server, _data) = Server::start(&[]);
    let address = server.address.as_str();
    let created = run(
        &[
            "streams",
            "-s",
            address,
            "create",
            "events",
            "--durability",
            "paged",
            "--pages",
            "3",
        ],
        None,
    );
    assert!(created.status.success(), "{}", text(&created.stderr));
    let listed = run(&["streams", "-s", address, "list"], None);
    assert!(text(&listed.stdout).contains("events"));
    assert!(text(&listed.stdout).contains("Paged"));
    let deleted = run(&["streams", "-s", address, "delete", "events"], None);
    assert!(deleted.status.success());
    let again = run(&["streams", "-s", address, "delete", "events"], None);
    assert!(!again.status.success());
    assert!(
        text(&again.stderr).contains("no stream named \"events\""),
        "{}",
        text(&again.stderr)
    );
}

/// The soft and hard limits on open files of process `pid`.
fn open_files_limits(pid: u32) -> (u64, u64) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits
        .lines()
        .find(|line| line.starts_with("Max open files"))
        .expect("/proc/PID/limits names the open-file limit");
    let numbers: Vec<u64> = line
        .split_whitespace()
        .filter_map(|word| word.parse().ok())
        .collect();
    (numbers[0], numbers[1])
}

/// Each replica keeps its segment open, so a server started under a soft
/// limit of 256 open files (many systems give 1,024) stopped creating
/// streams at about 240 ("Too many open files"). A server raises its
/// soft limit to the hard one on opening.
#[test]
fn a_server_started_under_a_low_open_files_limit_raises_it_and_holds_more_streams() {
    const SOFT: u64 = 256;
    const STREAMS: usize = 300;
    let (_, hard) = open_files_limits(std::process::id());
    assert!(
        hard > 2 * SOFT,
        "this test needs a hard limit on open files above {} (it is {hard})",
        2 * SOFT
    );
    let mut shell = Command::new("sh");
    shell
        .arg("-c")
        .arg(format!("ulimit -Sn {SOFT} && exec \"$0\" \"$@\""))
        .arg(BINARY);
    let (server, _data) = Server::start_by(shell, &[]);
    let pid = server.child.id();
    assert_eq!(
        open_files_limits(pid),
        (hard, hard),
        "raised to the hard limit"
    );
    let address = server.address.as_str();
    for index in 1..=STREAMS {
        let name = format!("s{index}");
        let created = run(&["streams", "-s", address, "create", &name], None);
        assert!(
            created.status.success(),
            "stream {index}: {}",
            text(&created.stderr)
        );
    }
    let open = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count();
    assert!(
        open as u64 > SOFT,
        "{open} files open: past the limit the server started with"
    );
    let last = format!("s{STREAMS}");
    let sent = run(&["send", "-s", address, "--stream", &last, "hello"], None);
    assert!(sent.status.success(), "{}", text(&sent.stderr));
    assert!(text(&sent.stdout).starts_with("version 1 "));
}

#[test]
fn bad_input_gets_a_clear_error_and_a_non_zero_exit() {
    let unreachable = run(&["status", "-s", "127.0.0.1:1"], None);
    assert!(!unreachable.status.success());
    assert!(
        text(&unreachable.stderr).contains("cannot connect to 127.0.0.1:1"),
        "{}",
        text(&unreachable.stderr)
    );
    let (server, _data) = Server::start(&[]);
    let unknown = run(
        &["send", "-s", &server.address, "--stream", "nope", "x"],
        None,
    );
    assert!(!unknown.status.success());
    assert!(
        text(&unknown.stderr).contains("no stream named"),
        "{}",
        text(&unknown.stderr)
    );
    let bad_mode = run(&["streams", "create", "x", "--durability", "fast"], None);
    assert!(!bad_mode.status.success());
    assert!(text(&bad_mode.stderr).contains("invalid value 'fast'"));
}

#[test]
fn the_config_file_sets_keys_and_flags_override_them() {
    let folder = tempfile::tempdir().unwrap();
    let config = folder.path().join("stamplog.toml");
    std::fs::write(
        &config,
        "message_bytes_max = 100\nlisten = \"127.0.0.1:1\"\n",
    )
    .unwrap();
    let config_arg = config.to_str().unwrap();
    let (server, _data) = Server::start(&["--config", config_arg]);
    let address = server.address.as_str();
    let fits = run(
        &[
            "send",
            "-s",
            address,
            "--stream",
            "small",
            "--create",
            &"x".repeat(100),
        ],
        None,
    );
    assert!(fits.status.success(), "{}", text(&fits.stderr));
    let too_big = run(
        &["send", "-s", address, "--stream", "small", &"x".repeat(101)],
        None,
    );
    assert!(!too_big.status.success());
    assert!(
        text(&too_big.stderr).contains("exceeds the limit of 100 bytes"),
        "{}",
        text(&too_big.stderr)
    );
    std::fs::write(&config, "no_such_key = 1\n").unwrap();
    assert_refused(&["server", "--config", config_arg], "no_such_key");
}

/// A server's `/metrics` text, from the admin port its stderr names.
fn metrics_of(extra: &[&str]) -> String {
    let extra = [&["--admin-listen", "127.0.0.1:0"], extra].concat();
    let (mut server, _data) = Server::start_with(Command::new(BINARY), &extra, Stdio::piped());
    // Read until the admin port's line, and kept open while the server runs.
    let mut stderr = BufReader::new(server.child.stderr.take().unwrap()).lines();
    let admin: std::net::SocketAddr = stderr
        .by_ref()
        .map(Result::unwrap)
        .find_map(|line| {
            let url = line.strip_prefix("admin port http://")?;
            Some(url.split('/').next().unwrap().parse().unwrap())
        })
        .expect("the server names its admin port");
    let timeout = std::time::Duration::from_secs(10);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (code, body) = runtime
        .block_on(server::observe::get(admin, "/metrics", timeout))
        .unwrap();
    assert_eq!(code, 200, "{body}");
    body
}

#[test]
fn a_server_runs_on_as_many_runtime_workers_as_it_is_told() {
    for workers in ["1", "3"] {
        let metrics = metrics_of(&["--runtime-workers", workers]);
        let line = format!("\nstamplog_runtime_workers {workers}.0\n");
        assert!(metrics.contains(&line), "{line:?} not in {metrics}");
    }
    assert_refused(
        &["server", "--runtime-workers", "0"],
        "runtime_workers must be between 1 and 1024",
    );
}

#[test]
fn the_journal_goes_where_journal_dir_says() {
    let elsewhere = tempfile::tempdir().unwrap();
    let folder = elsewhere.path().join("journal");
    let (server, data) = Server::start(&["--journal-dir", folder.to_str().unwrap()]);
    let address = server.address.as_str();
    let sent = run(
        &["send", "-s", address, "--stream", "j", "--create", "hello"],
        None,
    );
    assert!(sent.status.success(), "{}", text(&sent.stderr));
    assert!(
        folder.join("journal.wal").is_file(),
        "the journal is in --journal-dir"
    );
    assert!(
        !data.path().join("journal.wal").exists(),
        "and not in the data folder"
    );
}

#[test]
fn the_demo_survives_a_sigkill_with_nothing_lost_or_duplicated() {
    let demo = run(
        &["demo", "--messages", "3000", "--size", "64", "--quiet"],
        None,
    );
    let stdout = text(&demo.stdout);
    assert!(demo.status.success(), "{stdout}\n{}", text(&demo.stderr));
    assert!(stdout.contains("(the primary) with SIGKILL"), "{stdout}");
    for figure in [
        "lost acknowledged messages",
        "duplicated messages in the log",
        "gaps in versions",
        "versions the replicas disagree on",
    ] {
        let line = stdout
            .lines()
            .find(|l| l.contains(figure))
            .unwrap_or_else(|| panic!("no {figure}: {stdout}"));
        assert!(line.trim_end().ends_with(" 0"), "{line}");
    }
}

#[test]
fn five_sigkills_under_load_lose_and_duplicate_nothing() {
    let demo = run(
        &[
            "demo",
            "--messages",
            "20000",
            "--size",
            "100",
            "--kills",
            "5",
            "--quiet",
        ],
        None,
    );
    let stdout = text(&demo.stdout);
    assert!(demo.status.success(), "{stdout}\n{}", text(&demo.stderr));
    assert_eq!(stdout.matches(") with SIGKILL").count(), 5, "{stdout}");
    let restarts = stdout
        .lines()
        .find(|l| l.contains("server kills and restarts"))
        .unwrap();
    assert!(restarts.trim_end().ends_with(" 5"), "{restarts}");
    let acknowledged = stdout
        .lines()
        .find(|l| l.contains("messages acknowledged"))
        .unwrap();
    assert!(
        acknowledged.trim_end().ends_with(" 20000"),
        "{acknowledged}"
    );
    for figure in [
        "lost acknowledged messages",
        "duplicated messages in the log",
        "gaps in versions",
    ] {
        let line = stdout.lines().find(|l| l.contains(figure)).unwrap();
        assert!(line.trim_end().ends_with(" 0"), "{line}");
    }
}

#[test]
fn check_judges_a_kept_demo_run_and_catches_a_tampered_history_or_log() {
    let folder = tempfile::tempdir().unwrap();
    let data = folder.path().join("run");
    let history = folder.path().join("history.txt");
    let demo = run(
        &[
            "demo",
            "--messages",
            "2000",
            "--size",
            "64",
            "--quiet",
            "--data",
            data.to_str().unwrap(),
            "--history",
            history.to_str().unwrap(),
        ],
        None,
    );
    assert!(demo.status.success(), "{}", text(&demo.stderr));
    let server_data = data.join("server-2");
    let check = |history: &std::path::Path| {
        let mut arguments = vec![
            "check".to_string(),
            "--stream".into(),
            "demo".into(),
            "--history".into(),
            history.to_str().unwrap().into(),
        ];
        for id in 1..=3 {
            arguments.push("--data".into());
            arguments.push(data.join(format!("server-{id}")).to_str().unwrap().into());
        }
        let arguments: Vec<&str> = arguments.iter().map(String::as_str).collect();
        run(&arguments, None)
    };
    let clean = check(&history);
    assert!(
        clean.status.success(),
        "{}\n{}",
        text(&clean.stdout),
        text(&clean.stderr)
    );

    // An ack that claims a version the message does not hold.
    let lines = std::fs::read_to_string(&history).unwrap();
    let mut tampered: Vec<String> = lines.lines().map(str::to_string).collect();
    let position = tampered
        .iter()
        .position(|l| l.starts_with("acked "))
        .unwrap();
    let mut fields: Vec<String> = tampered[position].split(' ').map(str::to_string).collect();
    fields[4] = (fields[4].parse::<u64>().unwrap() + 1).to_string();
    tampered[position] = fields.join(" ");
    let wrong = folder.path().join("wrong.txt");
    std::fs::write(&wrong, tampered.join("\n")).unwrap();
    let caught = check(&wrong);
    assert!(!caught.status.success());
    assert!(
        text(&caught.stderr).contains("found violations"),
        "{}",
        text(&caught.stderr)
    );

    // A damaged record in the middle of the log is refused, not skipped.
    let log = server_data.join("streams/demo/log/00000000000000000001.seg");
    let mut bytes = std::fs::read(&log).unwrap();
    bytes[1000] ^= 0x40;
    std::fs::write(&log, &bytes).unwrap();
    let corrupt = check(&history);
    assert!(!corrupt.status.success());
    assert!(
        text(&corrupt.stderr).contains("log corrupt"),
        "{}",
        text(&corrupt.stderr)
    );
}

#[test]
fn certs_and_tokens_made_by_the_cli_secure_a_server_end_to_end() {
    let folder = tempfile::tempdir().unwrap();
    let tls = folder.path().join("tls");
    let tls_arg = tls.to_str().unwrap();
    let made = run(&["certs", "--out", tls_arg, "--servers", "1"], None);
    assert!(made.status.success(), "{}", text(&made.stderr));
    let tokens = folder.path().join("tokens.toml");
    let tokens_arg = tokens.to_str().unwrap();
    let token_of = |args: &[&str]| {
        let output = run(args, None);
        assert!(output.status.success(), "{}", text(&output.stderr));
        text(&output.stdout).trim().to_string()
    };
    let admin = token_of(&[
        "token",
        "--name",
        "ops",
        "--admin",
        "*",
        "--produce",
        "*",
        "--consume",
        "*",
        "--file",
        tokens_arg,
    ]);
    let reader = token_of(&[
        "token",
        "--name",
        "reader",
        "--consume",
        "a.*",
        "--file",
        tokens_arg,
    ]);
    assert!(
        !std::fs::read_to_string(&tokens).unwrap().contains(&admin),
        "the file holds hashes only"
    );
    let file = |name: &str| tls.join(name).to_str().unwrap().to_string();
    let (cert, key, ca) = (
        file("server-1.pem"),
        file("server-1-key.pem"),
        file("ca.pem"),
    );
    let (server, _data) = Server::start(&[
        "--tls-cert",
        &cert,
        "--tls-key",
        &key,
        "--tls-ca",
        &ca,
        "--tokens",
        tokens_arg,
    ]);
    let address = server.address.as_str();
    let send = |token: &str, stream: &str| {
        run(
            &[
                "send", "-s", address, "--ca", &ca, "--token", token, "--stream", stream,
                "--create", "hello",
            ],
            None,
        )
    };
    let sent = send(&admin, "a.one");
    assert!(sent.status.success(), "{}", text(&sent.stderr));
    let refused = send(&reader, "a.one");
    assert!(!refused.status.success());
    assert!(
        text(&refused.stderr).contains("produce"),
        "{}",
        text(&refused.stderr)
    );
    let tail = run(
        &[
            "tail", "-s", address, "--ca", &ca, "--token", &reader, "--stream", "a.one",
        ],
        None,
    );
    assert!(tail.status.success(), "{}", text(&tail.stderr));
    assert!(
        text(&tail.stdout).contains("hello"),
        "{}",
        text(&tail.stdout)
    );
    // Without the CA the client speaks plaintext, and the server closes.
    let plain = run(&["status", "-s", address, "--token", &admin], None);
    assert!(!plain.status.success());
    let wrong = run(
        &["status", "-s", address, "--ca", &ca, "--token", "stl_wrong"],
        None,
    );
    assert!(!wrong.status.success());
    assert!(
        text(&wrong.stderr).contains("not known"),
        "{}",
        text(&wrong.stderr)
    );
}
