//! Every SQL statement of the pipeline and of the verifier, against
//! PostgreSQL. The schema lives in `migrations/postgres/`.
//!
//! Relays get a connection of their own (see [`RelayConn`]) so that a crash can
//! be a real one: the socket closes mid-transaction and the server rolls back.

use crate::error::{Error, Result};
use crate::events::{self, Decoded, EventKind, PaymentEvent};
use crate::infra::{db_endpoint, CONNECT_TIMEOUT};
use crate::scenario::InboxMode;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, Row};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::str::FromStr;
use std::time::Duration;
use uuid::Uuid;

/// The handlers of the notifier, each with its own inbox claim.
pub const HANDLER_PROJECTION: &str = "projection";
pub const HANDLER_RECEIPTS: &str = "receipts";
pub const HANDLER_LOYALTY: &str = "loyalty";
pub const HANDLERS: [&str; 3] = [HANDLER_PROJECTION, HANDLER_RECEIPTS, HANDLER_LOYALTY];

/// Which handlers act on an event type.
pub fn handlers_for(kind: EventKind) -> &'static [&'static str] {
    match kind {
        EventKind::Authorized => &[HANDLER_PROJECTION],
        EventKind::Captured => &HANDLERS,
    }
}

/// Retention deletes at most this many rows per statement, so one purge never
/// holds long locks.
pub const PURGE_CHUNK: i64 = 10_000;

/// A run's database: a pool scoped to the run's schema.
#[derive(Clone)]
pub struct Store {
    pool: PgPool,
    opts: PgConnectOptions,
    pub schema: String,
    pub endpoint: String,
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
    pub partition: i32,
    pub offset: i64,
    /// The dedup key: the producer's event id, from the header.
    pub decoded: std::result::Result<Decoded, String>,
    /// Raw header value, kept for the dead-letter row.
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
}

impl Store {
    /// Connects, creates the run's schema and applies the migrations in it.
    pub async fn open(url: &str, schema: &str, max_connections: u32) -> Result<Self> {
        let endpoint = db_endpoint(url);
        let unreachable = |cause: String| Error::DatabaseUnreachable {
            endpoint: endpoint.clone(),
            cause,
        };
        let base = PgConnectOptions::from_str(url)
            .map_err(|e| unreachable(crate::infra::redact(&e.to_string())))?;
        let base = base.log_statements(tracing::log::LevelFilter::Trace);
        let mut admin = tokio::time::timeout(CONNECT_TIMEOUT, base.connect())
            .await
            .map_err(|_| unreachable(format!("no answer within {}s", CONNECT_TIMEOUT.as_secs())))?
            .map_err(|e| unreachable(crate::infra::redact(&e.to_string())))?;
        sqlx::query(&format!("CREATE SCHEMA IF NOT EXISTS \"{schema}\""))
            .execute(&mut admin)
            .await
            .map_err(|e| Error::db(format!("creating schema {schema}"), e))?;
        let _ = admin.close().await;
        let opts = base.options([("search_path", schema)]);
        let pool = PgPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(Duration::from_secs(15))
            .connect_with(opts.clone())
            .await
            .map_err(|e| unreachable(crate::infra::redact(&e.to_string())))?;
        sqlx::migrate!("migrations/postgres")
            .run(&pool)
            .await
            .map_err(|e| Error::Database {
                context: format!("migrating schema {schema}"),
                cause: e.to_string(),
            })?;
        Ok(Self {
            pool,
            opts,
            schema: schema.to_string(),
            endpoint,
        })
    }

    pub async fn close(&self) {
        self.pool.close().await;
    }

    /// A connection of the relay's own, outside the pool.
    pub async fn relay_connection(&self) -> Result<RelayConn> {
        let conn = tokio::time::timeout(CONNECT_TIMEOUT, self.opts.connect())
            .await
            .map_err(|_| Error::DatabaseUnreachable {
                endpoint: self.endpoint.clone(),
                cause: "connect timed out".into(),
            })?
            .map_err(|e| Error::db("opening a relay connection", e))?;
        Ok(RelayConn { conn })
    }

    /// Transaction 1 of a payment: the payment row and its `authorized` event.
    pub async fn authorize(&self, p: &NewPayment) -> Result<()> {
        let mut tx = self
            .pool
            .begin()
            .await
            .map_err(|e| Error::db("beginning authorize", e))?;
        sqlx::query("INSERT INTO payments (id, account_id, amount_cents, status) VALUES ($1, $2, $3, 'authorized')")
            .bind(p.id)
            .bind(p.account_id)
            .bind(p.amount_cents)
            .execute(&mut *tx)
            .await
            .map_err(|e| Error::db("inserting a payment", e))?;
        insert_outbox(&mut tx, p, EventKind::Authorized, None).await?;
        tx.commit()
            .await
            .map_err(|e| Error::db("committing authorize", e))
    }

    /// Transaction 2: mark captured and write `captured` (plus, when the poison
    /// fault fired, a malformed event beside it).
    pub async fn capture(&self, p: &NewPayment, poison: bool) -> Result<()> {
        let mut tx = self
            .pool
            .begin()
            .await
            .map_err(|e| Error::db("beginning capture", e))?;
        sqlx::query("UPDATE payments SET status = 'captured', updated_at = clock_timestamp() WHERE id = $1 AND status = 'authorized'")
            .bind(p.id)
            .execute(&mut *tx)
            .await
            .map_err(|e| Error::db("capturing a payment", e))?;
        insert_outbox(&mut tx, p, EventKind::Captured, None).await?;
        if poison {
            insert_outbox(
                &mut tx,
                p,
                EventKind::Captured,
                Some(events::poison_payload()),
            )
            .await?;
        }
        tx.commit()
            .await
            .map_err(|e| Error::db("committing capture", e))
    }

    /// One notifier transaction over a micro-batch: inbox claims, effects for
    /// what was claimed, dead letters. The caller commits offsets only after
    /// this returns Ok.
    pub async fn apply_batch(&self, batch: &[Incoming], mode: InboxMode) -> Result<BatchOutcome> {
        let mut out = BatchOutcome::default();
        let mut tx = self
            .pool
            .begin()
            .await
            .map_err(|e| Error::db("beginning a notifier batch", e))?;

        let (good, bad): (Vec<&Incoming>, Vec<&Incoming>) =
            batch.iter().partition(|m| m.decoded.is_ok());
        if !bad.is_empty() {
            let mut ids = Vec::new();
            let mut parts = Vec::new();
            let mut offs = Vec::new();
            let mut payloads = Vec::new();
            let mut errors = Vec::new();
            for m in &bad {
                ids.push(
                    m.raw_event_id
                        .clone()
                        .unwrap_or_else(|| format!("p{}-o{}", m.partition, m.offset)),
                );
                parts.push(m.partition);
                offs.push(m.offset);
                payloads.push(m.raw_payload.clone());
                errors.push(m.decoded.as_ref().err().cloned().unwrap_or_default());
            }
            let r = sqlx::query(
                "INSERT INTO dead_letters (message_id, topic_partition, topic_offset, payload, error) \
                 SELECT * FROM UNNEST($1::text[], $2::int[], $3::bigint[], $4::text[], $5::text[]) \
                 ON CONFLICT (message_id) DO NOTHING",
            )
            .bind(&ids)
            .bind(&parts)
            .bind(&offs)
            .bind(&payloads)
            .bind(&errors)
            .execute(&mut *tx)
            .await
            .map_err(|e| Error::db("writing dead letters", e))?;
            out.dead_lettered = r.rows_affected();
        }

        let events: Vec<&Decoded> = good
            .iter()
            .filter_map(|m| m.decoded.as_ref().ok())
            .collect();
        // Which (event, handler) pairs this transaction may act on.
        let claimed: HashSet<(Uuid, &str)> = match mode {
            InboxMode::Off => events
                .iter()
                .flat_map(|e| handlers_for(e.kind).iter().map(move |h| (e.event_id, *h)))
                .collect(),
            InboxMode::On => {
                let mut ids = Vec::new();
                let mut hs = Vec::new();
                for e in &events {
                    for h in handlers_for(e.kind) {
                        ids.push(e.event_id);
                        hs.push(h.to_string());
                    }
                }
                let rows = sqlx::query(
                    "INSERT INTO inbox (message_id, handler) SELECT * FROM UNNEST($1::uuid[], $2::text[]) \
                     ON CONFLICT DO NOTHING RETURNING message_id, handler",
                )
                .bind(&ids)
                .bind(&hs)
                .fetch_all(&mut *tx)
                .await
                .map_err(|e| Error::db("claiming inbox rows", e))?;
                let mut set = HashSet::new();
                for r in rows {
                    let id: Uuid = r.get(0);
                    let h: String = r.get(1);
                    let h = HANDLERS
                        .iter()
                        .find(|x| **x == h)
                        .copied()
                        .unwrap_or(HANDLER_PROJECTION);
                    set.insert((id, h));
                }
                set
            }
        };

        // With the inbox off the same event may sit twice in one batch and
        // must take effect twice: that is the bug being demonstrated. With it
        // on, a pair claimed once applies once.
        let mut applied_once: HashSet<(Uuid, &str)> = HashSet::new();
        let mut may_apply = |id: Uuid, h: &'static str| -> bool {
            match mode {
                InboxMode::Off => true,
                InboxMode::On => claimed.contains(&(id, h)) && applied_once.insert((id, h)),
            }
        };

        let mut receipt_payments = Vec::new();
        let mut receipt_messages = Vec::new();
        let mut loyalty: BTreeMap<i32, i64> = BTreeMap::new();
        for e in &events {
            let mut any = false;
            if may_apply(e.event_id, HANDLER_PROJECTION) {
                any = true;
                // State-based: only ever moves forward, so a replayed
                // `authorized` cannot undo a `captured`.
                let r = sqlx::query(
                    "INSERT INTO payment_projection (payment_id, status) VALUES ($1, $2) \
                     ON CONFLICT (payment_id) DO UPDATE SET status = EXCLUDED.status, updated_at = clock_timestamp() \
                     WHERE payment_projection.status = 'authorized' AND EXCLUDED.status = 'captured'",
                )
                .bind(e.body.payment_id)
                .bind(e.kind.status())
                .execute(&mut *tx)
                .await
                .map_err(|err| Error::db("updating the projection", err))?;
                if r.rows_affected() == 0 {
                    out.stale += 1;
                }
            }
            if e.kind == EventKind::Captured {
                if may_apply(e.event_id, HANDLER_RECEIPTS) {
                    any = true;
                    receipt_payments.push(e.body.payment_id);
                    receipt_messages.push(e.event_id);
                }
                if may_apply(e.event_id, HANDLER_LOYALTY) {
                    any = true;
                    *loyalty.entry(e.body.account_id).or_default() += e.body.amount_cents;
                }
            }
            if any {
                out.applied += 1;
            } else {
                out.duplicates += 1;
            }
        }
        if !receipt_payments.is_empty() {
            sqlx::query("INSERT INTO receipts (payment_id, message_id) SELECT * FROM UNNEST($1::uuid[], $2::uuid[])")
                .bind(&receipt_payments)
                .bind(&receipt_messages)
                .execute(&mut *tx)
                .await
                .map_err(|e| Error::db("sending receipts", e))?;
        }
        if !loyalty.is_empty() {
            // Sorted by account (BTreeMap), so concurrent notifiers lock rows
            // in the same order and cannot deadlock each other.
            let accounts: Vec<i32> = loyalty.keys().copied().collect();
            let points: Vec<i64> = loyalty.values().copied().collect();
            sqlx::query(
                "INSERT INTO loyalty_points (account_id, points) SELECT * FROM UNNEST($1::int[], $2::bigint[]) \
                 ON CONFLICT (account_id) DO UPDATE SET points = loyalty_points.points + EXCLUDED.points",
            )
            .bind(&accounts)
            .bind(&points)
            .execute(&mut *tx)
            .await
            .map_err(|e| Error::db("adding loyalty points", e))?;
        }
        tx.commit()
            .await
            .map_err(|e| Error::db("committing a notifier batch", e))?;
        Ok(out)
    }

    pub async fn unpublished(&self) -> Result<i64> {
        sqlx::query_scalar("SELECT count(*) FROM outbox WHERE published_at IS NULL")
            .fetch_one(&self.pool)
            .await
            .map_err(|e| Error::db("counting unpublished outbox rows", e))
    }

    /// Deletes published outbox rows and inbox rows older than their
    /// retention, in chunks of [`PURGE_CHUNK`]. Returns (outbox, inbox) rows.
    pub async fn purge(&self, outbox_older: Duration, inbox_older: Duration) -> Result<(u64, u64)> {
        let mut outbox = 0;
        loop {
            let n = sqlx::query(
                "DELETE FROM outbox WHERE id IN (SELECT id FROM outbox WHERE published_at IS NOT NULL \
                 AND published_at < clock_timestamp() - make_interval(secs => $1) LIMIT $2)",
            )
            .bind(outbox_older.as_secs_f64())
            .bind(PURGE_CHUNK)
            .execute(&self.pool)
            .await
            .map_err(|e| Error::db("purging the outbox", e))?
            .rows_affected();
            outbox += n;
            if (n as i64) < PURGE_CHUNK {
                break;
            }
        }
        let mut inbox = 0;
        loop {
            let n = sqlx::query(
                "DELETE FROM inbox WHERE ctid IN (SELECT ctid FROM inbox \
                 WHERE processed_at < clock_timestamp() - make_interval(secs => $1) LIMIT $2)",
            )
            .bind(inbox_older.as_secs_f64())
            .bind(PURGE_CHUNK)
            .execute(&self.pool)
            .await
            .map_err(|e| Error::db("purging the inbox", e))?
            .rows_affected();
            inbox += n;
            if (n as i64) < PURGE_CHUNK {
                break;
            }
        }
        Ok((outbox, inbox))
    }

    /// Reads the database side of the ground truth for the verifier.
    pub async fn ground_truth(&self) -> Result<DbTruth> {
        let ctx =
            |what: &'static str| move |e| Error::db(format!("reading {what} for the verifier"), e);
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
        let outbox = sqlx::query("SELECT id, aggregate_id, event_type, payload::text, published_at IS NOT NULL FROM outbox")
            .fetch_all(&self.pool)
            .await
            .map_err(ctx("the outbox"))?
            .into_iter()
            .map(|r| {
                let id: Uuid = r.get(0);
                let t: String = r.get(2);
                let payload: String = r.get(3);
                let kind = EventKind::from_type(&t)
                    .filter(|_| serde_json::from_str::<PaymentEvent>(&payload).is_ok());
                OutboxRecord { id, payment_id: r.get(1), kind, published: r.get(4) }
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
        Ok(DbTruth {
            payments,
            outbox,
            inbox_rows,
            receipts,
            projection,
            dead_letters: dead_letters as u64,
            loyalty,
        })
    }
}

async fn insert_outbox(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    p: &NewPayment,
    kind: EventKind,
    payload: Option<serde_json::Value>,
) -> Result<()> {
    let payload = payload.unwrap_or_else(|| {
        serde_json::to_value(PaymentEvent {
            payment_id: p.id,
            account_id: p.account_id,
            amount_cents: p.amount_cents,
        })
        .unwrap_or_default()
    });
    sqlx::query(
        "INSERT INTO outbox (id, aggregate_id, event_type, payload) VALUES ($1, $2, $3, $4)",
    )
    .bind(Uuid::new_v4())
    .bind(p.id)
    .bind(kind.event_type())
    .bind(payload)
    .execute(&mut **tx)
    .await
    .map_err(|e| Error::db("writing an outbox event", e))?;
    Ok(())
}

/// A relay's private connection. Transactions are driven by hand (BEGIN …
/// COMMIT) so that [`RelayConn::crash`] can drop the socket mid-transaction,
/// exactly as a killed process would: no ROLLBACK is ever sent.
pub struct RelayConn {
    conn: PgConnection,
}

impl RelayConn {
    /// Opens a transaction and claims up to `n` unpublished rows.
    ///
    /// `FOR UPDATE SKIP LOCKED`, with the lock held across the publish: two
    /// relays never hold the same rows, and when a relay dies its transaction
    /// dies with it, so the rows are claimable again at once. A lease column
    /// would leave them stuck until the lease expired.
    pub async fn claim(&mut self, n: usize) -> Result<Vec<OutboxRow>> {
        sqlx::query("BEGIN")
            .execute(&mut self.conn)
            .await
            .map_err(|e| Error::db("beginning a relay claim", e))?;
        let rows = sqlx::query(
            "SELECT id, seq, aggregate_id, event_type, payload::text FROM outbox \
             WHERE published_at IS NULL ORDER BY seq LIMIT $1 FOR UPDATE SKIP LOCKED",
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

    /// Marks the claimed rows published and commits the claim.
    pub async fn mark_published(&mut self, ids: &[Uuid]) -> Result<()> {
        if !ids.is_empty() {
            sqlx::query("UPDATE outbox SET published_at = clock_timestamp() WHERE id = ANY($1)")
                .bind(ids)
                .execute(&mut self.conn)
                .await
                .map_err(|e| Error::db("marking outbox rows published", e))?;
        }
        sqlx::query("COMMIT")
            .execute(&mut self.conn)
            .await
            .map_err(|e| Error::db("committing a relay batch", e))?;
        Ok(())
    }

    /// Gives the rows back after a produce error (a controlled failure, not a crash).
    pub async fn release(&mut self) -> Result<()> {
        sqlx::query("ROLLBACK")
            .execute(&mut self.conn)
            .await
            .map_err(|e| Error::db("releasing a relay claim", e))?;
        Ok(())
    }

    /// The crash: drop the connection with its transaction open.
    pub fn crash(self) {
        drop(self.conn);
    }
}

/// One payment row, as the verifier sees it.
#[derive(Debug, Clone)]
pub struct PaymentRow {
    pub id: Uuid,
    pub account_id: i32,
    pub amount_cents: i64,
    pub captured: bool,
}

/// One outbox row, as the verifier sees it. `kind` is None for a malformed
/// (poison) event.
#[derive(Debug, Clone)]
pub struct OutboxRecord {
    pub id: Uuid,
    pub payment_id: Uuid,
    pub kind: Option<EventKind>,
    pub published: bool,
}

/// The database half of the ground truth.
#[derive(Debug, Default, Clone)]
pub struct DbTruth {
    pub payments: Vec<PaymentRow>,
    pub outbox: Vec<OutboxRecord>,
    pub inbox_rows: HashMap<String, u64>,
    pub receipts: HashMap<Uuid, u64>,
    /// payment id → projection shows captured.
    pub projection: HashMap<Uuid, bool>,
    pub dead_letters: u64,
    pub loyalty: HashMap<i32, i64>,
}
