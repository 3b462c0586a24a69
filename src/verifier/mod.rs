//! The verifier: reads the ground truth (database rows and every message on
//! the topic), reconciles it, and decides a verdict. It never trusts the
//! components' own counters.
//!
//! - [`topic`]: reads every partition from the beginning to its high watermark.
//! - [`reconcile`]: pure functions from ground truth to counts, invariants,
//!   anomalies and verdict; unit-tested on hand-made rows.

pub mod reconcile;
pub mod topic;

pub use reconcile::{reconcile, Anomaly, Counts, Invariant, Verdict};
