//! The phases every run goes through, whatever the system under test:
//! the programs' readiness, the workload under the nemesis, the drain with
//! its one stall rule, the settle, and the verdict with its one rule for a
//! run that is incomplete. A system kind ([`SystemUnderTest`]) answers
//! questions: how to reach it, its workload, what it has left, what it
//! still has pending, what its checkers find. It owns none of these loops,
//! so both kinds stall, settle and judge alike.

use super::declared::{Stall, Stalls};
use super::drive::{self, Ran, Settle};
use super::history::History;
use super::system::SystemUnderTest;
use crate::context::{Ctx, Stats};
use crate::error::Result;
use crate::faults::{FaultPoint, FaultSummary, Schedule};
use crate::harness::interrupt;
use crate::nemesis::acting::Acting;
use crate::nemesis::process::program::Programs;
use crate::report::assemble::{Judged, Sections};
use crate::report::progress::{Phase, Progress};
use crate::verifier::{verdict, Anomaly, Invariant, Verdict};
use std::time::{Duration, Instant};
use tracing::info;

/// What the drive leaves for the judge: how it went, and what never
/// finished.
pub(super) struct Driven {
    pub ran: Ran,
    pub stalls: Stalls,
}

/// What a system kind's checkers found: the skeleton turns it into the
/// verdict.
pub(super) struct Checked {
    pub invariants: Vec<Invariant>,
    pub anomalies: Vec<Anomaly>,
    /// Firings whose effect the ground truth shows.
    pub confirmed: Vec<(FaultPoint, u64)>,
    /// The report's sections the kind fills.
    pub sections: Sections,
}

/// How long the workload may go without writing, group wait included. A
/// bound on progress, not on the whole: a busy machine, or a PostgreSQL
/// recovering from `db.restart` beside it, makes the workload slower, and
/// only one that is stuck stops writing for this long. (A bound of 120 s on
/// the whole of 1,000 payments ended the infrastructure faults' run
/// INCOMPLETE beside two busy loops.)
const WORKLOAD_STALL: Duration = Duration::from_secs(120);

/// The system reached, its programs ready, then the workload under the
/// nemesis and the drain; each may be cut short by a signal, or by a
/// program under test that failed. An error is a system that could not be
/// run at all (a service that never answered).
pub(super) async fn drive(ctx: &Ctx, sut: &SystemUnderTest, acting: &Acting, progress: &Progress) -> Result<Driven> {
    let mut ran = Ran::default();
    let t_work = Instant::now();
    if let Err(e) = sut.reach(ctx).await {
        return Err(sut.lacking().map(crate::Error::Service).unwrap_or(e));
    }
    let programs = sut.programs();
    let mut failed = std::pin::pin!(program_failure(programs));
    if let Some(p) = programs {
        tokio::select! {
            r = p.ready(ctx) => if let Err(why) = r { ran.incomplete = Some(why) },
            _ = interrupt::requested() => ran.interrupted = true,
        }
        // The nemesis acts from here until the system has drained: a
        // consumer does most of its work while it catches up, after the
        // service has stopped writing.
        p.set_acting(true);
    }
    acting.begin();
    let total = sut.operations(&ctx.scenario);
    // The calm goes on through the drain: it waits for the consumers too.
    let _calm = drive::calm_after(ctx, ctx.stats.clone(), total);
    if going(&ran) {
        tokio::select! {
            r = sut.workload(ctx, progress) => if let Err(e) = r {
                ran.incomplete = Some(format!("the workload stopped: {e}"))
            },
            why = workload_stalled(&ctx.stats, total, sut.unit(), stall_bound(ctx, total)) => ran.incomplete = Some(why),
            why = &mut failed => ran.incomplete = Some(why),
            _ = interrupt::requested() => ran.interrupted = true,
        }
    }
    ran.workload_ms = t_work.elapsed().as_millis() as u64;
    progress.phase(Phase::Drain);
    let stalls = come_to_rest(ctx, sut, acting, failed, &mut ran).await;
    // A program that said it lacks something is the run's one error,
    // whatever wait it cut short (a service's health, the group's).
    if let Some(why) = sut.lacking() {
        return Err(crate::Error::Service(why));
    }
    Ok(Driven { ran, stalls })
}

fn going(ran: &Ran) -> bool {
    ran.incomplete.is_none() && !ran.interrupted
}

/// Resolves with the first failure of a program under test; never, when
/// the system has none (the payments pipeline in process).
async fn program_failure(programs: Option<&Programs>) -> String {
    match programs {
        Some(p) => p.failed().await,
        None => std::future::pending().await,
    }
}

/// The drain, then the settle, each cut short by a program that failed or
/// a signal. The one stall rule: undrained, the faults stop and the system
/// gets one more drain timeout, so a relay or a consumer the faults only
/// slowed catches up then. Outbox rows still unpublished after it are a
/// stalled relay, judged, not an INCOMPLETE run; consumers still behind
/// leave the run INCOMPLETE. Drained is not done: a consumer that stores
/// first and applies later has work left, so a system that can say what
/// it has pending settles, its faults over, before it is judged.
async fn come_to_rest(
    ctx: &Ctx,
    sut: &SystemUnderTest,
    acting: &Acting,
    mut failed: std::pin::Pin<&mut impl std::future::Future<Output = String>>,
    ran: &mut Ran,
) -> Stalls {
    let t_drain = Instant::now();
    let mut stalls = Stalls::default();
    let mut faults_off: Option<Instant> = None;
    let programs = sut.programs();
    let stop_faults = || async {
        if let Some(p) = programs {
            p.set_acting(false);
        }
        acting.stop().await;
        ctx.faults.stop();
    };
    while going(ran) {
        tokio::select! {
            r = sut.drain(ctx) => match r {
                Ok(()) => break,
                Err(u) if faults_off.is_none() => {
                    info!(left = u.unpublished, lag = u.lag, "work left at the drain timeout: the faults stop, the system gets one more");
                    faults_off = Some(Instant::now());
                    stop_faults().await;
                }
                Err(u) if u.unpublished > 0 => {
                    let fault_free = faults_off.map(|t| t.elapsed()).unwrap_or_default();
                    tracing::warn!(left = u.unpublished, "the relays left outbox rows unpublished with the faults off: judging the run");
                    stalls.relay = sut.relay_stall(u.unpublished, t_drain.elapsed(), fault_free).await;
                    break;
                }
                Err(u) => ran.incomplete = Some(match programs {
                    Some(p) => format!("{}; {}", u.why, p.stderr_of_first()),
                    None => u.why,
                }),
            },
            why = &mut failed => ran.incomplete = Some(why),
            _ = interrupt::requested() => ran.interrupted = true,
        }
    }
    stop_faults().await;
    ran.drain_ms = t_drain.elapsed().as_millis() as u64;
    if going(ran) && sut.settles() {
        stalls.consumer = settle(ctx, sut, failed, ran).await;
    }
    stalls
}

/// The settle after the drain, timed, with the pending work it found at
/// its first reading ([`SystemUnderTest::settle`]).
async fn settle(
    ctx: &Ctx,
    sut: &SystemUnderTest,
    failed: std::pin::Pin<&mut impl std::future::Future<Output = String>>,
    ran: &mut Ran,
) -> Option<Stall> {
    let t_settle = Instant::now();
    let mut pending = None;
    let mut stall = None;
    tokio::select! {
        r = sut.settle(ctx, &mut pending) => match r {
            Ok(s) => stall = s,
            Err(e) => ran.incomplete = Some(format!("the settle after the drain could not read the system: {e}")),
        },
        why = failed => ran.incomplete = Some(why),
        _ = interrupt::requested() => ran.interrupted = true,
    }
    ran.settle = Some(Settle { ms: t_settle.elapsed().as_millis() as u64, pending });
    stall
}

/// How long the workload may go without writing: [`WORKLOAD_STALL`], or
/// twice the gap between two operations of a workload spread thinner
/// (`[workload] spread_secs`), which writes nothing for that long by design.
fn stall_bound(ctx: &Ctx, total: u64) -> Duration {
    let gap = ctx.scenario.spread.map_or(Duration::ZERO, |s| s / total.clamp(1, u32::MAX as u64) as u32);
    WORKLOAD_STALL.max(gap * 2)
}

/// Returns, with the reason, once the workload has written nothing for
/// `bound`; never while it writes.
async fn workload_stalled(stats: &Stats, total: u64, unit: &str, bound: Duration) -> String {
    let mut last = Stats::get(&stats.payments_written);
    let mut since = tokio::time::Instant::now();
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = Stats::get(&stats.payments_written);
        if now != last {
            (last, since) = (now, tokio::time::Instant::now());
        } else if since.elapsed() >= bound {
            return format!(
                "the workload wrote none of its {unit} for {} s ({last} of {total} written); a component or service may be stuck",
                bound.as_secs()
            );
        }
    }
}

/// The verdict, by one rule for every kind: a run is verified unless it
/// was interrupted or something may still write; an incomplete run that
/// was verified shows its figures as partial. The kind's checkers read the
/// ground truth through a fresh pool: after the nemesis restarted
/// PostgreSQL or ended sessions, the run's connections may be dead. Not
/// for a run that will not be read: an interrupted one may have lost
/// PostgreSQL, and a new pool would wait out its connect timeout for
/// nothing. Returns what the report is built from.
pub(super) async fn judge(ctx: &Ctx, sut: &SystemUnderTest, driven: &mut Driven, mut h: History) -> Judged {
    let sc = &ctx.scenario;
    let (ran, stalls) = (&mut driven.ran, &driven.stalls);
    let still_running = h.still_running;
    let mut faults = std::mem::take(&mut h.summary);
    let fired = std::mem::take(&mut h.fired);
    let verified = if ran.interrupted || still_running {
        None
    } else {
        let store = ctx.store.renewed(2).await;
        let pending = ran.settle.and_then(|s| s.pending);
        tokio::select! {
            r = sut.check(ctx, &store, h, stalls, pending) => Some(r),
            _ = interrupt::requested() => { ran.interrupted = true; None }
        }
    };
    let Checked { invariants, mut anomalies, confirmed, sections } = match ran.judgeable(still_running, verified) {
        Ok(found) => found,
        Err((verdict, reason)) => return unjudged(verdict, reason, fired, faults),
    };
    verdict::allow(&mut anomalies, &sc.allowed_anomalies);
    // The injector's counts and what the checkers found confirmed: the
    // injector keeps what the run recorded, and nothing is written back.
    crate::faults::add_confirmed(&mut faults, &confirmed);
    let chaos_checks = verdict::chaos_checks(&faults);
    let (v, why) = verdict::verdict(sc.exactly_once, &invariants, &anomalies, &chaos_checks, &faults);
    let (verdict, reason) = match &ran.incomplete {
        // Nothing ran, so there are no figures to call partial.
        Some(reason) if Stats::get(&ctx.stats.payments_written) == 0 => {
            (Verdict::Incomplete, format!("{reason}; the workload never started, so nothing was judged"))
        }
        Some(reason) => (Verdict::Incomplete, format!("{reason}; the figures above are partial")),
        None => (v, why),
    };
    Judged { verdict, reason, fired, faults, invariants, chaos_checks, anomalies, sections }
}

/// A run that could not be judged: its verdict and reason, and the faults
/// as the injector counted them.
fn unjudged(verdict: Verdict, reason: String, fired: Schedule, faults: Vec<FaultSummary>) -> Judged {
    let (invariants, chaos_checks, anomalies, sections) = Default::default();
    Judged { verdict, reason, fired, faults, invariants, chaos_checks, anomalies, sections }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The workload's bound is on progress: a slow workload that keeps
    /// writing is never cut, one that stops is, 120 s after its last write.
    #[tokio::test(start_paused = true)]
    async fn a_workload_is_cut_only_when_it_stops_writing() {
        let stats = std::sync::Arc::new(Stats::default());
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
        let why = workload_stalled(&stats, 9, "payments", WORKLOAD_STALL).await;
        writer.await.unwrap();
        let took = started.elapsed();
        assert!(took >= Duration::from_secs(300 + 120) && took <= Duration::from_secs(300 + 122), "{took:?}");
        assert!(why.contains("none of its payments for 120 s (5 of 9 written)"), "{why}");
    }
}
