//! The notifier: M instances in one consumer group, offsets committed by hand.
//!
//! Per micro-batch: ONE database transaction claims the inbox rows and applies
//! the effects of what it newly claimed (see [`crate::pipeline::inbox::apply_batch`]);
//! only then are the offsets committed.
//!
//! Fault point `notifier.before_offset_commit`: after the transaction committed
//! and before the offsets are committed, the notifier may crash. It then
//! restarts and the group redelivers the batch; the inbox must absorb it.
//! Restarts are a new member of the group (on Kafka, with static
//! membership, it takes its predecessor's place without waiting out a
//! session timeout). Its consumer is made ahead, while the current one
//! works (`Spare`), as a supervisor keeps a replacement process warm.

use crate::broker::{Consumer, ConsumerSpec, Delivery, Position, Replace};
use crate::context::{Ctx, Stats};
use crate::domain::events;
use crate::error::Result;
use crate::faults::{FaultPoint, Held, Reach};
use crate::pipeline::supervise::{self, Counters, Ending};
use crate::scenario::InboxMode;
use crate::store::{BatchFaults, BatchOutcome, Incoming, Modes};
use std::collections::BTreeMap;
use std::time::Duration;
use tracing::{debug, info, warn};

/// Attempts of one batch while the email provider fails it, before the
/// incarnation gives up and restarts.
const EMAIL_ATTEMPTS: u32 = 8;
/// How long the first message of a batch is waited for before re-checking shutdown.
const FIRST_WAIT: Duration = Duration::from_millis(200);
/// How long each further message may take to arrive before the batch closes.
const GATHER_WAIT: Duration = Duration::from_millis(3);

/// How long `notifier.stall` freezes a zombie: long enough for its
/// replacement to rejoin the group and process the same batch.
pub fn stall_duration(ctx: &Ctx) -> Duration {
    2 * ctx.broker.session_timeout(ctx.scenario.notifier.session_timeout) + Duration::from_secs(2)
}

type NotifierConsumer = Box<dyn Consumer>;

/// Who notifier `index` is to the broker.
fn spec(ctx: &Ctx, name: &str, index: usize) -> ConsumerSpec {
    let coord = ctx.coord.clone();
    ConsumerSpec {
        group: ctx.names.group.clone(),
        topic: ctx.names.topic.clone(),
        member: name.to_string(),
        session: ctx.broker.session_timeout(ctx.scenario.notifier.session_timeout),
        on_assign: std::sync::Arc::new(move |held| coord.set_assigned(index, held)),
    }
}

/// A consumer created and in the group: a notifier incarnation's.
fn consumer(ctx: &Ctx, name: &str, index: usize) -> Result<NotifierConsumer> {
    let c = ctx.broker.consumer(spec(ctx, name, index))?;
    c.join()?;
    Ok(c)
}

/// The next incarnation's consumer, made while the current one works, as a
/// supervisor keeps a replacement process warm: it is connected and ready
/// ([`Consumer::warm`]), but holds no membership until it joins.
struct Spare(Option<tokio::task::JoinHandle<Option<NotifierConsumer>>>);

impl Spare {
    /// Starts making the next incarnation's consumer, off the async threads
    /// (creating a client and reading metadata block).
    fn prepare(ctx: &Ctx, name: &str, index: usize) -> Self {
        let (broker, spec) = (ctx.broker.clone(), spec(ctx, name, index));
        Spare(Some(tokio::task::spawn_blocking(move || {
            let c = broker.consumer(spec).ok()?;
            c.warm();
            Some(c)
        })))
    }

    /// The prepared consumer, subscribed; None when there is none.
    async fn take(&mut self) -> Option<Result<NotifierConsumer>> {
        let c = self.0.take()?.await.ok()??;
        Some(c.join().map(|_| c))
    }
}

/// Decodes a received message into what the batch transaction needs. The
/// raw header and payload are copied only for a message that does not
/// decode: they are what its dead-letter row records.
pub fn incoming(m: &Delivery<'_>) -> Incoming {
    let decoded =
        events::decode(m.event_id, m.event_type, m.payload).map(|d| events::Decoded { lane: m.position.lane(), ..d });
    let (raw_event_id, raw_payload) = match decoded {
        Ok(_) => (None, String::new()),
        Err(_) => (
            m.event_id.map(|v| String::from_utf8_lossy(v).into_owned()),
            m.payload.map(|p| String::from_utf8_lossy(p).into_owned()).unwrap_or_default(),
        ),
    };
    Incoming { position: m.position, decoded, raw_event_id, raw_payload }
}

/// Runs notifier number `index` until shutdown: the supervisor. Every crash
/// and restart goes through here: the incarnation's consumer is dropped
/// without committing anything (the group sees a member go), the supervisor
/// pauses, and a new incarnation starts with a new consumer (made ahead by
/// [`Spare`]).
pub async fn run(ctx: Ctx, index: usize) {
    let name = format!("notifier-{index}");
    let cfg = ctx.scenario.notifier.clone();
    let mut shutdown = ctx.shutdown.clone();
    let mut spare = Spare(None);
    loop {
        if shutdown.is_set() {
            return;
        }
        let prepared = tokio::select! {
            _ = shutdown.wait() => return,
            c = spare.take() => c,
        };
        let next = prepared.unwrap_or_else(|| consumer(&ctx, &name, index));
        // A component process lives one incarnation: its replacement is a
        // new process.
        if !ctx.faults.linked() {
            spare = Spare::prepare(&ctx, &name, index);
        }
        let ending = match next {
            Ok(consumer) => {
                let mut inc = Incarnation { ctx: &ctx, name: &name, consumer };
                inc.run(&mut shutdown).await
            }
            Err(e) => Ending::Error { what: "starting a consumer", cause: e.to_string() },
        };
        let counters = Counters { crashes: &ctx.stats.notifier_crashes, errors: &ctx.stats.notifier_errors };
        if !supervise::after(ending, &name, counters, cfg.restart_delay, &mut shutdown).await {
            return;
        }
    }
}

/// One life of a notifier: its consumer in the group. A pass reads top to
/// bottom as consume a micro-batch → one transaction (inbox claim and
/// effects) → commit the offsets, with the fault points between.
struct Incarnation<'a> {
    ctx: &'a Ctx,
    name: &'a str,
    consumer: NotifierConsumer,
}

/// What one pass of an incarnation did.
enum Step {
    Continue,
    End(Ending),
}

impl Incarnation<'_> {
    async fn run(&mut self, shutdown: &mut crate::context::Shutdown) -> Ending {
        loop {
            match self.step(shutdown).await {
                Step::Continue => {}
                Step::End(e) => return e,
            }
        }
    }

    /// consume → `notifier.mid_batch` / `notifier.stall` → one transaction →
    /// `notifier.before_offset_commit` → commit offsets → `notifier.replay`.
    async fn step(&mut self, shutdown: &mut crate::context::Shutdown) -> Step {
        let (ctx, name) = (self.ctx, self.name);
        let cfg = &ctx.scenario.notifier;
        let batch = match self.gather(shutdown).await {
            Ok(Some(b)) => b,
            Ok(None) => return Step::Continue,
            Err(ending) => return Step::End(ending),
        };
        // What was delivered confirms the faults awaiting a redelivery,
        // before this batch's own faults start awaiting theirs.
        let at = batch[0].position;
        let held = ctx.faults.delivered(at, batch.iter().map(|m| m.position));
        ctx.faults.log_delivery(name, batch.iter().map(|m| m.position));
        let hit = || format!("batch of {} events, {}", batch.len(), at.named());
        // The batch's topic positions, logged with a firing: what ties an
        // anomaly's message to the crash that redelivered it.
        let reach = || Reach::topic(batch.iter().map(|m| m.position));
        let faults = BatchFaults {
            crash_mid_batch: ctx.faults.strike_reaching(FaultPoint::NotifierMidBatch, name, hit, reach),
            stall: ctx.faults.strike_reaching(FaultPoint::NotifierStall, name, hit, reach).then(|| stall_duration(ctx)),
        };
        let next = next_positions(&batch);
        if cfg.inbox == InboxMode::CommitOffsetFirst {
            // The mistake: acknowledge first, process after.
            let _ = self.consumer.commit(&next, true);
        }
        let modes = Modes { inbox: cfg.inbox, projection: cfg.projection, email: cfg.email };
        if let Some(stall) = faults.stall {
            if !ctx.faults.linked() {
                self.zombie(batch, modes, faults, stall, held);
                return Step::End(Ending::Crash { confirmed_by_restart: None });
            }
            // In a component process the zombie is this process itself: the
            // harness stops it inside the batch and resumes it after the
            // stall (see `inbox::stall`), and it carries on, late.
        }
        let outcome = match self.apply(&batch, modes, faults).await {
            Ok(o) => o,
            // Nothing was committed; the batch comes back after the restart.
            Err(e) => {
                ctx.faults.settled(held);
                return Step::End(Ending::Error { what: "a batch transaction", cause: e.to_string() });
            }
        };
        if self.crashes_after(&batch, &outcome, held).await {
            if self.consumer.crash_in_place() {
                Stats::add(&ctx.stats.notifier_crashes, 1);
                return Step::Continue;
            }
            return Step::End(Ending::Crash { confirmed_by_restart: None });
        }
        self.send_after_commit(&outcome.emails_after_commit).await;
        if cfg.inbox != InboxMode::CommitOffsetFirst {
            self.commit(&next);
        }
        ctx.faults.settled(held);
        if ctx.faults.strike_reaching(FaultPoint::NotifierReplay, name, hit, reach) {
            self.replay(&batch, at);
        }
        Step::Continue
    }

    /// The batch's transaction, tried again in place while the email
    /// provider fails it: each attempt rolled back, the next carrying the
    /// same idempotency keys. A restart would cost a rejoin of the group
    /// for what is the provider's hiccup, not the notifier's.
    async fn apply(&self, batch: &[Incoming], modes: Modes, faults: BatchFaults) -> crate::error::Result<BatchOutcome> {
        let ctx = self.ctx;
        let mut wait = Duration::from_millis(20);
        let mut attempt = 1;
        loop {
            let email = ctx.email.as_deref();
            let outcome =
                crate::pipeline::inbox::apply_batch(&ctx.store, batch, modes, faults, &ctx.faults, email, self.name)
                    .await;
            match outcome {
                Err(crate::Error::Provider(why)) if attempt < EMAIL_ATTEMPTS => {
                    debug!(notifier = %self.name, cause = %why, "the email provider failed the batch; trying again");
                    Stats::add(&ctx.stats.notifier_errors, 1);
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_millis(500));
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    /// The mistake `notifier.email = "after-commit"`: the batch's emails,
    /// once its transaction committed and it survived the crash points,
    /// their outcome ignored. A crash before this line, or a failed call,
    /// loses them: the redelivery finds the receipts claimed.
    async fn send_after_commit(&self, emails: &[(Option<String>, crate::domain::events::ReceiptEmail)]) {
        let Some(client) = self.ctx.email.as_deref() else { return };
        for (key, body) in emails {
            if let Err(e) = client.send(key.as_deref(), body).await {
                debug!(notifier = %self.name, cause = %e, "a receipt email failed; fire-and-forget goes on");
            }
        }
    }

    /// Commits a batch's offsets. Asynchronous, as consumers commit in
    /// their loop: the batch's effects are already committed with its inbox
    /// rows, so an offset commit lost to a crash only means a redelivery the
    /// inbox absorbs.
    fn commit(&self, next: &[Position]) {
        if let Err(e) = self.consumer.commit(next, false) {
            // Usually a rebalance took the partition away; its new owner
            // gets the batch again and the inbox absorbs it.
            debug!(notifier = %self.name, cause = %e, "offset commit failed");
        }
    }

    /// A micro-batch: the first message waited for (re-checking shutdown
    /// every [`FIRST_WAIT`]), then whatever follows within [`GATHER_WAIT`].
    /// `Ok(None)`: nothing this time.
    async fn gather(&mut self, shutdown: &mut crate::context::Shutdown) -> Result<Option<Vec<Incoming>>, Ending> {
        let ctx = self.ctx;
        let mut batch = Vec::new();
        let mut each = |m: Delivery<'_>| batch.push(incoming(&m));
        let polled = self.consumer.poll_batch(ctx.scenario.notifier.batch_size, FIRST_WAIT, GATHER_WAIT, &mut each);
        let n = tokio::select! {
            _ = shutdown.wait() => return Err(Ending::Shutdown),
            n = polled => n,
        };
        if n > 0 {
            return Ok(Some(batch));
        }
        // A consumer that hit a fatal error polls nothing forever (seen
        // after the broker was killed and restarted: the notifiers' group
        // stopped consuming for the rest of the run), and one the broker
        // never let in may never get in: replace it.
        match self.consumer.replace() {
            Some(Replace::Failed(why)) => {
                warn!(notifier = %self.name, cause = %why, "the consumer failed for good; replacing it");
                Err(Ending::Error { what: "the consumer", cause: why })
            }
            Some(Replace::Unjoined) => {
                info!(notifier = %self.name, "no assignment from the broker; joining again");
                Err(Ending::Again)
            }
            None => Ok(None),
        }
    }

    /// The crash faults after the batch transaction: `notifier.mid_batch`
    /// struck inside it, or `notifier.before_offset_commit` after it (its
    /// probability is per event, every event reaches it, and one hit is
    /// enough). Either awaits the batch's redelivery to be confirmed.
    async fn crashes_after(&self, batch: &[Incoming], outcome: &BatchOutcome, held: Held) -> bool {
        let ctx = self.ctx;
        if outcome.crashed {
            let point = match outcome.crashed_after_call {
                true => FaultPoint::NotifierAfterExternalCall,
                false => FaultPoint::NotifierMidBatch,
            };
            ctx.faults.await_redelivery(point, 1, held);
            return true;
        }
        ctx.stats.mark(&ctx.stats.first_apply_ms, &ctx.stats.last_apply_ms);
        Stats::add(&ctx.stats.events_applied, outcome.applied);
        Stats::add(&ctx.stats.duplicates_absorbed, outcome.duplicates);
        Stats::add(&ctx.stats.stale_ignored, outcome.stale);
        Stats::add(&ctx.stats.dead_lettered, outcome.dead_lettered);
        let mut fires = 0;
        for m in batch {
            // The whole batch comes back, not only the message struck.
            let reach = || Reach::topic(batch.iter().map(|m| m.position));
            fires += ctx.faults.strike_reaching(
                FaultPoint::NotifierBeforeOffsetCommit,
                self.name,
                || format!("batch of {} events, {}", batch.len(), m.position.named()),
                reach,
            ) as u64;
        }
        if fires > 0 {
            ctx.faults.await_redelivery(FaultPoint::NotifierBeforeOffsetCommit, fires, held);
            // In a component process: stop here, the offsets uncommitted,
            // for the harness's SIGKILL.
            ctx.faults.halt_for(FaultPoint::NotifierBeforeOffsetCommit, fires).await;
        }
        fires > 0
    }

    /// A zombie: this incarnation freezes while holding the batch (a GC
    /// pause, a stopped VM). The group replaces it and the batch is
    /// delivered again; when the zombie wakes it still applies what it held.
    /// It never commits offsets: it has been fenced.
    fn zombie(&self, batch: Vec<Incoming>, modes: Modes, faults: BatchFaults, stall: Duration, held: Held) {
        let ctx = self.ctx;
        let store = ctx.store.clone();
        let (stats, who, injector) = (ctx.stats.clone(), self.name.to_string(), ctx.faults.clone());
        let email = ctx.email.clone();
        if faults.crash_mid_batch {
            // The zombie never commits offsets: its batch comes back.
            ctx.faults.await_redelivery(FaultPoint::NotifierMidBatch, 1, held);
        } else {
            ctx.faults.settled(held);
        }
        // Counted until it ends, a panic included: the drain waits for it.
        let zombie = ctx.coord.zombie();
        ctx.tasks.spawn(format!("{} zombie", self.name), async move {
            let _zombie = zombie;
            let hold = BatchFaults { crash_mid_batch: faults.crash_mid_batch, stall: Some(stall) };
            match crate::pipeline::inbox::apply_batch(&store, &batch, modes, hold, &injector, email.as_deref(), &who)
                .await
            {
                Ok(o) => Stats::add(&stats.events_applied, o.applied),
                Err(e) => warn!(notifier = %who, cause = %e, "zombie batch failed"),
            }
            // Woken past its stall, it made its late attempt.
            injector.confirm(FaultPoint::NotifierStall, 1);
        });
    }

    /// A late replay, as an operator's offset reset makes one: the group's
    /// committed offsets go back to the start of this batch's partitions and
    /// reading resumes there. No restart: the replay is of the data, not of
    /// the process.
    fn replay(&self, batch: &[Incoming], at: Position) {
        self.ctx.faults.await_next_delivery(FaultPoint::NotifierReplay, at);
        let lanes: std::collections::BTreeSet<i32> = batch.iter().map(|m| m.position.lane()).collect();
        self.consumer.replay_from_start(&lanes.into_iter().collect::<Vec<_>>());
    }
}

/// The positions to commit after a batch: per lane, the one after the
/// furthest seen.
fn next_positions(batch: &[Incoming]) -> Vec<Position> {
    let mut next: BTreeMap<i32, Position> = BTreeMap::new();
    for m in batch {
        let e = next.entry(m.position.lane()).or_insert(m.position.next());
        *e = (*e).max(m.position.next());
    }
    next.into_values().collect()
}

#[cfg(test)]
mod tests {
    //! The notifier's crash semantics, on the in-memory broker and SQLite:
    //! the whole pipeline runs, and the verifier reconciles what it left.
    use crate::context::Stats;
    use crate::faults::FaultPoint;
    use crate::pipeline::testing::{anomalies, harness, Harness};
    use std::time::Duration;

    /// 300 payments through one relay and one notifier.
    async fn pipeline(notifier_and_faults: &str) -> Harness {
        let toml = format!(
            "name = \"unit\"\nseed = 5\n[workload]\npayments = 300\nproducers = 2\n[topic]\npartitions = 3\n{notifier_and_faults}"
        );
        let h = harness(&toml).await;
        let notifier = tokio::spawn(super::run(h.ctx.clone(), 1));
        let relay = tokio::spawn(crate::pipeline::relay::run(h.ctx.clone(), 1));
        crate::pipeline::workload::run(h.ctx.clone()).await.expect("the workload");
        let drained = h.drain(Duration::from_secs(30), true).await;
        h.stop(vec![notifier, relay]).await;
        assert!(drained, "the pipeline drains within 30 s");
        h
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_crash_before_the_offset_commit_is_redelivered_and_absorbed() {
        let h = pipeline("[notifier]\nbatch_size = 20\n[faults]\nnotifier_before_offset_commit = 0.01\n").await;
        assert!(h.ctx.faults.fired(FaultPoint::NotifierBeforeOffsetCommit) > 0, "the fault fired");
        assert!(Stats::get(&h.ctx.stats.notifier_crashes) > 0);
        assert!(Stats::get(&h.ctx.stats.duplicates_absorbed) > 0, "the batch came back to the inbox");
        let r = h.reconcile().await;
        let found: Vec<_> =
            r.anomalies.iter().filter(|a| a.count > 0).map(|a| (&a.name, a.count, &a.examples)).collect();
        let fresh = match &h.ctx.store {
            crate::store::Store::Sqlite(s) => {
                use sqlx::Connection;
                let mut c = sqlx::SqliteConnection::connect(&format!("sqlite://{}", s.endpoint)).await.unwrap();
                let n: i64 = sqlx::query_scalar("SELECT count(*) FROM inbox").fetch_one(&mut c).await.unwrap();
                let pooled: i64 =
                    sqlx::query_scalar("SELECT count(*) FROM inbox").fetch_one(&s.read_pool()).await.unwrap();
                format!("inbox rows: {n} on a fresh connection, {pooled} through the pool")
            }
            _ => String::new(),
        };
        let again = if found.is_empty() {
            String::new()
        } else {
            tokio::time::sleep(Duration::from_secs(1)).await;
            format!("a second reconcile 1 s later: {:?}", anomalies(&h.reconcile().await))
        };
        let fresh = format!("{fresh}; {again}");
        let lag = h.ctx.broker.backlog(&h.ctx.names.group, &h.ctx.topic()).await;
        let marks = h.ctx.broker.watermarks(&h.ctx.topic());
        assert_eq!(
            anomalies(&r),
            Vec::<String>::new(),
            "{found:?}\n{fresh}; lag now {lag:?}, marks {marks:?}\nfault log: {:?}",
            h.ctx.faults.log()
        );
        assert_eq!(r.counts.payments_with_one_receipt, 300);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn without_an_inbox_the_redelivery_applies_twice() {
        let notifier = "[notifier]\nbatch_size = 20\ninbox = \"off\"\n[faults]\nnotifier_before_offset_commit = 0.01\n";
        let h = pipeline(notifier).await;
        assert!(h.ctx.faults.fired(FaultPoint::NotifierBeforeOffsetCommit) > 0, "the fault fired");
        let r = h.reconcile().await;
        assert!(r.counts.payments_with_many_receipts > 0, "{:?}", r.counts);
        assert!(anomalies(&r).contains(&"duplicate effect".to_string()), "{:?}", anomalies(&r));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn committing_offsets_first_loses_the_batch_a_crash_interrupts() {
        let notifier =
            "[notifier]\nbatch_size = 20\ninbox = \"commit-offset-first\"\n[faults]\nnotifier_mid_batch = 0.2\n";
        let h = pipeline(notifier).await;
        assert!(h.ctx.faults.fired(FaultPoint::NotifierMidBatch) > 0, "the fault fired");
        let r = h.reconcile().await;
        assert!(r.counts.payments_without_receipt > 0, "{:?}", r.counts);
        assert!(anomalies(&r).contains(&"missing effect".to_string()), "{:?}", anomalies(&r));
    }
}
