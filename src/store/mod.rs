//! Storage: every SQL statement of the pipeline and the verifier, behind one
//! interface with a backend per database.
//!
//! - [`postgres`]: PostgreSQL, one schema per run (`migrations/postgres/`).
//! - [`sqlite`]: SQLite, one file per run, for the embedded mode
//!   (`migrations/sqlite/`).
//!
//! What a notifier batch does is decided once, here ([`plan_effects`]); the
//! backends only differ in how they say it in SQL.

pub mod postgres;
pub mod sqlite;
pub mod truth;

use crate::error::Result;
use crate::events::{Decoded, EventKind};
use crate::scenario::{InboxMode, ProjectionMode};
use std::collections::{BTreeMap, HashSet};
use std::time::Duration;
use uuid::Uuid;

choices! {
    /// The handlers of the notifier, each with its own inbox claim.
    Handler {
        /// The payment's status in the read model.
        Projection = "projection",
        /// One receipt per captured payment.
        Receipts = "receipts",
        /// Loyalty points += amount per captured payment.
        Loyalty = "loyalty",
    }
}

impl Handler {
    /// One bit per handler, for compact sets of them.
    pub fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

/// The handlers' names as the inbox table stores them.
pub const HANDLER_PROJECTION: &str = "projection";
pub const HANDLER_RECEIPTS: &str = "receipts";
pub const HANDLER_LOYALTY: &str = "loyalty";
pub const HANDLERS: [&str; 3] = [HANDLER_PROJECTION, HANDLER_RECEIPTS, HANDLER_LOYALTY];

/// Which handlers act on an event type.
pub fn handlers_for(kind: EventKind) -> &'static [Handler] {
    match kind {
        EventKind::Authorized => &[Handler::Projection],
        EventKind::Captured => &[Handler::Projection, Handler::Receipts, Handler::Loyalty],
    }
}

/// Retention deletes at most this many rows per statement, so one purge never
/// holds long locks.
pub const PURGE_CHUNK: i64 = 10_000;

/// One payment as the workload writes it.
#[derive(Debug, Clone)]
pub struct NewPayment {
    pub id: Uuid,
    pub account_id: i32,
    pub amount_cents: i64,
}

/// An unpublished outbox row, claimed by a relay.
#[derive(Debug, Clone)]
pub struct OutboxRow {
    pub id: Uuid,
    pub seq: i64,
    pub aggregate_id: Uuid,
    pub event_type: String,
    pub payload: Vec<u8>,
}

/// A message as the notifier received it, already decoded (or not).
#[derive(Debug, Clone)]
pub struct Incoming {
    pub partition: i32,
    pub offset: i64,
    /// The dedup key: the producer's event id, from the header.
    pub decoded: std::result::Result<Decoded, String>,
    /// Raw header value and payload, kept only when `decoded` is an error:
    /// the dead-letter row records them.
    pub raw_event_id: Option<String>,
    pub raw_payload: String,
}

/// What one notifier transaction did.
#[derive(Debug, Default, Clone, Copy)]
pub struct BatchOutcome {
    /// Events whose effects were applied (newly claimed, or every event with
    /// the inbox off).
    pub applied: u64,
    /// Events the inbox recognised as already processed.
    pub duplicates: u64,
    /// Events the state-based projection refused (stale or repeated).
    pub stale: u64,
    pub dead_lettered: u64,
    /// The batch's fault crashed the notifier part way.
    pub crashed: bool,
}

/// A run's database, whichever backend it is.
#[derive(Clone)]
pub enum Store {
    Postgres(postgres::PgStore),
    Sqlite(sqlite::SqliteStore),
}

/// A relay's own connection, whichever backend it is.
pub enum RelayConn {
    Postgres(postgres::PgRelayConn),
    Sqlite(sqlite::SqliteRelayConn),
}

/// The notifier's choices that shape a batch.
#[derive(Debug, Clone, Copy)]
pub struct Modes {
    pub inbox: InboxMode,
    pub projection: ProjectionMode,
}

/// What the fault injector decided for one batch.
#[derive(Debug, Clone, Copy, Default)]
pub struct BatchFaults {
    /// Crash after the inbox claim and before the effects.
    pub crash_mid_batch: bool,
    /// Stall this long while holding the batch.
    pub stall: Option<Duration>,
}

/// An open notifier transaction, whichever backend it is. Dropping it
/// without `commit` rolls it back.
pub enum Tx {
    Postgres(postgres::PgTx),
    Sqlite(sqlite::SqliteTx),
}

impl Tx {
    async fn dead_letters(&mut self, bad: &[&Incoming]) -> Result<u64> {
        match self {
            Tx::Postgres(t) => postgres::dead_letters(t, bad).await,
            Tx::Sqlite(t) => sqlite::dead_letters(t, bad).await,
        }
    }

    async fn claim(&mut self, pairs: &[(Uuid, &'static str)]) -> Result<HashSet<(Uuid, &'static str)>> {
        match self {
            Tx::Postgres(t) => postgres::claim(t, pairs).await,
            Tx::Sqlite(t) => sqlite::claim(t, pairs).await,
        }
    }

    async fn apply(&mut self, plan: &EffectPlan<'_>, projection: ProjectionMode) -> Result<u64> {
        match self {
            Tx::Postgres(t) => postgres::apply(t, plan, projection).await,
            Tx::Sqlite(t) => sqlite::apply(t, plan, projection).await,
        }
    }

    async fn commit(self) -> Result<()> {
        match self {
            Tx::Postgres(t) => t.commit().await,
            Tx::Sqlite(t) => t.commit().await,
        }
        .map_err(|e| crate::Error::db("committing a notifier batch", e))
    }
}

macro_rules! each {
    ($self:expr, $s:ident => $e:expr) => {
        match $self {
            Store::Postgres($s) => $e,
            Store::Sqlite($s) => $e,
        }
    };
}

impl Store {
    /// Which backend, for the report ("postgresql" or "sqlite").
    pub fn backend(&self) -> &'static str {
        match self {
            Store::Postgres(_) => "postgresql",
            Store::Sqlite(_) => "sqlite",
        }
    }

    /// Where the data lives: `host:port/database` or the SQLite file.
    pub fn endpoint(&self) -> String {
        each!(self, s => s.endpoint.clone())
    }

    pub async fn close(&self) {
        each!(self, s => s.close().await)
    }

    pub async fn relay_connection(&self) -> Result<RelayConn> {
        match self {
            Store::Postgres(s) => s.relay_connection().await.map(RelayConn::Postgres),
            Store::Sqlite(s) => s.relay_connection().await.map(RelayConn::Sqlite),
        }
    }

    /// Transaction 1 of a group of payments (one, unless the workload batches):
    /// the payment rows and, with `outbox`, their `authorized` events.
    pub async fn authorize(&self, ps: &[NewPayment], outbox: bool) -> Result<()> {
        each!(self, s => s.authorize(ps, outbox).await)
    }

    /// Transaction 2: mark captured and, with `outbox`, write `captured`
    /// (plus, when the poison fault fired, a malformed event beside it).
    pub async fn capture(&self, ps: &[(NewPayment, bool)], outbox: bool) -> Result<()> {
        each!(self, s => s.capture(ps, outbox).await)
    }

    /// One notifier micro-batch: inbox claims, effects for what was claimed,
    /// dead letters, in the shape the notifier's inbox mode prescribes (the
    /// correct one: a single transaction). The caller commits offsets only
    /// after this returns Ok and not crashed, except in the
    /// commit-offset-first variant, which commits them before.
    ///
    /// `faults` says what the fault injector decided for this batch: crash
    /// between the inbox claim and the effects, or stall while holding it.
    pub async fn apply_batch(&self, batch: &[Incoming], modes: Modes, faults: BatchFaults) -> Result<BatchOutcome> {
        let mut out = BatchOutcome::default();
        let bad: Vec<&Incoming> = batch.iter().filter(|m| m.decoded.is_err()).collect();
        let mut events: Vec<Decoded> = batch.iter().filter_map(|m| m.decoded.as_ref().ok().cloned()).collect();
        if modes.inbox == InboxMode::ConsumerMadeId {
            // The mistake: a dedup key made up on receipt, so a redelivered
            // message looks new every time.
            for e in &mut events {
                e.event_id = Uuid::new_v4();
            }
        }
        let refs: Vec<&Decoded> = events.iter().collect();
        let pairs = match modes.inbox {
            // The mistake: one claim per message, whatever the handlers. The
            // first handler's claim is the only one; the others find the
            // message taken and skip it.
            InboxMode::MessageIdOnly => refs.iter().map(|e| (e.event_id, HANDLER_PROJECTION)).collect(),
            _ => claims(&refs),
        };
        let stall = |d: Option<Duration>| async move {
            if let Some(d) = d {
                tokio::time::sleep(d).await;
            }
        };
        match modes.inbox {
            InboxMode::On
            | InboxMode::CommitOffsetFirst
            | InboxMode::ConsumerMadeId
            | InboxMode::MessageIdOnly
            | InboxMode::Off => {
                let mut tx = self.begin().await?;
                out.dead_lettered = tx.dead_letters(&bad).await?;
                let claimed = if modes.inbox == InboxMode::Off { HashSet::new() } else { tx.claim(&pairs).await? };
                if faults.crash_mid_batch {
                    // The process dies with its transaction open: nothing commits.
                    drop(tx);
                    out.crashed = true;
                    return Ok(out);
                }
                stall(faults.stall).await;
                let plan = plan_effects(&refs, modes.inbox, &claimed);
                out.stale = tx.apply(&plan, modes.projection).await?;
                tx.commit().await?;
                (out.applied, out.duplicates) = (plan.applied, plan.duplicates);
            }
            InboxMode::SeparateTransactions => {
                let mut tx = self.begin().await?;
                out.dead_lettered = tx.dead_letters(&bad).await?;
                let claimed = tx.claim(&pairs).await?;
                tx.commit().await?;
                if faults.crash_mid_batch {
                    // The inbox says "processed"; the effects never happen.
                    out.crashed = true;
                    return Ok(out);
                }
                stall(faults.stall).await;
                self.apply_alone(&refs, modes, &claimed, &[], &mut out).await?;
            }
            InboxMode::CheckThenAct => {
                let seen = self.unkeyed_seen(&pairs).await?;
                let claimed: HashSet<(Uuid, &str)> = pairs.iter().copied().filter(|p| !seen.contains(p)).collect();
                if faults.crash_mid_batch {
                    out.crashed = true;
                    return Ok(out);
                }
                // A stall here, between the check and the act, is what lets
                // a second notifier see "absent" too.
                stall(faults.stall).await;
                self.apply_alone(&refs, modes, &claimed, &bad, &mut out).await?;
                let acted: Vec<(Uuid, &'static str)> = pairs.iter().copied().filter(|p| claimed.contains(p)).collect();
                self.unkeyed_record(&acted).await?;
            }
        }
        Ok(out)
    }

    /// The effects in a transaction of their own, for the variants that
    /// split them from the inbox claim.
    async fn apply_alone(
        &self,
        events: &[&Decoded],
        modes: Modes,
        claimed: &HashSet<(Uuid, &str)>,
        bad: &[&Incoming],
        out: &mut BatchOutcome,
    ) -> Result<()> {
        let plan = plan_effects(events, modes.inbox, claimed);
        let mut tx = self.begin().await?;
        out.dead_lettered += tx.dead_letters(bad).await?;
        out.stale = tx.apply(&plan, modes.projection).await?;
        tx.commit().await?;
        (out.applied, out.duplicates) = (plan.applied, plan.duplicates);
        Ok(())
    }

    async fn begin(&self) -> Result<Tx> {
        match self {
            Store::Postgres(s) => s.begin().await.map(Tx::Postgres),
            Store::Sqlite(s) => s.begin_tx().await.map(Tx::Sqlite),
        }
    }

    async fn unkeyed_seen(&self, pairs: &[(Uuid, &'static str)]) -> Result<HashSet<(Uuid, &'static str)>> {
        each!(self, s => s.unkeyed_seen(pairs).await)
    }

    async fn unkeyed_record(&self, pairs: &[(Uuid, &'static str)]) -> Result<()> {
        each!(self, s => s.unkeyed_record(pairs).await)
    }

    pub async fn unpublished(&self) -> Result<i64> {
        match self {
            Store::Postgres(s) => truth::unpublished(s.pool()).await,
            Store::Sqlite(s) => truth::unpublished(s.pool()).await,
        }
    }

    /// Deletes published outbox rows and inbox rows older than their
    /// retention, in chunks of [`PURGE_CHUNK`]. Returns (outbox, inbox) rows.
    pub async fn purge(&self, outbox_older: Duration, inbox_older: Duration) -> Result<(u64, u64)> {
        each!(self, s => s.purge(outbox_older, inbox_older).await)
    }

    /// Streams the database half of the ground truth into the ledger.
    pub async fn ground_truth(&self, ledger: &mut crate::verifier::Ledger) -> Result<()> {
        each!(self, s => s.ground_truth(ledger).await)
    }

    /// End-to-end latency per event (outbox created → inbox processed).
    pub async fn latency(&self) -> Result<Option<crate::report::Latency>> {
        each!(self, s => s.latency().await)
    }
}

impl RelayConn {
    /// Opens a transaction and claims up to `n` unpublished rows that no
    /// other relay holds.
    pub async fn claim(&mut self, n: usize) -> Result<Vec<OutboxRow>> {
        match self {
            RelayConn::Postgres(c) => c.claim(n).await,
            RelayConn::Sqlite(c) => c.claim(n).await,
        }
    }

    /// Ends a claim that found no rows (on PostgreSQL it commits the claim's
    /// transaction; on SQLite a claim holds no transaction).
    pub async fn end_claim(&mut self) -> Result<()> {
        self.mark_published(&[]).await
    }

    /// Marks the claimed rows published and commits the claim.
    pub async fn mark_published(&mut self, ids: &[Uuid]) -> Result<()> {
        match self {
            RelayConn::Postgres(c) => c.mark_published(ids).await,
            RelayConn::Sqlite(c) => c.mark_published(ids).await,
        }
    }

    /// Deletes the claimed rows and commits the claim (the
    /// delete-then-publish mistake: the rows are gone before the broker has them).
    pub async fn delete_claimed(&mut self, ids: &[Uuid]) -> Result<()> {
        match self {
            RelayConn::Postgres(c) => c.delete_claimed(ids).await,
            RelayConn::Sqlite(c) => c.delete_claimed(ids).await,
        }
    }

    /// Gives the rows back after a produce error (a controlled failure).
    pub async fn release(&mut self) -> Result<()> {
        match self {
            RelayConn::Postgres(c) => c.release().await,
            RelayConn::Sqlite(c) => c.release().await,
        }
    }

    /// The crash: drop the connection with its transaction open. No
    /// ROLLBACK is sent; the database rolls back when it sees the close.
    pub fn crash(self) {
        match self {
            RelayConn::Postgres(c) => c.crash(),
            RelayConn::Sqlite(c) => c.crash(),
        }
    }
}

/// The (event, handler) pairs a batch must claim in the inbox.
pub fn claims(events: &[&Decoded]) -> Vec<(Uuid, &'static str)> {
    events.iter().flat_map(|e| handlers_for(e.kind).iter().map(move |h| (e.event_id, h.as_str()))).collect()
}

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

/// Decides which effects a batch applies. With the inbox on, only the pairs
/// this transaction newly claimed, each once. With it off, everything, as
/// often as it arrived: that is the bug being demonstrated.
pub fn plan_effects<'a>(events: &[&'a Decoded], mode: InboxMode, claimed: &HashSet<(Uuid, &str)>) -> EffectPlan<'a> {
    let mut plan = EffectPlan::default();
    let mut applied_once: HashSet<(Uuid, &str)> = HashSet::new();
    let mut may_apply = |id: Uuid, h: &'static str| -> bool {
        match mode {
            InboxMode::Off => true,
            _ => claimed.contains(&(id, h)) && applied_once.insert((id, h)),
        }
    };
    for e in events {
        let mut any = false;
        if may_apply(e.event_id, HANDLER_PROJECTION) {
            any = true;
            plan.projection.push(e);
        }
        if e.kind == EventKind::Captured {
            if may_apply(e.event_id, HANDLER_RECEIPTS) {
                any = true;
                plan.receipts.push((e.body.payment_id, e.event_id));
            }
            if may_apply(e.event_id, HANDLER_LOYALTY) {
                any = true;
                *plan.loyalty.entry((e.body.account_id, e.partition)).or_default() += e.body.amount_cents;
                plan.credits.push((e.event_id, e.body.account_id, e.body.amount_cents));
            }
        }
        if any {
            plan.applied += 1;
        } else {
            plan.duplicates += 1;
        }
    }
    plan
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

/// The `captured` outbox events of a capture transaction: each payment's
/// event, then its malformed twin when the poison fault fired, in payment
/// order (the outbox `seq` keeps that order).
pub fn captured_events(ps: &[(NewPayment, bool)]) -> Vec<(&NewPayment, EventKind, Option<serde_json::Value>)> {
    let mut events = Vec::with_capacity(ps.len());
    for (p, poison) in ps {
        events.push((p, EventKind::Captured, None));
        if *poison {
            events.push((p, EventKind::Captured, Some(crate::events::poison_payload())));
        }
    }
    events
}

/// The key a dead letter is recorded under: the event id when readable,
/// else the message's place on the topic.
pub fn dead_letter_key(m: &Incoming) -> String {
    m.raw_event_id.clone().unwrap_or_else(|| format!("p{}-o{}", m.partition, m.offset))
}

pub use crate::verifier::ledger::{OutboxRecord, PaymentRow};
