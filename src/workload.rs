//! The payment service: per payment, one transaction writes the payment and
//! its `payment.authorized` event; a second marks it captured and writes
//! `payment.captured`. Several producers run at once, as a busy service would.

use crate::context::{Ctx, Stats};
use crate::error::Result;
use crate::faults::FaultPoint;
use crate::store::NewPayment;
use rand::{Rng, SeedableRng};
use uuid::Uuid;

/// Writes `payments` payments with `producers` concurrent tasks. Amounts and
/// accounts come from the seed; payment ids are fresh uuids.
pub async fn run(ctx: Ctx) -> Result<()> {
    let (seed, payments) = (ctx.scenario.seed, ctx.scenario.payments);
    let (producers, accounts) = (ctx.scenario.producers, ctx.scenario.accounts);
    let mut tasks = Vec::with_capacity(producers);
    for k in 0..producers {
        let ctx = ctx.clone();
        tasks.push(tokio::spawn(async move {
            let component = format!("workload-{}", k + 1);
            let mut i = k as u64;
            while i < payments {
                if ctx.shutdown.is_set() {
                    break;
                }
                let mut rng =
                    rand::rngs::StdRng::seed_from_u64(seed ^ i.wrapping_mul(0x9e37_79b9_7f4a_7c15));
                let p = NewPayment {
                    id: Uuid::new_v4(),
                    account_id: rng.gen_range(1..=accounts as i32),
                    amount_cents: rng.gen_range(100..=50_000),
                };
                ctx.store.authorize(&p).await?;
                let poison = ctx
                    .faults
                    .strike(FaultPoint::WorkloadPoison, &component, || {
                        format!("payment {}", p.id)
                    });
                ctx.store.capture(&p, poison).await?;
                Stats::add(&ctx.stats.payments_written, 1);
                i += producers as u64;
            }
            Ok::<(), crate::Error>(())
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
                first_err
                    .get_or_insert(crate::Error::Internal(format!("workload task failed: {e}")));
            }
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(()),
    }
}
