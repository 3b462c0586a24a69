//! What a run could have caught: the protocol windows its confirmed strikes
//! covered, and the classic mistakes a run with those strikes exposes. A
//! user whose run passed reads here what it proved; a window no strike
//! covered is a mistake this run could not have seen.

use super::Report;

/// A window, the fault points whose confirmed firing covers it, and the
/// mistakes a strike there exposes (seeds 001 and 003, docs/contract.md).
const WINDOWS: &[(&str, &[&str], &str)] = &[
    (
        "a kill after a commit with changes",
        &["db.kill_after_commit"],
        "effects and inbox in two transactions, a mark before the broker's ack, an answer before the commit",
    ),
    ("a kill after an offset commit", &["kafka.kill_after_offset_commit"], "offsets committed before the effects"),
    ("a kill after a fetch", &["kafka.kill_after_fetch"], "effects applied outside the inbox's transaction"),
    ("a kill after a produce ack", &["kafka.kill_after_produce_ack"], "a new event id on a publish again"),
    (REORDERED, &["workload.slow_commit", "db.hold_commit"], "an insert-ordered cursor (seq) in a relay"),
    ("a commit held while offsets move", &["db.hold_commit"], "offsets left to auto-commit"),
];

const REORDERED: &str = "a reordered commit (a writer's, held)";

/// A stretch without a kill this long, from the first kill to the end of
/// the drain, gives a bug kept in memory (a cursor, a dedup set) time to
/// show after the last restart healed it.
const CALM_MS: u64 = 10_000;

/// "windows: struck a kill after a commit with changes, …; not struck: …"
/// and "can expose: …"; None for a run without kills or aimed strikes.
pub fn lines(r: &Report) -> Option<String> {
    let confirmed = |p: &str| r.faults.iter().any(|f| f.point == p && f.confirmed > 0);
    let mut struck = Vec::new();
    let mut missed = Vec::new();
    let mut exposes = Vec::new();
    for (window, points, mistakes) in WINDOWS {
        let set = r.faults.iter().any(|f| points.contains(&f.point.as_str()) && f.probability > 0.0);
        // A held COMMIT reorders the outbox only when a writer's is held:
        // a consumer's held commit reorders nothing a relay reads.
        let writer_held = || {
            r.fault_log.iter().any(|f| {
                f.point == "db.hold_commit"
                    && (f.component.starts_with("service") || f.component.starts_with("workload"))
            })
        };
        let covered = match *window {
            REORDERED => confirmed("workload.slow_commit") || (confirmed("db.hold_commit") && writer_held()),
            _ => points.iter().any(|p| confirmed(p)),
        };
        if covered {
            struck.push(*window);
            exposes.push(*mistakes);
        } else if set {
            missed.push(*window);
        }
    }
    match calm_ms(r) {
        Some(ms) if ms >= CALM_MS => {
            struck.push("a stretch without kills");
            exposes.push("state kept in memory that a restart heals (a cursor, a dedup set)");
        }
        Some(_) => missed.push("a stretch without kills (10 s)"),
        None => {}
    }
    if struck.is_empty() && missed.is_empty() {
        return None;
    }
    let mut out = format!("windows: struck {}", list(&struck));
    if !missed.is_empty() {
        out.push_str(&format!("; set but not struck: {}", missed.join(", ")));
    }
    out.push('\n');
    if !exposes.is_empty() {
        out.push_str(&format!("can expose: {}\n", exposes.join("; ")));
    }
    Some(out)
}

fn list(items: &[&str]) -> String {
    match items.is_empty() {
        true => "none".into(),
        false => items.join(", "),
    }
}

/// The longest stretch without a process kill, from the first kill to the
/// end of the drain; None for a run that killed nothing.
fn calm_ms(r: &Report) -> Option<u64> {
    let kill = |p: &str| p.contains("kill") && !p.starts_with("broker.");
    let mut at: Vec<u64> = r.fault_log.iter().filter(|f| kill(&f.point)).map(|f| f.at_ms).collect();
    at.sort_unstable();
    let end = r.timings.setup_ms + r.timings.workload_ms + r.timings.drain_ms;
    let tail = end.saturating_sub(*at.last()?);
    at.windows(2).map(|w| w[1] - w[0]).chain([tail]).max()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(faults: &[(&str, f64, u64)], kills_at: &[u64], end_ms: u64) -> Report {
        let mut r: Report =
            serde_json::from_str(include_str!("../../reports/sample-payments-postgres-kafka.json")).unwrap();
        r.faults = faults
            .iter()
            .map(|(p, prob, confirmed)| crate::faults::FaultSummary {
                point: p.to_string(),
                unit: "commit".into(),
                probability: *prob,
                occurrences: 10,
                fired: *confirmed,
                confirmed: *confirmed,
                preempted: 0,
                preempted_why: Vec::new(),
                armed: None,
                per_role: Vec::new(),
            })
            .collect();
        r.fault_log = kills_at
            .iter()
            .map(|at| crate::faults::FaultRecord {
                point: "db.kill_after_commit".into(),
                component: "notifier-1".into(),
                at_ms: *at,
                hit: String::new(),
                occurrence: None,
                reach: Default::default(),
            })
            .collect();
        (r.timings.setup_ms, r.timings.workload_ms, r.timings.drain_ms) = (0, end_ms, 0);
        r
    }

    /// A window counts only once a firing there was confirmed; a point set
    /// that never struck is named as such; a calm stretch is measured from
    /// the kills, not assumed from the scenario.
    #[test]
    fn the_windows_follow_the_confirmed_strikes_and_the_calm() {
        let r = report(
            &[("db.kill_after_commit", 0.1, 3), ("kafka.kill_after_offset_commit", 0.1, 0)],
            &[1_000, 2_000, 5_000],
            30_000,
        );
        let text = lines(&r).unwrap();
        assert!(text.contains("struck a kill after a commit with changes, a stretch without kills"), "{text}");
        assert!(text.contains("set but not struck: a kill after an offset commit"), "{text}");
        assert!(text.contains("effects and inbox in two transactions") && text.contains("a restart heals"), "{text}");
        assert!(!text.contains("offsets committed before"), "{text}");
        let busy = report(&[("db.kill_after_commit", 0.1, 3)], &[1_000, 9_000, 17_000, 25_000], 30_000);
        let text = lines(&busy).unwrap();
        assert!(text.contains("set but not struck: a stretch without kills"), "{text}");
        assert!(lines(&report(&[], &[], 30_000)).is_none());
    }
}
