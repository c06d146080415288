//! The admin HTTP port (axum): `/metrics` (Prometheus, OpenMetrics text),
//! `/status` (the JSON status document), `/health/live`, `/health/ready`
//! (200 once the server is in the view and every replica it holds is in
//! sync, 503 with the reason before) and `/` (the status page, one HTML
//! file that polls `/status`). It serves whatever server the process runs
//! now (`CurrentServer`), so it outlives a server's reopening after the
//! cluster removed it.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::collect::ServerCollector;
use crate::run::CurrentServer;
use crate::state::ServerState;

/// The status page: static HTML and a little JavaScript, no build step.
const STATUS_PAGE: &str = include_str!("status.html");

/// Requests the admin port serves at once; one more is answered 503 at
/// once (a scrape of many streams encodes megabytes: a flood of them must
/// not take the server's cores).
const ADMIN_REQUESTS_MAX: usize = 16;

/// The content type of the OpenMetrics text format, which Prometheus
/// scrapes.
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A running admin port; stops when dropped.
pub struct AdminServer {
    pub address: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl AdminServer {
    /// The URL of the status page.
    pub fn url(&self) -> String {
        format!("http://{}/", self.address)
    }

    /// Stops serving and waits for the task to end.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for AdminServer {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

/// Serves the admin endpoints of the server in `current` on `listener`
/// (on this runtime) until the returned handle is stopped or dropped.
pub fn serve_admin(listener: TcpListener, current: CurrentServer) -> std::io::Result<AdminServer> {
    let address = listener.local_addr()?;
    let app = Router::new()
        .route("/", get(page))
        .route("/metrics", get(metrics))
        .route("/status", get(status))
        .route("/health/live", get(live))
        .route("/health/ready", get(ready))
        .with_state(current);
    let app = bounded(app, ADMIN_REQUESTS_MAX);
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = stopped.await;
            })
            .await;
        if let Err(error) = served {
            tracing::warn!(%address, "the admin port stopped: {error}");
        }
    });
    Ok(AdminServer {
        address,
        stop: Some(stop),
        task: Some(task),
    })
}

/// `app` serving at most `requests` requests at once; one more is
/// answered 503 at once rather than queued.
fn bounded(app: Router, requests: usize) -> Router {
    let slots = Arc::new(tokio::sync::Semaphore::new(requests));
    app.layer(axum::middleware::from_fn_with_state(slots, take_slot))
}

/// Runs `request` while it holds one of the port's slots.
async fn take_slot(
    State(slots): State<Arc<tokio::sync::Semaphore>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let Ok(_slot) = slots.try_acquire() else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "the admin port is busy; retry in a moment\n",
        )
            .into_response();
    };
    next.run(request).await
}

/// 503 while the process opens its server again.
fn reopening() -> Response {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        "the server is opening again (it rejoins the cluster)\n",
    )
        .into_response()
}

async fn page() -> Response {
    (
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        STATUS_PAGE,
    )
        .into_response()
}

async fn metrics(State(current): State<CurrentServer>) -> Response {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(ServerCollector { current }));
    let mut text = String::new();
    match prometheus_client::encoding::text::encode(&mut text, &registry) {
        Ok(()) => ([(header::CONTENT_TYPE, OPENMETRICS)], text).into_response(),
        Err(error) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("encoding the metrics failed: {error}\n"),
        )
            .into_response(),
    }
}

async fn status(State(current): State<CurrentServer>) -> Response {
    match current.get() {
        Some(server) => (
            [(header::CONTENT_TYPE, "application/json")],
            server.status_json().to_string(),
        )
            .into_response(),
        None => reopening(),
    }
}

async fn live() -> Response {
    (StatusCode::OK, "live\n").into_response()
}

async fn ready(State(current): State<CurrentServer>) -> Response {
    let Some(server) = current.get() else {
        return reopening();
    };
    match not_ready(&server) {
        None => (StatusCode::OK, "ready\n").into_response(),
        Some(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {why}\n"),
        )
            .into_response(),
    }
}

/// Whether the server is ready: in the view, and caught up.
pub(crate) fn is_ready(server: &ServerState) -> bool {
    not_ready(server).is_none()
}

/// Why the server is not ready (it has not joined the view or opened its
/// streams; it was removed from the view; a replica it holds is not in
/// its stream's in-sync set yet), or `None`.
fn not_ready(server: &ServerState) -> Option<String> {
    if !server.is_ready() {
        return Some("it has not joined the cluster and opened its streams yet".to_string());
    }
    if *server.removed.borrow() {
        return Some("the cluster removed it from the view; it opens again".to_string());
    }
    let control = server.control.get()?;
    let state = Arc::clone(&control.state().borrow());
    let me = server.config.cluster.me;
    if !state.members.contains_key(&me) {
        return Some(format!("server {me} is not in view {}", state.view));
    }
    let behind: Vec<&str> = state
        .streams
        .values()
        .filter(|p| p.replicas.contains(&me) && !p.in_sync.contains(&me))
        .map(|p| p.name.as_str())
        .collect();
    if behind.is_empty() {
        None
    } else {
        Some(format!("replicas not in sync yet: {}", behind.join(", ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    /// Two requests held inside a bound of two: a third is answered 503
    /// at once, and once they are let go the port serves again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_request_past_the_bound_is_shed_with_503() {
        let entered = Arc::new(AtomicUsize::new(0));
        let release = Arc::new(tokio::sync::Semaphore::new(0));
        let slow = {
            let (entered, release) = (Arc::clone(&entered), Arc::clone(&release));
            move || async move {
                entered.fetch_add(1, Ordering::SeqCst);
                let _held = release.acquire().await;
                "done"
            }
        };
        let app = bounded(Router::new().route("/slow", get(slow)), 2);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        let timeout = Duration::from_secs(10);
        let held: Vec<_> = (0..2)
            .map(|_| tokio::spawn(crate::observe::get(address, "/slow", timeout)))
            .collect();
        while entered.load(Ordering::SeqCst) < 2 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let (code, body) = crate::observe::get(address, "/slow", timeout)
            .await
            .unwrap();
        assert_eq!(
            (code, body.as_str()),
            (503, "the admin port is busy; retry in a moment\n")
        );
        assert_eq!(
            entered.load(Ordering::SeqCst),
            2,
            "the shed request never ran"
        );
        release.add_permits(3);
        for request in held {
            assert_eq!(request.await.unwrap().unwrap(), (200, "done".to_string()));
        }
        let again = crate::observe::get(address, "/slow", timeout)
            .await
            .unwrap();
        assert_eq!(again, (200, "done".to_string()));
    }
}
