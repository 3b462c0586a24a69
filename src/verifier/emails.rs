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
use crate::provider::{Form, IdempotencyKey, Outcome, Record, Request};
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

fn said(record: &Record, q: &Request) -> Said {
    let id = |k: &str| record.field(q, k).and_then(|x| x.uuid());
    Said { payment: id("payment_id"), message: id("message_id") }
}

/// What is wrong with a body that does not name its payment and message.
fn unnamed(q: &Request, s: Said) -> String {
    match q.body.form {
        Form::NotJson => "a body that is not JSON".into(),
        Form::Object | Form::OtherJson => {
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
    let key = q.key.as_ref().map(|k| format!("key {k}")).unwrap_or_else(|| "no key".into());
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

/// What the email pass keeps per payment of the ledger (by its index):
/// a few bytes, not the requests, so that a million emails add megabytes,
/// not hundreds of them. Examples find their requests again in the record.
#[derive(Default, Clone, Copy)]
struct PerPayment {
    /// Requests that named the payment.
    asked: u32,
    /// Emails sent for it.
    sent: u32,
    /// One of them was caused by its captured event.
    well_caused: bool,
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
        let mut unmatched = AnomalyBuilder::new(AnomalyKind::MisattributedExternalEffect);
        let (per, odd_sent, cause) = self.email_causes(emails, &mut unmatched);
        let (captured, one, dup, missing) = self.emails_per_payment(emails, &per);
        self.receipts_against_emails(&per, &odd_sent, &mut unmatched);
        let reused = key_reuses(emails);
        f.check("exactly one email per captured payment", captured, one, vec![dup, missing]);
        f.check("each email caused by its payment's captured event", 0, cause.count, vec![cause]);
        f.check("receipt rows = emails, both ways", 0, unmatched.count, vec![unmatched]);
        f.check("no idempotency key reused", 0, reused.count, vec![reused]);
        f.finish(r);
    }

    /// Each email sent must name a payment that exists and, as the message
    /// that caused it, that payment's captured event. Returns what each
    /// payment got, which of the odd receipt rows an email matched (and the
    /// payments of odd rows that got an email), and the misattributions. A
    /// well-caused email whose payment has no receipt row from that event
    /// goes into `unmatched`.
    fn email_causes(
        &mut self,
        emails: &Record,
        unmatched: &mut AnomalyBuilder,
    ) -> (Vec<PerPayment>, OddSent, AnomalyBuilder) {
        let mut cause = AnomalyBuilder::new(AnomalyKind::MisattributedExternalEffect);
        let mut per = vec![PerPayment::default(); self.payments.len()];
        // The odd receipt rows are few: only their pairs and payments are
        // looked for among the emails.
        let odd_pairs: HashSet<(Uuid, Uuid)> = self.odd_receipts.iter().copied().collect();
        let odd_payments: HashSet<Uuid> = self.odd_receipts.iter().map(|(p, _)| *p).collect();
        let mut odd_sent = OddSent::default();
        let mut seen = HashSet::new();
        for q in &emails.requests {
            let s = said(emails, q);
            let at = s.payment.and_then(|p| self.payment(p));
            if let Some(i) = at {
                per[i].asked += 1;
            }
            if q.outcome.sent().is_none() {
                continue;
            }
            if let Some(i) = at {
                per[i].sent += 1;
            }
            match (s.payment, s.message, at) {
                (Some(p), Some(m), Some(i)) => {
                    if odd_pairs.contains(&(p, m)) {
                        odd_sent.pairs.insert((p, m));
                    }
                    if odd_payments.contains(&p) {
                        odd_sent.payments.insert(p);
                    }
                    let was = self.cause(m);
                    if matches!(was, Some((j, Some(EventKind::Captured))) if j == i) {
                        per[i].well_caused = true;
                        // Its receipt row is the one its payment's captured event caused.
                        let pay = &self.payments[i];
                        if !pay.has(flag::RECEIPT_CAUSED) && seen.insert((i, m)) {
                            let id = pay.id;
                            unmatched
                                .hit_on(id, || format!("{} for payment {id}, message {m}: no receipt row", name(q)));
                        }
                    } else {
                        let why = self.describe_cause(was, m);
                        cause.hit_on(p, || format!("{} for payment {p} caused by {why}", name(q)));
                    }
                }
                (Some(p), Some(_), None) => {
                    cause.hit_on(p, || format!("{} for payment {p}, which does not exist", name(q)))
                }
                _ => cause.hit_about(s.payment, || format!("{} with {}", name(q), unnamed(q, s))),
            }
        }
        (per, odd_sent, cause)
    }

    /// Exactly one email sent per captured payment. Returns the captured
    /// payments, those with one email, and the duplicates and the missing.
    fn emails_per_payment(&self, emails: &Record, per: &[PerPayment]) -> (u64, u64, AnomalyBuilder, AnomalyBuilder) {
        let mut dup = AnomalyBuilder::new(AnomalyKind::DuplicateExternalEffect);
        let mut missing = AnomalyBuilder::new(AnomalyKind::MissingExternalEffect);
        let (mut captured, mut one) = (0u64, 0u64);
        // An example's requests, found again in the record in arrival order:
        // only examples need them.
        let requests_of = |id: Uuid, sent_only: bool| -> Vec<&Request> {
            let of = |q: &&Request| said(emails, q).payment == Some(id) && (!sent_only || q.outcome.sent().is_some());
            emails.requests.iter().filter(of).collect()
        };
        for (p, got) in self.payments.iter().zip(per) {
            if p.captured() {
                captured += 1;
                match got.sent {
                    0 => missing.hit_on(p.id, || {
                        let asked = match got.asked {
                            0 => "no request reached the provider".into(),
                            _ => names(&requests_of(p.id, false)),
                        };
                        format!("payment {}: no email sent ({asked}); receipt rows: {}", p.id, p.receipts)
                    }),
                    1 => one += 1,
                    _ => {}
                }
            }
            if got.sent > 1 {
                dup.hit_on(p.id, || {
                    format!("payment {}: {} emails sent: {}", p.id, got.sent, names(&requests_of(p.id, true)))
                });
            }
        }
        (captured, one, dup, missing)
    }

    /// Receipt rows against emails, the other way: a receipt row without an
    /// email of its (payment, message). A receipt row of a payment with no
    /// email at all is not named here (`missing external effect` names it).
    fn receipts_against_emails(&self, per: &[PerPayment], odd_sent: &OddSent, unmatched: &mut AnomalyBuilder) {
        for (i, (p, got)) in self.payments.iter().zip(per).enumerate() {
            if p.has(flag::RECEIPT_CAUSED) && got.sent > 0 && !got.well_caused {
                unmatched.hit_on(p.id, || {
                    let m = self.captured_event(i).map(|e| e.to_string()).unwrap_or_else(|| "?".into());
                    format!("receipt row (payment {}, message {m}) has no email; its emails name other messages", p.id)
                });
            }
        }
        let odd: BTreeSet<(Uuid, Uuid)> = self.odd_receipts.iter().copied().collect();
        for (p, m) in odd {
            if odd_sent.payments.contains(&p) && !odd_sent.pairs.contains(&(p, m)) {
                unmatched.hit_on(p, || format!("receipt row (payment {p}, message {m}) has no email"));
            }
        }
    }

    /// The captured event of payment `i`, for an example (a linear search:
    /// only examples need it).
    fn captured_event(&self, i: usize) -> Option<Uuid> {
        self.events.iter().find(|e| e.payment == i as u32 && e.kind == Some(EventKind::Captured)).map(|e| e.id)
    }
}

/// Of the odd receipt rows (those not from their payment's captured
/// event): the (payment, message) pairs an email was sent for, and their
/// payments that got any email.
#[derive(Default)]
struct OddSent {
    pairs: HashSet<(Uuid, Uuid)>,
    payments: HashSet<Uuid>,
}

/// Every request the provider refused because its idempotency key came
/// before with another body: the key was reused for a different email. Two
/// passes: the reused keys first (few), then their first requests, so that
/// no map of every key is built.
fn key_reuses(emails: &Record) -> AnomalyBuilder {
    let mut reused = AnomalyBuilder::new(AnomalyKind::IdempotencyKeyReused);
    let conflicts: HashSet<&IdempotencyKey> =
        emails.requests.iter().filter(|q| q.outcome == Outcome::Conflict).filter_map(|q| q.key.as_ref()).collect();
    if conflicts.is_empty() {
        return reused;
    }
    let mut first: HashMap<&IdempotencyKey, &Request> = HashMap::new();
    for q in &emails.requests {
        let Some(key) = q.key.as_ref().filter(|k| conflicts.contains(k)) else { continue };
        let was = *first.entry(key).or_insert(q);
        if q.outcome != Outcome::Conflict {
            continue;
        }
        let s = said(emails, q);
        let about = s.payment.map(|p| format!(" for payment {p}")).unwrap_or_default();
        reused.hit_about(s.payment, || {
            if was.seq == q.seq {
                format!("key {key}: request {}{about} refused as reused, with no earlier request", q.seq)
            } else {
                // The record keeps a fingerprint of each body, not the body.
                format!(
                    "key {key}: request {}{about} differs from request {} (body fingerprints {:016x} and {:016x})",
                    q.seq, was.seq, q.body.fingerprint, was.body.fingerprint
                )
            }
        });
    }
    reused
}
