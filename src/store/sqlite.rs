//! The SQLite backend of the embedded mode: one file per run, WAL mode, a
//! busy timeout. Same statements as the PostgreSQL backend where SQLite
//! allows; one row per statement where PostgreSQL uses arrays (SQLite runs
//! in-process, so a statement costs no round trip).
//!
//! SQLite has no `SKIP LOCKED`, so a relay claims rows with a lease: one short
//! `BEGIN IMMEDIATE` transaction stamps a batch of unleased (or expired)
//! unpublished rows with the relay's id and a deadline, and commits. Two
//! relays never hold the same rows, relays publish concurrently (as they do
//! on PostgreSQL), and a crashed relay's rows come back when its lease
//! expires ([`LEASE`]), with no cleanup by anyone. Holding SQLite's single
//! write lock across the publish instead would serialise every writer behind
//! the broker.

use super::{dead_letter_key, DbTruth, EffectPlan, Incoming, NewPayment, OutboxRow, PURGE_CHUNK};
use crate::error::{Error, Result};
use crate::events::{self, EventKind, PaymentEvent};
use crate::report::Latency;
use crate::scenario::ProjectionMode;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{ConnectOptions, Row};
use std::collections::HashSet;
use std::path::Path;
use std::time::Duration;
use uuid::Uuid;

/// How long a relay's claim on outbox rows lasts. Longer than a publish
/// takes; a crashed relay's rows are claimable again after it.
pub const LEASE: Duration = Duration::from_secs(2);

/// "Now" in milliseconds since the epoch, as the migrations store times.
const NOW_MS: &str = "CAST(unixepoch('subsec') * 1000 AS INTEGER)";

/// A run's SQLite database.
#[derive(Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
    opts: SqliteConnectOptions,
    /// The database file.
    pub endpoint: String,
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
            // Writers take turns; a relay holds the write lock across a publish.
            .busy_timeout(Duration::from_secs(30))
            .log_statements(tracing::log::LevelFilter::Trace);
        let pool = SqlitePoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(opts.clone())
            .await
            .map_err(|e| Error::db(format!("opening {endpoint}"), e))?;
        sqlx::migrate!("migrations/sqlite")
            .run(&pool)
            .await
            .map_err(|e| Error::Database { context: format!("migrating {endpoint}"), cause: e.to_string() })?;
        Ok(Self { pool, opts, endpoint })
    }

    pub async fn close(&self) {
        self.pool.close().await;
    }

    pub async fn relay_connection(&self) -> Result<SqliteRelayConn> {
        let conn = self.opts.connect().await.map_err(|e| Error::db("opening a relay connection", e))?;
        Ok(SqliteRelayConn::new(conn))
    }

    async fn begin(&self, what: &str) -> Result<sqlx::Transaction<'static, sqlx::Sqlite>> {
        // IMMEDIATE: take the write lock up front (waiting up to the busy
        // timeout) instead of failing when a read would have to upgrade.
        self.pool.begin_with("BEGIN IMMEDIATE").await.map_err(|e| Error::db(format!("beginning {what}"), e))
    }

    pub async fn authorize(&self, ps: &[NewPayment], outbox: bool) -> Result<()> {
        let mut tx = self.begin("authorize").await?;
        for p in ps {
            sqlx::query("INSERT INTO payments (id, account_id, amount_cents, status) VALUES (?, ?, ?, 'authorized')")
                .bind(p.id)
                .bind(p.account_id)
                .bind(p.amount_cents)
                .execute(&mut *tx)
                .await
                .map_err(|e| Error::db("inserting a payment", e))?;
            if outbox {
                insert_outbox(&mut tx, p, EventKind::Authorized, None).await?;
            }
        }
        tx.commit().await.map_err(|e| Error::db("committing authorize", e))
    }

    pub async fn capture(&self, ps: &[(NewPayment, bool)], outbox: bool) -> Result<()> {
        let mut tx = self.begin("capture").await?;
        for (p, poison) in ps {
            sqlx::query(&format!(
                "UPDATE payments SET status = 'captured', updated_at = {NOW_MS} WHERE id = ? AND status = 'authorized'"
            ))
            .bind(p.id)
            .execute(&mut *tx)
            .await
            .map_err(|e| Error::db("capturing a payment", e))?;
            if outbox {
                insert_outbox(&mut tx, p, EventKind::Captured, None).await?;
                if *poison {
                    insert_outbox(&mut tx, p, EventKind::Captured, Some(events::poison_payload())).await?;
                }
            }
        }
        tx.commit().await.map_err(|e| Error::db("committing capture", e))
    }

    pub async fn begin_tx(&self) -> Result<SqliteTx> {
        self.begin("a notifier transaction").await
    }

    /// The check of the check-then-act variant, outside any transaction.
    pub async fn unkeyed_seen(&self, pairs: &[(Uuid, &'static str)]) -> Result<HashSet<(Uuid, &'static str)>> {
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

    pub async fn unkeyed_record(&self, pairs: &[(Uuid, &'static str)]) -> Result<()> {
        for (id, h) in pairs {
            sqlx::query("INSERT INTO inbox_unkeyed (message_id, handler) VALUES (?, ?)")
                .bind(id)
                .bind(*h)
                .execute(&self.pool)
                .await
                .map_err(|e| Error::db("recording in the unkeyed inbox", e))?;
        }
        Ok(())
    }

    pub(super) fn pool(&self) -> &sqlx::SqlitePool {
        &self.pool
    }

    pub async fn purge(&self, outbox_older: Duration, inbox_older: Duration) -> Result<(u64, u64)> {
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
                let n = sqlx::query(sql)
                    .bind(older.as_millis() as i64)
                    .bind(PURGE_CHUNK)
                    .execute(&self.pool)
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
    pub async fn latency(&self) -> Result<Option<Latency>> {
        let mut ms: Vec<i64> = sqlx::query_scalar(
            "SELECT i.processed_at - o.created_at FROM inbox i JOIN outbox o ON o.id = i.message_id \
             WHERE i.handler = 'projection'",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(|e| Error::db("measuring latency", e))?;
        Ok(super::percentiles(&mut ms))
    }

    /// Reads the database side of the ground truth for the verifier.
    pub async fn ground_truth(&self) -> Result<DbTruth> {
        let dialect = super::truth::Dialect {
            outbox: "SELECT id, aggregate_id, event_type, payload, published_at IS NOT NULL FROM outbox",
            inbox: "SELECT handler, count(*) FROM (SELECT handler FROM inbox UNION ALL SELECT handler FROM inbox_unkeyed) GROUP BY handler",
        };
        super::truth::read(&self.pool, &dialect).await
    }
}

/// A notifier transaction on SQLite (begun IMMEDIATE).
pub type SqliteTx = sqlx::Transaction<'static, sqlx::Sqlite>;

pub async fn dead_letters(tx: &mut SqliteTx, bad: &[&Incoming]) -> Result<u64> {
    let mut n = 0;
    for m in bad {
        let r = sqlx::query(
            "INSERT INTO dead_letters (message_id, topic_partition, topic_offset, payload, error) \
             VALUES (?, ?, ?, ?, ?) ON CONFLICT (message_id) DO NOTHING",
        )
        .bind(dead_letter_key(m))
        .bind(m.partition)
        .bind(m.offset)
        .bind(&m.raw_payload)
        .bind(m.decoded.as_ref().err().cloned().unwrap_or_default())
        .execute(&mut **tx)
        .await
        .map_err(|e| Error::db("writing dead letters", e))?;
        n += r.rows_affected();
    }
    Ok(n)
}

/// The inbox claim, one `INSERT … ON CONFLICT DO NOTHING` per pair.
pub async fn claim(tx: &mut SqliteTx, pairs: &[(Uuid, &'static str)]) -> Result<HashSet<(Uuid, &'static str)>> {
    let mut claimed = HashSet::new();
    for (id, h) in pairs {
        let r = sqlx::query("INSERT INTO inbox (message_id, handler) VALUES (?, ?) ON CONFLICT DO NOTHING")
            .bind(id)
            .bind(*h)
            .execute(&mut **tx)
            .await
            .map_err(|e| Error::db("claiming inbox rows", e))?;
        if r.rows_affected() == 1 {
            claimed.insert((*id, *h));
        }
    }
    Ok(claimed)
}

pub async fn apply(tx: &mut SqliteTx, plan: &EffectPlan<'_>, projection: ProjectionMode) -> Result<u64> {
    let mut stale = 0;
    let guard = match projection {
        // Only ever forward, so a stale `authorized` cannot undo `captured`.
        ProjectionMode::StateGuard => {
            " WHERE payment_projection.status = 'authorized' AND excluded.status = 'captured'"
        }
        ProjectionMode::LastWriteWins => "",
    };
    let sql = format!(
        "INSERT INTO payment_projection (payment_id, status) VALUES (?, ?) \
         ON CONFLICT (payment_id) DO UPDATE SET status = excluded.status, updated_at = {NOW_MS}{guard}"
    );
    for e in &plan.projection {
        let r = sqlx::query(&sql)
            .bind(e.body.payment_id)
            .bind(e.kind.status())
            .execute(&mut **tx)
            .await
            .map_err(|err| Error::db("updating the projection", err))?;
        if r.rows_affected() == 0 {
            stale += 1;
        }
    }
    for (payment, message) in &plan.receipts {
        sqlx::query("INSERT INTO receipts (payment_id, message_id) VALUES (?, ?)")
            .bind(payment)
            .bind(message)
            .execute(&mut **tx)
            .await
            .map_err(|e| Error::db("sending receipts", e))?;
    }
    for (account, points) in &plan.loyalty {
        sqlx::query(
            "INSERT INTO loyalty_points (account_id, points) VALUES (?, ?) \
             ON CONFLICT (account_id) DO UPDATE SET points = loyalty_points.points + excluded.points",
        )
        .bind(account)
        .bind(points)
        .execute(&mut **tx)
        .await
        .map_err(|e| Error::db("adding loyalty points", e))?;
    }
    Ok(stale)
}

async fn insert_outbox(
    tx: &mut sqlx::Transaction<'_, sqlx::Sqlite>,
    p: &NewPayment,
    kind: EventKind,
    payload: Option<serde_json::Value>,
) -> Result<()> {
    let payload = payload.unwrap_or_else(|| {
        serde_json::to_value(PaymentEvent { payment_id: p.id, account_id: p.account_id, amount_cents: p.amount_cents })
            .unwrap_or_default()
    });
    sqlx::query("INSERT INTO outbox (id, aggregate_id, event_type, payload) VALUES (?, ?, ?, ?)")
        .bind(Uuid::new_v4())
        .bind(p.id)
        .bind(kind.event_type())
        .bind(payload.to_string())
        .execute(&mut **tx)
        .await
        .map_err(|e| Error::db("writing an outbox event", e))?;
    Ok(())
}

/// A relay's private SQLite connection; see the module docs for the lease.
pub struct SqliteRelayConn {
    conn: SqliteConnection,
    /// This relay incarnation's lease id.
    owner: String,
    /// The ids it holds a lease on, to release them.
    held: Vec<Uuid>,
}

impl SqliteRelayConn {
    pub fn new(conn: SqliteConnection) -> Self {
        Self { conn, owner: Uuid::new_v4().to_string(), held: Vec::new() }
    }

    pub async fn claim(&mut self, n: usize) -> Result<Vec<OutboxRow>> {
        let mut tx = sqlx::Connection::begin_with(&mut self.conn, "BEGIN IMMEDIATE")
            .await
            .map_err(|e| Error::db("beginning a relay claim", e))?;
        let rows = sqlx::query(&format!(
            "UPDATE outbox SET lease_owner = ?, lease_until = {NOW_MS} + ? WHERE seq IN ( \
               SELECT seq FROM outbox WHERE published_at IS NULL \
               AND (lease_until IS NULL OR lease_until < {NOW_MS}) ORDER BY seq LIMIT ?) \
             RETURNING id, seq, aggregate_id, event_type, payload"
        ))
        .bind(&self.owner)
        .bind(LEASE.as_millis() as i64)
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

    pub async fn mark_published(&mut self, ids: &[Uuid]) -> Result<()> {
        if ids.is_empty() {
            return Ok(());
        }
        let mut tx = sqlx::Connection::begin_with(&mut self.conn, "BEGIN IMMEDIATE")
            .await
            .map_err(|e| Error::db("beginning a relay mark", e))?;
        for id in ids {
            sqlx::query(&format!(
                "UPDATE outbox SET published_at = {NOW_MS}, lease_owner = NULL, lease_until = NULL WHERE id = ?"
            ))
            .bind(id)
            .execute(&mut *tx)
            .await
            .map_err(|e| Error::db("marking outbox rows published", e))?;
        }
        tx.commit().await.map_err(|e| Error::db("committing a relay batch", e))?;
        self.held.clear();
        Ok(())
    }

    pub async fn release(&mut self) -> Result<()> {
        let held = std::mem::take(&mut self.held);
        for id in held {
            sqlx::query("UPDATE outbox SET lease_owner = NULL, lease_until = NULL WHERE id = ? AND lease_owner = ?")
                .bind(id)
                .bind(&self.owner)
                .execute(&mut self.conn)
                .await
                .map_err(|e| Error::db("releasing a relay claim", e))?;
        }
        Ok(())
    }

    /// The crash: the connection closes; the lease is left to expire.
    pub fn crash(self) {
        drop(self.conn);
    }
}
