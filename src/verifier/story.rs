//! Each anomaly example's story: what the database and the topic hold of
//! its payment, on one line of time, for the HTML report.
//!
//! The dated steps come from the rows the database time-stamps (the
//! payment written and captured, each outbox row created and published,
//! each inbox claim, each receipt and the projection), read only when a
//! run found anomalies ([`crate::store::Store::story`]). The messages come
//! from the verifier's own read of the topic, with their `partition:offset`;
//! that read keeps no broker timestamps, so a message is dated by its
//! deliveries: each batch a reference notifier received is logged
//! ([`crate::faults::DeliveryRecord`]; a notifier process reports each to
//! the run), and each delivery of one of the payment's messages is a step
//! of its story, a redelivery the inbox absorbed included. A program under
//! test reports none, so there an inbox claim stands for the delivery that
//! made it.

use super::Anomaly;
use crate::broker::Position;
use crate::domain::events::EventKind;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use uuid::Uuid;

/// Stories are told for at most this many examples per anomaly.
pub const PER_ANOMALY: usize = 5;

/// At most this many deliveries per story (a late replay of the whole
/// topic would deliver each message once more).
pub const DELIVERIES: usize = 24;

/// One example's payment, step by step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Story {
    /// The anomaly's name.
    pub anomaly: String,
    /// Index into the anomaly's `examples`.
    pub example: usize,
    /// The example's payment or event.
    pub subject: Uuid,
    pub payment: Uuid,
    /// In time order.
    pub steps: Vec<Step>,
    /// Its messages on the topic, in partition and offset order.
    pub messages: Vec<TopicMessage>,
    /// Its outbox rows' seqs, in order: with `messages`, what its example
    /// is matched to a fault's reach by ([`super::attribution`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub seqs: Vec<i64>,
}

/// One dated row of a payment's story.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Step {
    /// Milliseconds since the run started (the fault log's clock); negative
    /// if the database's clock stepped back.
    pub at_ms: i64,
    /// Where it happened: `payment`, `outbox`, `inbox` or `effect`.
    pub lane: String,
    /// What happened, e.g. "captured row published" or "receipt sent".
    pub what: String,
    /// The event (outbox row, inbox claim) or message (receipt) it concerns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<Uuid>,
}

/// A message carrying the payment's key, as the verifier read it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct TopicMessage {
    #[serde(flatten)]
    pub at: Position,
    /// `authorized`, `captured`, or `malformed` for one that does not decode.
    pub kind: String,
}

impl TopicMessage {
    pub fn new(at: Position, kind: Option<EventKind>) -> Self {
        let kind = kind.map_or("malformed", |k| k.status()).to_string();
        Self { at, kind }
    }
}

pub use crate::domain::rows::StoryRow;

/// The examples to tell, as (anomaly index, example index, subject).
pub fn wanted(anomalies: &[Anomaly]) -> Vec<(usize, usize, Uuid)> {
    anomalies
        .iter()
        .enumerate()
        .flat_map(|(a, an)| {
            an.subjects.iter().enumerate().filter_map(move |(i, s)| s.map(|s| (a, i, s))).take(PER_ANOMALY)
        })
        .collect()
}

/// The stories of the wanted examples: `payments` maps a subject to its
/// payment, `messages` a payment to its messages, `rows` are the payments'
/// dated rows, `deliveries` the batches in-process notifiers received;
/// `run_started_ms` is the run's start in epoch milliseconds. An example
/// whose payment is unknown (a message of no payment) gets none.
pub fn tell(
    anomalies: &[Anomaly],
    payments: &HashMap<Uuid, Uuid>,
    messages: &HashMap<Uuid, Vec<TopicMessage>>,
    rows: &[StoryRow],
    deliveries: &[crate::faults::DeliveryRecord],
    run_started_ms: i64,
) -> Vec<Story> {
    let mut by_payment: HashMap<Uuid, Vec<&StoryRow>> = HashMap::new();
    for r in rows {
        by_payment.entry(r.payment).or_default().push(r);
    }
    wanted(anomalies)
        .into_iter()
        .filter_map(|(a, example, subject)| {
            let payment = *payments.get(&subject)?;
            let mut steps: Vec<Step> = by_payment
                .get(&payment)
                .into_iter()
                .flatten()
                .map(|r| Step {
                    at_ms: r.at_epoch_ms - run_started_ms,
                    lane: r.lane.to_string(),
                    what: match r.seq {
                        Some(seq) => format!("{} (seq {seq})", r.what),
                        None => r.what.clone(),
                    },
                    event: r.event,
                })
                .collect();
            let mut seqs: Vec<i64> = by_payment.get(&payment).into_iter().flatten().filter_map(|r| r.seq).collect();
            seqs.sort_unstable();
            seqs.dedup();
            let mut msgs = messages.get(&payment).cloned().unwrap_or_default();
            msgs.sort_by_key(|m| m.at);
            let delivered = deliveries.iter().flat_map(|d| {
                msgs.iter().filter(|m| d.covers(m.at)).map(move |m| Step {
                    at_ms: d.at_ms as i64,
                    lane: "delivery".into(),
                    what: format!("{} {} to {} (batch of {})", m.kind, m.at, d.component, d.messages),
                    event: None,
                })
            });
            steps.extend(delivered.take(DELIVERIES));
            steps.sort_by(|x, y| (x.at_ms, &x.lane, &x.what).cmp(&(y.at_ms, &y.lane, &y.what)));
            Some(Story { anomaly: anomalies[a].name.clone(), example, subject, payment, steps, messages: msgs, seqs })
        })
        .collect()
}

/// What a story shows of one call to the email provider: 40 bytes, where
/// the provider's record keeps about 170 of each request. A million
/// payments' record (112 MB) is taken down to these before the topic is
/// read, whose read is the verifier's peak of memory.
struct Call {
    payment: Uuid,
    at_ms: u32,
    outcome: crate::provider::Outcome,
    /// The first bytes of its idempotency key, to a character boundary;
    /// `key_len` 0 when it had none.
    key: [u8; KEY_SHOWN],
    key_len: u8,
}

/// How much of an idempotency key a story shows.
const KEY_SHOWN: usize = 8;

/// The provider's calls a story may show, by payment.
pub struct Calls {
    calls: Vec<Call>,
    started_epoch_ms: i64,
}

impl Calls {
    /// The calls of `record` that name a payment, in arrival order within
    /// each payment.
    pub fn of(record: &crate::provider::Record) -> Self {
        let mut calls: Vec<Call> = record
            .requests
            .iter()
            .filter_map(|r| {
                let payment = record.field(r, "payment_id").and_then(|p| p.uuid())?;
                let (mut key, mut key_len) = ([0u8; KEY_SHOWN], 0);
                if let Some(k) = &r.key {
                    let text = k.text();
                    let end = (0..=KEY_SHOWN.min(text.len())).rev().find(|&i| text.is_char_boundary(i)).unwrap_or(0);
                    key[..end].copy_from_slice(&text.as_bytes()[..end]);
                    // A key shown empty still says it had one.
                    key_len = end.max(1) as u8;
                }
                Some(Call { payment, at_ms: r.at_ms, outcome: r.outcome.clone(), key, key_len })
            })
            .collect();
        // In place (a stable sort takes half as much again while it runs):
        // a story sorts its steps by time anyway.
        calls.sort_unstable_by_key(|c| (c.payment, c.at_ms));
        Self { calls, started_epoch_ms: record.started_epoch_ms }
    }

    fn of_payment(&self, payment: Uuid) -> &[Call] {
        let from = self.calls.partition_point(|c| c.payment < payment);
        let to = self.calls.partition_point(|c| c.payment <= payment);
        &self.calls[from..to]
    }
}

/// Adds to each story the email provider's calls for its payment, on the
/// provider's own lane: what was asked and what the provider did.
pub fn add_provider_calls(stories: &mut [Story], calls: &Calls, run_started_ms: i64) {
    use crate::provider::Outcome;
    for s in stories.iter_mut() {
        for c in calls.of_payment(s.payment).iter().take(DELIVERIES) {
            let outcome = match &c.outcome {
                Outcome::Sent { id } => format!("email {id} sent"),
                Outcome::Replayed { id } => format!("repeat absorbed, {id} replayed"),
                Outcome::SentResponseLost { id } => format!("email {id} sent, answer lost"),
                Outcome::SentSlow { id } => format!("email {id} sent, answer held"),
                Outcome::Conflict => "409, key reused with another body".into(),
                Outcome::InUse => "409, key in use".into(),
                Outcome::BadRequest => "400, not a JSON object".into(),
                Outcome::Unavailable => "503, nothing sent".into(),
            };
            let key = match c.key_len {
                0 => "no key".into(),
                n => format!("key {}…", String::from_utf8_lossy(&c.key[..usize::from(n).min(KEY_SHOWN)])),
            };
            s.steps.push(Step {
                at_ms: calls.started_epoch_ms + i64::from(c.at_ms) - run_started_ms,
                lane: "provider".into(),
                what: format!("{outcome} ({key})"),
                event: None,
            });
        }
        s.steps.sort_by(|x, y| (x.at_ms, &x.lane, &x.what).cmp(&(y.at_ms, &y.lane, &y.what)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_story_holds_its_payments_rows_in_time_order_and_its_messages() {
        let (p, q, e) = (Uuid::from_u128(1), Uuid::from_u128(2), Uuid::from_u128(3));
        let anomalies = vec![Anomaly {
            name: "duplicate effect".into(),
            count: 2,
            examples: vec!["p".into(), "no subject".into(), "by its event".into()],
            allowed: false,
            subjects: vec![Some(p), None, Some(e)],
            followed: vec![],
            found_by: vec![],
        }];
        let row = |payment, what: &str, at: i64| StoryRow {
            payment,
            lane: "effect",
            what: what.into(),
            event: None,
            at_epoch_ms: 1_000 + at,
            seq: None,
        };
        let rows = vec![row(p, "second receipt", 900), row(q, "other", 5), row(p, "first receipt", 400)];
        let payments = HashMap::from([(p, p), (e, q)]);
        let messages = HashMap::from([(
            p,
            vec![TopicMessage::new((2, 9).into(), Some(EventKind::Captured)), TopicMessage::new((2, 4).into(), None)],
        )]);
        let delivery = |at_ms, spans: Vec<(i32, i64, i64)>| crate::faults::DeliveryRecord {
            spans: spans.into_iter().map(Into::into).collect(),
            component: "notifier-1".into(),
            at_ms,
            messages: 3,
        };
        // Offset 9 delivered twice, offset 4 never; another partition's batch not at all.
        let deliveries = vec![
            delivery(500, vec![(2, 8, 10)]),
            delivery(600, vec![(1, 4, 9)]),
            delivery(700, vec![(2, 9, 9), (1, 1, 2)]),
        ];
        let stories = tell(&anomalies, &payments, &messages, &rows, &deliveries, 1_000);
        assert_eq!(stories.len(), 2, "the example without a subject has no story");
        let s = &stories[0];
        assert_eq!((s.example, s.payment), (0, p));
        let steps: Vec<(i64, &str)> = s.steps.iter().map(|s| (s.at_ms, s.what.as_str())).collect();
        assert_eq!(
            steps,
            vec![
                (400, "first receipt"),
                (500, "captured 2:9 to notifier-1 (batch of 3)"),
                (700, "captured 2:9 to notifier-1 (batch of 3)"),
                (900, "second receipt")
            ]
        );
        assert!(s.steps.iter().filter(|t| t.what.contains("to notifier")).all(|t| t.lane == "delivery"));
        let at: Vec<(i64, &str)> = s.messages.iter().map(|m| (m.at.at(), m.kind.as_str())).collect();
        assert_eq!(at, vec![(4, "malformed"), (9, "captured")]);
        // The event's example is told as its payment's story.
        assert_eq!((stories[1].example, stories[1].subject, stories[1].payment), (2, e, q));
        assert!(stories[1].messages.is_empty());
    }

    #[test]
    fn a_storys_calls_to_the_provider_are_steps_on_its_lane_on_the_runs_clock() {
        use crate::provider::{Body, EmailId, Outcome, Record, Request};
        let keep: Vec<String> = crate::provider::RECEIPT_FIELDS.map(String::from).to_vec();
        let p = Uuid::from_u128(1);
        let mut stories = vec![Story {
            anomaly: "duplicate external effect".into(),
            example: 0,
            subject: p,
            payment: p,
            steps: vec![Step { at_ms: 300, lane: "effect".into(), what: "receipt sent".into(), event: None }],
            messages: vec![],
            seqs: vec![],
        }];
        let call = |seq, at_ms, payment: Uuid, key: Option<&str>, outcome| Request {
            seq,
            at_ms: at_ms as u32,
            key: key.map(Into::into),
            body: Body::of_json(&serde_json::json!({ "payment_id": payment.to_string() }), &keep),
            outcome,
        };
        let record = Record {
            requests: vec![
                call(1, 100, p, None, Outcome::SentResponseLost { id: EmailId(1) }),
                call(2, 150, Uuid::from_u128(2), None, Outcome::Sent { id: EmailId(2) }),
                call(3, 400, p, Some("abcdefgh-rest:receipts"), Outcome::Replayed { id: EmailId(1) }),
                // A key cut inside a character is shown to the boundary
                // before it; a short key whole.
                call(4, 500, p, Some("abcdefgé-x"), Outcome::Conflict),
                call(5, 600, p, Some("k1"), Outcome::InUse),
            ],
            started_epoch_ms: 10_050,
            keep: keep.clone(),
        };
        assert!(std::mem::size_of::<Call>() <= 40, "a call kept for the stories grew");
        add_provider_calls(&mut stories, &Calls::of(&record), 10_000);
        let steps: Vec<(i64, &str, &str)> =
            stories[0].steps.iter().map(|s| (s.at_ms, s.lane.as_str(), s.what.as_str())).collect();
        assert_eq!(
            steps,
            vec![
                (150, "provider", "email em_1 sent, answer lost (no key)"),
                (300, "effect", "receipt sent"),
                (450, "provider", "repeat absorbed, em_1 replayed (key abcdefgh…)"),
                (550, "provider", "409, key reused with another body (key abcdefg…)"),
                (650, "provider", "409, key in use (key k1…)"),
            ],
            "another payment's call is not in this story"
        );
    }
}
