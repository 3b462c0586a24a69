//! The verifier's and the drain's reads of the database, written once for both backends: the
//! statements are the same text, and only the SQL dialect of two of them
//! differs (how the payload is read as text, how the two inboxes are joined).

use super::{DbTruth, OutboxRecord, PaymentRow};
use crate::error::{Error, Result};
use crate::events::{EventKind, PaymentEvent};
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

/// Reads every table the verifier reconciles. Decoding errors are errors,
/// never panics.
pub async fn read<DB>(pool: &Pool<DB>, dialect: &Dialect) -> Result<DbTruth>
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
    let mut payments = Vec::new();
    for r in sqlx::query("SELECT id, account_id, amount_cents, status FROM payments")
        .fetch_all(pool)
        .await
        .map_err(ctx("payments"))?
    {
        payments.push(PaymentRow {
            id: r.try_get(0).map_err(ctx("payments"))?,
            account_id: r.try_get(1).map_err(ctx("payments"))?,
            amount_cents: r.try_get(2).map_err(ctx("payments"))?,
            captured: r.try_get::<String, _>(3).map_err(ctx("payments"))? == "captured",
        });
    }
    let mut outbox = Vec::new();
    for r in sqlx::query(dialect.outbox).fetch_all(pool).await.map_err(ctx("the outbox"))? {
        let t: String = r.try_get(2).map_err(ctx("the outbox"))?;
        let payload: String = r.try_get(3).map_err(ctx("the outbox"))?;
        // Malformed (poison) events are told apart exactly as the notifier
        // tells them apart: by failing to decode.
        let kind = EventKind::from_type(&t).filter(|_| serde_json::from_str::<PaymentEvent>(&payload).is_ok());
        outbox.push(OutboxRecord {
            id: r.try_get(0).map_err(ctx("the outbox"))?,
            payment_id: r.try_get(1).map_err(ctx("the outbox"))?,
            kind,
            published: r.try_get(4).map_err(ctx("the outbox"))?,
        });
    }
    let mut inbox_rows = std::collections::HashMap::new();
    for r in sqlx::query(dialect.inbox).fetch_all(pool).await.map_err(ctx("the inbox"))? {
        let n: i64 = r.try_get(1).map_err(ctx("the inbox"))?;
        inbox_rows.insert(r.try_get::<String, _>(0).map_err(ctx("the inbox"))?, n as u64);
    }
    let mut receipts = std::collections::HashMap::new();
    for r in sqlx::query("SELECT payment_id, count(*) FROM receipts GROUP BY payment_id")
        .fetch_all(pool)
        .await
        .map_err(ctx("receipts"))?
    {
        let n: i64 = r.try_get(1).map_err(ctx("receipts"))?;
        receipts.insert(r.try_get::<Uuid, _>(0).map_err(ctx("receipts"))?, n as u64);
    }
    let mut projection = std::collections::HashMap::new();
    for r in sqlx::query("SELECT payment_id, status FROM payment_projection")
        .fetch_all(pool)
        .await
        .map_err(ctx("the projection"))?
    {
        let status: String = r.try_get(1).map_err(ctx("the projection"))?;
        projection.insert(r.try_get::<Uuid, _>(0).map_err(ctx("the projection"))?, status == "captured");
    }
    let dead: Vec<DB::Row> =
        sqlx::query("SELECT count(*) FROM dead_letters").fetch_all(pool).await.map_err(ctx("dead letters"))?;
    let dead_letters = match dead.first() {
        Some(r) => r.try_get::<i64, _>(0).map_err(ctx("dead letters"))? as u64,
        None => 0,
    };
    let mut loyalty = std::collections::HashMap::new();
    for r in sqlx::query("SELECT account_id, points FROM loyalty_points")
        .fetch_all(pool)
        .await
        .map_err(ctx("loyalty points"))?
    {
        loyalty.insert(
            r.try_get::<i32, _>(0).map_err(ctx("loyalty points"))?,
            r.try_get(1).map_err(ctx("loyalty points"))?,
        );
    }
    Ok(DbTruth { payments, outbox, inbox_rows, receipts, projection, dead_letters, loyalty })
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
