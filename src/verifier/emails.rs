//! The checks of effects outside the database: the emails in the provider's
//! record (ground truth the harness holds, not the system under test)
//! against the workload's record of intent and the ledger's outbox and
//! receipt rows. No I/O, like [`super::reconcile`]: each check can be fed a
//! hand-made record and fail on its own.
//!
//! - the email figures: sent, absorbed, refused;
//! - receipt rows = emails, both ways, by (payment, message) (`misattributed
//!   external effect`).
//!
//! Exactly one email per captured event, each caused by its event, and no
//! idempotency key reused, the core checks: the pipeline's declaration
//! reads its receipt emails from the provider's record.

use super::ledger::{flag, Ledger};
use super::reconcile::{AnomalyBuilder, AnomalyKind, Findings, Reconciliation};
use crate::domain::events::EventKind;
use crate::provider::{Outcome, Record, Request};
use std::collections::{BTreeSet, HashSet};
use uuid::Uuid;

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
        let (per, odd_sent) = self.email_causes(emails, &mut unmatched);
        self.receipts_against_emails(&per, &odd_sent, &mut unmatched);
        f.check("receipt rows = emails, both ways", 0, unmatched.count, vec![unmatched]);
        f.finish(r);
    }

    /// Each email sent must name a payment that exists and, as the message
    /// that caused it, that payment's captured event. Returns what each
    /// payment got, which of the odd receipt rows an email matched (and the
    /// payments of odd rows that got an email), and the misattributions. A
    /// well-caused email whose payment has no receipt row from that event
    /// goes into `unmatched`.
    fn email_causes(&mut self, emails: &Record, unmatched: &mut AnomalyBuilder) -> (Vec<PerPayment>, OddSent) {
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
                    }
                }
                // Caused by no captured event of its own, or naming none:
                // the core's `misattributed external effect`.
                _ => {}
            }
        }
        (per, odd_sent)
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
