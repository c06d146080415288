//! The journal's list of logs, seen from inside: a log is in it at most
//! once, however a write in place, a round and an append interleave, and
//! a log a round passed over while it was in flight comes back.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::{address, Journal, JournalConfig};
use crate::fault::FaultStorage;
use crate::{Log, LogConfig};

fn record(stream: u64, version: u64) -> Vec<u8> {
    let mut bytes = Vec::new();
    crate::experiment::encode_record(stream, version, 1, &[7u8; 100], &mut bytes);
    bytes
}

/// A durable hook that stops its thread at one version until opened.
#[derive(Default)]
struct Gate {
    entered: AtomicBool,
    open: Mutex<bool>,
    opened: Condvar,
}

impl Gate {
    fn install(log: &Log, at: u64) -> Arc<Gate> {
        let gate = Arc::new(Gate::default());
        let hooked = Arc::clone(&gate);
        log.on_durable(move |durable, _| {
            if durable == at {
                hooked.entered.store(true, Ordering::SeqCst);
                let mut open = hooked.open.lock().unwrap();
                while !*open {
                    open = hooked.opened.wait(open).unwrap();
                }
            }
            true
        });
        gate
    }

    fn wait_entered(&self) {
        wait_for("the hook to run", || self.entered.load(Ordering::SeqCst));
    }

    fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.opened.notify_all();
    }
}

/// Opens its gate when dropped, so that a failed assertion does not leave
/// a thread held in a hook (the journal's would hold up its shutdown).
struct OpenOnDrop(Arc<Gate>);

impl Drop for OpenOnDrop {
    fn drop(&mut self) {
        self.0.open();
    }
}

fn wait_for(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "waited 10 s for {what}");
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// How many times the journal lists `log`.
fn listed(journal: &Journal, log: &Log) -> usize {
    let me = address(&log.shared);
    let control = journal.inner.lock();
    control.ready.iter().filter(|l| address(l) == me).count()
}

fn open_log(storage: &FaultStorage, journal: &Arc<Journal>, name: &str, stream: u64) -> Log {
    let config = LogConfig {
        journal: Some(Arc::clone(journal)),
        ..LogConfig::default()
    };
    let folder = Path::new("/data").join(name);
    Log::open(
        Arc::new(storage.clone()),
        &folder,
        stream,
        config,
        &mut |_| {},
    )
    .unwrap()
}

/// A journal with two logs on it: `a` (stream 1) and `b` (stream 2).
fn two_logs() -> (FaultStorage, Arc<Journal>, Log, Log) {
    let storage = FaultStorage::new();
    let config = JournalConfig {
        bytes_max: 1 << 20,
        ..JournalConfig::default()
    };
    let (journal, _) =
        Journal::open(Arc::new(storage.clone()), Path::new("/data"), config).unwrap();
    let journal = Arc::new(journal);
    let log = open_log(&storage, &journal, "a", 1);
    let other = open_log(&storage, &journal, "b", 2);
    (storage, journal, log, other)
}

#[test]
fn a_log_is_listed_once_however_writes_in_place_rounds_and_appends_interleave() {
    let (_storage, journal, log, other) = two_logs();
    // A round of `log` alone: the next record may be written in place.
    log.append(1, &record(1, 1)).unwrap();
    wait_for("version 1", || log.durable_version() == 1);
    wait_for("an idle journal", || journal.idle());

    // Version 2 is written in place, and its hook holds the writing thread
    // with the log in flight.
    let gate = Gate::install(&log, 2);
    let other_gate = Gate::install(&other, 1);
    let (before, after) = std::thread::scope(|scope| {
        // Dropped as a failure unwinds, before the scope joins the writer.
        let _open = (OpenOnDrop(gate.clone()), OpenOnDrop(other_gate.clone()));
        let writer = scope.spawn(|| wal_write_here(&journal, &log, 2));
        gate.wait_entered();
        // The journal's thread is held in the hook of a round of another
        // log, so what is listed now stays listed.
        other.append(1, &record(2, 1)).unwrap();
        other_gate.wait_entered();
        log.append(3, &record(1, 3)).unwrap();
        let before = listed(&journal, &log);
        gate.open();
        writer.join().unwrap();
        let after = listed(&journal, &log);
        other_gate.open();
        (before, after)
    });
    assert_eq!(before, 1, "listed by the append");
    // The write in place ended while the log was still listed: no round
    // passed it over, so it is not listed a second time (a round would
    // take two batches of it, and could write them out of order on two
    // threads).
    assert_eq!(after, 1, "listed twice");
    wait_for("version 3", || log.durable_version() == 3);
    wait_for("an idle journal", || journal.idle());

    // A round that finds the log in flight passes it over, and the writer
    // lists it again when done: the record appended meanwhile is written.
    let gate = Gate::install(&log, 4);
    std::thread::scope(|scope| {
        let _open = OpenOnDrop(gate.clone());
        let writer = scope.spawn(|| wal_write_here(&journal, &log, 4));
        gate.wait_entered();
        log.append(5, &record(1, 5)).unwrap();
        wait_for("the round that passes it over", || journal.idle());
        gate.open();
        writer.join().unwrap();
    });
    wait_for("version 5", || log.durable_version() == 5);
    assert_eq!(
        journal.metrics().rounds,
        0,
        "a log alone never shares a round with itself"
    );
}

/// Appends `version` of stream 1 under `write_here`: written in place.
fn wal_write_here(journal: &Journal, log: &Log, version: u64) {
    let before = journal.metrics().in_place_writes;
    crate::write_here(|| log.append(version, &record(1, version)).unwrap());
    assert!(log.durable_version() >= version, "durable on return");
    assert_eq!(
        journal.metrics().in_place_writes,
        before + 1,
        "written in place"
    );
}

#[test]
fn a_batch_that_does_not_follow_the_last_written_latches_the_log_unwritten() {
    use super::Member;
    let (storage, _journal, log, other) = two_logs();
    // The journal's thread is held in a hook of another log, so that only
    // this test takes the log's batches.
    let gate = Gate::install(&other, 1);
    let _open = OpenOnDrop(gate.clone());
    other.append(1, &record(2, 1)).unwrap();
    gate.wait_entered();
    let member: Arc<dyn Member> = log.shared.clone();
    log.append(1, &record(1, 1)).unwrap();
    let first = member.take_direct().expect("version 1");
    member.finish_in_flight();
    log.append(2, &record(1, 2)).unwrap();
    let second = member.take_direct().expect("version 2");
    member.finish_in_flight();
    let bytes_before = storage.bytes_written();
    // Version 2 before version 1: what two threads writing two batches
    // of one log at once could do.
    member.write(second, Instant::now(), None);
    let failure = log.failure().expect("the log latched failed");
    assert!(failure.contains("out of order"), "{failure}");
    assert_eq!(log.durable_version(), 0);
    assert_eq!(storage.bytes_written(), bytes_before, "nothing written");
    // And nothing after it is written either.
    member.write(first, Instant::now(), None);
    assert_eq!(log.durable_version(), 0);
    assert_eq!(storage.bytes_written(), bytes_before);
}
