//! Components as OS processes: a program under test, and the protocol a
//! component process speaks to the harness.

pub mod program;
pub mod protocol;
