//! `chaos` crashes an outbox/inbox payments pipeline at named fault points and
//! proves, from the database rows and every message on the topic, whether each
//! payment produced exactly one receipt.
//!
//! # Layout
//!
//! - [`names`]: the `choices!` enums (scenario choices, anomaly kinds).
//! - [`scenario`]: the raw TOML scenario and the validated [`scenario::Scenario`].
//! - [`broker`]: the broker boundary, what the pipeline asks of a broker;
//!   Kafka through rdkafka (with librdkafka's mock cluster for the embedded
//!   mode) is its adapter, and an in-memory broker serves the unit tests.
//!   No other module names rdkafka.
//! - [`infra`]: resolves which PostgreSQL and Kafka a run talks to, and names
//!   the run's own schema, topic and consumer group.
//! - [`store`]: every SQL statement the pipeline and the verifier run, behind one
//!   interface with a PostgreSQL and a SQLite backend (the schema
//!   itself lives in `migrations/`).
//! - [`events`]: the message envelope shared by relay, notifier and verifier.
//! - [`workload`]: the payment service; writes payments and outbox events in one
//!   transaction, and keeps the [`intent`] record of what it committed.
//! - [`relay`]: outbox relays; claim, produce, `[relay.after_produce]`, mark.
//! - [`inbox`]: how a micro-batch claims and applies: the correct inbox and each
//!   classic mistake as its own strategy, and the pure core that plans effects.
//! - [`notifier`]: the inbox consumer; one transaction per micro-batch, then
//!   `[notifier.before_offset_commit]`, then the offset commit.
//! - [`program`]: a program under test (`[notifier] command`) as OS
//!   processes, killed and paused by the harness for real (docs/contract.md).
//! - [`component`]: the hidden `chaos component` subcommand, one reference
//!   relay or notifier as an OS process (`components = "process"`).
//! - [`proxy`]: the fault proxy between the components and PostgreSQL and
//!   Kafka: a port per component instance, shaping, resets, blackholes, and
//!   the faults that read each wire's framing (an acknowledgement withheld,
//!   a process killed right after one).
//! - [`nemesis`]: service faults on the scenario's timeline: the broker
//!   paused, killed or its partition leader killed, PostgreSQL restarted,
//!   sessions terminated, partitions of the proxied components.
//! - [`supervise`]: the one path every component crash and restart takes.
//! - [`faults`]: named fault points, seeded decisions and the log of what fired.
//! - [`verifier`]: reads the ground truth and reconciles it into counts,
//!   invariants, anomalies and a verdict.
//! - [`report`]: the JSON/Markdown report and the tables people read;
//!   [`html`]: the same report as one self-contained HTML page with charts;
//!   [`junit`]: the same verdicts as JUnit XML for CI pages.
//! - [`context`]: live counters and the shutdown signal every component shares.
//! - [`interrupt`]: Ctrl-C and SIGTERM as the binary delivers them to the library.
//! - [`progress`]: the live progress line on stderr.
//! - [`run`]: wires one run together: infra, components, drain, verify, report.
//! - [`selftest`]: the catalogue of classic mistakes the verifier must catch.
//! - [`sweep`]: one scenario over many seeds, with `--swarm` rates per seed;
//!   [`shrink`]: a failing seed's fault schedule made minimal.
//! - [`bench`]: throughput, latency and memory, against a pgbench yardstick.
//! - [`doctor`]: checks that PostgreSQL and Kafka answer.
//! - [`clean`]: removes the schemas, topics, groups and files of old runs.
//! - [`cli`]: the command line, parsed with clap; [`commands`]: one function per
//!   subcommand, which prints its result and picks its exit code.
//! - [`exit`] and [`error`]: exit codes in one place, typed errors.
//! - `testing` (built for tests only): unit-test support, one run's context on the in-memory
//!   broker and SQLite.

#[macro_use]
pub mod domain;

pub mod broker;
pub mod campaigns;
pub mod commands;
pub mod error;
pub mod faults;
pub mod harness;
pub mod nemesis;
pub mod pipeline;
pub(crate) mod report;
pub mod scenario;
pub mod store;
pub mod verifier;

pub use error::Error;
