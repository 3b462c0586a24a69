//! A scripted nemesis for the provider's and the email client's tests.

use super::{Fault, Nemesis};
use std::collections::VecDeque;
use std::sync::Mutex;

/// Answers `decide` from a queue of decisions (no fault once it is empty)
/// and remembers every confirmation.
#[derive(Default)]
pub(crate) struct Scripted {
    /// The decisions still to give, first first.
    decisions: Mutex<VecDeque<Option<Fault>>>,
    /// Every fault confirmed so far, in order.
    confirmed: Mutex<Vec<Fault>>,
}

impl Scripted {
    pub fn new(decisions: impl IntoIterator<Item = Option<Fault>>) -> Self {
        Scripted { decisions: Mutex::new(decisions.into_iter().collect()), confirmed: Mutex::default() }
    }

    /// The faults confirmed so far.
    pub fn seen_confirmed(&self) -> Vec<Fault> {
        self.confirmed.lock().unwrap().clone()
    }
}

impl Nemesis for Scripted {
    fn decide(&self, _key: Option<&str>) -> Option<Fault> {
        self.decisions.lock().unwrap().pop_front().flatten()
    }

    fn confirmed(&self, fault: Fault) {
        self.confirmed.lock().unwrap().push(fault);
    }
}
