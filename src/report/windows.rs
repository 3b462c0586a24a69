//! What a run could have caught: the protocol windows the harness saw
//! struck, and the classic mistakes a run with those strikes exposes. A
//! user whose run passed reads here what it proved; a window no strike
//! covered is a mistake this run could not have seen.
//!
//! A window is claimed only from evidence, never from a fault's firing:
//! a kill confirmed by the process seen dying by SIGKILL in the window, a
//! writer's held COMMIT that another writer's commit overtook, a hold on a
//! consumer that ran its course, a key whose events the topic carries out
//! of order.

use super::Report;

/// The windows, what covers each, and the mistakes a strike there exposes
/// (seeds 001 and 003, docs/contract.md).
const WINDOWS: &[(&str, Evidence, &str)] = &[
    (
        "a kill after a commit with changes",
        Evidence::Confirmed("db.kill_after_commit"),
        "effects and inbox in two transactions, a mark before the broker's ack, an answer before the commit",
    ),
    (
        "a kill after an offset commit",
        Evidence::Confirmed("kafka.kill_after_offset_commit"),
        "offsets committed before the effects",
    ),
    (
        "a kill after a fetch",
        Evidence::Confirmed("kafka.kill_after_fetch"),
        "effects applied outside the inbox's transaction",
    ),
    (
        "a kill after a produce ack",
        Evidence::Confirmed("kafka.kill_after_produce_ack"),
        "a new event id on a publish again",
    ),
    ("a reordered commit (a writer's, overtaken)", Evidence::Overtaken, "an insert-ordered cursor (seq) in a relay"),
    ("a commit held while offsets move", Evidence::ConsumerHold, "offsets left to auto-commit"),
    (
        "a zombie's transaction (a consumer stopped inside it)",
        Evidence::Confirmed("db.pause_in_transaction"),
        "an inbox read, then written, with no unique guard (check-then-act)",
    ),
    (
        "a key's events delivered out of order",
        Evidence::ReorderedKeys,
        "a projection that keeps the last event it handled (last-write-wins)",
    ),
];

/// What the harness must have seen for a window to count as struck.
#[derive(Clone, Copy)]
enum Evidence {
    /// The point's firings confirmed: for a kill, its process seen ending
    /// by SIGKILL in the window.
    Confirmed(&'static str),
    /// A writer's held COMMIT that went on after another writer committed
    /// rows: a row inserted later was visible first.
    Overtaken,
    /// A consumer's held COMMIT that ran its course or was killed when its
    /// offsets moved (a relay's or a service's is not one).
    ConsumerHold,
    /// Keys whose `authorized` the topic carries after their `captured`.
    ReorderedKeys,
}

impl Evidence {
    /// Whether a fault that can open the window was set.
    fn set(self, r: &Report) -> bool {
        let rate = |p: &str| r.faults.iter().any(|f| f.point == p && f.probability > 0.0);
        match self {
            Evidence::Confirmed(p) => rate(p),
            Evidence::Overtaken => rate("workload.slow_commit") || (rate("db.hold_commit") && r.shown.writers_held),
            Evidence::ConsumerHold => rate("db.hold_commit"),
            Evidence::ReorderedKeys => rate("relay.slow_produce"),
        }
    }

    /// Whether the harness saw the window struck.
    fn seen(self, r: &Report) -> bool {
        let confirmed = |p: &str| r.faults.iter().filter(|f| f.point == p).map(|f| f.confirmed).sum::<u64>();
        match self {
            Evidence::Confirmed(p) => confirmed(p) > 0,
            Evidence::Overtaken => r.components.writer_holds_overtaken > 0,
            Evidence::ConsumerHold => r.components.consumer_holds > 0,
            Evidence::ReorderedKeys => r.counts.reordered_payments > 0,
        }
    }
}

/// A stretch without a kill this long, from the first kill to the end of
/// the drain, gives a bug kept in memory (a cursor, a dedup set) time to
/// show after the last restart healed it.
const CALM_MS: u64 = 10_000;

/// "windows: struck a kill after a commit with changes, …; not struck: …"
/// and "can expose: …"; None for a run without kills or aimed strikes.
pub fn lines(r: &Report) -> Option<String> {
    let mut struck = Vec::new();
    let mut missed = Vec::new();
    let mut exposes = Vec::new();
    for (window, evidence, mistakes) in WINDOWS {
        if evidence.seen(r) {
            struck.push(*window);
            exposes.push(*mistakes);
        } else if evidence.set(r) {
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
        r.shown = crate::report::shown::Shown::payments(&r);
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
        r.counts.reordered_payments = 0;
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

    /// The planted run of issue 63: every writer's hold fired and was
    /// pre-empted, while the consumers' holds ran their course. The report
    /// claims the consumers' window, never a reordered commit; a writer's
    /// hold that went on but that nothing overtook proves no reorder
    /// either; one overtake does.
    #[test]
    fn a_reordered_commit_is_claimed_only_from_an_overtake_seen() {
        let mut r = report(&[("db.hold_commit", 0.05, 3), ("workload.slow_commit", 0.1, 0)], &[], 30_000);
        let hold = r.faults.iter_mut().find(|f| f.point == "db.hold_commit").unwrap();
        (hold.fired, hold.preempted) = (9, 6);
        r.fault_log = (0..6)
            .map(|i| crate::faults::FaultRecord {
                point: "db.hold_commit".into(),
                component: "service-1".into(),
                at_ms: 1_000 * i,
                hit: "a COMMIT, held".into(),
                occurrence: None,
                reach: Default::default(),
            })
            .collect();
        r.components.consumer_holds = 3;
        let text = lines(&r).unwrap();
        assert!(text.contains("struck a commit held while offsets move"), "{text}");
        assert!(text.contains("set but not struck: a reordered commit"), "{text}");
        assert!(!text.contains("insert-ordered cursor"), "{text}");
        // Three holds went on, all of them a writer's or a relay's, none
        // overtaken: neither window was struck.
        (r.components.writer_holds, r.components.consumer_holds) = (3, 0);
        let text = lines(&r).unwrap();
        assert!(!text.contains("insert-ordered cursor"), "a hold nothing overtook: {text}");
        assert!(!text.contains("struck a commit held"), "no consumer's commit was held: {text}");
        (r.components.writer_holds_overtaken, r.components.overtakes) = (1, 4);
        let text = lines(&r).unwrap();
        assert!(text.contains("a reordered commit (a writer's, overtaken)"), "{text}");
        assert!(text.contains("an insert-ordered cursor"), "{text}");
    }

    /// A zombie's transaction is claimed only once a process woke with its
    /// transaction open (the proxy confirms it then): a pause whose
    /// process died, or that was never seen stopped, claims nothing.
    #[test]
    fn a_zombies_transaction_is_claimed_only_once_one_woke_inside_it() {
        let mut r = report(&[("db.pause_in_transaction", 0.04, 0)], &[], 30_000);
        r.faults[0].fired = 2;
        let text = lines(&r).unwrap();
        assert!(text.contains("set but not struck: a zombie's transaction"), "{text}");
        assert!(!text.contains("check-then-act"), "{text}");
        r.faults[0].confirmed = 1;
        let text = lines(&r).unwrap();
        assert!(text.contains("struck a zombie's transaction"), "{text}");
        assert!(text.contains("check-then-act"), "{text}");
    }

    /// Keys delivered out of order are claimed only when the topic carried
    /// some: a slow produce that reordered nothing claims nothing.
    #[test]
    fn reordered_keys_are_claimed_from_the_topic() {
        let mut r = report(&[("relay.slow_produce", 0.1, 4)], &[], 30_000);
        let text = lines(&r).unwrap();
        assert!(text.contains("set but not struck: a key's events delivered out of order"), "{text}");
        assert!(!text.contains("last-write-wins"), "{text}");
        r.counts.reordered_payments = 12;
        assert!(lines(&r).unwrap().contains("last-write-wins"));
    }
}
