//! A `stamplog server` child process, for the demo: started on a port,
//! killed with SIGKILL, restarted on the same port.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use anyhow::Context;

/// A running server process; killed when dropped.
pub struct ServerProcess {
    child: Child,
    pub address: SocketAddr,
}

impl ServerProcess {
    /// Starts `stamplog server` from this very binary and waits for its
    /// `listening on ADDRESS` line.
    pub fn start(data: &Path, listen: &str) -> anyhow::Result<ServerProcess> {
        let binary = std::env::current_exe().context("finding the stamplog binary")?;
        let mut child = Command::new(binary)
            .args(["server", "--listen", listen, "--data"])
            .arg(data)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("starting the server process")?;
        let stdout = child.stdout.take().expect("stdout is piped");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .context("reading the server's first line")?;
        let address = line
            .trim()
            .strip_prefix("listening on ")
            .with_context(|| format!("the server did not start: {line:?}"))?
            .parse()
            .context("parsing the server's address")?;
        Ok(ServerProcess { child, address })
    }

    /// SIGKILL: the process gets no chance to flush anything.
    pub fn kill(mut self) -> anyhow::Result<()> {
        self.child.kill().context("killing the server")?;
        self.child.wait().context("waiting for the killed server")?;
        Ok(())
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
