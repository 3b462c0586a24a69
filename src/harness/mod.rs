//! One run: the services it talks to, the components it starts, the drain,
//! the verification pass and the report.

pub(crate) mod component;
pub(crate) mod emails;
pub(crate) mod infra;
pub mod interrupt;
pub(crate) mod run;
