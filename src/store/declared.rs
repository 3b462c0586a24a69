//! A declared system's tables (docs/contract.md section 8): its setup
//! applied, its declarations proved against the fresh schema before any
//! traffic, its outbox logged by a trigger, and its outbox, effects and
//! checks read for the verifier, row by row.
//!
//! Every name spliced into the SQL below was checked by the scenario as an
//! unquoted lowercase identifier, and is quoted anyway. The user's queries
//! are the user's: they run as written, wrapped in a sub-select. So are the
//! outbox's fields written as expressions (an envelope's `payload->>'id'`):
//! each is evaluated over one row of the outbox, in parentheses.
//!
//! Both backends: a user's declared system runs on PostgreSQL, and the
//! reads run on SQLite too, against the reference migrations (tested
//! below), for the declared path on the embedded backend. Every value is
//! read as text (`chaos_text`, [`super::text`]), so one reader serves
//! both; [`Dialect`] holds the few words that differ.

use super::Store;
use crate::error::{Error, Result};
use crate::scenario::{CheckDecl, EffectDecl, Once, OutboxDecl, OutboxField, Published, System};
use futures::TryStreamExt;
use sqlx::{Column, Executor, Row, TypeInfo};

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

/// An outbox field as SQL over one row of the outbox table: a column by
/// its quoted name, an expression as written, in parentheses. The line end
/// closes a `--` comment the expression may end with.
fn field(f: &OutboxField) -> String {
    match f {
        OutboxField::Column(c) => q(c),
        OutboxField::Expression(e) => format!("({e}\n)"),
    }
}

/// The outbox's fields, each with the key that declares it.
fn fields(o: &OutboxDecl) -> [(&'static str, &OutboxField); 4] {
    [("id", &o.id), ("key", &o.key), ("type", &o.kind), ("payload", &o.payload)]
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
pub async fn apply_setup(store: &Store, sql: &str) -> std::result::Result<(), String> {
    execute(store, sql).await.map_err(|e| db_message(&e))
}

/// Proves the outbox's declaration on the freshly set-up schema: the table
/// and its declared columns exist, and each field's expression reads as
/// one value of a row, as text. Nothing is written; each field's SQL is
/// prepared, not run, so it is one statement.
pub async fn probe_outbox(store: &Store, sys: &System) -> std::result::Result<(), BadDeclaration> {
    let bad = |key: &str, message: String| BadDeclaration { key: key.to_string(), message };
    let o = &sys.outbox;
    let table = q(&o.table);
    execute(store, &format!("SELECT 1 FROM {table} LIMIT 0"))
        .await
        .map_err(|e| bad("system.outbox.table", db_message(&e)))?;
    for (key, f) in fields(o) {
        let text = store.dialect().text(&field(f));
        let key = format!("system.outbox.{key}");
        prepare(store, &format!("SELECT {text} FROM {table} LIMIT 0")).await.map_err(|e| bad(&key, db_message(&e)))?;
        // A condition admits neither an aggregate nor a set-returning
        // function: one row of the outbox must give one value.
        prepare(store, &format!("SELECT 1 FROM {table} WHERE {text} IS NULL LIMIT 0"))
            .await
            .map_err(|e| bad(&key, format!("must give one value per row: {}", db_message(&e))))?;
    }
    if let Published::Column(c) = &o.published {
        execute(store, &format!("SELECT {} FROM {table} LIMIT 0", q(c)))
            .await
            .map_err(|e| bad("system.outbox.published_column", db_message(&e)))?;
    }
    Ok(())
}

/// The rest of the declarations, once the outbox log exists (a query may
/// read it): each effect's query returns the columns its `once` and
/// `conserve` need, and no others, with usable types; each check runs.
pub async fn probe_queries(store: &Store, sys: &System) -> std::result::Result<(), BadDeclaration> {
    let bad = |key: &str, message: String| BadDeclaration { key: key.to_string(), message };
    if let Some(m) = &sys.outbox.malformed {
        execute(store, &format!("SELECT {} FROM {OUTBOX_LOG} LIMIT 0", flag(m)))
            .await
            .map_err(|e| bad("system.outbox.malformed", db_message(&e)))?;
    }
    for e in sys.effects.iter().filter(|e| e.provider.is_none()) {
        let key = format!("[[system.effects]] {:?}", e.name);
        let got = columns(store, &e.query).await.map_err(|err| bad(&format!("{key}: query"), db_message(&err)))?;
        proves_effect_columns(e, &got, store.dialect()).map_err(|m| bad(&format!("{key}: query"), m))?;
        let names: Vec<&str> = got.iter().map(|(n, _)| n.as_str()).collect();
        execute(store, &effect_sql(store.dialect(), e, &names, Some(0)))
            .await
            .map_err(|err| bad(&format!("{key}: query"), db_message(&err)))?;
    }
    if let Some(p) = &sys.pending {
        let sql = pending_sql(store, p, Some(0)).await.map_err(|err| bad("system.pending", db_message(&err)))?;
        execute(store, &sql).await.map_err(|err| bad("system.pending", db_message(&err)))?;
    }
    for c in &sys.checks {
        execute(store, &format!("SELECT 1 FROM ({}) AS q LIMIT 0", c.query))
            .await
            .map_err(|err| bad(&format!("[[system.checks]] {:?}: query", c.name), db_message(&err)))?;
    }
    Ok(())
}

/// An effect query's columns, `(name, type)`: the ones its `once` and
/// `conserve` need, and no others, with usable types. SQLite's columns have
/// no fixed type, so only their names are proved there.
fn proves_effect_columns(
    e: &EffectDecl,
    got: &[(String, String)],
    dialect: Dialect,
) -> std::result::Result<(), String> {
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
        return Err(format!(
            "returns the columns ({}), without `{missing}`; it must return {} (alias them with AS)",
            names.join(", "),
            want.join(", ")
        ));
    }
    if let Some(extra) = names.iter().find(|n| !allowed.contains(n)) {
        return Err(format!("returns the column `{extra}`, which means nothing here; return only {}", want.join(", ")));
    }
    for (name, ty) in got.iter().filter(|_| dialect == Dialect::Postgres) {
        let fits = match name.as_str() {
            "amount" => ["INT2", "INT4", "INT8", "NUMERIC"].contains(&ty.as_str()),
            "message_id" => ["UUID", "TEXT", "VARCHAR", "BPCHAR", "NAME"].contains(&ty.as_str()),
            _ => true,
        };
        if !fits {
            let expected = if name == "amount" { "an integer" } else { "a uuid or text" };
            return Err(format!("its column `{name}` is of type {ty}; expected {expected}"));
        }
    }
    Ok(())
}

/// The most rows of pending work read at once: a backlog larger than this
/// is counted, and its keys past this many are not named.
const PENDING_READ: i64 = 100_000;

/// The read of the declared pending work: each row's `key` as text, NULL
/// when the query returns no such column.
async fn pending_sql(store: &Store, query: &str, limit: Option<i64>) -> std::result::Result<String, sqlx::Error> {
    let has_key = columns(store, query).await?.iter().any(|(n, _)| n == "key");
    let key = if has_key { store.dialect().text("q.key") } else { "CAST(NULL AS TEXT)".to_string() };
    let limit = limit.map(|n| format!(" LIMIT {n}")).unwrap_or_default();
    Ok(format!("SELECT {key} FROM ({query}) AS q{limit}"))
}

/// The system's pending work now (`[system] pending`): the keys of its
/// rows (an empty string for a row without one), at most [`PENDING_READ`].
pub async fn pending(store: &Store, query: &str) -> Result<Vec<String>> {
    let context = "reading the declared pending work (system.pending)";
    let sql = pending_sql(store, query, Some(PENDING_READ)).await.map_err(|e| Error::db(context, e))?;
    let mut keys = Vec::new();
    text_rows(store, &sql, context, |mut r| keys.push(r.swap_remove(0).unwrap_or_default())).await?;
    Ok(keys)
}

/// How many rows each effect's query returns now, in declaration order
/// (None for an effect read from the provider's record): what must stay
/// unchanged for a drained system to count as settled.
pub async fn effect_counts(store: &Store, sys: &System) -> Result<Vec<Option<i64>>> {
    let mut out = Vec::new();
    for e in &sys.effects {
        out.push(match e.provider {
            Some(_) => None,
            None => Some(count(store, &format!("({}) AS q", e.query), "counting an effect's rows").await?),
        });
    }
    Ok(out)
}

/// The read of an effect: its columns as text, the absent ones NULL.
fn effect_sql(dialect: Dialect, e: &EffectDecl, present: &[&str], limit: Option<i64>) -> String {
    let col = |name: &str, int: bool| match (present.contains(&name), int) {
        (true, false) => dialect.text(&format!("q.{name}")),
        (true, true) => dialect.integer(&format!("q.{name}")),
        (false, _) => "CAST(NULL AS TEXT)".to_string(),
    };
    let limit = limit.map(|n| format!(" LIMIT {n}")).unwrap_or_default();
    format!(
        "SELECT {}, {}, {} FROM ({}) AS q{limit}",
        col("message_id", false),
        col("key", false),
        col("amount", true),
        e.query
    )
}

/// Adds [`OUTBOX_LOG`] and the trigger that fills it, and `chaos_text` on
/// PostgreSQL (SQLite's connections register their own).
///
/// The trigger evaluates the fields over the inserted row as the probe and
/// the reads of the outbox do over the table: a column or an expression,
/// qualified by the table's name or not. On PostgreSQL the row is `NEW` as
/// a one-row sub-select named after the table, and the function keeps the
/// search_path it was made with, so an expression means what the probe
/// proved whoever inserts; on SQLite, which has no `NEW.*`, it is the
/// table's row just inserted, found by its rowid.
pub async fn install_outbox_log(store: &Store, o: &OutboxDecl) -> Result<()> {
    let values = fields(o).map(|(_, f)| store.dialect().text(&field(f))).join(", ");
    let table = q(&o.table);
    let sql = match store {
        Store::Postgres(pg) => {
            let schema = q(&pg.schema);
            let log = format!("{schema}.{OUTBOX_LOG}");
            // The field columns win over PL/pgSQL's own names (`found`).
            let body = format!(
                r#"#variable_conflict use_column
                BEGIN
                    INSERT INTO {log} (id, key, kind, payload) SELECT {values} FROM (SELECT NEW.*) AS {table};
                    RETURN NEW;
                END"#
            );
            let tag = dollar_tag(&body);
            format!(
                r#"{function};
                CREATE TABLE {log} (seq bigserial PRIMARY KEY, id text, key text, kind text, payload text,
                                    at timestamptz NOT NULL DEFAULT clock_timestamp());
                CREATE FUNCTION {schema}.chaos_outbox_log_row() RETURNS trigger LANGUAGE plpgsql
                    SET search_path FROM CURRENT AS {tag}{body}{tag};
                CREATE TRIGGER chaos_outbox_log AFTER INSERT ON {schema}.{table}
                    FOR EACH ROW EXECUTE FUNCTION {schema}.chaos_outbox_log_row();"#,
                function = super::text::POSTGRES,
            )
        }
        // Times in ms since the epoch, as the SQLite migrations keep them.
        Store::Sqlite(_) => format!(
            r#"CREATE TABLE {OUTBOX_LOG} (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT, key TEXT, kind TEXT,
                payload TEXT, at INTEGER NOT NULL DEFAULT (CAST(unixepoch('subsec') * 1000 AS INTEGER)));
            CREATE TRIGGER chaos_outbox_log AFTER INSERT ON {table} FOR EACH ROW
            BEGIN INSERT INTO {OUTBOX_LOG} (id, key, kind, payload) SELECT {values} FROM {table} WHERE rowid = NEW.rowid; END;"#
        ),
    };
    execute(store, &sql).await.map_err(|e| Error::db("adding the outbox log", e))
}

/// A dollar-quoting tag that `body` does not contain, so that no
/// expression in it ends the function's text early.
fn dollar_tag(body: &str) -> String {
    (0..).map(|n| format!("$chaos{n}$")).find(|tag| !body.contains(tag.as_str())).expect("a body is finite")
}

/// The rows of the outbox not yet marked published: NULL in the column,
/// or still there when the relay deletes; None when the relay keeps no mark.
fn unmarked(o: &OutboxDecl) -> Option<String> {
    match &o.published {
        Published::Column(c) => Some(format!("{} WHERE {} IS NULL", q(&o.table), q(c))),
        Published::Delete => Some(q(&o.table)),
        Published::None => None,
    }
}

/// How many outbox rows are not yet marked published; None when the relay
/// keeps no mark.
pub async fn unpublished(store: &Store, o: &OutboxDecl) -> Result<Option<i64>> {
    let Some(rows) = unmarked(o) else { return Ok(None) };
    count(store, &rows, "counting unpublished outbox rows").await.map(Some)
}

/// The keys of the outbox rows not yet marked published, at most
/// [`PENDING_READ`]; None when the relay keeps no mark.
pub async fn unpublished_keys(store: &Store, o: &OutboxDecl) -> Result<Option<Vec<String>>> {
    let Some(rows) = unmarked(o) else { return Ok(None) };
    let sql = format!("SELECT {} FROM {rows} LIMIT {PENDING_READ}", store.dialect().text(&field(&o.key)));
    let mut keys = Vec::new();
    text_rows(store, &sql, "reading the unpublished outbox rows' keys", |mut r| {
        keys.push(r.swap_remove(0).unwrap_or_default())
    })
    .await?;
    Ok(Some(keys))
}

/// How many rows the outbox log holds.
pub async fn logged(store: &Store) -> Result<i64> {
    count(store, OUTBOX_LOG, "counting the outbox log").await
}

/// `COALESCE((m), false)` as '1' or '0': the malformed test of one row.
fn flag(m: &str) -> String {
    format!("CASE WHEN COALESCE(({m}), false) THEN '1' ELSE '0' END")
}

/// Streams the outbox log, in insert order.
pub async fn outbox_log(store: &Store, o: &OutboxDecl, mut on: impl FnMut(LoggedEvent)) -> Result<()> {
    let malformed = o.malformed.as_deref().map_or("'0'".to_string(), flag);
    let at = store.dialect().epoch_ms("at");
    let sql = format!("SELECT id, key, kind, payload, {at}, {malformed} FROM {OUTBOX_LOG} ORDER BY seq");
    text_rows(store, &sql, "reading the outbox log", |r| {
        let mut r = r.into_iter().map(Option::unwrap_or_default);
        let mut next = || r.next().unwrap_or_default();
        on(LoggedEvent {
            id: next(),
            key: next(),
            kind: next(),
            payload: next(),
            at_epoch_ms: next().parse().unwrap_or_default(),
            malformed: next() == "1",
        })
    })
    .await
}

/// The ids of the outbox rows still unmarked after the drain.
pub async fn leftovers(store: &Store, o: &OutboxDecl, mut on: impl FnMut(String)) -> Result<()> {
    let Some(rows) = unmarked(o) else { return Ok(()) };
    let sql = format!("SELECT {} FROM {rows}", store.dialect().text(&field(&o.id)));
    text_rows(store, &sql, "reading unpublished outbox rows", |mut r| on(r.swap_remove(0).unwrap_or_default())).await
}

/// Streams an effect's rows.
pub async fn effect_rows(store: &Store, e: &EffectDecl, mut on: impl FnMut(EffectRow)) -> Result<()> {
    let names: Vec<String> = columns(store, &e.query)
        .await
        .map_err(|err| Error::db(format!("describing effect {:?}", e.name), err))?
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    let present: Vec<&str> = names.iter().map(String::as_str).collect();
    let sql = effect_sql(store.dialect(), e, &present, None);
    let mut bad_amount = None;
    text_rows(store, &sql, &format!("reading effect {:?}", e.name), |r| {
        let amount = r[2].as_deref().map(|a| a.parse::<i64>());
        if let Some(Err(_)) = amount {
            bad_amount = r[2].clone();
        }
        on(EffectRow { message_id: r[0].clone(), key: r[1].clone(), amount: amount.and_then(|a| a.ok()) })
    })
    .await?;
    match bad_amount {
        Some(a) => Err(Error::Database {
            context: format!("reading effect {:?}", e.name),
            cause: format!("its amount {a:?} is not an integer"),
        }),
        None => Ok(()),
    }
}

/// A check's violating rows: how many, and the first few as JSON.
pub async fn check_rows(store: &Store, c: &CheckDecl) -> Result<(i64, Vec<String>)> {
    let context = format!("running check {:?}", c.name);
    let n = count(store, &format!("({}) AS q", c.query), &context).await?;
    let json = match store {
        Store::Postgres(_) => "row_to_json(q)::text".to_string(),
        // A row as JSON, its BLOBs (our uuids) as text: JSON holds no BLOB.
        Store::Sqlite(_) => {
            let names = columns(store, &c.query).await.map_err(|e| Error::db(context.as_str(), e))?;
            let pairs = names.iter().map(|(n, _)| {
                let col = format!("q.{}", q(n));
                format!(
                    "'{}', CASE WHEN typeof({col}) = 'blob' THEN chaos_text({col}) ELSE {col} END",
                    n.replace('\'', "''")
                )
            });
            format!("json_object({})", pairs.collect::<Vec<_>>().join(", "))
        }
    };
    let mut examples = Vec::new();
    let sql = format!("SELECT {json} FROM ({}) AS q LIMIT {CHECK_EXAMPLES}", c.query);
    text_rows(store, &sql, &context, |mut r| examples.push(r.swap_remove(0).unwrap_or_default())).await?;
    Ok((n, examples))
}

/// The SQL words that differ between the backends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dialect {
    Postgres,
    Sqlite,
}

impl Dialect {
    /// A value as text: a uuid as PostgreSQL prints it, on both.
    fn text(self, e: &str) -> String {
        match self {
            Self::Postgres => format!("({e})::text"),
            Self::Sqlite => format!("chaos_text({e})"),
        }
    }

    /// A value as a whole number, as text.
    fn integer(self, e: &str) -> String {
        match self {
            Self::Postgres => format!("({e})::bigint::text"),
            Self::Sqlite => format!("CAST(CAST({e} AS INTEGER) AS TEXT)"),
        }
    }

    /// The outbox log's `at`, in ms since the epoch, as text.
    fn epoch_ms(self, e: &str) -> String {
        match self {
            Self::Postgres => format!("(extract(epoch FROM {e}) * 1000)::bigint::text"),
            Self::Sqlite => format!("CAST({e} AS TEXT)"),
        }
    }
}

impl Store {
    pub(crate) fn dialect(&self) -> Dialect {
        match self {
            Store::Postgres(_) => Dialect::Postgres,
            Store::Sqlite(_) => Dialect::Sqlite,
        }
    }
}

/// Runs SQL (one or more statements) for its effect only.
async fn execute(store: &Store, sql: &str) -> std::result::Result<(), sqlx::Error> {
    match store {
        Store::Postgres(pg) => sqlx::raw_sql(sql).execute(pg.conn_pool()).await.map(|_| ()),
        Store::Sqlite(s) => sqlx::raw_sql(sql).execute(s.conn_pool()).await.map(|_| ()),
    }
}

/// Prepares one statement without running it: the database's words on
/// what it would refuse to plan.
async fn prepare(store: &Store, sql: &str) -> std::result::Result<(), sqlx::Error> {
    match store {
        Store::Postgres(pg) => pg.conn_pool().describe(sql).await.map(|_| ()),
        Store::Sqlite(s) => s.conn_pool().describe(sql).await.map(|_| ()),
    }
}

/// A query's columns, `(name, type)`, without running it.
async fn columns(store: &Store, query: &str) -> std::result::Result<Vec<(String, String)>, sqlx::Error> {
    let sql = format!("SELECT * FROM ({query}) AS q LIMIT 0");
    Ok(match store {
        Store::Postgres(pg) => {
            let d = pg.conn_pool().describe(&sql).await?;
            d.columns().iter().map(|c| (c.name().to_string(), c.type_info().name().to_string())).collect()
        }
        Store::Sqlite(s) => {
            let d = s.conn_pool().describe(&sql).await?;
            d.columns().iter().map(|c| (c.name().to_string(), c.type_info().name().to_string())).collect()
        }
    })
}

/// How many rows `from` (a table, or a sub-select with its alias) holds.
async fn count(store: &Store, from: &str, context: &str) -> Result<i64> {
    let mut n = None;
    text_rows(store, &format!("SELECT CAST(count(*) AS TEXT) FROM {from}"), context, |mut r| n = r.swap_remove(0))
        .await?;
    n.and_then(|n| n.parse().ok())
        .ok_or_else(|| Error::Database { context: context.to_string(), cause: "no count came back".into() })
}

/// Streams a query's rows, every column read as text (NULL as None).
async fn text_rows(store: &Store, sql: &str, context: &str, mut on: impl FnMut(Vec<Option<String>>)) -> Result<()> {
    let err = |e| Error::db(context, e);
    match store {
        Store::Postgres(pg) => {
            let mut rows = sqlx::query(sql).fetch(pg.conn_pool());
            while let Some(r) = rows.try_next().await.map_err(err)? {
                on((0..r.len()).map(|i| r.try_get(i)).collect::<std::result::Result<_, _>>().map_err(err)?);
            }
        }
        Store::Sqlite(s) => {
            let mut rows = sqlx::query(sql).fetch(s.conn_pool());
            while let Some(r) = rows.try_next().await.map_err(err)? {
                on((0..r.len()).map(|i| r.try_get(i)).collect::<std::result::Result<_, _>>().map_err(err)?);
            }
        }
    }
    Ok(())
}

/// The declared reads on SQLite, against the reference migrations: what a
/// uuid BLOB reads as, the log's trigger, an effect and a check.
#[cfg(test)]
mod sqlite_reads {
    use super::*;
    use crate::scenario::Once;

    fn outbox(malformed: Option<&str>) -> OutboxDecl {
        OutboxDecl {
            table: "outbox".into(),
            id: "id".into(),
            key: "aggregate_id".into(),
            kind: "event_type".into(),
            payload: "payload".into(),
            published: Published::Column("published_at".into()),
            malformed: malformed.map(str::to_string),
        }
    }

    #[tokio::test]
    async fn the_log_and_the_reads_write_a_uuid_as_postgresql_does() {
        let dir = tempfile::tempdir().unwrap();
        let s = super::super::sqlite::SqliteStore::open(&dir.path().join("d.sqlite"), 2).await.unwrap();
        let store = Store::Sqlite(s);
        let o = outbox(Some(r#"payload NOT LIKE '%"payment_id"%'"#));
        install_outbox_log(&store, &o).await.unwrap();
        let (id, key, poison) = (uuid::Uuid::new_v4(), uuid::Uuid::new_v4(), uuid::Uuid::new_v4());
        let insert = "INSERT INTO outbox (id, aggregate_id, event_type, payload) VALUES (?, ?, 'payment.captured', ?)";
        let pool = match &store {
            Store::Sqlite(s) => s.conn_pool().clone(),
            Store::Postgres(_) => unreachable!(),
        };
        for (i, payload) in [(id, r#"{"payment_id": 1}"#), (poison, r#"{"poison": true}"#)] {
            sqlx::query(insert).bind(i).bind(key).bind(payload).execute(&pool).await.unwrap();
        }
        sqlx::query("INSERT INTO receipts (payment_id, message_id) VALUES (?, ?)")
            .bind(key)
            .bind(id)
            .execute(&pool)
            .await
            .unwrap();
        let mut logged = Vec::new();
        outbox_log(&store, &o, |e| logged.push(e)).await.unwrap();
        assert_eq!(logged.len(), 2);
        assert_eq!(
            (logged[0].id.as_str(), logged[0].key.as_str()),
            (id.to_string().as_str(), key.to_string().as_str())
        );
        assert_eq!((logged[0].malformed, logged[1].malformed), (false, true));
        assert!(logged[0].at_epoch_ms > 1_700_000_000_000, "{}", logged[0].at_epoch_ms);
        let mut left = Vec::new();
        leftovers(&store, &o, |id| left.push(id)).await.unwrap();
        assert_eq!(left, [id.to_string(), poison.to_string()]);
        let receipts = EffectDecl {
            name: "receipts".into(),
            query: "SELECT message_id, payment_id AS key FROM receipts".into(),
            provider: None,
            once: Once::PerMessage,
            types: vec![],
            key_value: None,
            conserve: None,
        };
        let mut rows = Vec::new();
        effect_rows(&store, &receipts, |r| rows.push(r)).await.unwrap();
        assert_eq!(rows, [EffectRow { message_id: Some(id.to_string()), key: Some(key.to_string()), amount: None }]);
        let check = CheckDecl {
            name: "every receipt's event is logged".into(),
            query: "SELECT r.payment_id, 3 AS n FROM receipts r LEFT JOIN chaos_outbox_log l ON l.id = chaos_text(r.message_id) WHERE l.key IS DISTINCT FROM chaos_text(r.payment_id) OR true".into(),
        };
        let (n, examples) = check_rows(&store, &check).await.unwrap();
        assert_eq!(n, 1);
        assert_eq!(examples, [format!(r#"{{"payment_id":"{key}","n":3}}"#)]);
        assert_eq!(super::logged(&store).await.unwrap(), 2);
    }

    /// An envelope: the key and type read out of the payload by
    /// expressions, one qualified by the table's name, one ending in a
    /// comment; the id a column. The log, the probe and the reads of the
    /// unpublished rows all evaluate them.
    #[tokio::test]
    async fn expressions_over_the_row_are_read_as_columns_are() {
        let dir = tempfile::tempdir().unwrap();
        let s = super::super::sqlite::SqliteStore::open(&dir.path().join("e.sqlite"), 2).await.unwrap();
        let store = Store::Sqlite(s);
        let o = OutboxDecl {
            key: "json_extract(outbox.payload, '$.order') -- the envelope's key".into(),
            kind: "upper(event_type)".into(),
            ..outbox(None)
        };
        assert!(matches!(o.id, OutboxField::Column(_)) && matches!(o.key, OutboxField::Expression(_)));
        let sys = System { outbox: o.clone(), ..crate::scenario::payments_declaration(false).unwrap() };
        probe_outbox(&store, &sys).await.unwrap();
        install_outbox_log(&store, &o).await.unwrap();
        let pool = match &store {
            Store::Sqlite(s) => s.conn_pool().clone(),
            Store::Postgres(_) => unreachable!(),
        };
        let id = uuid::Uuid::new_v4();
        sqlx::query("INSERT INTO outbox (id, aggregate_id, event_type, payload) VALUES (?, ?, 'placed', ?)")
            .bind(id)
            .bind(uuid::Uuid::new_v4())
            .bind(r#"{"order": "o-1", "quantity": 3}"#)
            .execute(&pool)
            .await
            .unwrap();
        let mut logged = Vec::new();
        outbox_log(&store, &o, |e| logged.push(e)).await.unwrap();
        assert_eq!(logged.len(), 1);
        let e = &logged[0];
        assert_eq!((e.id.as_str(), e.key.as_str(), e.kind.as_str()), (id.to_string().as_str(), "o-1", "PLACED"));
        assert_eq!(unpublished_keys(&store, &o).await.unwrap(), Some(vec!["o-1".to_string()]));
        let mut left = Vec::new();
        leftovers(&store, &o, |id| left.push(id)).await.unwrap();
        assert_eq!(left, [id.to_string()]);

        let bad = OutboxDecl { kind: "upper(event_typ)".into(), ..o };
        let sys = System { outbox: bad, ..sys };
        let err = probe_outbox(&store, &sys).await.unwrap_err();
        assert_eq!(err.key, "system.outbox.type");
        assert!(err.message.contains("no such column: event_typ"), "{}", err.message);
    }

    #[tokio::test]
    async fn chaos_text_writes_other_values_as_sqlite_does() {
        let dir = tempfile::tempdir().unwrap();
        let s = super::super::sqlite::SqliteStore::open(&dir.path().join("t.sqlite"), 1).await.unwrap();
        let store = Store::Sqlite(s);
        let mut got = Vec::new();
        let sql = "SELECT chaos_text(x'00ff'), chaos_text(42), chaos_text('é'), chaos_text(NULL)";
        text_rows(&store, sql, "test", |r| got = r).await.unwrap();
        assert_eq!(got, [Some("00ff".to_string()), Some("42".into()), Some("é".into()), None]);
    }
}
