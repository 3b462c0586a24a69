//! From ground truth to verdict, with no I/O: every check here can be fed
//! hand-made rows and messages, and every check can fail on its own.

use super::topic::TopicRecord;
use crate::events::EventKind;
use crate::faults::{FaultPoint, FaultSummary};
use crate::store::{handlers_for, OutboxRecord, PaymentRow, HANDLERS};
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

#[derive(Debug)]
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

/// Marks an index "not in the payments table".
const NONE: u32 = u32::MAX;

/// One payment, compact: the verifier holds one per payment.
#[derive(Debug, Clone, Copy)]
struct PaymentEntry {
    id: Uuid,
    amount_cents: i64,
    account_id: i32,
    receipts: u32,
    captured: bool,
    /// What the projection shows: 0 absent, 1 authorized, 2 captured.
    projection: u8,
}

/// One outbox event, compact: 24 bytes.
#[derive(Debug, Clone, Copy)]
struct EventEntry {
    id: Uuid,
    /// Index into the payments, or [`NONE`].
    payment: u32,
    kind: Option<EventKind>,
    published: bool,
    /// Copies of it on the topic (saturating: only zero matters).
    seen: u8,
}

/// One message on the topic that carries a known payment's key: 16 bytes.
#[derive(Debug, Clone, Copy)]
struct MessageEntry {
    offset: i64,
    payment: u32,
    partition: u16,
    kind: Option<EventKind>,
}

/// The ground truth, kept compact and fed row by row, so that the verifier's
/// memory grows with a few dozen bytes per payment and per message, never
/// with whole rows. Feed it in this order: payments, then outbox events,
/// then the rest of the database, then the topic; then [`Ledger::reconcile`].
#[derive(Debug, Default)]
pub struct Ledger {
    payments: Vec<PaymentEntry>,
    payments_sorted: bool,
    events: Vec<EventEntry>,
    events_sorted: bool,
    /// Receipts of payments absent from the payments table.
    stray_receipts: Vec<(Uuid, u64)>,
    inbox_rows: HashMap<String, u64>,
    dead_letters: u64,
    loyalty: HashMap<i32, i64>,
    messages: Vec<MessageEntry>,
    topic_messages: u64,
    /// Messages whose event id is an outbox event.
    topic_known: u64,
    foreign: Option<AnomalyBuilder>,
}

/// Sorts `entries` by id unless `sorted` says they already are.
fn sort_once<T>(entries: &mut [T], sorted: &mut bool, id: impl Fn(&T) -> Uuid) {
    if !*sorted {
        entries.sort_unstable_by_key(id);
        *sorted = true;
    }
}

impl Ledger {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn add_payment(&mut self, p: PaymentRow) {
        debug_assert!(self.events.is_empty(), "payments come before outbox events");
        self.payments_sorted = false;
        self.payments.push(PaymentEntry {
            id: p.id,
            amount_cents: p.amount_cents,
            account_id: p.account_id,
            receipts: 0,
            captured: p.captured,
            projection: 0,
        });
    }

    /// Sorts the payments by id once they are all in; indexes into them
    /// are taken only after.
    fn sort_payments(&mut self) {
        sort_once(&mut self.payments, &mut self.payments_sorted, |p| p.id);
    }

    fn payment(&mut self, id: Uuid) -> Option<usize> {
        self.sort_payments();
        self.payments.binary_search_by_key(&id, |p| p.id).ok()
    }

    pub fn add_event(&mut self, o: OutboxRecord) {
        debug_assert!(self.messages.is_empty(), "outbox events come before the topic");
        let payment = self.payment(o.payment_id).map(|i| i as u32).unwrap_or(NONE);
        self.events_sorted = false;
        self.events.push(EventEntry { id: o.id, payment, kind: o.kind, published: o.published, seen: 0 });
    }

    fn sort_events(&mut self) {
        sort_once(&mut self.events, &mut self.events_sorted, |e| e.id);
    }

    fn event(&mut self, id: Uuid) -> Option<usize> {
        self.sort_events();
        self.events.binary_search_by_key(&id, |e| e.id).ok()
    }

    /// `n` receipt rows for a payment.
    pub fn add_receipts(&mut self, payment: Uuid, n: u64) {
        match self.payment(payment) {
            Some(i) => {
                self.payments[i].receipts = self.payments[i].receipts.saturating_add(n.min(u32::MAX as u64) as u32)
            }
            None => self.stray_receipts.push((payment, n)),
        }
    }

    /// The projection's row for a payment (rows of unknown payments are ignored).
    pub fn add_projection(&mut self, payment: Uuid, captured: bool) {
        if let Some(i) = self.payment(payment) {
            self.payments[i].projection = if captured { 2 } else { 1 };
        }
    }

    pub fn add_inbox_rows(&mut self, handler: &str, n: u64) {
        *self.inbox_rows.entry(handler.to_string()).or_default() += n;
    }

    pub fn add_dead_letters(&mut self, n: u64) {
        self.dead_letters += n;
    }

    pub fn add_loyalty(&mut self, account: i32, points: i64) {
        *self.loyalty.entry(account).or_default() += points;
    }

    /// One message read from the topic.
    pub fn add_message(&mut self, m: TopicRecord) {
        self.topic_messages += 1;
        let known = m.event_id.and_then(|id| self.event(id));
        let foreign = self.foreign.get_or_insert_with(|| AnomalyBuilder::new("foreign event"));
        match (known, m.event_id) {
            (Some(i), _) => {
                self.topic_known += 1;
                self.events[i].seen = self.events[i].seen.saturating_add(1);
            }
            (None, Some(id)) => foreign.hit(|| format!("event {id} at partition {} offset {}", m.partition, m.offset)),
            (None, None) => {
                foreign.hit(|| format!("message without an event id at partition {} offset {}", m.partition, m.offset))
            }
        }
        if let Some(i) = m.payment_id.and_then(|p| self.payment(p)) {
            // Partitions fit: a scenario has at most 1,024.
            let partition = m.partition.clamp(0, u16::MAX as i32) as u16;
            self.messages.push(MessageEntry { offset: m.offset, payment: i as u32, partition, kind: m.kind });
        }
    }

    /// Reconciles the database with the topic.
    pub fn reconcile(mut self) -> Reconciliation {
        // Examples then come out in id order, whatever was looked up.
        self.sort_payments();
        self.sort_events();
        let mut c = Counts::default();
        let mut anomalies = Vec::new();
        let (payments, events) = (&self.payments, &self.events);

        c.payments = payments.len() as u64;
        c.payments_captured = payments.iter().filter(|p| p.captured).count() as u64;
        c.outbox_events = events.len() as u64;
        c.unpublished = events.iter().filter(|o| !o.published).count() as u64;
        c.poison_events = events.iter().filter(|o| o.kind.is_none()).count() as u64;
        c.topic_messages = self.topic_messages;
        c.topic_distinct_events = events.iter().filter(|e| e.seen > 0).count() as u64;
        c.topic_duplicates = self.topic_known - c.topic_distinct_events;
        let foreign = self.foreign.take().unwrap_or_else(|| AnomalyBuilder::new("foreign event"));

        let payment_id =
            |i: u32| payments.get(i as usize).map(|p| p.id.to_string()).unwrap_or_else(|| "unknown".into());
        let mut lost = AnomalyBuilder::new("lost event");
        let mut leftover = AnomalyBuilder::new("unpublished leftover");
        for o in events {
            if o.seen == 0 {
                lost.hit(|| {
                    let kind = o.kind.map(|k| k.status()).unwrap_or("malformed");
                    format!("event {} ({kind}) of payment {}", o.id, payment_id(o.payment))
                });
            }
            if !o.published {
                leftover.hit(|| format!("event {} of payment {}", o.id, payment_id(o.payment)));
            }
        }

        // Payment by payment, with its messages side by side: the messages
        // sorted by payment, then by place on the topic.
        self.messages.sort_unstable_by_key(|m| (m.payment, m.partition, m.offset));
        let messages = &self.messages;
        let mut dup = AnomalyBuilder::new("duplicate effect");
        let mut missing = AnomalyBuilder::new("missing effect");
        let mut stale = AnomalyBuilder::new("stale projection");
        let mut want_points: BTreeMap<i32, i64> = BTreeMap::new();
        let mut at = 0;
        for (i, p) in payments.iter().enumerate() {
            let start = at;
            while at < messages.len() && messages[at].payment == i as u32 {
                at += 1;
            }
            let msgs = &messages[start..at];
            if reordered(msgs) {
                c.reordered_payments += 1;
            }
            // Each payment's events must be on the topic, whatever the outbox
            // says (a dual write has no outbox to compare with).
            let has = |k: EventKind| msgs.iter().any(|m| m.kind == Some(k));
            let mut want = vec![EventKind::Authorized];
            if p.captured {
                want.push(EventKind::Captured);
            }
            let absent: Vec<&str> = want.iter().filter(|k| !has(**k)).map(|k| k.status()).collect();
            if !absent.is_empty() {
                c.payments_missing_events += 1;
                lost.hit(|| format!("payment {}: no {} message on the topic", p.id, absent.join(" or ")));
            }
            if !p.captured {
                if p.receipts > 0 {
                    // Receipts for a payment never captured are duplicates of nothing.
                    dup.hit(|| format!("payment {}: {} receipts but not captured", p.id, p.receipts));
                }
                continue;
            }
            *want_points.entry(p.account_id).or_default() += p.amount_cents;
            match p.receipts {
                0 => {
                    c.payments_without_receipt += 1;
                    missing.hit(|| format!("payment {}: no receipt; topic: {}", p.id, locate(msgs)));
                }
                1 => c.payments_with_one_receipt += 1,
                n => {
                    c.payments_with_many_receipts += 1;
                    dup.hit(|| format!("payment {}: {n} receipts; topic: {}", p.id, locate(msgs)));
                }
            }
            match p.projection {
                2 => c.projection_captured += 1,
                shown => {
                    let shown = if shown == 1 { "authorized" } else { "absent" };
                    stale.hit(|| format!("payment {}: projection {shown}; topic: {}", p.id, locate(msgs)));
                }
            }
        }
        for (pid, n) in &self.stray_receipts {
            dup.hit(|| format!("payment {pid}: {n} receipts but not captured"));
        }
        c.receipts = payments.iter().map(|p| p.receipts as u64).sum::<u64>()
            + self.stray_receipts.iter().map(|(_, n)| n).sum::<u64>();
        let lost_count = lost.count;

        // Inbox rows per handler against the distinct valid events it handles.
        let mut expected_inbox: BTreeMap<String, u64> = HANDLERS.iter().map(|h| (h.to_string(), 0)).collect();
        for k in events.iter().filter_map(|o| o.kind) {
            for h in handlers_for(k) {
                *expected_inbox.entry(h.to_string()).or_default() += 1;
            }
        }
        c.inbox_rows = self.inbox_rows.values().sum();
        c.inbox_rows_by_handler =
            HANDLERS.iter().map(|h| (h.to_string(), self.inbox_rows.get(*h).copied().unwrap_or(0))).collect();
        let mut inbox_mismatch = AnomalyBuilder::new("inbox mismatch");
        for (h, want) in &expected_inbox {
            let got = c.inbox_rows_by_handler.get(h).copied().unwrap_or(0);
            if got != *want {
                inbox_mismatch.hit(|| format!("handler {h}: {got} inbox rows for {want} distinct events"));
            }
        }

        c.dead_letters = self.dead_letters;
        let mut dl = AnomalyBuilder::new("dead letter mismatch");
        if c.dead_letters != c.poison_events {
            dl.hit(|| format!("{} dead letters for {} malformed events", c.dead_letters, c.poison_events));
        }

        // The non-idempotent counter, per account.
        c.loyalty_points = self.loyalty.values().sum();
        c.loyalty_points_expected = want_points.values().sum();
        let mut drift = AnomalyBuilder::new("counter drift");
        let accounts: HashSet<i32> = want_points.keys().chain(self.loyalty.keys()).copied().collect();
        let mut accounts: Vec<i32> = accounts.into_iter().collect();
        accounts.sort_unstable();
        for a in accounts {
            let want = want_points.get(&a).copied().unwrap_or(0);
            let got = self.loyalty.get(&a).copied().unwrap_or(0);
            if want != got {
                drift.hit(|| format!("account {a}: {got} points, expected {want}"));
            }
        }

        let payments_missing_events = c.payments_missing_events;
        let invariants = vec![
            Invariant::eq(
                "no lost events (outbox events missing from the topic)",
                0,
                lost_count - payments_missing_events,
            ),
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
}

/// Reordering: an `authorized` message at a later offset than a `captured`
/// one of the same payment (same key, so same partition).
fn reordered(msgs: &[MessageEntry]) -> bool {
    let at = |k: EventKind| msgs.iter().filter(move |m| m.kind == Some(k));
    let last_auth = at(EventKind::Authorized).max_by_key(|m| m.offset);
    let first_cap = at(EventKind::Captured).min_by_key(|m| m.offset);
    matches!((last_auth, first_cap), (Some(a), Some(k)) if a.partition == k.partition && a.offset > k.offset)
}

/// Where a payment's messages sit on the topic, for examples.
fn locate(msgs: &[MessageEntry]) -> String {
    if msgs.is_empty() {
        return "no message on the topic".into();
    }
    let parts: Vec<String> = msgs
        .iter()
        .take(6)
        .map(|m| format!("{}@{}:{}", m.kind.map(|k| k.status()).unwrap_or("malformed"), m.partition, m.offset))
        .collect();
    parts.join(" ")
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

    /// Hand-made ground truth, fed to a [`Ledger`] as the readers feed it.
    #[derive(Default)]
    struct DbTruth {
        payments: Vec<PaymentRow>,
        outbox: Vec<OutboxRecord>,
        inbox_rows: HashMap<String, u64>,
        receipts: HashMap<Uuid, u64>,
        projection: HashMap<Uuid, bool>,
        dead_letters: u64,
        loyalty: HashMap<i32, i64>,
    }

    fn reconcile(db: &DbTruth, topic: &[TopicRecord]) -> Reconciliation {
        let mut l = Ledger::new();
        for p in &db.payments {
            l.add_payment(p.clone());
        }
        for o in &db.outbox {
            l.add_event(o.clone());
        }
        for (h, n) in &db.inbox_rows {
            l.add_inbox_rows(h, *n);
        }
        for (p, n) in &db.receipts {
            l.add_receipts(*p, *n);
        }
        for (p, c) in &db.projection {
            l.add_projection(*p, *c);
        }
        l.add_dead_letters(db.dead_letters);
        for (a, n) in &db.loyalty {
            l.add_loyalty(*a, *n);
        }
        for m in topic {
            l.add_message(m.clone());
        }
        l.reconcile()
    }

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
    fn ledger_entries_stay_compact() {
        // A million payments keep two events and about 2.2 messages each:
        // these sizes are what keeps the verifier within its memory budget.
        assert!(std::mem::size_of::<PaymentEntry>() <= 40);
        assert!(std::mem::size_of::<EventEntry>() <= 24);
        assert!(std::mem::size_of::<MessageEntry>() <= 16);
    }

    #[test]
    fn receipts_of_unknown_payments_are_duplicates() {
        let (mut db, topic) = healthy(2);
        db.receipts.insert(Uuid::from_u128(7), 1);
        let r = reconcile(&db, &topic);
        assert_eq!(failing(&r), vec!["receipts sent"]);
        let a = r.anomalies.iter().find(|a| a.name == "duplicate effect").unwrap();
        assert!(a.examples[0].contains("but not captured"), "{:?}", a.examples);
        assert_eq!(r.counts.receipts, 3);
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
