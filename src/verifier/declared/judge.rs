//! The books turned into invariants and anomalies: one method per group.

use super::*;

impl Books<'_> {
    /// The invariants and anomalies.
    pub fn finish(mut self) -> Found {
        self.take_stall_leftovers();
        let mut found = Found::default();
        let mut tally = Tally::default();
        let f = &mut found.figures;
        f.operations = self.ops.len() as u64;
        f.outbox_events = self.events.len() as u64;
        f.messages = self.messages;
        // An event's messages past its first are its duplicates.
        f.duplicate_messages = self.more_copies.values().map(|c| c.len() as u64).sum();

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
            let [.., misattributed] = effect_anomalies(decl);
            for m in &books.misattributed {
                tally.note(misattributed, m.clone());
            }
            tally.more(misattributed, books.misattributed_count - books.misattributed.len() as u64);
            if let Some(v) = decl.conserve {
                self.judge_amounts(decl, books, v, &mut found, &mut tally);
            }
        }
        self.judge_checks(&mut found, &mut tally);

        found.anomalies = tally
            .0
            .into_iter()
            .map(|Noted { kind, count, examples, keys }| Anomaly {
                name: kind.as_str().to_string(),
                count,
                examples,
                allowed: false,
                subjects: match self.brief {
                    true => keys.iter().map(|&k| self.subject(k)).collect(),
                    false => vec![],
                },
                followed: keys
                    .iter()
                    .enumerate()
                    .filter_map(|(i, k)| k.and_then(|k| self.followed(k, i, kind.as_str())))
                    .collect(),
                found_by: vec![],
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
    fn judge_operation(&self, op: &Op, wanted: &str, tally: &mut Tally) -> bool {
        let key = op.key;
        let counts = self.declared_counts(key);
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
                    tally.note_on(AnomalyKind::LostOperation, Some(key), || {
                        format!(
                            "acknowledged, and none of its events ({wanted}) is in the outbox; {}",
                            self.story(key, AnomalyKind::LostOperation)
                        )
                    });
                } else if counts.iter().any(|&n| n != 1) {
                    tally.note_on(AnomalyKind::OutboxMismatch, Some(key), || {
                        format!(
                            "acknowledged with {} (expected each once); {}",
                            shown(),
                            self.story(key, AnomalyKind::OutboxMismatch)
                        )
                    });
                } else {
                    return true;
                }
            }
            Outcome::Ambiguous => {
                let partial = total > 0 && counts.contains(&0);
                if counts.iter().any(|&n| n > 1) || partial {
                    tally.note_on(AnomalyKind::OutboxMismatch, Some(key), || {
                        format!(
                            "ambiguous, with {} (expected each once, or none at all); {}",
                            shown(),
                            self.story(key, AnomalyKind::OutboxMismatch)
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
                tally.note_on(AnomalyKind::PhantomOperation, Some(key), || {
                    format!("refused, and still {}; {}", shown(), self.story(key, AnomalyKind::PhantomOperation))
                });
            }
        }
        false
    }

    /// Events for keys the workload never asked for: phantoms, each noted.
    fn judge_never_asked(&self, tally: &mut Tally) -> u64 {
        let mut n = 0;
        let mut never_asked: Vec<u32> = (0..self.last_event.len() as u32)
            .filter(|&k| {
                self.op_of(k).is_none()
                    && self.events_of(k).any(|i| self.declared(self.events[i].kind) && !self.events[i].malformed())
            })
            .collect();
        self.sort_by_text(&mut never_asked);
        for k in never_asked {
            n += 1;
            tally.note_on(AnomalyKind::PhantomOperation, Some(k), || {
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
        // The leftovers that are events, by index: a leftover is no lost event.
        let leftover: HashSet<u32> = self.leftovers.iter().filter_map(|id| self.event_ids.find(id)).collect();
        let mut on_topic = 0u64;
        let mut mismatched = 0u64;
        for (i, e) in self.events.iter().enumerate() {
            let id = self.event_ids.get(i as u32);
            if !e.on_topic() {
                if !leftover.contains(&(i as u32)) {
                    tally.note_on(AnomalyKind::LostEvent, Some(e.key), || {
                        format!(
                            "{} {id} is on no partition; {}",
                            self.kinds[e.kind as usize],
                            self.story(e.key, AnomalyKind::LostEvent)
                        )
                    });
                }
            } else {
                on_topic += 1;
            }
            if e.mismatched() {
                mismatched += 1;
                tally.note_on(AnomalyKind::MessageMismatch, Some(e.key), || {
                    format!(
                        "a message of {} {id} differs from its outbox row (key, type or value); {}",
                        self.kinds[e.kind as usize],
                        self.story(e.key, AnomalyKind::MessageMismatch)
                    )
                });
            }
        }
        let unpublished = leftover.iter().filter(|&&i| !self.events[i as usize].on_topic()).count() as u64;
        found.invariants.push(linked(
            Invariant::eq(
                "every published outbox event is on the topic",
                self.events.len() as u64 - unpublished,
                on_topic,
            ),
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
        self.judge_lanes(found, tally);
        self.judge_leftovers(found, tally);
    }

    /// A key's messages on one partition.
    fn judge_lanes(&self, found: &mut Found, tally: &mut Tally) {
        let mut split: Vec<u32> =
            (0..self.lanes.len() as u32).filter(|&k| self.lanes[k as usize] == Lane::Split).collect();
        self.sort_by_text(&mut split);
        for &k in &split {
            tally.note_on(AnomalyKind::SplitKey, Some(k), || {
                format!("its messages are on more than one partition; {}", self.story(k, AnomalyKind::SplitKey))
            });
        }
        found.invariants.push(linked(
            Invariant::eq("a key's messages are on one partition", 0, split.len() as u64),
            &[AnomalyKind::SplitKey],
        ));
    }

    /// No outbox row left unpublished after the drain.
    fn judge_leftovers(&self, found: &mut Found, tally: &mut Tally) {
        let mut left: Vec<&String> = self.leftovers.iter().collect();
        left.sort();
        for id in &left {
            let key = self.event_ids.find(id).map(|i| self.events[i as usize].key);
            tally.note_on(AnomalyKind::UnpublishedLeftover, key, || {
                format!(
                    "outbox row {id} is still unpublished after the drain{}",
                    key.map(|k| format!("; {}", self.story(k, AnomalyKind::UnpublishedLeftover))).unwrap_or_default()
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
                true => e.malformed(),
                false => !e.malformed() && self.of_types(e.kind, &decl.types),
            };
            if !wanted {
                continue;
            }
            expected += 1;
            let n = u64::from(books.per_event.get(i).copied().unwrap_or(0));
            if n == 0 && self.is_pending(e.key) {
                expected -= 1;
                continue;
            }
            let Some((kind, rows)) = not_once(decl, n, &mut missing, &mut duplicate) else { continue };
            tally.note_on(kind, Some(e.key), || {
                format!(
                    "{}: {rows} for {} {}; {}",
                    decl.name,
                    self.kinds[e.kind as usize],
                    self.event_ids.get(i as u32),
                    self.story(e.key, kind)
                )
            });
        }
        let types = if for_malformed { "malformed".to_string() } else { decl.types.join(", ") };
        let mut inv = Invariant::eq(
            &format!("effect {}: exactly one per {types} message", decl.name),
            expected,
            expected - missing - duplicate,
        );
        // A row for no such event breaks it too, though every event has its one.
        inv.ok &= books.misattributed_count == 0;
        found.invariants.push(inv);
        link_last(found, &effect_anomalies(decl));
    }

    /// Effect `decl` once per key of the operations that took effect, and
    /// no row for any other key.
    fn judge_per_key(&self, decl: &EffectDecl, books: &EffectBooks, found: &mut Found, tally: &mut Tally) {
        let (mut missing, mut duplicate) = (0u64, 0u64);
        let mut keys: Vec<u32> = self
            .ops
            .iter()
            .enumerate()
            .filter(|(_, op)| self.took_effect(op, &decl.types))
            .map(|(i, _)| self.effect_key(decl, i))
            .collect();
        keys.sort_unstable();
        keys.dedup();
        let mut expected = vec![false; self.keys.len()];
        for &k in &keys {
            expected[k as usize] = true;
        }
        self.sort_by_text(&mut keys);
        // Still pending: not expected yet.
        keys.retain(|&k| books.rows(k) > 0 || !self.is_pending(k));
        for &k in &keys {
            let Some((kind, rows)) = not_once(decl, books.rows(k), &mut missing, &mut duplicate) else { continue };
            tally.note_on(kind, Some(k), || {
                format!("{}: {rows} for key {}; {}", decl.name, self.keys.get(k), self.story(k, kind))
            });
        }
        let mut strays: Vec<u32> = books.keys().filter(|&k| !expected[k as usize]).collect();
        self.sort_by_text(&mut strays);
        let misattributed = strays.len() as u64 + books.misattributed_count;
        for k in strays {
            let [.., misattributed] = effect_anomalies(decl);
            tally.note_on(misattributed, Some(k), || {
                format!(
                    "{}: a row for key {}, which no operation that took effect has; {}",
                    decl.name,
                    self.keys.get(k),
                    self.story(k, misattributed)
                )
            });
        }
        let mut inv = Invariant::eq(
            &format!("effect {}: exactly one per key", decl.name),
            keys.len() as u64,
            keys.len() as u64 - missing - duplicate,
        );
        inv.ok &= misattributed == 0;
        found.invariants.push(inv);
        link_last(found, &effect_anomalies(decl));
    }

    /// Effect `decl`'s amounts per key against what the operations that
    /// took effect asked for in their value `v`.
    fn judge_amounts(&self, decl: &EffectDecl, books: &EffectBooks, v: usize, found: &mut Found, tally: &mut Tally) {
        // Asked for per key id: None for a key no operation asked for.
        let mut expected: Vec<Option<i64>> = Vec::new();
        // Work still pending is not expected in the sums yet.
        let amounts = self.value_amounts.get(&v).map(Vec::as_slice).unwrap_or_default();
        for (i, op) in self.ops.iter().enumerate() {
            if !self.took_effect(op, &decl.types) || self.is_pending(op.key) {
                continue;
            }
            let want = cell(&mut expected, self.effect_key(decl, i), None);
            *want = Some(want.unwrap_or(0) + amounts.get(i).copied().unwrap_or(0));
        }
        let asked = (0..expected.len() as u32).filter(|&k| expected[k as usize].is_some());
        let mut keys: Vec<u32> = asked.chain(books.keys()).collect();
        keys.sort_unstable();
        keys.dedup();
        self.sort_by_text(&mut keys);
        let mut drift = 0u64;
        let value = &self.sys.operation.values[v].0;
        for &k in &keys {
            let want = expected.get(k as usize).copied().flatten().unwrap_or(0);
            let got = books.amounts.get(k as usize).copied().unwrap_or(0);
            if want != got {
                drift += 1;
                let by =
                    if got > want { format!("{} too much", got - want) } else { format!("{} too little", want - got) };
                let about = decl.key_value.is_none().then_some(k);
                tally.note_on(AnomalyKind::CounterDrift, about, || {
                    let story = match about {
                        Some(k) => format!("; {}", self.story(k, AnomalyKind::CounterDrift)),
                        None => String::new(),
                    };
                    format!(
                        "{}: key {} adds up to {got}, and the operations that took effect asked for {want} ({value}): {by}{story}",
                        decl.name, self.keys.get(k)
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
            for (r, key) in reused {
                tally.note_on(AnomalyKind::IdempotencyKeyReused, *key, || r.clone());
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
}

/// An effect's rows where there should be one: None when there is, else
/// the anomaly and how many rows, counted as missing or duplicate.
fn not_once(decl: &EffectDecl, rows: u64, missing: &mut u64, duplicate: &mut u64) -> Option<(AnomalyKind, String)> {
    let [lost, twice, _] = effect_anomalies(decl);
    match rows {
        1 => None,
        0 => {
            *missing += 1;
            Some((lost, "no row".into()))
        }
        n => {
            *duplicate += 1;
            Some((twice, format!("{n} rows")))
        }
    }
}

/// What breaks an effect's once: missing, duplicate, misattributed. An
/// effect read from the provider's record is outside the database, and
/// says so, as the payments pipeline's emails do: one mistake, one name,
/// whichever verifier finds it.
fn effect_anomalies(decl: &EffectDecl) -> [AnomalyKind; 3] {
    match decl.provider {
        Some(_) => [
            AnomalyKind::MissingExternalEffect,
            AnomalyKind::DuplicateExternalEffect,
            AnomalyKind::MisattributedExternalEffect,
        ],
        None => [AnomalyKind::MissingEffect, AnomalyKind::DuplicateEffect, AnomalyKind::MisattributedEffect],
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
/// (its id) each example is about (for its cause).
struct Noted {
    kind: AnomalyKind,
    count: u64,
    examples: Vec<String>,
    keys: Vec<Option<u32>>,
}

impl Tally {
    fn note(&mut self, kind: AnomalyKind, example: String) {
        self.note_on(kind, None, || example)
    }

    /// [`Tally::note`] of an example about `key`. The example is written
    /// only when it is kept: its story looks for its cause in the fault
    /// log, and a run may find thousands of one anomaly.
    fn note_on(&mut self, kind: AnomalyKind, key: Option<u32>, example: impl FnOnce() -> String) {
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
