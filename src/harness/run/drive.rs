//! What every run's drive shares: how it went, the drain's clock and
//! loop, and the stop.

use crate::context::{Ctx, Stats};
use crate::error::Result;
use crate::verifier::Verdict;
use std::sync::Arc;
use std::time::Duration;
use tracing::warn;

/// How often the drain condition is polled.
const DRAIN_POLL: Duration = Duration::from_millis(250);

/// How the workload and the drain went.
#[derive(Debug, Default)]
pub(super) struct Ran {
    /// Why the run cannot be judged in full, if it cannot.
    pub incomplete: Option<String>,
    pub interrupted: bool,
    pub workload_ms: u64,
    pub drain_ms: u64,
    /// A declared system's settle after the drain, when it ran.
    pub settle: Option<Settle>,
}

/// How long a declared system took to settle after the drain, and how
/// much pending work it had when the settle began.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Settle {
    pub ms: u64,
    /// Rows of `[system] pending`; None when the system declares none.
    pub pending: Option<u64>,
}

impl Ran {
    /// What the checkers found, when the run can be judged on it; else the
    /// verdict and reason of a run that cannot: interrupted, with something
    /// that may still write, never verified, or its ground truth unread.
    pub fn judgeable<T>(
        &self,
        still_running: bool,
        verified: Option<Result<T>>,
    ) -> std::result::Result<T, (Verdict, String)> {
        let incomplete = self.incomplete.clone().unwrap_or_default();
        match verified {
            _ if self.interrupted => Err((
                Verdict::Interrupted,
                "interrupted by a signal before the run was verified; nothing was verified".into(),
            )),
            _ if still_running => Err((
                Verdict::Incomplete,
                format!("{incomplete}; nothing was verified, since something may still write"),
            )),
            None => Err((Verdict::Incomplete, format!("{incomplete}; nothing was verified"))),
            Some(Err(e)) => Err((
                Verdict::Incomplete,
                match &self.incomplete {
                    Some(r) => format!("{r}; verification failed too: {e}"),
                    None => format!("verification could not read the ground truth: {e}"),
                },
            )),
            Some(Ok(found)) => Ok(found),
        }
    }
}

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

    /// The work cannot move now for a reason the run made (the nemesis
    /// holds a process stopped): the wait for progress starts again. The
    /// cap on the whole drain still holds.
    pub(super) fn held(&mut self) {
        self.progress = tokio::time::Instant::now();
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

/// A drain that ran out: why, and the outbox events left and the
/// consumer group's lag at its last reading.
pub(super) struct Undrained {
    pub why: String,
    pub unpublished: i64,
    pub lag: i64,
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
        let lag = ctx.broker.backlog(&ctx.names.group, &ctx.topic()).await;
        match (now, lag) {
            (Ok(Left { unpublished: 0, busy: false }), Ok(0)) => {
                quiet += 1;
                if quiet >= 2 {
                    return Ok(());
                }
            }
            (Ok(Left { unpublished: u, busy }), Ok(l)) => {
                quiet = 0;
                last = (u, l);
                clock.left(u + l);
                if busy {
                    clock.held();
                }
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
        lag: last.1,
    })
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

/// `[nemesis] calm_after`: from then on no process is killed or paused to
/// the end of the run, so that a bug a restart heals (an in-memory cursor,
/// an in-memory dedup set) still shows in the stretch after the last kill,
/// and the backlog drains without restarts. The calm begins once that
/// share of the `total` payments (or a declared system's operations) is
/// written, the consumers' backlog (the group's lag) is no more than the
/// messages of the payments still to come ([`Rest`]), and every point set
/// to strike a process has struck once (confirmed): a window the kill
/// stretch never reached would leave the run INCONCLUSIVE.
///
/// The backlog counts because the faults are meant for the consumers' work,
/// not the writer's: on a loaded machine a consumer fell behind, applied
/// three quarters of its payments after the calm began, and the recommended
/// consumer scenario struck a broken one 5 times where it struck it 14
/// times on a quiet machine, and missed it. A consumer that never catches
/// up under the kills still gets its calm, once the kill stretch has lasted
/// half as long again as it took to write the share: a run is never left
/// to the kills until its drain times out.
///
/// Runs as its own task ([`CalmTask`]), so that the kills go on through
/// the drain while the consumers catch up.
pub(super) fn calm_after(ctx: &Ctx, stats: Arc<Stats>, total: u64) -> Option<CalmTask> {
    let share = ctx.scenario.calm_after?;
    let ctx = ctx.clone();
    let task = tokio::spawn(async move {
        let started = tokio::time::Instant::now();
        let at = ((total as f64) * share).ceil() as u64;
        while Stats::get(&stats.payments_written) < at {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let written = tokio::time::Instant::now();
        let deadline = written + started.elapsed() / 2;
        loop {
            // A lag that cannot be read is no reason to keep killing.
            let lag = ctx.broker.backlog(&ctx.names.group, &ctx.topic()).await.unwrap_or(0);
            let held = ctx.broker.held(&ctx.topic()).unwrap_or(0);
            let rest = Rest { payments: total - at, written: Stats::get(&stats.payments_written), held };
            let caught_up = rest.holds(lag);
            // Every window the file sets is struck once before the calm: a
            // run whose faults never fired proves nothing.
            let mut unstruck: Vec<&str> = ctx.faults.unstruck().iter().map(|p| p.name()).collect();
            // A writer's held COMMIT opens its window (rows committed out of
            // insert order) only once another writer's commit overtakes it:
            // a hold confirmed with none reordered nothing. One run in ten of
            // a relay that marks a range passed so, its service's holds never
            // overtaken before the calm.
            let holds = ctx.faults.rate_for(crate::faults::FaultPoint::DbHoldCommit, "service") > 0.0;
            if holds && Stats::get(&stats.writer_holds_overtaken) == 0 {
                unstruck.push("db.hold_commit (a writer's, overtaken)");
            }
            if (caught_up && unstruck.is_empty()) || tokio::time::Instant::now() >= deadline {
                // Whether the consumers caught up or the wait ran out.
                let waited_ms = written.elapsed().as_millis() as u64;
                tracing::info!(lag, caught_up, ?unstruck, waited_ms, "the calm's share is written");
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        ctx.faults.calm_down();
    });
    Some(CalmTask(task))
}

/// The work the calm stretch was meant to hold: the payments still to come
/// after the calm share, in the messages they will bring at the rate so
/// far (`held` messages on the topic for `written` payments).
struct Rest {
    payments: u64,
    written: u64,
    held: i64,
}

impl Rest {
    /// Whether the consumers' backlog (`lag`, in messages) is within it.
    fn holds(&self, lag: i64) -> bool {
        let per_payment = self.held as f64 / self.written.max(1) as f64;
        lag as f64 <= self.payments as f64 * per_payment
    }
}

/// The task that begins the calm stretch; it ends with the run's drain.
pub(super) struct CalmTask(tokio::task::JoinHandle<()>);

impl Drop for CalmTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The calm waits for the consumers while their backlog is more than
    /// the payments still to come, up to half as long again as the share
    /// took to write; a backlog within the rest lets it begin at once.
    #[tokio::test]
    async fn the_calm_waits_for_a_consumer_behind_by_more_than_the_rest() {
        use crate::domain::events::Envelope;
        let h = crate::pipeline::testing::harness("[workload]\npayments = 10\n[nemesis]\ncalm_after = 0.8\n").await;
        let ctx = &h.ctx;
        // The clock stops once SQLite is open (its pool's timeouts would
        // fire at once on a stopped clock).
        tokio::time::pause();
        // Six messages on the topic and no consumer: a lag of 6, over the
        // messages the 2 payments still to come once 8 are written bring
        // at the rate so far (6 for 8, so 1.5).
        let ids: Vec<uuid::Uuid> = (0..6).map(|_| uuid::Uuid::new_v4()).collect();
        let batch: Vec<Envelope> = ids.iter().map(|i| Envelope::new(*i, *i, "payment.captured", b"{}")).collect();
        ctx.broker.producer().unwrap().publish(&ctx.names.topic, &batch, true).await.unwrap();
        let _calm = calm_after(ctx, ctx.stats.clone(), 10).expect("calm_after is set");
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert!(!ctx.faults.is_calm(), "none written");
        ctx.stats.payments_written.store(8, std::sync::atomic::Ordering::Relaxed);
        tokio::time::sleep(Duration::from_secs(4)).await;
        assert!(!ctx.faults.is_calm(), "the share is written but the consumers are 6 messages behind");
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(ctx.faults.is_calm(), "the kill stretch has lasted half as long again as the share took");

        tokio::time::resume();
        let h = crate::pipeline::testing::harness("[workload]\npayments = 10\n[nemesis]\ncalm_after = 0.8\n").await;
        let ctx = &h.ctx;
        let publish = |n: usize| async move {
            let ids: Vec<uuid::Uuid> = (0..n).map(|_| uuid::Uuid::new_v4()).collect();
            let batch: Vec<Envelope> = ids.iter().map(|i| Envelope::new(*i, *i, "payment.captured", b"{}")).collect();
            ctx.broker.producer().unwrap().publish(&ctx.names.topic, &batch, true).await.unwrap();
        };
        // The group takes the first six and commits them; one more comes:
        // a lag of 1, within the 2 payments' 1.75 messages.
        publish(6).await;
        let spec = crate::broker::ConsumerSpec {
            group: ctx.names.group.clone(),
            topic: ctx.names.topic.clone(),
            member: "m".into(),
            session: Duration::from_secs(10),
            on_assign: Arc::new(|_| {}),
        };
        let consumer = ctx.broker.consumer(spec).unwrap();
        consumer.join().unwrap();
        let mut next = std::collections::BTreeMap::new();
        consumer
            .poll_batch(100, Duration::from_millis(50), Duration::ZERO, &mut |d| {
                next.insert(d.position.lane(), d.position.next());
            })
            .await;
        consumer.commit(&next.into_values().collect::<Vec<_>>(), true).unwrap();
        publish(1).await;
        tokio::time::pause();
        let _calm = calm_after(ctx, ctx.stats.clone(), 10).expect("calm_after is set");
        tokio::time::sleep(Duration::from_secs(10)).await;
        ctx.stats.payments_written.store(8, std::sync::atomic::Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(ctx.faults.is_calm(), "a backlog within the rest: the calm begins once the share is written");
    }

    /// With the service's COMMITs held, the calm waits for one that another
    /// writer's commit overtook: a hold none overtook reordered nothing.
    #[tokio::test]
    async fn the_calm_waits_for_a_writers_hold_that_was_overtaken() {
        let file = "[workload]\npayments = 10\n[run]\ncomponents = \"process\"\n[nemesis]\ncalm_after = 0.8\n[faults]\ndb_hold_commit = 0.05\n\
                    [faults.service]\ndb_hold_commit = 0.15\n";
        let h = crate::pipeline::testing::harness(file).await;
        let ctx = &h.ctx;
        assert!(
            ctx.faults.rate_for(crate::faults::FaultPoint::DbHoldCommit, "service-1") > 0.0,
            "the service's own rate"
        );
        tokio::time::pause();
        let _calm = calm_after(ctx, ctx.stats.clone(), 10).expect("calm_after is set");
        tokio::time::sleep(Duration::from_secs(10)).await;
        ctx.stats.payments_written.store(8, std::sync::atomic::Ordering::Relaxed);
        tokio::time::sleep(Duration::from_secs(1)).await;
        // Confirmed, as a consumer's hold or a writer's none overtook is.
        ctx.faults.confirm(crate::faults::FaultPoint::DbHoldCommit, 1);
        ctx.stats.writer_hold(0);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!ctx.faults.is_calm(), "caught up, but the one writer's hold was overtaken by none");
        ctx.stats.writer_hold(2);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(ctx.faults.is_calm(), "a hold two commits overtook: the calm begins");
    }

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
        // A process the nemesis holds stopped is no stall, up to the cap.
        let mut held = DrainClock::new(limit);
        held.left(7);
        for _ in 0..20 {
            tokio::time::advance(Duration::from_secs(1)).await;
            held.left(7);
            held.held();
        }
        assert!(held.running(), "twenty seconds held, none of them a stall");
        tokio::time::advance(Duration::from_secs(10)).await;
        held.left(7);
        assert!(!held.running(), "held no more, ten seconds without a new low");
        assert!(held.why().contains("of its last progress"), "{}", held.why());
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
        // Held up by the nemesis, the wait for progress starts again: only
        // the cap on the whole drain ends it.
        assert!(held.why.starts_with("the system did not drain within 4s (4 × 1s)"), "{}", held.why);
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
}
