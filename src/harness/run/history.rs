//! What a run recorded, taken once after every component stopped: the
//! checkers read this and the run's ground truth (the database's rows and
//! the topic, which they stream), never the system under test, and write
//! into nothing. As Jepsen's history: the operations asked for and how each
//! ended, and what the nemesis did with each firing's reach.

use crate::domain::intent::Intended;
use crate::domain::operations::Operation;
use crate::faults::{FaultHistory, FaultSummary, Schedule};
use crate::provider::Record;

pub(crate) struct History {
    /// The payments the workload committed: the reference pipeline's
    /// record of intent (empty for a declared system).
    pub intent: Vec<Intended>,
    /// A declared system's operations and how each ended (empty for the
    /// reference pipeline, whose checker takes them from `intent`).
    pub operations: Vec<Operation>,
    /// The fault log with each firing's reach, the notifiers' deliveries,
    /// and the firings the topic's copies confirm.
    pub faults: FaultHistory,
    /// The injector's totals per fault point: what it counted, before the
    /// checkers add what they find confirmed.
    pub summary: Vec<FaultSummary>,
    /// The firings, by occurrence, that replay the run (`--schedule`).
    pub fired: Schedule,
    /// The email provider's record of every request, when the run ran it.
    pub provider: Option<Record>,
    /// A component did not stop: something may still write, so the run
    /// cannot be judged.
    pub still_running: bool,
}
