//! What a server shows its operator: the scrape-time collector that
//! reads the server's state and the data path's [`crate::metrics`] for
//! `/metrics` (`collect.rs`), the admin HTTP port that serves them with the
//! status document, the health checks and the status page (`http.rs`),
//! and that port's own client (`get.rs`).

mod collect;
mod get;
mod http;

pub use get::get;
pub use http::{serve_admin, AdminServer};
