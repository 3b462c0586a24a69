//! `chaos` crashes an outbox/inbox payments pipeline at named fault points and
//! proves, from the database rows and every message on the topic, whether each
//! payment produced exactly one receipt.
//!
//! # Layers
//!
//! In Jepsen's words: a system under test, a nemesis, a checker. The modules
//! are layers, from the bottom up, and each uses only those below it
//! (`tests/layers.rs` checks it):
//!
//! 1. `error`, [`domain`]: typed errors, and the words every layer shares.
//! 2. [`faults`]: the fault point registry, seeded decisions, what fired.
//! 3. [`scenario`]: the raw TOML and the validated [`scenario::Scenario`].
//! 4. [`broker`], [`store`]: the services' adapters (Kafka and its mock
//!    cluster; PostgreSQL and SQLite); `provider`: the third party's
//!    stand-in (an HTTP email provider whose record is ground truth).
//!    `context`: what every part of one run shares (its scenario, store,
//!    broker, injector, counters and shutdown signal).
//! 5. [`verifier`]: the checker, which reads the ground truth and never the
//!    system under test.
//! 6. `pipeline`: the reference system under test.
//! 7. [`nemesis`]: faults from outside the components (the timeline, the
//!    fault proxy, processes killed and paused).
//! 8. `report`: what people and CI read.
//! 9. `harness`: one run, start to finish.
//! 10. `campaigns`: many runs (sweep, shrink, selftest, bench).
//! 11. [`commands`]: one function per subcommand; the only place that
//!     prints and decides exit codes.
//!
//! Eight of them are public; the others stay inside, and the root
//! re-exports the few items the binary and the tests use from them.
//!
//! docs/development.md's Layout section lists the files of each.

#[macro_use]
pub mod domain;

pub mod broker;
pub mod commands;
pub mod faults;
pub mod nemesis;
pub mod scenario;
pub mod store;
pub mod verifier;

pub(crate) mod campaigns;
pub(crate) mod context;
pub(crate) mod error;
pub(crate) mod harness;
pub(crate) mod pipeline;
pub(crate) mod provider;
pub(crate) mod report;

// What the binary and the tests use from the layers that stay inside.
pub use campaigns::selftest::{Variant, CATALOGUE};
pub use context::{shutdown_pair, ShutdownTrigger};
pub use error::{redact, Error};
pub use harness::interrupt::deliver as deliver_interrupt;
pub use harness::run::{execute, Quiet};
pub use pipeline::{inbox::apply_batch, notifier::incoming};
pub use report::schema::json_schema as report_json_schema;
