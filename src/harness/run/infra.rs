//! A run's database and broker, opened, and the context its components
//! share.

use crate::broker::SharedBroker;
use crate::context::{shutdown_pair, Ctx, ShutdownTrigger, Stats};
use crate::domain::names::RunNames;
use crate::error::{Error, Result};
use crate::faults::FaultInjector;
use crate::harness::infra::Endpoints;
use crate::report::InfraInfo;
use crate::scenario::Scenario;
use crate::store::{postgres::PgStore, sqlite::SqliteStore, Store};
use std::path::Path;
use std::sync::Arc;

/// Pool connections beyond one per producer and notifier: the drain's
/// probes, the retention purger, the verifier, and stalled notifiers
/// (zombies), each of which holds one for its whole stall.
const SPARE_CONNECTIONS: usize = 4;

/// The endpoints of a run: flags, environment and scenario resolved, and
/// checked against what the scenario needs ([`Scenario::preflight`]).
pub(super) fn endpoints(sc: &Scenario, database_url: Option<String>, brokers: Option<String>) -> Result<Endpoints> {
    let endpoints = Endpoints::resolve(database_url, brokers, sc)?;
    sc.preflight(endpoints.database_url.is_some(), endpoints.brokers.is_some()).map_err(Error::Usage)?;
    Ok(endpoints)
}

/// What the run's components share, and the trigger that stops them.
pub(super) fn context(sc: &Arc<Scenario>, infra: &Infra, names: &RunNames) -> (ShutdownTrigger, Ctx) {
    let (trigger, shutdown) = shutdown_pair();
    let ctx = Ctx {
        scenario: sc.clone(),
        store: infra.store.clone(),
        faults: Arc::new(
            FaultInjector::new(sc.seed, &sc.faults)
                .with_schedule(sc.schedule.clone())
                .with_aimed(sc.aimed)
                .with_role_rates(sc.role_rates.clone()),
        ),
        stats: Arc::new(Stats::default()),
        coord: Default::default(),
        shutdown,
        broker: infra.broker.clone(),
        names: names.clone(),
        intent: Default::default(),
        tasks: Default::default(),
        email: None,
    };
    (trigger, ctx)
}

/// A run's database and broker, opened: the run's PostgreSQL schema or
/// SQLite file, and a real Kafka or librdkafka's mock cluster in process.
pub(super) struct Infra {
    pub store: Store,
    /// A real Kafka, or the embedded mode's mock cluster in process.
    pub broker: SharedBroker,
    pub info: InfraInfo,
}

impl Infra {
    /// The reference pipeline's: its schema migrated (or its SQLite file
    /// made), pooled for its producers and notifiers.
    pub async fn open(sc: &Scenario, endpoints: &Endpoints, names: &RunNames, reports_dir: &Path) -> Result<Self> {
        let max_conns = (sc.producers + sc.notifier.instances + SPARE_CONNECTIONS) as u32;
        let store = match &endpoints.database_url {
            Some(url) => Store::Postgres(PgStore::open(url, &names.schema, max_conns).await?),
            None => {
                let path = reports_dir.join(format!("{}.sqlite", names.run_id));
                Store::Sqlite(SqliteStore::open(&path, max_conns).await?)
            }
        };
        Self::with_store(store, endpoints, names).await
    }

    /// A run's store, opened by its system under test, and the broker.
    pub async fn with_store(store: Store, endpoints: &Endpoints, names: &RunNames) -> Result<Self> {
        let broker: SharedBroker = crate::broker::open(endpoints.brokers.as_deref()).await?;
        let info = InfraInfo {
            database: store.backend().into(),
            database_endpoint: store.endpoint(),
            schema: match &store {
                Store::Postgres(s) => s.schema.clone(),
                Store::Sqlite(_) => String::new(),
            },
            broker: broker.kind().into(),
            brokers: broker.bootstrap().into(),
            topic: names.topic.clone(),
            group: names.group.clone(),
            proxy: None,
            read_isolation: crate::broker::READ_ISOLATION.into(),
        };
        Ok(Self { store, broker, info })
    }

    /// The banner's infra line.
    pub fn describe(&self, names: &RunNames) -> String {
        let db = match &self.store {
            Store::Postgres(s) => format!("PostgreSQL {} (schema {})", s.endpoint, s.schema),
            Store::Sqlite(s) => format!("SQLite {} (embedded)", s.endpoint),
        };
        let (b, topic) = (self.broker.bootstrap(), &names.topic);
        let broker = match self.broker.embedded() {
            false => format!("Apache Kafka {b} (topic {topic})"),
            true => format!("librdkafka mock cluster {b} (embedded, topic {topic})"),
        };
        format!("{db} · {broker}")
    }

    /// Closes the store and the broker. What a change-data-capture relay
    /// left in PostgreSQL under the run's name (a replication slot, a
    /// publication) goes first: its processes are gone by now.
    pub async fn close(self) {
        if let Store::Postgres(pg) = &self.store {
            match pg.drop_replication().await {
                Ok(dropped) if !dropped.is_empty() => {
                    tracing::info!(dropped = %dropped.join(", "), "the run's replication left behind, dropped")
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(cause = %e, "dropping the run's replication slots and publications failed; `chaos clean` drops them")
                }
            }
        }
        self.store.close().await;
        self.broker.close().await;
    }
}
