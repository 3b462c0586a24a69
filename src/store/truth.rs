//! The verifier's and the drain's reads of the database, written once for both backends: the
//! statements are the same text, and only the SQL dialect of two of them
//! differs (how the payload is read as text, how the two inboxes are joined).

use super::{OutboxRecord, PaymentRow};
use crate::error::{Error, Result};
use crate::events::{EventKind, PaymentEvent};
use crate::verifier::Ledger;
use futures::TryStreamExt;
use sqlx::{ColumnIndex, Database, Decode, Executor, IntoArguments, Pool, Row, Type};
use uuid::Uuid;

/// The two statements whose text differs per backend.
pub struct Dialect {
    /// id, aggregate_id, event_type, payload as text, published flag.
    pub outbox: &'static str,
    /// handler, count over `inbox` and `inbox_unkeyed` together.
    pub inbox: &'static str,
}

fn ctx(what: &'static str) -> impl Fn(sqlx::Error) -> Error {
    move |e| Error::db(format!("reading {what} for the verifier"), e)
}

/// Streams every table the verifier reconciles into the ledger, row by row:
/// nothing here holds more than one row at a time, so a million payments
/// cost the ledger's compact entries and no more. Payments come first, then
/// the outbox (the ledger indexes events by payment). Decoding errors are
/// errors, never panics.
pub async fn read<DB>(pool: &Pool<DB>, dialect: &Dialect, ledger: &mut Ledger) -> Result<()>
where
    DB: Database,
    for<'c> &'c Pool<DB>: Executor<'c, Database = DB>,
    for<'q> <DB as Database>::Arguments<'q>: IntoArguments<'q, DB>,
    usize: ColumnIndex<DB::Row>,
    for<'r> Uuid: Decode<'r, DB> + Type<DB>,
    for<'r> String: Decode<'r, DB> + Type<DB>,
    for<'r> i64: Decode<'r, DB> + Type<DB>,
    for<'r> i32: Decode<'r, DB> + Type<DB>,
    for<'r> bool: Decode<'r, DB> + Type<DB>,
{
    let what = "payments";
    let mut rows = sqlx::query("SELECT id, account_id, amount_cents, status FROM payments").fetch(pool);
    while let Some(r) = rows.try_next().await.map_err(ctx(what))? {
        ledger.add_payment(PaymentRow {
            id: r.try_get(0).map_err(ctx(what))?,
            account_id: r.try_get(1).map_err(ctx(what))?,
            amount_cents: r.try_get(2).map_err(ctx(what))?,
            captured: r.try_get::<String, _>(3).map_err(ctx(what))? == "captured",
        });
    }
    drop(rows);
    let what = "the outbox";
    let mut rows = sqlx::query(dialect.outbox).fetch(pool);
    while let Some(r) = rows.try_next().await.map_err(ctx(what))? {
        let t: String = r.try_get(2).map_err(ctx(what))?;
        let payload: String = r.try_get(3).map_err(ctx(what))?;
        // Malformed (poison) events are told apart exactly as the notifier
        // tells them apart: by failing to decode.
        let kind = EventKind::from_type(&t).filter(|_| serde_json::from_str::<PaymentEvent>(&payload).is_ok());
        ledger.add_event(OutboxRecord {
            id: r.try_get(0).map_err(ctx(what))?,
            payment_id: r.try_get(1).map_err(ctx(what))?,
            kind,
            published: r.try_get(4).map_err(ctx(what))?,
        });
    }
    drop(rows);
    let what = "the inbox";
    let mut rows = sqlx::query(dialect.inbox).fetch(pool);
    while let Some(r) = rows.try_next().await.map_err(ctx(what))? {
        let n: i64 = r.try_get(1).map_err(ctx(what))?;
        ledger.add_inbox_rows(&r.try_get::<String, _>(0).map_err(ctx(what))?, n as u64);
    }
    drop(rows);
    let what = "receipts";
    let mut rows = sqlx::query("SELECT payment_id, count(*) FROM receipts GROUP BY payment_id").fetch(pool);
    while let Some(r) = rows.try_next().await.map_err(ctx(what))? {
        let n: i64 = r.try_get(1).map_err(ctx(what))?;
        ledger.add_receipts(r.try_get::<Uuid, _>(0).map_err(ctx(what))?, n as u64);
    }
    drop(rows);
    let what = "the projection";
    let mut rows = sqlx::query("SELECT payment_id, status FROM payment_projection").fetch(pool);
    while let Some(r) = rows.try_next().await.map_err(ctx(what))? {
        let status: String = r.try_get(1).map_err(ctx(what))?;
        ledger.add_projection(r.try_get::<Uuid, _>(0).map_err(ctx(what))?, status == "captured");
    }
    drop(rows);
    let what = "dead letters";
    let mut rows = sqlx::query("SELECT count(*) FROM dead_letters").fetch(pool);
    while let Some(r) = rows.try_next().await.map_err(ctx(what))? {
        ledger.add_dead_letters(r.try_get::<i64, _>(0).map_err(ctx(what))? as u64);
    }
    drop(rows);
    let what = "loyalty points";
    let mut rows = sqlx::query("SELECT account_id, points FROM loyalty_points").fetch(pool);
    while let Some(r) = rows.try_next().await.map_err(ctx(what))? {
        ledger.add_loyalty(r.try_get::<i32, _>(0).map_err(ctx(what))?, r.try_get(1).map_err(ctx(what))?);
    }
    Ok(())
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
