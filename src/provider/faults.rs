//! Faults struck at the email provider, decided through [`Nemesis`] so the
//! run's fault injector can be plugged in, and counted fired and confirmed
//! so a report can say "provider.error fired 3, confirmed 3".

use super::record::Body;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

choices! {
    /// A fault the provider can strike a request that would send an email.
    Fault {
        /// Send the email, then drop the connection with no response at all:
        /// the client cannot tell whether the email went out.
        ResponseLost = "provider.response_lost",
        /// Answer `503` before sending; the idempotency key is not stored.
        Error = "provider.error",
        /// Send the email, then hold the answer for `slow_for` (longer than
        /// a client's timeout).
        Slow = "provider.slow",
    }
}

/// Decides which requests a fault strikes, and hears which firings were seen
/// to take effect. The run's fault injector implements it; [`NoFaults`]
/// strikes nothing.
pub trait Nemesis: Send + Sync + 'static {
    /// Called once per request that would send (a new idempotency key or no
    /// key): which fault, if any, strikes it.
    fn decide(&self, key: Option<&str>) -> Option<Fault>;
    /// Called once per firing when the provider has seen what confirms it:
    /// the retry after `Error` or `ResponseLost`, the end of the hold for `Slow`.
    fn confirmed(&self, fault: Fault);
}

/// A provider that never fails: every request is answered at once.
#[cfg(test)]
#[derive(Debug, Clone, Copy, Default)]
pub struct NoFaults;

#[cfg(test)]
impl Nemesis for NoFaults {
    fn decide(&self, _key: Option<&str>) -> Option<Fault> {
        None
    }

    fn confirmed(&self, _fault: Fault) {}
}

/// How often one fault fired at the provider and how many of those firings
/// were confirmed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tally {
    /// Requests the fault struck.
    pub fired: u64,
    /// Firings whose effect was seen (a retry arrived, a hold ended).
    pub confirmed: u64,
}

/// Every fault's tally, zeros included, keyed by fault.
pub type Tallies = BTreeMap<Fault, Tally>;

pub(super) fn empty_tallies() -> Tallies {
    Fault::ALL.iter().map(|f| (*f, Tally::default())).collect()
}

/// A firing of `Error` or `ResponseLost` waiting for the retry that confirms it.
#[derive(Debug)]
pub(super) struct Awaiting {
    /// The fault that fired.
    pub fault: Fault,
    /// The idempotency key of the request it struck; a retry repeats it.
    pub key: Option<String>,
    /// The body of the request it struck; a keyless retry repeats it.
    pub body: Body,
}

impl Awaiting {
    /// Whether a request with this key and body is the retry of the struck
    /// one: the same idempotency key, or the same body when it had no key.
    pub fn retried_by(&self, key: Option<&str>, body: &Body) -> bool {
        match &self.key {
            Some(k) => key == Some(k.as_str()),
            None => *body == self.body,
        }
    }
}
