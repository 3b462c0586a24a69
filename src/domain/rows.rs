//! The rows of the ground truth as the store reads them, and the sink they
//! stream into. The verifier's ledger is that sink; the store knows only
//! this trait, so it never imports the verifier.

use crate::domain::events::{EventKind, PaymentEvent};
use uuid::Uuid;

/// One row of the payments table, as the verifier reads it.
#[derive(Debug, Clone)]
pub struct PaymentRow {
    pub id: Uuid,
    pub account_id: i32,
    pub amount_cents: i64,
    pub captured: bool,
}

/// One outbox row, as the verifier reads it.
#[derive(Debug, Clone)]
pub struct OutboxRecord {
    pub id: Uuid,
    pub payment_id: Uuid,
    /// None for a malformed (poison) event: one whose type or payload does
    /// not decode, told apart exactly as the notifier tells it apart.
    pub kind: Option<EventKind>,
    /// The decoded payload, when it decodes.
    pub body: Option<PaymentEvent>,
    pub published: bool,
    /// Of the key, type and payload a relay publishes for it.
    pub fingerprint: u32,
    /// When it was written, in milliseconds since the epoch: what the core
    /// checker dates an operation's story by.
    pub at_epoch_ms: i64,
}

/// A dated row as the store reads it: its payment, and the time in
/// milliseconds since the epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoryRow {
    pub payment: Uuid,
    pub lane: &'static str,
    pub what: String,
    pub event: Option<Uuid>,
    pub at_epoch_ms: i64,
    /// The outbox row's seq, on an outbox row's steps: what a relay's
    /// fault log names.
    pub seq: Option<i64>,
}

/// Where the store streams the database half of the ground truth, one row
/// at a time: payments first, then the outbox, then the effects.
pub trait TruthSink: Send {
    fn payment(&mut self, row: PaymentRow);
    fn event(&mut self, row: OutboxRecord);
    fn inbox_row(&mut self, message: Uuid, handler: &str);
    fn receipt(&mut self, payment: Uuid, message: Uuid);
    fn projection(&mut self, payment: Uuid, captured: bool, event: Option<Uuid>);
    fn dead_letter(&mut self, message_id: &str);
    fn loyalty(&mut self, account: i32, points: i64);
    fn credit(&mut self, event: Uuid, account: i32, points: i64);
}
