//! The checks of effects outside the database: the emails in the provider's
//! record (ground truth the harness holds, not the system under test)
//! against the workload's record of intent and the ledger's outbox and
//! receipt rows. No I/O, like [`super::reconcile`]: each check can be fed a
//! hand-made record and fail on its own.
//!
//! - exactly one email per captured payment (`missing external effect`,
//!   `duplicate external effect`);
//! - each email caused by its payment's captured event, as its body names
//!   them (`misattributed external effect`);
//! - receipt rows = emails, both ways, by (payment, message) (`misattributed
//!   external effect`);
//! - no idempotency key reused with another body (`idempotency key reused`).

use super::ledger::{flag, Ledger};
use super::reconcile::{AnomalyBuilder, AnomalyKind, Findings, Reconciliation};
use crate::domain::events::EventKind;
use crate::provider::{Body, Outcome, Record, Request};
use std::collections::{BTreeSet, HashMap, HashSet};
use uuid::Uuid;

/// At most this many requests named in one example.
const NAMED_AT_MOST: usize = 4;

/// What an email's body says it is for. The notifier sends
/// `{"payment_id": …, "message_id": …}` among its fields.
#[derive(Debug, Clone, Copy, Default)]
struct Said {
    payment: Option<Uuid>,
    message: Option<Uuid>,
}

fn said(body: &Body) -> Said {
    match body {
        Body::Json(v) => {
            let id = |k: &str| v.get(k).and_then(|x| x.as_str()).and_then(|s| Uuid::parse_str(s).ok());
            Said { payment: id("payment_id"), message: id("message_id") }
        }
        Body::Text(_) => Said::default(),
    }
}

/// What is wrong with a body that does not name its payment and message.
fn unnamed(body: &Body, s: Said) -> String {
    match body {
        Body::Text(_) => "a body that is not JSON".into(),
        Body::Json(_) => {
            let missing: Vec<&str> = [("payment_id", s.payment.is_none()), ("message_id", s.message.is_none())]
                .into_iter()
                .filter_map(|(k, m)| m.then_some(k))
                .collect();
            format!("a body without a valid {}", missing.join(" or "))
        }
    }
}

/// A request as an example names it: the email it sent (or its outcome),
/// its place in arrival order and its idempotency key.
fn name(q: &Request) -> String {
    let key = q.key.as_deref().map(|k| format!("key {k}")).unwrap_or_else(|| "no key".into());
    match q.outcome.sent() {
        Some(id) => format!("email {id} (request {}, {key})", q.seq),
        None => format!("request {} ({}, {key})", q.seq, outcome(&q.outcome)),
    }
}

fn outcome(o: &Outcome) -> &'static str {
    match o {
        Outcome::Sent { .. } => "sent",
        Outcome::Replayed { .. } => "replayed",
        Outcome::Conflict => "key reused",
        Outcome::InUse => "key in use",
        Outcome::BadRequest => "bad request",
        Outcome::Unavailable => "unavailable",
        Outcome::SentResponseLost { .. } => "sent, response lost",
        Outcome::SentSlow { .. } => "sent slowly",
    }
}

fn names(qs: &[&Request]) -> String {
    let mut out: Vec<String> = qs.iter().take(NAMED_AT_MOST).map(|q| name(q)).collect();
    if qs.len() > NAMED_AT_MOST {
        out.push(format!("{} more", qs.len() - NAMED_AT_MOST));
    }
    out.join(", ")
}

/// The top-level fields in which two bodies differ.
fn differing(a: &Body, b: &Body) -> String {
    match (a, b) {
        (Body::Json(serde_json::Value::Object(a)), Body::Json(serde_json::Value::Object(b))) => {
            let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            let diff: Vec<&str> = keys.into_iter().filter(|k| a.get(*k) != b.get(*k)).map(|k| k.as_str()).collect();
            if diff.is_empty() {
                "the same fields".into()
            } else {
                diff.join(", ")
            }
        }
        _ => "the whole body".into(),
    }
}

impl Ledger {
    /// Adds the email checks to a finished reconciliation: their counts,
    /// their four invariants after the others, and their anomalies.
    pub fn check_emails(&mut self, emails: &Record, r: &mut Reconciliation) {
        // Seals the payments and events: indexes below stay valid.
        self.payment(Uuid::nil());
        self.seal_events();
        let c = &mut r.counts;
        let count = |f: fn(&Outcome) -> bool| emails.requests.iter().filter(|q| f(&q.outcome)).count() as u64;
        c.emails_sent = Some(count(|o| o.sent().is_some()));
        c.emails_absorbed = Some(count(|o| matches!(o, Outcome::Replayed { .. })));
        c.emails_refused = Some(count(|o| {
            matches!(o, Outcome::Conflict | Outcome::InUse | Outcome::BadRequest | Outcome::Unavailable)
        }));

        let mut f = Findings::resume(r);
        let (by_payment, caused, sent_pairs, cause) = self.email_causes(emails);
        let (captured, one, dup, missing) = self.emails_per_payment(&by_payment);
        let unmatched = self.receipts_against_emails(&caused, &sent_pairs);
        let reused = key_reuses(emails);
        f.check("exactly one email per captured payment", captured, one, vec![dup, missing]);
        f.check("each email caused by its payment's captured event", 0, cause.count, vec![cause]);
        f.check("receipt rows = emails, both ways", 0, unmatched.count, vec![unmatched]);
        f.check("no idempotency key reused", 0, reused.count, vec![reused]);
        f.finish(r);
    }

    /// Each email sent must name a payment that exists and, as the message
    /// that caused it, that payment's captured event. Returns every request
    /// by the payment it names (index, sorted), the well-caused emails, the
    /// (payment, message) of every email sent, and the misattributions.
    #[allow(clippy::type_complexity)]
    fn email_causes<'a>(
        &mut self,
        emails: &'a Record,
    ) -> (Vec<(usize, &'a Request)>, Vec<(usize, Uuid, &'a Request)>, HashSet<(Uuid, Uuid)>, AnomalyBuilder) {
        let mut cause = AnomalyBuilder::new(AnomalyKind::MisattributedExternalEffect);
        let mut by_payment = Vec::new();
        let mut caused = Vec::new();
        let mut sent_pairs = HashSet::new();
        for q in &emails.requests {
            let s = said(&q.body);
            let at = s.payment.and_then(|p| self.payment(p));
            if let Some(i) = at {
                by_payment.push((i, q));
            }
            if q.outcome.sent().is_none() {
                continue;
            }
            match (s.payment, s.message, at) {
                (Some(p), Some(m), Some(i)) => {
                    sent_pairs.insert((p, m));
                    let was = self.cause(m);
                    if matches!(was, Some((j, Some(EventKind::Captured))) if j == i) {
                        caused.push((i, m, q));
                    } else {
                        let why = self.describe_cause(was, m);
                        cause.hit_on(p, || format!("{} for payment {p} caused by {why}", name(q)));
                    }
                }
                (Some(p), Some(_), None) => {
                    cause.hit_on(p, || format!("{} for payment {p}, which does not exist", name(q)))
                }
                _ => cause.hit_about(s.payment, || format!("{} with {}", name(q), unnamed(&q.body, s))),
            }
        }
        // Payment by payment, in arrival order: examples come out in id order.
        by_payment.sort_by_key(|(i, q)| (*i, q.seq));
        (by_payment, caused, sent_pairs, cause)
    }

    /// Exactly one email sent per captured payment. Returns the captured
    /// payments, those with one email, and the duplicates and the missing.
    fn emails_per_payment(&self, by_payment: &[(usize, &Request)]) -> (u64, u64, AnomalyBuilder, AnomalyBuilder) {
        let mut dup = AnomalyBuilder::new(AnomalyKind::DuplicateExternalEffect);
        let mut missing = AnomalyBuilder::new(AnomalyKind::MissingExternalEffect);
        let (mut captured, mut one) = (0u64, 0u64);
        let mut at = 0;
        for (i, p) in self.payments.iter().enumerate() {
            let start = at;
            while at < by_payment.len() && by_payment[at].0 == i {
                at += 1;
            }
            let asked: Vec<&Request> = by_payment[start..at].iter().map(|(_, q)| *q).collect();
            let sent: Vec<&Request> = asked.iter().copied().filter(|q| q.outcome.sent().is_some()).collect();
            if p.captured() {
                captured += 1;
                match sent.len() {
                    0 => missing.hit_on(p.id, || {
                        let asked =
                            if asked.is_empty() { "no request reached the provider".into() } else { names(&asked) };
                        format!("payment {}: no email sent ({asked}); receipt rows: {}", p.id, p.receipts)
                    }),
                    1 => one += 1,
                    _ => {}
                }
            }
            if sent.len() > 1 {
                dup.hit_on(p.id, || format!("payment {}: {} emails sent: {}", p.id, sent.len(), names(&sent)));
            }
        }
        (captured, one, dup, missing)
    }

    /// Receipt rows and emails, matched by (payment, message) both ways. An
    /// email the cause check already named is not named again, nor a
    /// receipt row of a payment with no email at all (`missing external
    /// effect` names it).
    fn receipts_against_emails(
        &self,
        caused: &[(usize, Uuid, &Request)],
        sent_pairs: &HashSet<(Uuid, Uuid)>,
    ) -> AnomalyBuilder {
        let mut unmatched = AnomalyBuilder::new(AnomalyKind::MisattributedExternalEffect);
        // A well-caused email's receipt row is the one its payment's captured event caused.
        let mut seen = HashSet::new();
        for &(i, m, q) in caused {
            let p = &self.payments[i];
            if !p.has(flag::RECEIPT_CAUSED) && seen.insert((i, m)) {
                unmatched.hit_on(p.id, || format!("{} for payment {}, message {m}: no receipt row", name(q), p.id));
            }
        }
        let emailed: HashSet<Uuid> = sent_pairs.iter().map(|(p, _)| *p).collect();
        let caused_email: HashSet<usize> = caused.iter().map(|(i, _, _)| *i).collect();
        for (i, p) in self.payments.iter().enumerate() {
            if p.has(flag::RECEIPT_CAUSED) && emailed.contains(&p.id) && !caused_email.contains(&i) {
                unmatched.hit_on(p.id, || {
                    let m = self.captured_event(i).map(|e| e.to_string()).unwrap_or_else(|| "?".into());
                    format!("receipt row (payment {}, message {m}) has no email; its emails name other messages", p.id)
                });
            }
        }
        let odd: BTreeSet<(Uuid, Uuid)> = self.odd_receipts.iter().copied().collect();
        for (p, m) in odd {
            if emailed.contains(&p) && !sent_pairs.contains(&(p, m)) {
                unmatched.hit_on(p, || format!("receipt row (payment {p}, message {m}) has no email"));
            }
        }
        unmatched
    }

    /// The captured event of payment `i`, for an example (a linear search:
    /// only examples need it).
    fn captured_event(&self, i: usize) -> Option<Uuid> {
        self.events.iter().find(|e| e.payment == i as u32 && e.kind == Some(EventKind::Captured)).map(|e| e.id)
    }
}

/// Every request the provider refused because its idempotency key came
/// before with another body: the key was reused for a different email.
fn key_reuses(emails: &Record) -> AnomalyBuilder {
    let mut reused = AnomalyBuilder::new(AnomalyKind::IdempotencyKeyReused);
    let mut first: HashMap<&str, &Request> = HashMap::new();
    for q in &emails.requests {
        let Some(key) = q.key.as_deref() else { continue };
        let was = *first.entry(key).or_insert(q);
        if q.outcome != Outcome::Conflict {
            continue;
        }
        let s = said(&q.body);
        let about = s.payment.map(|p| format!(" for payment {p}")).unwrap_or_default();
        reused.hit_about(s.payment, || {
            if was.seq == q.seq {
                format!("key {key}: request {}{about} refused as reused, with no earlier request", q.seq)
            } else {
                let diff = differing(&was.body, &q.body);
                format!("key {key}: request {}{about} differs from request {} in {diff}", q.seq, was.seq)
            }
        });
    }
    reused
}
