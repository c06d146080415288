//! `stamplog bench` end to end: the memory experiment against the real
//! binary run as a child server, and an experiment run through the binary's
//! command line, both with tiny parameters so they cannot rot.

use std::path::Path;
use std::process::Command;

const BINARY: &str = env!("CARGO_BIN_EXE_stamplog");

fn assert_files(folder: &Path, names: &[&str]) {
    for name in names {
        let path = folder.join(name);
        let length = std::fs::metadata(&path)
            .unwrap_or_else(|error| panic!("{} is missing: {error}", path.display()))
            .len();
        assert!(length > 0, "{} is empty", path.display());
    }
}

#[test]
fn bench_memory_measures_a_child_server_and_counts_every_message() {
    let folder = tempfile::tempdir().unwrap();
    let args = ::bench::MemoryArgs {
        server_binary: Some(BINARY.into()),
        messages: 2000,
        size: 1024,
        window: 64,
        reader_pause_ms: 1,
        reader_pause_every: 100,
        sample_interval_ms: 20,
        output: ::bench::output::OutputArgs {
            out: Some(folder.path().join("out")),
            json: Some(folder.path().join("memory.json")),
            data: Some(folder.path().join("data")),
            quiet: true,
        },
    };
    let figures = ::bench::memory::run(args).unwrap();
    assert_eq!(figures.messages, 2000);
    assert!(figures.messages_per_second > 0.0);
    assert!(!figures.samples.is_empty());
    assert!(figures.final_resident_kib > 0);
    assert!(figures.peak_kib >= figures.final_resident_kib);
    assert!(figures.read_at_end <= 2000);
    assert_eq!(figures.lag_at_end, 2000 - figures.read_at_end);
    assert!(figures.lag_max <= 2000);
    assert_files(
        &folder.path().join("out"),
        &["memory.csv", "memory.png", "memory-lag.png"],
    );
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(folder.path().join("memory.json")).unwrap())
            .unwrap();
    assert!(!json["samples"].as_array().unwrap().is_empty());
}

#[test]
fn bench_paged_through_the_binary_prints_its_table_and_writes_its_files() {
    let folder = tempfile::tempdir().unwrap();
    let out = folder.path().join("out");
    let output = Command::new(BINARY)
        .args([
            "bench",
            "paged",
            "--messages",
            "500",
            "--compute-us",
            "1",
            "--page-size",
            "64KiB",
            "--pages",
            "1,2",
            "--quiet",
            "--out",
        ])
        .arg(&out)
        .arg("--json")
        .arg(folder.path().join("paged.json"))
        .arg("--data")
        .arg(folder.path().join("data"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    for label in ["no logging", "buffering only", "64KiBx1", "64KiBx2"] {
        assert!(stdout.contains(label), "{label} missing from:\n{stdout}");
    }
    assert_files(&out, &["paged.csv", "paged.png", "paged-buffer-full.png"]);
    assert_files(folder.path(), &["paged.json"]);
}

#[test]
fn bench_help_lists_every_experiment() {
    let output = Command::new(BINARY)
        .args(["bench", "--help"])
        .output()
        .unwrap();
    assert!(output.status.success());
    let help = String::from_utf8_lossy(&output.stdout);
    for experiment in [
        "logging",
        "paged",
        "throughput",
        "memory",
        "commit-interval",
    ] {
        assert!(
            help.contains(experiment),
            "{experiment} missing from:\n{help}"
        );
    }
}
