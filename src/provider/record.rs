//! The provider's record: every request it received and what it did with
//! each. It is the harness's ground truth for emails, held outside the
//! system under test, so a verifier can count emails without trusting the
//! database of the pipeline that sent them.

use serde::{Deserialize, Serialize};
use std::time::Duration;

/// One request to `POST /v1/emails`, as the provider saw and answered it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Request {
    /// Its place in arrival order, from 0; a snapshot of the record is sorted by it.
    pub seq: u64,
    /// When it arrived (its body read in full), since the provider started.
    pub at: Duration,
    /// Its `Idempotency-Key` header, if it had one.
    pub key: Option<String>,
    /// What it asked to send.
    pub body: Body,
    /// What the provider did with it.
    pub outcome: Outcome,
}

/// A request's body: parsed JSON when it parses, the raw text otherwise.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Body {
    /// The body parsed as JSON (an object unless the outcome is `BadRequest`).
    Json(serde_json::Value),
    /// A body that is not JSON, kept as (lossy UTF-8) text.
    Text(String),
}

/// What the provider did with one request. Only the `Sent*` outcomes sent
/// an email; every other one sent nothing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Outcome {
    /// Sent an email and answered `200 {"id": id}`.
    Sent {
        /// The email's id, `em_<n>`.
        id: String,
    },
    /// A repeated idempotency key with the same body: answered with the
    /// first answer again, sent nothing.
    Replayed {
        /// The id of the email the first request sent.
        id: String,
    },
    /// A repeated idempotency key with a different body: `409`, sent nothing.
    Conflict,
    /// The idempotency key's first request was still being sent: `409
    /// idempotency_key_in_use`, sent nothing.
    InUse,
    /// A body that is not a JSON object (or a key that is not text): `400`,
    /// sent nothing.
    BadRequest,
    /// The `Error` fault: `503` before sending; the key was not stored.
    Unavailable,
    /// The `ResponseLost` fault: sent, then the connection was dropped
    /// without a byte of response.
    SentResponseLost {
        /// The id of the email sent; a retry with the key replays it.
        id: String,
    },
    /// The `Slow` fault: sent, and the answer held back for `slow_for`.
    SentSlow {
        /// The id of the email sent.
        id: String,
    },
}

impl Outcome {
    /// The id of the email this request sent, if it sent one.
    pub fn sent(&self) -> Option<&str> {
        match self {
            Outcome::Sent { id } | Outcome::SentResponseLost { id } | Outcome::SentSlow { id } => Some(id),
            _ => None,
        }
    }
}

/// A snapshot of the provider's record, in arrival order.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// Every request received whose outcome is decided, sorted by `seq`.
    pub requests: Vec<Request>,
    /// When the provider started, in Unix milliseconds: each request's
    /// `at` counts from it.
    #[serde(default)]
    pub started_epoch_ms: i64,
}

impl Record {
    /// Only the requests that actually sent an email: what a verifier counts.
    pub fn emails_sent(&self) -> Vec<&Request> {
        self.requests.iter().filter(|r| r.outcome.sent().is_some()).collect()
    }

    /// The outcomes alone, in arrival order (for tests and reports).
    pub fn outcomes(&self) -> Vec<&Outcome> {
        self.requests.iter().map(|r| &r.outcome).collect()
    }
}
