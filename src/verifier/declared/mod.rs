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
use crate::broker::{Packed, Position};
use crate::domain::events::fingerprint;
use crate::domain::operations::{Operation, Outcome};
use crate::faults::FaultRecord;
use crate::scenario::{EffectDecl, Once, System};
use crate::store::declared::{EffectRow, LoggedEvent};
use std::collections::{BTreeMap, HashMap, HashSet};

mod judge;
pub(crate) mod read;
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

#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct Figures {
    pub operations: u64,
    pub acknowledged: u64,
    pub refused: u64,
    pub ambiguous: u64,
    pub outbox_events: u64,
    pub messages: u64,
    pub duplicate_messages: u64,
    /// Rows of `[system] pending` when the settle after the drain began:
    /// the work the run waited for. Absent when the system declares none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_at_settle: Option<u64>,
}

/// Marks no event, no operation: the columns below hold indices as `u32`.
const NONE: u32 = u32::MAX;

/// One outbox event, compact: its id is its index in [`Books::event_ids`],
/// its key an index in [`Books::keys`]. Thirty-two bytes: at a million
/// payments there are two million of them.
#[derive(Debug, Clone)]
struct Event {
    /// Its first message on the topic, when `on_topic`; the others, rare,
    /// are in [`Books::more_copies`]. Packed: a `Position` would pad to
    /// sixteen bytes.
    copy: Packed,
    key: u32,
    /// The next event of its key, in the order added; the key's last one
    /// points back to its first (see [`Books::events_of`]).
    next_of_key: u32,
    fingerprint: u32,
    /// When its row was written, in ms from the run's start
    /// ([`Books::started_epoch_ms`]), saturating: a row older than 24 days
    /// is dated as 24 days old, which only the stories show.
    at_ms: i32,
    /// Its type, an index into [`Books::kinds`].
    kind: u16,
    /// [`ON_TOPIC`], [`MISMATCHED`], [`MALFORMED`].
    flags: u8,
}

/// How much earlier than the last published event an unpublished one must
/// have been written to count as skipped rather than left by a stalled
/// relay: rows are timed at insert, published in commit order, and a
/// transaction may commit a little after a later one.
const SKIPPED_BEFORE_MS: i64 = 1000;

/// [`Event::flags`]: it has a message on the topic.
const ON_TOPIC: u8 = 1;
/// A message of it differs from its row.
const MISMATCHED: u8 = 2;
/// It meets `system.outbox.malformed`: it belongs to no operation and
/// causes no effect but a `per-malformed-message` one.
const MALFORMED: u8 = 4;

impl Event {
    fn on_topic(&self) -> bool {
        self.flags & ON_TOPIC != 0
    }
    fn mismatched(&self) -> bool {
        self.flags & MISMATCHED != 0
    }
    fn malformed(&self) -> bool {
        self.flags & MALFORMED != 0
    }
    /// When its row was written, in ms from the run's start.
    fn at_ms(&self) -> i64 {
        i64::from(self.at_ms)
    }
}

const _: () = assert!(std::mem::size_of::<Event>() == 32);
const _: () = assert!(std::mem::size_of::<Op>() == 24);

/// An operation as the books keep it: its key id, how it ended and when.
/// Twenty-four bytes, where an [`Operation`] with its values takes over a
/// hundred: a million payments are a million operations.
#[derive(Debug, Clone, Copy)]
struct Op {
    key: u32,
    status: u16,
    outcome: Outcome,
    /// When it was sent and when it ended, in ms on the fault log's clock.
    sent_ms: u64,
    done_ms: u64,
}

/// Where a key's messages are: the partition of its first one, until
/// another is on a different partition.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Lane {
    #[default]
    Unseen,
    One(i32),
    Split,
}

/// The ground truth of a declared system, fed row by row.
///
/// Every id and key is kept once, interned; what is known of a key is in
/// columns indexed by its id, what is known of an event in its `Event`. At a
/// million operations a map from text would hold a copy of the text per
/// map; these hold four or eight bytes.
pub struct Books<'a> {
    sys: &'a System,
    /// The record of intent, compact, in its order.
    ops: Vec<Op>,
    /// Per value an effect takes its key from, the key id of each
    /// operation's value, by operation index.
    value_keys: BTreeMap<usize, Vec<u32>>,
    /// Per value an effect conserves, each operation's amount.
    value_amounts: BTreeMap<usize, Vec<i64>>,
    /// Event types, interned.
    kinds: Vec<String>,
    /// The events' ids: an event's index is its id's.
    event_ids: Interned,
    events: Vec<Event>,
    /// The messages of an event past its first, by event index, in order.
    more_copies: HashMap<u32, Vec<Position>>,
    /// Every key: the operations', the events', the messages', the effect
    /// rows'. The columns below are indexed by key id.
    keys: Interned,
    /// The operation of a key, or NONE; the last one with that key, as a
    /// map from the key would keep.
    op_of_key: Vec<u32>,
    /// The last event of a key, or NONE: the key's events are a ring
    /// through [`Event::next_of_key`].
    last_event: Vec<u32>,
    /// Where a key's messages are.
    lanes: Vec<Lane>,
    foreign: Vec<String>,
    foreign_count: u64,
    messages: u64,
    leftovers: HashSet<String>,
    /// Per effect, rows per event index, rows per key, amount per key,
    /// and the misattributed rows.
    effects: Vec<EffectBooks>,
    checks: Vec<(String, i64, Vec<String>)>,
    /// Requests the provider refused for a key reused with another body,
    /// when an effect is read from its record, each with the key of the
    /// effect its body names, when it names one.
    keys_reused: Option<Vec<(String, Option<u32>)>>,
    faults: Vec<FaultRecord>,
    started_epoch_ms: i64,
    /// Keys of work the system still held as pending when the run settled
    /// (`[system] pending`): late, not lost, so never a missing effect.
    pending: HashSet<String>,
    /// Keys of the rows a stalled relay left unmarked, told apart once the
    /// topic is read ([`Books::with_unpublished`]).
    unpublished: HashSet<String>,
    /// A relay that keeps no mark (`published = "none"`) stalled: what it
    /// never published is its leftover, not lost.
    unmarked_stall: bool,
    /// How long each fault point lasts, for the attribution by time
    /// ([`attribution::spans`]).
    spans: std::collections::BTreeMap<String, u64>,
    /// The examples name their key and no more, and carry it as their
    /// subject: a run whose report tells each example's story from the
    /// database's dated rows (the payments pipeline's) tells it there.
    brief: bool,
}

/// One effect's rows, counted in columns: by event index, by key id.
#[derive(Default)]
struct EffectBooks {
    /// Rows per event (saturating: a count this high is told as it is).
    per_event: Vec<u16>,
    /// Rows per key: a key with a row counts at least one.
    per_key: Vec<u32>,
    /// Amount per key, for an effect that conserves a value.
    amounts: Vec<i64>,
    misattributed: Vec<String>,
    misattributed_count: u64,
}

impl EffectBooks {
    fn rows(&self, key: u32) -> u64 {
        u64::from(self.per_key.get(key as usize).copied().unwrap_or(0))
    }

    /// The keys with a row, by id.
    fn keys(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.per_key.len() as u32).filter(|&k| self.rows(k) > 0)
    }
}

impl<'a> Books<'a> {
    /// The books of a declared system's run: `ops` is its record of
    /// intent, gone over twice (the keys taken from a value first), and
    /// kept compact.
    pub fn new(
        sys: &'a System,
        ops: impl Iterator<Item = Operation> + Clone,
        faults: Vec<FaultRecord>,
        started_epoch_ms: i64,
    ) -> Self {
        let mut keys = Interned::default();
        // The keys effects take from a value first: they are few, so the
        // effects' columns by key stay short.
        let mut value_keys: BTreeMap<usize, Vec<u32>> = BTreeMap::new();
        let mut value_amounts: BTreeMap<usize, Vec<i64>> = BTreeMap::new();
        for v in sys.effects.iter().filter_map(|d| d.key_value) {
            value_keys.insert(v, Vec::new());
        }
        for v in sys.effects.iter().filter_map(|d| d.conserve) {
            value_amounts.insert(v, Vec::new());
        }
        for op in ops.clone() {
            for (v, column) in value_keys.iter_mut() {
                let value = op.values.get(*v).map(text).unwrap_or_default();
                column.push(keys.insert(IdRef::of(&value)).0);
            }
            for (v, column) in value_amounts.iter_mut() {
                column.push(op.values.get(*v).and_then(|x| x.as_i64()).unwrap_or(0));
            }
        }
        let mut op_of_key = Vec::new();
        let mut compact = Vec::new();
        for (i, op) in ops.enumerate() {
            let (k, _) = keys.insert(IdRef::Uuid(*op.key.as_bytes()));
            *cell(&mut op_of_key, k, NONE) = i as u32;
            let (status, outcome, sent_ms, done_ms) = (op.status, op.outcome, op.sent_ms, op.done_ms);
            compact.push(Op { key: k, status, outcome, sent_ms, done_ms });
        }
        Self {
            sys,
            ops: compact,
            value_keys,
            value_amounts,
            kinds: sys.operation.events.clone(),
            event_ids: Interned::default(),
            events: Vec::new(),
            more_copies: HashMap::new(),
            keys,
            op_of_key,
            last_event: Vec::new(),
            lanes: Vec::new(),
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
            unpublished: HashSet::new(),
            unmarked_stall: false,
            spans: Default::default(),
            brief: false,
        }
    }

    /// How long each fault point lasts: a trace inside a pause or a
    /// blackhole is nearest of all to it.
    pub fn with_spans(mut self, spans: std::collections::BTreeMap<String, u64>) -> Self {
        self.spans = spans;
        self
    }

    /// Examples brief, each with its key as its subject (see [`Books::brief`]).
    pub fn told_by_the_report(mut self) -> Self {
        self.brief = true;
        self
    }

    /// An example's subject: its key, when that is a UUID.
    fn subject(&self, key: Option<u32>) -> Option<uuid::Uuid> {
        match self.keys.get(key?) {
            IdRef::Uuid(b) => Some(uuid::Uuid::from_bytes(b)),
            IdRef::Text(_) => None,
        }
    }

    /// The keys still pending when the run settled: their effects are not
    /// expected yet (the `stalled consumer` anomaly speaks for them).
    pub fn with_pending(mut self, keys: impl IntoIterator<Item = String>) -> Self {
        self.pending = keys.into_iter().filter(|k| !k.is_empty()).collect();
        self
    }

    /// The keys of the outbox rows a stalled relay left unmarked: late, not
    /// lost, while none of the key's events reached the topic. A row
    /// published whose mark was lost (its message read on the topic) is no
    /// late work: its effects are expected, and its amounts counted.
    pub fn with_unpublished(mut self, keys: impl IntoIterator<Item = String>) -> Self {
        self.unpublished = keys.into_iter().filter(|k| !k.is_empty()).collect();
        self
    }

    /// The run found the relay stalled, and it keeps no mark of what it
    /// published (`published = "none"`, a change-data-capture reader):
    /// only the topic tells what it left.
    pub fn with_unmarked_stall(mut self, stalled: bool) -> Self {
        self.unmarked_stall = stalled && self.sys.outbox.published == crate::scenario::Published::None;
        self
    }

    /// The relay's unmarked keys ([`Books::with_unpublished`]) become work
    /// still pending unless one of their events reached the topic.
    ///
    /// With an unmarked stall, the events not on the topic written after
    /// the last one that reached it are the relay's leftovers, and a key
    /// none of whose events reached the topic is work still pending: late,
    /// neither a lost event nor a missing effect. An event written well
    /// before one that was published (by more than [`SKIPPED_BEFORE_MS`])
    /// was skipped, not left: a reader of the write-ahead log publishes in
    /// commit order, so it is lost. A key with some events through is
    /// judged as usual.
    pub(super) fn take_stall_leftovers(&mut self) {
        let reached: HashSet<u32> = self.events.iter().filter(|e| e.on_topic()).map(|e| e.key).collect();
        for key in std::mem::take(&mut self.unpublished) {
            if self.keys.find(&key).is_none_or(|k| !reached.contains(&k)) {
                self.pending.insert(key);
            }
        }
        if !self.unmarked_stall {
            return;
        }
        let last_published = self.events.iter().filter(|e| e.on_topic()).map(|e| e.at_ms).max().unwrap_or(i32::MIN);
        let left: Vec<(u32, u32)> = (0..self.events.len() as u32)
            .filter(|&i| {
                let e = &self.events[i as usize];
                !e.on_topic() && i64::from(e.at_ms) >= i64::from(last_published) - SKIPPED_BEFORE_MS
            })
            .map(|i| (i, self.events[i as usize].key))
            .collect();
        for (i, key) in left {
            self.leftovers.insert(self.event_ids.get(i).to_string());
            if !reached.contains(&key) {
                self.pending.insert(self.keys.get(key).to_string());
            }
        }
    }

    fn kind(&mut self, k: &str) -> u16 {
        let i = match self.kinds.iter().position(|x| x == k) {
            Some(i) => i,
            // Past 65,535 types, every new one is told as the last.
            None if self.kinds.len() > usize::from(u16::MAX) => usize::from(u16::MAX),
            None => {
                self.kinds.push(k.to_string());
                self.kinds.len() - 1
            }
        };
        i as u16
    }

    /// Whether an event type is one the operations must produce.
    fn declared(&self, kind: u16) -> bool {
        (kind as usize) < self.sys.operation.events.len()
    }

    /// Whether an event type is one of `types`.
    fn of_types(&self, kind: u16, types: &[String]) -> bool {
        types.iter().any(|t| self.kinds.get(kind as usize) == Some(t))
    }

    /// A row of the outbox log.
    pub fn add_event(&mut self, e: LoggedEvent) {
        let fingerprint = fingerprint(e.key.as_bytes(), e.kind.as_bytes(), e.payload.as_bytes());
        self.push_event(IdRef::of(&e.id), IdRef::of(&e.key), &e.kind, fingerprint, e.at_epoch_ms, e.malformed);
    }

    /// An outbox row as the payments pipeline's own read gives it: its
    /// fingerprint already taken, by the one function every reader uses.
    pub fn add_outbox_row(
        &mut self,
        id: uuid::Uuid,
        key: uuid::Uuid,
        kind: &str,
        fp: u32,
        at_ms: i64,
        malformed: bool,
    ) {
        self.push_event(IdRef::Uuid(*id.as_bytes()), IdRef::Uuid(*key.as_bytes()), kind, fp, at_ms, malformed);
    }

    fn push_event(&mut self, id: IdRef, key: IdRef, kind: &str, fingerprint: u32, at_epoch_ms: i64, malformed: bool) {
        let (i, new) = self.event_ids.insert(id);
        if !new {
            // The same id written twice: its second row is not a new event.
            return;
        }
        let kind = self.kind(kind);
        let (key, _) = self.keys.insert(key);
        // Into the ring of its key's events, after the last one.
        let last = std::mem::replace(cell(&mut self.last_event, key, NONE), i);
        let next_of_key = match last {
            NONE => i,
            last => std::mem::replace(&mut self.events[last as usize].next_of_key, i),
        };
        let at_ms = (at_epoch_ms - self.started_epoch_ms).clamp(i32::MIN.into(), i32::MAX.into()) as i32;
        let flags = if malformed { MALFORMED } else { 0 };
        self.events.push(Event { copy: Packed::default(), key, next_of_key, fingerprint, at_ms, kind, flags });
    }

    /// A message read from the topic.
    pub fn add_message(&mut self, at: Position, key: &[u8], id: Option<&[u8]>, fp: u32) {
        self.messages += 1;
        let found = id.and_then(|b| std::str::from_utf8(b).ok()).and_then(|id| self.event_ids.find(id));
        // A key's lane is its outbox key's: the order an outbox promises is
        // per aggregate, whatever key the relay put on the message. A relay
        // that keys by another column (the event's own id) splits an
        // aggregate's events across partitions with every message key
        // on one.
        let lane_key = match found {
            Some(i) => Some(self.events[i as usize].key),
            None => std::str::from_utf8(key).ok().map(|k| self.keys.insert(IdRef::of(k)).0),
        };
        if let Some(k) = lane_key {
            let lane = cell(&mut self.lanes, k, Lane::Unseen);
            *lane = match *lane {
                Lane::Unseen => Lane::One(at.lane()),
                Lane::One(first) if first != at.lane() => Lane::Split,
                seen => seen,
            };
        }
        let Some(i) = found else {
            self.foreign_count += 1;
            if self.foreign.len() < EXAMPLES {
                let id =
                    id.map(String::from_utf8_lossy).map_or("no event_id header".into(), |s| format!("event_id {s}"));
                self.foreign.push(format!(
                    "message {} ({id}, key {}): no outbox row has this id",
                    at.short(),
                    String::from_utf8_lossy(key)
                ));
            }
            return;
        };
        let e = &mut self.events[i as usize];
        if e.on_topic() {
            self.more_copies.entry(i).or_default().push(at);
        } else {
            e.copy = at.packed();
            e.flags |= ON_TOPIC;
        }
        if fp != e.fingerprint {
            e.flags |= MISMATCHED;
        }
    }

    /// An outbox row still unmarked after the drain.
    pub fn add_leftover(&mut self, id: String) {
        self.leftovers.insert(id);
    }

    /// A row of the `n`th declared effect.
    pub fn add_effect_row(&mut self, n: usize, row: EffectRow) {
        let (key, _) = self.keys.insert(IdRef::of(row.key.as_deref().unwrap_or_default()));
        self.add_row(n, row.message_id.as_deref().map(IdRef::of), key, row.amount);
    }

    fn add_row(&mut self, n: usize, message: Option<IdRef>, key: u32, amount: Option<i64>) {
        let decl = &self.sys.effects[n];
        let mut wrong = None;
        if matches!(decl.once, Once::PerMessage | Once::PerMalformedMessage) {
            match self.row_event(decl, message, key) {
                Ok(i) => {
                    let rows = cell(&mut self.effects[n].per_event, i, 0);
                    *rows = rows.saturating_add(1);
                }
                Err(w) => wrong = Some(w),
            }
        }
        let books = &mut self.effects[n];
        let rows = cell(&mut books.per_key, key, 0);
        *rows = rows.saturating_add(1);
        if decl.conserve.is_some() {
            *cell(&mut books.amounts, key, 0) += amount.unwrap_or(0);
        }
        if let Some(w) = wrong {
            books.misattributed_count += 1;
            if books.misattributed.len() < EXAMPLES {
                books.misattributed.push(format!("{}: {w}", decl.name));
            }
        }
    }

    /// The event a row of a per-message effect is for, or why it is for
    /// none: it names no event, or one that causes no such effect, or one
    /// of another key.
    fn row_event(&self, decl: &EffectDecl, message_id: Option<IdRef>, key: u32) -> Result<u32, String> {
        let for_malformed = decl.once == Once::PerMalformedMessage;
        let Some(i) = message_id.and_then(|m| self.event_ids.find_id(m)) else {
            let shown = message_id.map_or("NULL".to_string(), |m| m.to_owned().to_string());
            return Err(format!("a row names message {shown}, which is no outbox event"));
        };
        let (e, id) = (&self.events[i as usize], self.event_ids.get(i));
        if e.malformed() != for_malformed {
            let what = if for_malformed { "a well-formed" } else { "a malformed" };
            Err(format!("a row names message {id}, {what} event, which causes no {} effect", decl.name))
        } else if !for_malformed && !self.of_types(e.kind, &decl.types) {
            Err(format!(
                "a row names message {id}, a {} event, which causes no {} effect",
                self.kinds[e.kind as usize], decl.name
            ))
        } else if e.key != key {
            Err(format!(
                "a row for message {id} has key {}; the message's key is {}",
                self.keys.get(key),
                self.keys.get(e.key)
            ))
        } else {
            Ok(i)
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
                let about =
                    self.sys.effects.iter().find_map(|e| e.provider.as_ref()).and_then(|f| record.field(r, &f.key));
                let example = format!(
                    "key {} sent again with another body at {:.2} s",
                    r.key.as_ref().map_or("?".into(), |k| k.text()),
                    r.arrived().as_secs_f64()
                );
                reused.push((example, about.and_then(|v| self.keys.find(&v.text()))));
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
    fn declared_counts(&self, key: u32) -> Vec<u32> {
        let mut counts = vec![0u32; self.sys.operation.events.len()];
        for i in self.events_of(key) {
            let e = &self.events[i];
            if self.declared(e.kind) && !e.malformed() {
                counts[e.kind as usize] += 1;
            }
        }
        counts
    }

    /// Whether an operation took effect: its key has events of these types.
    fn took_effect(&self, op: &Op, types: &[String]) -> bool {
        self.events_of(op.key).any(|i| !self.events[i].malformed() && self.of_types(self.events[i].kind, types))
    }

    /// The key an effect's rows carry for operation `i`.
    fn effect_key(&self, decl: &EffectDecl, i: usize) -> u32 {
        match decl.key_value.and_then(|v| self.value_keys.get(&v)) {
            Some(column) => column[i],
            None => self.ops[i].key,
        }
    }

    /// The operation of a key, if any asked for it.
    fn op_of(&self, key: u32) -> Option<&Op> {
        self.op_of_key.get(key as usize).filter(|&&i| i != NONE).map(|&i| &self.ops[i as usize])
    }

    /// A key's events, by index, in the order added: around the ring from
    /// the one after its last, its first.
    fn events_of(&self, key: u32) -> impl Iterator<Item = usize> + '_ {
        let last = self.last_event.get(key as usize).copied().unwrap_or(NONE);
        let mut next = (last != NONE).then(|| self.events[last as usize].next_of_key);
        std::iter::from_fn(move || {
            let i = next?;
            next = (i != last).then(|| self.events[i as usize].next_of_key);
            Some(i as usize)
        })
    }

    /// An event's messages on the topic, in the order read.
    fn copies(&self, i: usize) -> impl Iterator<Item = Position> + '_ {
        let e = &self.events[i];
        let first = e.on_topic().then(|| e.copy.position());
        let more = self.more_copies.get(&(i as u32)).map(Vec::as_slice).unwrap_or_default();
        first.into_iter().chain(more.iter().copied())
    }

    /// Whether a key's work was still pending when the run settled.
    fn is_pending(&self, key: u32) -> bool {
        !self.pending.is_empty() && self.pending.contains(&self.keys.get(key).to_string())
    }

    /// Keys in the order of their texts, as the examples are told.
    fn sort_by_text(&self, keys: &mut [u32]) {
        keys.sort_by(|&a, &b| self.keys.get(a).cmp(&self.keys.get(b)));
    }
}

/// The cell of id `i` in a column indexed by id, grown with `empty` on demand.
fn cell<T: Clone>(column: &mut Vec<T>, i: u32, empty: T) -> &mut T {
    let i = i as usize;
    if i >= column.len() {
        column.resize(i + 1, empty);
    }
    &mut column[i]
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

/// An id or a key, borrowed: one whose text is a UUID in its canonical
/// form (lowercase, hyphenated) is its 16 bytes, any other text itself, so
/// that it renders back exactly as it came.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum IdRef<'t> {
    Uuid([u8; 16]),
    Text(&'t str),
}

impl<'t> IdRef<'t> {
    fn of(text: &'t str) -> Self {
        if text.len() == uuid::fmt::Hyphenated::LENGTH {
            if let Ok(u) = uuid::Uuid::try_parse(text) {
                // Only the canonical text: "ABC…" or any other spelling
                // of the same UUID is another key, as it is to a map.
                if u.hyphenated().encode_lower(&mut [0; uuid::fmt::Hyphenated::LENGTH]) == text {
                    return IdRef::Uuid(*u.as_bytes());
                }
            }
        }
        IdRef::Text(text)
    }

    /// Its text, written into `buf` when it is a UUID.
    fn text<'s>(&'s self, buf: &'s mut [u8; uuid::fmt::Hyphenated::LENGTH]) -> &'s str {
        match self {
            IdRef::Uuid(b) => uuid::Uuid::from_bytes(*b).hyphenated().encode_lower(buf),
            IdRef::Text(s) => s,
        }
    }
}

impl std::fmt::Display for IdRef<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            IdRef::Uuid(b) => uuid::Uuid::from_bytes(*b).hyphenated().fmt(f),
            IdRef::Text(s) => f.write_str(s),
        }
    }
}

/// Ids in the order of their texts.
impl Ord for IdRef<'_> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        match (self, other) {
            // Hyphens at the same places, hex digits in ascending order:
            // the canonical texts of two UUIDs sort as their bytes.
            (IdRef::Uuid(a), IdRef::Uuid(b)) => a.cmp(b),
            _ => {
                let (mut a, mut b) = ([0; uuid::fmt::Hyphenated::LENGTH], [0; uuid::fmt::Hyphenated::LENGTH]);
                self.text(&mut a).cmp(other.text(&mut b))
            }
        }
    }
}

impl PartialOrd for IdRef<'_> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// Ids interned once, each known by its index, in the order they came.
///
/// Each id takes 16 bytes: a UUID its own, a text the index of its copy in
/// `texts` (rare: the payments pipeline's ids and keys are all UUIDs). An
/// open-addressed table of indices finds them: four bytes a slot, where a
/// map would hold a hash, a second copy of the id and its index.
#[derive(Default)]
struct Interned {
    ids: Vec<[u8; 16]>,
    /// A bit per id: set when it is text, its 16 bytes then the index
    /// into `texts`.
    is_text: Vec<u64>,
    texts: Vec<Box<str>>,
    /// Each slot an index into `ids` plus one, or 0 when empty; never more
    /// than half full, so that a probe ends soon.
    slots: Vec<u32>,
    hasher: std::hash::RandomState,
}

impl Interned {
    fn len(&self) -> usize {
        self.ids.len()
    }

    /// The id at an index.
    fn get(&self, i: u32) -> IdRef<'_> {
        let i = i as usize;
        let bytes = &self.ids[i];
        match self.is_text.get(i / 64).is_some_and(|w| w >> (i % 64) & 1 == 1) {
            true => {
                let at = u64::from_le_bytes(bytes[..8].try_into().unwrap_or_default());
                IdRef::Text(&self.texts[at as usize])
            }
            false => IdRef::Uuid(*bytes),
        }
    }

    /// The index of an id given as text, if interned.
    fn find(&self, text: &str) -> Option<u32> {
        self.find_id(IdRef::of(text))
    }

    fn find_id(&self, id: IdRef) -> Option<u32> {
        self.probe(id).ok()
    }

    /// The index of an id, interned if new, and whether it was.
    fn insert(&mut self, id: IdRef) -> (u32, bool) {
        if (self.ids.len() + 1) * 2 > self.slots.len() {
            self.grow();
        }
        match self.probe(id) {
            Ok(i) => (i, false),
            Err(slot) => {
                let i = self.ids.len();
                match id {
                    IdRef::Uuid(b) => self.ids.push(b),
                    IdRef::Text(t) => {
                        let mut b = [0u8; 16];
                        b[..8].copy_from_slice(&(self.texts.len() as u64).to_le_bytes());
                        self.texts.push(t.into());
                        self.ids.push(b);
                        if self.is_text.len() <= i / 64 {
                            self.is_text.resize(i / 64 + 1, 0);
                        }
                        self.is_text[i / 64] |= 1 << (i % 64);
                    }
                }
                self.slots[slot] = i as u32 + 1;
                (i as u32, true)
            }
        }
    }

    /// Where an id is: its index, or else the empty slot it would take.
    fn probe(&self, id: IdRef) -> Result<u32, usize> {
        if self.slots.is_empty() {
            return Err(0);
        }
        let mask = self.slots.len() - 1;
        let mut slot = self.home(id, mask);
        loop {
            match self.slots[slot] {
                0 => return Err(slot),
                i if self.get(i - 1) == id => return Ok(i - 1),
                _ => slot = (slot + 1) & mask,
            }
        }
    }

    /// The slot where a probe for an id starts.
    fn home(&self, id: IdRef, mask: usize) -> usize {
        use std::hash::BuildHasher;
        self.hasher.hash_one(id) as usize & mask
    }

    /// Twice the slots, every id placed anew.
    fn grow(&mut self) {
        let mut slots = vec![0u32; (self.slots.len() * 2).max(16)];
        let mask = slots.len() - 1;
        for i in 0..self.ids.len() as u32 {
            let mut slot = self.home(self.get(i), mask);
            while slots[slot] != 0 {
                slot = (slot + 1) & mask;
            }
            slots[slot] = i + 1;
        }
        self.slots = slots;
    }
}
