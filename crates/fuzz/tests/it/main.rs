//! The short fuzz run of CI, on the stable toolchain: every target reads
//! its checked-in corpus (`fuzz/corpus/<target>/`, what the long libFuzzer
//! runs kept), its seeds, and then seeded mutations of them for
//! `STAMPLOG_FUZZ_SECONDS` seconds (3 unless set). A failing input is
//! written to `target/fuzz-failures/<target>` and named in the failure,
//! to be replayed with `cargo +nightly fuzz run <target> <file>`.

// A test stops at the first thing that is not as it expects.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use fuzz::{Mutator, Target};

fn corpus_folder(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(name)
}

fn budget() -> Duration {
    let seconds = std::env::var("STAMPLOG_FUZZ_SECONDS")
        .ok()
        .and_then(|text| text.parse::<f64>().ok())
        .unwrap_or(3.0);
    Duration::from_secs_f64(seconds)
}

/// Runs `input`; on a panic, keeps it and fails naming the file.
fn run_one(target: &Target, input: &[u8]) {
    let outcome = std::panic::catch_unwind(|| (target.run)(input));
    if outcome.is_err() {
        let folder = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/fuzz-failures");
        std::fs::create_dir_all(&folder).unwrap();
        let path = folder.join(target.name);
        std::fs::write(&path, input).unwrap();
        panic!(
            "target {} failed on the input kept in {}",
            target.name,
            path.display()
        );
    }
}

fn fuzz(name: &str) {
    let target = fuzz::target(name).expect("a target of that name");
    let mut pool = (target.seeds)();
    assert!(!pool.is_empty(), "{name} has seeds");
    let folder = corpus_folder(name);
    let entries = std::fs::read_dir(&folder)
        .unwrap_or_else(|error| panic!("the corpus {}: {error}", folder.display()));
    for entry in entries {
        pool.push(std::fs::read(entry.unwrap().path()).unwrap());
    }
    for input in &pool {
        run_one(target, input);
    }
    let seed = std::env::var("STAMPLOG_FUZZ_SEED")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(name.len() as u64);
    let mut mutator = Mutator::new(seed);
    let started = Instant::now();
    let mut runs = 0u64;
    while started.elapsed() < budget() {
        let input = mutator.mutate(&pool);
        run_one(target, &input);
        runs += 1;
    }
    println!(
        "{name}: {} corpus entries and seeds, {runs} mutated inputs (seed {seed}), no failure",
        pool.len()
    );
    assert!(runs > 0, "{name}: the budget allowed no mutated input");
}

#[test]
fn every_target_has_a_test_and_a_corpus() {
    let tested = [
        "frame",
        "peer_message",
        "control_request",
        "record",
        "log_files",
        "journal",
        "token_file",
        "server_session",
    ];
    for target in fuzz::TARGETS {
        assert!(tested.contains(&target.name), "{} is not run", target.name);
        assert!(
            corpus_folder(target.name).is_dir(),
            "{} has no corpus",
            target.name
        );
    }
}

#[test]
fn frame() {
    fuzz("frame");
}

#[test]
fn peer_message() {
    fuzz("peer_message");
}

#[test]
fn control_request() {
    fuzz("control_request");
}

#[test]
fn record() {
    fuzz("record");
}

#[test]
fn log_files() {
    fuzz("log_files");
}

#[test]
fn token_file() {
    fuzz("token_file");
}

#[test]
fn server_session() {
    fuzz("server_session");
}

#[test]
fn the_peer_message_seeds_are_messages_a_server_reads() {
    let target = fuzz::target("peer_message").unwrap();
    for (index, seed) in (target.seeds)().iter().enumerate() {
        assert!(
            server::check_peer_message(seed).is_ok(),
            "seed {index} does not decode: {seed:?}"
        );
    }
}

#[test]
fn journal() {
    fuzz("journal");
}
