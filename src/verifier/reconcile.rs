//! From ground truth to counts, invariants and anomalies, with no I/O: every
//! check here can be fed hand-made intent, rows and messages, and every
//! check can fail on its own.
//!
//! The payments checker, composed on the core ([`super::compose`]), check
//! by check:
//! - the payments: the scenario's count = what the workload committed = the
//!   table's rows, field by field;
//! - the outbox: each payment's events exactly as committed;
//! - the topic: each payment's events on it by key and type, on one
//!   partition;
//! - the effects: exactly one receipt per captured payment, a captured
//!   projection set by its own event, credits by account and amount, inbox
//!   rows and dead letters matched by id, the counter equal to its credits.
//!
//! Every event on the topic once, nothing foreign, each message equal to
//! its row, one effect per event and the points per account, the core
//! checks.
//!
//! Each check is an [`Invariant`] with the anomalies that break it: an
//! invariant holds only if none of its anomalies has a single example.

use super::ledger::{flag, mark, Ledger, MessageEntry, PaymentEntry};
use crate::domain::events::EventKind;
use crate::domain::handlers::Handler;
use crate::verifier::spec::handlers_fed_by;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// At most this many examples per anomaly: enough to go and look.
pub const EXAMPLES: usize = 5;

pub use crate::domain::anomaly::AnomalyKind;

/// The figures of a run, all read from the ground truth. `serde(default)`:
/// reports saved before a figure existed still load.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(default)]
pub struct Counts {
    /// Payments the workload committed (its own record, not the table's).
    pub payments_committed: u64,
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
    /// Malformed events with their dead letter.
    pub dead_letters_matched: u64,
    pub loyalty_points: i64,
    pub loyalty_points_expected: i64,
    pub loyalty_credits: u64,
    /// Emails the provider's record says it sent (its `Sent*` outcomes).
    /// The three email figures are `None` when the run sends no emails, so
    /// its report reads as it did before emails existed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub emails_sent: Option<u64>,
    /// Requests the provider answered as a replay of their idempotency key:
    /// repeats it absorbed without sending.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub emails_absorbed: Option<u64>,
    /// Requests the provider refused without sending (key reused, key in
    /// use, bad request, unavailable).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub emails_refused: Option<u64>,
}

/// A property that must hold, with what was expected and what was found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Invariant {
    /// A stable id, the same in every run of the scenario whatever the
    /// seed: what a script or a CI system keys on (the name, lowercase,
    /// with `-` for anything but letters, digits and `.`).
    #[serde(default)]
    pub id: String,
    pub name: String,
    pub expected: String,
    pub actual: String,
    pub ok: bool,
    /// The anomalies found against it (empty when it holds).
    #[serde(default)]
    pub anomalies: Vec<String>,
    /// How far `actual` is from `expected` when both are counts: 0 when it
    /// holds. One meaning on every row, where `expected` and `actual`
    /// count good things on some rows and bad things on others.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub off_by: Option<u64>,
}

impl Invariant {
    pub(crate) fn eq<T: PartialEq + ToString>(name: &str, expected: T, actual: T) -> Self {
        let ok = expected == actual;
        let (expected, actual) = (expected.to_string(), actual.to_string());
        let off_by = match (expected.parse::<i128>(), actual.parse::<i128>()) {
            (Ok(e), Ok(a)) => u64::try_from((e - a).unsigned_abs()).ok(),
            _ => None,
        };
        Self { id: slug(name), name: name.to_string(), expected, actual, ok, anomalies: vec![], off_by }
    }
}

/// An invariant's id from its name: lowercase letters, digits and `.`,
/// every other run of characters one `-`.
pub fn slug(name: &str) -> String {
    let mut out = String::new();
    for c in name.chars() {
        if c.is_ascii_alphanumeric() || c == '.' || c == '_' {
            out.push(c.to_ascii_lowercase());
        } else if !out.ends_with('-') && !out.is_empty() {
            out.push('-');
        }
    }
    out.trim_end_matches('-').to_string()
}

/// A named violation, with examples an engineer can look up.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Anomaly {
    /// One of the [`AnomalyKind`] names.
    pub name: String,
    pub count: u64,
    pub examples: Vec<String>,
    /// The scenario allows it (`[expect] allowed_anomalies`): reported, but
    /// not a violation.
    #[serde(default)]
    pub allowed: bool,
    /// Per example, the payment or event it is about, when it is about one:
    /// what [`super::attribution`] looks the traces of up.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subjects: Vec<Option<uuid::Uuid>>,
    /// The faults that fired shortly before examples' last traces in the
    /// database ([`super::attribution`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub followed: Vec<super::attribution::Followed>,
    /// In a payments run, which checkers found it: `payments` (the
    /// payments checker), `core` (the generic invariants), or both.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub found_by: Vec<String>,
}

/// What the verifier concluded from the ground truth.
#[derive(Debug, Clone, Default)]
pub struct Reconciliation {
    pub counts: Counts,
    pub invariants: Vec<Invariant>,
    pub anomalies: Vec<Anomaly>,
}

/// What the run was asked to do, as the checks need it.
#[derive(Debug, Clone, Copy)]
pub struct Spec {
    /// The scenario's payment count.
    pub payments: u64,
    /// Events go through the outbox (false: the dual-write variant, which
    /// has no outbox to compare the topic with).
    pub outbox: bool,
}

#[derive(Debug)]
pub(super) struct AnomalyBuilder {
    kind: AnomalyKind,
    pub(super) count: u64,
    examples: Vec<String>,
    /// Aligned with `examples`.
    subjects: Vec<Option<uuid::Uuid>>,
}

impl AnomalyBuilder {
    pub(super) fn new(kind: AnomalyKind) -> Self {
        Self { kind, count: 0, examples: Vec::new(), subjects: Vec::new() }
    }

    pub(super) fn hit(&mut self, example: impl FnOnce() -> String) {
        self.hit_about(None, example);
    }

    /// A hit about one payment or event (its id), whose traces in the
    /// database date it.
    pub(super) fn hit_on(&mut self, subject: uuid::Uuid, example: impl FnOnce() -> String) {
        self.hit_about(Some(subject), example);
    }

    pub(super) fn hit_about(&mut self, subject: Option<uuid::Uuid>, example: impl FnOnce() -> String) {
        self.count += 1;
        if self.examples.len() < EXAMPLES {
            self.examples.push(example());
            self.subjects.push(subject);
        }
    }
}

/// Collects invariants and the anomalies behind them; anomalies of one kind
/// found by several checks are reported once, their counts added.
#[derive(Default)]
pub(super) struct Findings {
    invariants: Vec<Invariant>,
    anomalies: Vec<Anomaly>,
}

impl Findings {
    /// Goes on from a finished reconciliation, so that later checks (the
    /// emails') add their invariants after its own and merge anomalies with its.
    pub(super) fn resume(r: &mut Reconciliation) -> Self {
        Self { invariants: std::mem::take(&mut r.invariants), anomalies: std::mem::take(&mut r.anomalies) }
    }

    /// Hands the findings back to the reconciliation they resumed.
    pub(super) fn finish(self, r: &mut Reconciliation) {
        r.invariants = self.invariants;
        r.anomalies = self.anomalies;
    }

    /// An invariant that holds when `expected == actual` and none of its
    /// anomalies has an example.
    pub(super) fn check<T: PartialEq + ToString>(
        &mut self,
        name: &str,
        expected: T,
        actual: T,
        found: Vec<AnomalyBuilder>,
    ) {
        let mut inv = Invariant::eq(name, expected, actual);
        for b in found.into_iter().filter(|b| b.count > 0) {
            inv.ok = false;
            let kind = b.kind.as_str().to_string();
            if !inv.anomalies.contains(&kind) {
                inv.anomalies.push(kind.clone());
            }
            match self.anomalies.iter_mut().find(|a| a.name == kind) {
                Some(a) => {
                    a.count += b.count;
                    let room = EXAMPLES.saturating_sub(a.examples.len());
                    a.examples.extend(b.examples.into_iter().take(room));
                    a.subjects.extend(b.subjects.into_iter().take(room));
                }
                None => self.anomalies.push(Anomaly {
                    name: kind,
                    count: b.count,
                    examples: b.examples,
                    allowed: false,
                    subjects: b.subjects,
                    followed: Vec::new(),
                    found_by: vec![],
                }),
            }
        }
        self.invariants.push(inv);
    }
}

impl Ledger {
    /// The payments checker's findings, the ledger spent (the backends'
    /// tests read a ledger's counts this way).
    pub fn reconcile(mut self, spec: &Spec) -> Reconciliation {
        self.check(spec)
    }

    /// The payments checker's findings, keeping the ledger for the
    /// look-ups that follow (the anomalies' stories, [`Ledger::messages_of`]).
    pub fn check(&mut self, spec: &Spec) -> Reconciliation {
        // Examples then come out in id order, whatever was looked up.
        self.payment(uuid::Uuid::nil());
        self.seal_events();
        let mut c = Counts::default();
        let mut f = Findings::default();
        let streamed = std::mem::take(&mut self.streamed);
        self.check_payments(spec, &mut c, &mut f, streamed.phantom, streamed.payment_rows);
        if spec.outbox {
            self.check_outbox(&mut f, streamed.outbox);
        }
        self.check_topic(&mut c, &mut f);
        self.check_receipts(&mut c, &mut f);
        self.check_loyalty(&mut c, &mut f, streamed.credit_cause);
        self.check_projection(&mut c, &mut f, streamed.projection_cause);
        self.check_inbox(&mut c, &mut f, streamed.inbox_cause);
        self.check_dead_letters(&mut c, &mut f, streamed.dead_letter);
        Reconciliation { counts: c, invariants: f.invariants, anomalies: f.anomalies }
    }

    /// The scenario's count = what the workload committed = the table.
    fn check_payments(
        &self,
        spec: &Spec,
        c: &mut Counts,
        f: &mut Findings,
        phantom: AnomalyBuilder,
        rows: AnomalyBuilder,
    ) {
        let ps = &self.payments;
        c.payments_committed = ps.iter().filter(|p| p.has(flag::INTENDED)).count() as u64;
        c.payments = ps.iter().filter(|p| p.has(flag::IN_TABLE)).count() as u64;
        c.payments_captured = ps.iter().filter(|p| p.has(flag::TABLE_CAPTURED)).count() as u64;
        // A workload that committed fewer payments than the scenario asks
        // (a run cut short: a program under test that never started) breaks
        // this invariant and names no anomaly: the payments it did not
        // commit were never anyone's, so none of them is lost.
        f.check("payments committed = the scenario's payments", spec.payments, c.payments_committed, vec![]);
        let mut lost = AnomalyBuilder::new(AnomalyKind::LostPayment);
        for p in ps.iter().filter(|p| p.has(flag::INTENDED) && !p.has(flag::IN_TABLE)) {
            lost.hit_on(p.id, || format!("payment {} was committed but has no row", p.id));
        }
        f.check("every committed payment in the payments table", c.payments_committed, c.payments, vec![lost, phantom]);
        f.check("payment rows as committed (account, amount, status)", 0, rows.count, vec![rows]);
        let mut uncaptured = AnomalyBuilder::new(AnomalyKind::PaymentMismatch);
        for p in ps.iter().filter(|p| p.has(flag::INTENDED) && !p.has(flag::CAPTURED)) {
            uncaptured.hit_on(p.id, || format!("payment {} was authorized but its capture never committed", p.id));
        }
        let committed_captured = ps.iter().filter(|p| p.has(flag::INTENDED) && p.has(flag::CAPTURED)).count() as u64;
        f.check("every committed payment captured", c.payments_committed, committed_captured, vec![uncaptured]);
    }

    /// Each payment's outbox events are exactly the committed ones: one
    /// authorized, one captured, one malformed twin where poison fired.
    fn check_outbox(&self, f: &mut Findings, mut bad: AnomalyBuilder) {
        for p in &self.payments {
            let want = [1, p.captured() as u8, p.has(flag::POISON) as u8];
            if p.outbox != want {
                bad.hit(|| {
                    format!(
                        "payment {}: {} authorized, {} captured, {} malformed events; expected {}, {}, {}",
                        p.id, p.outbox[0], p.outbox[1], p.outbox[2], want[0], want[1], want[2]
                    )
                });
            }
        }
        f.check("each payment's outbox events as committed", 0, bad.count, vec![bad]);
    }

    /// The topic as payments see it: each payment's events by key and
    /// type, whatever the outbox says (a dual write has no outbox). Every
    /// event on the topic, no foreign message, each equal to its row, a
    /// key's messages on one partition and no leftover: the core checks
    /// those.
    fn check_topic(&mut self, c: &mut Counts, f: &mut Findings) {
        let events = &self.events;
        c.outbox_events = events.len() as u64;
        c.unpublished = events.iter().filter(|o| !o.published).count() as u64;
        c.poison_events = events.iter().filter(|o| o.kind.is_none()).count() as u64;
        c.topic_messages = self.topic_messages;
        c.topic_distinct_events = events.iter().filter(|e| e.seen > 0).count() as u64;
        c.topic_duplicates = self.topic_known - c.topic_distinct_events;
        // Payment by payment, with its messages side by side: the messages
        // sorted by payment, then by place on the topic.
        self.messages.sort_unstable_by_key(|m| (m.payment, m.position()));
        let absent = self.payments_on_topic(c);
        f.check("every payment's events on the topic", 0, c.payments_missing_events, vec![absent]);
    }

    /// Each payment's messages, sorted by payment: payments with an event
    /// absent from the topic. Counts the reordered payments on the way.
    fn payments_on_topic(&self, c: &mut Counts) -> AnomalyBuilder {
        let mut absent = AnomalyBuilder::new(AnomalyKind::LostEvent);
        for (_, p, msgs) in by_payment(&self.payments, &self.messages) {
            if reordered(msgs) {
                c.reordered_payments += 1;
            }
            // Each payment's events must be on the topic, whatever the outbox
            // says (a dual write has no outbox to compare with).
            let has = |k: EventKind| msgs.iter().any(|m| m.kind == Some(k));
            let mut want = vec![EventKind::Authorized];
            if p.captured() {
                want.push(EventKind::Captured);
            }
            let missing: Vec<&str> = want.iter().filter(|k| !has(**k)).map(|k| k.status()).collect();
            if !missing.is_empty() {
                c.payments_missing_events += 1;
                absent.hit_on(p.id, || format!("payment {}: no {} message on the topic", p.id, missing.join(" or ")));
            }
        }
        absent
    }

    /// Exactly one receipt per captured payment, whatever events name
    /// them: a receipt under an id the consumer or the relay made up is
    /// no outbox event to the core, but it is a second receipt of its
    /// payment. Each receipt caused by its own event, the core checks.
    fn check_receipts(&self, c: &mut Counts, f: &mut Findings) {
        let mut dup = AnomalyBuilder::new(AnomalyKind::DuplicateEffect);
        let mut missing = AnomalyBuilder::new(AnomalyKind::MissingEffect);
        let mut captured = 0;
        for (_, p, msgs) in by_payment(&self.payments, &self.messages) {
            if !p.captured() {
                if p.receipts > 0 {
                    // Receipts for a payment never captured are duplicates of nothing.
                    dup.hit_on(p.id, || format!("payment {}: {} receipts but not captured", p.id, p.receipts));
                }
                continue;
            }
            captured += 1;
            match p.receipts {
                0 => {
                    c.payments_without_receipt += 1;
                    missing.hit_on(p.id, || format!("payment {}: no receipt; topic: {}", p.id, locate(msgs)));
                }
                1 => c.payments_with_one_receipt += 1,
                n => {
                    c.payments_with_many_receipts += 1;
                    dup.hit_on(p.id, || format!("payment {}: {n} receipts; topic: {}", p.id, locate(msgs)));
                }
            }
        }
        let mut stray = AnomalyBuilder::new(AnomalyKind::DuplicateEffect);
        for (pid, n) in &self.stray_receipts {
            stray.hit_on(*pid, || format!("payment {pid}: {n} receipts but it does not exist"));
        }
        c.receipts = self.payments.iter().map(|p| p.receipts as u64).sum::<u64>()
            + self.stray_receipts.iter().map(|(_, n)| n).sum::<u64>();
        f.check("exactly one receipt per captured payment", captured, c.payments_with_one_receipt, vec![dup, missing]);
        f.check("no receipts of payments that do not exist", 0, stray.count, vec![stray]);
    }

    /// Each credit caused by a captured event of its account, for its
    /// amount, and per account the counter = its credits. One credit per
    /// captured event and the points per account, the core checks.
    fn check_loyalty(&self, c: &mut Counts, f: &mut Findings, cause: AnomalyBuilder) {
        c.loyalty_credits = self.credits;
        c.loyalty_points = self.loyalty.values().sum();
        c.loyalty_points_expected = self.payments.iter().filter(|p| p.captured()).map(|p| p.amount_cents).sum();
        f.check("each loyalty credit caused by a captured event of its account", 0, cause.count, vec![cause]);
        let accounts: BTreeSet<i32> = self.loyalty.keys().chain(self.credited.keys()).copied().collect();
        let mut trail = AnomalyBuilder::new(AnomalyKind::CounterDrift);
        for a in accounts {
            let points = self.loyalty.get(&a).copied().unwrap_or(0);
            let credited = self.credited.get(&a).copied().unwrap_or(0);
            if points != credited {
                trail.hit(|| format!("account {a}: counter {points} points, its credits {credited}"));
            }
        }
        f.check("loyalty counter = its credits, per account", 0, trail.count, vec![trail]);
    }

    fn check_projection(&self, c: &mut Counts, f: &mut Findings, cause: AnomalyBuilder) {
        let mut stale = AnomalyBuilder::new(AnomalyKind::StaleProjection);
        let mut captured = 0;
        for (_, p, msgs) in by_payment(&self.payments, &self.messages).filter(|(_, p, _)| p.captured()) {
            captured += 1;
            match p.projection {
                2 => c.projection_captured += 1,
                shown => {
                    let shown = if shown == 1 { "authorized" } else { "absent" };
                    stale.hit_on(p.id, || format!("payment {}: projection {shown}; topic: {}", p.id, locate(msgs)));
                }
            }
        }
        f.check("projection shows captured", captured, c.projection_captured, vec![stale]);
        f.check("each projection row set by its payment's event", 0, cause.count, vec![cause]);
    }

    /// Inbox rows per handler = the distinct events it handles, and every
    /// event has a row for each of its handlers.
    fn check_inbox(&self, c: &mut Counts, f: &mut Findings, cause: AnomalyBuilder) {
        let mut expected: BTreeMap<Handler, u64> = Handler::ALL.iter().map(|h| (*h, 0)).collect();
        let mut unclaimed = AnomalyBuilder::new(AnomalyKind::InboxMismatch);
        for e in &self.events {
            let Some(k) = e.kind else { continue };
            for h in handlers_fed_by(k) {
                *expected.entry(*h).or_default() += 1;
                if e.marks & mark::INBOX_MASK & h.bit() == 0 {
                    unclaimed
                        .hit_on(e.id, || format!("event {} ({}) has no {} inbox row", e.id, k.status(), h.as_str()));
                }
            }
        }
        c.inbox_rows = self.inbox_rows.values().sum();
        c.inbox_rows_by_handler = Handler::ALL
            .iter()
            .map(|h| (h.as_str().to_string(), self.inbox_rows.get(h).copied().unwrap_or(0)))
            .collect();
        let mut counts = AnomalyBuilder::new(AnomalyKind::InboxMismatch);
        for (h, want) in &expected {
            let got = self.inbox_rows.get(h).copied().unwrap_or(0);
            if got != *want {
                counts.hit(|| format!("handler {}: {got} inbox rows for {want} distinct events", h.as_str()));
            }
        }
        let fmt = |m: &BTreeMap<Handler, u64>| {
            m.iter().map(|(k, v)| format!("{} {v}", k.as_str())).collect::<Vec<_>>().join(", ")
        };
        let got: BTreeMap<Handler, u64> =
            Handler::ALL.iter().map(|h| (*h, self.inbox_rows.get(h).copied().unwrap_or(0))).collect();
        f.check("inbox rows = distinct events, per handler", fmt(&expected), fmt(&got), vec![counts, unclaimed]);
        f.check("each inbox row an outbox event, for one of its handlers", 0, cause.count, vec![cause]);
    }

    /// Dead letters are exactly the malformed events, matched by id.
    fn check_dead_letters(&self, c: &mut Counts, f: &mut Findings, unknown: AnomalyBuilder) {
        c.dead_letters = self.dead_letters;
        let mut missing = AnomalyBuilder::new(AnomalyKind::DeadLetterMismatch);
        for e in self.events.iter().filter(|e| e.kind.is_none()) {
            if e.marks & mark::DEAD_LETTER != 0 {
                c.dead_letters_matched += 1;
            } else {
                missing.hit_on(e.id, || format!("malformed event {} has no dead letter", e.id));
            }
        }
        f.check("dead letters = the malformed events, by id", c.poison_events, c.dead_letters, vec![missing, unknown]);
    }
}

/// Each payment with its messages (which are sorted by payment).
fn by_payment<'a>(
    payments: &'a [PaymentEntry],
    messages: &'a [MessageEntry],
) -> impl Iterator<Item = (usize, &'a PaymentEntry, &'a [MessageEntry])> {
    let mut at = 0;
    payments.iter().enumerate().map(move |(i, p)| {
        let start = at;
        while at < messages.len() && messages[at].payment == i as u32 {
            at += 1;
        }
        (i, p, &messages[start..at])
    })
}

/// Reordering: an `authorized` message later in its lane than a `captured`
/// one of the same payment (same key, so same lane).
fn reordered(msgs: &[MessageEntry]) -> bool {
    let of = |k: EventKind| msgs.iter().filter(move |m| m.kind == Some(k));
    let last_auth = of(EventKind::Authorized).max_by_key(|m| m.at);
    let first_cap = of(EventKind::Captured).min_by_key(|m| m.at);
    matches!((last_auth, first_cap), (Some(a), Some(k)) if a.position().lane() == k.position().lane() && a.at > k.at)
}

/// Where a payment's messages sit on the topic, for examples.
const LOCATE_AT_MOST: usize = 6;

fn locate(msgs: &[MessageEntry]) -> String {
    if msgs.is_empty() {
        return "no message on the topic".into();
    }
    let parts: Vec<String> = msgs
        .iter()
        .take(LOCATE_AT_MOST)
        .map(|m| format!("{}@{}", m.kind.map(|k| k.status()).unwrap_or("malformed"), m.position()))
        .collect();
    parts.join(" ")
}
