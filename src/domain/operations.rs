//! The record of intent of a declared system (docs/contract.md section 8):
//! each operation the workload asked the user's service for, with its key,
//! its values and how it ended. The verifier's expectations come from
//! here, never from the system it judges.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

choices! {
    /// How an operation ended, as the workload saw it.
    Outcome {
        /// A 2xx answer: its events must exist, once each.
        Acknowledged = "acknowledged",
        /// A 4xx answer, or the service never reachable: no event may exist.
        Refused = "refused",
        /// A 5xx, a timeout or a connection that broke mid-request: its
        /// events exist once each, or not at all.
        Ambiguous = "ambiguous",
    }
}

/// One operation the workload asked for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Operation {
    /// The key `chaos` generated: `{key}` in the request.
    pub key: Uuid,
    /// Its values, in the declaration's order.
    pub values: Vec<serde_json::Value>,
    pub outcome: Outcome,
    /// The HTTP status, or 0 when there was no answer.
    pub status: u16,
    /// When it was sent and when it ended, in ms on the fault log's clock.
    pub sent_ms: u64,
    pub done_ms: u64,
}
