//! `bench metrics` with tiny parameters: three server processes, a few
//! streams, a few scrapes of each server's `/metrics`.

use bench::metrics::{self, MetricsArgs};

use crate::{assert_files, quiet_output, read_json, stamplog_binary};

#[test]
fn bench_metrics_scrapes_every_server_holding_every_stream() {
    let folder = tempfile::tempdir().unwrap();
    let args = MetricsArgs {
        server_binary: Some(stamplog_binary()),
        servers: 3,
        streams: 4,
        replicas: 3,
        scrapes: 3,
        output: quiet_output(folder.path()),
    };
    let figures = metrics::run(args).unwrap();
    assert_eq!(figures.streams, 4);
    assert_eq!(figures.servers.len(), 3);
    for server in &figures.servers {
        assert_eq!(
            server.streams, 4,
            "every server holds every stream: {server:?}"
        );
        assert_eq!(server.milliseconds.len(), 3);
        assert!(server.samples > 4 * 10, "{server:?}");
        let summary = server.summary();
        assert!(
            summary.min > 0.0 && summary.p50 <= summary.max,
            "{summary:?}"
        );
    }
    assert_files(&folder.path().join("out"), &["metrics.csv", "metrics.png"]);
    let json = read_json(&folder.path().join("figures.json"));
    assert_eq!(json["servers"].as_array().unwrap().len(), 3);
}
