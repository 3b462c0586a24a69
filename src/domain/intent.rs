//! The harness's own record of intent: what the payment service committed,
//! kept by the workload itself and never read back from the database. The
//! verifier judges the database and the topic against it, so a payment
//! service that drops or invents a payment, or writes the wrong amount,
//! fails the run instead of redefining what "should exist".
//!
//! Compact and streaming: one 32-byte entry per payment, appended by each
//! producer after its commit returned, so a million payments cost 32 MB.

use std::sync::Mutex;
use uuid::Uuid;

/// One committed payment, as the workload knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Intended {
    pub id: Uuid,
    pub amount_cents: i64,
    pub account_id: i32,
    /// The capture transaction committed too.
    pub captured: bool,
    /// The capture wrote a malformed twin of its event (`workload.poison`).
    pub poison: bool,
}

/// Every payment the workload committed, from all its producers.
#[derive(Debug, Default)]
pub struct Intent {
    committed: Mutex<Vec<Intended>>,
}

impl Intent {
    /// A producer's record, handed over when it stops (whether it finished or
    /// failed: what it committed is committed either way).
    pub fn extend(&self, entries: Vec<Intended>) {
        let mut all = self.committed.lock().unwrap_or_else(|p| p.into_inner());
        all.extend(entries);
    }

    /// Everything recorded, leaving the record empty.
    pub fn take(&self) -> Vec<Intended> {
        std::mem::take(&mut *self.committed.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_stay_compact_and_hand_over_whole() {
        // A million payments in 32 MB: the record must not grow the run's RSS past its budget.
        assert!(std::mem::size_of::<Intended>() <= 32);
        let i = Intent::default();
        let e = Intended { id: Uuid::from_u128(1), amount_cents: 5, account_id: 2, captured: true, poison: false };
        i.extend(vec![e, e]);
        i.extend(vec![e]);
        assert_eq!(i.take().len(), 3);
        assert!(i.take().is_empty(), "taken once");
    }
}
