//! Storage: every SQL statement of the pipeline and the verifier, behind one
//! interface with a backend per database.
//!
//! - [`postgres`]: PostgreSQL, one schema per run (`migrations/postgres/`).
//! - [`sqlite`]: SQLite, one file per run, for the embedded mode
//!   (`migrations/sqlite/`).
//!
//! What a notifier batch writes is decided once ([`effects`]); the backends
//! only differ in how they say it in SQL.

pub mod declared;
pub(crate) mod effects;
pub mod postgres;
pub mod sqlite;
pub(crate) mod text;
pub(crate) mod truth;

use crate::domain::events::{Decoded, EventKind};
pub use crate::domain::handlers::{Handler, HANDLERS, HANDLER_LOYALTY, HANDLER_PROJECTION, HANDLER_RECEIPTS};
use crate::domain::rows::TruthSink;
use crate::error::{Error, Result};
use crate::faults::{FaultInjector, FaultPoint};
use crate::scenario::{InboxMode, ProjectionMode};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;
use uuid::Uuid;

/// Retention deletes at most this many rows per statement, so one purge never
/// holds long locks.
pub const PURGE_CHUNK: i64 = 10_000;

/// Fault point `store.commit_refused` at one component's commits: each
/// commit that writes work (an authorize, a capture, a relay's mark or
/// delete, a notifier's batch) is an occurrence, and a firing rolls the
/// transaction back in place of the commit and hands the caller the error a
/// refused `COMMIT` gives. In process, on both backends: SQLite has no wire
/// for the fault proxy, and without it no transaction of the embedded mode
/// ever fails, so a caller's error path would never run.
///
/// The payment service's gate also holds `workload.slow_commit`: its
/// transaction stays open after its inserts and before its COMMIT while the
/// other producers commit, so commit order parts from insert order.
#[derive(Clone, Default)]
pub struct CommitGate(Option<Arc<Gate>>);

/// What a held commit of the payment service tells once it went on: how
/// many other commits of the producers overtook it (0: it reordered
/// nothing). The run counts these as the evidence of a reorder.
pub type OnHold = Arc<dyn Fn(u64) + Send + Sync>;

struct Gate {
    injector: Arc<FaultInjector>,
    on_hold: Option<OnHold>,
    component: String,
    refuses: bool,
    holds: bool,
    /// Commits through this gate so far: what a hold watches for the
    /// other producers' commits that overtake it.
    commits: std::sync::atomic::AtomicU64,
}

/// How long the `n`th held commit of a run is held: 50 to 500 ms, drawn
/// from `n` so that a replay holds alike.
fn hold_of(n: u64) -> Duration {
    let mut z = n.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    Duration::from_millis(50 + (z ^ (z >> 31)) % 451)
}

impl CommitGate {
    /// The gate of `component`'s commits; open (never refusing, never
    /// holding) when the scenario gives its points no rate.
    pub fn new(injector: Arc<FaultInjector>, component: &str, on_hold: Option<OnHold>) -> Self {
        let refuses = injector.probability(FaultPoint::StoreCommitRefused) > 0.0;
        let holds = component == "workload" && injector.probability(FaultPoint::WorkloadSlowCommit) > 0.0;
        let component = component.to_string();
        match refuses || holds {
            true => {
                Self(Some(Arc::new(Gate { injector, on_hold, component, refuses, holds, commits: Default::default() })))
            }
            false => Self(None),
        }
    }

    /// `workload.slow_commit`: holds the open transaction before its COMMIT.
    async fn hold(&self, what: &str) {
        let Some(g) = self.0.as_ref().filter(|g| g.holds) else { return };
        let point = FaultPoint::WorkloadSlowCommit;
        if g.injector.strike(point, &g.component, || format!("commit of {what}")) {
            use std::sync::atomic::Ordering::Relaxed;
            let before = g.commits.load(Relaxed);
            tokio::time::sleep(hold_of(g.injector.fired(point))).await;
            g.injector.confirm(point, 1);
            // Another producer's commit during the hold inserted after
            // this transaction did and became visible first: an overtake.
            if let Some(told) = &g.on_hold {
                told(g.commits.load(Relaxed) - before);
            }
        }
    }

    /// A commit through the gate went through.
    fn committed(&self) {
        if let Some(g) = self.0.as_ref().filter(|g| g.holds) {
            g.commits.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Reaches the point for the commit of `what`: true when it is refused.
    fn refuses(&self, what: &str) -> bool {
        self.0.as_ref().is_some_and(|g| {
            g.refuses && g.injector.strike(FaultPoint::StoreCommitRefused, &g.component, || format!("commit of {what}"))
        })
    }

    /// The refusal, once the rollback is done: confirmed, and the error
    /// the caller gets.
    fn refused(&self, what: &str) -> Error {
        if let Some(g) = &self.0 {
            g.injector.confirm(FaultPoint::StoreCommitRefused, 1);
        }
        Error::Database {
            context: format!("committing {what}"),
            cause: "the store refused the commit (fault point store.commit_refused); the transaction rolled back"
                .into(),
        }
    }

    /// Commits `tx`, or rolls it back and fails when the point fires.
    pub(crate) async fn commit<DB: sqlx::Database>(&self, tx: sqlx::Transaction<'_, DB>, what: &str) -> Result<()> {
        self.hold(what).await;
        if self.refuses(what) {
            tx.rollback().await.map_err(|e| Error::db(format!("rolling back {what}"), e))?;
            return Err(self.refused(what));
        }
        tx.commit().await.map_err(|e| Error::db(format!("committing {what}"), e))?;
        self.committed();
        Ok(())
    }

    /// The same for a transaction driven by hand (`BEGIN` … `COMMIT`).
    pub(crate) async fn commit_by_hand(&self, conn: &mut sqlx::PgConnection, what: &str) -> Result<()> {
        self.hold(what).await;
        if self.refuses(what) {
            sqlx::query("ROLLBACK")
                .execute(&mut *conn)
                .await
                .map_err(|e| Error::db(format!("rolling back {what}"), e))?;
            return Err(self.refused(what));
        }
        sqlx::query("COMMIT").execute(conn).await.map_err(|e| Error::db(format!("committing {what}"), e))?;
        self.committed();
        Ok(())
    }
}

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
    pub position: crate::broker::Position,
    /// The dedup key: the producer's event id, from the header.
    pub decoded: std::result::Result<Decoded, String>,
    /// Raw header value and payload, kept only when `decoded` is an error:
    /// the dead-letter row records them.
    pub raw_event_id: Option<String>,
    pub raw_payload: String,
}

/// What one notifier transaction did.
#[derive(Debug, Default, Clone)]
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
    /// It crashed after calling the email provider, before the commit
    /// (`notifier.after_external_call`), not before the effects.
    pub crashed_after_call: bool,
    /// Emails to send once the batch is done (`notifier.email =
    /// "after-commit"`, the mistake): idempotency key and body.
    pub emails_after_commit: Vec<(Option<String>, crate::domain::events::ReceiptEmail)>,
}

/// What a database backend must provide; the compiler checks that each one
/// (PostgreSQL, SQLite) implements every operation, and [`Store`]
/// dispatches to it. Statements that differ only in dialect are written
/// once, in [`truth`].
#[allow(async_fn_in_trait)] // called through the enums below, on concrete types whose futures are Send
pub trait Backend {
    /// A notifier transaction: dropping it without `commit` rolls it back.
    type Tx: NotifierTx;
    /// A relay's own handle on the database.
    type RelayConn: RelayConnOps;
    async fn close(&self);
    async fn relay_connection(&self) -> Result<Self::RelayConn>;
    /// Transaction 1 of a group of payments: the payment rows and, with
    /// `outbox`, their `authorized` events.
    async fn authorize(&self, ps: &[NewPayment], outbox: bool) -> Result<()>;
    /// Transaction 2: mark captured and, with `outbox`, write `captured`
    /// (plus, when the poison fault fired, a malformed event beside it).
    async fn capture(&self, ps: &[(NewPayment, bool)], outbox: bool) -> Result<()>;
    async fn begin(&self) -> Result<Self::Tx>;
    /// The check of the check-then-act variant, outside any transaction.
    async fn unkeyed_seen(&self, pairs: &[(Uuid, &'static str)]) -> Result<HashSet<(Uuid, &'static str)>>;
    /// The act's bookkeeping of the check-then-act variant.
    async fn unkeyed_record(&self, pairs: &[(Uuid, &'static str)]) -> Result<()>;
    /// Deletes published outbox rows and inbox rows older than their
    /// retention, in chunks of [`PURGE_CHUNK`]. Returns (outbox, inbox) rows.
    async fn purge(&self, outbox_older: Duration, inbox_older: Duration) -> Result<(u64, u64)>;
    /// Streams the database half of the ground truth into the ledger.
    async fn ground_truth(&self, sink: &mut dyn TruthSink) -> Result<()>;
    /// Each event's end-to-end latency in milliseconds (outbox created →
    /// inbox processed), one sample at a time.
    async fn latencies(&self, sample: &mut (dyn FnMut(i64) + Send)) -> Result<()>;
    /// Outbox rows no relay has published yet (the drain waits for zero).
    async fn unpublished(&self) -> Result<i64>;
    /// How many of these payments exist (`captured`: and are captured): the
    /// payment service's look-up by idempotency key after a write whose
    /// outcome it cannot know.
    async fn landed(&self, ids: &[Uuid], captured: bool) -> Result<usize>;
    /// The last time the database recorded for each of these payments or
    /// events, in milliseconds since the epoch.
    async fn traces(&self, ids: &[Uuid]) -> Result<std::collections::HashMap<Uuid, i64>>;
    /// The dated rows of these payments' stories: the payment, its outbox
    /// rows, inbox claims and effects ([`crate::verifier::story`]).
    async fn story(&self, payments: &[Uuid]) -> Result<Vec<StoryRow>>;
}

/// A notifier transaction's statements.
#[allow(async_fn_in_trait)]
pub trait NotifierTx {
    /// Records malformed messages, once each. Returns the rows written.
    async fn dead_letters(&mut self, bad: &[&Incoming]) -> Result<u64>;
    /// The inbox claim; returns the pairs this transaction newly claimed.
    async fn claim(&mut self, pairs: &[(Uuid, &'static str)]) -> Result<HashSet<(Uuid, &'static str)>>;
    /// Applies a batch's effects; returns the projection events refused.
    async fn apply(&mut self, plan: &EffectPlan<'_>, projection: ProjectionMode) -> Result<u64>;
}

/// A relay's statements.
#[allow(async_fn_in_trait)]
pub trait RelayConnOps {
    /// Claims up to `n` unpublished rows past `seq` `after` (0 for every
    /// one) that no other relay holds.
    async fn claim(&mut self, n: usize, after: i64) -> Result<Vec<OutboxRow>>;
    /// Marks the claimed rows published and commits the claim.
    async fn mark_published(&mut self, ids: &[Uuid]) -> Result<()>;
    /// Deletes the claimed rows and commits the claim (a mistake's path).
    async fn delete_claimed(&mut self, ids: &[Uuid]) -> Result<()>;
    /// Gives the rows back after a produce error.
    async fn release(&mut self) -> Result<()>;
    /// The crash: drop the connection with its claim open, no cleanup.
    fn crash(self);
}

/// A run's database, whichever backend it is.
// One per run, cloned into each component and task: its 400 bytes are
// copied a few dozen times a run, never per message, so no Box.
#[allow(clippy::large_enum_variant)]
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
    /// How each receipt's email goes out, if at all.
    pub email: crate::scenario::EmailMode,
}

/// What the fault injector decided for one batch.
#[derive(Debug, Clone, Copy, Default)]
pub struct BatchFaults {
    /// Crash after the inbox claim and before the effects.
    pub crash_mid_batch: bool,
    /// Stall this long while holding the batch.
    pub stall: Option<Duration>,
}

/// An open notifier transaction, whichever backend it is, and its
/// store's commit gate. Dropping it without `commit` rolls it back.
pub struct Tx {
    inner: TxOf,
    gate: CommitGate,
}

enum TxOf {
    Postgres(postgres::PgTx),
    Sqlite(sqlite::SqliteTx),
}

impl Tx {
    pub(crate) async fn dead_letters(&mut self, bad: &[&Incoming]) -> Result<u64> {
        match &mut self.inner {
            TxOf::Postgres(t) => NotifierTx::dead_letters(t, bad).await,
            TxOf::Sqlite(t) => NotifierTx::dead_letters(t, bad).await,
        }
    }

    pub(crate) async fn claim(&mut self, pairs: &[(Uuid, &'static str)]) -> Result<HashSet<(Uuid, &'static str)>> {
        match &mut self.inner {
            TxOf::Postgres(t) => NotifierTx::claim(t, pairs).await,
            TxOf::Sqlite(t) => NotifierTx::claim(t, pairs).await,
        }
    }

    pub(crate) async fn apply(&mut self, plan: &EffectPlan<'_>, projection: ProjectionMode) -> Result<u64> {
        match &mut self.inner {
            TxOf::Postgres(t) => NotifierTx::apply(t, plan, projection).await,
            TxOf::Sqlite(t) => NotifierTx::apply(t, plan, projection).await,
        }
    }

    /// Commits the batch, unless `store.commit_refused` refuses it.
    pub(crate) async fn commit(self) -> Result<()> {
        const WHAT: &str = "a notifier batch";
        match self.inner {
            TxOf::Postgres(t) => self.gate.commit(t, WHAT).await,
            TxOf::Sqlite(t) => t.commit_through(&self.gate, WHAT).await,
        }
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
    /// The same database through a new pool of `n` connections, for the
    /// harness's reads once the faults have stopped: after the nemesis
    /// restarted PostgreSQL or ended sessions, the old pool's idle
    /// connections are dead, and no read may meet one. SQLite's, or a pool
    /// that cannot be made (the read will say why), stay as they are.
    pub async fn renewed(&self, n: u32) -> Store {
        match self {
            Store::Postgres(pg) => Store::Postgres(pg.fresh(n).await.unwrap_or_else(|_| pg.clone())),
            sqlite => sqlite.clone(),
        }
    }

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

    pub(crate) async fn begin(&self) -> Result<Tx> {
        let inner = match self {
            Store::Postgres(s) => s.begin().await.map(TxOf::Postgres)?,
            Store::Sqlite(s) => s.begin().await.map(TxOf::Sqlite)?,
        };
        Ok(Tx { inner, gate: self.gate().clone() })
    }

    /// The same store with its commits behind `gate`: what a reference
    /// component is handed when `store.commit_refused` has a rate.
    pub fn gated(&self, gate: CommitGate) -> Store {
        let mut s = self.clone();
        match &mut s {
            Store::Postgres(p) => p.gate = gate,
            Store::Sqlite(q) => q.gate = gate,
        }
        s
    }

    fn gate(&self) -> &CommitGate {
        each!(self, s => &s.gate)
    }

    pub(crate) async fn unkeyed_seen(&self, pairs: &[(Uuid, &'static str)]) -> Result<HashSet<(Uuid, &'static str)>> {
        each!(self, s => s.unkeyed_seen(pairs).await)
    }

    pub(crate) async fn unkeyed_record(&self, pairs: &[(Uuid, &'static str)]) -> Result<()> {
        each!(self, s => s.unkeyed_record(pairs).await)
    }

    pub async fn unpublished(&self) -> Result<i64> {
        each!(self, s => s.unpublished().await)
    }

    /// How many of these payments exist (`captured`: and are captured).
    pub async fn landed(&self, ids: &[Uuid], captured: bool) -> Result<usize> {
        each!(self, s => s.landed(ids, captured).await)
    }

    /// Deletes published outbox rows and inbox rows older than their
    /// retention, in chunks of [`PURGE_CHUNK`]. Returns (outbox, inbox) rows.
    pub async fn purge(&self, outbox_older: Duration, inbox_older: Duration) -> Result<(u64, u64)> {
        each!(self, s => s.purge(outbox_older, inbox_older).await)
    }

    /// Streams the database half of the ground truth into `sink` (the
    /// verifier's ledger), row by row.
    pub async fn ground_truth(&self, sink: &mut dyn TruthSink) -> Result<()> {
        each!(self, s => s.ground_truth(sink).await)
    }

    /// Streams each event's end-to-end latency, in milliseconds.
    pub async fn latencies(&self, sample: &mut (dyn FnMut(i64) + Send)) -> Result<()> {
        each!(self, s => s.latencies(sample).await)
    }

    /// The last time the database recorded for each of these payments or
    /// events (epoch milliseconds): what dates an anomaly's example.
    pub async fn traces(&self, ids: &[Uuid]) -> Result<std::collections::HashMap<Uuid, i64>> {
        each!(self, s => s.traces(ids).await)
    }

    /// The dated rows of these payments' stories, for the HTML report.
    pub async fn story(&self, payments: &[Uuid]) -> Result<Vec<StoryRow>> {
        each!(self, s => s.story(payments).await)
    }
}

impl RelayConn {
    /// Opens a transaction and claims up to `n` unpublished rows that no
    /// other relay holds.
    pub async fn claim(&mut self, n: usize, after: i64) -> Result<Vec<OutboxRow>> {
        match self {
            RelayConn::Postgres(c) => RelayConnOps::claim(c, n, after).await,
            RelayConn::Sqlite(c) => RelayConnOps::claim(c, n, after).await,
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
            RelayConn::Postgres(c) => RelayConnOps::mark_published(c, ids).await,
            RelayConn::Sqlite(c) => RelayConnOps::mark_published(c, ids).await,
        }
    }

    /// Deletes the claimed rows and commits the claim (the
    /// delete-then-publish mistake: the rows are gone before the broker has them).
    pub async fn delete_claimed(&mut self, ids: &[Uuid]) -> Result<()> {
        match self {
            RelayConn::Postgres(c) => RelayConnOps::delete_claimed(c, ids).await,
            RelayConn::Sqlite(c) => RelayConnOps::delete_claimed(c, ids).await,
        }
    }

    /// Gives the rows back after a produce error (a controlled failure).
    pub async fn release(&mut self) -> Result<()> {
        match self {
            RelayConn::Postgres(c) => RelayConnOps::release(c).await,
            RelayConn::Sqlite(c) => RelayConnOps::release(c).await,
        }
    }

    /// The crash: drop the connection with its transaction open. No
    /// ROLLBACK is sent; the database rolls back when it sees the close.
    pub fn crash(self) {
        match self {
            RelayConn::Postgres(c) => RelayConnOps::crash(c),
            RelayConn::Sqlite(c) => RelayConnOps::crash(c),
        }
    }
}

pub use effects::{final_statuses, refused_by_guard, EffectPlan};

/// The `captured` outbox events of a capture transaction: each payment's
/// event, then its malformed twin when the poison fault fired, in payment
/// order (the outbox `seq` keeps that order).
pub fn captured_events(ps: &[(NewPayment, bool)]) -> Vec<(&NewPayment, EventKind, Option<serde_json::Value>)> {
    let mut events = Vec::with_capacity(ps.len());
    for (p, poison) in ps {
        events.push((p, EventKind::Captured, None));
        if *poison {
            events.push((p, EventKind::Captured, Some(crate::domain::events::poison_payload())));
        }
    }
    events
}

/// The payments a capture's UPDATE moved from authorized to captured:
/// only they get a `captured` event. A capture written again after its
/// first commit landed (its outcome unknown to the payment service)
/// changes no row and so writes no second event.
pub fn newly_captured(ps: &[(NewPayment, bool)], changed: &HashSet<Uuid>) -> Vec<(NewPayment, bool)> {
    ps.iter().filter(|(p, _)| changed.contains(&p.id)).cloned().collect()
}

/// The key a dead letter is recorded under: the event id when readable,
/// else the message's place on the topic.
pub fn dead_letter_key(m: &Incoming) -> String {
    let (lane, place) = m.position.as_row();
    m.raw_event_id.clone().unwrap_or_else(|| format!("p{lane}-o{place}"))
}

pub use crate::domain::rows::{OutboxRecord, PaymentRow, StoryRow};
