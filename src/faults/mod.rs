//! The fault injector: named fault points, seeded decisions, and a log of
//! everything that fired.
//!
//! A decision is a pure function of (seed, fault point, occurrence): the n-th
//! time any component reaches `relay.after_produce` gets the same answer on
//! every run with the same seed, whatever the backend. Which relay reaches it
//! n-th depends on thread scheduling, which no seed controls.

mod decide;
mod injector;
mod log;
mod registry;
mod schedule;
#[cfg(test)]
mod tests;

pub use decide::decide;
pub use injector::*;
pub use log::*;
pub use registry::*;
pub use schedule::*;
