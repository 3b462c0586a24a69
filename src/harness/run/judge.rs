//! Judging a run: the verifier's pass over the ground truth, unless the
//! run was interrupted or something may still write, and the verdict.

use super::drive::Ran;
use crate::context::Ctx;
use crate::faults::Strike;
use crate::report::Report;
use crate::store::Store;
use crate::verifier::{pass, verdict, Verdict};
use tracing::warn;

/// Verifies the run, unless it was interrupted or something may still
/// write, and sets the report's findings and verdict.
/// `emails` is the email provider's record, when the run sent emails.
pub(super) async fn judge(
    rep: &mut Report,
    ctx: &Ctx,
    ran: &mut Ran,
    still_running: bool,
    emails: Option<&crate::provider::Record>,
) {
    let sc = &ctx.scenario;
    // After the nemesis restarted PostgreSQL or ended sessions, the pool's
    // connections may be dead: the verifier reads through a new one.
    let store = match &ctx.store {
        Store::Postgres(pg) if sc.timeline.iter().any(|t| t.point.strike() == Strike::Database) => {
            pg.fresh(2).await.map(Store::Postgres).unwrap_or_else(|_| ctx.store.clone())
        }
        other => other.clone(),
    };
    let intent = ctx.intent.take();
    // With --declared, the same record of intent, as a declared system's.
    let ops = sc.cross_check.as_ref().map(|sys| super::declared::operations_of(sys, &intent));
    // The faults' history, taken once: the checkers read it, and what they
    // find confirmed the harness writes into the injector.
    let history = ctx.faults.history();
    let verified = if ran.interrupted || still_running {
        None
    } else {
        tokio::select! {
            r = pass::verify(&store, &ctx.broker, &ctx.names.topic, sc, intent, &history, emails) => Some(r),
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
        Some(Ok(pass::Verified { reconciliation: r, topic_side, confirmed })) => {
            for (point, n) in confirmed {
                ctx.faults.confirm(point, n);
            }
            let mut anomalies = r.anomalies;
            verdict::allow(&mut anomalies, &sc.allowed_anomalies);
            rep.stories = pass::stories(&store, &anomalies, topic_side, &history).await;
            pass::attribute(&store, &mut anomalies, &rep.stories, &history, sc).await;
            if let Some(record) = emails {
                crate::verifier::add_provider_calls(&mut rep.stories, record, history.started_epoch_ms);
            }
            rep.faults = ctx.faults.summary();
            let chaos = verdict::chaos_checks(&rep.faults);
            let (v, why) = verdict::verdict(sc.exactly_once, &r.invariants, &anomalies, &chaos);
            rep.counts = r.counts;
            rep.invariants = r.invariants;
            rep.anomalies = anomalies;
            rep.chaos_checks = chaos;
            rep.latency_ms = pass::latency(&store).await.unwrap_or_else(|e| {
                warn!(cause = %e, "measuring the latency failed");
                None
            });
            if let (Some(sys), Some(ops)) = (&sc.cross_check, &ops) {
                rep.cross_check = Some(super::declared::cross_check(ctx, &store, sys, ops, emails).await);
            }
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
