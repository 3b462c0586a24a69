//! Faults struck from outside the components: the scenario's timeline of
//! service faults, the fault proxy on the wires, and programs under test
//! run as OS processes that the harness kills and pauses.

pub mod acting;
pub(crate) mod process;
pub mod proxy;
pub mod signal;
pub(crate) mod timeline;
