//! The verifier's checks on hand-made worlds: a healthy one holds every
//! invariant, and each planted bug breaks exactly the invariants it should.

use super::compose;
use super::declared::Books;
use super::ledger::{EventEntry, MessageEntry, OutboxRecord, PaymentEntry, PaymentRow};
use super::reconcile::{Reconciliation, Spec};
use super::topic::{Read, TopicRecord};
use crate::broker::Position;
use crate::domain::events::{fingerprint, EventKind, PaymentEvent};
use crate::domain::intent::Intended;
use crate::provider::{Body, EmailId, IdempotencyKey, Outcome, Record, Request};
use crate::store::{sqlite::SqliteStore, Store};
use uuid::Uuid;

/// Hand-made ground truth, fed to a [`Ledger`] as the readers feed it.
#[derive(Default, Clone)]
struct World {
    intent: Vec<Intended>,
    payments: Vec<PaymentRow>,
    outbox: Vec<OutboxRecord>,
    inbox: Vec<(Uuid, &'static str)>,
    receipts: Vec<(Uuid, Uuid)>,
    projection: Vec<(Uuid, bool, Option<Uuid>)>,
    dead_letters: Vec<String>,
    loyalty: Vec<(i32, i64)>,
    credits: Vec<(Uuid, i32, i64)>,
    topic: Vec<TopicRecord>,
    scenario_payments: u64,
    /// The provider's record, when the world sends emails.
    emails: Option<Record>,
}

impl World {
    /// Judged as a run is: the core checker and the payments checker,
    /// composed, fed the same rows through one sink.
    fn reconcile(&self) -> Reconciliation {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(self.reconcile_on_sqlite())
    }

    async fn reconcile_on_sqlite(&self) -> Reconciliation {
        use crate::domain::rows::TruthSink;
        let sys = crate::scenario::payments_declaration(self.emails.is_some()).expect("the built-in declaration");
        let dir = tempfile::tempdir().unwrap();
        let store = self.tables(&sys, dir.path()).await;
        let ops = compose::operations(&sys, &self.intent);
        let books = Books::new(&sys, ops, vec![], 0);
        let mut t = compose::Truth::new(&sys, self.intent.clone(), books);
        self.payments.iter().for_each(|p| t.payment(p.clone()));
        self.outbox.iter().for_each(|o| t.event(o.clone()));
        self.inbox.iter().for_each(|(m, h)| t.inbox_row(*m, h));
        self.receipts.iter().for_each(|(p, m)| t.receipt(*p, *m));
        self.projection.iter().for_each(|(p, c, e)| t.projection(*p, *c, *e));
        self.dead_letters.iter().for_each(|d| t.dead_letter(d));
        self.loyalty.iter().for_each(|(a, n)| t.loyalty(*a, *n));
        self.credits.iter().for_each(|(e, a, n)| t.credit(*e, *a, *n));
        // As the verifier does: the declaration's queries after the
        // database's read, the emails once the database is read.
        t.read_declared(&store).await.expect("the built-in declaration's queries");
        t.provider_record(self.emails.clone());
        for m in &self.topic {
            let key = m.payment_id.map(|p| p.to_string().into_bytes()).unwrap_or_default();
            let id = m.event_id.map(|e| e.to_string().into_bytes());
            t.add_message(Read { record: m.clone(), key, id });
        }
        t.finish(&Spec { payments: self.scenario_payments, outbox: true }).0
    }

    /// The tables the built-in declaration's queries read, as a run
    /// leaves them in the embedded store: the pipeline's migrations and
    /// the outbox log's trigger, the outbox, receipts, projection, points,
    /// credits and dead letters.
    async fn tables(&self, sys: &crate::scenario::System, dir: &std::path::Path) -> Store {
        let store = Store::Sqlite(SqliteStore::open(&dir.join("world.sqlite"), 2).await.unwrap());
        crate::store::declared::install_outbox_log(&store, &sys.outbox).await.unwrap();
        let Store::Sqlite(s) = &store else { unreachable!() };
        let pool = s.read_pool();
        let run = |sql: &'static str| sqlx::query(sql);
        for o in &self.outbox {
            let kind = o.kind.map_or("malformed", EventKind::event_type);
            let payload = o
                .body
                .as_ref()
                .map_or_else(|| r#"{"poison": true}"#.to_string(), |b| serde_json::to_string(b).unwrap());
            run("INSERT INTO outbox (id, aggregate_id, event_type, payload) VALUES (?, ?, ?, ?)")
                .bind(o.id)
                .bind(o.payment_id)
                .bind(kind)
                .bind(payload)
                .execute(&pool)
                .await
                .unwrap();
        }
        for (payment, message) in &self.receipts {
            let q = run("INSERT INTO receipts (payment_id, message_id) VALUES (?, ?)");
            q.bind(payment).bind(message).execute(&pool).await.unwrap();
        }
        for (payment, captured, event) in &self.projection {
            let status = if *captured { "captured" } else { "authorized" };
            let q = run("INSERT INTO payment_projection (payment_id, status, event_id) VALUES (?, ?, ?)");
            q.bind(payment).bind(status).bind(event).execute(&pool).await.unwrap();
        }
        for (stripe, (account, points)) in self.loyalty.iter().enumerate() {
            let q = run("INSERT INTO loyalty_points (account_id, stripe, points) VALUES (?, ?, ?)");
            q.bind(account).bind(stripe as i64).bind(points).execute(&pool).await.unwrap();
        }
        for (event, account, points) in &self.credits {
            let q = run("INSERT INTO loyalty_credits (event_id, account_id, points) VALUES (?, ?, ?)");
            q.bind(event).bind(account).bind(points).execute(&pool).await.unwrap();
        }
        for (offset, message) in self.dead_letters.iter().enumerate() {
            let q = run("INSERT INTO dead_letters (message_id, topic_partition, topic_offset, payload, error) \
                         VALUES (?, 0, ?, '', 'malformed')");
            q.bind(message).bind(offset as i64).execute(&pool).await.unwrap();
        }
        store
    }

    /// The event of payment `i` of this kind.
    fn event(&self, i: usize, kind: EventKind) -> Uuid {
        let pid = self.payments[i].id;
        self.outbox.iter().find(|o| o.payment_id == pid && o.kind == Some(kind)).unwrap().id
    }
}

fn payload(p: &Intended) -> String {
    serde_json::to_string(&PaymentEvent { payment_id: p.id, account_id: p.account_id, amount_cents: p.amount_cents })
        .unwrap()
}

/// A healthy world: `n` payments on three accounts, both events on the
/// topic once (each payment on one partition), one receipt, one credit,
/// the projection captured by the captured event, inbox and counter in step.
fn healthy(n: usize) -> World {
    let mut w = World { scenario_payments: n as u64, ..World::default() };
    for i in 0..n {
        let p = Intended {
            id: Uuid::from_u128(1000 + i as u128),
            amount_cents: 100 + i as i64,
            account_id: (i % 3) as i32,
            captured: true,
            poison: false,
        };
        w.intent.push(p);
        w.payments.push(PaymentRow {
            id: p.id,
            account_id: p.account_id,
            amount_cents: p.amount_cents,
            captured: true,
        });
        let text = payload(&p);
        for (j, kind) in [EventKind::Authorized, EventKind::Captured].into_iter().enumerate() {
            let id = Uuid::from_u128(((i as u128) << 8) | j as u128 | 1 << 100);
            let fp = fingerprint(p.id.to_string().as_bytes(), kind.event_type().as_bytes(), text.as_bytes());
            let body = serde_json::from_str(&text).ok();
            w.outbox.push(OutboxRecord {
                id,
                payment_id: p.id,
                kind: Some(kind),
                body,
                published: true,
                fingerprint: fp,
                at_epoch_ms: 0,
            });
            let lane = (i % 2) as i32;
            // Payments alternate lanes, two messages each.
            let offset = ((i / 2) * 2 + j) as i64;
            w.topic.push(TopicRecord {
                position: Position::new(lane, offset),
                event_id: Some(id),
                payment_id: Some(p.id),
                kind: Some(kind),
                fingerprint: fp,
            });
            w.inbox.push((id, "projection"));
            if kind == EventKind::Captured {
                w.inbox.push((id, "receipts"));
                w.inbox.push((id, "loyalty"));
                w.receipts.push((p.id, id));
                w.projection.push((p.id, true, Some(id)));
                w.credits.push((id, p.account_id, p.amount_cents));
                w.loyalty.push((p.account_id, p.amount_cents));
            }
        }
    }
    w
}

fn failing(r: &Reconciliation) -> Vec<String> {
    r.invariants.iter().filter(|i| !i.ok).map(|i| i.name.clone()).collect()
}

fn anomaly<'a>(r: &'a Reconciliation, name: &str) -> &'a super::Anomaly {
    r.anomalies.iter().find(|a| a.name == name).unwrap_or_else(|| panic!("no {name:?} in {:?}", r.anomalies))
}

#[track_caller]
fn fails_with(w: &World, want: &[&str]) -> Reconciliation {
    let r = w.reconcile();
    // In any order: the payments checker's come first, then the core's.
    let (mut got, mut want) = (failing(&r), want.to_vec());
    got.sort_unstable();
    want.sort_unstable();
    assert_eq!(got, want, "{:#?}", r.anomalies);
    // Every failing invariant shows its anomaly, but the workload's own
    // count: a shortfall is a run cut short, which harms no payment.
    let workload = "payments committed = the scenario's payments";
    for i in r.invariants.iter().filter(|i| !i.ok && i.name != workload) {
        assert!(!i.anomalies.is_empty(), "{} failed without an anomaly to show", i.name);
    }
    r
}

#[test]
fn ledger_entries_stay_compact() {
    // A million payments keep two events and about 2.2 messages each:
    // these sizes are what keeps the verifier within its memory budget.
    assert!(std::mem::size_of::<PaymentEntry>() <= 40);
    assert!(std::mem::size_of::<EventEntry>() <= 28);
    assert!(std::mem::size_of::<MessageEntry>() <= 16);
}

#[test]
fn healthy_world_holds_every_invariant() {
    let r = healthy(10).reconcile();
    assert!(failing(&r).is_empty(), "{:?} {:#?}", failing(&r), r.anomalies);
    assert!(r.anomalies.is_empty());
    assert_eq!(r.counts.payments_committed, 10);
    assert_eq!(r.counts.topic_messages, 20);
    assert_eq!(r.counts.topic_duplicates, 0);
    assert_eq!(r.counts.reordered_payments, 0);
    assert_eq!(r.counts.loyalty_credits, 10);
}

#[test]
fn every_invariant_has_an_id_of_its_own_and_counts_how_far_off_it_is() {
    let r = healthy(10).reconcile();
    let mut ids: Vec<&str> = r.invariants.iter().map(|i| i.id.as_str()).collect();
    assert!(ids.iter().all(|id| !id.is_empty() && !id.contains(' ')), "{ids:?}");
    ids.sort();
    let n = ids.len();
    ids.dedup();
    assert_eq!(ids.len(), n, "two invariants share an id");
    // The same ids whatever the data: a seed changes counts, not names.
    let other: Vec<String> = healthy(3).reconcile().invariants.into_iter().map(|i| i.id).collect();
    assert_eq!(r.invariants.iter().map(|i| i.id.clone()).collect::<Vec<_>>(), other);
    for i in &r.invariants {
        if let Some(off) = i.off_by {
            assert_eq!(off == 0, i.ok, "{} is off by {off} and ok = {}", i.name, i.ok);
        }
    }
    let missing = crate::verifier::Invariant::eq("receipts sent", 10, 7);
    assert_eq!((missing.off_by, missing.id.as_str()), (Some(3), "receipts-sent"));
}

#[test]
fn replayed_batch_counts_duplicates_and_reordering_but_no_violation() {
    let mut w = healthy(3);
    // The first payment's batch (authorized, captured) is replayed whole.
    let replay: Vec<TopicRecord> = w.topic[0..2].to_vec();
    for mut m in replay {
        m.position = Position::new(m.position.lane(), m.position.at() + 100);
        w.topic.push(m);
    }
    let r = fails_with(&w, &[]);
    assert_eq!(r.counts.topic_duplicates, 2);
    assert_eq!(r.counts.reordered_payments, 1);
}

/// A workload that falls short fails its invariant, and invents no harm:
/// the payment it never committed was nobody's, so it is not a lost one.
#[test]
fn a_workload_that_writes_one_payment_fewer_fails_and_loses_nothing() {
    let mut w = healthy(4);
    w.scenario_payments = 5;
    let r = fails_with(&w, &["payments committed = the scenario's payments"]);
    assert!(r.anomalies.is_empty(), "{:?}", r.anomalies);
}

#[test]
fn a_committed_payment_without_a_row_fails() {
    let mut w = healthy(4);
    let gone = w.payments.remove(2).id;
    let r = w.reconcile();
    assert!(failing(&r).contains(&"every committed payment in the payments table".to_string()));
    assert!(anomaly(&r, "lost payment").examples[0].contains(&gone.to_string()));
}

#[test]
fn a_payment_nobody_committed_fails() {
    let mut w = healthy(2);
    let ghost = Uuid::from_u128(77);
    w.payments.push(PaymentRow { id: ghost, account_id: 1, amount_cents: 5, captured: false });
    let r = w.reconcile();
    assert!(failing(&r).contains(&"every committed payment in the payments table".to_string()));
    assert!(anomaly(&r, "phantom payment").examples[0].contains(&ghost.to_string()));
}

#[test]
fn a_payment_row_with_another_amount_fails_alone() {
    let mut w = healthy(3);
    w.payments[1].amount_cents += 1;
    fails_with(&w, &["payment rows as committed (account, amount, status)"]);
}

#[test]
fn an_outbox_payload_with_another_account_fails_alone() {
    let mut w = healthy(3);
    w.outbox[3].body.as_mut().unwrap().account_id = 9;
    let r = fails_with(&w, &["each payment's outbox events as committed"]);
    assert!(anomaly(&r, "outbox mismatch").examples[0].contains("account 9"));
}

#[test]
fn a_missing_outbox_event_fails() {
    let mut w = healthy(3);
    let e = w.outbox.remove(1).id;
    w.topic.retain(|m| m.event_id != Some(e));
    w.inbox.retain(|(m, _)| *m != e);
    w.receipts.retain(|(_, m)| *m != e);
    let r = w.reconcile();
    assert!(failing(&r).contains(&"each payment's outbox events as committed".to_string()), "{:?}", failing(&r));
}

#[test]
fn lost_event_fails() {
    let mut w = healthy(4);
    w.topic.remove(3);
    let r = fails_with(&w, &["every published outbox event is on the topic", "every payment's events on the topic"]);
    assert_eq!(anomaly(&r, "lost event").count, 2, "the event, and the payment missing it");
}

#[test]
fn foreign_event_fails_alone() {
    let mut w = healthy(2);
    w.topic.push(TopicRecord {
        position: Position::new(0, 99),
        event_id: Some(Uuid::nil()),
        payment_id: None,
        kind: None,
        fingerprint: 0,
    });
    fails_with(&w, &["every message is an outbox event"]);
}

#[test]
fn a_message_that_differs_from_its_outbox_row_fails_alone() {
    let mut w = healthy(3);
    w.topic[2].fingerprint ^= 1;
    let r = fails_with(&w, &["every message equals its outbox row"]);
    assert!(anomaly(&r, "message mismatch").examples[0].contains("differs from its outbox row"));
}

/// A relay that parses the payload and writes it out again publishes the
/// same event when the values are the same: JSON payloads are compared by
/// value, key order and spacing aside ([`crate::domain::canonical`]). A
/// changed value, or a number written in another form (`100.0` for
/// `100`), is a `message mismatch`.
#[test]
fn a_reserialised_payload_is_the_same_event_and_a_changed_value_a_mismatch() {
    let w = healthy(2);
    let (p, m) = (w.intent[0], &w.topic[1]);
    let sent = |payload: String| {
        let mut w = w.clone();
        let kind = m.kind.unwrap().event_type();
        w.topic[1].fingerprint = fingerprint(p.id.to_string().as_bytes(), kind.as_bytes(), payload.as_bytes());
        w
    };
    let (id, account, amount) = (p.id, p.account_id, p.amount_cents);
    // Keys in another order, spaced and broken over lines: the same event.
    let redumped = format!("{{ \"amount_cents\" : {amount},\n  \"account_id\": {account}, \"payment_id\": \"{id}\" }}");
    let r = sent(redumped).reconcile();
    assert!(failing(&r).is_empty() && r.anomalies.is_empty(), "{:?} {:#?}", failing(&r), r.anomalies);
    // A changed value, or the same number in another form: caught.
    for changed in [amount.to_string() + "1", format!("{amount}.0")] {
        let payload = format!(r#"{{"payment_id":"{id}","account_id":{account},"amount_cents":{changed}}}"#);
        let r = fails_with(&sent(payload), &["every message equals its outbox row"]);
        assert_eq!(anomaly(&r, "message mismatch").count, 1, "{changed}");
    }
}

#[test]
fn a_payment_on_two_partitions_fails_alone() {
    let mut w = healthy(3);
    w.topic[1].position = Position::new(7, w.topic[1].position.at());
    // One invariant names it: the core's, by the payment's key.
    let r = fails_with(&w, &["a key's messages are on one partition"]);
    assert_eq!(anomaly(&r, "split key").count, 1);
}

#[test]
fn unpublished_leftover_fails_alone() {
    let mut w = healthy(2);
    w.outbox[1].published = false;
    fails_with(&w, &["no outbox row left unpublished"]);
}

#[test]
fn duplicate_receipt_fails_with_an_example() {
    let mut w = healthy(5);
    let (pid, cause) = (w.payments[2].id, w.event(2, EventKind::Captured));
    w.receipts.push((pid, cause));
    let r = fails_with(
        &w,
        &["effect receipts: exactly one per payment.captured message", "exactly one receipt per captured payment"],
    );
    let a = anomaly(&r, "duplicate effect");
    assert!(a.examples[0].contains(&pid.to_string()), "{:?}", a.examples);
    // The payments checker's example first, where the payment's messages are.
    assert!(a.examples[0].contains("2 receipts; topic: authorized@0:2 captured@0:3"), "{:?}", a.examples);
    assert!(a.examples[1].contains(&format!("2 rows for payment.captured {cause}")), "{:?}", a.examples);
    assert_eq!(a.subjects, [Some(pid), Some(pid)], "each checker's example is about its payment, for its story");
}

#[test]
fn missing_receipt_fails() {
    let mut w = healthy(5);
    let pid = w.payments[0].id;
    w.receipts.retain(|(p, _)| *p != pid);
    let r = fails_with(
        &w,
        &["effect receipts: exactly one per payment.captured message", "exactly one receipt per captured payment"],
    );
    assert_eq!(r.counts.payments_without_receipt, 1);
    anomaly(&r, "missing effect");
}

#[test]
fn receipts_of_unknown_payments_are_duplicates() {
    let mut w = healthy(2);
    let cause = w.event(0, EventKind::Captured);
    w.receipts.push((Uuid::from_u128(7), cause));
    let r = fails_with(
        &w,
        &["effect receipts: exactly one per payment.captured message", "no receipts of payments that do not exist"],
    );
    assert!(anomaly(&r, "duplicate effect").examples[0].contains("does not exist"));
    assert!(anomaly(&r, "misattributed effect").examples[0].contains("the message's key is"));
    assert_eq!(r.counts.receipts, 3);
}

#[test]
fn a_receipt_sent_on_the_wrong_event_fails_alone() {
    // One receipt per payment, the right count: only its cause is wrong.
    let mut w = healthy(3);
    let auth = w.event(1, EventKind::Authorized);
    let pid = w.payments[1].id;
    w.receipts.iter_mut().find(|(p, _)| *p == pid).unwrap().1 = auth;
    let r = fails_with(&w, &["effect receipts: exactly one per payment.captured message"]);
    assert!(anomaly(&r, "misattributed effect").examples[0].contains("authorized"));
}

#[test]
fn loyalty_credited_to_the_wrong_accounts_fails_though_the_total_is_right() {
    let mut w = healthy(6);
    // Two payments' credits and points swap accounts: the total is unchanged.
    let (a, b) = (w.credits[0].1, w.credits[1].1);
    w.credits[0].1 = b;
    w.credits[1].1 = a;
    w.loyalty[0].0 = b;
    w.loyalty[1].0 = a;
    let r = fails_with(
        &w,
        &[
            "effect loyalty points: amounts per key equal the operations' amount_cents",
            "each loyalty credit caused by a captured event of its account",
        ],
    );
    assert_eq!(r.counts.loyalty_points, r.counts.loyalty_points_expected, "the total hides it");
    anomaly(&r, "counter drift");
}

#[test]
fn counter_drift_fails_alone_when_the_credits_are_right() {
    let mut w = healthy(3);
    w.loyalty[1].1 += 100;
    let r = fails_with(
        &w,
        &[
            "effect loyalty points: amounts per key equal the operations' amount_cents",
            "loyalty counter = its credits, per account",
        ],
    );
    let drift = &anomaly(&r, "counter drift").examples;
    assert!(drift[0].starts_with("account 1: counter 201 points, its credits 101"), "{drift:?}");
    assert!(drift[1].contains("key 1 adds up to 201") && drift[1].contains("asked for 101"), "{drift:?}");
}

#[test]
fn a_credit_applied_twice_fails() {
    let mut w = healthy(3);
    let c = w.credits[2];
    w.credits.push(c);
    w.loyalty.push((c.1, c.2));
    let r = fails_with(
        &w,
        &[
            "effect loyalty credits: exactly one per payment.captured message",
            "effect loyalty points: amounts per key equal the operations' amount_cents",
        ],
    );
    anomaly(&r, "duplicate effect");
}

#[test]
fn stale_projection_fails_alone() {
    let mut w = healthy(3);
    let pid = w.payments[1].id;
    let auth = w.event(1, EventKind::Authorized);
    *w.projection.iter_mut().find(|(p, ..)| *p == pid).unwrap() = (pid, false, Some(auth));
    let check = "check \"the projection shows every payment captured, by its own event\" returns no rows";
    fails_with(&w, &[check, "projection shows captured"]);
}

#[test]
fn a_projection_set_by_another_payments_event_fails_alone() {
    let mut w = healthy(3);
    let other = w.event(2, EventKind::Captured);
    w.projection[0].2 = Some(other);
    let check = "check \"the projection shows every payment captured, by its own event\" returns no rows";
    fails_with(&w, &[check, "each projection row set by its payment's event"]);
}

#[test]
fn inbox_mismatch_fails_alone() {
    let mut w = healthy(3);
    let i = w.inbox.iter().position(|(_, h)| *h == "receipts").unwrap();
    w.inbox.remove(i);
    let r = fails_with(&w, &["inbox rows = distinct events, per handler"]);
    assert_eq!(anomaly(&r, "inbox mismatch").count, 2, "the handler's count, and the event without its row");
}

#[test]
fn an_inbox_row_for_no_event_fails() {
    let mut w = healthy(3);
    w.inbox.push((Uuid::from_u128(5), "projection"));
    fails_with(
        &w,
        &["inbox rows = distinct events, per handler", "each inbox row an outbox event, for one of its handlers"],
    );
}

#[test]
fn an_inbox_row_for_a_handler_the_event_has_not_fails() {
    let mut w = healthy(3);
    let auth = w.event(0, EventKind::Authorized);
    let i = w.inbox.iter().position(|(_, h)| *h == "receipts").unwrap();
    w.inbox[i].0 = auth;
    let r = w.reconcile();
    assert!(failing(&r).contains(&"each inbox row an outbox event, for one of its handlers".to_string()));
}

#[test]
fn dead_letters_must_be_the_malformed_events_by_id() {
    let mut w = healthy(2);
    // A malformed twin of payment 0's capture, dead-lettered under its id.
    let mut twin = w.outbox[1].clone();
    twin.id = Uuid::from_u128(9_999);
    twin.kind = None;
    twin.body = None;
    w.intent[0].poison = true;
    w.topic.push(TopicRecord {
        event_id: Some(twin.id),
        kind: None,
        position: Position::new(w.topic[1].position.lane(), 50),
        ..w.topic[1].clone()
    });
    w.outbox.push(twin.clone());
    w.dead_letters.push(twin.id.to_string());
    let r = fails_with(&w, &[]);
    assert_eq!(r.counts.dead_letters_matched, 1);
    // The same count, the wrong id: caught by id.
    w.dead_letters[0] = Uuid::from_u128(4).to_string();
    let r = fails_with(
        &w,
        &["effect dead letters: exactly one per malformed message", "dead letters = the malformed events, by id"],
    );
    assert_eq!(anomaly(&r, "dead letter mismatch").count, 2, "the stray letter and the unlettered event");
}

#[test]
fn uncaptured_payment_fails() {
    let mut w = healthy(3);
    w.intent[0].captured = false;
    let r = w.reconcile();
    assert!(failing(&r).contains(&"every committed payment captured".to_string()));
}

// The emails: the provider's record checked against the intent, the outbox
// and the receipt rows.

/// The four anomalies only the email checks find.
const EMAIL_ANOMALIES: [&str; 4] =
    ["duplicate external effect", "missing external effect", "misattributed external effect", "idempotency key reused"];

/// The notifier's request for payment `i`'s receipt, caused by `message`.
fn email(w: &World, i: usize, message: Uuid, outcome: Outcome) -> Request {
    let p = &w.payments[i];
    let body = serde_json::json!({
        "to": format!("account-{}@customers.example", p.account_id),
        "subject": "Your receipt",
        "payment_id": p.id.to_string(),
        "message_id": message.to_string(),
        "amount_cents": p.amount_cents,
    });
    Request {
        seq: 0,
        at_ms: 0,
        key: Some(IdempotencyKey::new(&format!("{message}:receipts"))),
        body: Body::of_json(&body, &keep()),
        outcome,
    }
}

fn sent(n: usize) -> Outcome {
    Outcome::Sent { id: EmailId(n as u32) }
}

/// The fields the provider's record keeps for the reference notifier.
fn keep() -> Vec<String> {
    crate::provider::RECEIPT_FIELDS.map(String::from).to_vec()
}

/// A healthy world whose notifier sent one email per captured payment.
fn emailing(n: usize) -> World {
    let mut w = healthy(n);
    let requests = (0..n).map(|i| email(&w, i, w.event(i, EventKind::Captured), sent(i))).collect();
    w.emails = Some(Record { requests, started_epoch_ms: 0, keep: keep() });
    renumber(&mut w);
    w
}

/// Adds a request at the end of the world's record, numbered in arrival order.
fn push(w: &mut World, mut q: Request) {
    let record = w.emails.as_mut().unwrap();
    q.seq = record.requests.len() as u64;
    record.requests.push(q);
}

/// Renumbers the record after a request was taken out.
fn renumber(w: &mut World) {
    for (seq, q) in w.emails.as_mut().unwrap().requests.iter_mut().enumerate() {
        q.seq = seq as u64;
    }
}

fn names_of(r: &Reconciliation) -> Vec<&str> {
    r.anomalies.iter().map(|a| a.name.as_str()).collect()
}

fn email_anomalies(r: &Reconciliation) -> Vec<&str> {
    names_of(r).into_iter().filter(|n| EMAIL_ANOMALIES.contains(n)).collect()
}

#[test]
fn one_email_per_captured_payment_holds_every_email_invariant() {
    let w = emailing(6);
    let r = fails_with(&w, &[]);
    assert!(r.anomalies.is_empty(), "{:#?}", r.anomalies);
    let names: Vec<&str> = r.invariants.iter().map(|i| i.name.as_str()).collect();
    for want in [
        "effect receipt emails: exactly one per payment.captured message",
        "receipt rows = emails, both ways",
        "no idempotency key reused with another body (the provider's 409)",
    ] {
        assert!(names.contains(&want), "{want:?} not in {names:?}");
    }
    assert_eq!((r.counts.emails_sent, r.counts.emails_absorbed, r.counts.emails_refused), (Some(6), Some(0), Some(0)));
}

#[test]
fn a_repeat_the_provider_absorbed_is_no_anomaly() {
    let mut w = emailing(3);
    // A retry after a lost response, and one while the first was being sent.
    let e = w.event(1, EventKind::Captured);
    let repeats = [
        email(&w, 1, e, Outcome::Replayed { id: EmailId(1) }),
        email(&w, 1, e, Outcome::InUse),
        email(&w, 2, w.event(2, EventKind::Captured), Outcome::Unavailable),
    ];
    repeats.into_iter().for_each(|q| push(&mut w, q));
    let r = fails_with(&w, &[]);
    assert_eq!((r.counts.emails_sent, r.counts.emails_absorbed, r.counts.emails_refused), (Some(3), Some(1), Some(2)));
}

#[test]
fn without_emails_there_is_no_email_check_nor_figure() {
    let w = healthy(4);
    let r = w.reconcile();
    let mut with = emailing(4).reconcile();
    let emails = |i: &&super::Invariant| i.name.contains("email") || i.name.contains("idempotency");
    assert_eq!(with.invariants.iter().filter(emails).count(), 3, "the email checks add three invariants");
    with.invariants.retain(|i| !emails(&i));
    assert_eq!(with.invariants, r.invariants, "the other invariants stay as they were");
    assert!(!r.invariants.iter().any(|i| i.name.contains("email") || i.name.contains("idempotency")));
    assert_eq!((r.counts.emails_sent, r.counts.emails_absorbed, r.counts.emails_refused), (None, None, None));
    let json = serde_json::to_string(&r.counts).unwrap();
    assert!(!json.contains("email"), "a run without emails reports no email figure: {json}");
}

#[test]
fn a_second_email_sent_for_one_payment_is_a_duplicate_external_effect() {
    let mut w = emailing(4);
    // The same receipt sent again under another key: the provider cannot absorb it.
    let mut again = email(&w, 2, w.event(2, EventKind::Captured), sent(9));
    again.key = Some("another-key".into());
    push(&mut w, again);
    let r = fails_with(&w, &["effect receipt emails: exactly one per payment.captured message"]);
    assert_eq!(names_of(&r), ["duplicate external effect"]);
    let a = anomaly(&r, "duplicate external effect");
    let pid = w.payments[2].id;
    assert_eq!(a.subjects, [Some(pid)]);
    let cause = w.event(2, EventKind::Captured);
    assert!(a.examples[0].contains(&format!("2 rows for payment.captured {cause}; key {pid}")), "{:?}", a.examples);
}

#[test]
fn a_captured_payment_without_an_email_is_a_missing_external_effect() {
    let mut w = emailing(4);
    let pid = w.payments[1].id;
    let refused = email(&w, 1, w.event(1, EventKind::Captured), Outcome::Unavailable);
    let requests = &mut w.emails.as_mut().unwrap().requests;
    requests.retain(|q| q.outcome.sent() != Some(EmailId(1)));
    push(&mut w, refused);
    let r = fails_with(&w, &["effect receipt emails: exactly one per payment.captured message"]);
    assert_eq!(names_of(&r), ["missing external effect"], "its receipt row is named here, not again");
    let a = anomaly(&r, "missing external effect");
    assert_eq!(a.subjects, [Some(pid)]);
    assert!(a.examples[0].contains(&format!("no row for payment.captured")), "{:?}", a.examples);
    assert!(a.examples[0].contains(&pid.to_string()), "{:?}", a.examples);
}

#[test]
fn an_email_caused_by_another_event_is_misattributed() {
    let mut w = emailing(4);
    // Payment 3's email names its authorized event as its cause.
    let wrong = w.event(3, EventKind::Authorized);
    w.emails.as_mut().unwrap().requests[3] = email(&w, 3, wrong, sent(3));
    renumber(&mut w);
    let r = fails_with(
        &w,
        &["effect receipt emails: exactly one per payment.captured message", "receipt rows = emails, both ways"],
    );
    // Its captured event got no email; the email it sent names another event.
    assert_eq!(names_of(&r), ["misattributed external effect", "missing external effect"]);
    let a = anomaly(&r, "misattributed external effect");
    let pid = w.payments[3].id.to_string();
    assert!(a.examples[0].contains("receipt row") && a.examples[0].contains(&pid), "{:?}", a.examples);
    assert!(a.examples[1].contains(&wrong.to_string()), "{:?}", a.examples);
    assert!(a.examples[1].contains("authorized"), "{:?}", a.examples);
}

#[test]
fn emails_that_name_no_payment_or_an_unknown_one_are_misattributed() {
    let mut w = emailing(2);
    let cause = w.event(0, EventKind::Captured);
    let mut unknown = email(&w, 0, cause, sent(7));
    unknown.body =
        Body::of_json(&serde_json::json!({"payment_id": Uuid::from_u128(7).to_string(), "message_id": cause}), &keep());
    push(&mut w, unknown);
    let mut text = email(&w, 0, cause, sent(8));
    text.body = Body::not_json("receipt", &keep());
    push(&mut w, text);
    let mut bare = email(&w, 0, cause, sent(9));
    bare.body = Body::of_json(&serde_json::json!({"to": "someone"}), &keep());
    push(&mut w, bare);
    let r = fails_with(&w, &["effect receipt emails: exactly one per payment.captured message"]);
    assert_eq!(names_of(&r), ["misattributed external effect"]);
    let a = anomaly(&r, "misattributed external effect");
    assert_eq!(a.count, 3);
    // One names a payment that is not its message's; two name no message.
    assert!(a.examples[0].contains("the message's key is"), "{:?}", a.examples);
    assert!(a.examples[1].contains("names message NULL"), "{:?}", a.examples);
    assert!(a.examples[2].contains("names message NULL"), "{:?}", a.examples);
}

#[test]
fn an_email_without_its_receipt_row_is_misattributed() {
    let mut w = emailing(4);
    let pid = w.payments[2].id;
    // The email went out, its receipt row never committed.
    w.receipts.retain(|(p, _)| *p != pid);
    let r = w.reconcile();
    assert_eq!(email_anomalies(&r), ["misattributed external effect"]);
    assert_eq!(names_of(&r), ["missing effect", "misattributed external effect"], "the database's check sees no row");
    assert!(failing(&r).contains(&"receipt rows = emails, both ways".to_string()), "{:?}", failing(&r));
    let a = anomaly(&r, "misattributed external effect");
    assert_eq!(a.subjects, [Some(pid)]);
    let cause = w.event(2, EventKind::Captured).to_string();
    assert!(a.examples[0].contains(&pid.to_string()) && a.examples[0].contains(&cause), "{:?}", a.examples);
    assert!(a.examples[0].contains("no receipt row"), "{:?}", a.examples);
}

#[test]
fn a_receipt_row_without_its_email_is_misattributed() {
    let mut w = emailing(3);
    let pid = w.payments[0].id;
    // A second receipt row, from the payment's authorized event: no email matches it.
    let other = w.event(0, EventKind::Authorized);
    w.receipts.push((pid, other));
    let r = w.reconcile();
    assert_eq!(email_anomalies(&r), ["misattributed external effect"]);
    let a = anomaly(&r, "misattributed external effect");
    assert_eq!(a.subjects, [Some(pid)]);
    assert!(a.examples[0].contains(&pid.to_string()) && a.examples[0].contains(&other.to_string()));
    assert!(a.examples[0].contains("has no email"), "{:?}", a.examples);
}

#[test]
fn a_key_sent_again_with_another_body_is_a_reused_idempotency_key() {
    let mut w = emailing(3);
    let mut other = email(&w, 1, w.event(1, EventKind::Captured), Outcome::Conflict);
    // Another amount: another body under the same key.
    let mut asked = serde_json::json!({
        "payment_id": w.payments[1].id.to_string(),
        "message_id": w.event(1, EventKind::Captured).to_string(),
        "amount_cents": 1,
    });
    other.body = Body::of_json(&asked, &keep());
    asked["amount_cents"] = serde_json::json!(2);
    assert_ne!(Body::of_json(&asked, &keep()).fingerprint, other.body.fingerprint);
    let key = other.key.clone().unwrap().to_string();
    push(&mut w, other);
    let r = fails_with(&w, &["no idempotency key reused with another body (the provider's 409)"]);
    assert_eq!(names_of(&r), ["idempotency key reused"]);
    let a = anomaly(&r, "idempotency key reused");
    let pid = w.payments[1].id;
    assert_eq!(a.subjects, [Some(pid)]);
    assert!(a.examples[0].contains(&format!("key {key} sent again with another body")), "{:?}", a.examples);
    assert_eq!(r.counts.emails_refused, Some(1));
}

/// What both checkers' books hold at a million payments (two events, two
/// messages and the effects each), over the world they are fed from:
/// measured, not asserted (`cargo test --release --lib truth_memory --
/// --ignored --nocapture`), since resident memory moves with the allocator.
#[test]
#[ignore]
fn truth_memory_at_a_million_payments() {
    let w = healthy(1_000_000);
    use crate::context::memory::status_kb;
    let (rss, peak) = (status_kb("VmRSS:"), status_kb("VmHWM:"));
    let started = std::time::Instant::now();
    let r = w.reconcile();
    let failed: Vec<&str> = r.invariants.iter().filter(|i| !i.ok).map(|i| i.name.as_str()).collect();
    assert!(failed.is_empty(), "{failed:?}");
    eprintln!(
        "both checkers at a million payments: peak {} MB over the world (resident after: {} MB over it), judged in {:.1} s",
        status_kb("VmHWM:").saturating_sub(peak.max(rss)) / 1024,
        status_kb("VmRSS:").saturating_sub(rss) / 1024,
        started.elapsed().as_secs_f64()
    );
}
