//! The SQLite backend of the embedded mode: one file per run, WAL mode, a
//! busy timeout. Same statements as the PostgreSQL backend where SQLite
//! allows; where PostgreSQL binds arrays, SQLite gets multi-row `VALUES`
//! lists (chunked under its bound-parameter limit). SQLite runs in process,
//! but sqlx hands every statement to a worker thread and back: a statement
//! per row cost two context switches per row, which was most of the embedded
//! mode's CPU.
//!
//! SQLite has one writer at a time. Writers here take turns in process
//! ([`SqliteStore::writer`], a FIFO lock) before `BEGIN IMMEDIATE`, instead
//! of polling the file lock in SQLite's busy handler, which sleeps in growing
//! steps (up to 100 ms) and leaves the lock idle while everyone sleeps. The
//! busy timeout stays as the backstop (e.g. a rolled-back transaction whose
//! ROLLBACK has not reached its connection yet).
//!
//! SQLite has no `SKIP LOCKED`, so a relay claims rows with a lease: one short
//! `BEGIN IMMEDIATE` transaction stamps a batch of unleased (or expired)
//! unpublished rows with the relay's id and a deadline, and commits. Two
//! relays never hold the same rows, relays publish concurrently (as they do
//! on PostgreSQL), and a crashed relay's rows come back when its lease
//! expires ([`LEASE`]), with no cleanup by anyone. Holding SQLite's single
//! write lock across the publish instead would serialise every writer behind
//! the broker.

use super::{dead_letter_key, EffectPlan, Incoming, NewPayment, OutboxRow, HANDLERS, PURGE_CHUNK};
use crate::domain::events::{EventKind, PaymentEvent};
use crate::error::{Error, Result};
use crate::scenario::ProjectionMode;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{ConnectOptions, Row};
use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{watch, Mutex, OwnedMutexGuard};
use uuid::Uuid;

/// How long a relay's claim on outbox rows lasts. Longer than a claim is
/// legitimately held: a publish takes milliseconds, `relay.slow_produce`
/// holds it 300 ms, the mark may queue for its writer turn. A lease that runs
/// out early costs a duplicate on the topic, never a loss (the mark does not
/// check the owner). It is also how long a crashed relay's rows wait: at 2 s
/// the last relay crash of a run left its batch unpublished for 2 s after
/// the workload ended (measured: the last publish came 2.0 to 3.3 s after
/// the last write in the 100,000-payment bench), all of it on the clock.
pub const LEASE: Duration = Duration::from_secs(1);

/// "Now" in milliseconds since the epoch, as the migrations store times.
const NOW_MS: &str = "CAST(unixepoch('subsec') * 1000 AS INTEGER)";

/// SQLite's bound-parameter limit (SQLITE_MAX_VARIABLE_NUMBER since 3.32);
/// multi-row statements are cut into chunks that stay under it.
const MAX_PARAMS: usize = 32_766;

/// `(?, ?), (?, ?), …`: `rows` tuples of `cols` placeholders.
fn values(rows: usize, cols: usize) -> String {
    repeat(rows, &format!("({})", list(cols)))
}

/// `tuple, tuple, …`, `rows` times.
fn repeat(rows: usize, tuple: &str) -> String {
    vec![tuple; rows].join(", ")
}

/// `?, ?, …`: `n` placeholders, for `IN (…)`.
fn list(n: usize) -> String {
    vec!["?"; n].join(", ")
}

/// How many rows of `cols` parameters fit in one statement.
fn chunk_rows(cols: usize) -> usize {
    MAX_PARAMS / cols
}

/// The WAL size (in pages) at which a committing transaction checkpoints
/// itself, should the background checkpointer fall behind.
const WAL_BACKSTOP_PAGES: u32 = 16_384;

/// How often the background checkpointer copies the WAL into the database.
const CHECKPOINT_EVERY: Duration = Duration::from_millis(100);

/// Copies committed WAL frames into the database file, off the writers'
/// path: a PASSIVE checkpoint takes no write lock, so writers go on
/// appending while it copies and fsyncs. With the WAL fully copied, the next
/// writer starts it over from the beginning, so it stays small.
async fn checkpointer(mut conn: SqliteConnection, mut stopped: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            _ = stopped.changed() => break,
            _ = tokio::time::sleep(CHECKPOINT_EVERY) => {}
        }
        if let Err(e) = sqlx::query("PRAGMA wal_checkpoint(PASSIVE)").execute(&mut conn).await {
            tracing::debug!(cause = %e, "background checkpoint failed");
        }
    }
    let _ = sqlx::Connection::close(conn).await;
}

/// How long a writer waits for its turn before giving up with an error: as
/// long as SQLite's own busy timeout, so a stuck writer makes the run fail
/// loudly instead of hanging it.
const WRITER_TURN_WAIT: Duration = Duration::from_secs(30);

/// Waits for the writer turn, bounded by [`WRITER_TURN_WAIT`].
async fn turn(writer: &Writer, what: &str) -> Result<OwnedMutexGuard<()>> {
    tokio::time::timeout(WRITER_TURN_WAIT, writer.clone().lock_owned()).await.map_err(|_| Error::Database {
        context: format!("waiting for the SQLite writer turn for {what}"),
        cause: format!("no turn within {} s", WRITER_TURN_WAIT.as_secs()),
    })
}

/// The in-process writer turn; see the module docs. Held for a write
/// transaction's whole span; FIFO, so nobody starves. (Letting relays jump
/// the queue was measured too: their batches shrank to a fifth and the run
/// took more CPU.)
type Writer = Arc<Mutex<()>>;

/// A run's SQLite database.
#[derive(Clone)]
pub struct SqliteStore {
    /// Reads: the drain's counts, the verifier, the check-then-act check.
    pool: SqlitePool,
    /// Writes: one connection for every write transaction, the relays'
    /// included. Writers take turns anyway, and SQLite drops a connection's
    /// page cache whenever another connection has written, so with one
    /// writer connection the cache stays warm (checked: PRAGMA data_version
    /// on it moved once in a 100,000-payment run).
    write: SqlitePool,
    /// Every write transaction of the run (workload, relays, notifiers,
    /// purge) holds this for its whole span; FIFO, so nobody starves.
    writer: Writer,
    /// Stops the background checkpointer when the store closes.
    stop: Arc<watch::Sender<bool>>,
    /// The database file.
    pub endpoint: String,
    /// `store.commit_refused` at this component's commits.
    pub(super) gate: super::CommitGate,
}

impl SqliteStore {
    /// Creates the run's database file and applies the migrations.
    pub async fn open(path: &Path, max_connections: u32) -> Result<Self> {
        let endpoint = path.display().to_string();
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| Error::Write { path: dir.into(), cause: e.to_string() })?;
        }
        let opts = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            // The backstop behind the writer turn (see the module docs).
            .busy_timeout(Duration::from_secs(30))
            // Checkpoints run in the background ([`checkpointer`]); by
            // default the transaction that pushes the WAL past 1,000 pages
            // runs one (copy and fsync) while holding the writer turn. This
            // is only the backstop should the checkpointer fall behind.
            .pragma("wal_autocheckpoint", WAL_BACKSTOP_PAGES.to_string())
            .log_statements(tracing::log::LevelFilter::Trace);
        let write = SqlitePoolOptions::new()
            .max_connections(1)
            // In process, a ping proves nothing and costs a hand-off to the
            // connection's worker thread per transaction.
            .test_before_acquire(false)
            .acquire_timeout(Duration::from_secs(30))
            .after_connect(|conn, _| Box::pin(super::text::register(conn)))
            // A 4 MB page cache (the default is 2 MB). Measured against 16
            // and 64 MB: as fast or faster, and less CPU; with 64 MB SQLite's
            // own page-cache upkeep (pcache1TruncateUnsafe, malloc) showed
            // up at several percent of the run's CPU.
            .connect_with(opts.clone().pragma("cache_size", "-4096").statement_cache_capacity(2000))
            .await
            .map_err(|e| Error::db(format!("opening {endpoint}"), e))?;
        sqlx::migrate!("migrations/sqlite")
            .run(&write)
            .await
            .map_err(|e| Error::Database { context: format!("migrating {endpoint}"), cause: e.to_string() })?;
        let pool = SqlitePoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(Duration::from_secs(30))
            .after_connect(|conn, _| Box::pin(super::text::register(conn)))
            .connect_with(opts.clone())
            .await
            .map_err(|e| Error::db(format!("opening {endpoint}"), e))?;
        let checkpoints = opts.connect().await.map_err(|e| Error::db(format!("opening {endpoint}"), e))?;
        let (stop, stopped) = watch::channel(false);
        tokio::spawn(checkpointer(checkpoints, stopped));
        Ok(Self {
            pool,
            write,
            writer: Arc::new(Mutex::new(())),
            stop: Arc::new(stop),
            endpoint,
            gate: Default::default(),
        })
    }

    /// The read pool, for a declared system's reads ([`super::declared`]).
    pub(super) fn conn_pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// The read pool, for tests.
    #[cfg(test)]
    pub fn read_pool(&self) -> SqlitePool {
        self.pool.clone()
    }

    /// Waits for the writer turn, then begins a write transaction holding it.
    async fn begin_write(&self, what: &str) -> Result<SqliteTx> {
        let turn = turn(&self.writer, what).await?;
        // IMMEDIATE: take the write lock up front (waiting up to the busy
        // timeout) instead of failing when a read would have to upgrade.
        let tx =
            self.write.begin_with("BEGIN IMMEDIATE").await.map_err(|e| Error::db(format!("beginning {what}"), e))?;
        Ok(SqliteTx { tx, _turn: turn })
    }
}

impl super::Backend for SqliteStore {
    type Tx = SqliteTx;
    type RelayConn = SqliteRelayConn;

    async fn close(&self) {
        let _ = self.stop.send(true);
        self.write.close().await;
        self.pool.close().await;
    }

    /// A relay's handle on the database: the writer connection, in turn
    /// with every other writer. A relay holds no transaction between its
    /// calls (the lease is its claim), so it has nothing of its own to lose
    /// in a crash; and with a connection of its own every claim and mark
    /// would empty the writer connection's page cache.
    async fn relay_connection(&self) -> Result<SqliteRelayConn> {
        Ok(SqliteRelayConn::new(self.write.clone(), self.writer.clone(), self.gate.clone()))
    }

    async fn authorize(&self, ps: &[NewPayment], outbox: bool) -> Result<()> {
        let mut tx = self.begin_write("authorize").await?;
        for chunk in ps.chunks(chunk_rows(3)) {
            let sql = format!(
                "INSERT INTO payments (id, account_id, amount_cents, status) VALUES {}",
                repeat(chunk.len(), "(?, ?, ?, 'authorized')")
            );
            let mut q = sqlx::query(&sql);
            for p in chunk {
                q = q.bind(p.id).bind(p.account_id).bind(p.amount_cents);
            }
            q.execute(&mut *tx.tx).await.map_err(|e| Error::db("inserting payments", e))?;
        }
        if outbox {
            let events: Vec<_> = ps.iter().map(|p| (p, EventKind::Authorized, None)).collect();
            insert_outbox(&mut tx, &events).await?;
        }
        tx.commit_through(&self.gate, "authorize").await
    }

    async fn capture(&self, ps: &[(NewPayment, bool)], outbox: bool) -> Result<()> {
        let mut tx = self.begin_write("capture").await?;
        let mut changed = HashSet::new();
        for chunk in ps.chunks(MAX_PARAMS) {
            let sql = format!(
                "UPDATE payments SET status = 'captured', updated_at = {NOW_MS} \
                 WHERE status = 'authorized' AND id IN ({}) RETURNING id",
                list(chunk.len())
            );
            let mut q = sqlx::query_scalar::<_, Uuid>(&sql);
            for (p, _) in chunk {
                q = q.bind(p.id);
            }
            changed.extend(q.fetch_all(&mut *tx.tx).await.map_err(|e| Error::db("capturing payments", e))?);
        }
        if outbox {
            let fresh = super::newly_captured(ps, &changed);
            let events = super::captured_events(&fresh);
            insert_outbox(&mut tx, &events).await?;
        }
        tx.commit_through(&self.gate, "capture").await
    }

    async fn begin(&self) -> Result<SqliteTx> {
        self.begin_write("a notifier transaction").await
    }

    /// The check of the check-then-act variant, outside any transaction.
    async fn unkeyed_seen(&self, pairs: &[(Uuid, &'static str)]) -> Result<HashSet<(Uuid, &'static str)>> {
        let mut seen = HashSet::new();
        for (id, h) in pairs {
            let n: i64 = sqlx::query_scalar("SELECT count(*) FROM inbox_unkeyed WHERE message_id = ? AND handler = ?")
                .bind(id)
                .bind(*h)
                .fetch_one(&self.pool)
                .await
                .map_err(|e| Error::db("checking the unkeyed inbox", e))?;
            if n > 0 {
                seen.insert((*id, *h));
            }
        }
        Ok(seen)
    }

    async fn unkeyed_record(&self, pairs: &[(Uuid, &'static str)]) -> Result<()> {
        let _turn = turn(&self.writer, "the unkeyed inbox").await?;
        for (id, h) in pairs {
            sqlx::query("INSERT INTO inbox_unkeyed (message_id, handler) VALUES (?, ?)")
                .bind(id)
                .bind(*h)
                .execute(&self.write)
                .await
                .map_err(|e| Error::db("recording in the unkeyed inbox", e))?;
        }
        Ok(())
    }

    async fn purge(&self, outbox_older: Duration, inbox_older: Duration) -> Result<(u64, u64)> {
        let mut total = [0u64; 2];
        let statements = [
            format!(
                "DELETE FROM outbox WHERE rowid IN (SELECT rowid FROM outbox WHERE published_at IS NOT NULL \
                 AND published_at < {NOW_MS} - ? LIMIT ?)"
            ),
            format!(
                "DELETE FROM inbox WHERE rowid IN (SELECT rowid FROM inbox WHERE processed_at < {NOW_MS} - ? LIMIT ?)"
            ),
        ];
        for (i, (sql, older)) in statements.iter().zip([outbox_older, inbox_older]).enumerate() {
            loop {
                let _turn = turn(&self.writer, "the retention purge").await?;
                let n = sqlx::query(sql)
                    .bind(older.as_millis() as i64)
                    .bind(PURGE_CHUNK)
                    .execute(&self.write)
                    .await
                    .map_err(|e| Error::db("purging by retention", e))?
                    .rows_affected();
                total[i] += n;
                if (n as i64) < PURGE_CHUNK {
                    break;
                }
            }
        }
        Ok((total[0], total[1]))
    }

    /// Outbox created → inbox processed, per event, for the report.
    async fn latencies(&self, sample: &mut (dyn FnMut(i64) + Send)) -> Result<()> {
        super::truth::latencies(&self.pool, &DIALECT, sample).await
    }

    /// Reads the database side of the ground truth for the verifier.
    async fn ground_truth(&self, sink: &mut dyn crate::domain::rows::TruthSink) -> Result<()> {
        super::truth::read(&self.pool, &DIALECT, sink).await
    }

    async fn unpublished(&self) -> Result<i64> {
        super::truth::unpublished(&self.pool).await
    }

    async fn traces(&self, ids: &[Uuid]) -> Result<std::collections::HashMap<Uuid, i64>> {
        super::truth::traces(&self.pool, &DIALECT, ids).await
    }

    async fn story(&self, payments: &[Uuid]) -> Result<Vec<super::StoryRow>> {
        super::truth::story(&self.pool, &DIALECT, payments).await
    }

    async fn landed(&self, ids: &[Uuid], captured: bool) -> Result<usize> {
        let mut n = 0;
        for chunk in ids.chunks(MAX_PARAMS) {
            let sql = format!(
                "SELECT count(*) FROM payments WHERE id IN ({}){}",
                list(chunk.len()),
                if captured { " AND status = 'captured'" } else { "" }
            );
            let mut q = sqlx::query_scalar::<_, i64>(&sql);
            for id in chunk {
                q = q.bind(id);
            }
            n += q.fetch_one(&self.pool).await.map_err(|e| Error::db("looking payments up by id", e))? as usize;
        }
        Ok(n)
    }
}

/// The verifier's statements in this backend's SQL.
const DIALECT: super::truth::Dialect = super::truth::Dialect {
    outbox: "SELECT id, aggregate_id, event_type, payload, published_at IS NOT NULL, created_at FROM outbox",
    latency: "SELECT i.processed_at - o.created_at FROM inbox i JOIN outbox o ON o.id = i.message_id \
              WHERE i.handler = 'projection'",
    traces: "SELECT id, max(created_at, updated_at) FROM payments \
             UNION ALL SELECT payment_id, sent_at FROM receipts \
             UNION ALL SELECT payment_id, updated_at FROM payment_projection \
             UNION ALL SELECT id, published_at FROM outbox WHERE published_at IS NOT NULL \
             UNION ALL SELECT message_id, processed_at FROM inbox \
             UNION ALL SELECT message_id, processed_at FROM inbox_unkeyed",
    // An inbox claim joins its outbox row for the payment: a claim under
    // an id no outbox row has (the consumer-made id) belongs to no story.
    story: "SELECT id, 'payment', 'payment written', NULL, created_at, NULL FROM payments \
            UNION ALL SELECT id, 'payment', 'payment captured', NULL, updated_at, NULL FROM payments \
              WHERE status = 'captured' \
            UNION ALL SELECT aggregate_id, 'outbox', event_type || ' row created', id, created_at, seq FROM outbox \
            UNION ALL SELECT aggregate_id, 'outbox', event_type || ' row published', id, published_at, seq \
              FROM outbox WHERE published_at IS NOT NULL \
            UNION ALL SELECT o.aggregate_id, 'inbox', 'inbox claim: ' || i.handler, i.message_id, i.processed_at, NULL \
              FROM inbox i JOIN outbox o ON o.id = i.message_id \
            UNION ALL SELECT o.aggregate_id, 'inbox', 'inbox record: ' || i.handler, i.message_id, i.processed_at, NULL \
              FROM inbox_unkeyed i JOIN outbox o ON o.id = i.message_id \
            UNION ALL SELECT payment_id, 'effect', 'receipt sent', message_id, sent_at, NULL FROM receipts \
            UNION ALL SELECT payment_id, 'effect', 'projection: ' || status, event_id, updated_at, NULL \
              FROM payment_projection",
};

/// A notifier (or workload) transaction on SQLite: begun IMMEDIATE, holding
/// the writer turn until it commits or is dropped (dropping rolls back).
pub struct SqliteTx {
    tx: sqlx::Transaction<'static, sqlx::Sqlite>,
    // Declared after `tx`, so it is released after the rollback of a dropped
    // transaction has been handed to its connection.
    _turn: OwnedMutexGuard<()>,
}

impl SqliteTx {
    pub async fn commit(self) -> std::result::Result<(), sqlx::Error> {
        self.tx.commit().await
    }

    /// Commits through the store's gate (`store.commit_refused`), the
    /// writer turn held until the commit or the rollback is done.
    pub(super) async fn commit_through(self, gate: &super::CommitGate, what: &str) -> Result<()> {
        let SqliteTx { tx, _turn } = self;
        gate.commit(tx, what).await
    }
}

/// Records malformed messages, once each, in multi-row statements. Returns
/// the rows written.
pub async fn dead_letters(tx: &mut SqliteTx, bad: &[&Incoming]) -> Result<u64> {
    let mut n = 0;
    for chunk in bad.chunks(chunk_rows(5)) {
        let sql = format!(
            "INSERT INTO dead_letters (message_id, topic_partition, topic_offset, payload, error) \
             VALUES {} ON CONFLICT (message_id) DO NOTHING",
            values(chunk.len(), 5)
        );
        let mut q = sqlx::query(&sql);
        for m in chunk {
            let (lane, place) = m.position.as_row();
            q = q
                .bind(dead_letter_key(m))
                .bind(lane)
                .bind(place)
                .bind(&m.raw_payload)
                .bind(m.decoded.as_ref().err().cloned().unwrap_or_default());
        }
        n += q.execute(&mut *tx.tx).await.map_err(|e| Error::db("writing dead letters", e))?.rows_affected();
    }
    Ok(n)
}

/// The inbox claim: multi-row `INSERT … ON CONFLICT DO NOTHING RETURNING`.
/// Returns the pairs this transaction newly claimed (a pair twice in one
/// batch conflicts with itself and is returned once).
pub async fn claim(tx: &mut SqliteTx, pairs: &[(Uuid, &'static str)]) -> Result<HashSet<(Uuid, &'static str)>> {
    let mut claimed = HashSet::new();
    for chunk in pairs.chunks(chunk_rows(2)) {
        let sql = format!(
            "INSERT INTO inbox (message_id, handler) VALUES {} ON CONFLICT DO NOTHING RETURNING message_id, handler",
            values(chunk.len(), 2)
        );
        let mut q = sqlx::query(&sql);
        for (id, h) in chunk {
            q = q.bind(id).bind(*h);
        }
        let rows = q.fetch_all(&mut *tx.tx).await.map_err(|e| Error::db("claiming inbox rows", e))?;
        for r in rows {
            let (id, h): (Uuid, String) = (r.get(0), r.get(1));
            if let Some(h) = HANDLERS.iter().find(|k| **k == h) {
                claimed.insert((id, *h));
            }
        }
    }
    Ok(claimed)
}

/// Applies a batch's effects, a multi-row statement per effect. Returns how
/// many projection updates were refused by the state guard.
pub async fn apply(tx: &mut SqliteTx, plan: &EffectPlan<'_>, projection: ProjectionMode) -> Result<u64> {
    let mut stale = 0;
    let guard = match projection {
        // Only ever forward, so a stale `authorized` cannot undo `captured`.
        ProjectionMode::StateGuard => {
            " WHERE payment_projection.status = 'authorized' AND excluded.status = 'captured'"
        }
        ProjectionMode::LastWriteWins => "",
    };
    // One row per event, in message order: SQLite applies a multi-row
    // upsert row by row, so a payment's second event in the batch meets the
    // row its first one wrote, exactly as one statement per event did. A
    // refused update changes no row, so refusals are events minus changes.
    for chunk in plan.projection.chunks(chunk_rows(3)) {
        let sql = format!(
            "INSERT INTO payment_projection (payment_id, status, event_id) VALUES {} \
             ON CONFLICT (payment_id) DO UPDATE SET status = excluded.status, event_id = excluded.event_id, \
             updated_at = {NOW_MS}{guard}",
            values(chunk.len(), 3)
        );
        let mut q = sqlx::query(&sql);
        for e in chunk {
            q = q.bind(e.body.payment_id).bind(e.kind.status()).bind(e.event_id);
        }
        let r = q.execute(&mut *tx.tx).await.map_err(|err| Error::db("updating the projection", err))?;
        stale += chunk.len() as u64 - r.rows_affected();
    }
    for chunk in plan.receipts.chunks(chunk_rows(2)) {
        let sql = format!("INSERT INTO receipts (payment_id, message_id) VALUES {}", values(chunk.len(), 2));
        let mut q = sqlx::query(&sql);
        for (payment, message) in chunk {
            q = q.bind(payment).bind(message);
        }
        q.execute(&mut *tx.tx).await.map_err(|e| Error::db("sending receipts", e))?;
    }
    // (account, stripe) pairs are unique and sorted (a BTreeMap), so one row each.
    let loyalty: Vec<(&(i32, i32), &i64)> = plan.loyalty.iter().collect();
    for chunk in loyalty.chunks(chunk_rows(3)) {
        let sql = format!(
            "INSERT INTO loyalty_points (account_id, stripe, points) VALUES {} \
             ON CONFLICT (account_id, stripe) DO UPDATE SET points = loyalty_points.points + excluded.points",
            values(chunk.len(), 3)
        );
        let mut q = sqlx::query(&sql);
        for ((account, stripe), points) in chunk {
            q = q.bind(*account).bind(*stripe).bind(**points);
        }
        q.execute(&mut *tx.tx).await.map_err(|e| Error::db("adding loyalty points", e))?;
    }
    for chunk in plan.credits.chunks(chunk_rows(3)) {
        let sql =
            format!("INSERT INTO loyalty_credits (event_id, account_id, points) VALUES {}", values(chunk.len(), 3));
        let mut q = sqlx::query(&sql);
        for (event, account, points) in chunk {
            q = q.bind(event).bind(*account).bind(*points);
        }
        q.execute(&mut *tx.tx).await.map_err(|e| Error::db("recording loyalty credits", e))?;
    }
    Ok(stale)
}

/// Writes outbox events (payment, type, payload or the payment's own) in
/// multi-row statements, in the order given (`seq` follows it).
async fn insert_outbox(
    tx: &mut SqliteTx,
    events: &[(&NewPayment, EventKind, Option<serde_json::Value>)],
) -> Result<()> {
    for chunk in events.chunks(chunk_rows(4)) {
        let sql =
            format!("INSERT INTO outbox (id, aggregate_id, event_type, payload) VALUES {}", values(chunk.len(), 4));
        let mut q = sqlx::query(&sql);
        for (p, kind, payload) in chunk {
            let payload = match payload {
                Some(v) => v.to_string(),
                None => serde_json::to_string(&PaymentEvent {
                    payment_id: p.id,
                    account_id: p.account_id,
                    amount_cents: p.amount_cents,
                })
                .map_err(|e| Error::Internal(format!("encoding an event: {e}")))?,
            };
            q = q.bind(crate::domain::events::time_ordered_id()).bind(p.id).bind(kind.event_type()).bind(payload);
        }
        q.execute(&mut *tx.tx).await.map_err(|e| Error::db("writing outbox events", e))?;
    }
    Ok(())
}

/// A relay's handle on the database; see the module docs for the lease.
pub struct SqliteRelayConn {
    /// The store's writer connection (a pool of one).
    write: SqlitePool,
    /// The store's writer turn, held for each claim, mark and release.
    writer: Writer,
    /// This relay incarnation's lease id.
    owner: String,
    /// The ids it holds a lease on, to release them.
    held: Vec<Uuid>,
    gate: super::CommitGate,
}

impl SqliteRelayConn {
    fn new(write: SqlitePool, writer: Writer, gate: super::CommitGate) -> Self {
        Self { write, writer, owner: Uuid::new_v4().to_string(), held: Vec::new(), gate }
    }
}

impl super::RelayConnOps for SqliteRelayConn {
    async fn claim(&mut self, n: usize, after: i64) -> Result<Vec<OutboxRow>> {
        let _turn = turn(&self.writer, "a relay claim").await?;
        let mut tx =
            self.write.begin_with("BEGIN IMMEDIATE").await.map_err(|e| Error::db("beginning a relay claim", e))?;
        let rows = sqlx::query(&format!(
            "UPDATE outbox SET lease_owner = ?, lease_until = {NOW_MS} + ? WHERE seq IN ( \
               SELECT seq FROM outbox WHERE published_at IS NULL AND seq > ? \
               AND (lease_until IS NULL OR lease_until < {NOW_MS}) ORDER BY seq LIMIT ?) \
             RETURNING id, seq, aggregate_id, event_type, payload"
        ))
        .bind(&self.owner)
        .bind(LEASE.as_millis() as i64)
        .bind(after)
        .bind(n as i64)
        .fetch_all(&mut *tx)
        .await
        .map_err(|e| Error::db("claiming outbox rows", e))?;
        tx.commit().await.map_err(|e| Error::db("committing a relay claim", e))?;
        let mut rows: Vec<OutboxRow> = rows
            .into_iter()
            .map(|r| OutboxRow {
                id: r.get(0),
                seq: r.get(1),
                aggregate_id: r.get(2),
                event_type: r.get(3),
                payload: r.get::<String, _>(4).into_bytes(),
            })
            .collect();
        // RETURNING has no order; publish oldest first.
        rows.sort_by_key(|r| r.seq);
        self.held = rows.iter().map(|r| r.id).collect();
        Ok(rows)
    }

    /// Marks the rows published (and frees their lease) with one `UPDATE …
    /// WHERE id IN (…)` per chunk, in one transaction.
    async fn mark_published(&mut self, ids: &[Uuid]) -> Result<()> {
        if ids.is_empty() {
            return Ok(());
        }
        let _turn = turn(&self.writer, "a relay mark").await?;
        let mut tx =
            self.write.begin_with("BEGIN IMMEDIATE").await.map_err(|e| Error::db("beginning a relay mark", e))?;
        for chunk in ids.chunks(MAX_PARAMS) {
            let sql = format!(
                "UPDATE outbox SET published_at = {NOW_MS}, lease_owner = NULL, lease_until = NULL WHERE id IN ({})",
                list(chunk.len())
            );
            let mut q = sqlx::query(&sql);
            for id in chunk {
                q = q.bind(id);
            }
            q.execute(&mut *tx).await.map_err(|e| Error::db("marking outbox rows published", e))?;
        }
        self.gate.commit(tx, "a relay batch").await?;
        self.held.clear();
        Ok(())
    }

    /// Deletes the claimed rows, in one transaction.
    async fn delete_claimed(&mut self, ids: &[Uuid]) -> Result<()> {
        let _turn = turn(&self.writer, "a relay delete").await?;
        let mut tx =
            self.write.begin_with("BEGIN IMMEDIATE").await.map_err(|e| Error::db("beginning a relay delete", e))?;
        for chunk in ids.chunks(MAX_PARAMS) {
            let sql = format!("DELETE FROM outbox WHERE id IN ({})", list(chunk.len()));
            let mut q = sqlx::query(&sql);
            for id in chunk {
                q = q.bind(id);
            }
            q.execute(&mut *tx).await.map_err(|e| Error::db("deleting claimed outbox rows", e))?;
        }
        self.gate.commit(tx, "a relay delete").await?;
        self.held.clear();
        Ok(())
    }

    async fn release(&mut self) -> Result<()> {
        let held = std::mem::take(&mut self.held);
        let _turn = turn(&self.writer, "a relay release").await?;
        for chunk in held.chunks(MAX_PARAMS - 1) {
            let sql = format!(
                "UPDATE outbox SET lease_owner = NULL, lease_until = NULL WHERE lease_owner = ? AND id IN ({})",
                list(chunk.len())
            );
            let mut q = sqlx::query(&sql).bind(&self.owner);
            for id in chunk {
                q = q.bind(id);
            }
            q.execute(&self.write).await.map_err(|e| Error::db("releasing a relay claim", e))?;
        }
        Ok(())
    }

    /// The crash: the relay lets go of the database with its rows still
    /// leased (no release, no cleanup); the lease is left to expire.
    fn crash(self) {
        drop(self);
    }
}

impl super::NotifierTx for SqliteTx {
    async fn dead_letters(&mut self, bad: &[&Incoming]) -> Result<u64> {
        dead_letters(self, bad).await
    }

    async fn claim(&mut self, pairs: &[(Uuid, &'static str)]) -> Result<HashSet<(Uuid, &'static str)>> {
        claim(self, pairs).await
    }

    async fn apply(&mut self, plan: &EffectPlan<'_>, projection: ProjectionMode) -> Result<u64> {
        apply(self, plan, projection).await
    }
}

/// The drain and the verifier read through the pool while the writer
/// commits: a read that begins after a commit returns sees it, whichever
/// pooled connection it gets (a stale snapshot would end a drain early).
#[cfg(test)]
mod reads_after_commits {
    use super::*;

    #[tokio::test]
    async fn a_read_after_a_commit_sees_it_on_a_reused_connection() {
        let dir = tempfile::tempdir().unwrap();
        let s = SqliteStore::open(&dir.path().join("p.sqlite"), 1).await.unwrap();
        sqlx::query("CREATE TABLE t (x int)").execute(&s.write).await.unwrap();
        let mut stale = Vec::new();
        for i in 1..=50i64 {
            sqlx::query("INSERT INTO t VALUES (1)").execute(&s.write).await.unwrap();
            let n: i64 = sqlx::query_scalar("SELECT count(*) FROM t").fetch_one(&s.pool).await.unwrap();
            let all: Vec<i64> = sqlx::query_scalar("SELECT x FROM t").fetch_all(&s.pool).await.unwrap();
            if n != i || all.len() as i64 != i {
                stale.push((i, n, all.len()));
            }
        }
        assert!(stale.is_empty(), "(inserts, count, rows) seen: {stale:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_read_after_a_commit_sees_it_while_others_poll() {
        let dir = tempfile::tempdir().unwrap();
        let s = SqliteStore::open(&dir.path().join("p.sqlite"), 8).await.unwrap();
        sqlx::query("CREATE TABLE t (x int)").execute(&s.write).await.unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut pollers = Vec::new();
        for _ in 0..3 {
            let (pool, stop) = (s.pool.clone(), stop.clone());
            pollers.push(tokio::spawn(async move {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let _: i64 = sqlx::query_scalar("SELECT count(*) FROM t").fetch_one(&pool).await.unwrap();
                    tokio::task::yield_now().await;
                }
            }));
        }
        let mut stale = Vec::new();
        for i in 1..=2000i64 {
            let mut tx = s.write.begin_with("BEGIN IMMEDIATE").await.unwrap();
            sqlx::query("INSERT INTO t VALUES (1)").execute(&mut *tx).await.unwrap();
            tx.commit().await.unwrap();
            let n: i64 = sqlx::query_scalar("SELECT count(*) FROM t").fetch_one(&s.pool).await.unwrap();
            if n != i {
                stale.push((i, n));
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for p in pollers {
            p.await.unwrap();
        }
        assert!(stale.is_empty(), "(inserts, count) seen: {stale:?}");
    }
}
