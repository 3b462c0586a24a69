//! The reference payments pipeline as the run's skeleton asks it: its
//! schema migrated, its relays, notifiers and purger started (or the
//! program under test as processes beside them), the payment workload
//! after the notifiers' group has settled, the drain, and the payments
//! verifier.

use super::drive::{self, Left, Undrained};
use super::history::History;
use super::infra::Infra;
use super::phases::Checked;
use crate::context::{settled, Ctx, Named};
use crate::domain::names::RunNames;
use crate::error::{Error, Result};
use crate::faults::FaultPoint;
use crate::harness::infra::Endpoints;
use crate::nemesis::process::program::{Database, Programs};
use crate::nemesis::proxy::Lanes;
use crate::pipeline::{notifier, relay, workload};
use crate::report::assemble::Sections;
use crate::report::progress::{Phase, Progress};
use crate::scenario::{Components, Scenario};
use crate::store::{CommitGate, Store};
use crate::verifier::pass;
use std::path::Path;
use std::time::{Duration, Instant};
use tracing::{info, warn};

/// The reference pipeline under test: the program under test, when one
/// runs as processes, and the context its workload writes through.
pub(super) struct Reference {
    programs: Option<Programs>,
    workload_ctx: Option<Ctx>,
}

impl Reference {
    /// The run's schema migrated (or its SQLite file).
    pub async fn open(
        sc: &Scenario,
        endpoints: &Endpoints,
        names: &RunNames,
        reports_dir: &Path,
    ) -> Result<(Self, Infra)> {
        let infra = Infra::open(sc, endpoints, names, reports_dir).await?;
        // The built-in declaration's queries join the outbox log: every
        // event's key, though the purger deletes published rows.
        let sys = sc.payments_declaration(false).ok_or_else(|| Error::Internal("the built-in declaration".into()))?;
        crate::store::declared::install_outbox_log(&infra.store, &sys.outbox).await?;
        Ok((Self { programs: None, workload_ctx: None }, infra))
    }

    pub async fn start(
        &mut self,
        ctx: &Ctx,
        database_url: Option<&str>,
        reports_dir: &Path,
        lanes: Option<&Lanes>,
    ) -> Result<Vec<Named>> {
        let (programs, components, workload_ctx) = start_components(ctx, database_url, reports_dir, lanes).await?;
        (self.programs, self.workload_ctx) = (programs, Some(workload_ctx));
        Ok(components)
    }

    pub fn programs(&self) -> Option<&Programs> {
        self.programs.as_ref()
    }

    /// The payment workload, after the notifiers' group has settled (when
    /// the notifiers are ours): it records its intent in the context.
    pub async fn workload(&self, ctx: &Ctx, progress: &Progress) -> Result<()> {
        let Some(workload_ctx) = &self.workload_ctx else {
            return Err(Error::Internal("the pipeline was not started".into()));
        };
        if !self.programs.as_ref().is_some_and(|p| p.has_notifier()) {
            progress.phase(Phase::Group);
            group_ready(ctx).await;
        }
        progress.phase(Phase::Workload);
        workload::run(workload_ctx.clone()).await
    }
}

/// Relays, notifiers (the reference one, or the program under test as
/// processes) and the retention purger, each a named task; and the
/// context the workload runs with. A component behind the fault proxy
/// talks to the database through its slot.
async fn start_components(
    ctx: &Ctx,
    database_url: Option<&str>,
    reports_dir: &Path,
    lanes: Option<&Lanes>,
) -> Result<(Option<Programs>, Vec<Named>, Ctx)> {
    // A component with sessions of its own: behind the proxy, or when the
    // nemesis terminates the components' sessions (never the harness's).
    let own_sessions = ctx.scenario.timeline.iter().any(|t| t.point == FaultPoint::DbTerminateBackends);
    // Each one's commits go through its own gate for `store.commit_refused`.
    let through = |name: String, connections: u32| async move {
        let mut c = match (lanes, &ctx.store) {
            (Some(l), _) if l.slot(&name).is_some() => l.ctx_for(ctx, &name, connections).await?,
            (_, Store::Postgres(pg)) if own_sessions => {
                let app = format!("chaos-{}-{name}", ctx.names.run_id);
                Ctx { store: Store::Postgres(pg.for_component(&app, connections).await?), ..ctx.clone() }
            }
            _ => ctx.clone(),
        };
        c.store = c.store.gated(CommitGate::new(c.faults.clone(), &name, Some(c.stats.on_writer_hold())));
        Ok::<Ctx, Error>(c)
    };
    let workload_ctx = through("workload".into(), ctx.scenario.producers as u32 + 1).await?;
    let sc = &ctx.scenario;
    let mut components = Vec::new();
    let logs = reports_dir.join(format!("{}-processes", ctx.names.run_id));
    let database = match (&ctx.store, database_url) {
        (Store::Postgres(_), Some(url)) => Database::Postgres(url.to_string()),
        (Store::Sqlite(s), _) => {
            Database::Sqlite(std::path::absolute(&s.endpoint).unwrap_or_else(|_| s.endpoint.clone().into()))
        }
        (Store::Postgres(_), None) => return Err(Error::Internal("a PostgreSQL store without its URL".into())),
    };
    let programs = Programs::start(ctx, &database, logs, lanes)?.map(|(programs, keepers)| {
        components.extend(keepers);
        programs
    });
    let in_process = sc.components == Components::InProcess;
    if sc.notifier.command.is_none() && in_process {
        for i in 1..=sc.notifier.instances {
            let ctx = through(format!("notifier-{i}"), 3).await?;
            components.push((format!("notifier-{i}"), tokio::spawn(notifier::run(ctx, i))));
        }
    }
    if sc.relay.command.is_none() && in_process {
        for i in 1..=sc.relay.instances {
            let ctx = through(format!("relay-{i}"), 1).await?;
            components.push((format!("relay-{i}"), tokio::spawn(relay::run(ctx, i))));
        }
    }
    components.push(("retention purger".to_string(), tokio::spawn(crate::pipeline::purger::run(ctx.clone()))));
    Ok((programs, components, workload_ctx))
}

/// How long the workload waits for the notifiers' group to settle: on a
/// real broker (measured: 0.6-2.1 s), and on the mock cluster, where a group
/// settles in about 1.1 s, or 3.1 s when a notifier had to join again
/// (see `MOCK_JOIN_WAIT` in `broker/kafka/consumer.rs`).
const GROUP_READY: Duration = Duration::from_secs(15);
const GROUP_READY_MOCK: Duration = Duration::from_secs(5);

/// Waits until the notifiers' group holds every partition, with every
/// notifier that can have one holding at least one: a payment service's
/// consumers are up before its traffic, and without this the first seconds
/// of a run measure the group's initial rebalances, not the pipeline.
/// Gives up after [`GROUP_READY`] (the run goes on; partitions are then
/// picked up as the group settles).
async fn group_ready(ctx: &Ctx) {
    let (instances, lanes) = (ctx.scenario.notifier.instances, ctx.topic().lanes as usize);
    let limit = if ctx.broker.embedded() { GROUP_READY_MOCK } else { GROUP_READY };
    let deadline = tokio::time::Instant::now() + limit;
    let started = Instant::now();
    let mut assigned = ctx.coord.watch_assigned();
    loop {
        let ready = settled(&assigned.borrow_and_update(), instances, lanes);
        // Settled, and still so 50 ms on: a rebalance still under way is
        // not taken for the settled group.
        let wait = if ready { tokio::time::Instant::now() + STILL_SETTLED } else { deadline };
        match tokio::time::timeout_at(wait.min(deadline), assigned.changed()).await {
            Err(_) if ready => {
                info!(ms = started.elapsed().as_millis() as u64, "notifier group settled");
                return;
            }
            Err(_) => break,
            Ok(Ok(())) => {}
            // Nobody can change the assignments any more.
            Ok(Err(_)) => break,
        }
        if tokio::time::Instant::now() >= deadline {
            break;
        }
    }
    let held = format!("{:?}", ctx.coord.assigned());
    warn!(%held, "the notifier group did not settle within {}s; starting the workload anyway", limit.as_secs());
}

/// How long a settled group must stay unchanged to count as settled.
const STILL_SETTLED: Duration = Duration::from_millis(50);

/// The reference pipeline's drain: its outbox rows unpublished, its
/// notifiers' zombies.
pub(super) async fn drain(ctx: &Ctx) -> std::result::Result<(), Undrained> {
    let left = || async { Ok(Left { unpublished: ctx.store.unpublished().await?, busy: ctx.coord.zombies() > 0 }) };
    drive::drain_until_done(ctx, "the pipeline", "outbox rows unpublished", left).await
}

/// What the payments pipeline judges that no other system has: the
/// ledger's pass over its tables and topic (the core checker composed
/// under it), each anomaly's story and cause, the receipts' provider
/// calls, the counts and the latency.
pub(super) async fn check(ctx: &Ctx, store: &Store, h: History) -> Result<Checked> {
    let History { intent, faults: history, provider, .. } = h;
    let sc = &ctx.scenario;
    let verified = pass::verify(store, &ctx.broker, &ctx.names.topic, sc, intent, &history, provider).await?;
    let pass::Verified { reconciliation: r, topic_side, confirmed, calls } = verified;
    let mut anomalies = r.anomalies;
    let mut stories = pass::stories(store, &anomalies, topic_side, &history).await;
    pass::attribute(store, &mut anomalies, &stories, &history, sc).await;
    if let Some(calls) = &calls {
        crate::verifier::add_provider_calls(&mut stories, calls, history.started_epoch_ms);
    }
    let latency_ms = pass::latency(store).await.unwrap_or_else(|e| {
        warn!(cause = %e, "measuring the latency failed");
        None
    });
    let sections = Sections { counts: r.counts, stories, latency_ms, system: None };
    Ok(Checked { invariants: r.invariants, anomalies, confirmed, sections })
}
