//! The email provider: a stand-in for a third party's HTTP email API (think
//! Stripe's, with idempotency keys) that `chaos` runs on 127.0.0.1 for each
//! run. A receipt is an email sent through it.
//!
//! Its record of every request is ground truth held by the harness, outside
//! the system under test: a verifier reads it to prove exactly one email per
//! captured payment. Faults strike at the provider through [`Nemesis`].
//!
//! `POST /v1/emails` takes a JSON object and an optional `Idempotency-Key`:
//! - a new key sends and answers `200 {"id": "em_<n>"}`;
//! - the same key and body again answers the same, with `Idempotent-Replayed:
//!   true`, and sends nothing;
//! - the same key with another body: `409 idempotency_key_reused`;
//! - the same key while its first request is being sent: `409
//!   idempotency_key_in_use`;
//! - no key sends every time; a body that is not a JSON object is a `400`.

pub mod client;
mod emails;
mod faults;
mod record;
#[cfg(test)]
pub(crate) mod testing;

pub use emails::IDEMPOTENT_REPLAYED;
pub use faults::{Fault, Nemesis};
#[cfg(test)]
pub use faults::{NoFaults, Tallies};
#[cfg(test)]
pub use record::{fingerprint, Body, EmailId, Form, IdempotencyKey, Scalar};
pub use record::{Outcome, Record, Request};

use crate::error::{Error, Result};
use axum::routing::post;
use axum::{Extension, Router};
use emails::{Connection, Shared};
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use serde::{Deserialize, Serialize};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tracing::{debug, info};

/// How the provider behaves.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProviderSettings {
    /// How long the `Slow` fault holds an answer after sending; longer than
    /// a client's timeout, so the client gives up on an email that went out.
    pub slow_for: Duration,
    /// How long sending one email takes. While it lasts the idempotency key
    /// is in progress and a concurrent duplicate gets `409`.
    pub send_takes: Duration,
    /// The top-level body fields the record keeps of each request (the
    /// rest is only fingerprinted): those a verifier reads.
    pub keep: Vec<String>,
}

/// The fields the reference notifier's receipts name their cause by.
pub const RECEIPT_FIELDS: [&str; 2] = ["payment_id", "message_id"];

impl Default for ProviderSettings {
    fn default() -> Self {
        ProviderSettings {
            slow_for: Duration::from_secs(3),
            send_takes: Duration::ZERO,
            keep: RECEIPT_FIELDS.map(String::from).to_vec(),
        }
    }
}

/// A running email provider on 127.0.0.1. Dropping it stops it, as
/// [`Provider::shutdown`] does without waiting.
pub struct Provider {
    /// Where it listens: always 127.0.0.1, on a port the system chose.
    addr: SocketAddr,
    /// The state every request handler shares: the record and the tallies.
    shared: Arc<Shared>,
    /// Set to true to stop the accept loop and every connection.
    stop: watch::Sender<bool>,
    /// The accept loop, taken by the first shutdown.
    server: Mutex<Option<JoinHandle<()>>>,
}

impl Provider {
    /// Starts a provider on 127.0.0.1 on a free port; `nemesis` decides
    /// which requests faults strike ([`NoFaults`] for none).
    pub async fn start(settings: ProviderSettings, nemesis: Arc<dyn Nemesis>) -> Result<Provider> {
        // Only the loopback address: the provider must never be reachable from elsewhere.
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .map_err(|e| Error::Tool(format!("cannot start the email provider on 127.0.0.1: {e}")))?;
        let addr =
            listener.local_addr().map_err(|e| Error::Tool(format!("cannot read the email provider's address: {e}")))?;
        let (stop, stopped) = watch::channel(false);
        let shared = Arc::new(Shared {
            started: Instant::now(),
            started_epoch_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as i64),
            settings,
            nemesis,
            shutdown: stopped.clone(),
            state: Default::default(),
        });
        let router = Router::new().route("/v1/emails", post(emails::post_email)).with_state(shared.clone());
        let server = tokio::spawn(accept(listener, router, stopped));
        info!(%addr, "email provider started");
        Ok(Provider { addr, shared, stop, server: Mutex::new(Some(server)) })
    }

    /// The address it listens on (127.0.0.1).
    #[cfg(test)]
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:<port>`, for a client.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A snapshot of the record: every request whose outcome is decided, in
    /// arrival order. Still readable after shutdown.
    #[cfg(test)]
    pub fn record(&self) -> Record {
        self.shared.record()
    }

    /// Stops serving, then moves the record out: for the verifier, once
    /// every client has stopped.
    pub async fn stop_and_take_record(&self) -> Record {
        self.shutdown().await;
        self.take_record()
    }

    /// The record, moved out (no copy): for the verifier, once every
    /// client has stopped. Later snapshots hold only later requests.
    pub fn take_record(&self) -> Record {
        self.shared.take_record()
    }

    /// How often each fault fired and was confirmed.
    #[cfg(test)]
    pub fn faults(&self) -> Tallies {
        self.shared.tallies()
    }

    /// Stops accepting, drops every connection (an answer still held is
    /// never sent) and waits until all of them are gone.
    pub async fn shutdown(&self) {
        self.stop.send_replace(true);
        let server = self.server.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(server) = server {
            let _ = server.await;
            info!(addr = %self.addr, emails = self.shared.emails(), "email provider stopped");
        }
    }
}

impl Drop for Provider {
    fn drop(&mut self) {
        self.stop.send_replace(true);
        if let Some(server) = self.server.lock().unwrap_or_else(|p| p.into_inner()).take() {
            server.abort();
        }
    }
}

/// Accepts connections until told to stop, then drops every one of them.
async fn accept(listener: TcpListener, router: Router, stop: watch::Receiver<bool>) {
    // Dropping the set at return aborts every connection task still running.
    let mut connections = JoinSet::new();
    let mut stopping = stop.clone();
    loop {
        tokio::select! {
            _ = stopping.wait_for(|down| *down) => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    connections.spawn(serve(stream, peer, router.clone(), stop.clone()));
                }
                Err(e) => debug!(error = %e, "email provider could not accept a connection"),
            },
            // Reap finished connections so the set does not grow with the run.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    connections.shutdown().await;
}

/// Serves one connection until it ends, the provider stops, or a handler
/// asks for it to be dropped with no response (`ResponseLost`).
async fn serve(stream: TcpStream, peer: SocketAddr, router: Router, mut stop: watch::Receiver<bool>) {
    // Each connection is served here, not by `axum::serve`, so a handler can
    // have this very connection dropped before its answer is written.
    let conn = Connection::default();
    let service = TowerToHyperService::new(router.layer(Extension(conn.clone())));
    let http = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service);
    tokio::select! {
        done = http => if let Err(e) = done {
            debug!(%peer, error = %e, "email provider connection ended with an error");
        },
        _ = conn.drop.notified() => debug!(%peer, "email provider dropped a connection with no response"),
        _ = stop.wait_for(|down| *down) => {}
    }
}

#[cfg(test)]
mod tests;
