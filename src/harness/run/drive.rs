//! Driving a run: its components started, the workload, the drain, the
//! stop, and the counters sampled for the chart.

use crate::context::{settled, Ctx, Stats};
use crate::error::{Error, Result};
use crate::faults::FaultPoint;
use crate::nemesis::process::program::{Database, Programs};
use crate::nemesis::proxy::Lanes;
use crate::pipeline::{notifier, relay, workload};
use crate::report::progress::{Phase, Progress};
use crate::report::{self, Sample};
use crate::scenario::Components;
use crate::store::{CommitGate, Store};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tracing::{info, warn};

/// How often the drain condition is polled.
const DRAIN_POLL: Duration = Duration::from_millis(250);

/// Relays, notifiers (the reference one, or the program under test as
/// processes) and the retention purger, each a named task; and the
/// context the workload runs with. A component behind the fault proxy
/// talks to the database through its slot.
pub(super) async fn start_components(
    ctx: &Ctx,
    database_url: Option<&str>,
    reports_dir: &Path,
    lanes: Option<&Lanes>,
) -> Result<(Option<Programs>, Vec<crate::context::Named>, Ctx)> {
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
        c.store = c.store.gated(CommitGate::new(c.faults.clone(), &name));
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

/// How the workload and the drain went.
#[derive(Debug, Default)]
pub(super) struct Ran {
    /// Why the run cannot be judged in full, if it cannot.
    pub incomplete: Option<String>,
    pub interrupted: bool,
    pub workload_ms: u64,
    pub drain_ms: u64,
}

/// The workload (after the group wait, until it writes no payment for
/// [`WORKLOAD_STALL`]),
/// then the drain; either may be cut short by a signal, or by a program
/// under test that failed. After a signal, a second one exits at once.
pub(super) async fn drive(
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
    let deadline = tokio::time::Instant::now() + limit;
    let started = Instant::now();
    let mut assigned = ctx.coord.watch_assigned();
    loop {
        let ready = settled(&assigned.borrow_and_update(), instances, partitions);
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

/// How many drain timeouts a drain that keeps making progress may take in
/// all: a slow machine drains slower, not never, but a drain must end.
pub(super) const DRAIN_CAP: u32 = 4;

/// The drain's clock: its timeout counts from the last progress (a new low
/// of the work left, unpublished rows plus lag), up to [`DRAIN_CAP`] times
/// the timeout in all. So a busy machine makes a run slower, not red, and
/// a pipeline that stopped moving still fails after one timeout.
pub(super) struct DrainClock {
    // Tokio's clock: the same as the system's in a run, and one a test can
    // move on.
    started: tokio::time::Instant,
    progress: tokio::time::Instant,
    least: i64,
    limit: Duration,
}

impl DrainClock {
    pub(super) fn new(limit: Duration) -> Self {
        let now = tokio::time::Instant::now();
        Self { started: now, progress: now, least: i64::MAX, limit }
    }

    /// Notes the work left now.
    pub(super) fn left(&mut self, work: i64) {
        if work < self.least {
            self.least = work;
            self.progress = tokio::time::Instant::now();
        }
    }

    pub(super) fn running(&self) -> bool {
        self.progress.elapsed() < self.limit && self.started.elapsed() < self.limit * DRAIN_CAP
    }

    /// How the drain ran out, for its error.
    pub(super) fn why(&self) -> String {
        let secs = self.limit.as_secs();
        match self.started.elapsed() >= self.limit * DRAIN_CAP {
            true => format!(
                "within {}s ({DRAIN_CAP} × {secs}s), though it was still making progress",
                secs * DRAIN_CAP as u64
            ),
            false => format!("within {secs}s of its last progress"),
        }
    }
}

/// What a drain asks the system under test on each turn: how much of its
/// outbox is not yet on the topic, and whether a consumer is still busy
/// outside the group's view (a zombie that woke from a stall).
pub(super) struct Left {
    pub unpublished: i64,
    pub busy: bool,
}

/// A drain that ran out: why, and the outbox events left at its last reading.
pub(super) struct Undrained {
    pub why: String,
    pub unpublished: i64,
}

/// Waits until the system under test has nothing left (`left`: nothing
/// unpublished, nothing busy) and its consumer group's lag is zero, twice
/// in a row. Gives up after the scenario's drain timeout without progress
/// ([`DrainClock`]). One drain for every system: only `left` and the words
/// of its error (`system`, `unpublished_what`) are the system's own.
pub(super) async fn drain_until_done<F, Fut>(
    ctx: &Ctx,
    system: &str,
    unpublished_what: &str,
    mut left: F,
) -> std::result::Result<(), Undrained>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Left>>,
{
    let mut clock = DrainClock::new(ctx.scenario.drain_timeout);
    let mut quiet = 0;
    let mut last = (0i64, 0i64);
    while clock.running() {
        let now = left().await;
        let lag = ctx.broker.group_lag(&ctx.names.group, &ctx.names.topic, ctx.scenario.partitions).await;
        match (now, lag) {
            (Ok(Left { unpublished: 0, busy: false }), Ok(0)) => {
                quiet += 1;
                if quiet >= 2 {
                    return Ok(());
                }
            }
            (Ok(Left { unpublished: u, .. }), Ok(l)) => {
                quiet = 0;
                last = (u, l);
                clock.left(u + l);
            }
            (u, l) => {
                quiet = 0;
                warn!(unpublished = ?u.err(), lag = ?l.err(), "drain probe failed");
            }
        }
        tokio::time::sleep(DRAIN_POLL).await;
    }
    Err(Undrained {
        why: format!(
            "{system} did not drain {} ({} {unpublished_what}, consumer group lag {}){}",
            clock.why(),
            last.0,
            last.1,
            kill_storm(ctx, last.1)
        ),
        unpublished: last.0,
    })
}

/// The reference pipeline's drain: its outbox rows unpublished, its
/// notifiers' zombies.
async fn drain(ctx: &Ctx) -> std::result::Result<(), String> {
    let left = || async { Ok(Left { unpublished: ctx.store.unpublished().await?, busy: ctx.coord.zombies() > 0 }) };
    drain_until_done(ctx, "the pipeline", "outbox rows unpublished", left).await.map_err(|u| u.why)
}

/// When a run could not drain with its consumers' lag above zero while
/// the nemesis kept killing them: how often, and the likely fix. A client
/// without static membership rejoins its group after every kill, and the
/// group rebalances; killed faster than it can rejoin, it never catches up.
pub(super) fn kill_storm(ctx: &Ctx, lag: i64) -> String {
    let (killed, started) = (Stats::get(&ctx.stats.processes_killed), Stats::get(&ctx.stats.processes_started));
    if lag <= 0 || killed == 0 {
        return String::new();
    }
    let secs = ctx.stats.origin.elapsed().as_secs_f64().max(1.0);
    format!(
        "; {killed} processes killed and {started} started in {secs:.0} s ({:.1} kills a second): a consumer killed faster than it rejoins its group never catches up. Give it static membership (group.instance.id = CHAOS_INSTANCE) and CHAOS_SESSION_TIMEOUT_MS, or lower the kill rates",
        killed as f64 / secs
    )
}

/// Samples the counters the progress line shows, for the report's chart,
/// until told to stop (then once more). Past [`report::SERIES_MAX`]
/// samples it keeps every other one and samples half as often.
pub(super) fn sample(stats: Arc<Stats>) -> (tokio::task::JoinHandle<Vec<Sample>>, tokio::sync::oneshot::Sender<()>) {
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

/// How long the components get to stop once told to: a component stuck on
/// a dead service is abandoned (aborted, and it dies with the process),
/// never waited on forever.
const STOP_DEADLINE: Duration = Duration::from_secs(15);

/// What the stop saw: components that panicked, and ones still running at
/// the deadline.
#[derive(Debug, Default)]
pub(super) struct Stopped {
    pub panicked: Vec<String>,
    pub stuck: Vec<String>,
}

impl Stopped {
    /// Why the run is incomplete, if it is.
    pub fn why(&self) -> Option<String> {
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
pub(super) async fn stop(components: Vec<(String, tokio::task::JoinHandle<()>)>) -> Stopped {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A slow machine makes a drain slower, not failed: each new low of the
    /// work left restarts the timeout; a drain that stops moving fails one
    /// timeout later, and one that keeps moving fails at the cap.
    #[tokio::test(start_paused = true)]
    async fn a_drain_times_out_from_its_last_progress_up_to_its_cap() {
        let limit = Duration::from_secs(10);
        let mut slow = DrainClock::new(limit);
        for left in (0..25).rev() {
            tokio::time::advance(Duration::from_secs(1)).await;
            slow.left(100 + left);
            assert!(slow.running(), "still moving after {} s", 25 - left);
        }
        tokio::time::advance(Duration::from_secs(10)).await;
        assert!(!slow.running(), "ten seconds without a new low");
        assert!(slow.why().contains("within 10s of its last progress"), "{}", slow.why());
        let mut endless = DrainClock::new(limit);
        for left in (0..100).rev() {
            tokio::time::advance(Duration::from_secs(1)).await;
            endless.left(left);
        }
        assert!(!endless.running(), "at most {DRAIN_CAP} timeouts in all");
        assert!(endless.why().contains("though it was still making progress"), "{}", endless.why());
        // Lag that only goes up and down around a floor is no progress.
        let mut storm = DrainClock::new(limit);
        storm.left(40);
        for i in 0..11 {
            tokio::time::advance(Duration::from_secs(1)).await;
            storm.left(40 + (i % 3) * 20);
        }
        assert!(!storm.running());
    }

    #[tokio::test]
    async fn a_drain_lost_to_a_kill_storm_says_so_and_names_the_fix() {
        let h = crate::pipeline::testing::harness("name = \"unit\"\n").await;
        assert_eq!(kill_storm(&h.ctx, 228), "", "no kills, no storm");
        Stats::add(&h.ctx.stats.processes_killed, 89);
        Stats::add(&h.ctx.stats.processes_started, 93);
        let said = kill_storm(&h.ctx, 228);
        assert!(said.contains("89 processes killed and 93 started"), "{said}");
        assert!(said.contains("static membership (group.instance.id = CHAOS_INSTANCE)"), "{said}");
        assert_eq!(kill_storm(&h.ctx, 0), "", "drained consumers: the relay's problem, not a storm");
    }

    /// One drain for every system: it ends when the system says nothing is
    /// left twice in a row, and not while a consumer is busy or a probe
    /// fails, however long the outbox has been empty.
    #[tokio::test]
    async fn the_drain_asks_the_system_and_waits_for_its_word() {
        let h = crate::pipeline::testing::harness("name = \"unit\"\n[run]\ndrain_timeout_secs = 1\n").await;
        let turns = std::sync::atomic::AtomicI64::new(3);
        let counting_down = || async {
            let n = turns.fetch_sub(1, std::sync::atomic::Ordering::SeqCst).max(0);
            Ok(Left { unpublished: n, busy: false })
        };
        let done = drain_until_done(&h.ctx, "the system", "rows", counting_down).await;
        assert!(done.is_ok(), "{:?}", done.err().map(|u| u.why));
        assert!(turns.load(std::sync::atomic::Ordering::SeqCst) <= -1, "it read the system's word twice at zero");
        let busy = || async { Ok(Left { unpublished: 0, busy: true }) };
        let held =
            drain_until_done(&h.ctx, "the system", "rows", busy).await.expect_err("a busy consumer holds the drain");
        assert!(held.why.starts_with("the system did not drain within 1s"), "{}", held.why);
        assert_eq!(held.unpublished, 0);
        let failing = || async { Err(crate::Error::Internal("planted".into())) };
        let unread =
            drain_until_done(&h.ctx, "the system", "rows", failing).await.expect_err("an unread system never drains");
        assert!(unread.why.contains("(0 rows, consumer group lag 0)"), "{}", unread.why);
    }

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

    /// The workload's bound is on progress: a slow workload that keeps
    /// writing is never cut, one that stops is, 120 s after its last write.
    #[tokio::test(start_paused = true)]
    async fn a_workload_is_cut_only_when_it_stops_writing() {
        let stats = Arc::new(Stats::default());
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
