//! What one notifier transaction writes, and the projection's state
//! guard, decided once for both backends: the backends only differ in how
//! they say it in SQL.

use crate::domain::events::{Decoded, EventKind};
use crate::scenario::ProjectionMode;
use std::collections::BTreeMap;
use uuid::Uuid;

/// The effects one notifier transaction applies.
#[derive(Debug, Default)]
pub struct EffectPlan<'a> {
    /// Projection updates, in message order.
    pub projection: Vec<&'a Decoded>,
    /// (payment id, message id) of each receipt to send.
    pub receipts: Vec<(Uuid, Uuid)>,
    /// Points to add per (account, stripe), sorted so that concurrent
    /// notifiers lock rows in the same order and cannot deadlock.
    pub loyalty: BTreeMap<(i32, i32), i64>,
    /// (event id, account, points) of each loyalty credit: the counter's
    /// audit trail, one row per credit, so the verifier can trace it.
    pub credits: Vec<(Uuid, i32, i64)>,
    pub applied: u64,
    pub duplicates: u64,
}

/// The status each payment is left with by a batch's projection events, in
/// message order, with the event that set it: with the state guard the
/// furthest status seen (its first event), without it the last one. Sorted
/// by payment, so concurrent transactions lock rows in the same order.
pub fn final_statuses(events: &[&Decoded], mode: ProjectionMode) -> BTreeMap<Uuid, (EventKind, Uuid)> {
    let mut out: BTreeMap<Uuid, (EventKind, Uuid)> = BTreeMap::new();
    for e in events {
        let slot = out.entry(e.body.payment_id).or_insert((e.kind, e.event_id));
        let moves = match mode {
            ProjectionMode::StateGuard => e.kind > slot.0,
            ProjectionMode::LastWriteWins => true,
        };
        if moves {
            *slot = (e.kind, e.event_id);
        }
    }
    out
}

/// How many of a batch's projection events the state guard refused, given
/// each payment's status before the batch (`None`: no row yet). One
/// definition for both backends: an event is refused unless it moves its
/// payment's status forward (a first row, or authorized to captured), as
/// the guarded upsert decides event by event. Without the guard nothing is
/// refused.
pub fn refused_by_guard(events: &[&Decoded], mode: ProjectionMode, before: impl Fn(Uuid) -> Option<EventKind>) -> u64 {
    if mode == ProjectionMode::LastWriteWins {
        return 0;
    }
    let mut status: BTreeMap<Uuid, Option<EventKind>> = BTreeMap::new();
    let mut refused = 0;
    for e in events {
        let s = status.entry(e.body.payment_id).or_insert_with(|| before(e.body.payment_id));
        if s.is_none_or(|k| e.kind > k) {
            *s = Some(e.kind);
        } else {
            refused += 1;
        }
    }
    refused
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::domain::events::PaymentEvent;

    /// A decoded event of payment `payment`, for the inbox's tests too.
    pub(crate) fn event(payment: u128, kind: EventKind, id: u128) -> Decoded {
        Decoded {
            event_id: Uuid::from_u128(id),
            kind,
            body: PaymentEvent { payment_id: Uuid::from_u128(payment), account_id: 3, amount_cents: 250 },
            lane: 1,
        }
    }

    #[test]
    fn final_statuses_keep_the_furthest_with_the_guard_and_the_last_without() {
        let (a, c) = (event(1, EventKind::Authorized, 10), event(1, EventKind::Captured, 11));
        let guarded = final_statuses(&[&c, &a], ProjectionMode::StateGuard);
        assert_eq!(guarded[&c.body.payment_id], (EventKind::Captured, c.event_id));
        let lww = final_statuses(&[&c, &a], ProjectionMode::LastWriteWins);
        assert_eq!(lww[&c.body.payment_id], (EventKind::Authorized, a.event_id), "a stale event wins");
    }

    #[test]
    fn the_guard_refuses_what_does_not_move_a_status_forward() {
        let (a, c) = (event(1, EventKind::Authorized, 10), event(1, EventKind::Captured, 11));
        let fresh = |_| None;
        assert_eq!(refused_by_guard(&[&a, &c], ProjectionMode::StateGuard, fresh), 0, "in order");
        assert_eq!(refused_by_guard(&[&c, &a], ProjectionMode::StateGuard, fresh), 1, "out of order");
        let was_captured = |_| Some(EventKind::Captured);
        assert_eq!(refused_by_guard(&[&a, &c], ProjectionMode::StateGuard, was_captured), 2);
        let was_authorized = |_| Some(EventKind::Authorized);
        assert_eq!(refused_by_guard(&[&a, &c], ProjectionMode::StateGuard, was_authorized), 1);
        assert_eq!(refused_by_guard(&[&c, &a], ProjectionMode::LastWriteWins, was_captured), 0, "no guard");
    }
}
