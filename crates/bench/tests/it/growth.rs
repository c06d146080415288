//! `bench growth` with tiny parameters: a log grown in slices, each timed
//! and charged its CPU.

use bench::growth::{self, GrowthArgs};

use crate::{assert_files, quiet_output, read_json, stamplog_binary};

#[test]
fn bench_growth_times_every_slice_as_the_log_grows() {
    let folder = tempfile::tempdir().unwrap();
    let args = GrowthArgs {
        server_binary: Some(stamplog_binary()),
        records: 2500,
        slice: 1000,
        window: 32,
        output: quiet_output(folder.path()),
        ..GrowthArgs::default()
    };
    let figures = growth::run(args).unwrap();
    let starts: Vec<(u64, usize)> = figures
        .slices
        .iter()
        .map(|s| (s.records_before, s.messages))
        .collect();
    assert_eq!(starts, [(0, 1000), (1000, 1000), (2000, 500)]);
    for slice in &figures.slices {
        assert_eq!(slice.latency.count, slice.messages, "{slice:?}");
        assert!(slice.messages_per_second > 0.0, "{slice:?}");
        assert!(
            slice.cpu.primary.is_some(),
            "the server is a process of its own"
        );
    }
    // The first and the last slice, nothing in between at this size.
    let shown: Vec<u64> = figures.shown().iter().map(|s| s.records_before).collect();
    assert_eq!(shown, [0, 2000]);
    assert_files(&folder.path().join("out"), &["growth.csv"]);
    let json = read_json(&folder.path().join("figures.json"));
    assert_eq!(json["table"]["rows"].as_array().map(Vec::len), Some(3));
}
