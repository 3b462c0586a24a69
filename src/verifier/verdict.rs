//! From invariants, anomalies and the chaos that was seen to a verdict.
//!
//! Anomalies decide: any anomaly the scenario does not list as allowed is a
//! violation, whatever the invariants' figures say. And the chaos counts
//! only as far as the harness saw its effects: a fault that fired without
//! its observable effect makes the run inconclusive, named.

use super::reconcile::{Anomaly, AnomalyKind, Invariant};
use crate::faults::{FaultPoint, FaultSummary};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Expectations held and the faults really fired.
    Pass,
    /// An expectation was violated.
    Fail,
    /// Nothing was violated, but the chaos did not happen: proves nothing.
    Inconclusive,
    /// The pipeline did not drain (or a service died); no verdict on the rest.
    Incomplete,
    /// Stopped by Ctrl-C or SIGTERM.
    Interrupted,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Pass => "pass",
            Verdict::Fail => "fail",
            Verdict::Inconclusive => "inconclusive",
            Verdict::Incomplete => "incomplete",
            Verdict::Interrupted => "interrupted",
        }
    }
}

/// "The chaos happened", as the harness saw it: every fault point with a
/// probability above zero fired, and every firing had its effect
/// ([`FaultPoint::confirmed_by`]). A run that fails these proves nothing.
pub fn chaos_checks(faults: &[FaultSummary]) -> Vec<Invariant> {
    let mut out = Vec::new();
    for f in faults.iter().filter(|f| f.probability > 0.0) {
        out.push(Invariant {
            id: format!("fault-{}-fired", f.point),
            name: format!("fault {} fired", f.point),
            expected: "at least 1".into(),
            actual: f.fired.to_string(),
            ok: f.fired > 0,
            anomalies: vec![],
            off_by: Some(u64::from(f.fired == 0)),
        });
        if f.fired > 0 {
            let seen = FaultPoint::from_name(&f.point).map(|p| p.confirmed_by()).unwrap_or("its effect");
            // A firing another fault pre-empted (its process killed by
            // another point first) is neither seen nor missed; but a point
            // all of whose firings were pre-empted proved nothing.
            let accounted = f.confirmed + f.preempted;
            let actual = match f.preempted {
                0 => f.confirmed.to_string(),
                n => format!("{}; {n} pre-empted by another fault", f.confirmed),
            };
            out.push(Invariant {
                id: format!("fault-{}-confirmed", f.point),
                name: format!("fault {} confirmed: {seen}", f.point),
                expected: f.fired.to_string(),
                actual,
                ok: accounted >= f.fired && f.confirmed > 0,
                anomalies: vec![],
                off_by: Some(f.fired.saturating_sub(accounted).max(u64::from(f.confirmed == 0))),
            });
        }
    }
    out
}

/// Marks the anomalies the scenario allows.
pub fn allow(anomalies: &mut [Anomaly], allowed: &[AnomalyKind]) {
    for a in anomalies {
        a.allowed = allowed.iter().any(|k| k.as_str() == a.name || same_as(*k) == Some(a.name.as_str()));
    }
}

/// The anomaly an older name now stands for: the payments pipeline's
/// "split payment" is the core's "split key" (a payment's key is its id),
/// since the core alone checks that a key's messages share a partition. A
/// scenario that allows the old name allows the one found.
fn same_as(kind: AnomalyKind) -> Option<&'static str> {
    match kind {
        AnomalyKind::SplitPayment => Some(AnomalyKind::SplitKey.as_str()),
        _ => None,
    }
}

/// What a failed chaos check says did not happen, in words: a fault that
/// never fired, or firings whose effect was not seen. An aimed kill read
/// per second says what its seconds drew ([`unarmed`]).
fn not_happened(check: &Invariant, faults: &[FaultSummary]) -> String {
    let Some(rest) = check.name.strip_prefix("fault ") else { return check.name.clone() };
    if let Some(point) = rest.strip_suffix(" fired") {
        return match faults.iter().find(|f| f.point == point).and_then(unarmed) {
            Some(why) => format!("{point} never fired: {why}"),
            None => format!("{point} never fired"),
        };
    }
    match rest.split_once(" confirmed: ") {
        Some((point, seen)) => {
            let (confirmed, more) = match check.actual.split_once("; ") {
                Some((n, more)) => (n, format!("; {more}")),
                None => (check.actual.as_str(), String::new()),
            };
            format!("{point} fired {} time(s), {confirmed} confirmed by {seen}{more}", check.expected)
        }
        None => check.name.clone(),
    }
}

/// Arms a run asks for when it tells how to raise an aimed kill's rate:
/// with three expected, a run draws none about one time in twenty.
const ARMS_WANTED: f64 = 3.0;

/// Why an aimed kill read per second never fired, with the fix: what its
/// process-seconds drew, and, when they armed nothing, the rate per second
/// that expects a few arms in as many seconds, or `aimed = "per-occurrence"`
/// for a rate sized per window (a file written before per second was the
/// default). None for any other point, or one that fired.
fn unarmed(f: &FaultSummary) -> Option<String> {
    let (seconds, arms) = f.armed?;
    if f.fired > 0 {
        return None;
    }
    let drawn = format!("{arms} arm(s) in {seconds} process-second(s) at {} per second", f.rates());
    if arms > 0 {
        return Some(format!("{drawn}, and no armed process met a window of its kind"));
    }
    if seconds == 0 {
        return Some(drawn);
    }
    let key = FaultPoint::from_name(&f.point).map_or(f.point.as_str(), |p| p.key());
    let (expected, raise) = if f.per_role.is_empty() {
        let rate = ((ARMS_WANTED / seconds as f64 * 100.0).ceil() / 100.0).min(1.0);
        (
            format!(", {} expected", short(f.probability * seconds as f64)),
            format!("raise `{key}` to {rate} for about {} arm(s) here", (rate * seconds as f64).floor()),
        )
    } else {
        (String::new(), format!("raise `{key}` and the roles' own rates"))
    };
    Some(format!(
        "{drawn}{expected} (an aimed kill's rate is per second of a process's life, the default: {raise}, or set `[nemesis] aimed = \"per-occurrence\"` if {} counts windows)",
        f.probability
    ))
}

/// A figure with at most two decimals, and none it does not need.
fn short(x: f64) -> String {
    let s = format!("{x:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// The verdict, and one line saying why. A violated invariant whose every
/// anomaly is allowed is no violation; an anomaly not allowed always is.
pub fn verdict(
    exactly_once: bool,
    invariants: &[Invariant],
    anomalies: &[Anomaly],
    chaos: &[Invariant],
    faults: &[FaultSummary],
) -> (Verdict, String) {
    let allowed = |name: &String| anomalies.iter().any(|a| &a.name == name && a.allowed);
    let mut violated: Vec<&str> = invariants
        .iter()
        .filter(|i| !i.ok && (i.anomalies.is_empty() || !i.anomalies.iter().all(allowed)))
        .map(|i| i.name.as_str())
        .collect();
    for a in anomalies.iter().filter(|a| !a.allowed) {
        if !invariants.iter().any(|i| !i.ok && i.anomalies.contains(&a.name)) {
            violated.push(a.name.as_str());
        }
    }
    let quiet: Vec<String> = chaos.iter().filter(|i| !i.ok).map(|i| not_happened(i, faults)).collect();
    if !violated.is_empty() {
        let list = violated.join("; ");
        return if exactly_once {
            (Verdict::Fail, format!("{} invariant(s) violated: {list}", violated.len()))
        } else {
            (Verdict::Pass, format!("violations were expected and found: {list}"))
        };
    }
    if !quiet.is_empty() {
        return (Verdict::Inconclusive, format!("the chaos did not happen: {}", quiet.join("; ")));
    }
    if exactly_once {
        (Verdict::Pass, "every invariant held under the injected faults".into())
    } else {
        (Verdict::Fail, "violations were expected but every invariant held".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(point: FaultPoint, p: f64, fired: u64, confirmed: u64) -> FaultSummary {
        FaultSummary {
            point: point.name().into(),
            unit: point.unit().into(),
            probability: p,
            occurrences: 10,
            fired,
            confirmed,
            preempted: 0,
            preempted_why: vec![],
            armed: None,
            per_role: Vec::new(),
        }
    }

    #[test]
    fn a_firing_another_fault_pre_empted_is_neither_seen_nor_missed() {
        let mut held = summary(FaultPoint::DbHoldCommit, 0.1, 5, 4);
        held.preempted = 1;
        let chaos = chaos_checks(&[held.clone()]);
        assert!(chaos.iter().all(|i| i.ok), "{chaos:?}");
        assert_eq!(verdict(true, &[Invariant::eq("x", 1, 1)], &[], &chaos, &[]).0, Verdict::Pass);
        // One short even with the pre-empted one: inconclusive, and said.
        held.confirmed = 3;
        let (v, why) = verdict(true, &[Invariant::eq("x", 1, 1)], &[], &chaos_checks(&[held.clone()]), &[]);
        assert_eq!(v, Verdict::Inconclusive);
        assert!(
            why.contains("fired 5 time(s), 3 confirmed by") && why.ends_with("; 1 pre-empted by another fault"),
            "{why}"
        );
        // Every firing pre-empted: the fault proved nothing.
        held.confirmed = 0;
        held.preempted = 5;
        assert_eq!(
            verdict(true, &[Invariant::eq("x", 1, 1)], &[], &chaos_checks(&[held]), &[]).0,
            Verdict::Inconclusive
        );
    }

    fn anomaly(name: AnomalyKind, allowed: bool) -> Anomaly {
        Anomaly {
            name: name.as_str().into(),
            count: 1,
            examples: vec![],
            allowed,
            subjects: vec![],
            followed: vec![],
            found_by: vec![],
        }
    }

    fn broken(name: &str, by: AnomalyKind) -> Invariant {
        Invariant { ok: false, anomalies: vec![by.as_str().into()], ..Invariant::eq(name, 1, 2) }
    }

    #[test]
    fn a_fault_that_never_fired_is_inconclusive() {
        let quiet = chaos_checks(&[summary(FaultPoint::RelayAfterProduce, 0.1, 0, 0)]);
        assert_eq!(quiet.len(), 1);
        assert_eq!(verdict(true, &[Invariant::eq("x", 1, 1)], &[], &quiet, &[]).0, Verdict::Inconclusive);
    }

    #[test]
    fn a_fault_fired_but_not_confirmed_is_inconclusive_and_named() {
        let chaos = chaos_checks(&[summary(FaultPoint::NotifierBeforeOffsetCommit, 0.1, 3, 2)]);
        let (v, why) = verdict(true, &[Invariant::eq("x", 1, 1)], &[], &chaos, &[]);
        assert_eq!(v, Verdict::Inconclusive);
        assert!(why.contains("notifier.before_offset_commit fired 3 time(s), 2 confirmed"), "{why}");
    }

    #[test]
    fn confirmed_chaos_and_held_invariants_pass() {
        let chaos = chaos_checks(&[
            summary(FaultPoint::RelayAfterProduce, 0.1, 3, 3),
            summary(FaultPoint::WorkloadPoison, 0.0, 0, 0),
        ]);
        assert!(chaos.iter().all(|i| i.ok));
        assert_eq!(verdict(true, &[Invariant::eq("x", 1, 1)], &[], &chaos, &[]).0, Verdict::Pass);
        assert_eq!(verdict(false, &[Invariant::eq("x", 1, 1)], &[], &chaos, &[]).0, Verdict::Fail);
    }

    #[test]
    fn a_violation_fails_even_when_the_chaos_was_quiet() {
        let quiet = chaos_checks(&[summary(FaultPoint::RelayAfterProduce, 0.1, 0, 0)]);
        let bad = [broken("x", AnomalyKind::LostEvent)];
        let found = [anomaly(AnomalyKind::LostEvent, false)];
        assert_eq!(verdict(true, &bad, &found, &quiet, &[]).0, Verdict::Fail);
        assert_eq!(verdict(false, &bad, &found, &quiet, &[]).0, Verdict::Pass, "expected and found");
    }

    #[test]
    fn an_anomaly_alone_fails_the_run() {
        // No report says PASS above an anomaly table, whatever the invariants say.
        let (v, why) =
            verdict(true, &[Invariant::eq("x", 1, 1)], &[anomaly(AnomalyKind::CounterDrift, false)], &[], &[]);
        assert_eq!(v, Verdict::Fail);
        assert!(why.contains("counter drift"), "{why}");
    }

    #[test]
    fn an_allowed_anomaly_does_not_fail_the_run() {
        let bad = [broken("x", AnomalyKind::SplitKey)];
        let mut found = [anomaly(AnomalyKind::SplitKey, false)];
        allow(&mut found, &[AnomalyKind::SplitKey]);
        assert!(found[0].allowed);
        assert_eq!(verdict(true, &bad, &found, &[], &[]).0, Verdict::Pass);
        // The payments pipeline's old name for it still allows it; another
        // kind's name does not.
        let mut old = [anomaly(AnomalyKind::SplitKey, false)];
        allow(&mut old, &[AnomalyKind::SplitPayment]);
        assert!(old[0].allowed);
        allow(&mut old, &[AnomalyKind::LostEvent]);
        assert!(!old[0].allowed);
        // Allowing one kind does not excuse another on the same invariant.
        let two = [Invariant { anomalies: vec!["split key".into(), "lost event".into()], ..bad[0].clone() }];
        let found = [found[0].clone(), anomaly(AnomalyKind::LostEvent, false)];
        assert_eq!(verdict(true, &two, &found, &[], &[]).0, Verdict::Fail);
    }

    #[test]
    fn an_inconclusive_reason_names_what_did_not_happen() {
        let chaos =
            chaos_checks(&[summary(FaultPoint::ProcessPause, 0.2, 0, 0), summary(FaultPoint::ProcessKill, 0.2, 5, 3)]);
        let (v, why) = verdict(true, &[], &[], &chaos, &[]);
        assert_eq!(v, Verdict::Inconclusive);
        assert!(why.contains("process.pause never fired"), "{why}");
        assert!(
            why.contains("process.kill fired 5 time(s), 3 confirmed by the process seen ending by SIGKILL"),
            "{why}"
        );
        assert!(!why.contains("pause fired;"), "a fault that fired 0 times is never said to have fired: {why}");
    }

    /// A file whose aimed rates were sized per window, read per second (the
    /// default): its seconds armed nothing, and `why` says so with the fix.
    #[test]
    fn an_aimed_kill_that_armed_nothing_says_why_and_the_fix() {
        let mut f = summary(FaultPoint::DbKillAfterCommit, 0.05, 0, 0);
        f.armed = Some((7, 0));
        let faults = [f.clone()];
        let (v, why) = verdict(true, &[Invariant::eq("x", 1, 1)], &[], &chaos_checks(&faults), &faults);
        assert_eq!(v, Verdict::Inconclusive);
        assert_eq!(
            why,
            "the chaos did not happen: db.kill_after_commit never fired: 0 arm(s) in 7 process-second(s) at 0.05 per second, \
             0.35 expected (an aimed kill's rate is per second of a process's life, the default: raise `db_kill_after_commit` \
             to 0.43 for about 3 arm(s) here, or set `[nemesis] aimed = \"per-occurrence\"` if 0.05 counts windows)"
        );
        // Too few seconds for three arms: the rate stops at 1.
        f.armed = Some((2, 0));
        let (_, why) = verdict(true, &[], &[], &chaos_checks(&[f.clone()]), &[f.clone()]);
        assert!(why.contains("raise `db_kill_after_commit` to 1 for about 2 arm(s) here"), "{why}");
        // A role's own rate: no figure the run cannot stand behind.
        f.per_role = vec![("service".into(), 0.3)];
        let (_, why) = verdict(true, &[], &[], &chaos_checks(&[f.clone()]), &[f.clone()]);
        assert!(why.contains("at 0.05, service 0.3 per second (an aimed kill's"), "{why}");
        assert!(why.contains("raise `db_kill_after_commit` and the roles' own rates, or set"), "{why}");
        // Armed, but no window came: the rate is not what to change.
        f.per_role.clear();
        f.armed = Some((7, 2));
        let (_, why) = verdict(true, &[], &[], &chaos_checks(&[f.clone()]), &[f.clone()]);
        assert!(
            why.ends_with(
                "2 arm(s) in 7 process-second(s) at 0.05 per second, and no armed process met a window of its kind"
            ),
            "{why}"
        );
        // Read per window, or fired: the old words.
        f.armed = None;
        let (_, why) = verdict(true, &[], &[], &chaos_checks(&[f.clone()]), &[f]);
        assert!(why.ends_with("db.kill_after_commit never fired"), "{why}");
    }
}
