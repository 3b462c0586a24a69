//! From ground truth to verdict, with no I/O: every check here can be fed
//! hand-made rows and messages, and every check can fail on its own.

use super::topic::TopicRecord;
use crate::events::EventKind;
use crate::faults::{FaultPoint, FaultSummary};
use crate::store::{handlers_for, DbTruth, HANDLERS};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap, HashSet};
use uuid::Uuid;

/// At most this many examples per anomaly: enough to go and look.
pub const EXAMPLES: usize = 5;

/// The figures of a run, all read from the ground truth.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    pub payments: u64,
    pub payments_captured: u64,
    pub outbox_events: u64,
    pub unpublished: u64,
    pub poison_events: u64,
    pub topic_messages: u64,
    pub topic_distinct_events: u64,
    pub topic_duplicates: u64,
    pub inbox_rows: u64,
    pub inbox_rows_by_handler: BTreeMap<String, u64>,
    pub receipts: u64,
    pub payments_with_one_receipt: u64,
    pub payments_without_receipt: u64,
    pub payments_with_many_receipts: u64,
    pub projection_captured: u64,
    pub reordered_payments: u64,
    /// Payments with an event absent from the topic (by key and type).
    pub payments_missing_events: u64,
    pub dead_letters: u64,
    pub loyalty_points: i64,
    pub loyalty_points_expected: i64,
}

/// A property that must hold, with what was expected and what was found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Invariant {
    pub name: String,
    pub expected: String,
    pub actual: String,
    pub ok: bool,
}

impl Invariant {
    fn eq<T: PartialEq + ToString>(name: &str, expected: T, actual: T) -> Self {
        let ok = expected == actual;
        Self { name: name.to_string(), expected: expected.to_string(), actual: actual.to_string(), ok }
    }
}

/// A named violation, with examples an engineer can look up.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Anomaly {
    /// One of the documented names: `lost event`, `foreign event`,
    /// `unpublished leftover`, `duplicate effect`, `missing effect`,
    /// `stale projection`, `inbox mismatch`, `dead letter mismatch`,
    /// `counter drift`.
    pub name: String,
    pub count: u64,
    pub examples: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
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

    pub fn exit(self) -> crate::exit::Exit {
        use crate::exit::Exit;
        match self {
            Verdict::Pass => Exit::Pass,
            Verdict::Fail => Exit::Fail,
            Verdict::Inconclusive => Exit::Inconclusive,
            Verdict::Incomplete => Exit::Incomplete,
            Verdict::Interrupted => Exit::Interrupted,
        }
    }
}

/// What the verifier concluded from the ground truth.
#[derive(Debug, Clone, Default)]
pub struct Reconciliation {
    pub counts: Counts,
    pub invariants: Vec<Invariant>,
    pub anomalies: Vec<Anomaly>,
}

struct AnomalyBuilder {
    name: &'static str,
    count: u64,
    examples: Vec<String>,
}

impl AnomalyBuilder {
    fn new(name: &'static str) -> Self {
        Self { name, count: 0, examples: Vec::new() }
    }
    fn hit(&mut self, example: impl FnOnce() -> String) {
        self.count += 1;
        if self.examples.len() < EXAMPLES {
            self.examples.push(example());
        }
    }
    fn push_into(self, out: &mut Vec<Anomaly>) {
        if self.count > 0 {
            out.push(Anomaly { name: self.name.into(), count: self.count, examples: self.examples });
        }
    }
}

/// Where a payment's messages sit on the topic, for examples.
fn locate(topic_by_payment: &HashMap<Uuid, Vec<(i32, i64, Option<EventKind>)>>, payment: Uuid) -> String {
    match topic_by_payment.get(&payment) {
        None => "no message on the topic".into(),
        Some(v) => {
            let parts: Vec<String> = v
                .iter()
                .take(6)
                .map(|(p, o, k)| format!("{}@{p}:{o}", k.map(|k| k.status()).unwrap_or("malformed")))
                .collect();
            parts.join(" ")
        }
    }
}

/// Reconciles the database with the topic.
pub fn reconcile(db: &DbTruth, topic: &[TopicRecord]) -> Reconciliation {
    let mut c = Counts::default();
    let mut anomalies = Vec::new();

    c.payments = db.payments.len() as u64;
    c.payments_captured = db.payments.iter().filter(|p| p.captured).count() as u64;
    c.outbox_events = db.outbox.len() as u64;
    c.unpublished = db.outbox.iter().filter(|o| !o.published).count() as u64;
    c.poison_events = db.outbox.iter().filter(|o| o.kind.is_none()).count() as u64;

    // The topic: duplicates, foreign ids, and where each payment's events sit.
    let outbox_ids: HashSet<Uuid> = db.outbox.iter().map(|o| o.id).collect();
    let mut seen: HashSet<Uuid> = HashSet::with_capacity(topic.len());
    let mut foreign = AnomalyBuilder::new("foreign event");
    let mut by_payment: HashMap<Uuid, Vec<(i32, i64, Option<EventKind>)>> = HashMap::new();
    for m in topic {
        c.topic_messages += 1;
        match m.event_id {
            Some(id) if outbox_ids.contains(&id) => {
                seen.insert(id);
            }
            Some(id) => foreign.hit(|| format!("event {id} at partition {} offset {}", m.partition, m.offset)),
            None => {
                foreign.hit(|| format!("message without an event id at partition {} offset {}", m.partition, m.offset))
            }
        }
        if let Some(p) = m.payment_id {
            by_payment.entry(p).or_default().push((m.partition, m.offset, m.kind));
        }
    }
    c.topic_distinct_events = seen.len() as u64;
    let with_ids = topic.iter().filter(|m| m.event_id.map(|i| outbox_ids.contains(&i)).unwrap_or(false)).count() as u64;
    c.topic_duplicates = with_ids - c.topic_distinct_events;

    // Reordering: an `authorized` message at a later offset than a `captured`
    // one of the same payment (same key, so same partition).
    for msgs in by_payment.values() {
        let last_auth =
            msgs.iter().filter(|m| m.2 == Some(EventKind::Authorized)).map(|m| (m.0, m.1)).max_by_key(|m| m.1);
        let first_cap =
            msgs.iter().filter(|m| m.2 == Some(EventKind::Captured)).map(|m| (m.0, m.1)).min_by_key(|m| m.1);
        if let (Some(a), Some(k)) = (last_auth, first_cap) {
            if a.0 == k.0 && a.1 > k.1 {
                c.reordered_payments += 1;
            }
        }
    }

    let mut lost = AnomalyBuilder::new("lost event");
    let mut leftover = AnomalyBuilder::new("unpublished leftover");
    for o in &db.outbox {
        if !seen.contains(&o.id) {
            lost.hit(|| {
                format!(
                    "event {} ({}) of payment {}",
                    o.id,
                    o.kind.map(|k| k.status()).unwrap_or("malformed"),
                    o.payment_id
                )
            });
        }
        if !o.published {
            leftover.hit(|| format!("event {} of payment {}", o.id, o.payment_id));
        }
    }
    // Payment by payment too: each payment's events must be on the topic,
    // whatever the outbox says (a dual write has no outbox to compare with).
    let mut payments_missing_events = 0u64;
    for p in &db.payments {
        let kinds: HashSet<EventKind> =
            by_payment.get(&p.id).map(|v| v.iter().filter_map(|m| m.2).collect()).unwrap_or_default();
        let mut want = vec![EventKind::Authorized];
        if p.captured {
            want.push(EventKind::Captured);
        }
        let missing: Vec<&str> = want.iter().filter(|k| !kinds.contains(k)).map(|k| k.status()).collect();
        if !missing.is_empty() {
            payments_missing_events += 1;
            lost.hit(|| format!("payment {}: no {} message on the topic", p.id, missing.join(" or ")));
        }
    }
    c.payments_missing_events = payments_missing_events;
    let lost_count = lost.count;

    // Effects: receipts per captured payment.
    c.receipts = db.receipts.values().sum();
    let mut dup = AnomalyBuilder::new("duplicate effect");
    let mut missing = AnomalyBuilder::new("missing effect");
    let mut stale = AnomalyBuilder::new("stale projection");
    let captured: HashSet<Uuid> = db.payments.iter().filter(|p| p.captured).map(|p| p.id).collect();
    for p in db.payments.iter().filter(|p| p.captured) {
        match db.receipts.get(&p.id).copied().unwrap_or(0) {
            0 => {
                c.payments_without_receipt += 1;
                missing.hit(|| format!("payment {}: no receipt; topic: {}", p.id, locate(&by_payment, p.id)));
            }
            1 => c.payments_with_one_receipt += 1,
            n => {
                c.payments_with_many_receipts += 1;
                dup.hit(|| format!("payment {}: {n} receipts; topic: {}", p.id, locate(&by_payment, p.id)));
            }
        }
        if db.projection.get(&p.id).copied().unwrap_or(false) {
            c.projection_captured += 1;
        } else {
            let shown = match db.projection.get(&p.id) {
                Some(_) => "authorized",
                None => "absent",
            };
            stale.hit(|| format!("payment {}: projection {shown}; topic: {}", p.id, locate(&by_payment, p.id)));
        }
    }
    // Receipts for payments that were never captured are duplicates of nothing.
    for (pid, n) in &db.receipts {
        if !captured.contains(pid) {
            dup.hit(|| format!("payment {pid}: {n} receipts but not captured"));
        }
    }

    // Inbox rows per handler against the distinct valid events it handles.
    let mut expected_inbox: BTreeMap<String, u64> = HANDLERS.iter().map(|h| (h.to_string(), 0)).collect();
    for o in &db.outbox {
        if let Some(k) = o.kind {
            for h in handlers_for(k) {
                *expected_inbox.entry(h.to_string()).or_default() += 1;
            }
        }
    }
    c.inbox_rows = db.inbox_rows.values().sum();
    c.inbox_rows_by_handler =
        HANDLERS.iter().map(|h| (h.to_string(), db.inbox_rows.get(*h).copied().unwrap_or(0))).collect();
    let mut inbox_mismatch = AnomalyBuilder::new("inbox mismatch");
    for (h, want) in &expected_inbox {
        let got = c.inbox_rows_by_handler.get(h).copied().unwrap_or(0);
        if got != *want {
            inbox_mismatch.hit(|| format!("handler {h}: {got} inbox rows for {want} distinct events"));
        }
    }

    c.dead_letters = db.dead_letters;
    let mut dl = AnomalyBuilder::new("dead letter mismatch");
    if c.dead_letters != c.poison_events {
        dl.hit(|| format!("{} dead letters for {} malformed events", c.dead_letters, c.poison_events));
    }

    // The non-idempotent counter, per account.
    let mut want_points: BTreeMap<i32, i64> = BTreeMap::new();
    for p in db.payments.iter().filter(|p| p.captured) {
        *want_points.entry(p.account_id).or_default() += p.amount_cents;
    }
    c.loyalty_points = db.loyalty.values().sum();
    c.loyalty_points_expected = want_points.values().sum();
    let mut drift = AnomalyBuilder::new("counter drift");
    let accounts: HashSet<i32> = want_points.keys().chain(db.loyalty.keys()).copied().collect();
    let mut accounts: Vec<i32> = accounts.into_iter().collect();
    accounts.sort_unstable();
    for a in accounts {
        let want = want_points.get(&a).copied().unwrap_or(0);
        let got = db.loyalty.get(&a).copied().unwrap_or(0);
        if want != got {
            drift.hit(|| format!("account {a}: {got} points, expected {want}"));
        }
    }

    let invariants = vec![
        Invariant::eq("no lost events (outbox events missing from the topic)", 0, lost_count - payments_missing_events),
        Invariant::eq("every payment's events on the topic", 0, payments_missing_events),
        Invariant::eq("no foreign events (topic events not in the outbox)", 0, foreign.count),
        Invariant::eq("no unpublished leftovers", 0, c.unpublished),
        Invariant::eq("every payment captured", c.payments, c.payments_captured),
        Invariant::eq("exactly one receipt per captured payment", c.payments_captured, c.payments_with_one_receipt),
        Invariant::eq("receipts sent", c.payments_captured, c.receipts),
        Invariant::eq(
            "inbox rows = distinct events, per handler",
            fmt_map(&expected_inbox),
            fmt_map(&c.inbox_rows_by_handler),
        ),
        Invariant::eq("projection shows captured", c.payments_captured, c.projection_captured),
        Invariant::eq("dead letters = malformed events injected", c.poison_events, c.dead_letters),
        Invariant::eq("loyalty points = sum of captured amounts", c.loyalty_points_expected, c.loyalty_points),
    ];

    for b in [lost, foreign, leftover, dup, missing, stale, inbox_mismatch, dl, drift] {
        b.push_into(&mut anomalies);
    }
    Reconciliation { counts: c, invariants, anomalies }
}

fn fmt_map(m: &BTreeMap<String, u64>) -> String {
    m.iter().map(|(k, v)| format!("{k} {v}")).collect::<Vec<_>>().join(", ")
}

/// "The chaos happened": every fault point with a probability above zero
/// fired, and relay crashes left duplicates on the topic. A run that fails
/// these proves nothing and is inconclusive.
pub fn chaos_checks(faults: &[FaultSummary], counts: &Counts) -> Vec<Invariant> {
    let mut out = Vec::new();
    for f in faults.iter().filter(|f| f.probability > 0.0) {
        out.push(Invariant {
            name: format!("fault {} fired", f.point),
            expected: "at least 1".into(),
            actual: f.fired.to_string(),
            ok: f.fired > 0,
        });
    }
    let relay = faults.iter().find(|f| f.point == FaultPoint::RelayAfterProduce.name());
    if let Some(r) = relay.filter(|r| r.fired > 0) {
        out.push(Invariant {
            name: format!("relay crashes ({}) left duplicates on the topic", r.fired),
            expected: "more than 0".into(),
            actual: counts.topic_duplicates.to_string(),
            ok: counts.topic_duplicates > 0,
        });
    }
    out
}

/// The verdict, and one line saying why.
pub fn verdict(exactly_once: bool, invariants: &[Invariant], chaos: &[Invariant]) -> (Verdict, String) {
    let violated: Vec<&str> = invariants.iter().filter(|i| !i.ok).map(|i| i.name.as_str()).collect();
    let quiet: Vec<&str> = chaos.iter().filter(|i| !i.ok).map(|i| i.name.as_str()).collect();
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
    use crate::store::{OutboxRecord, PaymentRow};

    /// A healthy world: `n` payments, both events on the topic once, one
    /// receipt each, projection captured, inbox and counter in step.
    fn healthy(n: usize) -> (DbTruth, Vec<TopicRecord>) {
        let mut db = DbTruth::default();
        let mut topic = Vec::new();
        for i in 0..n {
            let pid = Uuid::from_u128(1000 + i as u128);
            db.payments.push(PaymentRow { id: pid, account_id: (i % 3) as i32, amount_cents: 100, captured: true });
            for (j, kind) in [EventKind::Authorized, EventKind::Captured].into_iter().enumerate() {
                let id = Uuid::from_u128(((i as u128) << 8) | j as u128 | 1 << 100);
                db.outbox.push(OutboxRecord { id, payment_id: pid, kind: Some(kind), published: true });
                let offset = topic.len() as i64;
                topic.push(TopicRecord {
                    partition: 0,
                    offset,
                    event_id: Some(id),
                    payment_id: Some(pid),
                    kind: Some(kind),
                });
            }
            db.receipts.insert(pid, 1);
            db.projection.insert(pid, true);
            *db.loyalty.entry((i % 3) as i32).or_default() += 100;
        }
        db.inbox_rows.insert("projection".into(), 2 * n as u64);
        db.inbox_rows.insert("receipts".into(), n as u64);
        db.inbox_rows.insert("loyalty".into(), n as u64);
        (db, topic)
    }

    fn failing(r: &Reconciliation) -> Vec<String> {
        r.invariants.iter().filter(|i| !i.ok).map(|i| i.name.clone()).collect()
    }

    #[test]
    fn healthy_world_holds_every_invariant() {
        let (db, topic) = healthy(10);
        let r = reconcile(&db, &topic);
        assert!(failing(&r).is_empty(), "{:?}", failing(&r));
        assert!(r.anomalies.is_empty());
        assert_eq!(r.counts.topic_messages, 20);
        assert_eq!(r.counts.topic_duplicates, 0);
        assert_eq!(r.counts.reordered_payments, 0);
    }

    #[test]
    fn replayed_batch_counts_duplicates_and_reordering_but_no_violation() {
        let (db, mut topic) = healthy(3);
        // The first payment's batch (authorized, captured) is replayed whole.
        let replay: Vec<TopicRecord> = topic[0..2].to_vec();
        for mut m in replay {
            m.offset = topic.len() as i64;
            topic.push(m);
        }
        let r = reconcile(&db, &topic);
        assert!(failing(&r).is_empty());
        assert_eq!(r.counts.topic_duplicates, 2);
        assert_eq!(r.counts.reordered_payments, 1);
    }

    #[test]
    fn lost_event_fails_alone() {
        let (db, mut topic) = healthy(4);
        topic.remove(3);
        let r = reconcile(&db, &topic);
        assert_eq!(
            failing(&r),
            vec!["no lost events (outbox events missing from the topic)", "every payment's events on the topic"]
        );
        assert_eq!(r.anomalies[0].name, "lost event");
        assert_eq!(r.anomalies[0].count, 2, "the event, and the payment missing it");
    }

    #[test]
    fn foreign_event_fails_alone() {
        let (db, mut topic) = healthy(2);
        topic.push(TopicRecord { partition: 0, offset: 99, event_id: Some(Uuid::nil()), payment_id: None, kind: None });
        let r = reconcile(&db, &topic);
        assert_eq!(failing(&r), vec!["no foreign events (topic events not in the outbox)"]);
    }

    #[test]
    fn unpublished_leftover_fails_alone() {
        let (mut db, topic) = healthy(2);
        db.outbox[1].published = false;
        let r = reconcile(&db, &topic);
        assert_eq!(failing(&r), vec!["no unpublished leftovers"]);
    }

    #[test]
    fn duplicate_receipt_fails_with_an_example() {
        let (mut db, topic) = healthy(5);
        let pid = db.payments[2].id;
        db.receipts.insert(pid, 2);
        let r = reconcile(&db, &topic);
        assert_eq!(failing(&r), vec!["exactly one receipt per captured payment", "receipts sent"]);
        let a = r.anomalies.iter().find(|a| a.name == "duplicate effect").unwrap();
        assert!(a.examples[0].contains(&pid.to_string()), "{:?}", a.examples);
        assert!(a.examples[0].contains("captured@0:"), "{:?}", a.examples);
    }

    #[test]
    fn missing_receipt_fails() {
        let (mut db, topic) = healthy(5);
        db.receipts.remove(&db.payments[0].id.clone());
        let r = reconcile(&db, &topic);
        assert!(failing(&r).contains(&"exactly one receipt per captured payment".to_string()));
        assert_eq!(r.counts.payments_without_receipt, 1);
        assert!(r.anomalies.iter().any(|a| a.name == "missing effect"));
    }

    #[test]
    fn stale_projection_fails_alone() {
        let (mut db, topic) = healthy(3);
        db.projection.insert(db.payments[1].id, false);
        let r = reconcile(&db, &topic);
        assert_eq!(failing(&r), vec!["projection shows captured"]);
        assert_eq!(r.anomalies[0].name, "stale projection");
    }

    #[test]
    fn inbox_mismatch_fails_alone() {
        let (mut db, topic) = healthy(3);
        db.inbox_rows.insert("receipts".into(), 2);
        let r = reconcile(&db, &topic);
        assert_eq!(failing(&r), vec!["inbox rows = distinct events, per handler"]);
    }

    #[test]
    fn dead_letters_must_match_poison() {
        let (mut db, topic) = healthy(2);
        db.dead_letters = 1;
        let r = reconcile(&db, &topic);
        assert_eq!(failing(&r), vec!["dead letters = malformed events injected"]);
    }

    #[test]
    fn counter_drift_fails_alone() {
        let (mut db, topic) = healthy(3);
        *db.loyalty.get_mut(&1).unwrap() += 100;
        let r = reconcile(&db, &topic);
        assert_eq!(failing(&r), vec!["loyalty points = sum of captured amounts"]);
        assert!(r.anomalies[0].examples[0].starts_with("account 1: 200 points, expected 100"));
    }

    #[test]
    fn uncaptured_payment_fails() {
        let (mut db, topic) = healthy(3);
        db.payments[0].captured = false;
        let r = reconcile(&db, &topic);
        assert!(failing(&r).contains(&"every payment captured".to_string()));
    }

    fn fs(point: FaultPoint, p: f64, fired: u64) -> FaultSummary {
        FaultSummary { point: point.name().into(), unit: point.unit().into(), probability: p, occurrences: 10, fired }
    }

    #[test]
    fn chaos_checks_and_verdicts() {
        let counts = Counts { topic_duplicates: 0, ..Default::default() };
        let quiet = chaos_checks(&[fs(FaultPoint::RelayAfterProduce, 0.1, 0)], &counts);
        assert!(!quiet[0].ok);
        let ok_inv = vec![Invariant::eq("x", 1, 1)];
        let bad_inv = vec![Invariant::eq("x", 1, 2)];
        assert_eq!(verdict(true, &ok_inv, &quiet).0, Verdict::Inconclusive);
        assert_eq!(verdict(true, &bad_inv, &quiet).0, Verdict::Fail);
        let fired = chaos_checks(&[fs(FaultPoint::RelayAfterProduce, 0.1, 3)], &counts);
        assert_eq!(fired.len(), 2);
        assert!(!fired[1].ok, "crashes without duplicates must not count as chaos");
        let dup = Counts { topic_duplicates: 5, ..Default::default() };
        let good =
            chaos_checks(&[fs(FaultPoint::RelayAfterProduce, 0.1, 3), fs(FaultPoint::WorkloadPoison, 0.0, 0)], &dup);
        assert!(good.iter().all(|i| i.ok));
        assert_eq!(verdict(true, &ok_inv, &good).0, Verdict::Pass);
        assert_eq!(verdict(false, &bad_inv, &good).0, Verdict::Pass);
        assert_eq!(verdict(false, &ok_inv, &good).0, Verdict::Fail);
        assert_eq!(verdict(false, &ok_inv, &quiet).0, Verdict::Inconclusive);
    }
}
