//! The payment service: per payment, one transaction writes the payment and
//! its `payment.authorized` event; a second marks it captured and writes
//! `payment.captured`. Several producers run at once, as a busy service would.
//!
//! The `dual-write` variant (a classic mistake) writes no outbox: it commits
//! the payment, then produces the event itself. Fault point
//! `workload.after_commit` crashes it between the two, and the event is lost.

use crate::broker::Producer;
use crate::context::{Ctx, Stats};
use crate::error::Result;
use crate::events::{Envelope, EventKind, PaymentEvent};
use crate::faults::FaultPoint;
use crate::intent::Intended;
use crate::scenario::PublishMode;
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
        let ps = payments_of_group(ctx, group * batch, batch);
        ctx.store.authorize(&ps, outbox).await?;
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
        ctx.store.capture(&captures, outbox).await?;
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

/// The payments `first..first + batch` of the scenario (fewer at its end):
/// accounts and amounts from the seed and the payment's number, ids fresh.
fn payments_of_group(ctx: &Ctx, first: u64, batch: u64) -> Vec<NewPayment> {
    let (seed, payments, accounts) = (ctx.scenario.seed, ctx.scenario.payments, ctx.scenario.accounts);
    (first..(first + batch).min(payments))
        .map(|i| {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ i.wrapping_mul(0x9e37_79b9_7f4a_7c15));
            NewPayment {
                id: crate::events::time_ordered_id(),
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
    let id = crate::events::time_ordered_id();
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
