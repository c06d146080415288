//! `bench commit-interval` with tiny parameters: one row per interval, and
//! the interval's cost shows in the latency.

use bench::commit_interval::{self, CommitIntervalArgs};
use bench::BenchCommand;
use clap::Parser;

use crate::{assert_files, quiet_output, read_json, stamplog_binary, BenchLine};

#[test]
fn commit_interval_with_tiny_parameters_reports_every_interval_and_its_latency_cost() {
    let folder = tempfile::tempdir().unwrap();
    let args = CommitIntervalArgs {
        server_binary: Some(stamplog_binary()),
        intervals: vec![0, 100],
        messages: 600,
        latency_messages: 300,
        rate: Some(3000.0),
        rounds: 2,
        warmup: 50,
        size: 1000,
        window: 1000,
        output: quiet_output(folder.path()),
        ..CommitIntervalArgs::default()
    };
    let figures = commit_interval::run(args).unwrap();
    let intervals: Vec<u32> = figures.rows.iter().map(|row| row.interval_ms).collect();
    assert_eq!(intervals, [0, 100]);
    for row in &figures.rows {
        assert_eq!(row.messages, 2 * 900, "{row:?}");
        assert_eq!(row.round_rates.len(), 2);
        assert!(row.round_rates.contains(&row.messages_per_second));
        assert_eq!(row.latency_ms.count, 2 * 250, "the warm-up is left out");
        assert_eq!(row.offered_rate, 3000.0);
        assert!(row.messages_per_second > 0.0 && row.megabytes_per_second > 0.0);
        assert!(row.throughput_ratio.is_finite() && row.throughput_ratio > 0.0);
        assert!(row.latency_ms.p50 <= row.latency_ms.p99);
        assert!(row.peak_held_acks >= 1, "acks wait at least for the log");
    }
    let (zero, hundred) = (figures.row(0).unwrap(), figures.row(100).unwrap());
    assert_eq!(zero.throughput_ratio, 1.0);
    assert_eq!(zero.held_per_interval_bytes, 0.0);
    assert!(zero.increase_over_half_interval.is_none());
    assert!(
        hundred.latency_ms.mean > zero.latency_ms.mean,
        "{hundred:?} against {zero:?}"
    );
    assert!(hundred.latency_ms.p50 > zero.latency_ms.p50);
    assert!(hundred.mean_increase_ms > 0.0);
    // 3,000 msgs/s for 0.1 s: a boundary holds back about 300 acks in
    // every round, where T = 0 holds only those of a group commit. A stall
    // of the disk in one round raises that round's peak (60 ms hold 180
    // acks at T = 0), so the rounds' least peaks are compared.
    let least = |row: &commit_interval::IntervalRow| {
        assert_eq!(row.round_peak_held_acks.len(), 2, "{row:?}");
        assert_eq!(
            row.peak_held_acks,
            *row.round_peak_held_acks.iter().max().unwrap()
        );
        *row.round_peak_held_acks.iter().min().unwrap()
    };
    assert!(
        least(hundred) >= 100 && least(hundred) > 2 * least(zero),
        "{hundred:?} against {zero:?}"
    );
    let expected_held = hundred.megabytes_per_second * 1e6 * 0.1;
    assert!((hundred.held_per_interval_bytes - expected_held).abs() < 1.0);
    let out = folder.path().join("out");
    assert_files(
        &out,
        &[
            "commit-interval.csv",
            "commit-interval-throughput.png",
            "commit-interval-latency.png",
        ],
    );
    let json = read_json(&folder.path().join("figures.json"));
    assert_eq!(json["rows"].as_array().unwrap().len(), 2);
    assert_eq!(json["rows"][1]["interval_ms"], 100);
}

#[test]
fn commit_interval_flags_parse_and_default_to_the_seeds_intervals() {
    let defaults = CommitIntervalArgs::default();
    assert_eq!(defaults.intervals, [0, 5, 20, 50, 100, 160]);
    assert_eq!(defaults.size, 1000);
    assert_eq!(defaults.replicas, 1);
    assert_eq!(
        defaults.publishers, 2,
        "two sessions in the throughput phase"
    );
    assert_eq!(defaults.window, 65_536);
    assert_eq!(
        defaults.rate, None,
        "a tenth of the first interval's throughput"
    );
    assert_eq!(defaults.latency_messages, 60_000);
    let line = BenchLine::parse_from([
        "bench",
        "commit-interval",
        "--intervals",
        "0,20",
        "--messages",
        "900",
        "--replicas",
        "3",
        "--protocol",
        "server-sync",
    ]);
    match line.command {
        BenchCommand::CommitInterval(args) => {
            assert_eq!(args.intervals, [0, 20]);
            assert_eq!(args.messages, 900);
            assert_eq!(args.replicas, 3);
            assert_eq!(args.protocol, client::Protocol::ServerSync);
        }
        other => panic!("parsed as {other:?}"),
    }
    assert!(BenchLine::try_parse_from(["bench", "commit-interval", "--intervals", "x"]).is_err());
}
