//! The admin port of every server of a cluster: `/metrics`, `/status`,
//! the health checks and the status page, read over HTTP as an operator's
//! tools read them; the ack-latency histogram counts exactly the messages
//! acknowledged.

use std::net::SocketAddr;
use std::time::Duration;

use crate::harness::{create_on_three, publisher};

/// One GET of an admin endpoint: the status code and the body.
pub async fn http_get(address: SocketAddr, path: &str) -> (u16, String) {
    server::observe::get(address, path, Duration::from_secs(10))
        .await
        .expect("the admin port answers within 10 s")
}

/// The value of the sample `name{labels}` (labels as written, in order),
/// or of `name` alone.
pub fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|line| {
        let rest = line.strip_prefix(series)?;
        rest.strip_prefix(' ')?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    })
}

/// The metric families of a `/metrics` answer (`# TYPE` lines).
fn families(metrics: &str) -> Vec<String> {
    metrics
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

/// docs/operations.md names every family a server exposes, and the
/// Grafana dashboard in docs/ queries no series a server does not.
fn every_family_is_documented_and_the_dashboard_reads_only_these(metrics: &str) {
    let docs = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs");
    let families = families(metrics);
    assert!(families.len() > 30, "{families:?}");
    let operations = std::fs::read_to_string(docs.join("operations.md")).unwrap();
    for family in &families {
        assert!(
            operations.contains(&format!("`{family}`")),
            "docs/operations.md does not list {family}"
        );
    }
    let dashboard = std::fs::read_to_string(docs.join("grafana-dashboard.json")).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(&dashboard).unwrap();
    let mut queried = 0;
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            for (at, _) in expr.match_indices("stamplog_") {
                let name: String = expr[at..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                let known = families.iter().any(|family| {
                    ["", "_total", "_bucket", "_count", "_sum"]
                        .iter()
                        .any(|suffix| name == format!("{family}{suffix}"))
                });
                assert!(
                    known,
                    "the dashboard queries {name}, which no server exposes"
                );
                queried += 1;
            }
        }
    }
    assert!(queried >= 20, "the dashboard queries {queried} series");
}

/// A three-server cluster, each server with an admin port.
async fn observed_cluster(folder: &std::path::Path) -> server::LocalCluster {
    server::LocalCluster::start(3, folder, |config| {
        config.admin_listen = Some(SocketAddr::from(([127, 0, 0, 1], 0)));
    })
    .await
    .unwrap()
}

/// The admin address of server `id` of `cluster` (started with one).
pub fn admin_address(cluster: &server::LocalCluster, id: u32) -> SocketAddr {
    let server = cluster.servers.iter().find(|s| s.id == id).unwrap();
    server.admin.as_ref().expect("an admin port").address
}

#[tokio::test]
async fn every_server_serves_metrics_status_health_and_the_status_page() {
    let folder = tempfile::tempdir().unwrap();
    let cluster = observed_cluster(folder.path()).await;
    let (client, info) =
        create_on_three(&cluster, "observed", client::Protocol::OneHopAckClient).await;
    let sent = 500u64;
    let publisher = publisher(&info, 64, 30_000).await;
    for index in 0..sent {
        publisher.send(b"k", &index.to_le_bytes()).await.unwrap();
    }
    assert_eq!(
        crate::harness::fetch_visible(&client, info.id, sent as usize)
            .await
            .len() as u64,
        sent
    );
    let primary = info.primary;

    for server in &cluster.servers {
        let admin = admin_address(&cluster, server.id);
        assert_eq!(http_get(admin, "/health/live").await.0, 200);
        // Ready once the server is in the view and its replica in sync.
        let mut ready = (0, String::new());
        for _ in 0..100 {
            ready = http_get(admin, "/health/ready").await;
            if ready.0 == 200 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(ready, (200, "ready\n".to_string()), "server {}", server.id);

        let (code, status) = http_get(admin, "/status").await;
        assert_eq!(code, 200);
        let status: serde_json::Value = serde_json::from_str(&status).unwrap();
        assert_eq!(status["member"], server.id);
        assert_eq!(status["cluster"]["members"].as_array().unwrap().len(), 3);
        assert_eq!(status["cluster"]["streams"][0]["name"], "observed");
        assert_eq!(status["streams"][0]["last_version"], sent);

        let (code, page) = http_get(admin, "/").await;
        assert_eq!(code, 200);
        assert!(page.contains("<title>stamplog status</title>"), "{page}");

        let (code, metrics) = http_get(admin, "/metrics").await;
        assert_eq!(code, 200);
        assert!(
            metrics.ends_with("# EOF\n"),
            "OpenMetrics text ends with # EOF"
        );
        let stream = r#"{stream="observed",protocol="one-hop-ack-client"}"#;
        assert_eq!(
            sample(&metrics, "stamplog_view"),
            status["cluster"]["view"].as_f64()
        );
        assert_eq!(sample(&metrics, "stamplog_members"), Some(3.0));
        assert_eq!(
            sample(
                &metrics,
                r#"stamplog_stream_in_sync_replicas{stream="observed"}"#
            ),
            Some(3.0)
        );
        assert_eq!(
            sample(&metrics, r#"stamplog_stream_primary{stream="observed"}"#),
            Some(primary as f64)
        );
        assert_eq!(
            sample(&metrics, &format!("stamplog_log_appends_total{stream}")),
            Some(sent as f64)
        );
        assert_eq!(sample(&metrics, "stamplog_ready"), Some(1.0));
        assert_eq!(
            sample(&metrics, &format!("stamplog_log_failed{stream}")),
            Some(0.0)
        );
        assert_eq!(sample(&metrics, "stamplog_damaged_copies"), Some(0.0));
        // One stream per server: every round of the journal is that
        // stream's alone, written into its own segment, never a frame.
        let direct = sample(&metrics, "stamplog_journal_direct_writes_total").unwrap();
        assert!(direct >= 1.0, "direct writes: {direct}");
        // One message at a time, each sent as soon as the one before was
        // acknowledged: the readers that append the records write most of
        // them, on the primary too (its forwards go out at once, though
        // the `Commit`s of the record before left just then), and on the
        // backups (a record read with the `Commit` before it is no batch).
        let in_place = sample(&metrics, "stamplog_journal_in_place_writes_total").unwrap();
        assert!(
            in_place >= sent as f64 / 2.0 && in_place <= direct,
            "server {}: written in place {in_place} of {direct}",
            server.id
        );
        assert_eq!(sample(&metrics, "stamplog_journal_rounds_total"), Some(0.0));
        let synced = sample(&metrics, "stamplog_log_records_per_fdatasync_sum").unwrap();
        assert!(synced >= sent as f64, "every record was synced: {synced}");
        let durable = sample(&metrics, "stamplog_log_append_to_durable_seconds_count").unwrap();
        assert!(
            durable >= sent as f64,
            "every record was timed to durable: {durable}"
        );
        // The primary answered every write: its ack-latency histogram
        // counts each message once; a backup answers none.
        let acks = sample(
            &metrics,
            &format!("stamplog_ack_latency_seconds_count{stream}"),
        );
        if server.id == primary {
            every_family_is_documented_and_the_dashboard_reads_only_these(&metrics);
            assert_eq!(acks, Some(sent as f64), "the primary's ack count");
            let inf = r#"stamplog_ack_latency_seconds_bucket{le="+Inf",stream="observed",protocol="one-hop-ack-client"}"#;
            assert_eq!(
                sample(&metrics, inf),
                acks,
                "buckets are cumulative to +Inf"
            );
            let bytes = sample(&metrics, "stamplog_client_received_bytes_total").unwrap();
            assert!(bytes > (sent * 8) as f64, "bytes in: {bytes}");
        } else {
            assert_eq!(acks, None, "server {} acknowledged nothing", server.id);
        }
    }
}

#[tokio::test]
async fn a_stopped_member_shows_as_an_under_replicated_stream_and_a_failover() {
    let folder = tempfile::tempdir().unwrap();
    let mut cluster = server::LocalCluster::start(3, folder.path(), |config| {
        config.admin_listen = Some(SocketAddr::from(([127, 0, 0, 1], 0)));
        crate::harness::fast(config);
    })
    .await
    .unwrap();
    let (_client, info) =
        create_on_three(&cluster, "watched", client::Protocol::OneHopAckClient).await;
    let primary = info.primary;
    let survivor = (1..=3).find(|&id| id != primary).unwrap();
    let admin = admin_address(&cluster, survivor);
    cluster.stop_server(primary).await;
    let mut metrics = String::new();
    for _ in 0..200 {
        metrics = http_get(admin, "/metrics").await.1;
        let failovers = sample(
            &metrics,
            r#"stamplog_stream_failovers_total{stream="watched"}"#,
        );
        if failovers >= Some(1.0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(sample(&metrics, "stamplog_members"), Some(2.0), "{metrics}");
    assert_eq!(
        sample(&metrics, "stamplog_under_replicated_streams"),
        Some(1.0)
    );
    assert_eq!(
        sample(
            &metrics,
            r#"stamplog_stream_in_sync_replicas{stream="watched"}"#
        ),
        Some(2.0)
    );
    assert_eq!(
        sample(
            &metrics,
            r#"stamplog_stream_failovers_total{stream="watched"}"#
        ),
        Some(1.0)
    );
    let new_primary = sample(&metrics, r#"stamplog_stream_primary{stream="watched"}"#).unwrap();
    assert!(new_primary != primary as f64 && new_primary != 0.0);
    let status: serde_json::Value =
        serde_json::from_str(&http_get(admin, "/status").await.1).unwrap();
    let transitions = status["cluster"]["transitions"].to_string();
    assert!(transitions.contains("failed over"), "{transitions}");
}

/// The headless browser of the status-page test: `STAMPLOG_CHROMIUM`, or
/// the first of chromium, chromium-browser and google-chrome on the path.
fn browser() -> Option<std::path::PathBuf> {
    if let Some(path) = std::env::var_os("STAMPLOG_CHROMIUM") {
        return Some(path.into());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).find_map(|folder| {
        ["chromium", "chromium-browser", "google-chrome"]
            .iter()
            .map(|name| folder.join(name))
            .find(|candidate| candidate.is_file())
    })
}

/// Runs the headless browser on `url` with `action` (`--dump-dom`, or
/// `--screenshot=PATH`), letting the page's scripts run for 4 s of its
/// time first; what it printed on stdout.
async fn headless(browser: &std::path::Path, url: &str, action: &str) -> String {
    let mut command = std::process::Command::new(browser);
    command.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        "--window-size=1280,900",
        "--virtual-time-budget=4000",
        "--timeout=30000",
        action,
        url,
    ]);
    let output = tokio::task::spawn_blocking(move || command.output())
        .await
        .unwrap()
        .expect("the browser starts");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// The rows of the body of the table `id` in a dumped page.
fn table_rows(dom: &str, id: &str) -> Vec<String> {
    let start = dom.find(&format!("<table id=\"{id}\"")).expect("the table");
    let table = &dom[start..start + dom[start..].find("</table>").unwrap()];
    let body = &table[table.find("<tbody>").expect("a body")..];
    body.split("<tr>").skip(1).map(str::to_string).collect()
}

/// The width and height of a PNG file's image.
fn png_size(bytes: &[u8]) -> (u32, u32) {
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "a PNG file");
    assert_eq!(&bytes[12..16], b"IHDR");
    let number = |at: usize| u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap());
    (number(16), number(20))
}

/// A person's view: the status page of a three-server cluster in a real
/// headless browser shows the three members, the stream and its primary,
/// read from the page the browser rendered after its script ran; and a
/// screenshot of it (`STAMPLOG_SCREENSHOT=docs/status-page.png` keeps it).
#[tokio::test]
async fn the_status_page_shows_the_cluster_in_a_headless_browser() {
    let Some(browser) = browser() else {
        assert!(
            std::env::var_os("STAMPLOG_REQUIRE_BROWSER").is_none(),
            "STAMPLOG_REQUIRE_BROWSER is set and no chromium was found"
        );
        eprintln!("SKIPPED: no chromium on the path (set STAMPLOG_CHROMIUM)");
        return;
    };
    let folder = tempfile::tempdir().unwrap();
    let cluster = observed_cluster(folder.path()).await;
    let (_client, info) =
        create_on_three(&cluster, "orders", client::Protocol::OneHopAckClient).await;
    let publisher = publisher(&info, 64, 30_000).await;
    for index in 0..300u64 {
        publisher.send(b"k", &index.to_le_bytes()).await.unwrap();
    }
    let admin = admin_address(&cluster, 1);
    let url = format!("http://{admin}/");

    let dom = headless(&browser, &url, "--dump-dom").await;
    assert!(
        dom.contains("server 1 at "),
        "the page names its server: {dom}"
    );
    assert!(
        dom.contains("id=\"error\" style=\"display: none;\""),
        "no error shown: {dom}"
    );
    let members = table_rows(&dom, "members");
    assert_eq!(members.len(), 3, "three members: {members:?}");
    for id in 1..=3 {
        assert!(
            members
                .iter()
                .any(|row| row.contains(&format!("<td>server {id}</td>"))),
            "server {id} is a member: {members:?}"
        );
    }
    let streams = table_rows(&dom, "streams");
    assert_eq!(streams.len(), 1, "{streams:?}");
    let row = &streams[0];
    assert!(row.contains(">orders<"), "{row}");
    assert!(row.contains("one-hop-ack-client"), "{row}");
    assert!(
        row.contains(&format!("<td>server {}</td>", info.primary)),
        "the primary: {row}"
    );
    assert!(
        row.contains("<td class=\"num\">300</td>"),
        "300 versions: {row}"
    );
    assert!(!row.contains("class=\"bad\""), "no log failed: {row}");

    let shot = folder.path().join("status-page.png");
    headless(&browser, &url, &format!("--screenshot={}", shot.display())).await;
    let bytes = std::fs::read(&shot).expect("the browser wrote the screenshot");
    assert_eq!(png_size(&bytes), (1280, 900));
    if let Some(keep) = std::env::var_os("STAMPLOG_SCREENSHOT") {
        std::fs::copy(&shot, keep).unwrap();
    }
    cluster.stop().await;
}

/// A stream of one server written with `Append` (the single-server path):
/// its ack-latency histogram counts each acknowledged message once.
#[tokio::test]
async fn appends_to_a_single_server_stream_are_timed_once_each() {
    let folder = tempfile::tempdir().unwrap();
    let cluster = server::LocalCluster::start(1, folder.path(), |config| {
        config.admin_listen = Some(SocketAddr::from(([127, 0, 0, 1], 0)));
    })
    .await
    .unwrap();
    let address = cluster.address(1).to_string();
    let client = client::Client::connect(client::ClientConfig::new(address))
        .await
        .unwrap();
    let info = client
        .create_stream("single", proto::DurabilityConfig::Sync)
        .await
        .unwrap();
    let mut producer = client.producer(info.id);
    let mut pending = Vec::new();
    for index in 0..200u64 {
        pending.push(producer.submit(b"", &index.to_le_bytes()).await.unwrap());
    }
    for ack in pending {
        ack.await.unwrap();
    }
    let (_, metrics) = http_get(admin_address(&cluster, 1), "/metrics").await;
    let count =
        r#"stamplog_ack_latency_seconds_count{stream="single",protocol="one-hop-ack-client"}"#;
    assert_eq!(sample(&metrics, count), Some(200.0), "{metrics}");
    cluster.stop().await;
}
