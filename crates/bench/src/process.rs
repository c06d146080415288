//! A stamplog server run as a child process (so its memory can be measured
//! apart from the benchmark's, and so the demo can kill it with SIGKILL),
//! the replication experiments' servers (`Servers`: a `stamplog server`
//! process each, a `ProcessCluster`, or one `stamplog cluster` child),
//! and the resident-memory sampler.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::network::Namespaces;

/// How long the child may take to print its `listening on` line.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(20);

/// The first line the server prints on stdout, followed by its address.
const LISTENING_PREFIX: &str = "listening on ";

/// The environment variable of `stamplog server --stop-at-stdin-end`
/// (and of `stamplog cluster`'s), set for every server this module
/// starts with a pipe as its input.
const STOP_AT_STDIN_END: &str = "STAMPLOG_STOP_AT_STDIN_END";

/// A running server process; killed when dropped, so an error anywhere in
/// the experiment never leaves it behind.
pub struct ServerProcess {
    child: Child,
    pub address: SocketAddr,
    /// Where the child's stderr goes, named in errors.
    pub log_path: PathBuf,
}

impl ServerProcess {
    /// Runs `<binary> server --listen <listen> --data <data>` and waits for
    /// its `listening on ADDR` line. `listen` is `127.0.0.1:0` for a free
    /// port, or the address of a server being restarted in place.
    pub fn spawn(
        binary: &Path,
        data: &Path,
        listen: &str,
        log_path: &Path,
    ) -> anyhow::Result<ServerProcess> {
        ServerProcess::spawn_with(binary, data, listen, log_path, &[])
    }

    /// As [`ServerProcess::spawn`], with more arguments for `server` (a
    /// cluster member's `--id` and `--peer`s).
    pub fn spawn_with(
        binary: &Path,
        data: &Path,
        listen: &str,
        log_path: &Path,
        extra: &[String],
    ) -> anyhow::Result<ServerProcess> {
        ServerProcess::spawn_command(Command::new(binary), data, listen, log_path, extra)
    }

    /// As [`ServerProcess::spawn_with`], running `command` (the binary,
    /// perhaps behind `ip netns exec`) with `server` and the arguments.
    pub fn spawn_command(
        mut command: Command,
        data: &Path,
        listen: &str,
        log_path: &Path,
        extra: &[String],
    ) -> anyhow::Result<ServerProcess> {
        let log = File::create(log_path)
            .with_context(|| format!("cannot create {}", log_path.display()))?;
        let mut child = command
            .arg("server")
            .arg("--listen")
            .arg(listen)
            .arg("--data")
            .arg(data)
            .args(extra)
            // The server stops when this process ends, however it ends:
            // the pipe's end is held by `child` alone. Set in the
            // environment, which a server binary from before the setting
            // (`--server-binary`) ignores.
            .env(STOP_AT_STDIN_END, "true")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .with_context(|| format!("cannot start {:?}", command.get_program()))?;
        let stdout = child.stdout.take().expect("stdout is piped");
        let mut process = ServerProcess {
            child,
            address: SocketAddr::from(([127, 0, 0, 1], 0)),
            log_path: log_path.to_path_buf(),
        };
        let line = first_line(stdout).with_context(|| process.describe_failure())?;
        process.address = match line.trim().strip_prefix(LISTENING_PREFIX) {
            Some(address) => address
                .parse()
                .with_context(|| format!("the server printed a bad address: {line:?}"))?,
            None => bail!(
                "the server's first line is {line:?}, not `{LISTENING_PREFIX}ADDR`; {}",
                process.describe_failure()
            ),
        };
        Ok(process)
    }

    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Names the log file and quotes its end, for error messages.
    fn describe_failure(&self) -> String {
        let text = std::fs::read_to_string(&self.log_path).unwrap_or_default();
        let tail: String = text
            .chars()
            .rev()
            .take(2000)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        format!("server stderr ({}):\n{tail}", self.log_path.display())
    }

    /// Kills the server and reaps it.
    pub fn kill(mut self) -> anyhow::Result<()> {
        self.child.kill().context("cannot kill the server")?;
        self.child.wait().context("cannot reap the server")?;
        Ok(())
    }

    /// Stops the server the way it stops in service: its standard input
    /// ends (`--stop-at-stdin-end`), it closes its logs and exits. An
    /// error when it does not exit within [`STOP_GRACE`] (it is then
    /// killed) or exits with a failure.
    pub fn stop(mut self) -> anyhow::Result<()> {
        drop(self.child.stdin.take());
        let stopped = wait_for_exit(&mut self.child, "the server", STOP_GRACE);
        stopped.with_context(|| self.describe_failure())
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        // Killing an exited child fails harmlessly; reaping avoids a zombie.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Reads the first line of `stdout` within [`STARTUP_TIMEOUT`], then keeps
/// draining it on the same thread so the child never blocks on a full pipe.
fn first_line(stdout: std::process::ChildStdout) -> anyhow::Result<String> {
    let (sender, receiver) = mpsc::channel();
    std::thread::Builder::new()
        .name("server-stdout".into())
        .spawn(move || {
            let mut reader = BufReader::new(stdout);
            let mut line = String::new();
            let result = reader.read_line(&mut line).map(|_| line);
            let _ = sender.send(result);
            let _ = std::io::copy(&mut reader, &mut std::io::sink());
        })
        .context("cannot start the stdout reader")?;
    match receiver.recv_timeout(STARTUP_TIMEOUT) {
        Ok(Ok(line)) if !line.is_empty() => Ok(line),
        Ok(Ok(_)) => bail!("the server exited before printing its address"),
        Ok(Err(error)) => Err(error).context("cannot read the server's stdout"),
        Err(_) => bail!("the server printed no address within {STARTUP_TIMEOUT:?}"),
    }
}

/// The line `stamplog cluster` prints once every server listens.
const CLUSTER_READY_PREFIX: &str = "cluster ready:";

/// Where the servers of an experiment run.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ServersAs {
    /// Each server a `stamplog server` process of its own, as a cluster
    /// is deployed (one per host).
    #[default]
    Processes,
    /// Every server a thread pool of one `stamplog cluster` process, for
    /// comparison with the figures measured that way before.
    Threads,
}

/// How an experiment's cluster runs.
#[derive(Clone, Copy, Debug)]
pub struct ClusterOptions {
    /// As `stamplog cluster` does by default: TLS on every link and
    /// tokens; otherwise `--insecure`.
    pub secure: bool,
    /// Each server serves its admin port and keeps metrics, as by
    /// default; otherwise none (`--no-admin`, `--admin-listen off`).
    pub admin: bool,
    /// Separate server processes, or one process of threads.
    pub servers_as: ServersAs,
    /// Each server's `sync` logs share its journal, as by default;
    /// otherwise each log syncs alone (`--journal-bytes-max 0`,
    /// `--no-journal`).
    pub journal: bool,
    /// Worker threads of each server process's runtime
    /// (`--runtime-workers`); `None`: the server's default, one per CPU.
    /// Servers run as threads share one runtime, and take none.
    pub runtime_workers: Option<usize>,
}

impl Default for ClusterOptions {
    /// Plain links (what the experiments compare with their seeds), the
    /// admin ports on, one process per server.
    fn default() -> Self {
        ClusterOptions {
            secure: false,
            admin: true,
            servers_as: ServersAs::Processes,
            journal: true,
            runtime_workers: None,
        }
    }
}

/// An experiment's running servers, as separate processes or as one.
pub enum Servers {
    Processes(Box<ProcessCluster>),
    Threads(ClusterProcess),
}

/// Marks `folder` as the top of directory hierarchies (ext4's `T`
/// attribute, `chattr +T`), so that the file system spreads the folders
/// made in it over its block groups as it does its root's: each server's
/// data folder, and the files in it, in a part of the disk of its own, as
/// on a disk of its own. Without it, three servers making a stream at
/// once get neighbouring inodes, several to a block of the inode table,
/// and their logs' writes then share the inode writes that a tick of the
/// clock brings (docs/results.md, "Three replicas' files pay three inode
/// writes"), which replicas on their own hosts never do. Whether the
/// file system took it; one without the attribute is left as it is.
pub fn spread_subfolders(folder: &Path) -> anyhow::Result<bool> {
    use rustix::fs::{ioctl_getflags, ioctl_setflags, IFlags};
    let opened =
        std::fs::File::open(folder).with_context(|| format!("cannot open {}", folder.display()))?;
    let took = ioctl_getflags(&opened)
        .and_then(|flags| ioctl_setflags(&opened, flags | IFlags::TOPDIR))
        .is_ok();
    Ok(took)
}

impl Servers {
    /// Starts `servers` servers with their data (and logs) in `folder`
    /// as `options` say.
    pub fn start(
        binary: &Path,
        servers: usize,
        folder: &Path,
        options: ClusterOptions,
    ) -> anyhow::Result<Servers> {
        let data = folder.join("cluster");
        std::fs::create_dir_all(&data)
            .with_context(|| format!("cannot create {}", data.display()))?;
        spread_subfolders(&data)?;
        if options.servers_as == ServersAs::Threads {
            anyhow::ensure!(
                options.runtime_workers.is_none(),
                "--server-workers sets each server process's runtime: it needs --servers-as processes"
            );
            let log = folder.join("cluster-stderr.log");
            let process = ClusterProcess::spawn_secure(binary, servers, &data, &log, options)?;
            return Ok(Servers::Threads(process));
        }
        let security = match options.secure {
            true => Some(server::LocalSecurity::make(&data, servers)?),
            false => None,
        };
        let mut extra: Vec<String> = match options.admin {
            true => Vec::new(),
            false => vec!["--admin-listen".into(), "off".into()],
        };
        if !options.journal {
            extra.extend(["--journal-bytes-max".into(), "0".into()]);
        }
        if let Some(workers) = options.runtime_workers {
            extra.extend(["--runtime-workers".into(), workers.to_string()]);
        }
        let count = u32::try_from(servers).context("too many servers")?;
        let cluster = ProcessCluster::start_secure(binary, &data, count, &extra, (None, security))?;
        Ok(Servers::Processes(Box::new(cluster)))
    }

    /// Each server's id and address.
    pub fn addresses(&self) -> Vec<(u32, SocketAddr)> {
        match self {
            Servers::Processes(cluster) => (1..).zip(cluster.addresses.iter().copied()).collect(),
            Servers::Threads(process) => process.servers.clone(),
        }
    }

    /// What a client of these servers connects with.
    pub fn credentials(&self) -> anyhow::Result<client::Credentials> {
        match self {
            Servers::Processes(cluster) => cluster.credentials(),
            Servers::Threads(process) => Ok(process.credentials.clone()),
        }
    }

    /// The process ids of the servers (one, shared, for threads).
    pub fn pids(&self) -> Vec<(u32, u32)> {
        match self {
            Servers::Processes(cluster) => cluster
                .running()
                .into_iter()
                .map(|id| (id, cluster.pid(id)))
                .collect(),
            Servers::Threads(process) => {
                let pid = process.child.id();
                process.servers.iter().map(|(id, _)| (*id, pid)).collect()
            }
        }
    }

    /// Stops every server as a server stops in service, each closing its
    /// logs ([`ServerProcess::stop`]).
    pub fn stop(self) -> anyhow::Result<()> {
        match self {
            Servers::Processes(cluster) => cluster.stop(),
            Servers::Threads(process) => process.stop(),
        }
    }
}

/// A running `stamplog cluster` process: several servers in one child,
/// each on its own loopback port; killed when dropped, like
/// [`ServerProcess`].
pub struct ClusterProcess {
    child: Child,
    /// Each server's id and client address, in the order the child
    /// printed them.
    pub servers: Vec<(u32, SocketAddr)>,
    /// Where the child's stderr goes, named in errors.
    pub log_path: PathBuf,
    /// What a client of the cluster connects with (the admin token over
    /// TLS when the cluster runs secure).
    pub credentials: client::Credentials,
}

impl ClusterProcess {
    /// Runs `<binary> cluster --servers <servers> --data <data>`, reads its
    /// `server <id> listening on <addr>` lines, and returns once it prints
    /// `cluster ready: ...`.
    pub fn spawn(
        binary: &Path,
        servers: usize,
        data: &Path,
        log_path: &Path,
    ) -> anyhow::Result<ClusterProcess> {
        ClusterProcess::spawn_secure(binary, servers, data, log_path, ClusterOptions::default())
    }

    /// As [`ClusterProcess::spawn`], with the cluster's `options`.
    pub fn spawn_secure(
        binary: &Path,
        servers: usize,
        data: &Path,
        log_path: &Path,
        options: ClusterOptions,
    ) -> anyhow::Result<ClusterProcess> {
        let log = File::create(log_path)
            .with_context(|| format!("cannot create {}", log_path.display()))?;
        let mut child = Command::new(binary)
            .args(["cluster", "--servers", &servers.to_string(), "--data"])
            .arg(data)
            .args((!options.secure).then_some("--insecure"))
            .args((!options.admin).then_some("--no-admin"))
            .args((!options.journal).then_some("--no-journal"))
            .env(STOP_AT_STDIN_END, "true")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .with_context(|| format!("cannot start {}", binary.display()))?;
        let stdout = child.stdout.take().expect("stdout is piped");
        let mut process = ClusterProcess {
            child,
            servers: Vec::with_capacity(servers),
            log_path: log_path.to_path_buf(),
            credentials: client::Credentials::default(),
        };
        let lines = forward_lines(stdout)?;
        let deadline = std::time::Instant::now() + STARTUP_TIMEOUT;
        loop {
            let remaining = deadline.saturating_duration_since(std::time::Instant::now());
            let line = match lines.recv_timeout(remaining) {
                Ok(Ok(line)) => line,
                Ok(Err(error)) => {
                    return Err(error).context("cannot read the cluster's stdout");
                }
                Err(mpsc::RecvTimeoutError::Timeout) => bail!(
                    "the cluster was not ready within {STARTUP_TIMEOUT:?}; {}",
                    stderr_tail(&process.log_path)
                ),
                Err(mpsc::RecvTimeoutError::Disconnected) => bail!(
                    "the cluster exited before it was ready; {}",
                    stderr_tail(&process.log_path)
                ),
            };
            if line.trim().starts_with(CLUSTER_READY_PREFIX) {
                break;
            }
            if let Some(server) = parse_server_line(&line)? {
                process.servers.push(server);
            }
        }
        if process.servers.len() != servers {
            bail!(
                "the cluster announced {} servers, not {servers}; {}",
                process.servers.len(),
                stderr_tail(&process.log_path)
            );
        }
        if options.secure {
            // The cluster made its CA and admin token before it was ready.
            let security = server::LocalSecurity::make(data, servers)?;
            process.credentials = client::Credentials {
                token: security.admin_token.clone(),
                dialer: security.admin_dialer()?,
            };
        }
        Ok(process)
    }

    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Stops the cluster as [`ServerProcess::stop`] stops a server.
    pub fn stop(mut self) -> anyhow::Result<()> {
        drop(self.child.stdin.take());
        wait_for_exit(&mut self.child, "the cluster", STOP_GRACE)
    }
}

/// How long a server whose standard input ended has to exit before it is
/// killed.
const STOP_GRACE: Duration = Duration::from_secs(15);

/// Waits up to `grace` for `child` (`what`) to exit, and kills it when it
/// does not; an error unless it exited by itself with success.
fn wait_for_exit(child: &mut Child, what: &str, grace: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + grace;
    loop {
        if let Some(status) = child
            .try_wait()
            .with_context(|| format!("cannot reap {what}"))?
        {
            anyhow::ensure!(status.success(), "{what} exited with {status} when stopped");
            return Ok(());
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("{what} did not exit within {grace:?} of its input's end; killed");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

impl Drop for ClusterProcess {
    fn drop(&mut self) {
        // Killing an exited child fails harmlessly; reaping avoids a zombie.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Parses `server <id> listening on <addr>`; other lines are `None`.
fn parse_server_line(line: &str) -> anyhow::Result<Option<(u32, SocketAddr)>> {
    let Some(rest) = line.trim().strip_prefix("server ") else {
        return Ok(None);
    };
    let Some((id, rest)) = rest.split_once(' ') else {
        return Ok(None);
    };
    let Some(address) = rest.strip_prefix(LISTENING_PREFIX) else {
        return Ok(None);
    };
    let id = id
        .parse()
        .with_context(|| format!("the cluster printed a bad server id: {line:?}"))?;
    let address = address
        .trim()
        .parse()
        .with_context(|| format!("the cluster printed a bad address: {line:?}"))?;
    Ok(Some((id, address)))
}

/// Hands each line of `stdout` over a channel until the receiver is
/// dropped, then drains the rest, so the child never blocks on a full pipe.
fn forward_lines(
    stdout: std::process::ChildStdout,
) -> anyhow::Result<mpsc::Receiver<std::io::Result<String>>> {
    let (sender, receiver) = mpsc::channel();
    std::thread::Builder::new()
        .name("cluster-stdout".into())
        .spawn(move || {
            let mut reader = BufReader::new(stdout);
            loop {
                let mut line = String::new();
                match reader.read_line(&mut line) {
                    Ok(0) => return,
                    Ok(_) => {
                        if sender.send(Ok(line)).is_err() {
                            break;
                        }
                    }
                    Err(error) => {
                        let _ = sender.send(Err(error));
                        return;
                    }
                }
            }
            let _ = std::io::copy(&mut reader, &mut std::io::sink());
        })
        .context("cannot start the stdout reader")?;
    Ok(receiver)
}

/// Names a child's stderr file and quotes its end, for error messages.
fn stderr_tail(log_path: &Path) -> String {
    let text = std::fs::read_to_string(log_path).unwrap_or_default();
    let tail: String = text
        .chars()
        .rev()
        .take(2000)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    format!("stderr ({}):\n{tail}", log_path.display())
}

/// Resident memory of a process, from `/proc/<pid>/status`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryUsage {
    /// `VmRSS`: resident now, in KiB.
    pub resident_kib: u64,
    /// `VmHWM`: the most ever resident, in KiB.
    pub peak_kib: u64,
}

/// Reads `VmRSS` and `VmHWM` of process `pid`.
pub fn memory_usage(pid: u32) -> anyhow::Result<MemoryUsage> {
    let path = format!("/proc/{pid}/status");
    let text = std::fs::read_to_string(&path).with_context(|| format!("cannot read {path}"))?;
    let field = |name: &str| -> anyhow::Result<u64> {
        let line = text
            .lines()
            .find(|line| line.starts_with(name))
            .with_context(|| format!("{path} has no {name}"))?;
        let number = line[name.len()..].trim().trim_end_matches("kB").trim();
        number
            .parse()
            .with_context(|| format!("bad {name} line in {path}: {line:?}"))
    };
    Ok(MemoryUsage {
        resident_kib: field("VmRSS:")?,
        peak_kib: field("VmHWM:")?,
    })
}

/// A multi-server cluster of separate `stamplog server` processes on
/// loopback ports chosen up front (or each in a network namespace of its
/// own, on its own address), so every server is told every other's
/// address and a killed server starts again on its own port and data.
pub struct ProcessCluster {
    binary: PathBuf,
    data: PathBuf,
    pub addresses: Vec<SocketAddr>,
    /// Each server's admin port on loopback, reserved with `addresses`
    /// (empty in network namespaces).
    admins: Vec<SocketAddr>,
    servers: Vec<Option<ServerProcess>>,
    starts: Vec<u32>,
    extra: Vec<String>,
    /// TLS certificates and the token file every server is started with,
    /// when the cluster is secure.
    security: Option<server::LocalSecurity>,
    /// The namespaces the servers run in, when they do; last, so that
    /// the servers are dropped (killed) before their namespaces go.
    network: Option<Namespaces>,
}

impl ProcessCluster {
    /// Starts `count` servers with ids 1..=count, data in
    /// `<data>/server-<id>`, stderr in `<data>/server-<id>-start-<k>.log`,
    /// each with `extra` arguments after its `--id` and `--peer`s.
    pub fn start(
        binary: &Path,
        data: &Path,
        count: u32,
        extra: &[String],
    ) -> anyhow::Result<ProcessCluster> {
        ProcessCluster::start_in(binary, data, count, extra, None)
    }

    /// As [`ProcessCluster::start`]; with `network`, server `id` runs in
    /// the network's namespace `id` and listens on its address there.
    pub fn start_in(
        binary: &Path,
        data: &Path,
        count: u32,
        extra: &[String],
        network: Option<Namespaces>,
    ) -> anyhow::Result<ProcessCluster> {
        ProcessCluster::start_secure(binary, data, count, extra, (network, None))
    }

    /// As [`ProcessCluster::start_in`]; with `security`, every server
    /// serves TLS with its certificate and checks tokens against its file
    /// ([`ProcessCluster::credentials`] are then the admin's).
    pub fn start_secure(
        binary: &Path,
        data: &Path,
        count: u32,
        extra: &[String],
        (network, security): (Option<Namespaces>, Option<server::LocalSecurity>),
    ) -> anyhow::Result<ProcessCluster> {
        // On loopback each server's client and admin ports are reserved
        // together, all distinct: a server left to pick its admin port
        // could take a port reserved for a server not started yet.
        let (addresses, admins) = match &network {
            Some(network) => (
                (1..=count).map(|id| network.listen(id)).collect(),
                Vec::new(),
            ),
            None => {
                let mut ports = free_ports(2 * count)?;
                let admins = ports.split_off(count as usize);
                (ports, admins)
            }
        };
        let mut cluster = ProcessCluster {
            admins,
            binary: binary.to_path_buf(),
            network,
            data: data.to_path_buf(),
            servers: (0..count).map(|_| None).collect(),
            starts: vec![0; count as usize],
            addresses,
            extra: extra.to_vec(),
            security,
        };
        for id in 1..=count {
            cluster.start_server(id)?;
        }
        Ok(cluster)
    }

    pub fn data(&self) -> &Path {
        &self.data
    }

    /// A client configuration for server `id` with the cluster's
    /// credentials.
    pub fn client_config(&self, id: u32) -> anyhow::Result<client::ClientConfig> {
        let mut config = client::ClientConfig::new(self.address(id).to_string());
        config.credentials = self.credentials()?;
        Ok(config)
    }

    /// A publisher's configuration with the cluster's credentials.
    pub fn publisher_config(&self, window: usize) -> anyhow::Result<client::PublisherConfig> {
        Ok(client::PublisherConfig {
            window,
            credentials: self.credentials()?,
            ..client::PublisherConfig::default()
        })
    }

    /// What a client of this cluster connects with: the admin token over
    /// TLS for a secure cluster, nothing for another.
    pub fn credentials(&self) -> anyhow::Result<client::Credentials> {
        Ok(match &self.security {
            Some(security) => client::Credentials {
                token: security.admin_token.clone(),
                dialer: security.admin_dialer()?,
            },
            None => client::Credentials::default(),
        })
    }

    /// The namespaces the servers run in, when they do.
    pub fn network(&self) -> Option<&Namespaces> {
        self.network.as_ref()
    }

    /// Starts server `id` (again), on its own port and data.
    pub fn start_server(&mut self, id: u32) -> anyhow::Result<()> {
        let index = id as usize - 1;
        self.starts[index] += 1;
        let log = self
            .data
            .join(format!("server-{id}-start-{}.log", self.starts[index]));
        let mut extra = vec!["--id".to_string(), id.to_string()];
        for (other, address) in self.addresses.iter().enumerate() {
            if other != index {
                extra.push("--peer".into());
                extra.push(format!("{}={address}", other + 1));
            }
        }
        // Without security the cluster is insecure by choice: servers in
        // network namespaces listen beyond loopback, which a server
        // refuses unless told.
        if self.security.is_none() {
            extra.push("--insecure".to_string());
        }
        if let Some(security) = &self.security {
            let identity = security.server_identity(id);
            extra.extend([
                "--tls-cert".to_string(),
                identity.certificate.display().to_string(),
                "--tls-key".to_string(),
                identity.key.display().to_string(),
                "--tls-ca".to_string(),
                security.ca.display().to_string(),
                "--tokens".to_string(),
                security.tokens.display().to_string(),
            ]);
        }
        if !self.extra.iter().any(|arg| arg == "--admin-listen") {
            // In a namespace the admin port would be out of this
            // process's reach: none there.
            let admin = self.admins.get(index).map(SocketAddr::to_string);
            extra.extend(["--admin-listen".to_string(), admin.unwrap_or("off".into())]);
        }
        extra.extend(self.extra.iter().cloned());
        let command = match &self.network {
            Some(network) => network.command(id, &self.binary),
            None => Command::new(&self.binary),
        };
        let process = ServerProcess::spawn_command(
            command,
            &self.data.join(format!("server-{id}")),
            &self.addresses[index].to_string(),
            &log,
            &extra,
        )?;
        self.servers[index] = Some(process);
        Ok(())
    }

    /// The admin port of server `id` (reserved on loopback; none in
    /// network namespaces or when the caller set `--admin-listen`).
    pub fn admin_address(&self, id: u32) -> anyhow::Result<SocketAddr> {
        let set_by_caller = self.extra.iter().any(|arg| arg == "--admin-listen");
        let admin = self.admins.get(id as usize - 1).filter(|_| !set_by_caller);
        admin
            .copied()
            .with_context(|| format!("server {id} has no admin port this cluster reserved"))
    }

    /// Stops every running server as [`ServerProcess::stop`] does: all
    /// their inputs end at once, then each is waited for.
    pub fn stop(mut self) -> anyhow::Result<()> {
        let mut servers: Vec<ServerProcess> =
            self.servers.iter_mut().filter_map(Option::take).collect();
        for server in &mut servers {
            drop(server.child.stdin.take());
        }
        servers.into_iter().try_for_each(ServerProcess::stop)
    }

    /// Kills server `id` with SIGKILL (when it runs).
    pub fn kill(&mut self, id: u32) -> anyhow::Result<()> {
        if let Some(server) = self.servers[id as usize - 1].take() {
            server.kill()?;
        }
        Ok(())
    }

    /// Stops server `id` with SIGSTOP, as a long pause does (a stalled
    /// disk, a VM migration): the process holds its sockets and state but
    /// runs no instruction until [`resume`](Self::resume).
    pub fn pause(&self, id: u32) -> anyhow::Result<()> {
        self.signal(id, "STOP")
    }

    /// Lets a paused server `id` run again (SIGCONT).
    pub fn resume(&self, id: u32) -> anyhow::Result<()> {
        self.signal(id, "CONT")
    }

    fn signal(&self, id: u32, signal: &str) -> anyhow::Result<()> {
        let pid = self.pid(id);
        anyhow::ensure!(pid != 0, "server {id} is not running");
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid.to_string())
            .status()
            .context("cannot run kill")?;
        anyhow::ensure!(status.success(), "kill -{signal} {pid} failed: {status}");
        Ok(())
    }

    pub fn is_running(&self, id: u32) -> bool {
        self.servers[id as usize - 1].is_some()
    }

    /// The process id of server `id` (0 when it is down).
    pub fn pid(&self, id: u32) -> u32 {
        self.servers[id as usize - 1]
            .as_ref()
            .map_or(0, ServerProcess::id)
    }

    pub fn address(&self, id: u32) -> SocketAddr {
        self.addresses[id as usize - 1]
    }

    /// Ids of the servers that run.
    pub fn running(&self) -> Vec<u32> {
        (1..=self.servers.len() as u32)
            .filter(|id| self.is_running(*id))
            .collect()
    }
}

/// `count` free loopback addresses: bound, noted and released; the
/// servers bind them a moment later. They are drawn below the kernel's
/// ephemeral range (`net.ipv4.ip_local_port_range`), from which the
/// kernel takes the local port of every outgoing connection and of every
/// listener on port 0: in that moment the servers started first already
/// connect to the ones not started yet, and the other tests of the
/// process make connections of their own, any of which could otherwise
/// take a reserved port. No port is handed out twice in a process.
fn free_ports(count: u32) -> anyhow::Result<Vec<SocketAddr>> {
    static HANDED_OUT: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let (first, last) = match ephemeral_range() {
        Some((low, _)) if low > RESERVED_PORTS_FROM + 1024 => (RESERVED_PORTS_FROM, low - 1),
        // No room below the range: ports of the kernel's choosing.
        _ => return ports_of_the_kernel(count),
    };
    let mut handed_out = HANDED_OUT.lock().expect("port list lock");
    let mut addresses = Vec::new();
    let mut probes = Vec::new();
    // An order of its own each time, so that test processes running
    // side by side seldom try the same ports.
    let mut random = proto::Rng::new(proto::random_u128() as u64);
    for _ in 0..PORT_TRIES {
        if addresses.len() == count as usize {
            break;
        }
        let port = random.between(u64::from(first), u64::from(last)) as u16;
        if handed_out.contains(&port) {
            continue;
        }
        // Refused: another socket holds it.
        let Ok(probe) = probe(SocketAddr::from(([127, 0, 0, 1], port))) else {
            continue;
        };
        handed_out.push(port);
        addresses.push(probe.local_addr()?);
        probes.push(probe);
    }
    anyhow::ensure!(
        addresses.len() == count as usize,
        "found {} of {count} free loopback ports in {first}..={last}",
        addresses.len()
    );
    Ok(addresses)
}

/// Ports at or past this one are drawn by [`free_ports`]; below it are the
/// well-known and commonly configured ones.
const RESERVED_PORTS_FROM: u16 = 10_000;
/// Ports [`free_ports`] tries before it gives up.
const PORT_TRIES: usize = 10_000;

/// The kernel's ephemeral port range, when it can be read.
fn ephemeral_range() -> Option<(u16, u16)> {
    let text = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    let mut bounds = text
        .split_whitespace()
        .map(|bound| bound.parse::<u16>().ok());
    Some((bounds.next()??, bounds.next()??))
}

/// A socket bound to `address` (with `SO_REUSEADDR`) that does not
/// listen. A process forked by another thread before the probe closes
/// holds a copy of it until that process execs; a listening probe would
/// then refuse the server's bind for that moment, a bound one does not
/// (two sockets with `SO_REUSEADDR` clash only when one listens).
fn probe(address: SocketAddr) -> std::io::Result<tokio::net::TcpSocket> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.set_reuseaddr(true)?;
    socket.bind(address)?;
    Ok(socket)
}

/// `count` free loopback addresses of the kernel's choosing (port 0).
fn ports_of_the_kernel(count: u32) -> anyhow::Result<Vec<SocketAddr>> {
    let mut addresses = Vec::new();
    let mut probes = Vec::new();
    for _ in 0..count {
        let probe = probe(SocketAddr::from(([127, 0, 0, 1], 0))).context("finding a free port")?;
        addresses.push(probe.local_addr()?);
        probes.push(probe);
    }
    Ok(addresses)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn child(script: &str) -> Child {
        Command::new("sh").args(["-c", script]).spawn().unwrap()
    }

    /// Where the file system takes the attribute (ext4, as on this
    /// project's machines), servers' files made at once in their folders
    /// have inodes in blocks of their own; without it, they had one.
    #[test]
    fn servers_folders_in_a_spread_folder_hold_files_with_inodes_apart() {
        let folder = tempfile::tempdir().unwrap();
        let cluster = folder.path().join("cluster");
        std::fs::create_dir(&cluster).unwrap();
        if !spread_subfolders(&cluster).unwrap() {
            eprintln!(
                "the file system of {} has no T attribute",
                cluster.display()
            );
            return;
        }
        let files: Vec<std::path::PathBuf> = (1..=3)
            .map(|id| {
                let log = cluster.join(format!("server-{id}/streams/s/log"));
                std::fs::create_dir_all(&log).unwrap();
                log.join("00000000000000000001.seg")
            })
            .collect();
        for file in &files {
            std::fs::write(file, b"").unwrap();
        }
        assert_eq!(crate::fdatasync::inode_blocks_of(&files).unwrap(), 3);
    }

    #[test]
    fn a_stopped_process_must_exit_by_itself_with_success_within_its_grace() {
        let grace = Duration::from_millis(300);
        wait_for_exit(&mut child("exit 0"), "ok", grace).unwrap();
        let failed = wait_for_exit(&mut child("exit 3"), "failing", grace).unwrap_err();
        assert!(
            failed.to_string().contains("failing exited with"),
            "{failed}"
        );
        let mut stuck = child("sleep 30");
        let started = Instant::now();
        let error = wait_for_exit(&mut stuck, "stuck", grace).unwrap_err();
        assert!(error.to_string().contains("did not exit within"), "{error}");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "killed after its grace"
        );
        assert!(
            stuck.try_wait().unwrap().is_some(),
            "the stuck child was killed and reaped"
        );
    }

    #[test]
    fn reserved_ports_are_outside_the_kernels_range_and_never_handed_out_twice() {
        let first = free_ports(6).unwrap();
        let second = free_ports(6).unwrap();
        let mut ports: Vec<u16> = first.iter().chain(&second).map(|a| a.port()).collect();
        if let Some((low, high)) = ephemeral_range() {
            if low > RESERVED_PORTS_FROM + 1024 {
                assert!(
                    ports
                        .iter()
                        .all(|&p| (RESERVED_PORTS_FROM..low).contains(&p)),
                    "{ports:?} not below {low}..={high}"
                );
            }
        }
        ports.sort_unstable();
        ports.dedup();
        assert_eq!(ports.len(), 12, "a port handed out twice");
        // Released: a server can bind each.
        for address in first.iter().chain(&second) {
            std::net::TcpListener::bind(address).unwrap();
        }
    }

    #[test]
    fn memory_usage_of_this_process_is_positive() {
        let usage = memory_usage(std::process::id()).unwrap();
        assert!(usage.resident_kib > 0);
        assert!(usage.peak_kib >= usage.resident_kib);
    }
}
