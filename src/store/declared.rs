//! A declared system's tables (docs/contract.md section 8): its setup
//! applied, its declarations proved against the fresh schema before any
//! traffic, its outbox logged by a trigger, and its outbox, effects and
//! checks read for the verifier, row by row.
//!
//! Every name spliced into the SQL below was checked by the scenario as an
//! unquoted lowercase identifier, and is quoted anyway. The user's queries
//! are the user's: they run as written, wrapped in a sub-select.

use super::postgres::PgStore;
use crate::error::{Error, Result};
use crate::scenario::{CheckDecl, EffectDecl, Once, OutboxDecl, Published, System};
use futures::TryStreamExt;
use sqlx::{Executor, Row};

/// chaos's own table in the run's schema: every row the user's service
/// inserted into its outbox, copied by a trigger in the same transaction,
/// so that a row the relay deleted is still accounted for.
pub const OUTBOX_LOG: &str = "chaos_outbox_log";

/// At most this many of a check's violating rows are kept as examples.
pub const CHECK_EXAMPLES: i64 = 5;

/// A declaration that does not hold on the fresh schema: the key that
/// declares it, and the database's own words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadDeclaration {
    pub key: String,
    pub message: String,
}

fn q(ident: &str) -> String {
    format!("\"{}\"", ident.replace('"', "\"\""))
}

/// The database's own message, without sqlx's wrapping.
fn db_message(e: &sqlx::Error) -> String {
    match e.as_database_error() {
        Some(d) => d.message().to_string(),
        None => crate::error::redact(&e.to_string()),
    }
}

/// One row of the outbox log, every column as text.
#[derive(Debug, Clone)]
pub struct LoggedEvent {
    pub id: String,
    pub key: String,
    pub kind: String,
    pub payload: String,
    /// When it was written, in ms since the epoch.
    pub at_epoch_ms: i64,
    /// It meets `system.outbox.malformed`.
    pub malformed: bool,
}

/// One row of a declared effect's query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EffectRow {
    pub message_id: Option<String>,
    pub key: Option<String>,
    pub amount: Option<i64>,
}

/// Applies the user's SQL file in the run's schema.
pub async fn apply_setup(pg: &PgStore, sql: &str) -> std::result::Result<(), String> {
    sqlx::raw_sql(sql).execute(pg.conn_pool()).await.map(|_| ()).map_err(|e| db_message(&e))
}

/// Proves each declaration on the freshly set-up schema: the outbox table
/// and columns exist, each effect query returns the columns its `once`
/// and `conserve` need (and no others) with usable types, each check
/// query runs. Nothing is written.
pub async fn probe_outbox(pg: &PgStore, sys: &System) -> std::result::Result<(), BadDeclaration> {
    let pool = pg.conn_pool();
    let bad = |key: &str, message: String| BadDeclaration { key: key.to_string(), message };
    let o = &sys.outbox;
    let table = q(&o.table);
    sqlx::query(&format!("SELECT 1 FROM {table} LIMIT 0"))
        .execute(pool)
        .await
        .map_err(|e| bad("system.outbox.table", db_message(&e)))?;
    let mut columns = vec![("id", &o.id), ("key", &o.key), ("type", &o.kind), ("payload", &o.payload)];
    if let Published::Column(c) = &o.published {
        columns.push(("published_column", c));
    }
    for (key, col) in columns {
        sqlx::query(&format!("SELECT {} FROM {table} LIMIT 0", q(col)))
            .execute(pool)
            .await
            .map_err(|e| bad(&format!("system.outbox.{key}"), db_message(&e)))?;
    }
    Ok(())
}

/// The rest of the declarations, once the outbox log exists (a query may
/// read it): each effect's query returns the columns its `once` and
/// `conserve` need, and no others, with usable types; each check runs.
pub async fn probe_queries(pg: &PgStore, sys: &System) -> std::result::Result<(), BadDeclaration> {
    let pool = pg.conn_pool();
    let bad = |key: &str, message: String| BadDeclaration { key: key.to_string(), message };
    if let Some(m) = &sys.outbox.malformed {
        sqlx::query(&format!("SELECT COALESCE(({m}), false)::boolean FROM {OUTBOX_LOG} LIMIT 0"))
            .execute(pool)
            .await
            .map_err(|e| bad("system.outbox.malformed", db_message(&e)))?;
    }
    for e in sys.effects.iter().filter(|e| e.provider.is_none()) {
        let key = format!("[[system.effects]] {:?}", e.name);
        let described = pool
            .describe(&format!("SELECT * FROM ({}) AS q LIMIT 0", e.query))
            .await
            .map_err(|err| bad(&format!("{key}: query"), db_message(&err)))?;
        let got: Vec<(String, String)> = described
            .columns()
            .iter()
            .map(|c| (sqlx::Column::name(c).to_string(), sqlx::TypeInfo::name(sqlx::Column::type_info(c)).to_string()))
            .collect();
        let names: Vec<&str> = got.iter().map(|(n, _)| n.as_str()).collect();
        let mut want = vec!["key"];
        if matches!(e.once, Once::PerMessage | Once::PerMalformedMessage) {
            want.push("message_id");
        }
        if e.conserve.is_some() {
            want.push("amount");
        }
        let allowed = ["key", "message_id", "amount"];
        if let Some(missing) = want.iter().find(|w| !names.contains(w)) {
            return Err(bad(
                &format!("{key}: query"),
                format!(
                    "returns the columns ({}), without `{missing}`; it must return {} (alias them with AS)",
                    names.join(", "),
                    want.join(", ")
                ),
            ));
        }
        if let Some(extra) = names.iter().find(|n| !allowed.contains(n)) {
            return Err(bad(
                &format!("{key}: query"),
                format!("returns the column `{extra}`, which means nothing here; return only {}", want.join(", ")),
            ));
        }
        for (name, ty) in &got {
            let fits = match name.as_str() {
                "amount" => ["INT2", "INT4", "INT8", "NUMERIC"].contains(&ty.as_str()),
                "message_id" => ["UUID", "TEXT", "VARCHAR", "BPCHAR", "NAME"].contains(&ty.as_str()),
                _ => true,
            };
            if !fits {
                let expected = if name == "amount" { "an integer" } else { "a uuid or text" };
                return Err(bad(
                    &format!("{key}: query"),
                    format!("its column `{name}` is of type {ty}; expected {expected}"),
                ));
            }
        }
        sqlx::query(&effect_sql(e, &names, Some(0)))
            .execute(pool)
            .await
            .map_err(|err| bad(&format!("{key}: query"), db_message(&err)))?;
    }
    if let Some(p) = &sys.pending {
        sqlx::query(&pending_sql(p, Some(0)))
            .execute(pool)
            .await
            .map_err(|err| bad("system.pending", db_message(&err)))?;
    }
    for c in &sys.checks {
        sqlx::query(&format!("SELECT 1 FROM ({}) AS q LIMIT 0", c.query))
            .execute(pool)
            .await
            .map_err(|err| bad(&format!("[[system.checks]] {:?}: query", c.name), db_message(&err)))?;
    }
    Ok(())
}

/// The most rows of pending work read at once: a backlog larger than this
/// is counted, and its keys past this many are not named.
const PENDING_READ: i64 = 100_000;

/// The read of the declared pending work: each row's `key` as text, NULL
/// when the query returns no such column.
fn pending_sql(query: &str, limit: Option<i64>) -> String {
    let limit = limit.map(|n| format!(" LIMIT {n}")).unwrap_or_default();
    format!("SELECT to_jsonb(q) ->> 'key' FROM ({query}) AS q{limit}")
}

/// The system's pending work now (`[system] pending`): the keys of its
/// rows (an empty string for a row without one), at most [`PENDING_READ`].
pub async fn pending(pg: &PgStore, query: &str) -> Result<Vec<String>> {
    let rows: Vec<Option<String>> = sqlx::query_scalar(&pending_sql(query, Some(PENDING_READ)))
        .fetch_all(pg.conn_pool())
        .await
        .map_err(|e| Error::db("reading the declared pending work (system.pending)", e))?;
    Ok(rows.into_iter().map(Option::unwrap_or_default).collect())
}

/// How many rows each effect's query returns now, in declaration order
/// (None for an effect read from the provider's record): what must stay
/// unchanged for a drained system to count as settled.
pub async fn effect_counts(pg: &PgStore, sys: &System) -> Result<Vec<Option<i64>>> {
    let mut out = Vec::new();
    for e in &sys.effects {
        if e.provider.is_some() {
            out.push(None);
            continue;
        }
        let n: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM ({}) AS q", e.query))
            .fetch_one(pg.conn_pool())
            .await
            .map_err(|err| Error::db("counting an effect's rows", err))?;
        out.push(Some(n));
    }
    Ok(out)
}

/// The read of an effect: its columns cast to what the verifier compares,
/// the absent ones NULL.
fn effect_sql(e: &EffectDecl, present: &[&str], limit: Option<i64>) -> String {
    let col = |name: &str, cast: &str| match present.contains(&name) {
        true => format!("q.{name}::{cast}"),
        false => format!("NULL::{cast}"),
    };
    let limit = limit.map(|n| format!(" LIMIT {n}")).unwrap_or_default();
    format!(
        "SELECT {}, {}, {} FROM ({}) AS q{limit}",
        col("message_id", "text"),
        col("key", "text"),
        col("amount", "bigint"),
        e.query
    )
}

/// Adds [`OUTBOX_LOG`] and the trigger that fills it.
pub async fn install_outbox_log(pg: &PgStore, o: &OutboxDecl) -> Result<()> {
    let schema = q(&pg.schema);
    let log = format!("{schema}.{OUTBOX_LOG}");
    let sql = format!(
        r#"CREATE TABLE {log} (seq bigserial PRIMARY KEY, id text, key text, kind text, payload text,
                                at timestamptz NOT NULL DEFAULT clock_timestamp());
        CREATE FUNCTION {schema}.chaos_outbox_log_row() RETURNS trigger LANGUAGE plpgsql AS $chaos$
        BEGIN
            INSERT INTO {log} (id, key, kind, payload)
            VALUES (NEW.{id}::text, NEW.{key}::text, NEW.{kind}::text, NEW.{payload}::text);
            RETURN NEW;
        END $chaos$;
        CREATE TRIGGER chaos_outbox_log AFTER INSERT ON {schema}.{table}
            FOR EACH ROW EXECUTE FUNCTION {schema}.chaos_outbox_log_row();"#,
        id = q(&o.id),
        key = q(&o.key),
        kind = q(&o.kind),
        payload = q(&o.payload),
        table = q(&o.table),
    );
    sqlx::raw_sql(&sql).execute(pg.conn_pool()).await.map_err(|e| Error::db("adding the outbox log", e))?;
    Ok(())
}

/// Outbox rows not yet marked published: NULL in the column, or still
/// there when the relay deletes; None when the relay keeps no mark.
pub async fn unpublished(pg: &PgStore, o: &OutboxDecl) -> Result<Option<i64>> {
    let sql = match &o.published {
        Published::Column(c) => format!("SELECT count(*) FROM {} WHERE {} IS NULL", q(&o.table), q(c)),
        Published::Delete => format!("SELECT count(*) FROM {}", q(&o.table)),
        Published::None => return Ok(None),
    };
    let n: i64 = sqlx::query_scalar(&sql)
        .fetch_one(pg.conn_pool())
        .await
        .map_err(|e| Error::db("counting unpublished outbox rows", e))?;
    Ok(Some(n))
}

/// The keys of the outbox rows not yet marked published, at most
/// [`PENDING_READ`]; None when the relay keeps no mark.
pub async fn unpublished_keys(pg: &PgStore, o: &OutboxDecl) -> Result<Option<Vec<String>>> {
    let unmarked = match &o.published {
        Published::Column(c) => format!(" WHERE {} IS NULL", q(c)),
        Published::Delete => String::new(),
        Published::None => return Ok(None),
    };
    let sql = format!("SELECT {}::text FROM {}{unmarked} LIMIT {PENDING_READ}", q(&o.key), q(&o.table));
    let keys: Vec<Option<String>> = sqlx::query_scalar(&sql)
        .fetch_all(pg.conn_pool())
        .await
        .map_err(|e| Error::db("reading the unpublished outbox rows' keys", e))?;
    Ok(Some(keys.into_iter().map(Option::unwrap_or_default).collect()))
}

/// How many rows the outbox log holds.
pub async fn logged(pg: &PgStore) -> Result<i64> {
    sqlx::query_scalar(&format!("SELECT count(*) FROM {OUTBOX_LOG}"))
        .fetch_one(pg.conn_pool())
        .await
        .map_err(|e| Error::db("counting the outbox log", e))
}

/// Streams the outbox log, in insert order.
pub async fn outbox_log(pg: &PgStore, o: &OutboxDecl, mut on: impl FnMut(LoggedEvent)) -> Result<()> {
    let malformed = o.malformed.as_deref().map_or("false".to_string(), |m| format!("COALESCE(({m}), false)"));
    let sql = format!(
        "SELECT id, key, kind, payload, (extract(epoch FROM at) * 1000)::bigint, {malformed}::boolean FROM {OUTBOX_LOG} ORDER BY seq"
    );
    let mut rows = sqlx::query(&sql).fetch(pg.conn_pool());
    while let Some(r) = rows.try_next().await.map_err(|e| Error::db("reading the outbox log", e))? {
        on(LoggedEvent {
            id: r.try_get::<Option<String>, _>(0).ok().flatten().unwrap_or_default(),
            key: r.try_get::<Option<String>, _>(1).ok().flatten().unwrap_or_default(),
            kind: r.try_get::<Option<String>, _>(2).ok().flatten().unwrap_or_default(),
            payload: r.try_get::<Option<String>, _>(3).ok().flatten().unwrap_or_default(),
            at_epoch_ms: r.try_get::<i64, _>(4).unwrap_or_default(),
            malformed: r.try_get::<bool, _>(5).map_err(|e| Error::db("reading the outbox log", e))?,
        });
    }
    Ok(())
}

/// The ids of the outbox rows still unmarked after the drain.
pub async fn leftovers(pg: &PgStore, o: &OutboxDecl, mut on: impl FnMut(String)) -> Result<()> {
    let sql = match &o.published {
        Published::Column(c) => format!("SELECT {}::text FROM {} WHERE {} IS NULL", q(&o.id), q(&o.table), q(c)),
        Published::Delete => format!("SELECT {}::text FROM {}", q(&o.id), q(&o.table)),
        Published::None => return Ok(()),
    };
    let mut rows = sqlx::query_scalar::<_, Option<String>>(&sql).fetch(pg.conn_pool());
    while let Some(id) = rows.try_next().await.map_err(|e| Error::db("reading unpublished outbox rows", e))? {
        on(id.unwrap_or_default());
    }
    Ok(())
}

/// Streams an effect's rows.
pub async fn effect_rows(pg: &PgStore, e: &EffectDecl, mut on: impl FnMut(EffectRow)) -> Result<()> {
    let pool = pg.conn_pool();
    let described = pool
        .describe(&format!("SELECT * FROM ({}) AS q LIMIT 0", e.query))
        .await
        .map_err(|err| Error::db(format!("describing effect {:?}", e.name), err))?;
    let names: Vec<String> = described.columns().iter().map(|c| sqlx::Column::name(c).to_string()).collect();
    let present: Vec<&str> = names.iter().map(String::as_str).collect();
    let sql = effect_sql(e, &present, None);
    let mut rows = sqlx::query(&sql).fetch(pool);
    let context = || format!("reading effect {:?}", e.name);
    while let Some(r) = rows.try_next().await.map_err(|err| Error::db(context(), err))? {
        on(EffectRow {
            message_id: r.try_get(0).map_err(|err| Error::db(context(), err))?,
            key: r.try_get(1).map_err(|err| Error::db(context(), err))?,
            amount: r.try_get(2).map_err(|err| Error::db(context(), err))?,
        });
    }
    Ok(())
}

/// A check's violating rows: how many, and the first few as JSON.
pub async fn check_rows(pg: &PgStore, c: &CheckDecl) -> Result<(i64, Vec<String>)> {
    let pool = pg.conn_pool();
    let context = || format!("running check {:?}", c.name);
    let n: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM ({}) AS q", c.query))
        .fetch_one(pool)
        .await
        .map_err(|e| Error::db(context(), e))?;
    let examples: Vec<String> =
        sqlx::query_scalar(&format!("SELECT row_to_json(q)::text FROM ({}) AS q LIMIT {CHECK_EXAMPLES}", c.query))
            .fetch_all(pool)
            .await
            .map_err(|e| Error::db(context(), e))?;
    Ok((n, examples))
}
