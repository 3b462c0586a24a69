//! The payment service: per payment, one transaction writes the payment and
//! its `payment.authorized` event; a second marks it captured and writes
//! `payment.captured`. Several producers run at once, as a busy service would.
//!
//! The workload's shape comes from the seed, so that no fixed arithmetic
//! of it lines up with a bug: the producers take the next group of payments
//! as they come free (their interleaving is the scheduler's), a group's size
//! varies around `[workload] batch`, a producer captures a group only after
//! authorizing 0 to 2 more, and before one group in eight it pauses for a
//! millisecond, as a service's requests do not arrive in lockstep (on
//! SQLite, whose writers take strict turns, nothing else would change the
//! order of the producers' transactions). With a fixed shape (producer k taking
//! groups k, k + producers, …, each captured at once) every captured event
//! sat exactly `producers` outbox rows after its authorized one, and a
//! relay choosing the partition from that position passed.
//!
//! The `dual-write` variant (a classic mistake) writes no outbox: it commits
//! the payment, then produces the event itself. Fault point
//! `workload.after_commit` crashes it between the two, and the event is lost.

use crate::broker::Producer;
use crate::context::{Ctx, Stats};
use crate::domain::events::{Envelope, EventKind, PaymentEvent};
use crate::domain::intent::Intended;
use crate::error::Result;
use crate::faults::FaultPoint;
use crate::scenario::{PublishMode, WorkloadRetry};
use crate::store::NewPayment;
use rand::{Rng, SeedableRng};
use std::sync::Arc;

/// Writes `payments` payments with `producers` concurrent tasks. Amounts and
/// accounts come from the seed; payment ids are fresh uuids.
pub async fn run(ctx: Ctx) -> Result<()> {
    let producers = ctx.scenario.producers;
    let mut shape = Shape::new(ctx.scenario.seed, ctx.scenario.payments, ctx.scenario.workload_batch as u64);
    shape.pace = ctx.scenario.spread.map(|s| Pace::new(s, ctx.scenario.payments));
    let shape = Arc::new(shape);
    let mut tasks = Vec::with_capacity(producers);
    for k in 0..producers {
        let ctx = ctx.clone();
        let shape = shape.clone();
        tasks.push(tokio::spawn(async move {
            // What this producer committed, handed to the run's record of
            // intent when it stops, finished or not.
            let mut committed = Vec::new();
            let r = produce(&ctx, k, &shape, &mut committed).await;
            ctx.intent.extend(committed);
            r
        }));
    }
    let mut first_err = None;
    for t in tasks {
        match t.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                first_err.get_or_insert(e);
            }
            Err(e) => {
                first_err.get_or_insert(crate::Error::Internal(format!("workload task failed: {e}")));
            }
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// The groups of payments the producers share: the next one goes to
/// whichever producer asks first. Group `g`'s size and the captures it waits
/// for come from the seed and `g` alone.
struct Shape {
    seed: u64,
    payments: u64,
    batch: u64,
    /// The next group's number and first payment.
    next: std::sync::Mutex<(u64, u64)>,
    /// `[workload] spread_secs`: when each payment may start.
    pace: Option<Pace>,
}

/// A producer's pause before one group in eight.
const THINK: std::time::Duration = std::time::Duration::from_millis(1);

/// A group the producer has authorized and not yet captured.
struct Pending {
    ps: Vec<NewPayment>,
    /// Where its payments start in the producer's `committed`.
    from: usize,
    /// More groups to authorize before this one is captured.
    wait: u32,
}

impl Shape {
    fn new(seed: u64, payments: u64, batch: u64) -> Self {
        Self { seed, payments, batch: batch.max(1), next: std::sync::Mutex::new((0, 0)), pace: None }
    }

    /// Under `[workload] spread_secs`, how long the group that starts with
    /// payment `first` waits for its turn.
    fn turn_in(&self, first: u64) -> std::time::Duration {
        self.pace.as_ref().map_or(std::time::Duration::ZERO, |p| p.turn_in(first))
    }

    fn rng(&self, g: u64) -> rand::rngs::StdRng {
        rand::rngs::StdRng::seed_from_u64(self.seed ^ 0x5a4e_0f9e_3b00 ^ g.wrapping_mul(0xbf58_476d_1ce4_e5b9))
    }

    /// The next group: its first payment and size (1 to 2 × batch − 1,
    /// about `batch` on average), how many groups its capture waits for,
    /// and whether the producer pauses before it; None once every payment
    /// has a group.
    fn take(&self) -> Option<(u64, u64, u32, bool)> {
        let mut next = self.next.lock().unwrap_or_else(|p| p.into_inner());
        let (g, first) = *next;
        if first >= self.payments {
            return None;
        }
        let mut rng = self.rng(g);
        let size = rng.gen_range(1..=2 * self.batch - 1).min(self.payments - first);
        let wait = rng.gen_range(0..=2);
        let pause = rng.gen_ratio(1, 8);
        *next = (g + 1, first + size);
        Some((first, size, wait, pause))
    }
}

/// `[workload] spread_secs`: `n` payments or operations started evenly
/// over `spread`, the i-th no sooner than i × spread / n into the workload.
/// The declared system's workload paces its operations with it too.
#[derive(Clone, Copy)]
pub struct Pace {
    start: tokio::time::Instant,
    spread: std::time::Duration,
    n: u64,
}

impl Pace {
    pub fn new(spread: std::time::Duration, n: u64) -> Self {
        Self { start: tokio::time::Instant::now(), spread, n: n.max(1) }
    }

    /// How long the i-th must wait from now.
    pub fn turn_in(&self, i: u64) -> std::time::Duration {
        let at = self.start + self.spread.mul_f64(i as f64 / self.n as f64);
        at.saturating_duration_since(tokio::time::Instant::now())
    }
}

/// Producer `k`: takes the next group of payments (written in one
/// transaction each step) until none is left. Each payment enters
/// `committed` once its authorize transaction returned, and is marked
/// captured once its capture did.
async fn produce(ctx: &Ctx, k: usize, shape: &Shape, committed: &mut Vec<Intended>) -> Result<()> {
    let component = format!("workload-{}", k + 1);
    let outbox = ctx.scenario.publish == PublishMode::Outbox;
    let producer = if outbox { None } else { Some(ctx.broker.producer()?) };
    let mut pending: std::collections::VecDeque<Pending> = Default::default();
    while let Some((first, size, wait, pause)) = shape.take() {
        if ctx.shutdown.is_set() {
            break;
        }
        if pause {
            tokio::time::sleep(THINK).await;
        }
        let turn = shape.turn_in(first);
        if !turn.is_zero() && ctx.shutdown.clone().sleep(turn).await {
            break;
        }
        let mut ps = payments_of_group(ctx, first, size);
        authorize(ctx, &component, &mut ps, outbox).await?;
        let from = committed.len();
        committed.extend(ps.iter().map(|p| Intended {
            id: p.id,
            amount_cents: p.amount_cents,
            account_id: p.account_id,
            captured: false,
            poison: false,
        }));
        ctx.stats.mark(&ctx.stats.first_write_ms, &ctx.stats.last_write_ms);
        if let Some(producer) = &producer {
            for p in &ps {
                dual_write(ctx, producer.as_ref(), &component, p, EventKind::Authorized).await?;
            }
        }
        // The groups already waiting count this one; those whose wait is
        // over are captured, oldest first.
        for p in pending.iter_mut() {
            p.wait = p.wait.saturating_sub(1);
        }
        pending.push_back(Pending { ps, from, wait });
        while pending.front().is_some_and(|p| p.wait == 0) {
            let p = pending.pop_front().expect("a front");
            capture_group(ctx, &component, producer.as_deref(), p, committed, outbox).await?;
        }
    }
    // Every group this producer authorized is captured before it stops.
    while let Some(p) = pending.pop_front() {
        capture_group(ctx, &component, producer.as_deref(), p, committed, outbox).await?;
    }
    Ok(())
}

/// Transaction 2 for one group, then its record of intent.
async fn capture_group(
    ctx: &Ctx,
    component: &str,
    producer: Option<&dyn Producer>,
    group: Pending,
    committed: &mut [Intended],
    outbox: bool,
) -> Result<()> {
    let captures: Vec<(NewPayment, bool)> = group
        .ps
        .into_iter()
        .map(|p| {
            let poison =
                outbox && ctx.faults.strike(FaultPoint::WorkloadPoison, component, || format!("payment {}", p.id));
            (p, poison)
        })
        .collect();
    capture(ctx, component, &captures, outbox).await?;
    for (entry, (_, poison)) in committed[group.from..].iter_mut().zip(&captures) {
        entry.captured = true;
        entry.poison = *poison;
    }
    if let Some(producer) = producer {
        for (p, _) in &captures {
            dual_write(ctx, producer, component, p, EventKind::Captured).await?;
        }
    }
    Stats::add(&ctx.stats.payments_written, captures.len() as u64);
    ctx.stats.mark(&ctx.stats.first_write_ms, &ctx.stats.last_write_ms);
    Ok(())
}

/// How often the payment service tries a write whose outcome it cannot
/// know, and the pause before the first retry; it doubles to
/// [`RETRY_PAUSE_MAX`], so the tries span about 40 s: a PostgreSQL restart
/// and its recovery fit in.
const WRITE_ATTEMPTS: u32 = 45;
const RETRY_PAUSE: std::time::Duration = std::time::Duration::from_millis(100);
const RETRY_PAUSE_MAX: std::time::Duration = std::time::Duration::from_secs(1);

fn pause_before(attempt: u32) -> std::time::Duration {
    (RETRY_PAUSE * 2u32.saturating_pow(attempt.min(8))).min(RETRY_PAUSE_MAX)
}

/// A database error may leave a write's outcome unknown: its COMMIT was
/// sent and the connection broke before the answer came.
fn outcome_unknown(e: &crate::Error) -> bool {
    matches!(e, crate::Error::Database { .. } | crate::Error::DatabaseUnreachable { .. })
}

/// Transaction 1 of a group, until it is known to have landed. After an
/// error the correct service looks its payments up by id, its idempotency
/// key, and writes them again only when they are absent; a write that
/// landed meanwhile makes the new one fail on the id, and the next look-up
/// finds it. The `new-id` mistake writes them again under new ids, so a
/// commit that landed leaves a payment nobody asked for.
async fn authorize(ctx: &Ctx, component: &str, ps: &mut [NewPayment], outbox: bool) -> Result<()> {
    let mut attempt = 1;
    loop {
        let err = match ctx.store.authorize(ps, outbox).await {
            Ok(()) => return Ok(()),
            Err(e) if outcome_unknown(&e) && attempt < WRITE_ATTEMPTS => e,
            Err(e) => return Err(e),
        };
        attempt += 1;
        tracing::info!(component, cause = %err, attempt, "an authorize's outcome is unknown; retrying");
        tokio::time::sleep(pause_before(attempt)).await;
        match ctx.scenario.retry {
            WorkloadRetry::NewId => ps.iter_mut().for_each(|p| p.id = crate::domain::events::time_ordered_id()),
            WorkloadRetry::Idempotent => {
                if landed(ctx, ps.iter().map(|p| p.id), false).await? {
                    return Ok(());
                }
            }
        }
    }
}

/// Transaction 2 of a group, the same way: the correct service looks up
/// whether its payments are captured, and writes again only if not. The
/// capture itself writes a `captured` event only for the payments it moved
/// from authorized (see [`crate::store::newly_captured`]): a second write
/// racing a first whose COMMIT was still in flight waits on its row locks
/// and then finds nothing to capture. The `new-id` mistake writes again
/// without looking; the status guard absorbs that, and its phantom
/// payments come from the authorize.
async fn capture(ctx: &Ctx, component: &str, ps: &[(NewPayment, bool)], outbox: bool) -> Result<()> {
    let mut attempt = 1;
    loop {
        let err = match ctx.store.capture(ps, outbox).await {
            Ok(()) => return Ok(()),
            Err(e) if outcome_unknown(&e) && attempt < WRITE_ATTEMPTS => e,
            Err(e) => return Err(e),
        };
        attempt += 1;
        tracing::info!(component, cause = %err, attempt, "a capture's outcome is unknown; retrying");
        tokio::time::sleep(pause_before(attempt)).await;
        if ctx.scenario.retry == WorkloadRetry::Idempotent && landed(ctx, ps.iter().map(|p| p.0.id), true).await? {
            return Ok(());
        }
    }
}

/// Whether all of a transaction's payments are there (false when none
/// are). A look-up that fails is tried again: only a look-up that answers
/// may send a write again.
async fn landed(ctx: &Ctx, ids: impl Iterator<Item = uuid::Uuid>, captured: bool) -> Result<bool> {
    let ids: Vec<uuid::Uuid> = ids.collect();
    let mut attempt = 1;
    loop {
        match ctx.store.landed(&ids, captured).await {
            Ok(n) if n == ids.len() => return Ok(true),
            Ok(0) => return Ok(false),
            Ok(n) => {
                return Err(crate::Error::Internal(format!(
                    "{n} of the {} payments of one transaction landed; a transaction is all or nothing",
                    ids.len()
                )))
            }
            Err(e) if outcome_unknown(&e) && attempt < WRITE_ATTEMPTS => {
                attempt += 1;
                tokio::time::sleep(pause_before(attempt)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// The payments `first..first + size` of the scenario (fewer at its end):
/// accounts and amounts from the seed and the payment's number, ids fresh.
fn payments_of_group(ctx: &Ctx, first: u64, size: u64) -> Vec<NewPayment> {
    let (seed, payments, accounts) = (ctx.scenario.seed, ctx.scenario.payments, ctx.scenario.accounts);
    (first..(first + size).min(payments))
        .map(|i| {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ i.wrapping_mul(0x9e37_79b9_7f4a_7c15));
            NewPayment {
                id: crate::domain::events::time_ordered_id(),
                account_id: rng.gen_range(1..=accounts as i32),
                amount_cents: rng.gen_range(100..=50_000),
            }
        })
        .collect()
}

/// The dual write: after the database commit, produce the event directly.
/// The event id is made up here, since there is no outbox row to carry one.
async fn dual_write(
    ctx: &Ctx,
    producer: &dyn Producer,
    component: &str,
    p: &NewPayment,
    kind: EventKind,
) -> Result<()> {
    let id = crate::domain::events::time_ordered_id();
    if ctx
        .faults
        .strike(FaultPoint::WorkloadAfterCommit, component, || format!("{} of payment {}", kind.event_type(), p.id))
    {
        // Crashed between the commit and the produce: the payment exists, its
        // event never will. The service restarts and carries on. The
        // harness skipped the produce itself, so it saw the effect.
        ctx.faults.confirm(FaultPoint::WorkloadAfterCommit, 1);
        return Ok(());
    }
    let body = PaymentEvent { payment_id: p.id, account_id: p.account_id, amount_cents: p.amount_cents };
    let payload = serde_json::to_vec(&body).map_err(|e| crate::Error::Internal(e.to_string()))?;
    let envelope = [Envelope::new(id, p.id, kind.event_type(), &payload)];
    producer
        .publish(&ctx.names.topic, &envelope, true)
        .await
        .map_err(|e| crate::Error::kafka("producing a dual-write event", e))?;
    Stats::add(&ctx.stats.messages_published, 1);
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::pipeline::testing::harness;
    use crate::store::{CommitGate, NewPayment};

    /// With 4 producers taking fixed turns on SQLite's one writer, every
    /// captured event sat a multiple of 4 outbox rows after its authorized
    /// one, and a relay that chose the partition from the row's position
    /// kept each payment on one partition by coincidence.
    #[tokio::test]
    async fn the_gap_between_a_payments_events_does_not_line_up_with_the_producers() {
        let h = harness("name = \"unit\"\nseed = 3\n[workload]\npayments = 400\nproducers = 4\n").await;
        super::run(h.ctx.clone()).await.expect("the workload");
        let url = format!("sqlite://{}", h.ctx.store.endpoint());
        let pool = sqlx::SqlitePool::connect(&url).await.expect("the run's SQLite file");
        let gaps: Vec<(i64, i64)> = sqlx::query_as(
            "SELECT (c.seq - a.seq) % 4 AS r, count(*) FROM outbox a JOIN outbox c ON a.aggregate_id = c.aggregate_id \
             WHERE a.event_type = 'payment.authorized' AND c.event_type = 'payment.captured' GROUP BY r",
        )
        .fetch_all(&pool)
        .await
        .expect("the outbox");
        assert_eq!(gaps.iter().map(|g| g.1).sum::<i64>(), 400, "{gaps:?}");
        assert!(gaps.len() > 1, "every gap the same modulo the producers: {gaps:?}");
    }

    /// `[workload] spread_secs`: payment 29 of 30 starts no sooner than
    /// 29/30 of the spread into the workload, whatever the producers' speed.
    #[tokio::test]
    async fn a_paced_workload_starts_no_payment_before_its_turn() {
        let h = harness("name = \"unit\"\n[workload]\npayments = 30\nproducers = 4\nspread_secs = 1\n").await;
        let start = std::time::Instant::now();
        super::run(h.ctx.clone()).await.expect("the workload");
        let took = start.elapsed();
        assert!(took >= std::time::Duration::from_millis(29 * 1000 / 30), "{took:?}");
        assert_eq!(h.ctx.intent.take().len(), 30);
    }

    /// `store.commit_refused`: the transaction rolls back, the caller gets
    /// a database error, and the firing is confirmed.
    #[tokio::test]
    async fn a_refused_commit_leaves_nothing_and_says_so() {
        // Not 1, which a scenario may not ask for (a run that refuses every
        // commit never ends); with seed 3 the first commit draws a firing.
        let h = harness("name = \"unit\"\nseed = 3\n[faults]\nstore_commit_refused = 0.99\n").await;
        let store = h.ctx.store.gated(CommitGate::new(h.ctx.faults.clone(), "workload", None));
        let ps = vec![NewPayment { id: uuid::Uuid::new_v4(), account_id: 1, amount_cents: 100 }];
        let err = store.authorize(&ps, true).await.expect_err("refused");
        assert!(matches!(err, crate::Error::Database { .. }), "{err}");
        assert!(err.to_string().contains("store.commit_refused"), "{err}");
        assert_eq!(h.ctx.store.landed(&[ps[0].id], false).await.unwrap(), 0);
        assert_eq!(h.ctx.store.unpublished().await.unwrap(), 0, "the outbox row rolled back with the payment");
        let faults = &h.ctx.faults;
        use crate::faults::FaultPoint::StoreCommitRefused;
        assert_eq!((faults.fired(StoreCommitRefused), faults.confirmed(StoreCommitRefused)), (1, 1));
        // An open gate lets the same write through.
        let open = h.ctx.store.gated(CommitGate::default());
        open.authorize(&ps, true).await.expect("committed");
        assert_eq!(h.ctx.store.landed(&[ps[0].id], false).await.unwrap(), 1);
    }

    /// `workload.slow_commit`: the payment service's commit waits 50 to
    /// 500 ms and then lands, confirmed; another component's gate never
    /// holds.
    #[tokio::test]
    async fn a_held_commit_lands_late_and_only_the_payment_services() {
        use crate::faults::FaultPoint::WorkloadSlowCommit;
        let h = harness("name = \"unit\"\nseed = 3\n[faults]\nworkload_slow_commit = 0.99\n").await;
        let faults = &h.ctx.faults;
        let relay = h.ctx.store.gated(CommitGate::new(faults.clone(), "relay-1", None));
        let ps = vec![NewPayment { id: uuid::Uuid::new_v4(), account_id: 1, amount_cents: 100 }];
        relay.authorize(&ps, true).await.expect("committed");
        assert_eq!(faults.reached(WorkloadSlowCommit), 0, "only the payment service's commits are occurrences");
        let store = h.ctx.store.gated(CommitGate::new(faults.clone(), "workload", Some(h.ctx.stats.on_writer_hold())));
        let mut held = Vec::new();
        for _ in 0..3 {
            let ps = vec![NewPayment { id: uuid::Uuid::new_v4(), account_id: 1, amount_cents: 100 }];
            let t = std::time::Instant::now();
            store.authorize(&ps, true).await.expect("a held commit still commits");
            held.push(t.elapsed());
            assert_eq!(h.ctx.store.landed(&[ps[0].id], false).await.unwrap(), 1);
        }
        let fired = faults.fired(WorkloadSlowCommit);
        assert!(fired >= 1, "0.99 fires on almost every commit");
        assert_eq!(faults.confirmed(WorkloadSlowCommit), fired);
        assert!(held.iter().any(|d| d.as_millis() >= 50), "no commit was held: {held:?}");
        assert!(held.iter().all(|d| d.as_millis() < 2_000), "{held:?}");
        // One producer, one commit at a time: each hold went on, and no
        // other commit overtook it, so nothing was reordered.
        let k = h.ctx.stats.counts();
        assert_eq!((k.writer_holds, k.writer_holds_overtaken, k.overtakes), (fired, 0, 0));
    }
}
