//! `POST /v1/emails`: the provider's one endpoint, with idempotency keys as
//! Stripe has them, the record of every request, and the faults it strikes.

use super::faults::{empty_tallies, Awaiting, Fault, Nemesis, Tallies};
use super::record::{Body, EmailId, Form, IdempotencyKey, Outcome, Record, Request};
use super::ProviderSettings;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde_json::json;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::{watch, Notify};
use tracing::debug;

/// The header a client names its idempotency key in.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
/// The header set on an answer replayed for a repeated idempotency key.
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";

/// What every request handler shares: settings, the nemesis, the state.
pub(super) struct Shared {
    /// When the provider started: the record's `at` counts from it.
    pub started: Instant,
    /// The same moment as Unix milliseconds, so the record can be placed on
    /// the run's clock.
    pub started_epoch_ms: i64,
    /// How long a send and a slow answer take.
    pub settings: ProviderSettings,
    /// Decides which requests a fault strikes.
    pub nemesis: Arc<dyn Nemesis>,
    /// Becomes true when the provider shuts down.
    pub shutdown: watch::Receiver<bool>,
    /// The idempotency keys, the record and the fault tallies, behind one
    /// lock so a key's check and its claim are one step.
    pub state: Mutex<Inner>,
}

/// The provider's mutable state.
pub(super) struct Inner {
    /// The `seq` the next request to arrive gets.
    next_seq: u64,
    /// Emails sent so far; the next one's id is `em_<emails + 1>`.
    emails: u64,
    /// Every idempotency key seen with a request that was sent or is being
    /// sent, by [`key_id`]: a million keys then take tens of megabytes
    /// (their text, and an email id as text, took over two hundred).
    keys: HashMap<u128, KeyState>,
    /// The record, in the order outcomes were decided (sorted by `seq` on read).
    requests: Vec<Request>,
    /// Firings of `Error` and `ResponseLost` still waiting for their retry.
    awaiting: Vec<Awaiting>,
    /// Fired and confirmed, per fault.
    tallies: Tallies,
}

impl Default for Inner {
    fn default() -> Self {
        Inner {
            next_seq: 0,
            emails: 0,
            keys: HashMap::new(),
            requests: Vec::new(),
            awaiting: Vec::new(),
            tallies: empty_tallies(),
        }
    }
}

/// Where an idempotency key stands.
#[derive(Clone, Copy)]
enum KeyState {
    /// Its first request is being sent; a concurrent duplicate gets `409`.
    InProgress,
    /// Its first request sent this email; repeats with this body replay it.
    Done {
        /// A fingerprint of the body the email was sent with, taken from the
        /// parsed JSON so that key order and spacing do not matter; a
        /// fingerprint, not the body, so that a million keys stay small.
        body: u64,
        /// The id of the email sent.
        id: EmailId,
    },
}

/// An idempotency key as the provider's table holds it: 128 bits of two
/// SipHashes of its text. Two of a million keys share one with odds of
/// about 1 in 10^26, and a run's keys are not chosen to collide.
fn key_id(key: &str) -> u128 {
    use std::hash::{Hash, Hasher};
    let half = |salt: u8| {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (salt, key).hash(&mut h);
        h.finish()
    };
    (u128::from(half(0)) << 64) | u128::from(half(1))
}

/// A request's place in the record, fixed when it arrives.
#[derive(Debug, Clone, Copy)]
struct Arrival {
    /// Its place in arrival order.
    seq: u64,
    /// When it arrived, since the provider started.
    at: Duration,
}

/// This connection's kill switch: the handler fires it to have the
/// connection dropped before any byte of its response is written.
#[derive(Clone, Default)]
pub(super) struct Connection {
    /// Notified once to drop the connection.
    pub drop: Arc<Notify>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic elsewhere must not hide the record: it is still the truth.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A snapshot of the record, in arrival order.
    #[cfg(test)]
    pub fn record(&self) -> Record {
        let mut requests = self.lock().requests.clone();
        requests.sort_by_key(|r| r.seq);
        Record { requests, started_epoch_ms: self.started_epoch_ms, keep: self.settings.keep.clone() }
    }

    /// The record, moved out, in arrival order: for the verifier once the
    /// run is over, with no copy of a million requests. The provider's
    /// record and its keys are empty after it: call it once every client
    /// has stopped.
    pub fn take_record(&self) -> Record {
        let mut s = self.lock();
        // The keys serve requests only; a stopped provider frees them
        // before the verifier's peak (about 90 MB at a million keys).
        s.keys = HashMap::new();
        let mut requests = std::mem::take(&mut s.requests);
        drop(s);
        requests.sort_by_key(|r| r.seq);
        Record { requests, started_epoch_ms: self.started_epoch_ms, keep: self.settings.keep.clone() }
    }

    /// How many emails it sent so far.
    pub fn emails(&self) -> u64 {
        self.lock().emails
    }

    /// Every fault's tally.
    #[cfg(test)]
    pub fn tallies(&self) -> Tallies {
        self.lock().tallies.clone()
    }

    /// Numbers the request, and confirms any firing it is the retry of.
    fn arrive(&self, key: Option<&str>, body: &Body) -> Arrival {
        let mut confirmed = Vec::new();
        let arrival = {
            let mut s = self.lock();
            let arrival = Arrival { seq: s.next_seq, at: self.started.elapsed() };
            s.next_seq += 1;
            // Most requests find nothing awaiting: no lists built for them.
            if !s.awaiting.is_empty() {
                let (retried, waiting): (Vec<_>, Vec<_>) = s.awaiting.drain(..).partition(|a| a.retried_by(key, body));
                s.awaiting = waiting;
                for a in retried {
                    s.tallies.entry(a.fault).or_default().confirmed += 1;
                    confirmed.push(a.fault);
                }
            }
            arrival
        };
        // The nemesis's code runs outside the lock.
        for fault in confirmed {
            debug!(fault = fault.as_str(), seq = arrival.seq, "provider fault confirmed by a retry");
            self.nemesis.confirmed(fault);
        }
        arrival
    }

    /// Confirms a firing seen at once (the end of a `Slow` hold).
    fn confirm(&self, fault: Fault) {
        self.lock().tallies.entry(fault).or_default().confirmed += 1;
        debug!(fault = fault.as_str(), "provider fault confirmed");
        self.nemesis.confirmed(fault);
    }

    /// Writes a request into the record.
    fn note(s: &mut Inner, arrival: Arrival, key: Option<String>, body: Body, outcome: Outcome) {
        debug!(seq = arrival.seq, key = key.as_deref(), outcome = ?outcome, "provider request");
        let key = key.as_deref().map(IdempotencyKey::new);
        let at_ms = u32::try_from(arrival.at.as_millis()).unwrap_or(u32::MAX);
        s.requests.push(Request { seq: arrival.seq, at_ms, key, body, outcome });
    }

    /// Records a request that sent nothing.
    fn refused(&self, arrival: Arrival, key: Option<String>, body: Body, outcome: Outcome) {
        Self::note(&mut self.lock(), arrival, key, body, outcome);
    }

    /// Checks a repeated idempotency key and returns its answer, or claims a
    /// new one for this request and returns `None`.
    fn claim(&self, arrival: Arrival, key: &str, body: &Body) -> Option<Response> {
        let mut s = self.lock();
        let id = key_id(key);
        let (outcome, answer) = match s.keys.get(&id).copied() {
            None => {
                s.keys.insert(id, KeyState::InProgress);
                return None;
            }
            Some(KeyState::InProgress) => (
                Outcome::InUse,
                refuse(
                    StatusCode::CONFLICT,
                    "idempotency_key_in_use",
                    "another request with this idempotency key is in progress; retry later",
                ),
            ),
            Some(KeyState::Done { body: first, id }) if first == body.fingerprint => {
                (Outcome::Replayed { id }, accepted(id, true))
            }
            Some(KeyState::Done { .. }) => (
                Outcome::Conflict,
                refuse(
                    StatusCode::CONFLICT,
                    "idempotency_key_reused",
                    "this idempotency key was used with a different body",
                ),
            ),
        };
        Self::note(&mut s, arrival, Some(key.to_string()), body.clone(), outcome);
        Some(answer)
    }

    /// The `Error` fault: nothing sent, and the key released so a retry sends.
    fn unavailable(&self, arrival: Arrival, key: Option<String>, body: Body) {
        let mut s = self.lock();
        if let Some(k) = &key {
            s.keys.remove(&key_id(k));
        }
        s.tallies.entry(Fault::Error).or_default().fired += 1;
        s.awaiting.push(Awaiting { fault: Fault::Error, key: key.clone(), body: body.clone() });
        Self::note(&mut s, arrival, key, body, Outcome::Unavailable);
    }

    /// Sends the email: numbers it, records it, and stores the key's answer.
    fn send(&self, arrival: Arrival, key: Option<String>, body: Body, fault: Option<Fault>) -> EmailId {
        let mut s = self.lock();
        s.emails += 1;
        let id = EmailId(u32::try_from(s.emails).unwrap_or(u32::MAX));
        let outcome = match fault {
            Some(Fault::ResponseLost) => Outcome::SentResponseLost { id },
            Some(Fault::Slow) => Outcome::SentSlow { id },
            _ => Outcome::Sent { id },
        };
        if let Some(f) = fault {
            s.tallies.entry(f).or_default().fired += 1;
            if f == Fault::ResponseLost {
                s.awaiting.push(Awaiting { fault: f, key: key.clone(), body: body.clone() });
            }
        }
        if let Some(k) = &key {
            s.keys.insert(key_id(k), KeyState::Done { body: body.fingerprint, id });
        }
        Self::note(&mut s, arrival, key, body, outcome);
        id
    }
}

/// Confirms a `Slow` firing when dropped: when the hold ends, or when the
/// client hangs up first (the email went out either way).
struct Hold(Arc<Shared>);

impl Drop for Hold {
    fn drop(&mut self) {
        self.0.confirm(Fault::Slow);
    }
}

/// `200 {"id": id}`, marked replayed when it repeats a first answer.
fn accepted(id: EmailId, replayed: bool) -> Response {
    // Written directly: `em_<n>` needs no escaping, and no JSON tree is
    // built for each of a million answers.
    let json = HeaderValue::from_static("application/json");
    let mut answer =
        (StatusCode::OK, [(axum::http::header::CONTENT_TYPE, json)], format!(r#"{{"id":"{id}"}}"#)).into_response();
    if replayed {
        answer.headers_mut().insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    }
    answer
}

/// An error answer: `{"error": {"code": …, "message": …}}`.
fn refuse(status: StatusCode, code: &str, message: &str) -> Response {
    (status, Json(json!({ "error": { "code": code, "message": message } }))).into_response()
}

/// Sends the email, taking the settings' `send_takes`; `None` when the
/// provider shuts down first. A send that takes no time is done here, with
/// no await between the claim and the send for a client's hang-up to cut:
/// the reference runs' case, where a task per email was a measurable share
/// of its cost. A send that takes time runs in its own task: a client
/// hanging up mid-send must not leave an idempotency key claimed and never
/// sent, as a real provider would not.
async fn send_in_time(
    shared: &Arc<Shared>,
    arrival: Arrival,
    key: Option<String>,
    body: Body,
    fault: Option<Fault>,
) -> Option<EmailId> {
    if shared.settings.send_takes.is_zero() {
        return Some(shared.send(arrival, key, body, fault));
    }
    let shared = shared.clone();
    let mut shutdown = shared.shutdown.clone();
    let task = tokio::spawn(async move {
        tokio::select! {
            _ = tokio::time::sleep(shared.settings.send_takes) => {}
            _ = shutdown.wait_for(|down| *down) => return None,
        }
        Some(shared.send(arrival, key, body, fault))
    });
    task.await.ok().flatten()
}

/// `POST /v1/emails`.
pub(super) async fn post_email(
    State(shared): State<Arc<Shared>>,
    Extension(conn): Extension<Connection>,
    headers: HeaderMap,
    bytes: Bytes,
) -> Response {
    let header = headers.get(IDEMPOTENCY_KEY);
    let key = header.map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let key_is_text = header.is_none_or(|v| v.to_str().is_ok());
    // The record keeps a fingerprint and the fields a verifier reads, not
    // the body.
    let body = Body::read(&bytes, &shared.settings.keep);
    let arrival = shared.arrive(key.as_deref(), &body);

    match body.form {
        Form::Object if key_is_text => {}
        _ => {
            shared.refused(arrival, key, body, Outcome::BadRequest);
            return refuse(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                "the body must be a JSON object and the idempotency key text",
            );
        }
    };
    if let Some(k) = &key {
        if let Some(answer) = shared.claim(arrival, k, &body) {
            return answer;
        }
    }

    let fault = shared.nemesis.decide(key.as_deref());
    if fault == Some(Fault::Error) {
        debug!(seq = arrival.seq, key = key.as_deref(), "provider fault: error before sending");
        shared.unavailable(arrival, key, body);
        return refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "the provider is unavailable; retry with the same idempotency key",
        );
    }

    let Some(id) = send_in_time(&shared, arrival, key, body, fault).await else {
        return refuse(StatusCode::SERVICE_UNAVAILABLE, "shutting_down", "the provider is shutting down");
    };

    match fault {
        Some(Fault::ResponseLost) => {
            debug!(seq = arrival.seq, id = %id, "provider fault: sent, dropping the connection with no response");
            conn.drop.notify_one();
            // The connection is dropped before this answer could be written.
            std::future::pending().await
        }
        Some(Fault::Slow) => {
            let hold = Hold(shared.clone());
            debug!(seq = arrival.seq, id = %id, hold = ?shared.settings.slow_for, "provider fault: sent, holding the answer");
            tokio::time::sleep(shared.settings.slow_for).await;
            drop(hold);
            accepted(id, false)
        }
        _ => accepted(id, false),
    }
}
