//! CPU time per message and per role: the user + system time of the
//! client (this process) and of each server process, read from `/proc`
//! before and after a run and divided by the messages it sent. A stream's
//! primary and its backups are separate processes when the servers run
//! as processes (`--servers-as processes`), so each role gets its own
//! figure; with all servers in one process only their sum is known.
//!
//! The kernel counts process time in ticks of 1/100 s (`USER_HZ`, fixed
//! at 100 for `/proc` on Linux); a run of a second or more of CPU reads to
//! within 1 %.
//!
//! The same clock reads the bytes each server process sent to storage
//! (`write_bytes` in `/proc/<pid>/io`: its direct writes, and the page
//! cache it dirtied, which writeback takes to the disk later), so a run
//! also says how many bytes of disk writes each message cost the servers.

use std::time::Duration;

/// `/proc/<pid>/stat` counts in these per second on Linux.
const TICKS_PER_SECOND: f64 = 100.0;

/// CPU microseconds per message, by role.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CpuPerMessage {
    /// This process: the publisher and the experiment around it.
    pub client: f64,
    /// The stream's primary's process (`None` when the servers share one
    /// process).
    pub primary: Option<f64>,
    /// The mean of the backups' processes (`None` as for `primary`, or
    /// with no backup).
    pub backup: Option<f64>,
    /// Every server process together.
    pub servers: f64,
}

impl CpuPerMessage {
    /// The same per KB (10^3 bytes) of payload.
    pub fn per_kilobyte(&self, payload: usize) -> CpuPerMessage {
        let kilobytes = payload.max(1) as f64 / 1000.0;
        CpuPerMessage {
            client: self.client / kilobytes,
            primary: self.primary.map(|p| p / kilobytes),
            backup: self.backup.map(|b| b / kilobytes),
            servers: self.servers / kilobytes,
        }
    }
}

/// The CPU time each process had used when a run started, and the bytes
/// each server process had written.
#[derive(Clone, Debug)]
pub struct CpuClock {
    client: Duration,
    /// Each server's id, process and CPU time.
    servers: Vec<(u32, u32, Duration)>,
    /// Each server process's bytes written (once per process); `None`
    /// where `/proc/<pid>/io` cannot be read.
    written: Option<Vec<(u32, u64)>>,
}

impl CpuClock {
    /// Reads the clocks of this process and of `servers` (id, pid).
    pub fn start(servers: &[(u32, u32)]) -> std::io::Result<CpuClock> {
        let mut started = Vec::with_capacity(servers.len());
        for &(id, pid) in servers {
            started.push((id, pid, process_cpu(&pid.to_string())?));
        }
        Ok(CpuClock {
            client: process_cpu("self")?,
            servers: started,
            written: written_by(distinct(servers.iter().map(|(_, pid)| *pid))),
        })
    }

    /// Bytes the server processes wrote to storage per message of the
    /// `messages` sent since `start`; `None` where `/proc/<pid>/io` cannot
    /// be read.
    pub fn written_per_message(&self, messages: usize) -> Option<f64> {
        let before = self.written.as_ref()?;
        let after = written_by(before.iter().map(|(pid, _)| *pid).collect())?;
        let bytes: u64 = before
            .iter()
            .zip(&after)
            .map(|((_, was), (_, now))| now.saturating_sub(*was))
            .sum();
        Some(bytes as f64 / messages.max(1) as f64)
    }

    /// CPU per message of the `messages` sent since `start`, the server
    /// `primary` holding the primary (0 for none: many streams, each its
    /// own primary; `backup` is then the mean of every server).
    pub fn per_message(&self, messages: usize, primary: u32) -> std::io::Result<CpuPerMessage> {
        let per = |used: Duration| used.as_secs_f64() * 1e6 / messages.max(1) as f64;
        let client = per(process_cpu("self")?.saturating_sub(self.client));
        let mut used = Vec::with_capacity(self.servers.len());
        for &(id, pid, before) in &self.servers {
            used.push((
                id,
                pid,
                process_cpu(&pid.to_string())?.saturating_sub(before),
            ));
        }
        // Servers in one process: each pid once in the sum.
        let pids = distinct(used.iter().map(|(_, pid, _)| *pid));
        let servers: f64 = pids
            .iter()
            .filter_map(|pid| used.iter().find(|(_, p, _)| p == pid))
            .map(|(_, _, time)| per(*time))
            .sum();
        let separate = pids.len() == used.len();
        let primary_cpu = used
            .iter()
            .find(|(id, _, _)| *id == primary)
            .filter(|_| separate)
            .map(|(_, _, time)| per(*time));
        let backups: Vec<f64> = used
            .iter()
            .filter(|(id, _, _)| *id != primary)
            .map(|(_, _, time)| per(*time))
            .collect();
        let backup = (separate && !backups.is_empty())
            .then(|| backups.iter().sum::<f64>() / backups.len() as f64);
        Ok(CpuPerMessage {
            client,
            primary: primary_cpu,
            backup,
            servers,
        })
    }
}

/// User + system time of process `pid` (`self` for this one), its threads'
/// (living and ended) included.
pub fn process_cpu(pid: &str) -> std::io::Result<Duration> {
    read_proc(pid, "stat", parse_stat, "no CPU times")
}

/// User + system time of process `pid` and of the children it has waited
/// for (`cutime` and `cstime`): what a shell loop and the commands it ran
/// to their end used.
pub fn process_and_children_cpu(pid: &str) -> std::io::Result<Duration> {
    read_proc(pid, "stat", |stat| stat_times(stat, 4), "no CPU times")
}

/// `/proc/<pid>/<file>` read and parsed; an `InvalidData` error saying
/// what it lacks when it does not parse.
fn read_proc<T>(
    pid: &str,
    file: &str,
    parse: impl Fn(&str) -> Option<T>,
    lacks: &str,
) -> std::io::Result<T> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/{file}"))?;
    parse(&text).ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("/proc/{pid}/{file} has {lacks}: {text:?}"),
        )
    })
}

/// `pids`, each once.
fn distinct(pids: impl IntoIterator<Item = u32>) -> Vec<u32> {
    let mut pids: Vec<u32> = pids.into_iter().collect();
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// Each of `pids` with the bytes it has written; `None` if any cannot be
/// read.
fn written_by(pids: Vec<u32>) -> Option<Vec<(u32, u64)>> {
    pids.into_iter()
        .map(|pid| Some((pid, process_written(&pid.to_string()).ok()?)))
        .collect()
}

/// Bytes process `pid` (`self` for this one) caused to be written to
/// storage: `write_bytes` of `/proc/<pid>/io`.
pub fn process_written(pid: &str) -> std::io::Result<u64> {
    read_proc(pid, "io", parse_written, "no write_bytes")
}

fn parse_written(io: &str) -> Option<u64> {
    io.lines()
        .find_map(|line| line.strip_prefix("write_bytes:"))
        .and_then(|value| value.trim().parse().ok())
}

fn parse_stat(stat: &str) -> Option<Duration> {
    stat_times(stat, 2)
}

/// The sum of the first `count` of utime, stime, cutime and cstime, the
/// 14th to 17th fields, counted after the command name, which is in
/// parentheses and may hold spaces.
fn stat_times(stat: &str, count: usize) -> Option<Duration> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<u64> = after_name
        .split_whitespace()
        .skip(11)
        .take(count)
        .map(|field| field.parse().ok())
        .collect::<Option<_>>()?;
    (fields.len() == count)
        .then(|| Duration::from_secs_f64(fields.iter().sum::<u64>() as f64 / TICKS_PER_SECOND))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stat_line_gives_user_plus_system_time() {
        // A command name with a space and a parenthesis in it.
        let line = "4242 (tokio (rt) x) S 1 4242 4242 0 -1 4194560 950 0 0 0 250 130 0 0 20 0 9 0";
        assert_eq!(parse_stat(line), Some(Duration::from_millis(3800)));
        assert_eq!(parse_stat("4242 (cut) S 1"), None);
        // With the children's times (cutime 20, cstime 10 ticks).
        let line = "4242 (sh) S 1 4242 4242 0 -1 4194560 950 0 0 0 250 130 20 10 20 0 9 0";
        assert_eq!(stat_times(line, 4), Some(Duration::from_millis(4100)));
        assert_eq!(
            stat_times("4242 (sh) S 1 4242 4242 0 -1 4194560 950 0 0 0 250 130", 4),
            None
        );
    }

    #[test]
    fn this_process_is_charged_for_the_work_it_does() {
        // Spins until 100 ms of CPU are charged, however often a loaded
        // machine takes the core away; a clock that never moves fails at
        // the deadline.
        let before = process_cpu("self").expect("own stat");
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let mut x = 1u64;
        loop {
            for _ in 0..100_000 {
                x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
            }
            let used = process_cpu("self").expect("own stat") - before;
            if used >= Duration::from_millis(100) {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "30 s of spinning charged only {used:?}"
            );
        }
    }

    #[test]
    fn the_io_file_gives_the_bytes_written_to_storage() {
        let io = "rchar: 10\nwchar: 20\nsyscr: 1\nsyscw: 2\nread_bytes: 4096\nwrite_bytes: 8192\ncancelled_write_bytes: 0\n";
        assert_eq!(parse_written(io), Some(8192));
        assert_eq!(parse_written("rchar: 10\n"), None);
    }

    #[test]
    fn this_process_is_charged_for_what_it_writes_and_syncs() {
        let before = process_written("self").expect("own io");
        // In the source tree, on a disk: a memory file system writes
        // nothing to storage.
        let folder = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).expect("temporary folder");
        let path = folder.path().join("written");
        std::fs::write(&path, vec![7u8; 1 << 20]).expect("write");
        std::fs::File::open(&path)
            .and_then(|file| file.sync_all())
            .expect("sync");
        let written = process_written("self").expect("own io") - before;
        assert!(
            written >= 1 << 20,
            "1 MiB written and synced, {written} counted"
        );
    }

    #[test]
    fn roles_split_by_process_and_sum_once_when_shared() {
        let me = std::process::id();
        let clock = CpuClock::start(&[(1, me), (2, me), (3, me)]).expect("clock");
        let cpu = clock.per_message(1000, 1).expect("per message");
        assert_eq!(
            (cpu.primary, cpu.backup),
            (None, None),
            "one shared process"
        );
        assert!(cpu.servers >= 0.0 && cpu.client >= 0.0);
        let per_kb = CpuPerMessage {
            client: 10.0,
            primary: Some(20.0),
            backup: Some(30.0),
            servers: 80.0,
        }
        .per_kilobyte(10_000);
        assert_eq!(per_kb.primary, Some(2.0));
        assert_eq!(per_kb.servers, 8.0);
    }
}
