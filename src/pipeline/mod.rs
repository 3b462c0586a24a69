//! The reference system under test: the payment service (workload), the
//! outbox relays, the notifier and its inbox, and the supervisor every
//! component crash and restart goes through.

pub mod inbox;
pub mod notifier;
pub mod purger;
pub(crate) mod relay;
pub(crate) mod supervise;
#[cfg(test)]
pub mod testing;
pub(crate) mod workload;
