//! The declared verifier on hand-made rows.

use super::*;
use crate::broker::Position;
use crate::domain::events::fingerprint;
use crate::scenario::{
    CheckDecl, EffectDecl, OperationDecl, OutboxDecl, ProgramCommand, Published, ServiceDecl, Setup, ValueGen,
};
use crate::verifier::attribution;
use std::time::Duration;
use uuid::Uuid;

fn system() -> System {
    System {
        setup: Setup::Sql { path: "schema.sql".into(), text: String::new() },
        service: Some(ServiceDecl {
            command: ProgramCommand { argv: vec!["service".into()], dir: ".".into() },
            instances: 1,
            health: "/health".into(),
            ready_line: None,
            ready_timeout: Duration::from_secs(1),
        }),
        operation: OperationDecl {
            count: 3,
            concurrency: 1,
            method: "POST".into(),
            path: Some("/orders".into()),
            body: None,
            timeout: Duration::from_secs(1),
            events: vec!["OrderPlaced".into()],
            values: vec![
                ("quantity".into(), ValueGen::Range(1, 5)),
                ("sku".into(), ValueGen::OneOf(vec!["apple".into(), "pear".into()])),
            ],
        },
        outbox: OutboxDecl {
            table: "order_events".into(),
            id: "event_id".into(),
            key: "order_id".into(),
            kind: "event_type".into(),
            payload: "body".into(),
            published: Published::Column("published_at".into()),
            malformed: None,
        },
        effects: vec![
            EffectDecl {
                name: "shipments".into(),
                query: String::new(),
                provider: None,
                once: Once::PerMessage,
                types: vec!["OrderPlaced".into()],
                key_value: None,
                conserve: None,
            },
            EffectDecl {
                name: "stock".into(),
                query: String::new(),
                provider: None,
                once: Once::Unbounded,
                types: vec!["OrderPlaced".into()],
                key_value: Some(1),
                conserve: Some(0),
            },
            EffectDecl {
                name: "invoices".into(),
                query: String::new(),
                provider: None,
                once: Once::PerKey,
                types: vec!["OrderPlaced".into()],
                key_value: None,
                conserve: None,
            },
        ],
        checks: vec![CheckDecl { name: "every order has its event".into(), query: String::new() }],
        pending: None,
    }
}

fn op(n: u128, outcome: Outcome, qty: i64, sku: &str) -> Operation {
    Operation {
        key: Uuid::from_u128(n),
        values: vec![qty.into(), sku.into()],
        outcome,
        status: 201,
        sent_ms: 10,
        done_ms: 20,
    }
}

fn event(id: u128, key: u128, payload: &str) -> LoggedEvent {
    LoggedEvent {
        id: Uuid::from_u128(id).to_string(),
        key: Uuid::from_u128(key).to_string(),
        kind: "OrderPlaced".into(),
        payload: payload.into(),
        at_epoch_ms: 0,
        malformed: false,
    }
}

/// A world where every operation had exactly one effect, built row by
/// row as the real reads feed it; `plant` changes it before the
/// verdict.
fn world(ops: &[Operation], plant: impl FnOnce(&mut Books)) -> Found {
    let sys = Box::leak(Box::new(system()));
    let mut b = Books::new(sys, ops.iter().cloned(), vec![], 0);
    plant(&mut b);
    b.finish()
}

/// The rows a correct system leaves for an acknowledged operation.
fn correct(b: &mut Books, id: u128, key: u128, qty: i64, sku: &str, partition: i32) {
    let payload = format!(r#"{{"order_id": "{}", "quantity": {qty}}}"#, Uuid::from_u128(key));
    b.add_event(event(id, key, &payload));
    let k = Uuid::from_u128(key).to_string();
    let i = Uuid::from_u128(id).to_string();
    b.add_message(
        Position::new(partition, id as i64),
        k.as_bytes(),
        Some(i.as_bytes()),
        fingerprint(k.as_bytes(), b"OrderPlaced", payload.as_bytes()),
    );
    b.add_effect_row(0, EffectRow { message_id: Some(i.clone()), key: Some(k.clone()), amount: None });
    b.add_effect_row(1, EffectRow { message_id: None, key: Some(sku.into()), amount: Some(qty) });
    b.add_effect_row(2, EffectRow { message_id: Some(i), key: Some(k), amount: None });
}

fn names(f: &Found) -> Vec<&str> {
    f.anomalies.iter().map(|a| a.name.as_str()).collect()
}

fn ops() -> Vec<Operation> {
    vec![
        op(1, Outcome::Acknowledged, 2, "apple"),
        op(2, Outcome::Acknowledged, 3, "apple"),
        op(3, Outcome::Ambiguous, 1, "pear"),
    ]
}

#[test]
fn a_correct_system_holds_every_invariant() {
    let ops = ops();
    let f = world(&ops, |b| {
        correct(b, 11, 1, 2, "apple", 0);
        correct(b, 12, 2, 3, "apple", 1);
        // The ambiguous one took no effect: nothing of it anywhere.
        b.add_check("every order has its event", 0, vec![]);
    });
    assert!(f.anomalies.is_empty(), "{:?}", f.anomalies);
    assert!(f.invariants.iter().all(|i| i.ok), "{:?}", f.invariants);
    assert_eq!(f.figures.acknowledged, 2);
    assert_eq!(f.figures.ambiguous, 1);
}

#[test]
fn json_key_order_and_spacing_are_not_a_mismatch_but_a_changed_value_is() {
    let ops = vec![op(1, Outcome::Acknowledged, 2, "apple")];
    let k = Uuid::from_u128(1).to_string();
    let i = Uuid::from_u128(11).to_string();
    let f = world(&ops, |b| {
        b.add_event(event(11, 1, r#"{"a": 1, "b": [2, 3]}"#));
        b.add_message(
            Position::new(0, 0),
            k.as_bytes(),
            Some(i.as_bytes()),
            fingerprint(k.as_bytes(), b"OrderPlaced", br#"{"b":[2,3],"a":1}"#),
        );
    });
    assert!(!names(&f).contains(&"message mismatch"), "{:?}", f.anomalies);
    let f = world(&ops, |b| {
        b.add_event(event(11, 1, r#"{"a": 1}"#));
        b.add_message(
            Position::new(0, 0),
            k.as_bytes(),
            Some(i.as_bytes()),
            fingerprint(k.as_bytes(), b"OrderPlaced", br#"{"a":2}"#),
        );
    });
    assert!(names(&f).contains(&"message mismatch"), "{:?}", f.anomalies);
}

#[test]
fn operations_are_judged_by_their_outcome() {
    // Acknowledged with no event; ambiguous with two; refused with one;
    // and a key never asked for.
    let ops = vec![
        op(1, Outcome::Acknowledged, 2, "apple"),
        op(2, Outcome::Ambiguous, 3, "apple"),
        op(3, Outcome::Refused, 1, "pear"),
    ];
    let f = world(&ops, |b| {
        correct(b, 21, 2, 3, "apple", 0);
        correct(b, 22, 2, 3, "apple", 0);
        correct(b, 31, 3, 1, "pear", 0);
        correct(b, 41, 4, 1, "pear", 0);
    });
    let n = names(&f);
    assert!(n.contains(&"lost operation"), "{n:?}");
    assert!(n.contains(&"outbox mismatch"), "{n:?}");
    let phantom = f.anomalies.iter().find(|a| a.name == "phantom operation").unwrap();
    assert_eq!(phantom.count, 2, "the refused one and the key never asked for: {:?}", phantom.examples);
    assert!(phantom.examples.iter().any(|e| e.contains("never asked for")));
}

#[test]
fn the_topic_must_hold_each_event_once_keyed_on_one_partition() {
    let ops = vec![op(1, Outcome::Acknowledged, 2, "apple"), op(2, Outcome::Acknowledged, 3, "apple")];
    let k = Uuid::from_u128(1).to_string();
    let f = world(&ops, |b| {
        correct(b, 11, 1, 2, "apple", 0);
        // A second event of key 1, on another partition.
        b.add_event(event(12, 1, "{}"));
        let i = Uuid::from_u128(12).to_string();
        b.add_message(
            Position::new(1, 5),
            k.as_bytes(),
            Some(i.as_bytes()),
            fingerprint(k.as_bytes(), b"OrderPlaced", b"{}"),
        );
        // Key 2's event never published, and not a leftover: lost.
        b.add_event(event(21, 2, "{}"));
        // A message no outbox row has.
        b.add_message(Position::new(0, 9), b"x", Some(b"not-an-id"), 0);
    });
    let n = names(&f);
    for want in ["split key", "lost event", "foreign event", "outbox mismatch"] {
        assert!(n.contains(&want), "{want} missing from {n:?}");
    }
    // A leftover is reported as one, not also as lost.
    let f = world(&ops[1..], |b| {
        b.add_event(event(21, 2, "{}"));
        b.add_leftover(Uuid::from_u128(21).to_string());
    });
    let n = names(&f);
    assert!(n.contains(&"unpublished leftover") && !n.contains(&"lost event"), "{n:?}");
}

#[test]
fn effects_are_counted_in_their_own_sense() {
    let ops = ops();
    let f = world(&ops, |b| {
        correct(b, 11, 1, 2, "apple", 0);
        correct(b, 12, 2, 3, "apple", 0);
        let (k, i) = (Uuid::from_u128(2).to_string(), Uuid::from_u128(12).to_string());
        // A redelivery applied twice: a second shipment, a second
        // decrement, a second invoice.
        b.add_effect_row(0, EffectRow { message_id: Some(i.clone()), key: Some(k.clone()), amount: None });
        b.add_effect_row(1, EffectRow { message_id: None, key: Some("apple".into()), amount: Some(3) });
        b.add_effect_row(2, EffectRow { message_id: None, key: Some(k.clone()), amount: None });
        // A shipment naming a message that is no event, and one under the wrong key.
        b.add_effect_row(0, EffectRow { message_id: Some("nope".into()), key: Some(k.clone()), amount: None });
        b.add_effect_row(0, EffectRow { message_id: Some(i), key: Some("other".into()), amount: None });
    });
    let get = |n: &str| f.anomalies.iter().find(|a| a.name == n).map(|a| a.count);
    assert_eq!(get("duplicate effect"), Some(2), "{:?}", f.anomalies);
    assert_eq!(get("misattributed effect"), Some(2), "{:?}", f.anomalies);
    let drift = f.anomalies.iter().find(|a| a.name == "counter drift").unwrap();
    assert!(
        drift.examples[0].contains("key apple adds up to 8") && drift.examples[0].contains("asked for 5"),
        "{:?}",
        drift.examples
    );
    assert!(f.invariants.iter().any(|i| !i.ok && i.name.starts_with("effect stock")));
}

#[test]
fn a_missing_effect_and_a_failed_check_are_found() {
    let ops = vec![op(1, Outcome::Acknowledged, 2, "apple")];
    let f = world(&ops, |b| {
        b.add_event(event(11, 1, "{}"));
        let (k, i) = (Uuid::from_u128(1).to_string(), Uuid::from_u128(11).to_string());
        b.add_message(
            Position::new(0, 0),
            k.as_bytes(),
            Some(i.as_bytes()),
            fingerprint(k.as_bytes(), b"OrderPlaced", b"{}"),
        );
        b.add_check("every order has its event", 3, vec![r#"{"order_id": 7}"#.into()]);
    });
    let get = |n: &str| f.anomalies.iter().find(|a| a.name == n).cloned();
    let missing = get("missing effect").unwrap();
    assert_eq!(missing.count, 2, "the shipment and the invoice: {:?}", missing.examples);
    assert!(missing.examples[0].contains("outbox: OrderPlaced"), "the story is told: {:?}", missing.examples);
    assert!(get("counter drift").is_some());
    let check = get("failed check").unwrap();
    assert_eq!(check.count, 3);
    assert!(check.examples[0].contains("order_id"));
}

/// Late is not lost: an order whose work was still pending when the run
/// settled is not expected to have its effects yet; another order that
/// is not pending and has none is missing all the same.
#[test]
fn work_still_pending_is_not_a_missing_effect() {
    let ops = vec![op(1, Outcome::Acknowledged, 2, "apple"), op(2, Outcome::Acknowledged, 3, "pear")];
    let sys = Box::leak(Box::new(system()));
    let run = |pending: Vec<String>| {
        let mut b = Books::new(sys, ops.iter().cloned(), vec![], 0).with_pending(pending);
        for (id, key) in [(11, 1), (12, 2)] {
            let payload = format!(r#"{{"order_id": "{}", "quantity": 1}}"#, Uuid::from_u128(key));
            b.add_event(event(id, key, &payload));
            let (k, i) = (Uuid::from_u128(key).to_string(), Uuid::from_u128(id).to_string());
            b.add_message(
                Position::new(0, 0),
                k.as_bytes(),
                Some(i.as_bytes()),
                fingerprint(k.as_bytes(), b"OrderPlaced", payload.as_bytes()),
            );
        }
        b.finish()
    };
    let missing = |f: &Found| f.anomalies.iter().find(|a| a.name == "missing effect").map_or(0, |a| a.count);
    let drift = |f: &Found| f.anomalies.iter().any(|a| a.name == "counter drift");
    let (none, one) = (run(vec![]), run(vec![Uuid::from_u128(1).to_string()]));
    assert!(missing(&none) > missing(&one) && missing(&one) > 0, "{} then {}", missing(&none), missing(&one));
    let both = run(vec![Uuid::from_u128(1).to_string(), Uuid::from_u128(2).to_string()]);
    assert_eq!(missing(&both), 0, "{:?}", both.anomalies);
    assert!(!drift(&both), "pending orders are not expected in the sums yet: {:?}", both.anomalies);
}

/// A row the stalled relay left unmarked is late only while its message
/// never reached the topic. One whose message was read on the topic (the
/// relay sent it, then lost its mark) was applied: its effects are
/// expected and its amounts counted, or the sums drift by its quantity
/// (Spring Modulith's publications completed on the topic, their
/// `completion_date` never set: docs/findings/spring-modulith.md).
#[test]
fn a_row_published_whose_mark_was_lost_is_not_late() {
    let ops = vec![op(1, Outcome::Acknowledged, 2, "apple"), op(2, Outcome::Acknowledged, 3, "apple")];
    let sys = Box::leak(Box::new(system()));
    let unmarked = vec![Uuid::from_u128(1).to_string(), Uuid::from_u128(2).to_string()];
    let mut b = Books::new(sys, ops.iter().cloned(), vec![], 0).with_unpublished(unmarked);
    // Order 1: published and applied, its mark lost. Order 2: its row
    // written, never sent, nothing applied.
    correct(&mut b, 11, 1, 2, "apple", 0);
    let payload = format!(r#"{{"order_id": "{}", "quantity": 3}}"#, Uuid::from_u128(2));
    b.add_event(event(12, 2, &payload));
    let f = b.finish();
    assert!(!names(&f).contains(&"counter drift"), "order 1 counted in the sums: {:?}", f.anomalies);
    assert!(!names(&f).contains(&"missing effect"), "order 2 is late, not lost: {:?}", f.anomalies);
    // Planted: order 1's effects gone although its message was read: a
    // missing effect, which a late key would have hidden.
    let mut b = Books::new(sys, ops.iter().cloned(), vec![], 0)
        .with_unpublished(vec![Uuid::from_u128(1).to_string(), Uuid::from_u128(2).to_string()]);
    let payload = format!(r#"{{"order_id": "{}", "quantity": 2}}"#, Uuid::from_u128(1));
    b.add_event(event(11, 1, &payload));
    let (k, i) = (Uuid::from_u128(1).to_string(), Uuid::from_u128(11).to_string());
    b.add_message(
        Position::new(0, 11),
        k.as_bytes(),
        Some(i.as_bytes()),
        fingerprint(k.as_bytes(), b"OrderPlaced", payload.as_bytes()),
    );
    b.add_event(event(12, 2, &format!(r#"{{"order_id": "{}", "quantity": 3}}"#, Uuid::from_u128(2))));
    let f = b.finish();
    assert!(names(&f).contains(&"missing effect"), "{:?}", f.anomalies);
}

/// A declared system's missing effect names its cause by data when a
/// firing's reach held its message (a kill right after an offset
/// commit that covered it), and only by time, said so, when none did.
#[test]
fn a_missing_effect_names_the_offset_commit_that_covered_its_message() {
    let ops = vec![op(1, Outcome::Acknowledged, 2, "apple"), op(2, Outcome::Acknowledged, 3, "pear")];
    let sys = Box::leak(Box::new(system()));
    let fault = |point: &str, at_ms, reach| crate::faults::FaultRecord {
        point: point.into(),
        component: "notifier-1".into(),
        at_ms,
        hit: "the process".into(),
        occurrence: Some(0),
        reach,
    };
    let run = |faults, spans| {
        let mut b = Books::new(sys, ops.iter().cloned(), faults, 0).with_spans(spans);
        for (id, key, offset) in [(11, 1, 4), (12, 2, 5)] {
            let payload = format!(r#"{{"order_id": "{}", "quantity": 1}}"#, Uuid::from_u128(key));
            b.add_event(event(id, key, &payload));
            let (k, i) = (Uuid::from_u128(key).to_string(), Uuid::from_u128(id).to_string());
            let print = fingerprint(k.as_bytes(), b"OrderPlaced", payload.as_bytes());
            b.add_message(Position::new(1, offset), k.as_bytes(), Some(i.as_bytes()), print);
        }
        b.finish()
    };
    let covered = crate::faults::Reach { seqs: vec![], spans: vec![(1, 3, 4).into()] };
    // A random kill nearer in time, with no reach, and the commit that
    // covered order 1's message (1:4) but not order 2's (1:5).
    let found = run(
        vec![
            fault("process.kill", 19, Default::default()),
            fault("kafka.kill_after_offset_commit", 15, covered.clone()),
        ],
        Default::default(),
    );
    let missing = found.anomalies.iter().find(|a| a.name == "missing effect").expect("missing effect");
    let of = |key: u128| missing.followed.iter().find(|f| f.subject == Uuid::from_u128(key).to_string()).unwrap();
    let first = of(1);
    assert_eq!(first.faults.len(), 1, "{first:?}");
    assert_eq!(first.cause().map(|c| c.point.as_str()), Some("kafka.kill_after_offset_commit"));
    assert!(
        first.suspects("").contains("its offset commit (partition 1, offsets 3..=4) covered message 1:4"),
        "{first:?}"
    );
    let i = first.example;
    assert!(missing.examples[i].contains("cause: kafka.kill_after_offset_commit"), "{}", missing.examples[i]);
    // Nothing reached order 2's message: both faults, by time, nearest first.
    let second = of(2);
    assert!(second.cause().is_none() && second.faults.iter().all(|f| f.by == attribution::By::Time), "{second:?}");
    assert_eq!(second.faults[0].point, "process.kill");
    assert!(second.suspects(", ").starts_with("by time: process.kill"), "{}", second.suspects(", "));
    assert!(
        missing.examples[second.example].contains("faults around it, by time: "),
        "{}",
        missing.examples[second.example]
    );
    // The attribution every checker shares: a pause that lasts covers
    // its span, so order 2's last trace (20 ms), inside a pause fired
    // at 0 for 60 s, names the pause before the kill 1 ms away.
    let spans = [("process.pause".to_string(), 60_000)].into();
    let found = run(
        vec![
            fault("process.pause", 0, Default::default()),
            fault("process.kill", 19, Default::default()),
            fault("kafka.kill_after_offset_commit", 15, covered),
        ],
        spans,
    );
    let missing = found.anomalies.iter().find(|a| a.name == "missing effect").expect("missing effect");
    let second = missing.followed.iter().find(|f| f.subject == Uuid::from_u128(2).to_string()).unwrap();
    assert_eq!(second.faults[0].point, "process.pause", "{second:?}");
}

#[test]
fn a_malformed_event_belongs_to_no_operation_and_wants_its_dead_letter() {
    let mut sys = system();
    sys.outbox.malformed = Some("payload LIKE '%poison%'".into());
    sys.effects.push(EffectDecl {
        name: "dead letters".into(),
        query: String::new(),
        provider: None,
        once: Once::PerMalformedMessage,
        types: vec!["OrderPlaced".into()],
        key_value: None,
        conserve: None,
    });
    let sys = Box::leak(Box::new(sys));
    let ops = vec![op(1, Outcome::Acknowledged, 2, "apple")];
    let run = |dead_letter: bool| {
        let mut b = Books::new(sys, ops.iter().cloned(), vec![], 0);
        correct(&mut b, 11, 1, 2, "apple", 0);
        let twin = LoggedEvent { malformed: true, ..event(12, 1, r#"{"poison": true}"#) };
        b.add_event(twin);
        let (k, i) = (Uuid::from_u128(1).to_string(), Uuid::from_u128(12).to_string());
        b.add_message(
            Position::new(0, 12),
            k.as_bytes(),
            Some(i.as_bytes()),
            fingerprint(k.as_bytes(), b"OrderPlaced", br#"{"poison": true}"#),
        );
        if dead_letter {
            b.add_effect_row(3, EffectRow { message_id: Some(i), key: Some(k), amount: None });
        }
        b.finish()
    };
    let f = run(true);
    assert!(f.anomalies.is_empty(), "the twin is no second OrderPlaced and wants no shipment: {:?}", f.anomalies);
    let f = run(false);
    assert_eq!(names(&f), vec!["missing effect"], "{:?}", f.anomalies);
    assert!(f.anomalies[0].examples[0].starts_with("dead letters:"), "{:?}", f.anomalies[0].examples);
}

#[test]
fn calls_to_the_provider_are_counted_from_its_record() {
    use crate::provider::{Body, EmailId, Outcome as Sent, Record, Request};
    let keep: Vec<String> = vec!["message_id".into(), "order_id".into()];
    let mut sys = system();
    sys.effects = vec![EffectDecl {
        name: "emails".into(),
        query: String::new(),
        provider: Some(crate::scenario::ProviderFields {
            message_id: Some("message_id".into()),
            key: "order_id".into(),
            amount: None,
        }),
        once: Once::PerMessage,
        types: vec!["OrderPlaced".into()],
        key_value: None,
        conserve: None,
    }];
    let sys = Box::leak(Box::new(sys));
    let ops = vec![op(1, Outcome::Acknowledged, 2, "apple"), op(2, Outcome::Acknowledged, 1, "pear")];
    let req = |seq: u64, order: u128, event: u128, outcome: Sent| Request {
        seq,
        at_ms: seq as u32,
        key: Some(format!("{event}").as_str().into()),
        body: Body::of_json(
            &serde_json::json!({
                "order_id": Uuid::from_u128(order).to_string(),
                "message_id": Uuid::from_u128(event).to_string(),
            }),
            &keep,
        ),
        outcome,
    };
    let record = Record {
        requests: vec![
            // Order 1: sent, then its retry replayed: one email.
            req(0, 1, 11, Sent::SentResponseLost { id: EmailId(1) }),
            req(1, 1, 11, Sent::Replayed { id: EmailId(1) }),
            // Order 2: a 503, then sent twice (no key would do that).
            req(2, 2, 21, Sent::Unavailable),
            req(3, 2, 21, Sent::Sent { id: EmailId(2) }),
            req(4, 2, 21, Sent::Sent { id: EmailId(3) }),
            req(5, 2, 21, Sent::Conflict),
        ],
        started_epoch_ms: 0,
        keep: keep.clone(),
    };
    let mut b = Books::new(sys, ops.iter().cloned(), vec![], 0);
    for (id, key) in [(11, 1), (21, 2)] {
        b.add_event(event(id, key, "{}"));
        let (k, i) = (Uuid::from_u128(key).to_string(), Uuid::from_u128(id).to_string());
        b.add_message(
            Position::new(0, id as i64),
            k.as_bytes(),
            Some(i.as_bytes()),
            fingerprint(k.as_bytes(), b"OrderPlaced", b"{}"),
        );
    }
    b.add_provider_record(&record);
    let f = b.finish();
    // An effect outside the database is named so, as the payments
    // pipeline's emails are.
    assert!(!names(&f).contains(&"duplicate effect"), "{:?}", f.anomalies);
    let dup = f.anomalies.iter().find(|a| a.name == "duplicate external effect").expect("a doubled email");
    assert_eq!(dup.count, 1, "order 1's replay is no second email: {:?}", dup.examples);
    assert!(dup.examples[0].contains(&Uuid::from_u128(21).to_string()));
    assert!(names(&f).contains(&"idempotency key reused"), "{:?}", f.anomalies);
}

/// The books' memory at a million operations, each with its event, its
/// message and a row of each of the three effects, as the real reads feed
/// them: measured, not asserted (`cargo test --release -- --ignored
/// books_memory --nocapture`), since resident memory moves with the
/// allocator. The figure is in docs/measurements.md.
#[test]
#[ignore]
fn books_memory_at_a_million_operations() {
    const N: u128 = 1_000_000;
    let ops: Vec<Operation> = (0..N).map(|n| op(n, Outcome::Acknowledged, 1, "apple")).collect();
    let before = crate::context::memory::status_kb("VmRSS:");
    let started = std::time::Instant::now();
    let f = world(&ops, |b| {
        for n in 0..N {
            correct(b, N + n, n, 1, "apple", (n % 8) as i32);
        }
        eprintln!(
            "books at {N} operations: {} MB over the operations",
            (crate::context::memory::status_kb("VmRSS:") - before) / 1024
        );
    });
    assert!(f.anomalies.is_empty(), "{:?}", f.anomalies);
    eprintln!("judged in {:.1} s", started.elapsed().as_secs_f64());
}

#[test]
fn interned_ids_read_back_as_they_came_uuid_or_text() {
    let mut ids = Interned::default();
    let u = "0191d3a2-7c4e-7b1a-9f00-00000000002a";
    let texts = [u.to_string(), u.to_uppercase(), "order-7".into(), String::new(), "é".repeat(40)];
    // Enough ids that the table grows and the text bits span words.
    let many: Vec<String> = (0..300).map(|i| format!("{}{i}", if i % 3 == 0 { "k-" } else { "" })).collect();
    let all: Vec<&str> = texts.iter().chain(&many).map(String::as_str).collect();
    for (n, t) in all.iter().enumerate() {
        assert_eq!(ids.insert(IdRef::of(t)), (n as u32, true), "{t:?} is new");
    }
    for (n, t) in all.iter().enumerate() {
        assert_eq!(ids.insert(IdRef::of(t)), (n as u32, false), "{t:?} is known");
        assert_eq!(ids.get(n as u32).to_string(), *t, "reads back exactly");
        assert_eq!(ids.find(t), Some(n as u32));
    }
    assert!(matches!(ids.get(0), IdRef::Uuid(_)), "the canonical UUID is kept as its bytes");
    assert!(matches!(ids.get(1), IdRef::Text(_)), "another spelling of it is text, another id");
    assert_eq!(ids.find("order-8"), None);
    // Ordered as their texts, UUID or not.
    assert!(ids.get(0) < ids.get(2) && ids.get(1) < ids.get(0) && ids.get(3) < ids.get(1));
    assert_eq!(ids.len(), all.len());
}

/// A change-data-capture relay keeps no mark (`published = "none"`): when
/// it stalled, the events it never published are its leftovers, and an
/// order none of whose events reached the topic is late, not lost. Without
/// the stall the same rows are lost events and missing effects.
#[test]
fn an_unmarked_relay_that_stalled_leaves_leftovers_not_lost_events() {
    let ops = vec![
        op(1, Outcome::Acknowledged, 2, "apple"),
        op(2, Outcome::Acknowledged, 3, "pear"),
        op(3, Outcome::Acknowledged, 1, "apple"),
    ];
    let mut unmarked = system();
    unmarked.outbox.published = Published::None;
    let sys = Box::leak(Box::new(unmarked));
    let run = |stalled: bool| {
        let mut b = Books::new(sys, ops.iter().cloned(), vec![], 0).with_unmarked_stall(stalled);
        // Order 3's event was written 5 s before order 1's, which was
        // published: skipped, not left.
        for (id, key, at) in [(13, 3, 0), (11, 1, 5_000), (12, 2, 5_000)] {
            let payload = format!(r#"{{"order_id": "{}", "quantity": 1}}"#, Uuid::from_u128(key));
            b.add_event(LoggedEvent { at_epoch_ms: at, ..event(id, key, &payload) });
        }
        // Only order 1's event reached the topic.
        let (k, i, payload) = (
            Uuid::from_u128(1).to_string(),
            Uuid::from_u128(11).to_string(),
            format!(r#"{{"order_id": "{}", "quantity": 1}}"#, Uuid::from_u128(1)),
        );
        b.add_message(
            Position::new(0, 0),
            k.as_bytes(),
            Some(i.as_bytes()),
            fingerprint(k.as_bytes(), b"OrderPlaced", payload.as_bytes()),
        );
        b.finish()
    };
    let count = |f: &Found, n: &str| f.anomalies.iter().find(|a| a.name == n).map_or(0, |a| a.count);
    let (healthy, stalled) = (run(false), run(true));
    assert_eq!(count(&healthy, "lost event"), 2, "{:?}", healthy.anomalies);
    assert_eq!(count(&stalled, "lost event"), 1, "order 3's, skipped: {:?}", stalled.anomalies);
    assert_eq!(count(&stalled, "unpublished leftover"), 1, "{:?}", stalled.anomalies);
    // Orders 1 and 3 are judged as usual (none of their effects were
    // applied: missing); order 2's two (its shipment, its invoice) are not
    // expected yet.
    assert_eq!(count(&stalled, "missing effect"), 4, "{:?}", stalled.anomalies);
    assert_eq!(count(&healthy, "missing effect"), 6, "{:?}", healthy.anomalies);
}
