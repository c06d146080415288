//! Servers on separate addresses, each in a network namespace of its own,
//! and partitions between them (issue 17: the cluster in the real world).
//!
//! The layout, made by [`Namespaces::create`] and removed when it is
//! dropped:
//!
//! ```text
//!   this process (the clients)         router namespace            server i
//!   10.O.0.1 ── veth ── 10.O.0.2 [ forwards, drops by rule ] 10.O.i.1 ── veth ── 10.O.i.2
//! ```
//!
//! Every packet between two servers, and between a client and a server,
//! crosses the router namespace. A cut from server A to server B is a
//! policy rule there (`ip rule add from A to B blackhole`): A's packets to
//! B vanish silently, as on a real network that lost a link, while B's
//! packets to A and every client's packets still pass. Both directions
//! make a partition, one makes a one-way partition, and adding and
//! removing them in turn makes a flapping link. Only the router's rules
//! change; the servers see nothing but silence.
//!
//! Creating namespaces needs root (CAP_NET_ADMIN) and the `ip` tool;
//! [`Namespaces::create`] says clearly when either is missing, and the
//! tests skip with that message unless `STAMPLOG_REQUIRE_NETNS` is set.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

use anyhow::{bail, Context};

/// The port every server listens on inside its own namespace.
pub const SERVER_PORT: u16 = 7000;

/// Set (to anything) to make the namespace tests fail rather than skip
/// where namespaces cannot be made (CI sets it).
pub const REQUIRE_ENV: &str = "STAMPLOG_REQUIRE_NETNS";

/// Networks made by this process so far: each gets its own names.
static NETWORKS: AtomicU32 = AtomicU32::new(0);

/// A router namespace and one namespace per server, with the cuts in
/// force. Removes everything it made when dropped.
pub struct Namespaces {
    /// Prefix of every name: `sl<pid>n<k>`.
    prefix: String,
    /// The second octet of every address: `10.<octet>.x.y`.
    octet: u8,
    servers: u32,
    /// The cuts in force, as `(from, to)` server ids.
    cuts: Mutex<BTreeSet<(u32, u32)>>,
}

impl Namespaces {
    /// Makes the router and `servers` server namespaces (ids 1..=servers).
    pub fn create(servers: u32) -> anyhow::Result<Namespaces> {
        anyhow::ensure!(
            (1..=200).contains(&servers),
            "between 1 and 200 servers in namespaces"
        );
        if NETWORKS.load(Ordering::Relaxed) == 0 {
            remove_stale();
        }
        let number = NETWORKS.fetch_add(1, Ordering::Relaxed);
        let prefix = format!("sl{}n{number}", std::process::id() % 1_000_000);
        let octet = free_octet(std::process::id().wrapping_add(number))?;
        let network = Namespaces {
            prefix,
            octet,
            servers,
            cuts: Mutex::new(BTreeSet::new()),
        };
        // From here on, a failure drops `network`, which removes whatever
        // was made.
        network.build().context(
            "cannot make network namespaces (they need root, CAP_NET_ADMIN and the `ip` tool)",
        )?;
        Ok(network)
    }

    /// Says why namespaces cannot be made here, or `None` when they can.
    pub fn unavailable() -> Option<String> {
        match Namespaces::create(1) {
            Ok(_) => None,
            Err(error) => Some(format!("{error:#}")),
        }
    }

    fn build(&self) -> anyhow::Result<()> {
        let router = self.router();
        let octet = self.octet;
        ip(&["netns", "add", &router])?;
        ip(&["-n", &router, "link", "set", "lo", "up"])?;
        run(Command::new("ip").args([
            "netns",
            "exec",
            &router,
            "sysctl",
            "-qw",
            "net.ipv4.ip_forward=1",
        ]))?;
        // The clients' side: this namespace to the router.
        let outside = format!("{}c", self.prefix);
        ip(&[
            "link", "add", &outside, "type", "veth", "peer", "name", "c0", "netns", &router,
        ])?;
        ip(&[
            "addr",
            "add",
            &format!("10.{octet}.0.1/24"),
            "dev",
            &outside,
        ])?;
        ip(&["link", "set", &outside, "up"])?;
        ip(&[
            "-n",
            &router,
            "addr",
            "add",
            &format!("10.{octet}.0.2/24"),
            "dev",
            "c0",
        ])?;
        ip(&["-n", &router, "link", "set", "c0", "up"])?;
        ip(&[
            "route",
            "add",
            &format!("10.{octet}.0.0/16"),
            "via",
            &format!("10.{octet}.0.2"),
        ])?;
        for id in 1..=self.servers {
            self.build_server(id)?;
        }
        Ok(())
    }

    fn build_server(&self, id: u32) -> anyhow::Result<()> {
        let (router, name, octet) = (self.router(), self.server(id), self.octet);
        let inside = format!("r{id}");
        ip(&["netns", "add", &name])?;
        ip(&["-n", &name, "link", "set", "lo", "up"])?;
        ip(&[
            "-n", &router, "link", "add", &inside, "type", "veth", "peer", "name", "eth0", "netns",
            &name,
        ])?;
        ip(&[
            "-n",
            &router,
            "addr",
            "add",
            &format!("10.{octet}.{id}.1/24"),
            "dev",
            &inside,
        ])?;
        ip(&["-n", &router, "link", "set", &inside, "up"])?;
        ip(&[
            "-n",
            &name,
            "addr",
            "add",
            &format!("10.{octet}.{id}.2/24"),
            "dev",
            "eth0",
        ])?;
        ip(&["-n", &name, "link", "set", "eth0", "up"])?;
        ip(&[
            "-n",
            &name,
            "route",
            "add",
            "default",
            "via",
            &format!("10.{octet}.{id}.1"),
        ])
    }

    fn router(&self) -> String {
        format!("{}r", self.prefix)
    }

    fn server(&self, id: u32) -> String {
        format!("{}s{id}", self.prefix)
    }

    /// Server `id`'s own address.
    pub fn address(&self, id: u32) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(10, self.octet, id as u8, 2))
    }

    /// Where server `id` listens: its address and [`SERVER_PORT`].
    pub fn listen(&self, id: u32) -> SocketAddr {
        SocketAddr::new(self.address(id), SERVER_PORT)
    }

    /// A command that runs `binary` inside server `id`'s namespace (`ip
    /// netns exec` replaces itself with the program, so the child's
    /// process id is the server's, for signals).
    pub fn command(&self, id: u32, binary: &Path) -> Command {
        let mut command = Command::new("ip");
        command
            .arg("netns")
            .arg("exec")
            .arg(self.server(id))
            .arg(binary);
        command
    }

    /// Server `from`'s packets to server `to` are dropped from now on.
    pub fn cut(&self, from: u32, to: u32) -> anyhow::Result<()> {
        let mut cuts = self.cuts.lock().expect("cuts lock");
        if cuts.insert((from, to)) {
            self.rule("add", from, to)?;
        }
        Ok(())
    }

    /// Server `from`'s packets reach server `to` again.
    pub fn mend(&self, from: u32, to: u32) -> anyhow::Result<()> {
        let mut cuts = self.cuts.lock().expect("cuts lock");
        if cuts.remove(&(from, to)) {
            self.rule("del", from, to)?;
        }
        Ok(())
    }

    /// Cuts both directions between every server of `side` and every
    /// server not in it; clients still reach everyone.
    pub fn partition(&self, side: &[u32]) -> anyhow::Result<()> {
        for &inside in side {
            for outside in (1..=self.servers).filter(|id| !side.contains(id)) {
                self.cut(inside, outside)?;
                self.cut(outside, inside)?;
            }
        }
        Ok(())
    }

    /// Removes every cut.
    pub fn heal(&self) -> anyhow::Result<()> {
        let cuts: Vec<(u32, u32)> = self
            .cuts
            .lock()
            .expect("cuts lock")
            .iter()
            .copied()
            .collect();
        for (from, to) in cuts {
            self.mend(from, to)?;
        }
        Ok(())
    }

    fn rule(&self, action: &str, from: u32, to: u32) -> anyhow::Result<()> {
        ip(&[
            "-n",
            &self.router(),
            "rule",
            action,
            "from",
            &self.address(from).to_string(),
            "to",
            &self.address(to).to_string(),
            "blackhole",
        ])
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        // Removing a namespace removes the veth ends in it, and with them
        // their peers and the route through them; each step may already
        // be gone after a failure half-way.
        for id in 1..=self.servers {
            let _ = ip(&["netns", "del", &self.server(id)]);
        }
        let _ = ip(&["netns", "del", &self.router()]);
        let _ = ip(&["link", "del", &format!("{}c", self.prefix)]);
    }
}

/// Removes what a process that made networks and died without cleaning
/// up (SIGKILL) left: namespaces `sl<pid>n<k>...` and the veth
/// `sl<pid>n<k>c` of a pid that no longer runs.
fn remove_stale() {
    let Ok(listed) = Command::new("ip").args(["netns", "list"]).output() else {
        return;
    };
    let listed = String::from_utf8_lossy(&listed.stdout).into_owned();
    let mut prefixes = BTreeSet::new();
    for name in listed
        .lines()
        .filter_map(|line| line.split_whitespace().next())
    {
        let Some(rest) = name.strip_prefix("sl") else {
            continue;
        };
        let Some((pid, tail)) = rest.split_once('n') else {
            continue;
        };
        let number: String = tail.chars().take_while(char::is_ascii_digit).collect();
        let Ok(pid) = pid.parse::<u32>() else {
            continue;
        };
        if number.is_empty() || Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let _ = ip(&["netns", "del", name]);
        prefixes.insert(format!("sl{pid}n{number}"));
    }
    for prefix in prefixes {
        let _ = ip(&["link", "del", &format!("{prefix}c")]);
    }
}

/// A second octet for `10.x.0.0/16` that no route of this machine uses,
/// starting from one derived from `seed`.
fn free_octet(seed: u32) -> anyhow::Result<u8> {
    let routes = Command::new("ip")
        .args(["-4", "route", "show"])
        .output()
        .context("cannot run `ip route show` (is iproute2 installed?)")?;
    let routes = String::from_utf8_lossy(&routes.stdout);
    let addresses = Command::new("ip")
        .args(["-4", "addr", "show"])
        .output()
        .context("cannot run `ip addr show`")?;
    let addresses = String::from_utf8_lossy(&addresses.stdout);
    for step in 0..200u32 {
        let octet = 20 + ((seed + step) % 200) as u8;
        let prefix = format!("10.{octet}.");
        if !routes.contains(&prefix) && !addresses.contains(&prefix) {
            return Ok(octet);
        }
    }
    bail!("no free 10.x.0.0/16 range for the test network")
}

/// Runs `ip <args>`, an error naming the command and what it printed.
fn ip(args: &[&str]) -> anyhow::Result<()> {
    let mut command = Command::new("ip");
    command.args(args);
    run(&mut command)
}

fn run(command: &mut Command) -> anyhow::Result<()> {
    let output = command
        .output()
        .with_context(|| format!("cannot run {command:?}"))?;
    if !output.status.success() {
        bail!(
            "{command:?} failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::time::Duration;

    /// Tries to reach `to` from inside server `from`'s namespace (through
    /// a tiny program run there): true when it connects within a second.
    fn reaches(network: &Namespaces, from: u32, to: SocketAddr) -> bool {
        let script = format!(
            "import socket,sys\ntry:\n socket.create_connection(('{}',{}),timeout=1)\nexcept OSError:\n sys.exit(1)",
            to.ip(),
            to.port()
        );
        let mut command = Command::new("ip");
        command.args([
            "netns",
            "exec",
            &network.server(from),
            "python3",
            "-c",
            &script,
        ]);
        command.status().is_ok_and(|status| status.success())
    }

    #[test]
    fn cuts_drop_one_direction_and_heal_restores_it() {
        if let Some(why) = Namespaces::unavailable() {
            assert!(
                std::env::var_os(REQUIRE_ENV).is_none(),
                "{REQUIRE_ENV} is set but namespaces are unavailable: {why}"
            );
            eprintln!("SKIPPED: network namespaces unavailable here: {why}");
            return;
        }
        if Command::new("python3").arg("--version").output().is_err() {
            eprintln!("SKIPPED: python3 (the probe inside a namespace) is missing");
            return;
        }
        let network = Namespaces::create(2).unwrap();
        // A listener in server 2's namespace.
        let address = network.listen(2);
        let mut listener = Command::new("ip")
            .args(["netns", "exec", &network.server(2), "python3", "-c"])
            .arg(format!(
                "import socket\ns=socket.socket()\ns.bind(('{}',{}))\ns.listen(16)\nprint('up',flush=True)\nwhile True:\n c,_=s.accept(); c.close()",
                address.ip(),
                address.port()
            ))
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut up = [0u8; 3];
        listener.stdout.take().unwrap().read_exact(&mut up).unwrap();
        let target = network.listen(2);
        assert!(reaches(&network, 1, target), "no cut: 1 reaches 2");
        network.cut(1, 2).unwrap();
        assert!(
            !reaches(&network, 1, target),
            "cut 1 -> 2: 1 must not reach 2"
        );
        // This process (a client) still reaches server 2.
        let mut client = std::net::TcpStream::connect_timeout(&target, Duration::from_secs(1))
            .expect("clients pass a cut between servers");
        let _ = client.write_all(b"x");
        network.heal().unwrap();
        assert!(reaches(&network, 1, target), "healed: 1 reaches 2 again");
        let _ = listener.kill();
        let _ = listener.wait();
        let names = network.prefix.clone();
        drop(network);
        let left = Command::new("ip").args(["netns", "list"]).output().unwrap();
        assert!(
            !String::from_utf8_lossy(&left.stdout).contains(&names),
            "the namespaces are removed"
        );
    }
}
