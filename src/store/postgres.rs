//! The PostgreSQL backend: every SQL statement of the pipeline and of the
//! verifier. The schema lives in `migrations/postgres/`. Multi-row statements
//! use `UNNEST` over arrays, so a micro-batch costs a handful of round trips.
//!
//! Relays get a connection of their own (see [`PgRelayConn`]) so that a crash
//! can be a real one: the socket closes mid-transaction and the server rolls
//! back.

use super::{dead_letter_key, EffectPlan, Incoming, NewPayment, OutboxRow, HANDLERS, PURGE_CHUNK};
use crate::domain::events::{EventKind, PaymentEvent};
use crate::domain::names::CONNECT_TIMEOUT;
use crate::error::db_endpoint;
use crate::error::{Error, Result};
use crate::scenario::ProjectionMode;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, Row};
use std::collections::HashSet;
use std::str::FromStr;
use std::time::Duration;
use uuid::Uuid;

/// A run's PostgreSQL database: a pool scoped to the run's schema.
#[derive(Clone)]
pub struct PgStore {
    pool: PgPool,
    opts: PgConnectOptions,
    pub schema: String,
    pub endpoint: String,
    /// `store.commit_refused` at this component's commits.
    pub(super) gate: super::CommitGate,
}

impl PgStore {
    /// Connects, creates the run's schema and applies the migrations in it.
    pub async fn open(url: &str, schema: &str, max_connections: u32) -> Result<Self> {
        Self::connect(url, schema, max_connections, true, None).await
    }

    /// Connects and creates the run's schema, empty: a declared system
    /// brings its own tables, which ours must not stand beside (a user's
    /// `inbox` or `outbox` would clash).
    pub async fn open_empty(url: &str, schema: &str, max_connections: u32) -> Result<Self> {
        let store = Self::connect(url, schema, max_connections, false, None).await?;
        // search_path is resolved at each statement, so the pool's sessions
        // see the schema once it exists.
        sqlx::query(&format!("CREATE SCHEMA IF NOT EXISTS \"{schema}\""))
            .execute(&store.pool)
            .await
            .map_err(|e| Error::db(format!("creating schema {schema}"), e))?;
        Ok(store)
    }

    /// The pool, for a declared system's reads ([`super::declared`]).
    pub(super) fn conn_pool(&self) -> &PgPool {
        &self.pool
    }

    /// Connects to a run's schema that the run has already made: a
    /// component process, which may restart hundreds of times a run, skips
    /// the schema and the migrations every restart would otherwise repeat.
    pub async fn attach(url: &str, schema: &str, max_connections: u32) -> Result<Self> {
        Self::connect(url, schema, max_connections, false, None).await
    }

    /// [`PgStore::attach`] with the sessions named `name`: a component
    /// behind the fault proxy, reaching the run's schema through its port.
    pub async fn attach_as(url: &str, schema: &str, max_connections: u32, name: &str) -> Result<Self> {
        Self::connect(url, schema, max_connections, false, Some(name)).await
    }

    /// A pool of its own on the same database for one component, its
    /// sessions named `name` (so that the nemesis's
    /// `db.terminate_backends` finds them and spares the harness's own).
    pub async fn for_component(&self, name: &str, max_connections: u32) -> Result<Self> {
        let opts = self.opts.clone().application_name(name);
        let pool = Self::pool(&opts, max_connections, &self.endpoint).await?;
        Ok(Self { pool, opts, schema: self.schema.clone(), endpoint: self.endpoint.clone(), gate: self.gate.clone() })
    }

    /// The same database through a new pool: after a restart or
    /// terminated sessions the old pool's connections are dead, and the
    /// verifier must not meet them.
    pub async fn fresh(&self, max_connections: u32) -> Result<Self> {
        let pool = Self::pool(&self.opts, max_connections, &self.endpoint).await?;
        Ok(Self { pool, ..self.clone() })
    }

    async fn pool(opts: &PgConnectOptions, max_connections: u32, endpoint: &str) -> Result<PgPool> {
        PgPoolOptions::new()
            .max_connections(max_connections)
            // No ping before each checkout: it is one more round trip per
            // transaction, and a dead connection shows up anyway as the
            // transaction's error, which every caller already handles.
            .test_before_acquire(false)
            .acquire_timeout(Duration::from_secs(15))
            .connect_with(opts.clone())
            .await
            .map_err(|e| Error::DatabaseUnreachable {
                endpoint: endpoint.to_string(),
                cause: crate::error::redact(&e.to_string()),
            })
    }

    async fn connect(url: &str, schema: &str, max_connections: u32, create: bool, name: Option<&str>) -> Result<Self> {
        let endpoint = db_endpoint(url);
        let unreachable = |cause: String| Error::DatabaseUnreachable { endpoint: endpoint.clone(), cause };
        let base = PgConnectOptions::from_str(url).map_err(|e| unreachable(crate::error::redact(&e.to_string())))?;
        let mut base = base.log_statements(tracing::log::LevelFilter::Trace);
        // The harness's sessions carry the run's schema as their name; a
        // component's carry its own (`chaos-<run id>-<component>`, from
        // `name` or, in a component process, PGAPPNAME), which is what the
        // nemesis's `db.terminate_backends` looks for.
        match name {
            Some(n) => base = base.application_name(n),
            None if std::env::var_os("PGAPPNAME").is_none() => base = base.application_name(schema),
            None => {}
        }
        if create {
            Self::create_schema(&base, schema, &endpoint).await?;
        }
        let opts = base.options([("search_path", schema)]);
        let pool = Self::pool(&opts, max_connections, &endpoint).await?;
        if create {
            sqlx::migrate!("migrations/postgres")
                .run(&pool)
                .await
                .map_err(|e| Error::Database { context: format!("migrating schema {schema}"), cause: e.to_string() })?;
        }
        Ok(Self { pool, opts, schema: schema.to_string(), endpoint, gate: Default::default() })
    }

    async fn create_schema(base: &PgConnectOptions, schema: &str, endpoint: &str) -> Result<()> {
        let unreachable = |cause: String| Error::DatabaseUnreachable { endpoint: endpoint.to_string(), cause };
        let mut admin = tokio::time::timeout(CONNECT_TIMEOUT, base.connect())
            .await
            .map_err(|_| unreachable(format!("no answer within {}s", CONNECT_TIMEOUT.as_secs())))?
            .map_err(|e| unreachable(crate::error::redact(&e.to_string())))?;
        sqlx::query(&format!("CREATE SCHEMA IF NOT EXISTS \"{schema}\""))
            .execute(&mut admin)
            .await
            .map_err(|e| Error::db(format!("creating schema {schema}"), e))?;
        let _ = admin.close().await;
        Ok(())
    }

    /// Sessions open under an application name: a program under test's
    /// process names its sessions by `PGAPPNAME`, so the harness can see
    /// them end with it.
    pub async fn sessions(&self, application_name: &str) -> Result<i64> {
        Ok(self.session_activity(application_name).await?.0)
    }

    /// A process's sessions, and how many of them are inside a transaction
    /// (`xact_start` set: a `BEGIN` not yet ended, or a statement running).
    pub async fn session_activity(&self, application_name: &str) -> Result<(i64, i64)> {
        sqlx::query_as("SELECT count(*), count(xact_start) FROM pg_stat_activity WHERE application_name = $1")
            .bind(application_name)
            .fetch_one(&self.pool)
            .await
            .map_err(|e| Error::db("counting a process's sessions", e))
    }

    /// When the postmaster started: it moves when PostgreSQL restarts.
    pub async fn postmaster_started(&self) -> Result<String> {
        sqlx::query_scalar("SELECT pg_postmaster_start_time()::text")
            .fetch_one(&self.pool)
            .await
            .map_err(|e| Error::db("reading the postmaster's start time", e))
    }

    /// How many sessions of the run's components are open.
    pub async fn run_sessions(&self, run_id: &str) -> Result<i64> {
        sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE $1")
            .bind(format!("chaos-{run_id}-%"))
            .fetch_one(&self.pool)
            .await
            .map_err(|e| Error::db("counting the run's sessions", e))
    }

    /// Terminates every session of the run's components, in process
    /// (their own pools) or as processes, all named `chaos-<run id>-…`;
    /// the harness's own sessions (named by the schema) are spared.
    /// Returns how many were terminated.
    pub async fn terminate_run_sessions(&self, run_id: &str) -> Result<i64> {
        sqlx::query_scalar(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE application_name LIKE $1 AND pid <> pg_backend_pid()",
        )
        .bind(format!("chaos-{run_id}-%"))
        .fetch_one(&self.pool)
        .await
        .map_err(|e| Error::db("terminating the run's sessions", e))
    }

    /// Drops the replication slots and publications named after the run's
    /// schema: a change-data-capture relay's (Debezium's connector names
    /// both so). A slot left behind holds back the write-ahead log for
    /// ever. Returns what was dropped.
    pub async fn drop_replication(&self) -> Result<Vec<String>> {
        let mut c = self.pool.acquire().await.map_err(|e| Error::db("dropping the run's replication slots", e))?;
        let schema = self.schema.clone();
        drop_replication_where(&mut c, |name| name.starts_with(&schema)).await
    }

    /// What those sessions are doing, for a message about one that
    /// outlived its process.
    pub async fn session_states(&self, application_name: &str) -> Result<String> {
        let rows: Vec<(Option<String>, Option<String>, Option<String>)> = sqlx::query_as(
            "SELECT state, wait_event_type || ':' || wait_event, left(query, 80) FROM pg_stat_activity \
             WHERE application_name = $1",
        )
        .bind(application_name)
        .fetch_all(&self.pool)
        .await
        .map_err(|e| Error::db("reading a process's sessions", e))?;
        Ok(rows.iter().map(|r| format!("{:?}", r)).collect::<Vec<_>>().join("; "))
    }
}

/// Drops every replication slot and publication whose name `chosen`
/// picks, ending the walsender that still holds a slot. A slot whose
/// holder was just killed may show active for a moment: each is tried for
/// up to 10 s.
pub async fn drop_replication_where(c: &mut sqlx::PgConnection, chosen: impl Fn(&str) -> bool) -> Result<Vec<String>> {
    let slots: Vec<String> =
        sqlx::query_scalar("SELECT slot_name::text FROM pg_replication_slots WHERE slot_name LIKE 'chaos%'")
            .fetch_all(&mut *c)
            .await
            .map_err(|e| Error::db("listing replication slots", e))?;
    let mut dropped = Vec::new();
    for slot in slots.into_iter().filter(|s| chosen(s)) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let _ = sqlx::query(
                "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots \
                 WHERE slot_name = $1 AND active_pid IS NOT NULL",
            )
            .bind(&slot)
            .execute(&mut *c)
            .await;
            match sqlx::query("SELECT pg_drop_replication_slot($1)").bind(&slot).execute(&mut *c).await {
                Ok(_) => break,
                Err(e) if std::time::Instant::now() >= deadline => {
                    return Err(Error::db(format!("dropping replication slot {slot}"), e))
                }
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(200)).await,
            }
        }
        dropped.push(format!("slot {slot}"));
    }
    let publications: Vec<String> =
        sqlx::query_scalar("SELECT pubname::text FROM pg_publication WHERE pubname LIKE 'chaos%'")
            .fetch_all(&mut *c)
            .await
            .map_err(|e| Error::db("listing publications", e))?;
    for p in publications.into_iter().filter(|p| chosen(p)) {
        sqlx::query(&format!("DROP PUBLICATION IF EXISTS \"{}\"", p.replace('"', "\"\"")))
            .execute(&mut *c)
            .await
            .map_err(|e| Error::db(format!("dropping publication {p}"), e))?;
        dropped.push(format!("publication {p}"));
    }
    Ok(dropped)
}

impl super::Backend for PgStore {
    type Tx = PgTx;
    type RelayConn = PgRelayConn;

    async fn close(&self) {
        self.pool.close().await;
    }

    /// A connection of the relay's own, outside the pool.
    async fn relay_connection(&self) -> Result<PgRelayConn> {
        let conn = tokio::time::timeout(CONNECT_TIMEOUT, self.opts.connect())
            .await
            .map_err(|_| Error::DatabaseUnreachable {
                endpoint: self.endpoint.clone(),
                cause: "connect timed out".into(),
            })?
            .map_err(|e| Error::db("opening a relay connection", e))?;
        Ok(PgRelayConn { conn, held: Default::default(), gate: self.gate.clone() })
    }

    /// Transaction 1 of a payment: the payment row and its `authorized` event.
    async fn authorize(&self, ps: &[NewPayment], outbox: bool) -> Result<()> {
        let mut tx = self.pool.begin().await.map_err(|e| Error::db("beginning authorize", e))?;
        let ids: Vec<Uuid> = ps.iter().map(|p| p.id).collect();
        let accounts: Vec<i32> = ps.iter().map(|p| p.account_id).collect();
        let amounts: Vec<i64> = ps.iter().map(|p| p.amount_cents).collect();
        sqlx::query(
            "INSERT INTO payments (id, account_id, amount_cents, status) \
             SELECT *, 'authorized' FROM UNNEST($1::uuid[], $2::int[], $3::bigint[])",
        )
        .bind(&ids)
        .bind(&accounts)
        .bind(&amounts)
        .execute(&mut *tx)
        .await
        .map_err(|e| Error::db("inserting payments", e))?;
        if outbox {
            let events: Vec<(&NewPayment, EventKind, Option<serde_json::Value>)> =
                ps.iter().map(|p| (p, EventKind::Authorized, None)).collect();
            insert_outbox(&mut tx, &events).await?;
        }
        self.gate.commit(tx, "authorize").await
    }

    /// Transaction 2: mark captured and write `captured` (plus, where the
    /// poison fault fired, a malformed event beside it).
    async fn capture(&self, ps: &[(NewPayment, bool)], outbox: bool) -> Result<()> {
        let mut tx = self.pool.begin().await.map_err(|e| Error::db("beginning capture", e))?;
        let ids: Vec<Uuid> = ps.iter().map(|(p, _)| p.id).collect();
        let changed: HashSet<Uuid> = sqlx::query_scalar(
            "UPDATE payments SET status = 'captured', updated_at = clock_timestamp() \
             WHERE id = ANY($1) AND status = 'authorized' RETURNING id",
        )
        .bind(&ids)
        .fetch_all(&mut *tx)
        .await
        .map_err(|e| Error::db("capturing payments", e))?
        .into_iter()
        .collect();
        if outbox {
            let fresh = super::newly_captured(ps, &changed);
            let events = super::captured_events(&fresh);
            insert_outbox(&mut tx, &events).await?;
        }
        self.gate.commit(tx, "capture").await
    }

    async fn begin(&self) -> Result<PgTx> {
        self.pool.begin().await.map_err(|e| Error::db("beginning a notifier transaction", e))
    }

    /// The check of the check-then-act variant: which pairs are already in
    /// its unkeyed inbox. Runs outside any transaction, as the mistake does.
    async fn unkeyed_seen(&self, pairs: &[(Uuid, &'static str)]) -> Result<HashSet<(Uuid, &'static str)>> {
        let (ids, hs): (Vec<Uuid>, Vec<String>) = pairs.iter().map(|(i, h)| (*i, h.to_string())).unzip();
        let rows = sqlx::query(
            "SELECT DISTINCT u.message_id, u.handler FROM inbox_unkeyed u \
             JOIN UNNEST($1::uuid[], $2::text[]) AS p(message_id, handler) USING (message_id, handler)",
        )
        .bind(&ids)
        .bind(&hs)
        .fetch_all(&self.pool)
        .await
        .map_err(|e| Error::db("checking the unkeyed inbox", e))?;
        Ok(rows.into_iter().filter_map(|r| known_pair(r.get(0), &r.get::<String, _>(1))).collect())
    }

    /// The act's bookkeeping of the check-then-act variant, after the effects.
    async fn unkeyed_record(&self, pairs: &[(Uuid, &'static str)]) -> Result<()> {
        let (ids, hs): (Vec<Uuid>, Vec<String>) = pairs.iter().map(|(i, h)| (*i, h.to_string())).unzip();
        sqlx::query("INSERT INTO inbox_unkeyed (message_id, handler) SELECT * FROM UNNEST($1::uuid[], $2::text[])")
            .bind(&ids)
            .bind(&hs)
            .execute(&self.pool)
            .await
            .map_err(|e| Error::db("recording in the unkeyed inbox", e))?;
        Ok(())
    }

    /// Deletes published outbox rows and inbox rows older than their
    /// retention, in chunks of [`PURGE_CHUNK`]. Returns (outbox, inbox) rows.
    ///
    /// Both scans must walk the timestamp index, oldest first. The cutoff is
    /// `now()`: a volatile `clock_timestamp()` cannot bound an index scan.
    /// The `ORDER BY` keeps the planner on the index while the tables grow
    /// faster than their statistics. Without the two, every purge read the
    /// whole outbox and inbox: 60 ms and 40 ms per purge, once a second, at
    /// 100,000 payments on the bench scenario, deleting nothing.
    async fn purge(&self, outbox_older: Duration, inbox_older: Duration) -> Result<(u64, u64)> {
        let mut outbox = 0;
        loop {
            let n = sqlx::query(
                "DELETE FROM outbox WHERE id IN (SELECT id FROM outbox WHERE published_at IS NOT NULL \
                 AND published_at < now() - make_interval(secs => $1) ORDER BY published_at LIMIT $2)",
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
                 WHERE processed_at < now() - make_interval(secs => $1) ORDER BY processed_at LIMIT $2)",
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
        let n: i64 =
            sqlx::query_scalar("SELECT count(*) FROM payments WHERE id = ANY($1) AND (NOT $2 OR status = 'captured')")
                .bind(ids)
                .bind(captured)
                .fetch_one(&self.pool)
                .await
                .map_err(|e| Error::db("looking payments up by id", e))?;
        Ok(n as usize)
    }
}

/// The verifier's statements in this backend's SQL.
const DIALECT: super::truth::Dialect = super::truth::Dialect {
    outbox: "SELECT id, aggregate_id, event_type, payload::text, published_at IS NOT NULL, \
             round(extract(epoch FROM created_at) * 1000)::bigint FROM outbox",
    latency: "SELECT round(extract(epoch FROM i.processed_at - o.created_at) * 1000)::bigint \
             FROM inbox i JOIN outbox o ON o.id = i.message_id WHERE i.handler = 'projection'",
    traces: "SELECT id, round(extract(epoch FROM greatest(created_at, updated_at)) * 1000)::bigint FROM payments \
             UNION ALL SELECT payment_id, round(extract(epoch FROM sent_at) * 1000)::bigint FROM receipts \
             UNION ALL SELECT payment_id, round(extract(epoch FROM updated_at) * 1000)::bigint FROM payment_projection \
             UNION ALL SELECT id, round(extract(epoch FROM published_at) * 1000)::bigint FROM outbox \
                 WHERE published_at IS NOT NULL \
             UNION ALL SELECT message_id, round(extract(epoch FROM processed_at) * 1000)::bigint FROM inbox \
             UNION ALL SELECT message_id, round(extract(epoch FROM processed_at) * 1000)::bigint FROM inbox_unkeyed",
    // An inbox claim joins its outbox row for the payment: a claim under
    // an id no outbox row has (the consumer-made id) belongs to no story.
    story: "SELECT id, 'payment', 'payment written', NULL::uuid, round(extract(epoch FROM created_at) * 1000)::bigint, NULL::bigint FROM payments \
            UNION ALL SELECT id, 'payment', 'payment captured', NULL::uuid, round(extract(epoch FROM updated_at) * 1000)::bigint, NULL::bigint FROM payments \
              WHERE status = 'captured' \
            UNION ALL SELECT aggregate_id, 'outbox', event_type || ' row created', id, round(extract(epoch FROM created_at) * 1000)::bigint, seq FROM outbox \
            UNION ALL SELECT aggregate_id, 'outbox', event_type || ' row published', id, round(extract(epoch FROM published_at) * 1000)::bigint, seq \
              FROM outbox WHERE published_at IS NOT NULL \
            UNION ALL SELECT o.aggregate_id, 'inbox', 'inbox claim: ' || i.handler, i.message_id, round(extract(epoch FROM i.processed_at) * 1000)::bigint, NULL::bigint \
              FROM inbox i JOIN outbox o ON o.id = i.message_id \
            UNION ALL SELECT o.aggregate_id, 'inbox', 'inbox record: ' || i.handler, i.message_id, round(extract(epoch FROM i.processed_at) * 1000)::bigint, NULL::bigint \
              FROM inbox_unkeyed i JOIN outbox o ON o.id = i.message_id \
            UNION ALL SELECT payment_id, 'effect', 'receipt sent', message_id, round(extract(epoch FROM sent_at) * 1000)::bigint, NULL::bigint FROM receipts \
            UNION ALL SELECT payment_id, 'effect', 'projection: ' || status, event_id, round(extract(epoch FROM updated_at) * 1000)::bigint, NULL::bigint \
              FROM payment_projection",
};

/// A notifier transaction on PostgreSQL.
pub type PgTx = sqlx::Transaction<'static, sqlx::Postgres>;

fn known_pair(id: Uuid, handler: &str) -> Option<(Uuid, &'static str)> {
    HANDLERS.iter().find(|h| **h == handler).map(|h| (id, *h))
}

/// Records malformed messages, once each. Returns the rows written.
pub async fn dead_letters(tx: &mut PgTx, bad: &[&Incoming]) -> Result<u64> {
    if bad.is_empty() {
        return Ok(0);
    }
    let ids: Vec<String> = bad.iter().map(|m| dead_letter_key(m)).collect();
    let (parts, offs): (Vec<i32>, Vec<i64>) = bad.iter().map(|m| m.position.as_row()).unzip();
    let payloads: Vec<String> = bad.iter().map(|m| m.raw_payload.clone()).collect();
    let errors: Vec<String> = bad.iter().map(|m| m.decoded.as_ref().err().cloned().unwrap_or_default()).collect();
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
    .execute(&mut **tx)
    .await
    .map_err(|e| Error::db("writing dead letters", e))?;
    Ok(r.rows_affected())
}

/// The inbox claim: one multi-row `INSERT … ON CONFLICT DO NOTHING
/// RETURNING`. Returns the pairs this transaction newly claimed.
pub async fn claim(tx: &mut PgTx, pairs: &[(Uuid, &'static str)]) -> Result<HashSet<(Uuid, &'static str)>> {
    if pairs.is_empty() {
        return Ok(HashSet::new());
    }
    let (ids, hs): (Vec<Uuid>, Vec<String>) = pairs.iter().map(|(i, h)| (*i, h.to_string())).unzip();
    let rows = sqlx::query(
        "INSERT INTO inbox (message_id, handler) SELECT * FROM UNNEST($1::uuid[], $2::text[]) \
         ON CONFLICT DO NOTHING RETURNING message_id, handler",
    )
    .bind(&ids)
    .bind(&hs)
    .fetch_all(&mut **tx)
    .await
    .map_err(|e| Error::db("claiming inbox rows", e))?;
    Ok(rows.into_iter().filter_map(|r| known_pair(r.get(0), &r.get::<String, _>(1))).collect())
}

/// Applies a batch's effects. Returns how many projection events the state
/// guard refused ([`super::refused_by_guard`]).
pub async fn apply(tx: &mut PgTx, plan: &EffectPlan<'_>, projection: ProjectionMode) -> Result<u64> {
    let stale = apply_projection(tx, plan, projection).await?;
    send_receipts(tx, plan).await?;
    add_loyalty_points(tx, plan).await?;
    record_loyalty_credits(tx, plan).await?;
    Ok(stale)
}

/// The projection upsert for a mode, one statement for the whole batch.
///
/// RETURNING says, per row written, whether it was a first insert (xmax
/// = 0) or an update; a payment not returned was refused. With the guard
/// an update only ever moves authorized to captured, so each payment's
/// status before the batch follows, and the refusals are counted event
/// by event exactly as on SQLite.
fn projection_sql(projection: ProjectionMode) -> &'static str {
    match projection {
        // Only ever forward, so a stale `authorized` cannot undo `captured`.
        ProjectionMode::StateGuard => {
            "INSERT INTO payment_projection (payment_id, status, event_id) \
             SELECT * FROM UNNEST($1::uuid[], $2::text[], $3::uuid[]) \
             ON CONFLICT (payment_id) DO UPDATE SET status = EXCLUDED.status, event_id = EXCLUDED.event_id, \
             updated_at = clock_timestamp() \
             WHERE payment_projection.status = 'authorized' AND EXCLUDED.status = 'captured' \
             RETURNING payment_id, xmax = 0"
        }
        ProjectionMode::LastWriteWins => {
            "INSERT INTO payment_projection (payment_id, status, event_id) \
             SELECT * FROM UNNEST($1::uuid[], $2::text[], $3::uuid[]) \
             ON CONFLICT (payment_id) DO UPDATE SET status = EXCLUDED.status, event_id = EXCLUDED.event_id, \
             updated_at = clock_timestamp() \
             RETURNING payment_id, xmax = 0"
        }
    }
}

/// Writes the batch's projection updates; returns how many events the state
/// guard refused.
async fn apply_projection(tx: &mut PgTx, plan: &EffectPlan<'_>, projection: ProjectionMode) -> Result<u64> {
    // One row per payment: what the batch's events leave behind, applied in
    // one statement (a statement may not update a row twice).
    let finals = super::final_statuses(&plan.projection, projection);
    if finals.is_empty() {
        return Ok(0);
    }
    let mut payments = Vec::with_capacity(finals.len());
    let mut statuses = Vec::with_capacity(finals.len());
    let mut causes = Vec::with_capacity(finals.len());
    for (p, (k, e)) in &finals {
        payments.push(*p);
        statuses.push(k.status());
        causes.push(*e);
    }
    let rows = sqlx::query(projection_sql(projection))
        .bind(&payments)
        .bind(&statuses)
        .bind(&causes)
        .fetch_all(&mut **tx)
        .await
        .map_err(|err| Error::db("updating the projection", err))?;
    let written: std::collections::HashMap<Uuid, bool> =
        rows.iter().map(|r| (r.get::<Uuid, _>(0), r.get::<bool, _>(1))).collect();
    Ok(super::refused_by_guard(&plan.projection, projection, |p| match written.get(&p) {
        Some(true) => None,
        Some(false) => Some(EventKind::Authorized),
        // Refused as a whole: the row already holds the furthest status.
        None => Some(EventKind::Captured),
    }))
}

async fn send_receipts(tx: &mut PgTx, plan: &EffectPlan<'_>) -> Result<()> {
    if plan.receipts.is_empty() {
        return Ok(());
    }
    let (payments, messages): (Vec<Uuid>, Vec<Uuid>) = plan.receipts.iter().copied().unzip();
    sqlx::query("INSERT INTO receipts (payment_id, message_id) SELECT * FROM UNNEST($1::uuid[], $2::uuid[])")
        .bind(&payments)
        .bind(&messages)
        .execute(&mut **tx)
        .await
        .map_err(|e| Error::db("sending receipts", e))?;
    Ok(())
}

async fn add_loyalty_points(tx: &mut PgTx, plan: &EffectPlan<'_>) -> Result<()> {
    if plan.loyalty.is_empty() {
        return Ok(());
    }
    let accounts: Vec<i32> = plan.loyalty.keys().map(|k| k.0).collect();
    let stripes: Vec<i32> = plan.loyalty.keys().map(|k| k.1).collect();
    let points: Vec<i64> = plan.loyalty.values().copied().collect();
    sqlx::query(
        "INSERT INTO loyalty_points (account_id, stripe, points) \
         SELECT * FROM UNNEST($1::int[], $2::int[], $3::bigint[]) \
         ON CONFLICT (account_id, stripe) DO UPDATE SET points = loyalty_points.points + EXCLUDED.points",
    )
    .bind(&accounts)
    .bind(&stripes)
    .bind(&points)
    .execute(&mut **tx)
    .await
    .map_err(|e| Error::db("adding loyalty points", e))?;
    Ok(())
}

/// One audit row per loyalty credit, so the verifier can trace the counter.
async fn record_loyalty_credits(tx: &mut PgTx, plan: &EffectPlan<'_>) -> Result<()> {
    if plan.credits.is_empty() {
        return Ok(());
    }
    let events: Vec<Uuid> = plan.credits.iter().map(|c| c.0).collect();
    let accounts: Vec<i32> = plan.credits.iter().map(|c| c.1).collect();
    let points: Vec<i64> = plan.credits.iter().map(|c| c.2).collect();
    sqlx::query(
        "INSERT INTO loyalty_credits (event_id, account_id, points) \
         SELECT * FROM UNNEST($1::uuid[], $2::int[], $3::bigint[])",
    )
    .bind(&events)
    .bind(&accounts)
    .bind(&points)
    .execute(&mut **tx)
    .await
    .map_err(|e| Error::db("recording loyalty credits", e))?;
    Ok(())
}

/// Writes outbox events (payment, type, payload or the payment's own) in one
/// multi-row statement.
async fn insert_outbox(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    events: &[(&NewPayment, EventKind, Option<serde_json::Value>)],
) -> Result<()> {
    let mut ids = Vec::with_capacity(events.len());
    let mut aggregates = Vec::with_capacity(events.len());
    let mut types = Vec::with_capacity(events.len());
    let mut payloads = Vec::with_capacity(events.len());
    for (p, kind, payload) in events {
        let payload = match payload {
            Some(v) => v.to_string(),
            None => serde_json::to_string(&PaymentEvent {
                payment_id: p.id,
                account_id: p.account_id,
                amount_cents: p.amount_cents,
            })
            .map_err(|e| Error::Internal(format!("encoding an event: {e}")))?,
        };
        ids.push(crate::domain::events::time_ordered_id());
        aggregates.push(p.id);
        types.push(kind.event_type());
        payloads.push(payload);
    }
    sqlx::query(
        "INSERT INTO outbox (id, aggregate_id, event_type, payload) \
         SELECT i, a, t, p::jsonb FROM UNNEST($1::uuid[], $2::uuid[], $3::text[], $4::text[]) \
         WITH ORDINALITY AS u(i, a, t, p, n) ORDER BY n",
    )
    .bind(&ids)
    .bind(&aggregates)
    .bind(&types)
    .bind(&payloads)
    .execute(&mut **tx)
    .await
    .map_err(|e| Error::db("writing outbox events", e))?;
    Ok(())
}

/// A relay's private connection. Transactions are driven by hand (BEGIN …
/// COMMIT) so that [`RelayConn::crash`] can drop the socket mid-transaction,
/// exactly as a killed process would: no ROLLBACK is ever sent.
pub struct PgRelayConn {
    conn: PgConnection,
    /// Where each claimed row lies (its `ctid`). The claim's row locks keep
    /// them there until the transaction ends, so the mark reaches each row
    /// directly instead of looking its id up in the primary key.
    held: std::collections::HashMap<Uuid, String>,
    gate: super::CommitGate,
}

impl super::RelayConnOps for PgRelayConn {
    /// Opens a transaction and claims up to `n` unpublished rows.
    ///
    /// `FOR UPDATE SKIP LOCKED`, with the lock held across the publish: two
    /// relays never hold the same rows, and when a relay dies its transaction
    /// dies with it, so the rows are claimable again at once. A lease column
    /// would leave them stuck until the lease expired.
    async fn claim(&mut self, n: usize, after: i64) -> Result<Vec<OutboxRow>> {
        sqlx::query("BEGIN").execute(&mut self.conn).await.map_err(|e| Error::db("beginning a relay claim", e))?;
        let rows = sqlx::query(
            "SELECT id, seq, aggregate_id, event_type, payload::text, ctid::text FROM outbox \
             WHERE published_at IS NULL AND seq > $2 ORDER BY seq LIMIT $1 FOR UPDATE SKIP LOCKED",
        )
        .bind(n as i64)
        .bind(after)
        .fetch_all(&mut self.conn)
        .await
        .map_err(|e| Error::db("claiming outbox rows", e))?;
        self.held = rows.iter().map(|r| (r.get(0), r.get(5))).collect();
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
    async fn mark_published(&mut self, ids: &[Uuid]) -> Result<()> {
        if !ids.is_empty() {
            // Only rows of this claim have a ctid here: nothing else is marked.
            let ctids: Vec<&str> = ids.iter().filter_map(|i| self.held.get(i).map(String::as_str)).collect();
            sqlx::query("UPDATE outbox SET published_at = clock_timestamp() WHERE ctid = ANY($1::tid[])")
                .bind(&ctids)
                .execute(&mut self.conn)
                .await
                .map_err(|e| Error::db("marking outbox rows published", e))?;
        }
        self.held.clear();
        if ids.is_empty() {
            // An empty claim wrote nothing: not a commit the gate counts.
            sqlx::query("COMMIT").execute(&mut self.conn).await.map_err(|e| Error::db("ending a relay claim", e))?;
            return Ok(());
        }
        self.gate.commit_by_hand(&mut self.conn, "a relay batch").await
    }

    /// Deletes the claimed rows and commits the claim.
    async fn delete_claimed(&mut self, ids: &[Uuid]) -> Result<()> {
        let ctids: Vec<&str> = ids.iter().filter_map(|i| self.held.get(i).map(String::as_str)).collect();
        sqlx::query("DELETE FROM outbox WHERE ctid = ANY($1::tid[])")
            .bind(&ctids)
            .execute(&mut self.conn)
            .await
            .map_err(|e| Error::db("deleting claimed outbox rows", e))?;
        self.held.clear();
        self.gate.commit_by_hand(&mut self.conn, "a relay delete").await
    }

    /// Gives the rows back after a produce error (a controlled failure, not a crash).
    async fn release(&mut self) -> Result<()> {
        self.held.clear();
        sqlx::query("ROLLBACK").execute(&mut self.conn).await.map_err(|e| Error::db("releasing a relay claim", e))?;
        Ok(())
    }

    /// The crash: drop the connection with its transaction open.
    fn crash(self) {
        drop(self.conn);
    }
}

impl super::NotifierTx for PgTx {
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
