//! One run of a declared system (`[system]`, docs/contract.md section 8):
//! the run's empty schema, the user's setup, every declaration proved on
//! it before any traffic, the user's service, relay and consumer as
//! processes under the nemesis, the HTTP workload and its record of
//! intent, the drain, and the generic verifier.

mod workload;

use super::drive::{self, Left, Stopped, Undrained};
use super::infra::{self, Infra};
use super::{Event, Reporter};
use crate::broker::SharedBroker;
use crate::context::Ctx;
use crate::domain::names::RunNames;
use crate::error::{Error, Result};
use crate::nemesis::process::program::{Database, Programs};
use crate::nemesis::proxy::Lanes;
use crate::report::progress::{Phase, Progress};
use crate::report::{assemble, InfraInfo, Report, Timings};
use crate::scenario::{Published, Scenario, ServiceDecl, Setup, System};
use crate::store::declared as rows;
use crate::store::postgres::PgStore;
use crate::store::Store;
use crate::verifier::{verdict, Verdict};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tracing::{info, warn};

/// How long the user's migrations may run.
const SETUP_LIMIT: Duration = Duration::from_secs(120);
/// How often a service's health URL is asked while it starts.
const HEALTH_POLL: Duration = Duration::from_millis(200);
/// The harness's own connections: the drain's probes and the verifier.
const CONNECTIONS: u32 = 4;

/// Runs a declared system end to end.
pub async fn execute(
    sc: Scenario,
    database_url: Option<String>,
    brokers: Option<String>,
    reports_dir: &Path,
    reporter: &dyn Reporter,
) -> Result<Report> {
    let started = Instant::now();
    let Some(sys) = sc.system.clone() else { return Err(Error::Internal("a declared run without [system]".into())) };
    let Some(service) = sys.service.clone() else {
        return Err(Error::Scenario(format!(
            "{}: `[system.service]` is not set, so this declaration only judges another run; pass it as `--declared` to a run of the payments pipeline, or declare your service",
            sc.path.display()
        )));
    };
    let endpoints = infra::endpoints(&sc, database_url, brokers)?;
    let Some(url) = endpoints.database_url.clone() else {
        return Err(Error::Usage(
            "a `[system]` scenario runs against PostgreSQL only: pass --database-url or set DATABASE_URL".into(),
        ));
    };
    let names = RunNames::new().for_system(&sc.name);
    let pg = PgStore::open_empty(&url, &names.schema, CONNECTIONS).await?;
    set_up(&pg, &sys, &sc, &url, &names).await?;
    let broker: SharedBroker = crate::broker::open(endpoints.brokers.as_deref()).await?;
    let mut infra = Infra {
        info: InfraInfo {
            database: "postgres".into(),
            database_endpoint: pg.endpoint.clone(),
            schema: pg.schema.clone(),
            broker: broker.kind().into(),
            brokers: broker.bootstrap().into(),
            topic: names.topic.clone(),
            group: names.group.clone(),
            proxy: None,
        },
        store: Store::Postgres(pg.clone()),
        broker,
    };
    let sc = Arc::new(sc);
    let (trigger, mut ctx) = infra::context(&sc, &infra, &names);
    // The provider stands before the programs, which get its URL.
    let provider = crate::harness::emails::start(&sc, &ctx.faults).await?;
    if let Some(p) = &provider {
        ctx.email = Some(Arc::new(crate::harness::emails::client(&p.base_url())?));
    }
    let (acting, _) = watch::channel(false);
    let lanes = match sc.proxied() {
        true => Some(Lanes::start(&ctx, &url, acting.subscribe()).await?),
        false => None,
    };
    let mut infra_line = infra.describe(&names);
    if let Some(l) = &lanes {
        infra_line = format!("{infra_line} · {}", l.describe());
        infra.info.proxy = Some(l.describe());
    }
    reporter.event(&Event::Started { run_id: &names.run_id, scenario: &sc.name, seed: sc.seed, infra: &infra_line })?;
    info!(run_id = %names.run_id, seed = sc.seed, "starting a declared system");
    let progress =
        Progress::start(sys.operation.count, ctx.stats.clone(), ctx.faults.clone(), reporter.shows_progress());
    infra.broker.create_topic(&names.topic, sc.partitions).await?;
    let setup_ms = started.elapsed().as_millis() as u64;

    let logs = reports_dir.join(format!("{}-processes", names.run_id));
    let (programs, mut components) =
        match Programs::start(&ctx, &Database::Postgres(url.clone()), logs, lanes.as_ref())? {
            Some(p) => p,
            None => return Err(Error::Internal("a declared system without programs".into())),
        };
    let slots = lanes.as_ref().map(|l| l.slots()).unwrap_or_default();
    components.extend(crate::nemesis::timeline::start(&ctx, acting.subscribe(), slots));

    let mut ran = drive::Ran::default();
    let t_work = Instant::now();
    // The service must answer before anything is asked of it: one that
    // never does is a service that cannot be reached (exit 3).
    if let Err(e) = healthy(&programs, &service, &ctx).await {
        trigger.trigger();
        let _ = drive::stop(components).await;
        infra.close().await;
        return Err(e);
    }
    tokio::select! {
        r = programs.ready(&ctx) => if let Err(why) = r { ran.incomplete = Some(why) },
        _ = crate::harness::interrupt::requested() => ran.interrupted = true,
    }
    programs.set_acting(true);
    let _ = acting.send(true);
    let mut ops = Vec::new();
    if ran.incomplete.is_none() && !ran.interrupted {
        progress.phase(Phase::Workload);
        let work = workload::run(
            Arc::new(sys.operation.clone()),
            sc.seed,
            programs.service_ports().to_vec(),
            ctx.faults.clone(),
            ctx.stats.clone(),
        );
        tokio::select! {
            r = work => match r {
                Ok(o) => ops = o,
                Err(e) => ran.incomplete = Some(format!("the workload stopped: {e}")),
            },
            why = programs.failed() => ran.incomplete = Some(why),
            _ = crate::harness::interrupt::requested() => ran.interrupted = true,
        }
    }
    ran.workload_ms = t_work.elapsed().as_millis() as u64;
    let t_drain = Instant::now();
    progress.phase(Phase::Drain);
    // Undrained with outbox rows left, the faults stop and the relays get
    // one more drain timeout: a relay the faults only slowed publishes
    // then, and one that still does not has stalled (a `stalled relay`,
    // judged, not an INCOMPLETE run).
    let mut relay_stall = None;
    let mut faults_off: Option<Instant> = None;
    while ran.incomplete.is_none() && !ran.interrupted {
        tokio::select! {
            r = drain(&ctx, &pg, &sys) => match r {
                Ok(()) => break,
                Err(u) if u.unpublished > 0 && faults_off.is_none() => {
                    info!(left = u.unpublished, "outbox rows still unpublished at the drain timeout: the faults stop, the relays get one more");
                    faults_off = Some(Instant::now());
                    programs.set_acting(false);
                    let _ = acting.send(false);
                }
                Err(u) if u.unpublished > 0 => {
                    let fault_free = faults_off.map(|t| t.elapsed()).unwrap_or_default();
                    relay_stall = Some(RelayStall::read(&pg, &sys, u.unpublished, t_drain.elapsed(), fault_free).await);
                    break;
                }
                Err(u) => {
                    ran.incomplete = Some(format!("{}; {}", u.why, programs.stderr_of_first()));
                }
            },
            why = programs.failed() => ran.incomplete = Some(why),
            _ = crate::harness::interrupt::requested() => ran.interrupted = true,
        }
    }
    programs.set_acting(false);
    let _ = acting.send(false);
    // Drained is not done: a consumer that stores first and applies later
    // has work left. The system settles, its faults over, before it is judged.
    let mut stall = None;
    if ran.incomplete.is_none() && !ran.interrupted {
        let deadline = Instant::now() + sc.drain_timeout;
        tokio::select! {
            r = settle(&ctx, &pg, &sys, deadline) => match r {
                Ok(Settled::Quiet) => {}
                Ok(Settled::Stalled(s)) => stall = Some(s),
                Err(e) => ran.incomplete = Some(format!("the settle after the drain could not read the system: {e}")),
            },
            why = programs.failed() => ran.incomplete = Some(why),
            _ = crate::harness::interrupt::requested() => ran.interrupted = true,
        }
    }
    ran.drain_ms = t_drain.elapsed().as_millis() as u64;
    trigger.trigger();
    components.extend(ctx.tasks.take());
    let stopped = tokio::select! {
        s = drive::stop(components) => s,
        _ = crate::harness::interrupt::requested(), if !ran.interrupted => { ran.interrupted = true; Stopped::default() }
    };
    if let Some(l) = lanes {
        l.close();
    }
    // Every program has stopped: the provider's record is final.
    let record = match &provider {
        Some(p) => {
            p.shutdown().await;
            Some(p.take_record())
        }
        None => None,
    };
    super::why_incomplete(&mut ran, programs.failure(), &stopped);

    let mut rep = assemble::skeleton(&sc, &names, &infra.info, &ctx.faults, &ctx.stats);
    rep.scenario.payments = sys.operation.count;
    rep.scenario.inbox = "declared".into();
    rep.timings = Timings { setup_ms, workload_ms: ran.workload_ms, drain_ms: ran.drain_ms, ..Default::default() };
    let t_verify = Instant::now();
    progress.phase(Phase::Verify);
    let stalls = Stalls { consumer: stall, relay: relay_stall };
    judge(&mut rep, &ctx, &pg, &sys, &ops, &mut ran, !stopped.stuck.is_empty(), record.as_ref(), &stalls).await;
    progress.finish();
    rep.timings.verify_ms = t_verify.elapsed().as_millis() as u64;
    rep.timings.total_ms = started.elapsed().as_millis() as u64;
    infra.close().await;
    let saved = rep.save(reports_dir)?;
    reporter.event(&Event::Finished { report: &rep, json: &saved.json, md: &saved.md, html: &saved.html })?;
    Ok(rep)
}

/// The user's schema in the run's, then every declaration proved on it,
/// then the outbox log. A bad declaration is a bad scenario (exit 2),
/// named by its key, with the database's own message.
async fn set_up(pg: &PgStore, sys: &System, sc: &Scenario, url: &str, names: &RunNames) -> Result<()> {
    let shown = sc.path.display().to_string();
    match &sys.setup {
        Setup::None => {}
        Setup::Sql { path, text } => rows::apply_setup(pg, text).await.map_err(|m| {
            Error::Scenario(format!("{shown}: `system.setup` ({}) fails on the run's schema: {m}", path.display()))
        })?,
        Setup::Command(cmd) => {
            let mut c = tokio::process::Command::new(&cmd.argv[0]);
            c.args(&cmd.argv[1..])
                .current_dir(&cmd.dir)
                .env("CHAOS_DATABASE_URL", url)
                .env("CHAOS_SCHEMA", &names.schema)
                .env("CHAOS_RUN_ID", &names.run_id)
                .env("PGAPPNAME", format!("chaos-{}-setup", names.run_id))
                .stdin(std::process::Stdio::null())
                .kill_on_drop(true);
            let out = tokio::time::timeout(SETUP_LIMIT, c.output())
                .await
                .map_err(|_| {
                    Error::Scenario(format!(
                        "{shown}: `system.setup_command` did not finish within {} s",
                        SETUP_LIMIT.as_secs()
                    ))
                })?
                .map_err(|e| {
                    Error::Scenario(format!("{shown}: `system.setup_command` `{}` could not start: {e}", cmd.shown()))
                })?;
            if !out.status.success() {
                let err = String::from_utf8_lossy(&out.stderr);
                let tail: Vec<&str> = err.lines().rev().take(3).collect::<Vec<_>>().into_iter().rev().collect();
                return Err(Error::Scenario(format!(
                    "{shown}: `system.setup_command` `{}` failed with {}: {}",
                    cmd.shown(),
                    out.status,
                    tail.join(" | ")
                )));
            }
        }
    }
    let bad = |b: rows::BadDeclaration| Error::Scenario(format!("{shown}: {}: {}", b.key, b.message));
    rows::probe_outbox(pg, sys).await.map_err(bad)?;
    // The log before the queries: a declared query may read it.
    rows::install_outbox_log(pg, &sys.outbox).await?;
    rows::probe_queries(pg, sys).await.map_err(bad)
}

/// Waits until every service slot answers its health path with a 2xx, or
/// has written its ready line.
async fn healthy(programs: &Programs, service: &ServiceDecl, ctx: &Ctx) -> Result<()> {
    if let Some(line) = &service.ready_line {
        return ready_line(programs, service, line, ctx).await;
    }
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(1))
        .build()
        .map_err(|e| Error::Internal(format!("making the health check's client: {e}")))?;
    let limit = service.ready_timeout;
    let started = Instant::now();
    for (slot, port) in programs.service_ports().iter().enumerate() {
        let url = format!("http://127.0.0.1:{port}{}", service.health);
        let mut last;
        loop {
            if let Some(f) = programs.failure() {
                return Err(Error::Service(format!("the service did not become ready: {f}")));
            }
            match client.get(&url).send().await {
                Ok(r) if r.status().is_success() => break,
                Ok(r) => last = format!("it answered {}", r.status()),
                Err(e) if e.is_connect() => last = "nothing listens there".into(),
                Err(e) => last = format!("no answer ({e})"),
            }
            if started.elapsed() >= limit {
                return Err(Error::Service(format!(
                    "the service `{}` (service-{}) did not answer GET {url} with a 2xx within {} s ({last}); check `system.service.health` and that it listens on CHAOS_PORT; {}",
                    service.command.shown(),
                    slot + 1,
                    limit.as_secs(),
                    programs.stderr_of_first()
                )));
            }
            if ctx.shutdown.is_set() {
                return Err(Error::Internal("stopped while waiting for the service".into()));
            }
            tokio::time::sleep(HEALTH_POLL).await;
        }
    }
    info!(ms = started.elapsed().as_millis() as u64, "service ready");
    Ok(())
}

/// Waits until each service slot's output (its log, where the keeper
/// copies stdout and stderr) holds `line`.
async fn ready_line(programs: &Programs, service: &ServiceDecl, line: &str, ctx: &Ctx) -> Result<()> {
    let started = Instant::now();
    for slot in 1..=programs.service_ports().len() {
        let prefix = format!("service-{slot}.");
        loop {
            if let Some(f) = programs.failure() {
                return Err(Error::Service(format!("the service did not become ready: {f}")));
            }
            let seen = std::fs::read_dir(&programs.logs).into_iter().flatten().flatten().any(|e| {
                e.file_name().to_string_lossy().starts_with(&prefix)
                    && std::fs::read_to_string(e.path()).is_ok_and(|t| t.contains(line))
            });
            if seen {
                break;
            }
            if started.elapsed() >= service.ready_timeout {
                return Err(Error::Service(format!(
                    "the service `{}` (service-{slot}) did not write {line:?} within {} s; check `system.service.ready_line`; {}",
                    service.command.shown(),
                    service.ready_timeout.as_secs(),
                    programs.stderr_of_first()
                )));
            }
            if ctx.shutdown.is_set() {
                return Err(Error::Internal("stopped while waiting for the service".into()));
            }
            tokio::time::sleep(HEALTH_POLL).await;
        }
    }
    info!(ms = started.elapsed().as_millis() as u64, "service ready (its ready line)");
    Ok(())
}

/// Waits until every outbox row is marked published (or, with no mark,
/// the topic holds as many messages as the outbox log) and the consumer
/// group's lag is zero, twice in a row.
async fn drain(ctx: &Ctx, pg: &PgStore, sys: &System) -> std::result::Result<(), Undrained> {
    let left = || async {
        let unpublished = match rows::unpublished(pg, &sys.outbox).await? {
            Some(n) => n,
            // No mark: what the log holds and the topic does not yet.
            None => {
                let on_topic: i64 = ctx
                    .broker
                    .watermarks(&ctx.names.topic, ctx.scenario.partitions)?
                    .iter()
                    .map(|(lo, hi)| hi - lo)
                    .sum();
                (rows::logged(pg).await? - on_topic).max(0)
            }
        };
        Ok(Left { unpublished, busy: false })
    };
    let what = match sys.outbox.published {
        Published::Column(_) | Published::Delete => "outbox rows unpublished",
        Published::None => "outbox events not yet on the topic",
    };
    drive::drain_until_done(ctx, "the system", what, left).await
}

/// Outbox rows the relays never published, not even once the faults had
/// stopped and they had one more drain timeout.
struct RelayStall {
    /// How many rows were left at the drain's last reading.
    left: i64,
    /// Their keys, when the relay keeps a mark (a column or a delete).
    keys: Vec<String>,
    /// How long the drain had waited, faults and fault-free together.
    waited: Duration,
    /// How much of it was without faults.
    fault_free: Duration,
}

impl RelayStall {
    async fn read(pg: &PgStore, sys: &System, left: i64, waited: Duration, fault_free: Duration) -> Self {
        let keys = match rows::unpublished_keys(pg, &sys.outbox).await {
            Ok(k) => k.unwrap_or_default(),
            Err(e) => {
                warn!(error = %e, "could not read the unpublished rows' keys");
                Vec::new()
            }
        };
        Self { left, keys, waited, fault_free }
    }
}

/// What never finished: work a consumer accepted, outbox rows no relay
/// published. Their keys are late, not lost.
struct Stalls {
    consumer: Option<Stall>,
    relay: Option<RelayStall>,
}

impl Stalls {
    /// The keys whose effects are not expected yet.
    fn keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = self.consumer.iter().flat_map(|s| s.keys.iter().cloned()).collect();
        keys.extend(self.relay.iter().flat_map(|r| r.keys.iter().cloned()));
        keys
    }
}

/// How often the settle reads the pending work and the effects' counts.
const SETTLE_POLL: Duration = Duration::from_millis(200);

/// How a drained system came to rest.
enum Settled {
    /// No pending work, every effect's count unchanged for the quiet period.
    Quiet,
    /// The time ran out with declared pending work still there.
    Stalled(Stall),
}

/// Work the system accepted and never applied, when the settle ran out.
struct Stall {
    /// The pending rows' keys (an empty string for a row without one).
    keys: Vec<String>,
    /// How long the settle waited after the drain.
    waited: Duration,
}

/// After the drain: waits until the declared pending work (`[system]
/// pending`) is gone and every effect's count has stayed the same for
/// `[run] settle_quiet_ms`, until `deadline`. Counts still moving at the
/// deadline are judged as they are; pending work still there is a stall.
/// `CHAOS_SKIP_SETTLE=1` judges at once (a switch for tests that show the
/// settle is what makes the difference).
async fn settle(ctx: &Ctx, pg: &PgStore, sys: &System, deadline: Instant) -> Result<Settled> {
    if std::env::var_os("CHAOS_SKIP_SETTLE").is_some() {
        warn!("CHAOS_SKIP_SETTLE: judging at once, without waiting for pending work");
        return Ok(Settled::Quiet);
    }
    let quiet = ctx.scenario.settle_quiet;
    let started = Instant::now();
    let (mut last, mut since) = (None, Instant::now());
    loop {
        let pending = match &sys.pending {
            Some(q) => rows::pending(pg, q).await?,
            None => Vec::new(),
        };
        let counts = rows::effect_counts(pg, sys).await?;
        if !pending.is_empty() || last.as_ref() != Some(&counts) {
            since = Instant::now();
        }
        last = Some(counts);
        if pending.is_empty() && since.elapsed() >= quiet {
            info!(ms = started.elapsed().as_millis() as u64, "settled: no pending work, effects unchanged");
            return Ok(Settled::Quiet);
        }
        if Instant::now() + SETTLE_POLL > deadline {
            if pending.is_empty() {
                warn!("the effects were still changing when the drain timeout ran out; judging them as they are");
                return Ok(Settled::Quiet);
            }
            return Ok(Settled::Stalled(Stall { keys: pending, waited: started.elapsed() }));
        }
        tokio::time::sleep(SETTLE_POLL).await;
    }
}

/// The last fault that struck a component whose name starts with
/// `prefix`, or else the last of all, as the stall's last fault before.
fn last_fault(faults: &[crate::faults::FaultRecord], prefix: &str) -> String {
    let on = faults.iter().filter(|f| f.component.starts_with(prefix)).max_by_key(|f| f.at_ms);
    on.or_else(|| faults.iter().max_by_key(|f| f.at_ms))
        .map(|f| format!("{} on {} at {:.3} s", f.point, f.component, f.at_ms as f64 / 1000.0))
        .unwrap_or_else(|| "none fired".into())
}

/// A liveness anomaly: its headline example, then up to four keys.
fn stall_anomaly(
    kind: crate::domain::anomaly::AnomalyKind,
    count: u64,
    headline: String,
    keys: &[String],
    each: &str,
) -> crate::verifier::Anomaly {
    let mut keys: Vec<&str> = keys.iter().map(String::as_str).filter(|k| !k.is_empty()).collect();
    keys.sort();
    keys.dedup();
    let mut examples = vec![headline];
    examples.extend(keys.iter().take(4).map(|k| format!("key {k}: {each}")));
    crate::verifier::Anomaly {
        name: kind.as_str().into(),
        count,
        examples,
        allowed: false,
        subjects: vec![],
        followed: vec![],
    }
}

/// The `stalled consumer` anomaly of a stall: how much was left, for how
/// long, which keys, and the last fault before it.
fn stalled(stall: &Stall, faults: &[crate::faults::FaultRecord]) -> crate::verifier::Anomaly {
    let headline = format!(
        "{} rows of system.pending still there {:.1} s after the drain; the last fault before: {}",
        stall.keys.len(),
        stall.waited.as_secs_f64(),
        last_fault(faults, "notifier")
    );
    let kind = crate::domain::anomaly::AnomalyKind::StalledConsumer;
    stall_anomaly(kind, stall.keys.len() as u64, headline, &stall.keys, "accepted, still pending")
}

/// The `stalled relay` anomaly: how many outbox rows were left, for how
/// long the drain waited, which keys, and the last fault before (a
/// relay's, when one was struck).
fn stalled_relay(stall: &RelayStall, faults: &[crate::faults::FaultRecord]) -> crate::verifier::Anomaly {
    let headline = format!(
        "{} outbox rows unpublished {:.1} s into the drain ({:.1} s of it fault-free); last fault before: {}",
        stall.left,
        stall.waited.as_secs_f64(),
        stall.fault_free.as_secs_f64(),
        last_fault(faults, "relay")
    );
    let kind = crate::domain::anomaly::AnomalyKind::StalledRelay;
    stall_anomaly(kind, stall.left.max(0) as u64, headline, &stall.keys, "written to the outbox, never published")
}

/// The two liveness invariants beside the verifier's: a stalled relay
/// breaks "no outbox row left unpublished" (its rows are the leftovers),
/// and a system that declares `pending` promises its accepted work is
/// applied before the run ends.
fn liveness(invariants: &mut Vec<crate::verifier::Invariant>, sys: &System, stalls: &Stalls) {
    use crate::domain::anomaly::AnomalyKind;
    if stalls.relay.is_some() {
        if let Some(i) = invariants.iter_mut().find(|i| i.name == crate::verifier::declared::UNPUBLISHED_INVARIANT) {
            i.anomalies.push(AnomalyKind::StalledRelay.as_str().into());
        }
    }
    if sys.pending.is_some() {
        let left = stalls.consumer.as_ref().map_or(0, |s| s.keys.len() as u64);
        let mut i = crate::verifier::Invariant::eq(PENDING_INVARIANT, 0, left);
        i.anomalies = vec![AnomalyKind::StalledConsumer.as_str().into()];
        invariants.push(i);
    }
}

/// The invariant of a system that declares its pending work.
const PENDING_INVARIANT: &str = "the accepted work (system.pending) is applied before the run ends";

/// The generic verifier's pass, unless the run was interrupted or
/// something may still write, and the verdict.
#[allow(clippy::too_many_arguments)]
async fn judge(
    rep: &mut Report,
    ctx: &Ctx,
    pg: &PgStore,
    sys: &System,
    ops: &[crate::domain::operations::Operation],
    ran: &mut drive::Ran,
    still_running: bool,
    record: Option<&crate::provider::Record>,
    stalls: &Stalls,
) {
    let sc = &ctx.scenario;
    let verified = if ran.interrupted || still_running || ran.incomplete.is_some() {
        None
    } else {
        // A fresh pool: the nemesis may have ended sessions.
        let pg = pg.fresh(2).await.unwrap_or_else(|_| pg.clone());
        let faults = ctx.faults.log();
        let late = stalls.keys();
        let read = crate::verifier::declared::verify(
            &pg,
            ctx.broker.clone(),
            &ctx.names.topic,
            sc.partitions,
            sys,
            ops,
            faults,
            ctx.faults.started_epoch_ms(),
            record,
            &late,
        );
        tokio::select! {
            r = read => Some(r),
            _ = crate::harness::interrupt::requested() => { ran.interrupted = true; None }
        }
    };
    let (v, reason) = match verified {
        _ if ran.interrupted => {
            (Verdict::Interrupted, "interrupted by a signal before the run was verified; nothing was verified".into())
        }
        _ if still_running => (
            Verdict::Incomplete,
            format!(
                "{}; nothing was verified, since something may still write",
                ran.incomplete.clone().unwrap_or_default()
            ),
        ),
        None => (Verdict::Incomplete, format!("{}; nothing was verified", ran.incomplete.clone().unwrap_or_default())),
        Some(Err(e)) => (Verdict::Incomplete, format!("verification could not read the ground truth: {e}")),
        Some(Ok(found)) => {
            let mut anomalies = found.anomalies;
            // Late is not lost: the stall leads, and its keys are left out
            // of the missing effects.
            if let Some(s) = &stalls.consumer {
                anomalies.insert(0, stalled(s, &ctx.faults.log()));
            }
            if let Some(s) = &stalls.relay {
                anomalies.insert(0, stalled_relay(s, &ctx.faults.log()));
            }
            let mut invariants = found.invariants;
            liveness(&mut invariants, sys, stalls);
            verdict::allow(&mut anomalies, &sc.allowed_anomalies);
            rep.faults = ctx.faults.summary();
            let chaos = verdict::chaos_checks(&rep.faults);
            let (v, why) = verdict::verdict(sc.exactly_once, &invariants, &anomalies, &chaos);
            rep.invariants = invariants;
            rep.anomalies = anomalies;
            rep.chaos_checks = chaos;
            rep.system = Some(found.figures);
            (v, why)
        }
    };
    rep.fired = ctx.faults.fired_schedule();
    rep.verdict = v;
    rep.reason = reason;
}

/// Before a payments run judged by a declaration too (`--declared`): the
/// declaration proved on the run's freshly migrated schema, and the
/// outbox log added. PostgreSQL only.
pub(super) async fn prepare_cross_check(sc: &Scenario, sys: &System, store: &Store) -> Result<()> {
    let Store::Postgres(pg) = store else {
        return Err(Error::Usage(
            "--declared reads the run with SQL of PostgreSQL's: pass --database-url or set DATABASE_URL".into(),
        ));
    };
    let shown = sc.path.display();
    let bad = |b: rows::BadDeclaration| Error::Scenario(format!("{shown}: --declared: {}: {}", b.key, b.message));
    rows::probe_outbox(pg, sys).await.map_err(bad)?;
    rows::install_outbox_log(pg, &sys.outbox).await?;
    rows::probe_queries(pg, sys).await.map_err(bad)
}

/// The payments the workload committed, as a declared system's record of
/// intent: each payment an acknowledged operation keyed by its id, with
/// the values the declaration names.
pub(super) fn operations_of(
    sys: &System,
    intent: &[crate::domain::intent::Intended],
) -> Vec<crate::domain::operations::Operation> {
    intent
        .iter()
        .map(|i| crate::domain::operations::Operation {
            key: i.id,
            values: sys
                .operation
                .values
                .iter()
                .map(|(name, _)| match name.as_str() {
                    "account_id" => serde_json::Value::from(i.account_id),
                    _ => serde_json::Value::from(i.amount_cents),
                })
                .collect(),
            outcome: crate::domain::operations::Outcome::Acknowledged,
            status: 200,
            sent_ms: 0,
            done_ms: 0,
        })
        .collect()
}

/// The generic verifier's verdict on a payments run (`--declared`).
pub(super) async fn cross_check(
    ctx: &Ctx,
    store: &Store,
    sys: &System,
    ops: &[crate::domain::operations::Operation],
    emails: Option<&crate::provider::Record>,
) -> crate::report::CrossCheck {
    let sc = &ctx.scenario;
    let Store::Postgres(pg) = store else {
        return crate::report::CrossCheck {
            verdict: Verdict::Incomplete,
            reason: "not PostgreSQL".into(),
            anomalies: vec![],
        };
    };
    let found = crate::verifier::declared::verify(
        pg,
        ctx.broker.clone(),
        &ctx.names.topic,
        sc.partitions,
        sys,
        ops,
        ctx.faults.log(),
        ctx.faults.started_epoch_ms(),
        emails,
        &[],
    )
    .await;
    match found {
        Err(e) => crate::report::CrossCheck {
            verdict: Verdict::Incomplete,
            reason: format!("the generic verifier could not read the run: {e}"),
            anomalies: vec![],
        },
        Ok(found) => {
            let mut anomalies = found.anomalies;
            verdict::allow(&mut anomalies, &sc.allowed_anomalies);
            let chaos = verdict::chaos_checks(&ctx.faults.summary());
            let (v, reason) = verdict::verdict(sc.exactly_once, &found.invariants, &anomalies, &chaos);
            crate::report::CrossCheck {
                verdict: v,
                reason,
                anomalies: anomalies.iter().map(|a| format!("{} × {}", a.count, a.name)).collect(),
            }
        }
    }
}
