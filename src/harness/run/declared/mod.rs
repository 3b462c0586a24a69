//! One run of a declared system (`[system]`, docs/contract.md section 8),
//! as the run's skeleton asks it: the run's empty schema, the user's setup
//! and every declaration proved on it before any traffic; the user's
//! service, relays and consumers as processes; the HTTP workload and its
//! record of intent; the drain and the settle; the generic verifier.

mod settle;
mod setup;
mod workload;

use super::drive::{self, Ran};
use super::history::History;
use super::infra::Infra;
use crate::context::{Ctx, Named};
use crate::domain::names::RunNames;
use crate::domain::operations::Operation;
use crate::error::{Error, Result};
use crate::harness::infra::Endpoints;
use crate::nemesis::acting::Acting;
use crate::nemesis::process::program::{Database, Programs};
use crate::nemesis::proxy::Lanes;
use crate::report::progress::{Phase, Progress};
use crate::report::Report;
use crate::scenario::{Scenario, ServiceDecl, System};
use crate::store::postgres::PgStore;
use crate::store::Store;
use crate::verifier::declared::Books;
use crate::verifier::{attribution, verdict};
use settle::Stalls;
use std::path::Path;
use std::sync::Arc;

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
    ops: Vec<Operation>,
    /// What never finished: late, not lost.
    stalls: Stalls,
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
        let me =
            Self { sys: sys.clone(), service, url, store, programs: None, ops: Vec::new(), stalls: Stalls::default() };
        Ok((me, infra))
    }

    /// How many operations the workload sends.
    pub fn operations(&self) -> u64 {
        self.sys.operation.count
    }

    /// The operations the workload asked for and how each ended, for the
    /// run's history.
    pub fn take_operations(&mut self) -> Vec<Operation> {
        std::mem::take(&mut self.ops)
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

    /// The service's readiness (one that never answers cannot be reached:
    /// exit 3), the workload, then the drain and the settle.
    pub async fn drive(&mut self, ctx: &Ctx, acting: &Acting, progress: &Progress) -> Result<Ran> {
        let Some(programs) = &self.programs else {
            return Err(Error::Internal("a declared system not started".into()));
        };
        let mut ran = Ran::default();
        let t_work = std::time::Instant::now();
        setup::healthy(programs, &self.service, ctx).await?;
        tokio::select! {
            r = programs.ready(ctx) => if let Err(why) = r { ran.incomplete = Some(why) },
            _ = crate::harness::interrupt::requested() => ran.interrupted = true,
        }
        programs.set_acting(true);
        acting.begin();
        // The calm goes on through the drain: it waits for the consumers too.
        let _calm = drive::calm_after(ctx, ctx.stats.clone(), self.sys.operation.count);
        if ran.incomplete.is_none() && !ran.interrupted {
            progress.phase(Phase::Workload);
            let ports = programs.service_ports().to_vec();
            let work = workload::run(
                Arc::new(self.sys.operation.clone()),
                ctx.scenario.spread,
                ctx.scenario.seed,
                ports,
                ctx.faults.clone(),
                ctx.stats.clone(),
            );
            tokio::select! {
                r = work => match r {
                    Ok(o) => self.ops = o,
                    Err(e) => ran.incomplete = Some(format!("the workload stopped: {e}")),
                },
                why = programs.failed() => ran.incomplete = Some(why),
                _ = crate::harness::interrupt::requested() => ran.interrupted = true,
            }
        }
        ran.workload_ms = t_work.elapsed().as_millis() as u64;
        progress.phase(Phase::Drain);
        self.stalls = settle::come_to_rest(ctx, &self.store, &self.sys, programs, acting, &mut ran).await;
        Ok(ran)
    }

    /// What the report says of the run's shape.
    pub fn shape(&self, rep: &mut Report) {
        rep.scenario.payments = self.sys.operation.count;
        rep.scenario.inbox = "declared".into();
    }

    /// The generic verifier's pass, unless the run was interrupted or
    /// something may still write, and the verdict.
    pub async fn judge(&self, rep: &mut Report, ctx: &Ctx, ran: &mut Ran, h: History) {
        let (sys, ops, stalls) = (&self.sys, &h.operations, &self.stalls);
        let (still_running, record) = (h.still_running, h.provider.as_ref());
        let sc = &ctx.scenario;
        let verified = if ran.interrupted || still_running || ran.incomplete.is_some() {
            None
        } else {
            // A fresh pool: the nemesis may have ended sessions.
            let store = self.store.renewed(2).await;
            let books = Books::new(sys, ops.iter().cloned(), h.faults.log.clone(), h.faults.started_epoch_ms)
                .with_pending(stalls.keys())
                .with_unmarked_stall(stalls.relay.is_some())
                .with_spans(attribution::spans(sc));
            let read = crate::verifier::declared::verify(&store, ctx.broker.clone(), ctx.topic(), books, record);
            tokio::select! {
                r = read => Some(r),
                _ = crate::harness::interrupt::requested() => { ran.interrupted = true; None }
            }
        };
        let found = match ran.judgeable(still_running, verified) {
            Ok(found) => found,
            Err((v, why)) => return rep.judged(v, why, ctx.faults.fired_schedule()),
        };
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
        verdict::allow(&mut anomalies, &sc.allowed_anomalies);
        rep.faults = h.summary.clone();
        let chaos = verdict::chaos_checks(&rep.faults);
        let (v, why) = verdict::verdict(sc.exactly_once, &invariants, &anomalies, &chaos, &rep.faults);
        rep.invariants = invariants;
        rep.anomalies = anomalies;
        rep.chaos_checks = chaos;
        let pending_at_settle = ran.settle.and_then(|s| s.pending);
        rep.system = Some(crate::verifier::declared::Figures { pending_at_settle, ..found.figures });
        rep.judged(v, why, ctx.faults.fired_schedule());
    }
}
