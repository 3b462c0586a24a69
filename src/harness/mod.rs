//! One run: the services it talks to, the components it starts, the drain,
//! the verification pass and the report.

pub mod component;
pub mod infra;
pub mod interrupt;
pub mod run;
