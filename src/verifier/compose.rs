//! A payments run judged as Jepsen composes checkers: the core checker
//! (the generic books of [`super::declared`], holding the pipeline's own
//! declaration) judges it as it judges any declared system, and the
//! payments checker (the [`Ledger`]) adds on top what only payments have:
//! the payments table, the outbox bodies against the intent, each payment's
//! events by key and type, the projection, the inbox per handler, the
//! causes by account and amount, receipts against emails, the counter
//! against its credits, and the figures.
//!
//! One read of the database and one of the topic feed both: [`Truth`] is
//! the sink of the first, and takes each message of the second.

use super::declared::Books;
use super::reconcile::{Anomaly, Reconciliation, Spec, EXAMPLES};
use super::story::Calls;
use super::topic::Read;
use super::Ledger;
use crate::domain::events::EventKind;
use crate::domain::intent::Intended;
use crate::domain::operations::{Operation, Outcome};
use crate::domain::rows::{OutboxRecord, PaymentRow, TruthSink};
use crate::error::Result;
use crate::provider::Record;
use crate::scenario::System;
use crate::store::Store;
use uuid::Uuid;

/// The payments the workload committed, as the core's record of intent:
/// each an acknowledged operation keyed by its id, with the values the
/// declaration names.
pub fn operations<'s>(sys: &'s System, intent: &'s [Intended]) -> impl Iterator<Item = Operation> + Clone + 's {
    intent.iter().map(|i| Operation {
        key: i.id,
        values: sys
            .operation
            .values
            .iter()
            .map(|(name, _)| match name.as_str() {
                "account_id" => serde_json::Value::from(i.account_id),
                _ => serde_json::Value::from(i.amount_cents),
            })
            .collect(),
        outcome: Outcome::Acknowledged,
        status: 200,
        sent_ms: 0,
        done_ms: 0,
    })
}

/// Both checkers' ground truth, fed by one read of each source.
pub struct Truth<'a> {
    sys: &'a System,
    ledger: Ledger,
    books: Books<'a>,
    /// The emails' findings, judged once the database is read.
    emails: Option<Reconciliation>,
}

impl<'a> Truth<'a> {
    /// `intent` goes to the ledger; `books` already hold it as operations.
    pub fn new(sys: &'a System, intent: Vec<Intended>, books: Books<'a>) -> Self {
        let mut ledger = Ledger::new();
        for p in intent {
            ledger.add_intended(p);
        }
        Self { sys, ledger, books: books.told_by_the_report(), emails: None }
    }

    /// The declaration's own queries, each effect's and each check's, run
    /// on the store into the core's books, as a declared system's are
    /// ([`super::declared::read`]): after the database's read, so that the
    /// books hold every outbox event the rows name.
    pub async fn read_declared(&mut self, store: &Store) -> Result<()> {
        super::declared::read::effects_and_checks(store, &mut self.books).await
    }

    /// How many messages the topic read will bring, at most.
    pub fn expect_messages(&mut self, n: usize) {
        self.ledger.expect_messages(n);
    }

    /// One message of the topic read, to both.
    pub fn add_message(&mut self, m: Read) {
        self.books.add_message(m.record.position, &m.key, m.id.as_deref(), m.record.fingerprint);
        self.ledger.add_message(m.record);
    }

    /// The provider's record, once the database is read: the emails are
    /// judged against the payments, events and receipts now, and only what
    /// the stories show of each call is kept ([`Calls`]), so the record is
    /// not held through the topic read, the verifier's peak of memory.
    pub fn provider_record(&mut self, provider: Option<crate::provider::Record>) -> Option<Calls> {
        let Some(record) = provider else {
            if self.sys.uses_provider() {
                self.books.add_provider_record(&Record::default());
            }
            return None;
        };
        let mut found = Reconciliation::default();
        self.ledger.check_emails(&record, &mut found);
        self.books.add_provider_record(&record);
        self.emails = Some(found);
        Some(Calls::of(&record))
    }

    /// Both checkers' findings, composed ([`compose`]), the emails' after
    /// the payments checker's own. The ledger comes back for the look-ups
    /// that follow (the stories', the confirmations').
    pub fn finish(mut self, spec: &Spec) -> (Reconciliation, Ledger) {
        let mut r = self.ledger.check(spec);
        if let Some(emails) = self.emails.take() {
            let c = &mut r.counts;
            (c.emails_sent, c.emails_absorbed, c.emails_refused) =
                (emails.counts.emails_sent, emails.counts.emails_absorbed, emails.counts.emails_refused);
            r.invariants.extend(emails.invariants);
            r.anomalies.extend(emails.anomalies);
        }
        let core = self.books.finish();
        (compose(core.invariants, core.anomalies, r), self.ledger)
    }
}

/// The core's findings with the payments checker's on top. The payments
/// checker's lead, as they name payments and tell where each one's
/// messages are; an anomaly both name is one, its counts added, its
/// examples the payments checker's first.
fn compose(invariants: Vec<super::Invariant>, anomalies: Vec<Anomaly>, payments: Reconciliation) -> Reconciliation {
    let mut out = payments;
    out.invariants.extend(invariants);
    for a in out.anomalies.iter_mut() {
        a.found_by = vec!["payments".into()];
    }
    for mut a in anomalies {
        a.found_by = vec!["core".into()];
        match out.anomalies.iter_mut().find(|b| b.name == a.name) {
            Some(b) => {
                b.found_by.push("core".into());
                b.count += a.count;
                let room = EXAMPLES.saturating_sub(b.examples.len()).min(a.examples.len());
                // Subjects stay aligned with the examples.
                b.subjects.resize(b.examples.len(), None);
                b.subjects.extend(a.subjects.into_iter().chain(std::iter::repeat(None)).take(room));
                b.examples.extend(a.examples.into_iter().take(room));
            }
            None => out.anomalies.push(a),
        }
    }
    out
}

/// The database streams into both: the ledger takes every row; the books
/// take the outbox, and read the effects by the declaration's own queries.
impl TruthSink for Truth<'_> {
    fn payment(&mut self, row: PaymentRow) {
        self.ledger.add_payment(row)
    }

    fn event(&mut self, o: OutboxRecord) {
        if !o.published {
            self.books.add_leftover(o.id.to_string());
        }
        // A malformed event is told apart as the notifier tells it apart.
        let kind = o.kind.map(EventKind::event_type).unwrap_or("malformed");
        self.books.add_outbox_row(o.id, o.payment_id, kind, o.fingerprint, o.at_epoch_ms, o.kind.is_none());
        self.ledger.add_event(o)
    }

    fn inbox_row(&mut self, message: Uuid, handler: &str) {
        self.ledger.add_inbox_row(message, handler)
    }

    fn receipt(&mut self, payment: Uuid, message: Uuid) {
        self.ledger.add_receipt(payment, message)
    }

    fn projection(&mut self, payment: Uuid, captured: bool, event: Option<Uuid>) {
        self.ledger.add_projection(payment, captured, event)
    }

    fn dead_letter(&mut self, message_id: &str) {
        self.ledger.add_dead_letter(message_id)
    }

    fn loyalty(&mut self, account: i32, points: i64) {
        self.ledger.add_loyalty(account, points)
    }

    fn credit(&mut self, event: Uuid, account: i32, points: i64) {
        self.ledger.add_credit(event, account, points)
    }
}
