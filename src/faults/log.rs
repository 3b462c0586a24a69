//! What fired and what it reached: the records the checkers read as the
//! run's fault history.

use super::*;
use crate::broker::{Position, Stretch};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// One fault that fired.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct FaultRecord {
    pub point: String,
    pub component: String,
    /// Milliseconds since the run started.
    pub at_ms: u64,
    /// What it hit, e.g. "batch of 12 events (first seq 340)".
    pub hit: String,
    /// Which occurrence of its point it was, counted from 0 across the
    /// run: what a [`Schedule`] names. None for a firing a component
    /// process reported, whose occurrences count in that process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub occurrence: Option<u64>,
    /// Which data it hit, when the component that struck it knows: what
    /// matches an anomaly's example to its cause
    /// ([`crate::verifier::attribution`]).
    #[serde(default, skip_serializing_if = "Reach::is_empty")]
    pub reach: Reach,
}

/// The data a firing hit: the outbox rows of a relay's batch, the topic
/// positions of a notifier's batch. Empty when the striker cannot know
/// (a proxy, a signal to a process).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Reach {
    /// The outbox seqs of the batch, as runs of consecutive seqs (first,
    /// last): a relay's claim skips rows other relays hold, so its batch
    /// need not be one range.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub seqs: Vec<(i64, i64)>,
    /// The topic positions of the batch: a stretch per lane (a consumer
    /// reads a lane in order).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub spans: Vec<Stretch>,
}

impl Reach {
    pub fn is_empty(&self) -> bool {
        self.seqs.is_empty() && self.spans.is_empty()
    }

    /// A batch of outbox rows, by their seqs in any order.
    pub fn outbox(seqs: impl IntoIterator<Item = i64>) -> Reach {
        let mut all: Vec<i64> = seqs.into_iter().collect();
        all.sort_unstable();
        all.dedup();
        let mut runs: Vec<(i64, i64)> = Vec::new();
        for s in all {
            match runs.last_mut() {
                Some(r) if r.1 + 1 == s => r.1 = s,
                _ => runs.push((s, s)),
            }
        }
        Reach { seqs: runs, spans: vec![] }
    }

    /// A batch of messages, by their positions.
    pub fn topic(messages: impl IntoIterator<Item = Position>) -> Reach {
        Reach { seqs: vec![], spans: Stretch::fold(messages).0 }
    }

    /// The run holding outbox seq `seq`, if any.
    pub fn seq_run(&self, seq: i64) -> Option<(i64, i64)> {
        self.seqs.iter().copied().find(|(a, b)| (*a..=*b).contains(&seq))
    }

    /// The stretch holding the message at `at`, if any.
    pub fn span_of(&self, at: Position) -> Option<Stretch> {
        self.spans.iter().copied().find(|s| s.contains(at))
    }
}

/// One batch a reference notifier received: what puts each delivery of a
/// message on an anomaly's story ([`crate::verifier::story`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeliveryRecord {
    pub component: String,
    /// Milliseconds since the run started.
    pub at_ms: u64,
    pub messages: u32,
    /// A stretch per lane the batch held (a consumer reads a lane in
    /// order, so the batch holds the stretch).
    pub spans: Vec<Stretch>,
}

impl DeliveryRecord {
    pub fn covers(&self, at: Position) -> bool {
        self.spans.iter().any(|s| s.contains(at))
    }
}

/// Per-point totals for the report.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct FaultSummary {
    pub point: String,
    pub unit: String,
    pub probability: f64,
    pub occurrences: u64,
    pub fired: u64,
    /// Firings whose effect the harness saw ([`FaultPoint::confirmed_by`]).
    #[serde(default)]
    pub confirmed: u64,
    /// Firings whose effect another fault pre-empted (the process killed
    /// by another point during a hold): neither confirmed nor missed.
    #[serde(default)]
    pub preempted: u64,
    /// Why each pre-empted firing had no effect of its own (the first few).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub preempted_why: Vec<String>,
    /// With `[nemesis] aimed = "per-second"`, an aimed kill's seconds of
    /// process life drawn, and the draws that armed a process: `probability`
    /// is then per second, `occurrences` counts the windows met and `fired`
    /// the armed ones struck. None for any other point.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub armed: Option<(u64, u64)>,
    /// Roles with a rate of their own for this aimed kill
    /// (`[faults.service]`), over `probability`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub per_role: Vec<(String, f64)>,
}

impl FaultSummary {
    /// Its rate as the reports show it: the scenario's, then each role's
    /// own (`0.1, service 0.3`).
    pub fn rates(&self) -> String {
        std::iter::once(self.probability.to_string())
            .chain(self.per_role.iter().map(|(role, rate)| format!("{role} {rate}")))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// An aimed kill's rate per second for one role's processes
/// (`[faults.service] db_kill_after_commit = 0.3`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoleRate {
    /// `service`, `relay` or `notifier`: the processes named `ROLE-N`.
    pub role: String,
    pub point: FaultPoint,
    pub rate: f64,
}

/// Every role's own rates.
pub type RoleRates = Vec<RoleRate>;

/// What the run's faults left for the checkers to read: when the run
/// started, every firing with its reach, what the notifiers received, and
/// the firings confirmed only by copies of an event on the topic. The
/// checkers read this value, never the injector: what they find confirmed
/// they return, and the harness writes it into the injector.
#[derive(Debug, Clone, Default)]
pub struct FaultHistory {
    pub started_epoch_ms: i64,
    pub log: Vec<FaultRecord>,
    pub deliveries: Vec<DeliveryRecord>,
    /// Each firing whose effect is `copies` copies of `event` on the topic.
    pub awaited_copies: Vec<(FaultPoint, uuid::Uuid, u8)>,
}

/// The report's per-point totals with what the checkers found confirmed
/// added: the injector keeps what the run recorded, and the checkers'
/// confirmations are computed from the history, never written back.
pub fn add_confirmed(summary: &mut [FaultSummary], confirmed: &[(FaultPoint, u64)]) {
    for (point, n) in confirmed {
        if let Some(s) = summary.iter_mut().find(|s| s.point == point.name()) {
            s.confirmed += n;
        }
    }
}
