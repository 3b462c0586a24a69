//! The generic verifier of a declared system (docs/contract.md section 8):
//! the record of intent (what the workload asked for), the outbox log
//! (every event the service wrote), the whole topic and the declared
//! queries, checked against each other. Its expectations come from the
//! record of intent and the declaration, never from the system's account
//! of itself.
//!
//! [`Books`] is the pure part: it is fed row by row (events, messages,
//! leftovers, effect rows) and keeps a few dozen bytes per event and key,
//! then [`Books::finish`] turns them into invariants and anomalies. It is
//! unit-tested on hand-made rows; [`verify`] streams the real ones into it.

use super::{Anomaly, AnomalyKind, Invariant};
use crate::broker::SharedBroker;
use crate::domain::operations::{Operation, Outcome};
use crate::error::{Error, Result};
use crate::faults::FaultRecord;
use crate::scenario::{EffectDecl, Once, System};
use crate::store::declared::{self as rows, EffectRow, LoggedEvent};
use crate::store::postgres::PgStore;
use crate::verifier::attribution::{self, By, Followed, Suspect};
use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::time::Duration;

/// Examples kept per anomaly.
const EXAMPLES: usize = 5;
/// Faults within this much of an operation are told in its story.
const AROUND_MS: u64 = 1000;

/// What the verifier found.
#[derive(Debug, Clone, Default)]
pub struct Found {
    pub invariants: Vec<Invariant>,
    pub anomalies: Vec<Anomaly>,
    /// Figures for the report: operations by outcome, events, messages.
    pub figures: Figures,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Figures {
    pub operations: u64,
    pub acknowledged: u64,
    pub refused: u64,
    pub ambiguous: u64,
    pub outbox_events: u64,
    pub messages: u64,
    pub duplicate_messages: u64,
}

/// One outbox event, compact.
#[derive(Debug, Clone)]
struct Event {
    id: String,
    key: String,
    kind: usize,
    fingerprint: u64,
    at_epoch_ms: i64,
    /// Its messages on the topic, as (partition, offset).
    copies: Vec<(i32, i64)>,
    mismatched: bool,
    /// It meets `system.outbox.malformed`: it belongs to no operation and
    /// causes no effect but a `per-malformed-message` one.
    malformed: bool,
}

/// The ground truth of a declared system, fed row by row.
pub struct Books<'a> {
    sys: &'a System,
    ops: &'a [Operation],
    /// Operation index by its key as text.
    op_by_key: HashMap<String, usize>,
    /// Event types, interned.
    kinds: Vec<String>,
    events: Vec<Event>,
    event_by_id: HashMap<String, usize>,
    /// Event indices per key.
    by_key: HashMap<String, Vec<usize>>,
    /// Per key, the partition of its first message, and whether another was seen.
    partitions: HashMap<String, (i32, bool)>,
    foreign: Vec<String>,
    foreign_count: u64,
    messages: u64,
    leftovers: HashSet<String>,
    /// Per effect, rows per event index, rows per key, amount per key,
    /// and the misattributed rows.
    effects: Vec<EffectBooks>,
    checks: Vec<(String, i64, Vec<String>)>,
    /// Requests the provider refused for a key reused with another body,
    /// when an effect is read from its record.
    keys_reused: Option<Vec<String>>,
    faults: Vec<FaultRecord>,
    started_epoch_ms: i64,
    /// Keys of work the system still held as pending when the run settled
    /// (`[system] pending`): late, not lost, so never a missing effect.
    pending: HashSet<String>,
}

#[derive(Default)]
struct EffectBooks {
    per_event: HashMap<usize, u32>,
    per_key: HashMap<String, u64>,
    amounts: HashMap<String, i64>,
    misattributed: Vec<String>,
    misattributed_count: u64,
}

impl<'a> Books<'a> {
    pub fn new(sys: &'a System, ops: &'a [Operation], faults: Vec<FaultRecord>, started_epoch_ms: i64) -> Self {
        let op_by_key = ops.iter().enumerate().map(|(i, o)| (o.key.to_string(), i)).collect();
        Self {
            sys,
            ops,
            op_by_key,
            kinds: sys.operation.events.clone(),
            events: Vec::new(),
            event_by_id: HashMap::new(),
            by_key: HashMap::new(),
            partitions: HashMap::new(),
            foreign: Vec::new(),
            foreign_count: 0,
            messages: 0,
            leftovers: HashSet::new(),
            effects: sys.effects.iter().map(|_| EffectBooks::default()).collect(),
            checks: Vec::new(),
            keys_reused: None,
            faults,
            started_epoch_ms,
            pending: HashSet::new(),
        }
    }

    /// The keys still pending when the run settled: their effects are not
    /// expected yet (the `stalled consumer` anomaly speaks for them).
    pub fn with_pending(mut self, keys: impl IntoIterator<Item = String>) -> Self {
        self.pending = keys.into_iter().filter(|k| !k.is_empty()).collect();
        self
    }

    fn kind(&mut self, k: &str) -> usize {
        match self.kinds.iter().position(|x| x == k) {
            Some(i) => i,
            None => {
                self.kinds.push(k.to_string());
                self.kinds.len() - 1
            }
        }
    }

    /// Whether an event type is one the operations must produce.
    fn declared(&self, kind: usize) -> bool {
        kind < self.sys.operation.events.len()
    }

    /// A row of the outbox log.
    pub fn add_event(&mut self, e: LoggedEvent) {
        if self.event_by_id.contains_key(&e.id) {
            // The same id written twice: its second row is not a new event.
            return;
        }
        let kind = self.kind(&e.kind);
        let fingerprint = fingerprint(e.key.as_bytes(), e.kind.as_bytes(), e.payload.as_bytes());
        let i = self.events.len();
        self.by_key.entry(e.key.clone()).or_default().push(i);
        self.event_by_id.insert(e.id.clone(), i);
        self.events.push(Event {
            id: e.id,
            key: e.key,
            kind,
            fingerprint,
            at_epoch_ms: e.at_epoch_ms,
            copies: Vec::new(),
            mismatched: false,
            malformed: e.malformed,
        });
    }

    /// A message read from the topic.
    pub fn add_message(&mut self, partition: i32, offset: i64, key: &[u8], id: Option<&[u8]>, fp: u64) {
        self.messages += 1;
        if let Ok(k) = std::str::from_utf8(key) {
            match self.partitions.get_mut(k) {
                Some((p, split)) => *split |= *p != partition,
                None => {
                    self.partitions.insert(k.to_string(), (partition, false));
                }
            }
        }
        let found = id.and_then(|b| std::str::from_utf8(b).ok()).and_then(|id| self.event_by_id.get(id).copied());
        let Some(i) = found else {
            self.foreign_count += 1;
            if self.foreign.len() < EXAMPLES {
                let id =
                    id.map(String::from_utf8_lossy).map_or("no event_id header".into(), |s| format!("event_id {s}"));
                self.foreign.push(format!(
                    "message p{partition}@{offset} ({id}, key {}): no outbox row has this id",
                    String::from_utf8_lossy(key)
                ));
            }
            return;
        };
        let e = &mut self.events[i];
        e.copies.push((partition, offset));
        e.mismatched |= fp != e.fingerprint;
    }

    /// An outbox row still unmarked after the drain.
    pub fn add_leftover(&mut self, id: String) {
        self.leftovers.insert(id);
    }

    /// A row of the `n`th declared effect.
    pub fn add_effect_row(&mut self, n: usize, row: EffectRow) {
        let decl = &self.sys.effects[n];
        let key = row.key.clone().unwrap_or_default();
        let wanted_kind = |books: &Self, kind: usize| decl.types.iter().any(|t| books.kinds.get(kind) == Some(t));
        let mut wrong = None;
        if matches!(decl.once, Once::PerMessage | Once::PerMalformedMessage) {
            let for_malformed = decl.once == Once::PerMalformedMessage;
            let event = row.message_id.as_deref().and_then(|m| self.event_by_id.get(m).copied());
            match event {
                None => {
                    wrong = Some(format!(
                        "a row names message {}, which is no outbox event",
                        row.message_id.as_deref().unwrap_or("NULL")
                    ))
                }
                Some(i) if self.events[i].malformed != for_malformed => {
                    let what = if for_malformed { "a well-formed" } else { "a malformed" };
                    wrong = Some(format!(
                        "a row names message {}, {what} event, which causes no {} effect",
                        self.events[i].id, decl.name
                    ))
                }
                Some(i) if !for_malformed && !wanted_kind(self, self.events[i].kind) => {
                    wrong = Some(format!(
                        "a row names message {}, a {} event, which causes no {} effect",
                        self.events[i].id, self.kinds[self.events[i].kind], decl.name
                    ))
                }
                Some(i) if self.events[i].key != key => {
                    wrong = Some(format!(
                        "a row for message {} has key {key}; the message's key is {}",
                        self.events[i].id, self.events[i].key
                    ))
                }
                Some(i) => *self.effects[n].per_event.entry(i).or_default() += 1,
            }
        }
        let books = &mut self.effects[n];
        *books.per_key.entry(key.clone()).or_default() += 1;
        if decl.conserve.is_some() {
            *books.amounts.entry(key).or_default() += row.amount.unwrap_or(0);
        }
        if let Some(w) = wrong {
            books.misattributed_count += 1;
            if books.misattributed.len() < EXAMPLES {
                books.misattributed.push(format!("{}: {w}", decl.name));
            }
        }
    }

    /// The provider's record, for the effects read from it: each request
    /// that sent something is a row of each such effect, its fields taken
    /// from the body.
    pub fn add_provider_record(&mut self, record: &crate::provider::Record) {
        use crate::provider::Outcome;
        let mut reused = Vec::new();
        for r in &record.requests {
            if r.outcome == Outcome::Conflict {
                reused.push(format!(
                    "key {} sent again with another body at {:.2} s",
                    r.key.as_ref().map_or("?".into(), |k| k.text()),
                    r.at.as_secs_f64()
                ));
            }
            if r.outcome.sent().is_none() {
                continue;
            }
            let field = |name: &Option<String>| name.as_ref().and_then(|n| record.field(r, n)).map(|v| v.text());
            for n in 0..self.sys.effects.len() {
                let Some(f) = self.sys.effects[n].provider.clone() else { continue };
                let amount = f.amount.as_ref().and_then(|a| record.field(r, a)).and_then(|v| v.int());
                let row = EffectRow { message_id: field(&f.message_id), key: field(&Some(f.key)), amount };
                self.add_effect_row(n, row);
            }
        }
        self.keys_reused = Some(reused);
    }

    /// A declared check's result.
    pub fn add_check(&mut self, name: &str, rows: i64, examples: Vec<String>) {
        self.checks.push((name.to_string(), rows, examples));
    }

    /// Counts per declared type of a key's events.
    fn declared_counts(&self, key: &str) -> Vec<u32> {
        let mut counts = vec![0u32; self.sys.operation.events.len()];
        for &i in self.by_key.get(key).map(Vec::as_slice).unwrap_or_default() {
            if self.declared(self.events[i].kind) && !self.events[i].malformed {
                counts[self.events[i].kind] += 1;
            }
        }
        counts
    }

    /// Whether an operation took effect: its key has events of these types.
    fn took_effect(&self, op: &Operation, types: &[String]) -> bool {
        self.by_key.get(&op.key.to_string()).is_some_and(|es| {
            es.iter().any(|&i| {
                !self.events[i].malformed && types.iter().any(|t| self.kinds.get(self.events[i].kind) == Some(t))
            })
        })
    }

    /// The key an effect's rows carry for an operation.
    fn effect_key(&self, decl: &EffectDecl, op: &Operation) -> String {
        match decl.key_value {
            Some(v) => text(&op.values[v]),
            None => op.key.to_string(),
        }
    }

    /// A key's story, on one line, as an example of `anomaly`: its
    /// operation, the cause of the anomaly by data or the faults around the
    /// operation by time, its outbox events, its messages, its effects.
    fn story(&self, key: &str, anomaly: AnomalyKind) -> String {
        let mut parts = Vec::new();
        match self.op_by_key.get(key).map(|&i| &self.ops[i]) {
            Some(op) => {
                let answer = if op.status == 0 { "no answer".to_string() } else { op.status.to_string() };
                parts.push(format!(
                    "asked at {:.2} s, {} ({answer}) at {:.2} s",
                    op.sent_ms as f64 / 1000.0,
                    op.outcome.as_str(),
                    op.done_ms as f64 / 1000.0
                ));
                // Its cause by data when a firing reached its messages,
                // else the faults around it, said to be near in time only.
                match self.followed(key, 0, anomaly.as_str()) {
                    Some(f) if f.cause().is_some_and(|c| attribution::can_cause(&c.point, anomaly.as_str())) => {
                        parts.push(format!("cause: {}", f.suspects(", ")))
                    }
                    _ => {
                        let near: Vec<String> = self
                            .faults
                            .iter()
                            .filter(|f| f.at_ms + AROUND_MS >= op.sent_ms && f.at_ms <= op.done_ms + AROUND_MS)
                            .take(3)
                            .map(|f| format!("{} on {} at {:.2} s", f.point, f.component, f.at_ms as f64 / 1000.0))
                            .collect();
                        if !near.is_empty() {
                            parts.push(format!("faults around it, by time: {}", near.join(", ")));
                        }
                    }
                }
            }
            None => parts.push("never asked for".into()),
        }
        let events = self.by_key.get(key).map(Vec::as_slice).unwrap_or_default();
        let outbox: Vec<String> = events
            .iter()
            .map(|&i| {
                let e = &self.events[i];
                let at = (e.at_epoch_ms - self.started_epoch_ms) as f64 / 1000.0;
                format!("{} {} at {at:.2} s", self.kinds[e.kind], short(&e.id))
            })
            .collect();
        parts.push(match outbox.is_empty() {
            true => "outbox: none".into(),
            false => format!("outbox: {}", outbox.join(", ")),
        });
        let copies: Vec<String> = events
            .iter()
            .flat_map(|&i| self.events[i].copies.iter().map(|(p, o)| format!("p{p}@{o}")))
            .take(8)
            .collect();
        parts.push(match copies.is_empty() {
            true => "topic: none".into(),
            false => format!("topic: {}", copies.join(", ")),
        });
        let effects: Vec<String> = self
            .sys
            .effects
            .iter()
            .zip(&self.effects)
            .filter(|(d, _)| d.key_value.is_none())
            .map(|(d, b)| format!("{} ×{}", d.name, b.per_key.get(key).copied().unwrap_or(0)))
            .collect();
        if !effects.is_empty() {
            parts.push(format!("effects: {}", effects.join(", ")));
        }
        format!("key {key}: {}", parts.join("; "))
    }

    /// The invariants and anomalies.
    pub fn finish(self) -> Found {
        let mut found = Found::default();
        let mut tally = Tally::default();
        let f = &mut found.figures;
        f.operations = self.ops.len() as u64;
        f.outbox_events = self.events.len() as u64;
        f.messages = self.messages;
        f.duplicate_messages = self.events.iter().map(|e| e.copies.len().saturating_sub(1) as u64).sum();

        self.judge_operations(&mut found, &mut tally);
        self.judge_topic(&mut found, &mut tally);
        for (decl, books) in self.sys.effects.iter().zip(&self.effects) {
            match decl.once {
                Once::PerMessage | Once::PerMalformedMessage => {
                    self.judge_per_message(decl, books, &mut found, &mut tally)
                }
                Once::PerKey => self.judge_per_key(decl, books, &mut found, &mut tally),
                Once::Unbounded => {}
            }
            for m in &books.misattributed {
                tally.note(AnomalyKind::MisattributedEffect, m.clone());
            }
            tally.more(AnomalyKind::MisattributedEffect, books.misattributed_count - books.misattributed.len() as u64);
            if let Some(v) = decl.conserve {
                self.judge_amounts(decl, books, v, &mut found, &mut tally);
            }
        }
        self.judge_checks(&mut found, &mut tally);

        for inv in found.invariants.iter_mut() {
            inv.ok = inv.expected == inv.actual;
        }
        found.anomalies = tally
            .0
            .into_iter()
            .map(|Noted { kind, count, examples, keys }| Anomaly {
                name: kind.as_str().to_string(),
                count,
                examples,
                allowed: false,
                subjects: vec![],
                followed: keys
                    .iter()
                    .enumerate()
                    .filter_map(|(i, k)| k.as_deref().and_then(|k| self.followed(k, i, kind.as_str())))
                    .collect(),
            })
            .collect();
        found
    }

    /// The operations against their events: an acknowledged one's each
    /// once, an ambiguous one's all once or none, a refused one's none, and
    /// none for a key never asked for.
    fn judge_operations(&self, found: &mut Found, tally: &mut Tally) {
        let wanted = self.sys.operation.events.join(", ");
        let (mut acked, mut acked_ok, mut ambiguous, mut ambiguous_ok, mut phantoms) = (0u64, 0u64, 0u64, 0u64, 0u64);
        for op in self.ops.iter() {
            let ok = self.judge_operation(op, &wanted, tally);
            match op.outcome {
                Outcome::Acknowledged => {
                    found.figures.acknowledged += 1;
                    acked += 1;
                    acked_ok += u64::from(ok);
                }
                Outcome::Ambiguous => {
                    found.figures.ambiguous += 1;
                    ambiguous += 1;
                    ambiguous_ok += u64::from(ok);
                }
                Outcome::Refused => {
                    found.figures.refused += 1;
                    phantoms += u64::from(!ok);
                }
            }
        }
        phantoms += self.judge_never_asked(tally);
        found.invariants.push(linked(
            Invariant::eq("every acknowledged operation produced exactly its events", acked, acked_ok),
            &[AnomalyKind::LostOperation, AnomalyKind::OutboxMismatch],
        ));
        found.invariants.push(linked(
            Invariant::eq(
                "every ambiguous operation produced its events at most once, all or none",
                ambiguous,
                ambiguous_ok,
            ),
            &[AnomalyKind::OutboxMismatch],
        ));
        found.invariants.push(linked(
            Invariant::eq("no events for a key never asked for, or refused", 0, phantoms),
            &[AnomalyKind::PhantomOperation],
        ));
    }

    /// One operation against its events, each finding noted: whether they
    /// are what its outcome allows (an acknowledged one's each once, an
    /// ambiguous one's all once or none, a refused one's none).
    fn judge_operation(&self, op: &Operation, wanted: &str, tally: &mut Tally) -> bool {
        let key = op.key.to_string();
        let counts = self.declared_counts(&key);
        let total: u32 = counts.iter().sum();
        let shown = || {
            counts
                .iter()
                .zip(&self.sys.operation.events)
                .map(|(n, t)| format!("{t} ×{n}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        match op.outcome {
            Outcome::Acknowledged => {
                if total == 0 {
                    tally.note_on(AnomalyKind::LostOperation, Some(key.as_str()), || {
                        format!(
                            "acknowledged, and none of its events ({wanted}) is in the outbox; {}",
                            self.story(&key, AnomalyKind::LostOperation)
                        )
                    });
                } else if counts.iter().any(|&n| n != 1) {
                    tally.note_on(AnomalyKind::OutboxMismatch, Some(key.as_str()), || {
                        format!(
                            "acknowledged with {} (expected each once); {}",
                            shown(),
                            self.story(&key, AnomalyKind::OutboxMismatch)
                        )
                    });
                } else {
                    return true;
                }
            }
            Outcome::Ambiguous => {
                let partial = total > 0 && counts.contains(&0);
                if counts.iter().any(|&n| n > 1) || partial {
                    tally.note_on(AnomalyKind::OutboxMismatch, Some(key.as_str()), || {
                        format!(
                            "ambiguous, with {} (expected each once, or none at all); {}",
                            shown(),
                            self.story(&key, AnomalyKind::OutboxMismatch)
                        )
                    });
                } else {
                    return true;
                }
            }
            Outcome::Refused => {
                if total == 0 {
                    return true;
                }
                tally.note_on(AnomalyKind::PhantomOperation, Some(key.as_str()), || {
                    format!("refused, and still {}; {}", shown(), self.story(&key, AnomalyKind::PhantomOperation))
                });
            }
        }
        false
    }

    /// Events for keys the workload never asked for: phantoms, each noted.
    fn judge_never_asked(&self, tally: &mut Tally) -> u64 {
        let mut n = 0;
        let mut never_asked: Vec<&String> = self
            .by_key
            .iter()
            .filter(|(k, es)| {
                !self.op_by_key.contains_key(*k)
                    && es.iter().any(|&i| self.declared(self.events[i].kind) && !self.events[i].malformed)
            })
            .map(|(k, _)| k)
            .collect();
        never_asked.sort();
        for k in never_asked {
            n += 1;
            tally.note_on(AnomalyKind::PhantomOperation, Some(k.as_str()), || {
                format!(
                    "events for a key the workload never asked for; {}",
                    self.story(k, AnomalyKind::PhantomOperation)
                )
            });
        }
        n
    }

    /// The outbox against the topic: every published event on it, equal to
    /// its row, a key on one partition, no foreign message, no leftover.
    fn judge_topic(&self, found: &mut Found, tally: &mut Tally) {
        let mut on_topic = 0u64;
        let mut mismatched = 0u64;
        for e in &self.events {
            if e.copies.is_empty() {
                if !self.leftovers.contains(&e.id) {
                    tally.note_on(AnomalyKind::LostEvent, Some(e.key.as_str()), || {
                        format!(
                            "{} {} is on no partition; {}",
                            self.kinds[e.kind],
                            e.id,
                            self.story(&e.key, AnomalyKind::LostEvent)
                        )
                    });
                }
            } else {
                on_topic += 1;
            }
            if e.mismatched {
                mismatched += 1;
                tally.note_on(AnomalyKind::MessageMismatch, Some(e.key.as_str()), || {
                    format!(
                        "a message of {} {} differs from its outbox row (key, type or value); {}",
                        self.kinds[e.kind],
                        e.id,
                        self.story(&e.key, AnomalyKind::MessageMismatch)
                    )
                });
            }
        }
        let published = self.events.len() as u64
            - self.events.iter().filter(|e| e.copies.is_empty() && self.leftovers.contains(&e.id)).count() as u64;
        found.invariants.push(linked(
            Invariant::eq("every published outbox event is on the topic", published, on_topic),
            &[AnomalyKind::LostEvent],
        ));
        for example in &self.foreign {
            tally.note(AnomalyKind::ForeignEvent, example.clone());
        }
        tally.more(AnomalyKind::ForeignEvent, self.foreign_count.saturating_sub(self.foreign.len() as u64));
        found.invariants.push(linked(
            Invariant::eq("every message is an outbox event", 0, self.foreign_count),
            &[AnomalyKind::ForeignEvent],
        ));
        found.invariants.push(linked(
            Invariant::eq("every message equals its outbox row", 0, mismatched),
            &[AnomalyKind::MessageMismatch],
        ));
        let mut split: Vec<&String> = self.partitions.iter().filter(|(_, (_, s))| *s).map(|(k, _)| k).collect();
        split.sort();
        for k in &split {
            tally.note_on(AnomalyKind::SplitKey, Some(k.as_str()), || {
                format!("its messages are on more than one partition; {}", self.story(k, AnomalyKind::SplitKey))
            });
        }
        found.invariants.push(linked(
            Invariant::eq("a key's messages are on one partition", 0, split.len() as u64),
            &[AnomalyKind::SplitKey],
        ));
        let mut left: Vec<&String> = self.leftovers.iter().collect();
        left.sort();
        for id in &left {
            let key = self.event_by_id.get(*id).map(|&i| self.events[i].key.clone());
            tally.note_on(AnomalyKind::UnpublishedLeftover, key.as_deref(), || {
                format!(
                    "outbox row {id} is still unpublished after the drain{}",
                    key.as_ref()
                        .map(|k| format!("; {}", self.story(k, AnomalyKind::UnpublishedLeftover)))
                        .unwrap_or_default()
                )
            });
        }
        found.invariants.push(linked(
            Invariant::eq(UNPUBLISHED_INVARIANT, 0, left.len() as u64),
            &[AnomalyKind::UnpublishedLeftover],
        ));
    }

    /// Effect `decl` once per message of its types (or per malformed
    /// message), work still pending excepted.
    fn judge_per_message(&self, decl: &EffectDecl, books: &EffectBooks, found: &mut Found, tally: &mut Tally) {
        let (mut missing, mut duplicate) = (0u64, 0u64);
        let for_malformed = decl.once == Once::PerMalformedMessage;
        let mut expected = 0u64;
        for (i, e) in self.events.iter().enumerate() {
            let wanted = match for_malformed {
                true => e.malformed,
                false => !e.malformed && decl.types.iter().any(|t| self.kinds.get(e.kind) == Some(t)),
            };
            if !wanted {
                continue;
            }
            expected += 1;
            let n = u64::from(books.per_event.get(&i).copied().unwrap_or(0));
            if n == 0 && self.pending.contains(&e.key) {
                expected -= 1;
                continue;
            }
            let Some((kind, rows)) = not_once(n, &mut missing, &mut duplicate) else { continue };
            tally.note_on(kind, Some(e.key.as_str()), || {
                format!("{}: {rows} for {} {}; {}", decl.name, self.kinds[e.kind], e.id, self.story(&e.key, kind))
            });
        }
        let types = if for_malformed { "malformed".to_string() } else { decl.types.join(", ") };
        found.invariants.push(Invariant::eq(
            &format!("effect {}: exactly one per {types} message", decl.name),
            expected,
            expected - missing - duplicate,
        ));
        link_last(found, &[AnomalyKind::MissingEffect, AnomalyKind::DuplicateEffect, AnomalyKind::MisattributedEffect]);
    }

    /// Effect `decl` once per key of the operations that took effect, and
    /// no row for any other key.
    fn judge_per_key(&self, decl: &EffectDecl, books: &EffectBooks, found: &mut Found, tally: &mut Tally) {
        let (mut missing, mut duplicate) = (0u64, 0u64);
        let expected: HashSet<String> = self
            .ops
            .iter()
            .filter(|op| self.took_effect(op, &decl.types))
            .map(|op| self.effect_key(decl, op))
            .collect();
        let mut keys: Vec<&String> = expected.iter().collect();
        keys.sort();
        // Still pending: not expected yet.
        keys.retain(|k| !self.pending.contains(*k) || books.per_key.contains_key(*k));
        for k in &keys {
            let n = books.per_key.get(*k).copied().unwrap_or(0);
            let Some((kind, rows)) = not_once(n, &mut missing, &mut duplicate) else { continue };
            tally.note_on(kind, Some(k.as_str()), || {
                format!("{}: {rows} for key {k}; {}", decl.name, self.story(k, kind))
            });
        }
        let mut strays: Vec<&String> = books.per_key.keys().filter(|k| !expected.contains(*k)).collect();
        strays.sort();
        for k in strays {
            tally.note_on(AnomalyKind::MisattributedEffect, Some(k.as_str()), || {
                format!(
                    "{}: a row for key {k}, which no operation that took effect has; {}",
                    decl.name,
                    self.story(k, AnomalyKind::MisattributedEffect)
                )
            });
        }
        found.invariants.push(Invariant::eq(
            &format!("effect {}: exactly one per key", decl.name),
            keys.len() as u64,
            keys.len() as u64 - missing - duplicate,
        ));
        link_last(found, &[AnomalyKind::MissingEffect, AnomalyKind::DuplicateEffect, AnomalyKind::MisattributedEffect]);
    }

    /// Effect `decl`'s amounts per key against what the operations that
    /// took effect asked for in their value `v`.
    fn judge_amounts(&self, decl: &EffectDecl, books: &EffectBooks, v: usize, found: &mut Found, tally: &mut Tally) {
        let mut expected: HashMap<String, i64> = HashMap::new();
        // Work still pending is not expected in the sums yet.
        let settled = |op: &&Operation| !self.pending.contains(&op.key.to_string());
        for op in self.ops.iter().filter(|op| self.took_effect(op, &decl.types)).filter(settled) {
            *expected.entry(self.effect_key(decl, op)).or_default() += op.values[v].as_i64().unwrap_or(0);
        }
        let mut keys: Vec<&String> = expected.keys().chain(books.amounts.keys()).collect();
        keys.sort();
        keys.dedup();
        let mut drift = 0u64;
        let value = &self.sys.operation.values[v].0;
        for k in &keys {
            let (want, got) = (expected.get(*k).copied().unwrap_or(0), books.amounts.get(*k).copied().unwrap_or(0));
            if want != got {
                drift += 1;
                let by =
                    if got > want { format!("{} too much", got - want) } else { format!("{} too little", want - got) };
                let about = decl.key_value.is_none().then_some(k.as_str());
                tally.note_on(AnomalyKind::CounterDrift, about, || {
                    let story = match about {
                        Some(k) => format!("; {}", self.story(k, AnomalyKind::CounterDrift)),
                        None => String::new(),
                    };
                    format!(
                        "{}: key {k} adds up to {got}, and the operations that took effect asked for {want} ({value}): {by}{story}",
                        decl.name
                    )
                });
            }
        }
        found.invariants.push(Invariant::eq(
            &format!("effect {}: amounts per key equal the operations' {value}", decl.name),
            keys.len() as u64,
            keys.len() as u64 - drift,
        ));
        link_last(found, &[AnomalyKind::CounterDrift]);
    }

    /// The provider's refusals of a reused key, and the user's own checks.
    fn judge_checks(&self, found: &mut Found, tally: &mut Tally) {
        if let Some(reused) = &self.keys_reused {
            for r in reused {
                tally.note(AnomalyKind::IdempotencyKeyReused, r.clone());
            }
            found.invariants.push(linked(
                Invariant::eq(
                    "no idempotency key reused with another body (the provider's 409)",
                    0,
                    reused.len() as u64,
                ),
                &[AnomalyKind::IdempotencyKeyReused],
            ));
        }

        // The user's own checks.
        for (name, n, examples) in &self.checks {
            if *n > 0 {
                for e in examples {
                    tally.note(AnomalyKind::FailedCheck, format!("check {name:?} returns {e}"));
                }
                tally.more(AnomalyKind::FailedCheck, (*n as u64).saturating_sub(examples.len() as u64));
            }
            found.invariants.push(Invariant::eq(&format!("check {name:?} returns no rows"), 0, *n as u64));
            link_last(found, &[AnomalyKind::FailedCheck]);
        }
    }

    /// When a key's story ends, in milliseconds since the run started: the
    /// latest of its operation's answer and its outbox events.
    fn trace_ms(&self, key: &str) -> Option<u64> {
        let op = self.op_by_key.get(key).map(|&i| self.ops[i].done_ms);
        let events = self.by_key.get(key).map(Vec::as_slice).unwrap_or_default();
        let last_event = events
            .iter()
            .map(|&i| u64::try_from(self.events[i].at_epoch_ms - self.started_epoch_ms).unwrap_or(0))
            .max();
        op.into_iter().chain(last_event).max()
    }

    /// The faults tied to a key's example: by data first (a firing whose
    /// reach holds one of its messages: an offset commit that covered it),
    /// else by time (fired in the window before its last trace, or soon
    /// after), nearest first, each marked so.
    fn followed(&self, key: &str, example: usize, anomaly: &str) -> Option<Followed> {
        let trace_ms = self.trace_ms(key)?;
        let messages: Vec<(i32, i64)> = self
            .by_key
            .get(key)
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .flat_map(|&i| self.events[i].copies.iter().copied())
            .collect();
        let suspect = |f: &FaultRecord, by, matched| Suspect::of(f, trace_ms, by, matched);
        let mut faults: Vec<Suspect> = self
            .faults
            .iter()
            .filter_map(|f| attribution::reached(f, &messages, anomaly).map(|m| suspect(f, By::Data, Some(m))))
            .collect();
        attribution::latest_redelivery(&mut faults);
        // One that cannot cause this anomaly goes last; then the earliest.
        faults.sort_by_key(|f| (!attribution::can_cause(&f.point, anomaly), f.at_ms));
        // Reached by firings none of which can cause it: no cause by data.
        if !faults.iter().any(|f| attribution::can_cause(&f.point, anomaly)) {
            faults = self
                .faults
                .iter()
                .filter(|f| f.at_ms + attribution::WINDOW_MS >= trace_ms && f.at_ms <= trace_ms + attribution::AFTER_MS)
                .map(|f| suspect(f, By::Time, None))
                .collect();
            faults.sort_by_key(|f| f.before_ms.unsigned_abs());
        }
        faults.truncate(attribution::SUSPECTS);
        Some(Followed { example, subject: key.to_string(), trace_ms, faults })
    }
}

/// An effect's rows where there should be one: None when there is, else
/// the anomaly and how many rows, counted as missing or duplicate.
fn not_once(rows: u64, missing: &mut u64, duplicate: &mut u64) -> Option<(AnomalyKind, String)> {
    match rows {
        1 => None,
        0 => {
            *missing += 1;
            Some((AnomalyKind::MissingEffect, "no row".into()))
        }
        n => {
            *duplicate += 1;
            Some((AnomalyKind::DuplicateEffect, format!("{n} rows")))
        }
    }
}

/// The invariant an outbox row still unpublished after the drain breaks
/// (the run adds a `stalled relay` to it when the relays stalled).
pub const UNPUBLISHED_INVARIANT: &str = "no outbox row left unpublished";

/// An invariant with the anomalies that break it, so that the verdict
/// names each violation once.
fn linked(mut inv: Invariant, kinds: &[AnomalyKind]) -> Invariant {
    inv.anomalies = kinds.iter().map(|k| k.as_str().to_string()).collect();
    inv
}

fn link_last(found: &mut Found, kinds: &[AnomalyKind]) {
    if let Some(last) = found.invariants.pop() {
        found.invariants.push(linked(last, kinds));
    }
}

/// Anomalies as they are found.
#[derive(Default)]
struct Tally(Vec<Noted>);

/// One anomaly as found so far: a count, the first examples, and the key
/// each example is about (for its cause).
struct Noted {
    kind: AnomalyKind,
    count: u64,
    examples: Vec<String>,
    keys: Vec<Option<String>>,
}

impl Tally {
    fn note(&mut self, kind: AnomalyKind, example: String) {
        self.note_on(kind, None, || example)
    }

    /// [`Tally::note`] of an example about `key`. The example is written
    /// only when it is kept: its story looks for its cause in the fault
    /// log, and a run may find thousands of one anomaly.
    fn note_on(&mut self, kind: AnomalyKind, key: Option<&str>, example: impl FnOnce() -> String) {
        let key = key.map(str::to_string);
        match self.0.iter_mut().find(|a| a.kind == kind) {
            Some(a) => {
                a.count += 1;
                if a.examples.len() < EXAMPLES {
                    a.examples.push(example());
                    a.keys.push(key);
                }
            }
            None => self.0.push(Noted { kind, count: 1, examples: vec![example()], keys: vec![key] }),
        }
    }

    /// Counts `n` more of an anomaly already noted, beyond its examples.
    fn more(&mut self, kind: AnomalyKind, n: u64) {
        if let Some(a) = self.0.iter_mut().find(|a| a.kind == kind) {
            a.count += n;
        }
    }
}

/// A value as the effect rows show it as text: a string bare, anything else as JSON.
fn text(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The first 8 characters of an id, for stories.
fn short(id: &str) -> &str {
    id.get(..8).unwrap_or(id)
}

/// Of a message's key, type and value; the value as canonical JSON when
/// it is JSON (so that key order and spacing do not count), else its bytes.
pub fn fingerprint(key: &[u8], kind: &[u8], value: &[u8]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut h);
    kind.hash(&mut h);
    match crate::domain::canonical::of_bytes(value) {
        Some(json) => (0u8, json).hash(&mut h),
        None => (1u8, value).hash(&mut h),
    }
    h.finish()
}

/// Reads the outbox log, the leftovers, the whole topic, every declared
/// effect and check, and verifies them against the record of intent.
#[allow(clippy::too_many_arguments)]
pub async fn verify(
    pg: &PgStore,
    broker: SharedBroker,
    topic: &str,
    partitions: i32,
    sys: &System,
    ops: &[Operation],
    faults: Vec<FaultRecord>,
    started_epoch_ms: i64,
    provider: Option<&crate::provider::Record>,
    pending: &[String],
) -> Result<Found> {
    let mut books = Books::new(sys, ops, faults, started_epoch_ms).with_pending(pending.iter().cloned());
    rows::outbox_log(pg, &sys.outbox, |e| books.add_event(e)).await?;
    rows::leftovers(pg, &sys.outbox, |id| books.add_leftover(id)).await?;
    // The topic is read on a blocking thread; the books go with it and back.
    let topic_name = topic.to_string();
    let mut books = {
        // Books borrows the declaration and the record; the read needs an
        // owned sink, so it gathers the compact messages first.
        let msgs = tokio::task::spawn_blocking(move || {
            let mut out: Vec<Msg> = Vec::new();
            crate::verifier::topic::read_checked(&*broker, &topic_name, partitions, TOPIC_READ, &mut |m| {
                // Kept compact: the value only as its fingerprint.
                let key = m.key.unwrap_or_default();
                out.push(Msg {
                    partition: m.partition,
                    offset: m.offset,
                    key: key.to_vec(),
                    id: m.event_id.map(<[u8]>::to_vec),
                    fp: fingerprint(key, m.event_type.unwrap_or_default(), m.payload.unwrap_or_default()),
                })
            })?;
            Ok(out)
        })
        .await
        .map_err(|e| Error::Internal(e.to_string()))??;
        for m in msgs {
            books.add_message(m.partition, m.offset, &m.key, m.id.as_deref(), m.fp);
        }
        books
    };
    for (n, e) in sys.effects.iter().enumerate().filter(|(_, e)| e.provider.is_none()) {
        rows::effect_rows(pg, e, |r| books.add_effect_row(n, r)).await?;
    }
    if sys.uses_provider() {
        // No record (no provider ran) reads as one with no request.
        books.add_provider_record(provider.unwrap_or(&crate::provider::Record::default()));
    }
    for c in &sys.checks {
        let (n, examples) = rows::check_rows(pg, c).await?;
        books.add_check(&c.name, n, examples);
    }
    Ok(books.finish())
}

/// How long reading the whole topic may take.
const TOPIC_READ: Duration = Duration::from_secs(120);

struct Msg {
    partition: i32,
    offset: i64,
    key: Vec<u8>,
    id: Option<Vec<u8>>,
    fp: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::{
        CheckDecl, EffectDecl, OperationDecl, OutboxDecl, ProgramCommand, Published, ServiceDecl, Setup, ValueGen,
    };
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
        let mut b = Books::new(sys, ops, vec![], 0);
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
            partition,
            id as i64,
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
                0,
                0,
                k.as_bytes(),
                Some(i.as_bytes()),
                fingerprint(k.as_bytes(), b"OrderPlaced", br#"{"b":[2,3],"a":1}"#),
            );
        });
        assert!(!names(&f).contains(&"message mismatch"), "{:?}", f.anomalies);
        let f = world(&ops, |b| {
            b.add_event(event(11, 1, r#"{"a": 1}"#));
            b.add_message(
                0,
                0,
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
            b.add_message(1, 5, k.as_bytes(), Some(i.as_bytes()), fingerprint(k.as_bytes(), b"OrderPlaced", b"{}"));
            // Key 2's event never published, and not a leftover: lost.
            b.add_event(event(21, 2, "{}"));
            // A message no outbox row has.
            b.add_message(0, 9, b"x", Some(b"not-an-id"), 0);
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
            b.add_message(0, 0, k.as_bytes(), Some(i.as_bytes()), fingerprint(k.as_bytes(), b"OrderPlaced", b"{}"));
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
            let mut b = Books::new(sys, &ops, vec![], 0).with_pending(pending);
            for (id, key) in [(11, 1), (12, 2)] {
                let payload = format!(r#"{{"order_id": "{}", "quantity": 1}}"#, Uuid::from_u128(key));
                b.add_event(event(id, key, &payload));
                let (k, i) = (Uuid::from_u128(key).to_string(), Uuid::from_u128(id).to_string());
                b.add_message(
                    0,
                    0,
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
        let run = |faults| {
            let mut b = Books::new(sys, &ops, faults, 0);
            for (id, key, offset) in [(11, 1, 4), (12, 2, 5)] {
                let payload = format!(r#"{{"order_id": "{}", "quantity": 1}}"#, Uuid::from_u128(key));
                b.add_event(event(id, key, &payload));
                let (k, i) = (Uuid::from_u128(key).to_string(), Uuid::from_u128(id).to_string());
                let print = fingerprint(k.as_bytes(), b"OrderPlaced", payload.as_bytes());
                b.add_message(1, offset, k.as_bytes(), Some(i.as_bytes()), print);
            }
            b.finish()
        };
        let covered = crate::faults::Reach { seqs: vec![], spans: vec![(1, 3, 4)] };
        // A random kill nearer in time, with no reach, and the commit that
        // covered order 1's message (1:4) but not order 2's (1:5).
        let found = run(vec![
            fault("process.kill", 19, Default::default()),
            fault("kafka.kill_after_offset_commit", 15, covered),
        ]);
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
        assert!(second.cause().is_none() && second.faults.iter().all(|f| f.by == By::Time), "{second:?}");
        assert_eq!(second.faults[0].point, "process.kill");
        assert!(second.suspects(", ").starts_with("by time: process.kill"), "{}", second.suspects(", "));
        assert!(
            missing.examples[second.example].contains("faults around it, by time: "),
            "{}",
            missing.examples[second.example]
        );
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
            let mut b = Books::new(sys, &ops, vec![], 0);
            correct(&mut b, 11, 1, 2, "apple", 0);
            let twin = LoggedEvent { malformed: true, ..event(12, 1, r#"{"poison": true}"#) };
            b.add_event(twin);
            let (k, i) = (Uuid::from_u128(1).to_string(), Uuid::from_u128(12).to_string());
            b.add_message(
                0,
                12,
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
            at: Duration::from_millis(seq),
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
        let mut b = Books::new(sys, &ops, vec![], 0);
        for (id, key) in [(11, 1), (21, 2)] {
            b.add_event(event(id, key, "{}"));
            let (k, i) = (Uuid::from_u128(key).to_string(), Uuid::from_u128(id).to_string());
            b.add_message(
                0,
                id as i64,
                k.as_bytes(),
                Some(i.as_bytes()),
                fingerprint(k.as_bytes(), b"OrderPlaced", b"{}"),
            );
        }
        b.add_provider_record(&record);
        let f = b.finish();
        let dup = f.anomalies.iter().find(|a| a.name == "duplicate effect").expect("a doubled email");
        assert_eq!(dup.count, 1, "order 1's replay is no second email: {:?}", dup.examples);
        assert!(dup.examples[0].contains(&Uuid::from_u128(21).to_string()));
        assert!(names(&f).contains(&"idempotency key reused"), "{:?}", f.anomalies);
    }
}
