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
//!
//! - [`judge`]: [`Books::finish`] and one method per group of invariants:
//!   the operations, the topic, each effect, the user's checks.
//! - [`story`]: each example's story and its causes, by the attribution
//!   every checker shares.
//! - [`read`]: [`verify`], the reads streamed into the books.

use super::{Anomaly, AnomalyKind, Invariant};
use crate::broker::Position;
use crate::domain::events::fingerprint;
use crate::domain::operations::{Operation, Outcome};
use crate::faults::FaultRecord;
use crate::scenario::{EffectDecl, Once, System};
use crate::store::declared::{EffectRow, LoggedEvent};
use std::collections::{HashMap, HashSet};

mod judge;
mod read;
mod story;
#[cfg(test)]
mod tests;

pub use judge::UNPUBLISHED_INVARIANT;
pub use read::verify;

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
    fingerprint: u32,
    at_epoch_ms: i64,
    /// Its messages on the topic, as (partition, offset).
    copies: Vec<Position>,
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
    lanes: HashMap<String, (i32, bool)>,
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
    /// How long each fault point lasts, for the attribution by time
    /// ([`attribution::spans`]).
    spans: std::collections::BTreeMap<String, u64>,
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
            lanes: HashMap::new(),
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
            spans: Default::default(),
        }
    }

    /// How long each fault point lasts: a trace inside a pause or a
    /// blackhole is nearest of all to it.
    pub fn with_spans(mut self, spans: std::collections::BTreeMap<String, u64>) -> Self {
        self.spans = spans;
        self
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
    pub fn add_message(&mut self, at: Position, key: &[u8], id: Option<&[u8]>, fp: u32) {
        self.messages += 1;
        if let Ok(k) = std::str::from_utf8(key) {
            match self.lanes.get_mut(k) {
                Some((lane, split)) => *split |= *lane != at.lane(),
                None => {
                    self.lanes.insert(k.to_string(), (at.lane(), false));
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
                    "message p{}@{} ({id}, key {}): no outbox row has this id",
                    at.lane(),
                    at.at(),
                    String::from_utf8_lossy(key)
                ));
            }
            return;
        };
        let e = &mut self.events[i];
        e.copies.push(at);
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
