//! The SQLite backend of the embedded mode: one file per run, WAL mode, a
//! busy timeout. Same statements as the PostgreSQL backend where SQLite
//! allows; one row per statement where PostgreSQL uses arrays (SQLite runs
//! in-process, so a statement costs no round trip).
//!
//! SQLite has no `SKIP LOCKED`. A relay's claim is `BEGIN IMMEDIATE`, the
//! database's single write lock, held across the publish: two relays never
//! hold the same rows (they take turns), and a crashed relay's transaction
//! dies with its connection, so the rows are claimable again at once.

use super::{
    claims, dead_letter_key, plan_effects, BatchOutcome, DbTruth, Incoming, NewPayment, OutboxRecord, OutboxRow,
    PaymentRow, PURGE_CHUNK,
};
use crate::error::{Error, Result};
use crate::events::{self, Decoded, EventKind, PaymentEvent};
use crate::scenario::InboxMode;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{ConnectOptions, Row};
use std::collections::HashSet;
use std::path::Path;
use std::time::Duration;
use uuid::Uuid;

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
        Ok(SqliteRelayConn { conn })
    }

    async fn begin(&self, what: &str) -> Result<sqlx::Transaction<'static, sqlx::Sqlite>> {
        // IMMEDIATE: take the write lock up front (waiting up to the busy
        // timeout) instead of failing when a read would have to upgrade.
        self.pool.begin_with("BEGIN IMMEDIATE").await.map_err(|e| Error::db(format!("beginning {what}"), e))
    }

    pub async fn authorize(&self, p: &NewPayment) -> Result<()> {
        let mut tx = self.begin("authorize").await?;
        sqlx::query("INSERT INTO payments (id, account_id, amount_cents, status) VALUES (?, ?, ?, 'authorized')")
            .bind(p.id)
            .bind(p.account_id)
            .bind(p.amount_cents)
            .execute(&mut *tx)
            .await
            .map_err(|e| Error::db("inserting a payment", e))?;
        insert_outbox(&mut tx, p, EventKind::Authorized, None).await?;
        tx.commit().await.map_err(|e| Error::db("committing authorize", e))
    }

    pub async fn capture(&self, p: &NewPayment, poison: bool) -> Result<()> {
        let mut tx = self.begin("capture").await?;
        sqlx::query(&format!(
            "UPDATE payments SET status = 'captured', updated_at = {NOW_MS} WHERE id = ? AND status = 'authorized'"
        ))
        .bind(p.id)
        .execute(&mut *tx)
        .await
        .map_err(|e| Error::db("capturing a payment", e))?;
        insert_outbox(&mut tx, p, EventKind::Captured, None).await?;
        if poison {
            insert_outbox(&mut tx, p, EventKind::Captured, Some(events::poison_payload())).await?;
        }
        tx.commit().await.map_err(|e| Error::db("committing capture", e))
    }

    pub async fn apply_batch(&self, batch: &[Incoming], mode: InboxMode) -> Result<BatchOutcome> {
        let mut out = BatchOutcome::default();
        let mut tx = self.begin("a notifier batch").await?;
        for m in batch.iter().filter(|m| m.decoded.is_err()) {
            let r = sqlx::query(
                "INSERT INTO dead_letters (message_id, topic_partition, topic_offset, payload, error) \
                 VALUES (?, ?, ?, ?, ?) ON CONFLICT (message_id) DO NOTHING",
            )
            .bind(dead_letter_key(m))
            .bind(m.partition)
            .bind(m.offset)
            .bind(&m.raw_payload)
            .bind(m.decoded.as_ref().err().cloned().unwrap_or_default())
            .execute(&mut *tx)
            .await
            .map_err(|e| Error::db("writing dead letters", e))?;
            out.dead_lettered += r.rows_affected();
        }
        let events: Vec<&Decoded> = batch.iter().filter_map(|m| m.decoded.as_ref().ok()).collect();
        let mut claimed: HashSet<(Uuid, &str)> = HashSet::new();
        if mode == InboxMode::On {
            for (id, h) in claims(&events) {
                let r = sqlx::query("INSERT INTO inbox (message_id, handler) VALUES (?, ?) ON CONFLICT DO NOTHING")
                    .bind(id)
                    .bind(h)
                    .execute(&mut *tx)
                    .await
                    .map_err(|e| Error::db("claiming inbox rows", e))?;
                if r.rows_affected() == 1 {
                    claimed.insert((id, h));
                }
            }
        }
        let plan = plan_effects(&events, mode, &claimed);
        out.applied = plan.applied;
        out.duplicates = plan.duplicates;
        for e in &plan.projection {
            // State-based: a replayed `authorized` cannot undo a `captured`.
            let r = sqlx::query(&format!(
                "INSERT INTO payment_projection (payment_id, status) VALUES (?, ?) \
                 ON CONFLICT (payment_id) DO UPDATE SET status = excluded.status, updated_at = {NOW_MS} \
                 WHERE payment_projection.status = 'authorized' AND excluded.status = 'captured'"
            ))
            .bind(e.body.payment_id)
            .bind(e.kind.status())
            .execute(&mut *tx)
            .await
            .map_err(|err| Error::db("updating the projection", err))?;
            if r.rows_affected() == 0 {
                out.stale += 1;
            }
        }
        for (payment, message) in &plan.receipts {
            sqlx::query("INSERT INTO receipts (payment_id, message_id) VALUES (?, ?)")
                .bind(payment)
                .bind(message)
                .execute(&mut *tx)
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
            .execute(&mut *tx)
            .await
            .map_err(|e| Error::db("adding loyalty points", e))?;
        }
        tx.commit().await.map_err(|e| Error::db("committing a notifier batch", e))?;
        Ok(out)
    }

    pub async fn unpublished(&self) -> Result<i64> {
        sqlx::query_scalar("SELECT count(*) FROM outbox WHERE published_at IS NULL")
            .fetch_one(&self.pool)
            .await
            .map_err(|e| Error::db("counting unpublished outbox rows", e))
    }

    pub async fn purge(&self, outbox_older: Duration, inbox_older: Duration) -> Result<(u64, u64)> {
        let mut total = [0u64; 2];
        let statements = [
            format!(
                "DELETE FROM outbox WHERE rowid IN (SELECT rowid FROM outbox WHERE published_at IS NOT NULL \
                 AND published_at < {NOW_MS} - ? LIMIT ?)"
            ),
            format!("DELETE FROM inbox WHERE rowid IN (SELECT rowid FROM inbox WHERE processed_at < {NOW_MS} - ? LIMIT ?)"),
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

    pub async fn ground_truth(&self) -> Result<DbTruth> {
        let ctx = |what: &'static str| move |e| Error::db(format!("reading {what} for the verifier"), e);
        let payments = sqlx::query("SELECT id, account_id, amount_cents, status FROM payments")
            .fetch_all(&self.pool)
            .await
            .map_err(ctx("payments"))?
            .into_iter()
            .map(|r| PaymentRow {
                id: r.get(0),
                account_id: r.get(1),
                amount_cents: r.get(2),
                captured: r.get::<String, _>(3) == "captured",
            })
            .collect();
        let outbox = sqlx::query("SELECT id, aggregate_id, event_type, payload, published_at IS NOT NULL FROM outbox")
            .fetch_all(&self.pool)
            .await
            .map_err(ctx("the outbox"))?
            .into_iter()
            .map(|r| {
                let t: String = r.get(2);
                let payload: String = r.get(3);
                let kind =
                    EventKind::from_type(&t).filter(|_| serde_json::from_str::<PaymentEvent>(&payload).is_ok());
                OutboxRecord { id: r.get(0), payment_id: r.get(1), kind, published: r.get(4) }
            })
            .collect();
        let inbox_rows = sqlx::query("SELECT handler, count(*) FROM inbox GROUP BY handler")
            .fetch_all(&self.pool)
            .await
            .map_err(ctx("the inbox"))?
            .into_iter()
            .map(|r| (r.get::<String, _>(0), r.get::<i64, _>(1) as u64))
            .collect();
        let receipts = sqlx::query("SELECT payment_id, count(*) FROM receipts GROUP BY payment_id")
            .fetch_all(&self.pool)
            .await
            .map_err(ctx("receipts"))?
            .into_iter()
            .map(|r| (r.get::<Uuid, _>(0), r.get::<i64, _>(1) as u64))
            .collect();
        let projection = sqlx::query("SELECT payment_id, status FROM payment_projection")
            .fetch_all(&self.pool)
            .await
            .map_err(ctx("the projection"))?
            .into_iter()
            .map(|r| (r.get::<Uuid, _>(0), r.get::<String, _>(1) == "captured"))
            .collect();
        let dead_letters: i64 = sqlx::query_scalar("SELECT count(*) FROM dead_letters")
            .fetch_one(&self.pool)
            .await
            .map_err(ctx("dead letters"))?;
        let loyalty = sqlx::query("SELECT account_id, points FROM loyalty_points")
            .fetch_all(&self.pool)
            .await
            .map_err(ctx("loyalty points"))?
            .into_iter()
            .map(|r| (r.get::<i32, _>(0), r.get::<i64, _>(1)))
            .collect();
        Ok(DbTruth { payments, outbox, inbox_rows, receipts, projection, dead_letters: dead_letters as u64, loyalty })
    }
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

/// A relay's private SQLite connection; see the module docs for the claim.
pub struct SqliteRelayConn {
    conn: SqliteConnection,
}

impl SqliteRelayConn {
    pub async fn claim(&mut self, n: usize) -> Result<Vec<OutboxRow>> {
        sqlx::query("BEGIN IMMEDIATE").execute(&mut self.conn).await.map_err(|e| Error::db("beginning a relay claim", e))?;
        let rows = sqlx::query(
            "SELECT id, seq, aggregate_id, event_type, payload FROM outbox WHERE published_at IS NULL ORDER BY seq LIMIT ?",
        )
        .bind(n as i64)
        .fetch_all(&mut self.conn)
        .await
        .map_err(|e| Error::db("claiming outbox rows", e))?;
        Ok(rows
            .into_iter()
            .map(|r| OutboxRow {
                id: r.get(0),
                seq: r.get(1),
                aggregate_id: r.get(2),
                event_type: r.get(3),
                payload: r.get::<String, _>(4).into_bytes(),
            })
            .collect())
    }

    pub async fn mark_published(&mut self, ids: &[Uuid]) -> Result<()> {
        for id in ids {
            sqlx::query(&format!("UPDATE outbox SET published_at = {NOW_MS} WHERE id = ?"))
                .bind(id)
                .execute(&mut self.conn)
                .await
                .map_err(|e| Error::db("marking outbox rows published", e))?;
        }
        sqlx::query("COMMIT").execute(&mut self.conn).await.map_err(|e| Error::db("committing a relay batch", e))?;
        Ok(())
    }

    pub async fn release(&mut self) -> Result<()> {
        sqlx::query("ROLLBACK").execute(&mut self.conn).await.map_err(|e| Error::db("releasing a relay claim", e))?;
        Ok(())
    }

    /// The crash: the connection closes with its transaction open; SQLite
    /// rolls it back and frees the write lock.
    pub fn crash(self) {
        drop(self.conn);
    }
}
