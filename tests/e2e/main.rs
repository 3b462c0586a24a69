//! The end-to-end tests: one crate, so the library and librdkafka are
//! linked into one test binary instead of one per file. Each module is
//! the tests of one concern, against the real PostgreSQL and Kafka that
//! `scripts/test.sh` starts, or the embedded backends. The outage tests,
//! which stop those services, are a binary of their own (tests/lifecycle.rs).

mod backends;
mod bad_input;
mod bench;
mod common;
mod debezium;
mod declared;
mod docs;
mod foundation;
mod html;
mod infra;
mod node;
mod output;
mod payments;
mod programs;
mod proxy;
mod scenarios;
mod selftest;
mod sweep;
