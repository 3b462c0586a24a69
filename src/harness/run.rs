//! One run, start to finish: resolve the infrastructure, create the run's
//! schema and topic, start relays, notifiers and the retention purger, drive
//! the workload, wait for the pipeline to drain, verify, report.

use crate::broker::{kafka::Kafka, SharedBroker};
use crate::pipeline::context::{shutdown_pair, Ctx, ShutdownTrigger, Stats};
use crate::error::{Error, Result};
use crate::exit::Exit;
use crate::faults::FaultInjector;
use crate::faults::{FaultPoint, Strike};
use crate::domain::names::RunNames;
use crate::harness::infra::Endpoints;
use crate::pipeline::notifier;
use crate::nemesis::process::program::{Database, Programs};
use crate::report::progress::{Phase, Progress};
use crate::nemesis::proxy::Lanes;
use crate::report::{self, ComponentFigures, InfraInfo, Report, Sample, ScenarioInfo, Stages, Timings};
use crate::scenario::Components;
use crate::scenario::{self, Scenario};
use crate::store::{postgres::PgStore, sqlite::SqliteStore, Store};
use crate::verifier::{attribution, reconcile, story, topic, verdict, Ledger, Verdict};
use crate::pipeline::{relay, workload};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tracing::{info, warn};
use uuid::Uuid;

/// What `chaos run` was asked to do.
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub scenario: PathBuf,
    pub seed: Option<u64>,
    pub database_url: Option<String>,
    pub brokers: Option<String>,
    pub reports_dir: PathBuf,
    /// Overrides the scenario's `[run] components`.
    pub components: Option<Components>,
    /// Overrides the scenario's `workload.payments`.
    pub payments: Option<u64>,
    /// Overrides `[faults]` probabilities, in order.
    pub faults: Vec<(FaultPoint, f64)>,
    /// Pins the firings by occurrence.
    pub schedule: Option<crate::faults::Schedule>,
}

impl RunOptions {
    /// Loads the scenario file and applies the command line's changes, each
    /// checked as the file's keys are.
    pub fn scenario(&self) -> Result<Scenario> {
        let mut sc = scenario::load(&self.scenario)?;
        if let Some(seed) = self.seed {
            sc = sc.with_seed(seed);
        }
        if let Some(c) = self.components {
            sc = sc.with_components(c);
        }
        if let Some(n) = self.payments {
            sc = sc.with_payments(n)?;
        }
        for (p, rate) in &self.faults {
            sc = sc.with_rate(*p, *rate)?;
        }
        if let Some(s) = &self.schedule {
            sc = sc.with_schedule(s.clone())?;
        }
        Ok(sc)
    }
}

/// Pool connections beyond one per producer and notifier: the drain's
/// probes, the retention purger, the verifier, and stalled notifiers
/// (zombies), each of which holds one for its whole stall.
const SPARE_CONNECTIONS: usize = 4;

/// Fault firings listed one by one in the report (the counts count all).
const REPORT_FAULT_LOG: usize = 200;

/// How often the drain condition is polled.
const DRAIN_POLL: Duration = Duration::from_millis(250);

/// What a run tells whoever shows it, in order: the library computes and
/// emits these; a [`Reporter`] (the binary's choice, see `commands/`) turns
/// them into tables, JSON, or nothing.
pub enum Event<'a> {
    /// The infrastructure is open; the components start next.
    Started { run_id: &'a str, scenario: &'a str, seed: u64, infra: &'a str },
    /// The run ended and its report was saved at `json`, `md` and `html`.
    Finished { report: &'a Report, json: &'a Path, md: &'a Path, html: &'a Path },
}

/// Consumes a run's events.
pub trait Reporter: Send + Sync {
    fn event(&self, event: &Event<'_>) -> Result<()>;

    /// Whether the live progress line is drawn on stderr meanwhile.
    fn shows_progress(&self) -> bool {
        true
    }
}

/// Shows nothing: a run inside the selftest or the bench, which print
/// their own tables.
pub struct Quiet;

impl Reporter for Quiet {
    fn event(&self, _: &Event<'_>) -> Result<()> {
        Ok(())
    }

    fn shows_progress(&self) -> bool {
        false
    }
}

/// Runs a scenario file end to end and returns the report and the exit code.
pub async fn run(opts: RunOptions, reporter: &dyn Reporter) -> Result<(Report, Exit)> {
    let sc = opts.scenario()?;
    execute(sc, opts.database_url.clone(), opts.brokers.clone(), &opts.reports_dir, reporter).await
}

/// Runs a validated scenario end to end: open the infrastructure, start
/// the components, drive the workload and the drain, stop, verify, report.
pub async fn execute(
    sc: Scenario,
    database_url: Option<String>,
    brokers: Option<String>,
    reports_dir: &std::path::Path,
    reporter: &dyn Reporter,
) -> Result<(Report, Exit)> {
    let started = Instant::now();
    let endpoints = endpoints(&sc, database_url, brokers)?;
    let names = RunNames::new();
    let mut infra = Infra::open(&sc, &endpoints, &names, reports_dir).await?;
    let sc = Arc::new(sc);
    let (trigger, ctx) = context(&sc, &infra, &names);
    // The proxy's and the timeline's faults strike from the workload's
    // start until the drain ends.
    let (acting, _) = watch::channel(false);
    let lanes = match (&endpoints.database_url, sc.proxied()) {
        (Some(url), true) => Some(Lanes::start(&ctx, url, acting.subscribe()).await?),
        _ => None,
    };
    let mut infra_line = infra.describe(&names);
    if let Some(l) = &lanes {
        infra_line = format!("{infra_line} · {}", l.describe());
        infra.info.proxy = Some(l.describe());
    }
    reporter.event(&Event::Started { run_id: &names.run_id, scenario: &sc.name, seed: sc.seed, infra: &infra_line })?;
    info!(run_id = %names.run_id, seed = sc.seed, "starting");
    let progress = Progress::start(sc.payments, ctx.stats.clone(), ctx.faults.clone(), reporter.shows_progress());
    infra.broker.create_topic(&names.topic, sc.partitions).await?;
    let setup_ms = started.elapsed().as_millis() as u64;

    let (faults, stats) = (ctx.faults.clone(), ctx.stats.clone());
    let started_components =
        start_components(&ctx, endpoints.database_url.as_deref(), reports_dir, lanes.as_ref()).await;
    let (programs, mut components, workload_ctx) = match started_components {
        Ok(s) => s,
        Err(e) => {
            trigger.trigger();
            return Err(e);
        }
    };
    let slots = lanes.as_ref().map(|l| l.slots()).unwrap_or_default();
    components.extend(crate::nemesis::timeline::start(&ctx, acting.subscribe(), slots));
    let (series, stop_series) = sample(stats.clone());
    let mut ran = drive(&ctx, &workload_ctx, programs.as_ref(), &acting, &progress).await;
    trigger.trigger();
    components.extend(ctx.tasks.take());
    let stopped = tokio::select! {
        s = stop(components) => s,
        _ = crate::harness::interrupt::requested(), if !ran.interrupted => { ran.interrupted = true; Stopped::default() }
    };
    let _ = stop_series.send(());
    let series = series.await.unwrap_or_default();
    if let Some(l) = lanes {
        l.close();
    }
    if let (None, Some(why)) = (&ran.incomplete, programs.as_ref().and_then(|p| p.failure())) {
        ran.incomplete = Some(why);
    }
    if let Some(why) = stopped.why() {
        warn!("{why}");
        ran.incomplete = Some(match ran.incomplete.take() {
            Some(before) => format!("{before}; {why}"),
            None => why,
        });
    }

    let mut rep = skeleton(&sc, &names, &infra.info, &faults, &stats);
    rep.series = series;
    rep.timings = Timings { setup_ms, workload_ms: ran.workload_ms, drain_ms: ran.drain_ms, ..Default::default() };
    let t_verify = Instant::now();
    progress.phase(Phase::Verify);
    judge(&mut rep, &ctx, &mut ran, !stopped.stuck.is_empty()).await;
    progress.finish();
    rep.timings.verify_ms = t_verify.elapsed().as_millis() as u64;
    rep.timings.total_ms = started.elapsed().as_millis() as u64;
    infra.close().await;

    let saved = rep.save(reports_dir)?;
    reporter.event(&Event::Finished { report: &rep, json: &saved.json, md: &saved.md, html: &saved.html })?;
    let exit = rep.verdict.exit();
    Ok((rep, exit))
}

/// The endpoints of a run: flags, environment and scenario resolved, and
/// a program under test or the fault proxy refused without PostgreSQL.
fn endpoints(sc: &Scenario, database_url: Option<String>, brokers: Option<String>) -> Result<Endpoints> {
    let endpoints = Endpoints::resolve(database_url, brokers, sc)?;
    if sc.proxied() && endpoints.database_url.is_none() {
        let what = FaultPoint::ALL
            .iter()
            .find(|p| p.proxied() && sc.faults.get(**p) > 0.0)
            .map_or("`[proxy]`".to_string(), |p| format!("`faults.{}`", p.key()));
        return Err(Error::Usage(format!(
            "{what} needs the fault proxy, which sits on PostgreSQL's wire protocol: pass --database-url or set DATABASE_URL"
        )));
    }
    // The mock cluster advertises its own address, and only a broker with
    // a listener per slot sends its clients back through the proxy.
    if sc.proxies_kafka() && endpoints.brokers.is_none() {
        let what = FaultPoint::ALL
            .iter()
            .find(|p| p.on_kafka_wire() && sc.faults.get(**p) > 0.0)
            .map_or("`proxy.kafka`".to_string(), |p| format!("`faults.{}`", p.key()));
        return Err(Error::Usage(format!(
            "{what} needs the fault proxy in front of a real Kafka broker with a listener per slot (`scripts/services.sh up` configures them): pass --brokers or set KAFKA_BROKERS"
        )));
    }
    // A leader to kill takes a cluster; the mock cluster has one broker.
    if sc.timeline.iter().any(|t| t.point == FaultPoint::BrokerKillLeader) && endpoints.brokers.is_none() {
        return Err(Error::Usage(
            "the nemesis timeline's broker.kill_leader needs a real Kafka cluster (`scripts/services.sh up cluster`): pass --brokers or set KAFKA_BROKERS".into(),
        ));
    }
    // The broker's faults act on a local Kafka's process, or on the mock
    // cluster through its own controls; the database's need PostgreSQL.
    if let (Some(t), None) = (sc.timeline.iter().find(|t| t.point.strike() == Strike::Database), &endpoints.database_url) {
        return Err(Error::Usage(format!(
            "the nemesis timeline's {} needs PostgreSQL (pass --database-url or set DATABASE_URL); SQLite has no server to restart or sessions to end",
            t.point.name()
        )));
    }
    let under_test = [("notifier", &sc.notifier.command), ("relay", &sc.relay.command)];
    if let (Some((role, _)), None) = (under_test.iter().find(|c| c.1.is_some()), &endpoints.database_url) {
        return Err(Error::Usage(format!(
            "`{role}.command` runs a program under test against PostgreSQL only: pass --database-url or set DATABASE_URL"
        )));
    }
    Ok(endpoints)
}

/// What the run's components share, and the trigger that stops them.
fn context(sc: &Arc<Scenario>, infra: &Infra, names: &RunNames) -> (ShutdownTrigger, Ctx) {
    let (trigger, shutdown) = shutdown_pair();
    let ctx = Ctx {
        scenario: sc.clone(),
        store: infra.store.clone(),
        faults: Arc::new(FaultInjector::new(sc.seed, &sc.faults).with_schedule(sc.schedule.clone())),
        stats: Arc::new(Stats::default()),
        shutdown,
        broker: infra.broker.clone(),
        names: names.clone(),
        intent: Default::default(),
        tasks: Default::default(),
    };
    (trigger, ctx)
}

/// A run's database and broker, opened: the run's PostgreSQL schema or
/// SQLite file, and a real Kafka or librdkafka's mock cluster in process.
struct Infra {
    store: Store,
    /// A real Kafka, or the embedded mode's mock cluster in process.
    broker: SharedBroker,
    info: InfraInfo,
}

impl Infra {
    async fn open(sc: &Scenario, endpoints: &Endpoints, names: &RunNames, reports_dir: &Path) -> Result<Self> {
        let max_conns = (sc.producers + sc.notifier.instances + SPARE_CONNECTIONS) as u32;
        let store = match &endpoints.database_url {
            Some(url) => Store::Postgres(PgStore::open(url, &names.schema, max_conns).await?),
            None => {
                let path = reports_dir.join(format!("{}.sqlite", names.run_id));
                Store::Sqlite(SqliteStore::open(&path, max_conns).await?)
            }
        };
        let broker: SharedBroker = match &endpoints.brokers {
            Some(b) => Arc::new(Kafka::connect(b).await?),
            None => Arc::new(Kafka::embedded()?),
        };
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
        };
        Ok(Self { store, broker, info })
    }

    /// The banner's infra line.
    fn describe(&self, names: &RunNames) -> String {
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

    async fn close(self) {
        self.store.close().await;
        self.broker.close().await;
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
) -> Result<(Option<Programs>, Vec<crate::pipeline::context::Named>, Ctx)> {
    // A component with sessions of its own: behind the proxy, or when the
    // nemesis terminates the components' sessions (never the harness's).
    let own_sessions = ctx.scenario.timeline.iter().any(|t| t.point == FaultPoint::DbTerminateBackends);
    let through = |name: String, connections: u32| async move {
        match (lanes, &ctx.store) {
            (Some(l), _) if l.slot(&name).is_some() => l.ctx_for(ctx, &name, connections).await,
            (_, Store::Postgres(pg)) if own_sessions => {
                let app = format!("chaos-{}-{name}", ctx.names.run_id);
                Ok(Ctx { store: Store::Postgres(pg.for_component(&app, connections).await?), ..ctx.clone() })
            }
            _ => Ok(ctx.clone()),
        }
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
    components.push(("retention purger".to_string(), tokio::spawn(purger(ctx.clone()))));
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

/// How the workload and the drain went.
#[derive(Debug, Default)]
struct Ran {
    /// Why the run cannot be judged in full, if it cannot.
    incomplete: Option<String>,
    interrupted: bool,
    workload_ms: u64,
    drain_ms: u64,
}

/// The workload (after the group wait, bounded by [`workload_limit`]),
/// then the drain; either may be cut short by a signal, or by a program
/// under test that failed. After a signal, a second one exits at once.
async fn drive(
    ctx: &Ctx,
    workload_ctx: &Ctx,
    programs: Option<&Programs>,
    acting: &watch::Sender<bool>,
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
    let _ = acting.send(true);
    let limit = workload_limit(ctx.scenario.payments);
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
            r = tokio::time::timeout(limit, workload) => match r {
                Ok(Ok(())) => {}
                Ok(Err(e)) => ran.incomplete = Some(format!("the workload stopped: {e}")),
                Err(_) => ran.incomplete = Some(format!(
                    "the workload did not finish within {} s; a component or service may be stuck",
                    limit.as_secs()
                )),
            },
            why = &mut failed => ran.incomplete = Some(why),
            _ = crate::harness::interrupt::requested() => ran.interrupted = true,
        }
    }
    ran.workload_ms = t_work.elapsed().as_millis() as u64;
    let t_drain = Instant::now();
    progress.phase(Phase::Drain);
    if ran.incomplete.is_none() && !ran.interrupted {
        tokio::select! {
            r = drain(ctx) => if let Err(why) = r {
                ran.incomplete = Some(match programs {
                    Some(p) => format!("{why}; {}", p.stderr_of_first()),
                    None => why,
                })
            },
            why = &mut failed => ran.incomplete = Some(why),
            _ = crate::harness::interrupt::requested() => ran.interrupted = true,
        }
    }
    if let Some(p) = programs {
        p.set_acting(false);
    }
    let _ = acting.send(false);
    ran.drain_ms = t_drain.elapsed().as_millis() as u64;
    ran
}

/// The report before verification: what ran, what the components say, no verdict yet.
fn skeleton(sc: &Scenario, names: &RunNames, infra: &InfraInfo, faults: &FaultInjector, stats: &Stats) -> Report {
    Report {
        schema_version: report::SCHEMA_VERSION,
        run_id: names.run_id.clone(),
        scenario: ScenarioInfo {
            name: sc.name.clone(),
            path: sc.path.display().to_string(),
            exactly_once_expected: sc.exactly_once,
            payments: sc.payments,
            partitions: sc.partitions,
            relays: sc.relay.instances,
            notifiers: sc.notifier.instances,
            inbox: sc.notifier.inbox.as_str().into(),
            notifier_command: sc.notifier.command.as_ref().map(|c| c.shown()),
            relay_command: sc.relay.command.as_ref().map(|c| c.shown()),
        },
        seed: sc.seed,
        replay: sc.replay(),
        infra: infra.clone(),
        counts: Default::default(),
        faults: faults.summary(),
        fault_log: faults.log().into_iter().take(REPORT_FAULT_LOG).collect(),
        fired: Default::default(),
        invariants: vec![],
        chaos_checks: vec![],
        anomalies: vec![],
        components: figures(stats),
        timings: Timings::default(),
        latency_ms: None,
        stages: stages(stats),
        series: vec![],
        fault_spans_ms: fault_spans(sc),
        stories: vec![],
        verdict: Verdict::Incomplete,
        reason: String::new(),
    }
}

/// Verifies the run, unless it was interrupted or something may still
/// write, and sets the report's findings and verdict.
async fn judge(rep: &mut Report, ctx: &Ctx, ran: &mut Ran, still_running: bool) {
    let sc = &ctx.scenario;
    // After the nemesis restarted PostgreSQL or ended sessions, the pool's
    // connections may be dead: the verifier reads through a new one.
    let store = match &ctx.store {
        Store::Postgres(pg) if sc.timeline.iter().any(|t| t.point.strike() == Strike::Database) => {
            pg.fresh(2).await.map(Store::Postgres).unwrap_or_else(|_| ctx.store.clone())
        }
        other => other.clone(),
    };
    let verified = if ran.interrupted || still_running {
        None
    } else {
        tokio::select! {
            r = verify(&store, &ctx.names, sc, ctx) => Some(r),
            _ = crate::harness::interrupt::requested() => { ran.interrupted = true; None }
        }
    };
    let incomplete = ran.incomplete.clone();
    let (verdict, reason) = match verified {
        _ if ran.interrupted => {
            (Verdict::Interrupted, "interrupted by a signal before the run was verified; nothing was verified".into())
        }
        _ if still_running => (
            Verdict::Incomplete,
            format!("{}; nothing was verified, since something may still write", incomplete.unwrap_or_default()),
        ),
        None => (Verdict::Incomplete, incomplete.unwrap_or_default()),
        Some(Err(e)) => (
            Verdict::Incomplete,
            match incomplete {
                Some(r) => format!("{r}; verification failed too: {e}"),
                None => format!("verification could not read the ground truth: {e}"),
            },
        ),
        Some(Ok((r, topic_side))) => {
            let mut anomalies = r.anomalies;
            verdict::allow(&mut anomalies, &sc.allowed_anomalies);
            attribute(&store, &mut anomalies, ctx).await;
            rep.stories = stories(&store, &anomalies, topic_side, ctx).await;
            rep.faults = ctx.faults.summary();
            let chaos = verdict::chaos_checks(&rep.faults);
            let (v, why) = verdict::verdict(sc.exactly_once, &r.invariants, &anomalies, &chaos);
            rep.counts = r.counts;
            rep.invariants = r.invariants;
            rep.anomalies = anomalies;
            rep.chaos_checks = chaos;
            let mut recorder = crate::verifier::latency::LatencyRecorder::new();
            rep.latency_ms = store.latencies(&mut |ms| recorder.record(ms)).await.map(|()| recorder.finish()).unwrap_or_else(|e| {
                warn!(cause = %e, "measuring the latency failed");
                None
            });
            match incomplete {
                Some(reason) => (Verdict::Incomplete, format!("{reason}; the figures above are partial")),
                None => (v, why),
            }
        }
    };
    rep.fired = ctx.faults.fired_schedule();
    rep.verdict = verdict;
    rep.reason = reason;
}

fn stages(s: &Stats) -> Stages {
    let first = |a: &std::sync::atomic::AtomicU64| match Stats::get(a) {
        u64::MAX => 0,
        v => v,
    };
    Stages {
        first_write_ms: first(&s.first_write_ms),
        last_write_ms: Stats::get(&s.last_write_ms),
        first_publish_ms: first(&s.first_publish_ms),
        last_publish_ms: Stats::get(&s.last_publish_ms),
        first_apply_ms: first(&s.first_apply_ms),
        last_apply_ms: Stats::get(&s.last_apply_ms),
    }
}

fn figures(s: &Stats) -> ComponentFigures {
    ComponentFigures {
        messages_published: Stats::get(&s.messages_published),
        relay_batches: Stats::get(&s.relay_batches),
        relay_crashes: Stats::get(&s.relay_crashes),
        relay_errors: Stats::get(&s.relay_errors),
        events_applied: Stats::get(&s.events_applied),
        duplicates_absorbed: Stats::get(&s.duplicates_absorbed),
        stale_ignored: Stats::get(&s.stale_ignored),
        dead_lettered: Stats::get(&s.dead_lettered),
        notifier_crashes: Stats::get(&s.notifier_crashes),
        notifier_errors: Stats::get(&s.notifier_errors),
        purged_outbox_rows: Stats::get(&s.purged_outbox),
        purged_inbox_rows: Stats::get(&s.purged_inbox),
        processes_started: Stats::get(&s.processes_started),
        processes_killed: Stats::get(&s.processes_killed),
        processes_paused: Stats::get(&s.processes_paused),
        sessions_at_kill: Stats::get(&s.sessions_at_kill),
        sessions_gone_after_kill: Stats::get(&s.sessions_gone_after_kill),
    }
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
    let (instances, partitions) = (ctx.scenario.notifier.instances, ctx.scenario.partitions as usize);
    let limit = if ctx.broker.embedded() { GROUP_READY_MOCK } else { GROUP_READY };
    let deadline = Instant::now() + limit;
    let started = Instant::now();
    let mut settled = 0;
    while Instant::now() < deadline {
        let ready = ctx.stats.group_settled(instances, partitions);
        // Twice in a row, so that a rebalance still under way is not taken
        // for the settled group.
        settled = if ready { settled + 1 } else { 0 };
        if settled >= 2 {
            info!(ms = started.elapsed().as_millis() as u64, "notifier group settled");
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let held = ctx.stats.assigned.lock().map(|a| format!("{a:?}")).unwrap_or_default();
    warn!(%held, "the notifier group did not settle within {}s; starting the workload anyway", limit.as_secs());
}

/// Waits until every outbox row is published and the group's lag is zero,
/// twice in a row. Gives up after the scenario's drain timeout.
async fn drain(ctx: &Ctx) -> std::result::Result<(), String> {
    let deadline = Instant::now() + ctx.scenario.drain_timeout;
    let mut quiet = 0;
    let mut last = (0i64, 0i64);
    while Instant::now() < deadline {
        let unpublished = ctx.store.unpublished().await;
        let lag = ctx.broker.group_lag(&ctx.names.group, &ctx.names.topic, ctx.scenario.partitions).await;
        let zombies = Stats::get(&ctx.stats.zombies_active);
        match (unpublished, lag) {
            (Ok(0), Ok(0)) if zombies == 0 => {
                quiet += 1;
                if quiet >= 2 {
                    return Ok(());
                }
            }
            (Ok(u), Ok(l)) => {
                quiet = 0;
                last = (u, l);
            }
            (u, l) => {
                quiet = 0;
                warn!(unpublished = ?u.err(), lag = ?l.err(), "drain probe failed");
            }
        }
        tokio::time::sleep(DRAIN_POLL).await;
    }
    Err(format!(
        "the pipeline did not drain within {}s ({} outbox rows unpublished, group lag {})",
        ctx.scenario.drain_timeout.as_secs(),
        last.0,
        last.1
    ))
}

/// The verifier's topic read gets at least this long, and
/// [`TOPIC_READ_PER_PAYMENT`] per payment beyond it (a million payments'
/// 2.2 million messages read in about 10 s here).
const TOPIC_READ_FLOOR: Duration = Duration::from_secs(60);
const TOPIC_READ_PER_PAYMENT: Duration = Duration::from_micros(100);

/// Reads the ground truth against the workload's record of intent,
/// confirms the faults the topic shows, and reconciles.
async fn verify(
    store: &Store,
    names: &RunNames,
    sc: &Scenario,
    ctx: &Ctx,
) -> Result<(reconcile::Reconciliation, TopicSide)> {
    let mut ledger = Ledger::new();
    for p in ctx.intent.take() {
        ledger.add_intended(p);
    }
    store.ground_truth(&mut ledger).await?;
    let limit = TOPIC_READ_FLOOR.max(TOPIC_READ_PER_PAYMENT * sc.payments.min(u32::MAX as u64) as u32);
    let mut ledger = topic::read_all(ctx.broker.clone(), &names.topic, sc.partitions, limit, ledger).await?;
    for (point, event, copies) in ctx.faults.take_awaited_copies() {
        if ledger.copies(event) >= copies {
            ctx.faults.confirm(point, 1);
        }
    }
    let spec = reconcile::Spec { payments: sc.payments, outbox: sc.publish == crate::scenario::PublishMode::Outbox };
    let r = ledger.check(&spec);
    // A poison message's effect is its dead letter.
    ctx.faults.confirm(FaultPoint::WorkloadPoison, r.counts.dead_letters_matched);
    // What the stories need of the topic, while the ledger still holds it.
    let subjects: Vec<_> = story::wanted(&r.anomalies).into_iter().map(|(_, _, s)| s).collect();
    let topic_side = if subjects.is_empty() { TopicSide::default() } else { ledger.messages_of(&subjects) };
    Ok((r, topic_side))
}

/// For the stories: each subject's payment, and each payment's messages.
type TopicSide = (HashMap<Uuid, Uuid>, HashMap<Uuid, Vec<story::TopicMessage>>);

/// Each anomaly example's story ([`story`]): the topic's side from the
/// ledger, the database's dated rows read now. A failed read leaves the
/// report without stories: it never changes a verdict.
async fn stories(
    store: &Store,
    anomalies: &[crate::verifier::Anomaly],
    (payment_of, messages): TopicSide,
    ctx: &Ctx,
) -> Vec<story::Story> {
    let mut payments: Vec<Uuid> = payment_of.values().copied().collect();
    if payments.is_empty() {
        return vec![];
    }
    payments.sort_unstable();
    payments.dedup();
    match store.story(&payments).await {
        Ok(rows) => story::tell(
            anomalies,
            &payment_of,
            &messages,
            &rows,
            &ctx.faults.deliveries(),
            ctx.faults.started_epoch_ms(),
        ),
        Err(e) => {
            warn!(cause = %e, "reading the anomalies' stories failed");
            vec![]
        }
    }
}

/// Samples the counters the progress line shows, for the report's chart,
/// until told to stop (then once more). Past [`report::SERIES_MAX`]
/// samples it keeps every other one and samples half as often.
fn sample(stats: Arc<Stats>) -> (tokio::task::JoinHandle<Vec<Sample>>, tokio::sync::oneshot::Sender<()>) {
    let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let mut every = Duration::from_millis(report::SAMPLE_EVERY_MS);
        let mut series = Vec::new();
        let now = |s: &Stats| Sample {
            at_ms: s.origin.elapsed().as_millis() as u64,
            written: Stats::get(&s.payments_written),
            published: Stats::get(&s.messages_published),
            applied: Stats::get(&s.events_applied),
        };
        loop {
            series.push(now(&stats));
            if series.len() >= report::SERIES_MAX {
                series = series.into_iter().step_by(2).collect();
                every *= 2;
            }
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = &mut stopped => break,
            }
        }
        series.push(now(&stats));
        series
    });
    (task, stop)
}

/// How long each scheduled fault lasts, for the chart's bands: the
/// timeline's `for` (its first entry per fault point) and a pause's length.
fn fault_spans(sc: &Scenario) -> std::collections::BTreeMap<String, u64> {
    let mut spans = std::collections::BTreeMap::new();
    for t in &sc.timeline {
        spans.entry(t.point.name().to_string()).or_insert(t.lasts.as_millis() as u64);
    }
    if sc.faults.get(FaultPoint::ProcessPause) > 0.0 {
        spans.insert(FaultPoint::ProcessPause.name().to_string(), sc.pause.as_millis() as u64);
    }
    spans
}

/// How long the workload may take, group wait included: generous (a
/// million payments take about 100 s on the real services here), so that
/// only a stuck run reaches it.
const WORKLOAD_FLOOR: Duration = Duration::from_secs(120);
const WORKLOAD_PER_PAYMENT: Duration = Duration::from_millis(2);

fn workload_limit(payments: u64) -> Duration {
    WORKLOAD_FLOOR.max(WORKLOAD_PER_PAYMENT * payments.min(u32::MAX as u64) as u32)
}

/// How long the components get to stop once told to: a component stuck on
/// a dead service is abandoned (aborted, and it dies with the process),
/// never waited on forever.
const STOP_DEADLINE: Duration = Duration::from_secs(15);

/// What the stop saw: components that panicked, and ones still running at
/// the deadline.
#[derive(Debug, Default)]
struct Stopped {
    panicked: Vec<String>,
    stuck: Vec<String>,
}

impl Stopped {
    /// Why the run is incomplete, if it is.
    fn why(&self) -> Option<String> {
        let mut parts = Vec::new();
        if !self.panicked.is_empty() {
            parts.push(format!("{} panicked", self.panicked.join(", ")));
        }
        if !self.stuck.is_empty() {
            parts.push(format!("{} did not stop within {} s", self.stuck.join(", "), STOP_DEADLINE.as_secs()));
        }
        (!parts.is_empty()).then(|| parts.join("; "))
    }
}

/// Awaits every component and task under one deadline; aborts what is left.
async fn stop(components: Vec<(String, tokio::task::JoinHandle<()>)>) -> Stopped {
    let deadline = tokio::time::Instant::now() + STOP_DEADLINE;
    let mut out = Stopped::default();
    for (name, mut handle) in components {
        match tokio::time::timeout_at(deadline, &mut handle).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) if e.is_panic() => out.panicked.push(name),
            Ok(Err(_)) => {}
            Err(_) => {
                handle.abort();
                out.stuck.push(name);
            }
        }
    }
    out
}

/// Retention: purges old published outbox rows and old inbox rows.
async fn purger(ctx: Ctx) {
    let mut shutdown = ctx.shutdown.clone();
    let r = &ctx.scenario.retention;
    loop {
        if shutdown.sleep(r.purge_interval).await {
            return;
        }
        match ctx.store.purge(r.outbox, r.inbox).await {
            Ok((o, i)) => {
                Stats::add(&ctx.stats.purged_outbox, o);
                Stats::add(&ctx.stats.purged_inbox, i);
            }
            Err(e) => warn!(cause = %e, "retention purge failed"),
        }
    }
}

/// Dates each anomaly's examples by their last trace in the database and
/// names the faults that fired just before ([`attribution`]). A failed
/// look-up leaves the anomalies undated: it never changes a verdict.
async fn attribute(store: &Store, anomalies: &mut [crate::verifier::Anomaly], ctx: &Ctx) {
    let ids = attribution::subjects(anomalies);
    if ids.is_empty() {
        return;
    }
    match store.traces(&ids).await {
        Ok(traces) => attribution::attribute(anomalies, &traces, ctx.faults.started_epoch_ms(), &ctx.faults.log()),
        Err(e) => warn!(cause = %e, "dating the anomalies' examples failed"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_stop_names_what_panicked_and_what_did_not_stop() {
        let fine = tokio::spawn(async {});
        let panics = tokio::spawn(async { panic!("planted") });
        let stuck = tokio::spawn(std::future::pending::<()>());
        let stopped =
            stop(vec![("relay-1".into(), fine), ("notifier-2".into(), panics), ("notifier-1 zombie".into(), stuck)])
                .await;
        assert_eq!(stopped.panicked, vec!["notifier-2"]);
        assert_eq!(stopped.stuck, vec!["notifier-1 zombie"]);
        let why = stopped.why().unwrap();
        assert_eq!(why, "notifier-2 panicked; notifier-1 zombie did not stop within 15 s");
        assert!(Stopped::default().why().is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn the_series_stays_bounded_however_long_the_run() {
        let stats = Arc::new(Stats::default());
        Stats::add(&stats.payments_written, 7);
        let (task, stop) = sample(stats);
        // Three times as long as SERIES_MAX samples at the first rate.
        let long = Duration::from_millis(report::SAMPLE_EVERY_MS * 3 * report::SERIES_MAX as u64);
        tokio::time::sleep(long).await;
        let _ = stop.send(());
        let series = task.await.unwrap();
        assert!(series.len() <= report::SERIES_MAX, "{} samples", series.len());
        assert!(series.len() >= report::SERIES_MAX / 2, "thinned too far: {} samples", series.len());
        assert!(series.iter().all(|s| s.written == 7));
    }

    #[test]
    fn the_workload_limit_grows_with_the_payments() {
        assert_eq!(workload_limit(1000), WORKLOAD_FLOOR);
        assert_eq!(workload_limit(1_000_000), Duration::from_secs(2000));
    }
}
