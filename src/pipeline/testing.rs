//! Unit-test support: one run's context on the in-memory broker and a
//! SQLite file, so that a test can drive the real relay, notifier and
//! workload code and reconcile what they left, without Kafka.

use crate::broker::memory::Memory;
use crate::broker::Broker;
use crate::context::{shutdown_pair, Ctx, ShutdownTrigger, Stats};
use crate::domain::names::RunNames;
use crate::faults::FaultInjector;
use crate::store::{sqlite::SqliteStore, Store};
use crate::verifier::reconcile;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A run's context for a unit test, and what keeps it alive.
pub struct Harness {
    pub ctx: Ctx,
    trigger: ShutdownTrigger,
    _dir: tempfile::TempDir,
}

/// A context for the scenario `toml`, its topic created.
pub async fn harness(toml: &str) -> Harness {
    let sc = crate::scenario::parse(toml, std::path::Path::new("unit.toml")).expect("a valid unit scenario");
    let dir = tempfile::tempdir().expect("a temporary folder");
    let store = Store::Sqlite(SqliteStore::open(&dir.path().join("unit.sqlite"), 8).await.expect("SQLite"));
    // As a run's: the built-in declaration's queries join the outbox log.
    let sys = sc.payments_declaration(false).expect("the built-in declaration");
    crate::store::declared::install_outbox_log(&store, &sys.outbox).await.expect("the outbox log");
    let broker = Memory::new();
    let names = RunNames::new();
    broker.create_topic(&sc.topic(&names.topic)).await.expect("a topic");
    let (trigger, shutdown) = shutdown_pair();
    let ctx = Ctx {
        faults: Arc::new(FaultInjector::new(sc.seed, &sc.faults)),
        scenario: Arc::new(sc),
        store,
        stats: Arc::new(Stats::default()),
        coord: Default::default(),
        shutdown,
        broker: Arc::new(broker.clone()),
        names,
        intent: Default::default(),
        tasks: Default::default(),
        email: None,
    };
    Harness { ctx, trigger, _dir: dir }
}

impl Harness {
    /// Waits for every outbox row to be published and the group to have
    /// nothing left to read (`notifiers`: false when none runs), with no
    /// zombie still holding a batch, for at most `limit`.
    pub async fn drain(&self, limit: Duration, notifiers: bool) -> bool {
        let c = &self.ctx;
        let started = Instant::now();
        let mut quiet = 0;
        while started.elapsed() < limit {
            // The outbox before the lag, never the other way round: a relay
            // publishes a batch and then marks it, so an outbox seen empty
            // means every message was on the topic before the lag is read.
            // Read the lag first and a batch published and marked between
            // the two reads is never consumed, yet the drain says done
            // (seen under load: a batch's effects missing at the tails).
            let unpublished = c.store.unpublished().await;
            let lag = match notifiers {
                true => c.broker.backlog(&c.names.group, &c.topic()).await,
                false => Ok(0),
            };
            let zombies = c.coord.zombies();
            // Twice in a row, as the run's own drain asks.
            match matches!((unpublished, lag, zombies), (Ok(0), Ok(0), 0)) {
                true if quiet >= 1 => return true,
                true => quiet += 1,
                false => quiet = 0,
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        false
    }

    /// Tells the components to stop and waits for `tasks`.
    pub async fn stop(&self, tasks: Vec<tokio::task::JoinHandle<()>>) {
        self.trigger.trigger();
        for t in tasks.into_iter().chain(self.ctx.tasks.take().into_iter().map(|(_, t)| t)) {
            tokio::time::timeout(Duration::from_secs(10), t).await.expect("stops in time").expect("no panic");
        }
    }

    /// The verifier's reconciliation of what the run left.
    pub async fn reconcile(&self) -> reconcile::Reconciliation {
        let c = &self.ctx;
        let (history, intent) = (c.faults.history(), c.intent.take());
        let verified =
            crate::verifier::pass::verify(&c.store, &c.broker, &c.names.topic, &c.scenario, intent, &history, None);
        verified.await.expect("the ground truth").reconciliation
    }
}

/// The names of the anomalies a reconciliation found.
pub fn anomalies(r: &reconcile::Reconciliation) -> Vec<String> {
    r.anomalies.iter().filter(|a| a.count > 0).map(|a| a.name.clone()).collect()
}
