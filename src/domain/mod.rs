//! The words every layer shares: the message envelope, the record of
//! intent, the run's names, and the `choices!` enums.

#[macro_use]
pub mod choices;

pub(crate) mod anomaly;
pub mod canonical;
pub mod events;
pub(crate) mod handlers;
pub mod intent;
pub mod names;
pub mod operations;
pub(crate) mod rows;
