//! The durable hook: the I/O thread calls it with each new durable version,
//! clearing it stops the calls, the watch beyond the hook hears only of
//! what the hook did not take, and a hook that drops the log's last owner
//! does not leave the log waiting for its own thread.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use wal::{FileStorage, Log, LogConfig, Storage};

use crate::basics::{append_all, open, wait_durable};

#[test]
fn the_hook_sees_every_durable_version_on_the_io_thread_and_stops_when_cleared() {
    let folder = tempfile::tempdir().unwrap();
    let storage: Arc<dyn Storage> = Arc::new(FileStorage);
    let (log, _) = open(storage, folder.path(), LogConfig::default());
    let seen: Arc<Mutex<Vec<(u64, bool)>>> = Arc::default();
    let threads: Arc<Mutex<Vec<std::thread::ThreadId>>> = Arc::default();
    {
        let (seen, threads) = (Arc::clone(&seen), Arc::clone(&threads));
        log.on_durable(move |durable, busy| {
            seen.lock().unwrap().push((durable, busy));
            threads.lock().unwrap().push(std::thread::current().id());
            true
        });
    }
    append_all(&log, 7, 1, 300, 200);
    wait_durable(&log, 300);
    let calls = seen.lock().unwrap().clone();
    assert!(!calls.is_empty());
    let versions: Vec<u64> = calls.iter().map(|(v, _)| *v).collect();
    assert!(
        versions.windows(2).all(|w| w[0] < w[1]),
        "the durable version only moves forward: {versions:?}"
    );
    assert_eq!(*versions.last().unwrap(), 300, "the hook saw the last sync");
    let threads = threads.lock().unwrap().clone();
    assert!(
        threads.iter().all(|t| *t == threads[0]),
        "one thread calls it"
    );
    assert_ne!(threads[0], std::thread::current().id(), "not the appender");
    assert!(
        !calls.last().unwrap().1,
        "nothing waits after the last batch, so the log was not busy"
    );

    log.clear_on_durable();
    let before = seen.lock().unwrap().len();
    append_all(&log, 7, 301, 50, 200);
    wait_durable(&log, 350);
    assert_eq!(
        seen.lock().unwrap().len(),
        before,
        "a cleared hook is not called"
    );
}

#[test]
fn the_watch_beyond_the_hook_hears_of_what_the_hook_left_and_of_a_failure_only() {
    let storage = wal::fault::FaultStorage::new();
    let (log, _) = open(
        Arc::new(storage.clone()),
        crate::crash::folder(),
        LogConfig::default(),
    );
    let taken_up_to = 40;
    log.on_durable(move |durable, _| durable <= taken_up_to);
    let mut beyond = log.progress_beyond_hook();
    let mut all = log.progress();
    // One record at a time, each its own sync, each taken by the hook:
    // the full watch hears of every one, the other of none.
    for version in 1..=taken_up_to {
        append_all(&log, 7, version, 1, 100);
        wait_durable(&log, version);
    }
    assert!(all.has_changed().unwrap(), "the full watch heard of them");
    assert_eq!(all.borrow_and_update().durable, taken_up_to);
    assert!(
        !beyond.has_changed().unwrap(),
        "versions the hook took wake no one beyond it"
    );
    assert_eq!(beyond.borrow().durable, 0);
    // Versions the hook leaves reach both watches.
    append_all(&log, 7, taken_up_to + 1, 10, 100);
    wait_durable(&log, taken_up_to + 10);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while beyond.borrow_and_update().durable < taken_up_to + 10 {
        assert!(std::time::Instant::now() < deadline, "never passed on");
        std::thread::sleep(Duration::from_millis(1));
    }
    // A failure reaches it too, whatever the hook.
    storage.fail_sync_after(0);
    append_all(&log, 7, taken_up_to + 11, 1, 100);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while beyond.borrow().failed.is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "the failure never came"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(beyond.has_changed().unwrap());
    let progress = beyond.borrow_and_update().clone();
    assert!(progress.failed.unwrap().contains("injected fsync failure"));
    assert_eq!(
        progress.durable,
        taken_up_to + 10,
        "nothing more is durable"
    );
}

#[test]
fn a_hook_that_drops_the_last_owner_of_the_log_does_not_wait_for_itself() {
    hook_drops_the_log(false);
}

#[test]
fn a_hook_that_drops_the_last_owner_of_a_journaled_log_and_its_journal_does_not_wait_for_itself() {
    hook_drops_the_log(true);
}

/// A log (sharing a journal, whose last owner it then is, when
/// `journaled`) dropped by its own durable hook: nothing waits for itself,
/// and everything appended is there when the log opens again.
fn hook_drops_the_log(journaled: bool) {
    let root = tempfile::tempdir().unwrap();
    let folder = root.path().join("streams/s/log");
    let storage: Arc<dyn Storage> = Arc::new(FileStorage);
    let config = || {
        let journal = journaled.then(|| {
            let (journal, _) =
                wal::Journal::open(storage.clone(), root.path(), wal::JournalConfig::default())
                    .unwrap();
            Arc::new(journal)
        });
        LogConfig {
            journal,
            ..LogConfig::default()
        }
    };
    let (log, _) = open(storage.clone(), &folder, config());
    // The owner sits in a slot the hook empties: the log is dropped on the
    // thread that made its records durable, as a stream whose last holder
    // was the hook would be.
    let owner: Arc<Mutex<Option<Log>>> = Arc::new(Mutex::new(None));
    let dropped = Arc::new(AtomicU64::new(0));
    {
        let (slot, dropped) = (Arc::clone(&owner), Arc::clone(&dropped));
        log.on_durable(move |durable, _| {
            if durable >= 20 {
                if let Some(log) = slot.lock().unwrap().take() {
                    drop(log);
                    dropped.store(durable, Ordering::Release);
                }
            }
            true
        });
    }
    *owner.lock().unwrap() = Some(log);
    {
        // The hook waits for the slot while the records go in.
        let slot = owner.lock().unwrap();
        append_all(slot.as_ref().unwrap(), 7, 1, 20, 100);
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while dropped.load(Ordering::Acquire) == 0 {
        assert!(std::time::Instant::now() < deadline, "the hook never ran");
        std::thread::sleep(Duration::from_millis(1));
    }
    // The thread wrote what was pending and stopped: the log reopens with
    // every record. (A journal's thread, left on its own by the drop, ends
    // with a rotation: give it time, so that two journals never share the
    // file.)
    if journaled {
        std::thread::sleep(Duration::from_millis(200));
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        // The thread may still be cutting the zeros ahead off the file
        // after its hook returned: an open that read the file while it
        // shrank is tried again.
        let mut seen = Vec::new();
        let reopened = Log::open(storage.clone(), &folder, 7, config(), &mut |record| {
            seen.push(record.header.version)
        });
        let reopened = match reopened {
            Ok(reopened) => reopened,
            Err(error) => {
                assert!(std::time::Instant::now() < deadline, "{error}");
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        if seen.len() == 20 {
            assert_eq!(reopened.last_version(), 20);
            break;
        }
        drop(reopened);
        assert!(
            std::time::Instant::now() < deadline,
            "{} records",
            seen.len()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}
