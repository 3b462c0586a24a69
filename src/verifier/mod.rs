//! The verifier: reads the ground truth (the workload's record of intent,
//! the database rows and every message on the topic), reconciles it, and
//! decides a verdict. It never trusts the components' own counters.
//!
//! - [`topic`]: reads every partition from its low to its high watermark,
//!   and checks that it read exactly that many messages.
//! - [`spec`]: the specification it holds itself: which handlers each event
//!   type must reach. Never taken from the system under test.
//! - [`pass`]: one run's verification pass, from the reads to the stories.
//! - [`ledger`]: the [`Ledger`], the ground truth kept compact (a few dozen
//!   bytes per payment, event and message, fed row by row as it streams in).
//! - [`reconcile`]: the checks, pure functions from the ledger to counts,
//!   invariants and anomalies; unit-tested on hand-made rows.
//! - [`emails`]: the checks of effects outside the database, the emails in
//!   the provider's record against the intent and the receipt rows.
//! - [`verdict`]: anomalies and confirmed chaos to a verdict.
//! - [`attribution`]: which faults fired just before each anomaly's
//!   examples were last written, from their timestamps and the fault log.
//! - [`story`]: each anomaly example's payment on one line of time, for the HTML report.
//! - [`declared`]: the generic verifier of a declared system (`[system]`):
//!   the record of intent, the outbox log, the topic and the declared queries.
//! - [`latency`]: end-to-end latency percentiles, one computation for every backend.

pub(crate) mod attribution;
pub(crate) mod compose;
pub mod declared;
pub(crate) mod emails;
pub mod latency;
pub(crate) mod ledger;
pub(crate) mod pass;
pub(crate) mod reconcile;
pub(crate) mod spec;
pub(crate) mod story;
pub(crate) mod topic;
pub(crate) mod verdict;

#[cfg(test)]
mod tests;

pub use ledger::Ledger;
pub use reconcile::{Anomaly, AnomalyKind, Counts, Invariant, Spec};
pub use story::{add_provider_calls, Calls};
pub use verdict::Verdict;
