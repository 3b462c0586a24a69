//! The reference payments pipeline as the run's skeleton asks it: its
//! schema migrated, its relays, notifiers and purger started (or the
//! program under test as processes beside them), the payment workload
//! after the notifiers' group has settled, the drain, and the payments
//! verifier.

use super::drive::{self, Left, Ran, Undrained};
use super::history::History;
use super::infra::Infra;
use crate::context::{settled, Ctx, Named, Stats};
use crate::domain::names::RunNames;
use crate::error::{Error, Result};
use crate::faults::FaultPoint;
use crate::harness::infra::Endpoints;
use crate::nemesis::acting::Acting;
use crate::nemesis::process::program::{Database, Programs};
use crate::nemesis::proxy::Lanes;
use crate::pipeline::{notifier, relay, workload};
use crate::report::progress::{Phase, Progress};
use crate::report::Report;
use crate::scenario::{Components, Scenario};
use crate::store::{CommitGate, Store};
use crate::verifier::{pass, verdict, Verdict};
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

    pub async fn drive(&self, ctx: &Ctx, acting: &Acting, progress: &Progress) -> Result<Ran> {
        let Some(workload_ctx) = &self.workload_ctx else {
            return Err(Error::Internal("the pipeline was not started".into()));
        };
        Ok(drive(ctx, workload_ctx, self.programs.as_ref(), acting, progress).await)
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

/// Resolves with the first failure of a program under test; never, when
/// the notifier is the reference one.
async fn program_failure(programs: Option<&Programs>) -> String {
    match programs {
        Some(p) => p.failed().await,
        None => std::future::pending().await,
    }
}

/// The workload (after the group wait, until it writes no payment for
/// [`WORKLOAD_STALL`]),
/// then the drain; either may be cut short by a signal, or by a program
/// under test that failed. After a signal, a second one exits at once.
async fn drive(
    ctx: &Ctx,
    workload_ctx: &Ctx,
    programs: Option<&Programs>,
    acting: &Acting,
    progress: &Progress,
) -> Ran {
    let mut ran = Ran::default();
    let mut failed = std::pin::pin!(program_failure(programs));
    let t_work = Instant::now();
    if let Some(p) = programs {
        tokio::select! {
            r = p.ready(ctx) => if let Err(why) = r { ran.incomplete = Some(why) },
            _ = crate::harness::interrupt::requested() => ran.interrupted = true,
        }
        // The nemesis acts from here until the pipeline has drained: a
        // consumer does most of its work while it catches up, after the
        // payment service has stopped writing.
        p.set_acting(true);
    }
    acting.begin();
    // The calm goes on through the drain: it waits for the consumers too.
    let _calm = drive::calm_after(ctx, workload_ctx.stats.clone(), ctx.scenario.payments);
    if ran.incomplete.is_none() && !ran.interrupted {
        let workload = async {
            if !programs.is_some_and(|p| p.has_notifier()) {
                progress.phase(Phase::Group);
                group_ready(ctx).await;
            }
            progress.phase(Phase::Workload);
            workload::run(workload_ctx.clone()).await
        };
        tokio::select! {
            r = workload => if let Err(e) = r {
                ran.incomplete = Some(format!("the workload stopped: {e}"))
            },
            why = workload_stalled(&workload_ctx.stats, ctx.scenario.payments) => ran.incomplete = Some(why),
            why = &mut failed => ran.incomplete = Some(why),
            _ = crate::harness::interrupt::requested() => ran.interrupted = true,
        }
    }
    ran.workload_ms = t_work.elapsed().as_millis() as u64;
    let t_drain = Instant::now();
    progress.phase(Phase::Drain);
    drain_or_judge(ctx, programs, acting, failed, &mut ran).await;
    ran.drain_ms = t_drain.elapsed().as_millis() as u64;
    ran
}

/// The drain, cut short by a program that failed or a signal; the faults
/// from outside stop when it ends.
async fn drain_or_judge(
    ctx: &Ctx,
    programs: Option<&Programs>,
    acting: &Acting,
    mut failed: std::pin::Pin<&mut impl std::future::Future<Output = String>>,
    ran: &mut Ran,
) {
    let stop_faults = || async {
        if let Some(p) = programs {
            p.set_acting(false);
        }
        acting.stop().await;
    };
    // Undrained with outbox rows left, the faults from outside stop and the
    // relays get one more drain timeout, as a declared system's do: a relay
    // the faults only slowed publishes then. One that still leaves rows
    // behind while the consumers have caught up has stalled: the run is
    // judged (its rows are `unpublished leftover`s), not INCOMPLETE.
    let mut faults_off = false;
    while ran.incomplete.is_none() && !ran.interrupted {
        tokio::select! {
            r = drain(ctx) => match r {
                Ok(()) => break,
                Err(u) if u.unpublished > 0 && !faults_off => {
                    info!(left = u.unpublished, "outbox rows still unpublished at the drain timeout: the faults stop, the relays get one more");
                    faults_off = true;
                    stop_faults().await;
                }
                Err(u) if u.unpublished > 0 && u.lag == 0 => {
                    warn!(left = u.unpublished, "the relays left outbox rows unpublished with the faults off: judging the run");
                    break;
                }
                Err(u) => ran.incomplete = Some(match programs {
                    Some(p) => format!("{}; {}", u.why, p.stderr_of_first()),
                    None => u.why,
                }),
            },
            why = &mut failed => ran.incomplete = Some(why),
            _ = crate::harness::interrupt::requested() => ran.interrupted = true,
        }
    }
    stop_faults().await;
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
async fn drain(ctx: &Ctx) -> std::result::Result<(), Undrained> {
    let left = || async { Ok(Left { unpublished: ctx.store.unpublished().await?, busy: ctx.coord.zombies() > 0 }) };
    drive::drain_until_done(ctx, "the pipeline", "outbox rows unpublished", left).await
}

/// How long the workload may go without writing a payment, group wait
/// included. A bound on progress, not on the whole: a busy machine, or a
/// PostgreSQL recovering from `db.restart` beside it, makes the workload
/// slower, and only one that is stuck stops writing for this long. (A
/// bound of 120 s on the whole of 1,000 payments ended the infrastructure
/// faults' run INCOMPLETE beside two busy loops.)
const WORKLOAD_STALL: Duration = Duration::from_secs(120);

/// Returns, with the reason, once the workload has written no payment for
/// [`WORKLOAD_STALL`]; never while it writes.
async fn workload_stalled(stats: &Stats, payments: u64) -> String {
    let mut last = Stats::get(&stats.payments_written);
    let mut since = tokio::time::Instant::now();
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = Stats::get(&stats.payments_written);
        if now != last {
            (last, since) = (now, tokio::time::Instant::now());
        } else if since.elapsed() >= WORKLOAD_STALL {
            return format!(
                "the workload wrote no payment for {} s ({last} of {payments} written); a component or service may be stuck",
                WORKLOAD_STALL.as_secs()
            );
        }
    }
}

/// Verifies the run from its history, unless it was interrupted or
/// something may still write, and sets the report's findings and verdict.
pub(super) async fn judge(rep: &mut Report, ctx: &Ctx, ran: &mut Ran, h: History) {
    let History { intent, faults: history, summary, provider, still_running, .. } = h;
    let emails = provider.as_ref();
    let sc = &ctx.scenario;
    // The verifier reads through a fresh pool, as the declared path's
    // does: after the nemesis restarted PostgreSQL or ended sessions, the
    // pool's connections may be dead. Not for a run that will not be read:
    // an interrupted one may have lost PostgreSQL, and a new pool would
    // wait out its connect timeout for nothing.
    let judged = !(ran.interrupted || still_running);
    let store = if judged { ctx.store.renewed(2).await } else { ctx.store.clone() };
    let verified = if !judged {
        None
    } else {
        tokio::select! {
            r = pass::verify(&store, &ctx.broker, &ctx.names.topic, sc, intent, &history, emails) => Some(r),
            _ = crate::harness::interrupt::requested() => { ran.interrupted = true; None }
        }
    };
    let pass::Verified { reconciliation: r, topic_side, confirmed } = match ran.judgeable(still_running, verified) {
        Ok(found) => found,
        Err((v, why)) => return rep.judged(v, why, ctx.faults.fired_schedule()),
    };
    let mut anomalies = r.anomalies;
    verdict::allow(&mut anomalies, &sc.allowed_anomalies);
    rep.stories = pass::stories(&store, &anomalies, topic_side, &history).await;
    pass::attribute(&store, &mut anomalies, &rep.stories, &history, sc).await;
    if let Some(record) = emails {
        crate::verifier::add_provider_calls(&mut rep.stories, record, history.started_epoch_ms);
    }
    // The injector's counts and what the checkers found confirmed: the
    // injector keeps what the run recorded, and nothing is written back.
    rep.faults = summary;
    crate::faults::add_confirmed(&mut rep.faults, &confirmed);
    let chaos = verdict::chaos_checks(&rep.faults);
    let (v, why) = verdict::verdict(sc.exactly_once, &r.invariants, &anomalies, &chaos, &rep.faults);
    rep.counts = r.counts;
    rep.invariants = r.invariants;
    rep.anomalies = anomalies;
    rep.chaos_checks = chaos;
    rep.latency_ms = pass::latency(&store).await.unwrap_or_else(|e| {
        warn!(cause = %e, "measuring the latency failed");
        None
    });
    let (v, why) = match &ran.incomplete {
        // Nothing ran, so there are no figures to call partial.
        Some(reason) if rep.counts.payments_committed == 0 => {
            (Verdict::Incomplete, format!("{reason}; the workload never started, so nothing was judged"))
        }
        Some(reason) => (Verdict::Incomplete, format!("{reason}; the figures above are partial")),
        None => (v, why),
    };
    rep.judged(v, why, ctx.faults.fired_schedule());
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The workload's bound is on progress: a slow workload that keeps
    /// writing is never cut, one that stops is, 120 s after its last write.
    #[tokio::test(start_paused = true)]
    async fn a_workload_is_cut_only_when_it_stops_writing() {
        let stats = std::sync::Arc::new(Stats::default());
        let writer = {
            let stats = stats.clone();
            tokio::spawn(async move {
                // One payment a minute for five minutes: slower than any
                // whole-run bound of 120 s would allow.
                for _ in 0..5 {
                    tokio::time::sleep(Duration::from_secs(60)).await;
                    Stats::add(&stats.payments_written, 1);
                }
            })
        };
        let started = tokio::time::Instant::now();
        let why = workload_stalled(&stats, 9).await;
        writer.await.unwrap();
        let took = started.elapsed();
        assert!(took >= Duration::from_secs(300 + 120) && took <= Duration::from_secs(300 + 122), "{took:?}");
        assert!(why.contains("no payment for 120 s (5 of 9 written)"), "{why}");
    }
}
