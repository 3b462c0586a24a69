//! Retention: the purger deletes old published outbox rows and old inbox
//! rows, as the scenario's `[retention]` says.

use crate::context::{Ctx, Stats};
use tracing::warn;

/// Retention: purges old published outbox rows and old inbox rows.
pub async fn run(ctx: Ctx) {
    let mut shutdown = ctx.shutdown.clone();
    let r = &ctx.scenario.retention;
    loop {
        if shutdown.sleep(r.purge_interval).await {
            return;
        }
        match ctx.store.purge(r.outbox, r.inbox).await {
            Ok((o, i)) => {
                Stats::add(&ctx.stats.purged_outbox_rows, o);
                Stats::add(&ctx.stats.purged_inbox_rows, i);
            }
            Err(e) => warn!(cause = %e, "retention purge failed"),
        }
    }
}
