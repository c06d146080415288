//! Neighbours for the whole run of `bench patterns`, so that a slow
//! spell can be made on purpose, the same way in every run, instead of
//! waited for:
//! - on the disk (`--disk-neighbour`): threads that write blocks with
//!   `O_DSYNC` into files of their own, so that every fdatasync of the
//!   run (the servers', the floor's, the disk-limit writers') waits
//!   behind theirs;
//! - on the CPU (`--cpu-neighbour`): shell loops, each a process of its
//!   own, that start a short-lived process (`/bin/true`) and wait for it,
//!   again and again, so that every process of the run (the servers, the
//!   bench's client and floors) shares the cores with them. They are
//!   processes apart from the bench's, each in a session of its own, as
//!   another program on the host would be: loops in the bench's process,
//!   or in its session, slow the floors, which live in the bench's
//!   process, more than the servers.

use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::Context;

/// Blocks each writer goes over before it starts again at the first,
/// so that its file stays small (the file is written over, not grown).
const BLOCKS: u64 = 200;
/// The largest block a writer takes (each writer holds one in memory).
const BLOCK_BYTES_MAX: usize = 64 * 1024 * 1024;
/// The most loops of processes a CPU neighbour runs.
pub const CPU_LOOPS_MAX: usize = 64;
/// The program each loop of the CPU neighbour starts: it does nothing
/// and exits, so that its cost is the start and the exit of a process.
const CPU_PROGRAM: &str = "/bin/true";

/// Threads that each repeat one step until told to stop, counting the
/// steps done.
struct Loops {
    name: &'static str,
    stop: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
    threads: Vec<JoinHandle<std::io::Result<()>>>,
}

impl Loops {
    fn new(name: &'static str) -> Loops {
        Loops {
            name,
            stop: Arc::new(AtomicBool::new(false)),
            done: Arc::new(AtomicU64::new(0)),
            threads: Vec::new(),
        }
    }

    /// Starts a thread that runs `step` until the loops stop or it fails.
    fn spawn(
        &mut self,
        mut step: impl FnMut() -> std::io::Result<()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let (stop, done) = (Arc::clone(&self.stop), Arc::clone(&self.done));
        let thread = std::thread::Builder::new()
            .name(self.name.into())
            .spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    step()?;
                    done.fetch_add(1, Ordering::Relaxed);
                }
                Ok(())
            })
            .with_context(|| format!("cannot start a {} thread", self.name))?;
        self.threads.push(thread);
        Ok(())
    }

    fn done(&self) -> u64 {
        self.done.load(Ordering::Relaxed)
    }

    /// Stops the threads and waits for them; the first one's error, if
    /// one failed.
    fn halt(&mut self) -> anyhow::Result<()> {
        self.stop.store(true, Ordering::Relaxed);
        let mut failed = None;
        for thread in self.threads.drain(..) {
            let name = self.name;
            let outcome = thread
                .join()
                .map_err(|_| anyhow::anyhow!("a {name} thread panicked"));
            let outcome =
                outcome.and_then(|ran| ran.with_context(|| format!("a {name} thread failed")));
            if let Err(error) = outcome {
                failed.get_or_insert(error);
            }
        }
        failed.map_or(Ok(()), Err)
    }
}

/// What the neighbours did in a run.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct NeighbourWork {
    /// Blocks the disk neighbour wrote.
    pub writes: u64,
    /// CPU time the CPU neighbour's loops used, the processes they
    /// started included.
    pub cpu: Duration,
    /// How long the CPU neighbour ran (zero without one).
    pub cpu_wall: Duration,
}

/// The running neighbours; stopped (the disk neighbour's files removed,
/// the CPU neighbour's loops killed) by [`Neighbour::stop`] or when
/// dropped.
pub struct Neighbour {
    disk: Loops,
    files: Vec<PathBuf>,
    cpu: Vec<Child>,
    cpu_started: Instant,
}

impl Neighbour {
    /// One writer for each of `blocks` (bytes per write, each from 1 to
    /// 64 MiB), each with a file `disk-neighbour-N` of its own in `folder`,
    /// and `cpu_loops` shell loops of short-lived processes (at most
    /// [`CPU_LOOPS_MAX`]); none of either for an empty list and 0.
    pub fn start(folder: &Path, blocks: &[usize], cpu_loops: usize) -> anyhow::Result<Neighbour> {
        anyhow::ensure!(
            cpu_loops <= CPU_LOOPS_MAX,
            "a CPU neighbour runs at most {CPU_LOOPS_MAX} loops, not {cpu_loops}"
        );
        let mut neighbour = Neighbour {
            disk: Loops::new("disk-neighbour"),
            files: Vec::new(),
            cpu: Vec::new(),
            cpu_started: Instant::now(),
        };
        for (index, &block) in blocks.iter().enumerate() {
            anyhow::ensure!(
                (1..=BLOCK_BYTES_MAX).contains(&block),
                "a disk neighbour's block must be at least 1 byte and at most 64 MiB, not {block} bytes"
            );
            let path = folder.join(format!("disk-neighbour-{index}"));
            let file = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .custom_flags(rustix::fs::OFlags::DSYNC.bits() as i32)
                .open(&path)
                .with_context(|| format!("cannot create {}", path.display()))?;
            neighbour.files.push(path);
            neighbour.disk.spawn(block_writer(file, block))?;
        }
        neighbour.start_cpu(cpu_loops)?;
        Ok(neighbour)
    }

    fn start_cpu(&mut self, loops: usize) -> anyhow::Result<()> {
        if loops == 0 {
            return Ok(());
        }
        // Once first, here: a machine without the program fails the run
        // at its start, not in a loop that ends at once.
        start_and_wait(CPU_PROGRAM)
            .with_context(|| format!("the CPU neighbour cannot start `{CPU_PROGRAM}`"))?;
        self.cpu_started = Instant::now();
        for _ in 0..loops {
            self.cpu.push(cpu_loop(std::process::id())?);
        }
        Ok(())
    }

    /// Blocks the disk neighbour wrote so far.
    pub fn writes(&self) -> u64 {
        self.disk.done()
    }

    /// Stops the neighbours, removes the disk neighbour's files, and
    /// returns what they did; the first error of a writer that failed,
    /// or of a loop that ended before it was stopped.
    pub fn stop(mut self) -> anyhow::Result<NeighbourWork> {
        let cpu_wall = match self.cpu.is_empty() {
            true => Duration::ZERO,
            false => self.cpu_started.elapsed(),
        };
        let cpu = self.cpu_time();
        self.halt()?;
        Ok(NeighbourWork {
            writes: self.writes(),
            cpu: cpu?,
            cpu_wall,
        })
    }

    /// The CPU time of the loops so far, each of them still running.
    fn cpu_time(&mut self) -> anyhow::Result<Duration> {
        let mut total = Duration::ZERO;
        for child in &mut self.cpu {
            if let Some(status) = child.try_wait()? {
                anyhow::bail!("a CPU neighbour's loop ended before the run did: {status}");
            }
            total += crate::cpu::process_and_children_cpu(&child.id().to_string())?;
        }
        Ok(total)
    }

    fn halt(&mut self) -> anyhow::Result<()> {
        let disk = self.disk.halt();
        for mut child in self.cpu.drain(..) {
            // The loop's `/bin/true` of the moment ends by itself.
            let _ = child.kill();
            let _ = child.wait();
        }
        for path in self.files.drain(..) {
            let _ = std::fs::remove_file(path);
        }
        disk
    }
}

impl Drop for Neighbour {
    fn drop(&mut self) {
        let _ = self.halt();
    }
}

/// A writer's step: the next of its blocks, written with `O_DSYNC`.
fn block_writer(
    file: std::fs::File,
    block: usize,
) -> impl FnMut() -> std::io::Result<()> + Send + 'static {
    let bytes = vec![0x5a_u8; block];
    let mut index = 0;
    move || {
        file.write_all_at(&bytes, index * block as u64)?;
        index = (index + 1) % BLOCKS;
        Ok(())
    }
}

/// One loop of the CPU neighbour: a shell that starts `/bin/true` (by its
/// path, so that a shell whose `true` is built in still starts it) and
/// waits for it, again and again, for as long as process `watched` (the
/// bench) lives. In a session of its own, as another program on the host:
/// where the kernel groups the CPU's share by session (autogroup), a loop
/// in the bench's session would share the bench's part. That session is
/// also why it watches: a bench killed before it stops its loops (a
/// signal, `kill -9`) takes no loop of another session with it, so each
/// loop ends by itself, at its next turn, once the bench is gone.
fn cpu_loop(watched: u32) -> anyhow::Result<Child> {
    // `setsid` runs the shell in its own process, which is no group
    // leader, so the child's id is the loop's.
    Command::new("setsid")
        .args([
            "sh",
            "-c",
            &format!("while kill -0 {watched} 2>/dev/null; do {CPU_PROGRAM}; done"),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("the CPU neighbour cannot start `setsid sh`")
}

/// Starts `program` with no input or output and waits for it to exit
/// with success.
fn start_and_wait(program: &str) -> std::io::Result<()> {
    let status = Command::new(program)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()?;
    if status.success() {
        Ok(())
    } else {
        Err(std::io::Error::other(format!(
            "`{program}` exited with {status}"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Waits up to 10 s for `enough`.
    fn wait_for(enough: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !enough() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn writers_write_until_stopped_and_leave_no_file() {
        let folder = tempfile::tempdir().unwrap();
        let neighbour = Neighbour::start(folder.path(), &[4096, 512], 0).unwrap();
        wait_for(|| neighbour.writes() >= 10);
        assert_eq!(std::fs::read_dir(folder.path()).unwrap().count(), 2);
        let work = neighbour.stop().unwrap();
        assert!(work.writes >= 10, "{work:?}");
        assert_eq!(
            work.cpu_wall,
            Duration::ZERO,
            "no CPU neighbour was asked for"
        );
        assert_eq!(
            std::fs::read_dir(folder.path()).unwrap().count(),
            0,
            "the writers' files are removed"
        );
    }

    #[test]
    fn cpu_loops_use_the_cpu_until_stopped_and_are_gone_after() {
        let folder = tempfile::tempdir().unwrap();
        let neighbour = Neighbour::start(folder.path(), &[], 2).unwrap();
        let loops: Vec<u32> = neighbour.cpu.iter().map(Child::id).collect();
        assert_eq!(loops.len(), 2);
        for pid in &loops {
            // Each loop is the shell itself, once `setsid` has run it,
            // leading a session of its own.
            let comm = || std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap();
            wait_for(|| comm().trim() == "sh");
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
            let after_name: Vec<&str> = stat[stat.rfind(')').unwrap() + 1..]
                .split_whitespace()
                .collect();
            assert_eq!(after_name[3], pid.to_string(), "session of {stat}");
        }
        // Each loop's times count the `/bin/true`s it waited for, in
        // ticks of 10 ms: wait until both loops show some.
        let used = |pid: &u32| crate::cpu::process_and_children_cpu(&pid.to_string()).unwrap();
        wait_for(|| {
            loops
                .iter()
                .all(|pid| used(pid) >= Duration::from_millis(20))
        });
        let work = neighbour.stop().unwrap();
        assert!(work.cpu >= Duration::from_millis(40), "{work:?}");
        assert!(
            work.cpu_wall > Duration::ZERO && work.writes == 0,
            "{work:?}"
        );
        for pid in loops {
            assert!(
                !std::path::Path::new(&format!("/proc/{pid}")).exists(),
                "loop {pid} is killed and waited for"
            );
        }
    }

    #[test]
    fn a_loop_whose_step_fails_reports_it_when_stopped() {
        let mut loops = Loops::new("failing-neighbour");
        loops
            .spawn(|| start_and_wait("false"))
            .expect("the thread starts");
        // The loop ends by itself at its first step's failure.
        wait_for(|| loops.threads[0].is_finished());
        let error = loops.halt().expect_err("`false` fails its loop");
        let message = format!("{error:#}");
        assert!(
            message.contains("failing-neighbour thread failed"),
            "{message}"
        );
        assert!(message.contains("exited with"), "{message}");
        assert_eq!(loops.done(), 0, "a failed step is not counted");
    }

    #[test]
    fn a_cpu_loop_ends_by_itself_once_the_process_it_watches_is_gone() {
        let mut watched = Command::new("sleep").arg("60").spawn().unwrap();
        let mut cpu = cpu_loop(watched.id()).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            cpu.try_wait().unwrap().is_none(),
            "it loops while the bench lives"
        );
        watched.kill().unwrap();
        watched.wait().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let ended = loop {
            match cpu.try_wait().unwrap() {
                None if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
                ended => break ended,
            }
        };
        assert!(ended.is_some_and(|status| status.success()), "{ended:?}");
    }

    #[test]
    fn a_cpu_loop_that_ends_early_fails_the_stop() {
        let folder = tempfile::tempdir().unwrap();
        let mut neighbour = Neighbour::start(folder.path(), &[], 1).unwrap();
        neighbour.cpu[0].kill().unwrap();
        neighbour.cpu[0].wait().unwrap();
        let error = neighbour.stop().expect_err("a loop ended early");
        assert!(
            error.to_string().contains("ended before the run did"),
            "{error}"
        );
    }

    #[test]
    fn no_blocks_no_loops_nothing_runs_and_out_of_bounds_is_refused() {
        let folder = tempfile::tempdir().unwrap();
        let work = Neighbour::start(folder.path(), &[], 0)
            .unwrap()
            .stop()
            .unwrap();
        assert_eq!(work, NeighbourWork::default());
        for block in [0, BLOCK_BYTES_MAX + 1] {
            let refused = Neighbour::start(folder.path(), &[block], 0).err().unwrap();
            assert!(refused.to_string().contains("at most 64 MiB"), "{refused}");
        }
        let refused = Neighbour::start(folder.path(), &[], CPU_LOOPS_MAX + 1)
            .err()
            .unwrap();
        assert!(
            refused.to_string().contains("at most 64 loops"),
            "{refused}"
        );
    }
}
