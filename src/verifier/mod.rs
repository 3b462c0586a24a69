//! The verifier: reads the ground truth (database rows and every message on
//! the topic), reconciles it, and decides a verdict. It never trusts the
//! components' own counters.
//!
//! - [`topic`]: reads every partition from the beginning to its high watermark.
//! - [`reconcile`]: the [`Ledger`], the ground truth kept compact (a few dozen
//!   bytes per payment and per message, fed row by row as it streams in), and
//!   pure functions from it to counts, invariants, anomalies and verdict;
//!   unit-tested on hand-made rows.

pub mod reconcile;
pub mod topic;

pub use reconcile::{Anomaly, Counts, Invariant, Ledger, Verdict};
