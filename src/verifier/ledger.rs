//! The payments checker's ground truth, kept compact and fed row by row:
//! the workload's record of intent, the database's rows and every message
//! on the topic. Memory grows with a few dozen bytes per payment, per event
//! and per message, never with whole rows.
//!
//! Feed it in this order: the intent, the payments table, the outbox, the
//! rest of the database (any order), then the topic; then
//! [`Ledger::check`](super::reconcile). Whatever can be judged as a row
//! streams past (a payment's fields, a credit's cause) is judged right
//! there, into the anomaly builders kept here. The core checker fed beside
//! it ([`super::compose`]) judges what any declared system shares.

use super::reconcile::{AnomalyBuilder, AnomalyKind};
use super::topic::TopicRecord;
use crate::broker::{Packed, Position};
use crate::domain::events::{EventKind, PaymentEvent};
use crate::domain::handlers::Handler;
use crate::domain::intent::Intended;
use crate::domain::rows::TruthSink;
pub use crate::domain::rows::{OutboxRecord, PaymentRow};
use crate::verifier::spec::handlers_fed_by;
use std::collections::{BTreeMap, HashMap};
use uuid::Uuid;

/// Marks an index "no such payment".
pub(super) const NO_PAYMENT: u32 = u32::MAX;

/// [`PaymentEntry::flags`]: what is known of a payment, and from where.
pub(super) mod flag {
    /// The workload committed it (it is in the record of intent).
    pub const INTENDED: u8 = 1;
    /// It has a row in the payments table.
    pub const IN_TABLE: u8 = 2;
    /// The workload committed its capture.
    pub const CAPTURED: u8 = 4;
    /// The workload wrote a malformed twin of its captured event.
    pub const POISON: u8 = 8;
    /// Its row in the table says captured.
    pub const TABLE_CAPTURED: u8 = 16;
    /// It has a receipt row caused by its own captured event: the row an
    /// email from that event must match.
    pub const RECEIPT_CAUSED: u8 = 32;
}

/// One payment, compact: 40 bytes.
#[derive(Debug, Clone, Copy)]
pub(super) struct PaymentEntry {
    pub id: Uuid,
    pub amount_cents: i64,
    pub account_id: i32,
    /// Receipt rows for it (saturating: only 0, 1 and "more" matter).
    pub receipts: u16,
    pub flags: u8,
    /// What the projection shows: 0 absent, 1 authorized, 2 captured.
    pub projection: u8,
    /// Its outbox events: authorized, captured, malformed (saturating).
    pub outbox: [u8; 3],
}

impl PaymentEntry {
    pub fn has(&self, f: u8) -> bool {
        self.flags & f != 0
    }

    /// Whether it should be captured: by the intent when the workload
    /// committed it, else by what its row says.
    pub fn captured(&self) -> bool {
        if self.has(flag::INTENDED) {
            self.has(flag::CAPTURED)
        } else {
            self.has(flag::TABLE_CAPTURED)
        }
    }
}

/// [`EventEntry::marks`]: what the effects say of an event.
pub(super) mod mark {
    /// Bits 0..3: the handlers with an inbox row for it, by [`super::Handler::bit`].
    pub const INBOX_MASK: u8 = 0b111;
    /// It has a dead letter.
    pub const DEAD_LETTER: u8 = 8;
    /// Bits 4..8: loyalty credits it caused (saturating at 15).
    pub const CREDIT_SHIFT: u8 = 4;
}

/// One outbox event, compact: 24 bytes.
#[derive(Debug, Clone, Copy)]
pub(super) struct EventEntry {
    pub id: Uuid,
    /// Index into the payments, or [`NO_PAYMENT`].
    pub payment: u32,
    /// None for a malformed (poison) event.
    pub kind: Option<EventKind>,
    pub published: bool,
    /// Copies of it on the topic (saturating: 0, 1 and "more" matter).
    pub seen: u8,
    pub marks: u8,
}

impl MessageEntry {
    pub fn position(&self) -> Position {
        self.at.position()
    }
}

impl EventEntry {
    pub fn credits(&self) -> u8 {
        self.marks >> mark::CREDIT_SHIFT
    }
}

/// One message on the topic that carries a known payment's key: 16 bytes.
#[derive(Debug, Clone, Copy)]
pub(super) struct MessageEntry {
    /// Its position, packed so the entry stays 16 bytes.
    pub at: Packed,
    pub payment: u32,
    pub kind: Option<EventKind>,
}

/// The builders of the anomalies found while rows stream in.
#[derive(Debug)]
pub(super) struct Streamed {
    pub payment_rows: AnomalyBuilder,
    pub phantom: AnomalyBuilder,
    pub outbox: AnomalyBuilder,
    pub credit_cause: AnomalyBuilder,
    pub projection_cause: AnomalyBuilder,
    pub inbox_cause: AnomalyBuilder,
    pub dead_letter: AnomalyBuilder,
}

impl Default for Streamed {
    fn default() -> Self {
        use AnomalyKind::*;
        Self {
            payment_rows: AnomalyBuilder::new(PaymentMismatch),
            phantom: AnomalyBuilder::new(PhantomPayment),
            outbox: AnomalyBuilder::new(OutboxMismatch),
            credit_cause: AnomalyBuilder::new(MisattributedEffect),
            projection_cause: AnomalyBuilder::new(MisattributedEffect),
            inbox_cause: AnomalyBuilder::new(MisattributedEffect),
            dead_letter: AnomalyBuilder::new(DeadLetterMismatch),
        }
    }
}

#[derive(Debug, Default)]
pub struct Ledger {
    pub(super) payments: Vec<PaymentEntry>,
    payments_sorted: bool,
    /// Rows of the payments table the intent does not know, merged into
    /// `payments` once the table has been read.
    phantoms: Vec<PaymentEntry>,
    pub(super) events: Vec<EventEntry>,
    events_sorted: bool,
    pub(super) streamed: Streamed,
    /// Receipts of payments that do not exist.
    pub(super) stray_receipts: Vec<(Uuid, u64)>,
    /// Receipt rows (payment, message) not caused by their payment's
    /// captured event, kept whole for the email checks; a correct run has
    /// none, so they cost nothing there.
    pub(super) odd_receipts: Vec<(Uuid, Uuid)>,
    pub(super) inbox_rows: BTreeMap<Handler, u64>,
    pub(super) dead_letters: u64,
    /// The counter, summed over its stripes, per account.
    pub(super) loyalty: HashMap<i32, i64>,
    /// The credits' points, per account.
    pub(super) credited: HashMap<i32, i64>,
    pub(super) credits: u64,
    pub(super) messages: Vec<MessageEntry>,
    pub(super) topic_messages: u64,
    /// Messages whose event id is an outbox event.
    pub(super) topic_known: u64,
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

    /// One payment the workload committed.
    pub fn add_intended(&mut self, p: Intended) {
        debug_assert!(self.events.is_empty(), "the intent comes before the database");
        self.payments_sorted = false;
        let mut flags = flag::INTENDED;
        if p.captured {
            flags |= flag::CAPTURED;
        }
        if p.poison {
            flags |= flag::POISON;
        }
        self.payments.push(PaymentEntry {
            id: p.id,
            amount_cents: p.amount_cents,
            account_id: p.account_id,
            receipts: 0,
            flags,
            projection: 0,
            outbox: [0; 3],
        });
    }

    /// One row of the payments table, checked against the intent.
    pub fn add_payment(&mut self, row: PaymentRow) {
        debug_assert!(self.events.is_empty(), "payments come before outbox events");
        sort_once(&mut self.payments, &mut self.payments_sorted, |p| p.id);
        let table_captured = if row.captured { flag::TABLE_CAPTURED } else { 0 };
        let Ok(i) = self.payments.binary_search_by_key(&row.id, |p| p.id) else {
            self.streamed.phantom.hit_on(row.id, || {
                format!(
                    "payment {} (account {}, {} cents) was never committed",
                    row.id, row.account_id, row.amount_cents
                )
            });
            self.phantoms.push(PaymentEntry {
                id: row.id,
                amount_cents: row.amount_cents,
                account_id: row.account_id,
                receipts: 0,
                flags: flag::IN_TABLE | table_captured,
                projection: 0,
                outbox: [0; 3],
            });
            return;
        };
        let p = &mut self.payments[i];
        if p.has(flag::IN_TABLE) {
            self.streamed.payment_rows.hit_on(row.id, || format!("payment {}: two rows", row.id));
        }
        p.flags |= flag::IN_TABLE | table_captured;
        let status = |c: bool| if c { "captured" } else { "authorized" };
        if (p.account_id, p.amount_cents, p.has(flag::CAPTURED)) != (row.account_id, row.amount_cents, row.captured) {
            let (want, got) = (*p, row);
            self.streamed.payment_rows.hit(|| {
                format!(
                    "payment {}: row says account {}, {} cents, {}; committed account {}, {} cents, {}",
                    got.id,
                    got.account_id,
                    got.amount_cents,
                    status(got.captured),
                    want.account_id,
                    want.amount_cents,
                    status(want.has(flag::CAPTURED)),
                )
            });
        }
    }

    /// Sorts the payments by id, phantoms included, once they are all in;
    /// indexes into them are taken only after.
    fn seal_payments(&mut self) {
        if !self.phantoms.is_empty() {
            self.payments.append(&mut self.phantoms);
            self.payments_sorted = false;
        }
        sort_once(&mut self.payments, &mut self.payments_sorted, |p| p.id);
    }

    pub(super) fn payment(&mut self, id: Uuid) -> Option<usize> {
        self.seal_payments();
        self.payments.binary_search_by_key(&id, |p| p.id).ok()
    }

    /// One outbox row, checked against its payment as committed.
    pub fn add_event(&mut self, o: OutboxRecord) {
        debug_assert!(self.messages.is_empty(), "outbox events come before the topic");
        let payment = self.payment(o.payment_id);
        match payment {
            None => {
                self.streamed.outbox.hit(|| format!("event {} of payment {}, which does not exist", o.id, o.payment_id))
            }
            Some(i) => {
                let p = &mut self.payments[i];
                let slot = match o.kind {
                    Some(EventKind::Authorized) => 0,
                    Some(EventKind::Captured) => 1,
                    None => 2,
                };
                p.outbox[slot] = p.outbox[slot].saturating_add(1);
                let want = PaymentEvent { payment_id: p.id, account_id: p.account_id, amount_cents: p.amount_cents };
                if let Some(body) = o.body.as_ref().filter(|b| **b != want) {
                    let body = body.clone();
                    self.streamed.outbox.hit(|| {
                        format!(
                            "event {}: payload says payment {}, account {}, {} cents; committed account {}, {} cents",
                            o.id,
                            body.payment_id,
                            body.account_id,
                            body.amount_cents,
                            want.account_id,
                            want.amount_cents
                        )
                    });
                }
            }
        }
        self.events_sorted = false;
        self.events.push(EventEntry {
            id: o.id,
            payment: payment.map(|i| i as u32).unwrap_or(NO_PAYMENT),
            kind: o.kind,
            published: o.published,
            seen: 0,
            marks: 0,
        });
    }

    pub(super) fn seal_events(&mut self) {
        sort_once(&mut self.events, &mut self.events_sorted, |e| e.id);
    }

    pub(super) fn event(&mut self, id: Uuid) -> Option<usize> {
        self.seal_events();
        self.events.binary_search_by_key(&id, |e| e.id).ok()
    }

    /// The payment and kind of a known event: (payment index, kind).
    pub(super) fn cause(&mut self, id: Uuid) -> Option<(usize, Option<EventKind>)> {
        let e = self.event(id)?;
        let ev = self.events[e];
        (ev.payment != NO_PAYMENT).then_some((ev.payment as usize, ev.kind))
    }

    /// One receipt row: it must come from its payment's captured event.
    pub fn add_receipt(&mut self, payment: Uuid, message: Uuid) {
        let cause = self.cause(message);
        match self.payment(payment) {
            Some(i) => self.payments[i].receipts = self.payments[i].receipts.saturating_add(1),
            None => match self.stray_receipts.last_mut() {
                Some((p, n)) if *p == payment => *n += 1,
                _ => self.stray_receipts.push((payment, 1)),
            },
        }
        // Whether it is caused by its own captured event, the core checks;
        // the emails are matched against it here.
        let ok = matches!(cause, Some((i, Some(EventKind::Captured))) if self.payments[i].id == payment);
        if let (true, Some((i, _))) = (ok, cause) {
            self.payments[i].flags |= flag::RECEIPT_CAUSED;
        } else {
            self.odd_receipts.push((payment, message));
        }
    }

    /// What a cause is, for an example.
    pub(super) fn describe_cause(&self, cause: Option<(usize, Option<EventKind>)>, id: Uuid) -> String {
        match cause {
            None => format!("{id}, which is no outbox event"),
            Some((i, kind)) => format!(
                "event {id} ({} of payment {})",
                kind.map(|k| k.status()).unwrap_or("malformed"),
                self.payments[i].id
            ),
        }
    }

    /// The projection's row for a payment, with the event that set it.
    pub fn add_projection(&mut self, payment: Uuid, captured: bool, event: Option<Uuid>) {
        let status = if captured { EventKind::Captured } else { EventKind::Authorized };
        let cause = event.and_then(|e| self.cause(e));
        let Some(i) = self.payment(payment) else {
            self.streamed
                .projection_cause
                .hit(|| format!("projection row for payment {payment}, which does not exist"));
            return;
        };
        self.payments[i].projection = if captured { 2 } else { 1 };
        if !matches!(cause, Some((j, Some(k))) if j == i && k == status) {
            let why = match event {
                None => "no event".to_string(),
                Some(e) => self.describe_cause(cause, e),
            };
            self.streamed
                .projection_cause
                .hit_on(payment, || format!("projection of payment {payment} shows {} set by {why}", status.status()));
        }
    }

    /// One inbox row: an outbox event, claimed for one of its handlers.
    pub fn add_inbox_row(&mut self, message: Uuid, handler: &str) {
        let handler = Handler::parse(handler);
        if let Some(h) = handler {
            *self.inbox_rows.entry(h).or_default() += 1;
        }
        let e = self.event(message);
        let valid = match (e, handler) {
            (Some(e), Some(h)) => {
                let ev = &mut self.events[e];
                ev.marks |= h.bit();
                ev.kind.is_some_and(|k| handlers_fed_by(k).contains(&h))
            }
            _ => false,
        };
        if !valid {
            let kind = e.map(|e| self.events[e].kind.map(|k| k.status()).unwrap_or("malformed"));
            self.streamed.inbox_cause.hit(|| match kind {
                None => format!("inbox row ({message}, {handler:?}) for no outbox event"),
                Some(k) => format!("inbox row ({message}, {handler:?}) for a {k} event"),
            });
        }
    }

    /// One dead letter, by the message id it was recorded under.
    pub fn add_dead_letter(&mut self, message_id: &str) {
        self.dead_letters += 1;
        let e = Uuid::parse_str(message_id).ok().and_then(|id| self.event(id));
        match e {
            Some(e) if self.events[e].kind.is_none() => self.events[e].marks |= mark::DEAD_LETTER,
            _ => self.streamed.dead_letter.hit(|| format!("dead letter {message_id} is no malformed outbox event")),
        }
    }

    /// One stripe of the loyalty counter.
    pub fn add_loyalty(&mut self, account: i32, points: i64) {
        *self.loyalty.entry(account).or_default() += points;
    }

    /// One loyalty credit: it must come from a captured event of a payment
    /// on this account, for that payment's amount.
    pub fn add_credit(&mut self, event: Uuid, account: i32, points: i64) {
        self.credits += 1;
        *self.credited.entry(account).or_default() += points;
        let cause = self.cause(event);
        if let Some(e) = self.event(event) {
            let ev = &mut self.events[e];
            let n = (ev.credits() + 1).min(15);
            ev.marks = (ev.marks & !(0xf << mark::CREDIT_SHIFT)) | (n << mark::CREDIT_SHIFT);
        }
        let ok = matches!(cause, Some((i, Some(EventKind::Captured)))
            if self.payments[i].account_id == account && self.payments[i].amount_cents == points);
        if !ok {
            let why = self.describe_cause(cause, event);
            let on = cause.map(|(i, _)| (self.payments[i].account_id, self.payments[i].amount_cents));
            self.streamed.credit_cause.hit(|| match on {
                Some((a, amount)) => {
                    format!(
                        "{points} points to account {account} caused by {why}, which is {amount} cents on account {a}"
                    )
                }
                None => format!("{points} points to account {account} caused by {why}"),
            });
        }
    }

    /// Room for the `n` messages the topic holds, made once: grown by
    /// doubling, the entries of a million payments (2.2 million, 16 bytes
    /// each) took room for 4.2 million, and 96 MB while the last doubling
    /// copied them, at the verifier's peak of memory.
    pub fn expect_messages(&mut self, n: usize) {
        self.messages.reserve_exact(n.saturating_sub(self.messages.len()));
    }

    /// One message read from the topic: counted, and kept by its payment.
    /// Whether it is an outbox event, equal to its row, the core checks.
    pub fn add_message(&mut self, m: TopicRecord) {
        self.topic_messages += 1;
        if let Some(i) = m.event_id.and_then(|id| self.event(id)) {
            self.topic_known += 1;
            let e = &mut self.events[i];
            e.seen = e.seen.saturating_add(1);
        }
        if let Some(i) = m.payment_id.and_then(|p| self.payment(p)) {
            self.messages.push(MessageEntry { at: m.position.packed(), payment: i as u32, kind: m.kind });
        }
    }

    /// Copies on the topic of an event (0 for an unknown one).
    pub fn copies(&mut self, event: Uuid) -> u8 {
        self.event(event).map(|e| self.events[e].seen).unwrap_or(0)
    }

    /// For each subject (a payment, or an event of one), its payment, and
    /// each such payment's messages on the topic: what an anomaly's story
    /// shows of the topic. One pass over the messages.
    pub fn messages_of(
        &mut self,
        subjects: &[Uuid],
    ) -> (HashMap<Uuid, Uuid>, HashMap<Uuid, Vec<super::story::TopicMessage>>) {
        let mut payment_of = HashMap::new();
        let mut wanted: HashMap<u32, Uuid> = HashMap::new();
        for &s in subjects {
            let i = match self.payment(s) {
                Some(i) => Some(i as u32),
                None => self.event(s).map(|e| self.events[e].payment).filter(|&p| p != NO_PAYMENT),
            };
            if let Some(i) = i {
                let id = self.payments[i as usize].id;
                payment_of.insert(s, id);
                wanted.insert(i, id);
            }
        }
        let mut messages: HashMap<Uuid, Vec<super::story::TopicMessage>> = HashMap::new();
        for m in self.messages.iter() {
            if let Some(id) = wanted.get(&m.payment) {
                let msg = super::story::TopicMessage::new(m.position(), m.kind);
                messages.entry(*id).or_default().push(msg);
            }
        }
        (payment_of, messages)
    }
}

/// The database half of the ground truth streams straight into the ledger.
impl TruthSink for Ledger {
    fn payment(&mut self, row: PaymentRow) {
        self.add_payment(row)
    }
    fn event(&mut self, row: OutboxRecord) {
        self.add_event(row)
    }
    fn inbox_row(&mut self, message: Uuid, handler: &str) {
        self.add_inbox_row(message, handler)
    }
    fn receipt(&mut self, payment: Uuid, message: Uuid) {
        self.add_receipt(payment, message)
    }
    fn projection(&mut self, payment: Uuid, captured: bool, event: Option<Uuid>) {
        self.add_projection(payment, captured, event)
    }
    fn dead_letter(&mut self, message_id: &str) {
        self.add_dead_letter(message_id)
    }
    fn loyalty(&mut self, account: i32, points: i64) {
        self.add_loyalty(account, points)
    }
    fn credit(&mut self, event: Uuid, account: i32, points: i64) {
        self.add_credit(event, account, points)
    }
}
