//! The verifier's and the drain's reads of the database, written once for
//! both backends: the statements are the same text, and only the SQL dialect
//! of two of them differs (how the payload is read as text, how a latency is
//! computed from two timestamps).

use super::{OutboxRecord, PaymentRow};
use crate::domain::events::{fingerprint, EventKind, PaymentEvent};
use crate::domain::rows::{StoryRow, TruthSink};
use crate::error::{Error, Result};
use futures::TryStreamExt;
use sqlx::{ColumnIndex, Database, Decode, Executor, IntoArguments, Pool, Row, Type};
use std::collections::HashMap;
use uuid::Uuid;

/// The statements whose text differs per backend.
pub struct Dialect {
    /// id, aggregate_id, event_type, payload as text, published flag,
    /// created in milliseconds since the epoch.
    pub outbox: &'static str,
    /// Each event's latency in whole milliseconds, outbox created → inbox
    /// processed (projection handler).
    pub latency: &'static str,
    /// (payment or event id, a time the database recorded for it in
    /// milliseconds since the epoch), over every table that dates one.
    pub traces: &'static str,
    /// Every dated row of a payment's story: (payment id, lane, what, event
    /// or message id or NULL, time in milliseconds since the epoch, the
    /// outbox row's seq or NULL).
    pub story: &'static str,
}

fn ctx(what: &'static str) -> impl Fn(sqlx::Error) -> Error {
    move |e| Error::db(format!("reading {what} for the verifier"), e)
}

/// Streams the rows of one statement through `row`, one at a time. The
/// stream is dropped before the next statement starts, which hands its pool
/// connection back (shadowing a stream would not drop it).
async fn stream<DB, F>(pool: &Pool<DB>, sql: &str, what: &'static str, mut row: F) -> Result<()>
where
    DB: Database,
    for<'c> &'c Pool<DB>: Executor<'c, Database = DB>,
    for<'q> <DB as Database>::Arguments<'q>: IntoArguments<'q, DB>,
    F: FnMut(&DB::Row) -> std::result::Result<(), sqlx::Error>,
{
    let mut rows = sqlx::query(sql).fetch(pool);
    while let Some(r) = rows.try_next().await.map_err(ctx(what))? {
        row(&r).map_err(ctx(what))?;
    }
    Ok(())
}

/// Streams every table the verifier reconciles into the sink, row by row:
/// nothing here holds more than one row at a time, so a million payments
/// cost the sink's compact entries and no more. Payments come first, then
/// the outbox (the sink indexes events by payment), then the effects.
/// Decoding errors are errors, never panics.
pub async fn read<DB>(pool: &Pool<DB>, dialect: &Dialect, sink: &mut dyn TruthSink) -> Result<()>
where
    DB: Database,
    for<'c> &'c Pool<DB>: Executor<'c, Database = DB>,
    for<'q> <DB as Database>::Arguments<'q>: IntoArguments<'q, DB>,
    usize: ColumnIndex<DB::Row>,
    for<'r> Uuid: Decode<'r, DB> + Type<DB>,
    for<'r> Option<Uuid>: Decode<'r, DB> + Type<DB>,
    for<'r> String: Decode<'r, DB> + Type<DB>,
    for<'r> i64: Decode<'r, DB> + Type<DB>,
    for<'r> i32: Decode<'r, DB> + Type<DB>,
    for<'r> bool: Decode<'r, DB> + Type<DB>,
{
    stream(pool, "SELECT id, account_id, amount_cents, status FROM payments", "payments", |r| {
        sink.payment(PaymentRow {
            id: r.try_get(0)?,
            account_id: r.try_get(1)?,
            amount_cents: r.try_get(2)?,
            captured: r.try_get::<String, _>(3)? == "captured",
        });
        Ok(())
    })
    .await?;
    stream(pool, dialect.outbox, "the outbox", |r| {
        sink.event(outbox_record(r)?);
        Ok(())
    })
    .await?;
    read_effects(pool, sink).await
}

/// One row of the dialect's outbox statement as the sink keeps it.
fn outbox_record<R>(r: &R) -> std::result::Result<OutboxRecord, sqlx::Error>
where
    R: Row,
    usize: ColumnIndex<R>,
    for<'r> Uuid: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> String: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> bool: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
{
    let payment_id: Uuid = r.try_get(1)?;
    let t: String = r.try_get(2)?;
    let payload: String = r.try_get(3)?;
    // Malformed (poison) events are told apart exactly as the notifier
    // tells them apart: by failing to decode.
    let body = serde_json::from_str::<PaymentEvent>(&payload).ok();
    let kind = EventKind::from_type(&t).filter(|_| body.is_some());
    // What a relay publishes for this row: the payment id as the key,
    // the type header, the payload as stored.
    let fingerprint = fingerprint(payment_id.to_string().as_bytes(), t.as_bytes(), payload.as_bytes());
    Ok(OutboxRecord {
        id: r.try_get(0)?,
        payment_id,
        kind,
        body: body.filter(|_| kind.is_some()),
        published: r.try_get(4)?,
        fingerprint,
        at_epoch_ms: r.try_get(5)?,
    })
}

/// The effects' tables, read after the outbox: the inbox, receipts, the
/// projection, dead letters and the loyalty counter with its credits.
async fn read_effects<DB>(pool: &Pool<DB>, sink: &mut dyn TruthSink) -> Result<()>
where
    DB: Database,
    for<'c> &'c Pool<DB>: Executor<'c, Database = DB>,
    for<'q> <DB as Database>::Arguments<'q>: IntoArguments<'q, DB>,
    usize: ColumnIndex<DB::Row>,
    for<'r> Uuid: Decode<'r, DB> + Type<DB>,
    for<'r> Option<Uuid>: Decode<'r, DB> + Type<DB>,
    for<'r> String: Decode<'r, DB> + Type<DB>,
    for<'r> i64: Decode<'r, DB> + Type<DB>,
    for<'r> i32: Decode<'r, DB> + Type<DB>,
{
    let inbox = "SELECT message_id, handler FROM inbox UNION ALL SELECT message_id, handler FROM inbox_unkeyed";
    stream(pool, inbox, "the inbox", |r| {
        sink.inbox_row(r.try_get(0)?, &r.try_get::<String, _>(1)?);
        Ok(())
    })
    .await?;
    // In payment order, so a payment's receipts arrive side by side.
    stream(pool, "SELECT payment_id, message_id FROM receipts ORDER BY payment_id", "receipts", |r| {
        sink.receipt(r.try_get(0)?, r.try_get(1)?);
        Ok(())
    })
    .await?;
    stream(pool, "SELECT payment_id, status, event_id FROM payment_projection", "the projection", |r| {
        let status: String = r.try_get(1)?;
        sink.projection(r.try_get(0)?, status == "captured", r.try_get(2)?);
        Ok(())
    })
    .await?;
    stream(pool, "SELECT message_id FROM dead_letters", "dead letters", |r| {
        sink.dead_letter(&r.try_get::<String, _>(0)?);
        Ok(())
    })
    .await?;
    stream(pool, "SELECT account_id, points FROM loyalty_points", "loyalty points", |r| {
        sink.loyalty(r.try_get(0)?, r.try_get(1)?);
        Ok(())
    })
    .await?;
    stream(pool, "SELECT event_id, account_id, points FROM loyalty_credits", "loyalty credits", |r| {
        sink.credit(r.try_get(0)?, r.try_get(1)?, r.try_get(2)?);
        Ok(())
    })
    .await
}

/// Each event's end-to-end latency in whole milliseconds, streamed one
/// sample at a time: the verifier makes the statistic, the same whichever
/// backend holds the samples.
pub async fn latencies<DB>(pool: &Pool<DB>, dialect: &Dialect, sample: &mut (dyn FnMut(i64) + Send)) -> Result<()>
where
    DB: Database,
    for<'c> &'c Pool<DB>: Executor<'c, Database = DB>,
    for<'q> <DB as Database>::Arguments<'q>: IntoArguments<'q, DB>,
    usize: ColumnIndex<DB::Row>,
    for<'r> i64: Decode<'r, DB> + Type<DB>,
{
    stream(pool, dialect.latency, "latencies", |r| {
        sample(r.try_get(0)?);
        Ok(())
    })
    .await
}

/// The last trace of each of `ids` (payments or events) in the database,
/// in milliseconds since the epoch ([`crate::verifier::attribution`]). It
/// reads every dated row once and keeps those of `ids`: called only when a
/// run found anomalies.
pub async fn traces<DB>(pool: &Pool<DB>, dialect: &Dialect, ids: &[Uuid]) -> Result<HashMap<Uuid, i64>>
where
    DB: Database,
    for<'c> &'c Pool<DB>: Executor<'c, Database = DB>,
    for<'q> <DB as Database>::Arguments<'q>: IntoArguments<'q, DB>,
    usize: ColumnIndex<DB::Row>,
    for<'r> Uuid: Decode<'r, DB> + Type<DB>,
    for<'r> i64: Decode<'r, DB> + Type<DB>,
{
    let wanted: std::collections::HashSet<Uuid> = ids.iter().copied().collect();
    let mut last: HashMap<Uuid, i64> = HashMap::new();
    stream(pool, dialect.traces, "the anomalies' traces", |r| {
        let id: Uuid = r.try_get(0)?;
        if wanted.contains(&id) {
            let at: i64 = r.try_get(1)?;
            let t = last.entry(id).or_insert(at);
            *t = (*t).max(at);
        }
        Ok(())
    })
    .await?;
    Ok(last)
}

/// The dated rows of these payments' stories ([`crate::verifier::story`]).
/// Like [`traces`], it reads every dated row once and keeps those of
/// `payments`: called only when a run found anomalies.
pub async fn story<DB>(pool: &Pool<DB>, dialect: &Dialect, payments: &[Uuid]) -> Result<Vec<StoryRow>>
where
    DB: Database,
    for<'c> &'c Pool<DB>: Executor<'c, Database = DB>,
    for<'q> <DB as Database>::Arguments<'q>: IntoArguments<'q, DB>,
    usize: ColumnIndex<DB::Row>,
    for<'r> Uuid: Decode<'r, DB> + Type<DB>,
    for<'r> Option<Uuid>: Decode<'r, DB> + Type<DB>,
    for<'r> String: Decode<'r, DB> + Type<DB>,
    for<'r> i64: Decode<'r, DB> + Type<DB>,
    for<'r> Option<i64>: Decode<'r, DB> + Type<DB>,
{
    let wanted: std::collections::HashSet<Uuid> = payments.iter().copied().collect();
    let mut rows = Vec::new();
    stream(pool, dialect.story, "the anomalies' stories", |r| {
        let payment: Uuid = r.try_get(0)?;
        if wanted.contains(&payment) {
            let lane = match r.try_get::<String, _>(1)?.as_str() {
                "payment" => "payment",
                "outbox" => "outbox",
                "inbox" => "inbox",
                _ => "effect",
            };
            rows.push(StoryRow {
                payment,
                lane,
                what: r.try_get(2)?,
                event: r.try_get(3)?,
                at_epoch_ms: r.try_get(4)?,
                seq: r.try_get(5)?,
            });
        }
        Ok(())
    })
    .await?;
    Ok(rows)
}

/// Outbox rows no relay has published yet (the drain waits for zero).
pub async fn unpublished<DB>(pool: &Pool<DB>) -> Result<i64>
where
    DB: Database,
    for<'c> &'c Pool<DB>: Executor<'c, Database = DB>,
    for<'q> <DB as Database>::Arguments<'q>: IntoArguments<'q, DB>,
    usize: ColumnIndex<DB::Row>,
    for<'r> i64: Decode<'r, DB> + Type<DB>,
{
    let row = sqlx::query("SELECT count(*) FROM outbox WHERE published_at IS NULL")
        .fetch_one(pool)
        .await
        .map_err(|e| Error::db("counting unpublished outbox rows", e))?;
    row.try_get(0).map_err(|e| Error::db("counting unpublished outbox rows", e))
}
