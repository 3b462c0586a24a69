//! The payment service: per payment, one transaction writes the payment and
//! its `payment.authorized` event; a second marks it captured and writes
//! `payment.captured`. Several producers run at once, as a busy service would.
//!
//! The `dual-write` variant (a classic mistake) writes no outbox: it commits
//! the payment, then produces the event itself. Fault point
//! `workload.after_commit` crashes it between the two, and the event is lost.

use crate::broker::Producer;
use crate::domain::events::{Envelope, EventKind, PaymentEvent};
use crate::domain::intent::Intended;
use crate::error::Result;
use crate::faults::FaultPoint;
use crate::pipeline::context::{Ctx, Stats};
use crate::scenario::{PublishMode, WorkloadRetry};
use crate::store::NewPayment;
use rand::{Rng, SeedableRng};

/// Writes `payments` payments with `producers` concurrent tasks. Amounts and
/// accounts come from the seed; payment ids are fresh uuids.
pub async fn run(ctx: Ctx) -> Result<()> {
    let producers = ctx.scenario.producers;
    let mut tasks = Vec::with_capacity(producers);
    for k in 0..producers {
        let ctx = ctx.clone();
        tasks.push(tokio::spawn(async move {
            // What this producer committed, handed to the run's record of
            // intent when it stops, finished or not.
            let mut committed = Vec::new();
            let r = produce(&ctx, k, &mut committed).await;
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

/// Producer `k`: takes payment groups k, k + producers, …; a group is
/// `batch` consecutive payments written in one transaction each step. Each
/// payment enters `committed` once its authorize transaction returned, and
/// is marked captured once its capture did.
async fn produce(ctx: &Ctx, k: usize, committed: &mut Vec<Intended>) -> Result<()> {
    let (payments, producers) = (ctx.scenario.payments, ctx.scenario.producers);
    let component = format!("workload-{}", k + 1);
    let outbox = ctx.scenario.publish == PublishMode::Outbox;
    let producer = if outbox { None } else { Some(ctx.broker.producer()?) };
    let batch = ctx.scenario.workload_batch as u64;
    let mut group = k as u64;
    while group * batch < payments {
        if ctx.shutdown.is_set() {
            break;
        }
        let mut ps = payments_of_group(ctx, group * batch, batch);
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
        let captures: Vec<(NewPayment, bool)> = ps
            .into_iter()
            .map(|p| {
                let poison =
                    outbox && ctx.faults.strike(FaultPoint::WorkloadPoison, &component, || format!("payment {}", p.id));
                (p, poison)
            })
            .collect();
        capture(ctx, &component, &captures, outbox).await?;
        for (entry, (_, poison)) in committed[from..].iter_mut().zip(&captures) {
            entry.captured = true;
            entry.poison = *poison;
        }
        if let Some(producer) = &producer {
            for (p, _) in &captures {
                dual_write(ctx, producer.as_ref(), &component, p, EventKind::Captured).await?;
            }
        }
        Stats::add(&ctx.stats.payments_written, captures.len() as u64);
        ctx.stats.mark(&ctx.stats.first_write_ms, &ctx.stats.last_write_ms);
        group += producers as u64;
    }
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

/// The payments `first..first + batch` of the scenario (fewer at its end):
/// accounts and amounts from the seed and the payment's number, ids fresh.
fn payments_of_group(ctx: &Ctx, first: u64, batch: u64) -> Vec<NewPayment> {
    let (seed, payments, accounts) = (ctx.scenario.seed, ctx.scenario.payments, ctx.scenario.accounts);
    (first..(first + batch).min(payments))
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
