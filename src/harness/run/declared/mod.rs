//! One run of a declared system (`[system]`, docs/contract.md section 8),
//! as the run's skeleton asks it: the run's empty schema, the user's setup
//! and every declaration proved on it before any traffic; the user's
//! service, relays and consumers as processes; the HTTP workload and its
//! record of intent; the drain and the settle; the generic verifier.

mod settle;
mod setup;
mod workload;

pub(super) use settle::{RelayStall, Stall, Stalls};

use super::drive::Undrained;
use super::history::History;
use super::infra::Infra;
use super::phases::Checked;
use crate::context::{Ctx, Named};
use crate::domain::names::RunNames;
use crate::domain::operations::Operation;
use crate::error::{Error, Result};
use crate::harness::infra::Endpoints;
use crate::nemesis::process::program::{Database, Programs};
use crate::nemesis::proxy::Lanes;
use crate::report::assemble::Sections;
use crate::report::progress::{Phase, Progress};
use crate::report::Report;
use crate::scenario::{Scenario, ServiceDecl, System};
use crate::store::postgres::PgStore;
use crate::store::Store;
use crate::verifier::attribution;
use crate::verifier::declared::Books;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// The harness's own connections: the drain's probes and the verifier.
const CONNECTIONS: u32 = 4;

/// A declared system under test: its declaration, the run's schema, and
/// what the run learned for its judgement.
pub(super) struct Declared {
    sys: System,
    service: ServiceDecl,
    url: String,
    store: Store,
    programs: Option<Programs>,
    /// The workload's record of intent.
    record: workload::Record,
}

impl Declared {
    /// Opens the run's empty schema and proves the declaration on it after
    /// the user's setup. A declared run needs PostgreSQL and a service.
    pub async fn open(sc: &Scenario, sys: &System, endpoints: &Endpoints, names: &RunNames) -> Result<(Self, Infra)> {
        let Some(service) = sys.service.clone() else {
            return Err(Error::Scenario(format!(
                "{}: `[system.service]` is not set: declare the service that takes the workload's requests (docs/your-system.md)",
                sc.path.display()
            )));
        };
        let Some(url) = endpoints.database_url.clone() else {
            return Err(Error::Usage(
                "a `[system]` scenario runs against PostgreSQL only: pass --database-url or set DATABASE_URL".into(),
            ));
        };
        let pg = PgStore::open_empty(&url, &names.schema, CONNECTIONS).await?;
        let store = Store::Postgres(pg);
        setup::set_up(&store, sys, sc, &url, names).await?;
        let infra = Infra::with_store(store.clone(), endpoints, names).await?;
        let me = Self { sys: sys.clone(), service, url, store, programs: None, record: Default::default() };
        Ok((me, infra))
    }

    /// How many operations the workload sends.
    pub fn operations(&self) -> u64 {
        self.sys.operation.count
    }

    /// The user's programs, each behind its proxy slot when it has one.
    pub fn start(&mut self, ctx: &Ctx, reports_dir: &Path, lanes: Option<&Lanes>) -> Result<Vec<Named>> {
        let logs = reports_dir.join(format!("{}-processes", ctx.names.run_id));
        let Some((programs, components)) = Programs::start(ctx, &Database::Postgres(self.url.clone()), logs, lanes)?
        else {
            return Err(Error::Internal("a declared system without programs".into()));
        };
        self.programs = Some(programs);
        Ok(components)
    }

    pub fn programs(&self) -> Option<&Programs> {
        self.programs.as_ref()
    }

    /// The service's health: one that never answers cannot be reached
    /// (exit 3).
    pub async fn reach(&self, ctx: &Ctx) -> Result<()> {
        let Some(programs) = &self.programs else {
            return Err(Error::Internal("a declared system not started".into()));
        };
        setup::healthy(programs, &self.service, ctx).await
    }

    /// The HTTP workload, into its record of intent: each operation asked
    /// for and how it ended.
    pub async fn workload(&self, ctx: &Ctx, progress: &Progress) -> Result<()> {
        let Some(programs) = &self.programs else {
            return Err(Error::Internal("a declared system not started".into()));
        };
        progress.phase(Phase::Workload);
        let (sc, ports) = (&ctx.scenario, programs.service_ports().to_vec());
        let op = Arc::new(self.sys.operation.clone());
        workload::run(op, sc.spread, sc.seed, ports, ctx.faults.clone(), ctx.stats.clone(), self.record.clone()).await
    }

    /// The operations the workload sent and how each ended, for the run's
    /// history: all of them, or as many as it sent before the run was cut
    /// short.
    pub fn take_operations(&self) -> Vec<Operation> {
        workload::take(&self.record)
    }

    /// What the drain waits for: outbox rows unpublished, the group's lag.
    pub async fn drain(&self, ctx: &Ctx) -> std::result::Result<(), Undrained> {
        settle::drain(ctx, &self.store, &self.sys).await
    }

    /// The rows a stalled relay left, with their keys when it marks them.
    pub async fn relay_stall(&self, left: i64, waited: Duration, fault_free: Duration) -> RelayStall {
        RelayStall::read(&self.store, &self.sys, left, waited, fault_free).await
    }

    /// The settle's wait for the declared pending work, on a fresh pool
    /// (the faults may have ended sessions): None once it is quiet.
    pub async fn settle(&self, ctx: &Ctx, first: &mut Option<u64>) -> Result<Option<Stall>> {
        settle::settle(ctx, &self.store.renewed(2).await, &self.sys, first).await
    }

    /// What the report says of the run's shape.
    pub fn shape(&self, rep: &mut Report) {
        rep.scenario.payments = self.sys.operation.count;
        rep.scenario.inbox = "declared".into();
    }

    /// The generic verifier's pass, with what never finished: its keys are
    /// late, not lost, and its liveness anomalies lead.
    pub async fn check(
        &self,
        ctx: &Ctx,
        store: &Store,
        h: History,
        stalls: &Stalls,
        pending_at_settle: Option<u64>,
    ) -> Result<Checked> {
        let sys = &self.sys;
        let books = Books::new(sys, h.operations.into_iter(), h.faults.log.clone(), h.faults.started_epoch_ms)
            .with_pending(stalls.pending())
            .with_unpublished(stalls.unpublished())
            .with_unmarked_stall(stalls.relay.is_some())
            .with_spans(attribution::spans(&ctx.scenario));
        let found =
            crate::verifier::declared::verify(store, ctx.broker.clone(), ctx.topic(), books, h.provider.as_ref())
                .await?;
        let mut anomalies = found.anomalies;
        // Late is not lost: the stall leads, and its keys are left out of
        // the missing effects.
        if let Some(s) = &stalls.consumer {
            anomalies.insert(0, settle::stalled(s, &h.faults.log));
        }
        // Without a mark, the verifier tells the rows skipped while later
        // ones were published (lost events) from those left after the last
        // one (leftovers): only the leftovers are a stall.
        let relay = stalls.relay.as_ref().and_then(|s| settle::left_by_the_relay(s, &sys.outbox.published, &anomalies));
        if let Some(s) = &relay {
            anomalies.insert(0, settle::stalled_relay(s, &h.faults.log));
        }
        let mut invariants = found.invariants;
        settle::liveness(&mut invariants, sys, stalls.consumer.as_ref(), relay.is_some());
        let system = Some(crate::verifier::declared::Figures { pending_at_settle, ..found.figures });
        let sections = Sections { system, ..Default::default() };
        Ok(Checked { invariants, anomalies, confirmed: Vec::new(), sections })
    }
}
