//! Each example's story, and its causes by the one attribution.

use super::*;
use crate::verifier::attribution::{self, Followed};

impl Books<'_> {
    /// A key's story, on one line, as an example of `anomaly`: its
    /// operation, the cause of the anomaly by data or the faults around the
    /// operation by time, its outbox events, its messages, its effects.
    pub(super) fn story(&self, key: u32, anomaly: AnomalyKind) -> String {
        if self.brief {
            return format!("key {}", self.keys.get(key));
        }
        let mut parts = Vec::new();
        match self.op_of(key) {
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
                        let near = self.near(op.sent_ms, op.done_ms, anomaly);
                        if !near.is_empty() {
                            parts.push(format!("faults around it, by time: {}", near.join(", ")));
                        }
                    }
                }
            }
            None => parts.push("never asked for".into()),
        }
        let outbox: Vec<String> = self
            .events_of(key)
            .map(|i| {
                let e = &self.events[i];
                let at = e.at_ms() as f64 / 1000.0;
                let id = self.event_ids.get(i as u32).to_string();
                format!("{} {} at {at:.2} s", self.kinds[e.kind as usize], short(&id))
            })
            .collect();
        parts.push(match outbox.is_empty() {
            true => "outbox: none".into(),
            false => format!("outbox: {}", outbox.join(", ")),
        });
        let copies: Vec<String> = self.events_of(key).flat_map(|i| self.copies(i).map(|p| p.short())).take(8).collect();
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
            .map(|(d, b)| format!("{} ×{}", d.name, b.rows(key)))
            .collect();
        if !effects.is_empty() {
            parts.push(format!("effects: {}", effects.join(", ")));
        }
        format!("key {}: {}", self.keys.get(key), parts.join("; "))
    }

    /// The first three faults around an operation (from `sent_ms` to
    /// `done_ms`, with [`AROUND_MS`] either side), by time. For an event no
    /// relay published, a writer's held COMMIT around its write is the
    /// likeliest cause (a later row committed first, and a cursor read past
    /// it), so it is named first.
    fn near(&self, sent_ms: u64, done_ms: u64, anomaly: AnomalyKind) -> Vec<String> {
        let mut near: Vec<&crate::faults::FaultRecord> =
            self.faults.iter().filter(|f| f.at_ms + AROUND_MS >= sent_ms && f.at_ms <= done_ms + AROUND_MS).collect();
        if matches!(anomaly, AnomalyKind::LostEvent | AnomalyKind::UnpublishedLeftover) {
            near.sort_by_key(|f| !held_writer(f));
        }
        near.iter()
            .take(3)
            .map(|f| format!("{} on {} at {:.2} s", f.point, f.component, f.at_ms as f64 / 1000.0))
            .collect()
    }

    /// When a key's story ends, in milliseconds since the run started: the
    /// latest of its operation's answer and its outbox events.
    pub(super) fn trace_ms(&self, key: u32) -> Option<u64> {
        let op = self.op_of(key).map(|op| op.done_ms);
        let last_event = self.events_of(key).map(|i| u64::try_from(self.events[i].at_ms()).unwrap_or(0)).max();
        op.into_iter().chain(last_event).max()
    }

    /// The faults tied to a key's example: by data first (a firing whose
    /// reach holds one of its messages: an offset commit that covered it),
    /// else by time (fired in the window before its last trace, or soon
    /// after), nearest first, each marked so.
    pub(super) fn followed(&self, key: u32, example: usize, anomaly: &str) -> Option<Followed> {
        let trace_ms = self.trace_ms(key)?;
        let messages: Vec<crate::broker::Position> = self.events_of(key).flat_map(|i| self.copies(i)).collect();
        let faults = attribution::suspects(&self.faults, trace_ms, anomaly, &self.spans, |f| {
            attribution::reached(f, &messages, anomaly)
        });
        Some(Followed { example, subject: self.keys.get(key).to_string(), trace_ms, faults })
    }
}

/// A held COMMIT of a process that writes the outbox (a service).
fn held_writer(f: &crate::faults::FaultRecord) -> bool {
    f.point == crate::faults::FaultPoint::DbHoldCommit.name() && crate::domain::names::writes_outbox(&f.component)
}
