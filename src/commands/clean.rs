//! `chaos clean --older-than <duration>`: removes what old runs left behind,
//! their PostgreSQL schemas, Kafka topics and consumer groups, and SQLite
//! files, and the replication slots and publications a change-data-capture
//! relay (Debezium) made under a run's name. It only touches names that carry a run id (`chaos_20261130_034000_ab12`,
//! `chaos.20261130-034000-ab12.…`), which only the harness creates, and
//! only when the run id's time is older than the cut-off. Reports are kept,
//! unless `--reports` asks for them too.

use crate::domain::names::CONNECT_TIMEOUT;
use crate::error::{db_endpoint, redact};
use crate::error::{Error, Result};
use sqlx::{ConnectOptions, Connection, Row};
use std::path::Path;
use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub use crate::domain::names::run_id_time;

/// The run id inside a schema, topic, group or file name the harness made.
pub fn run_id_of(name: &str) -> Option<String> {
    let id = if let Some(rest) = name.strip_prefix("chaos_") {
        rest.replace('_', "-")
    } else if let Some(rest) = name.strip_prefix("chaos.") {
        rest.split('.').next()?.to_string()
    } else {
        name.split('.').next()?.to_string()
    };
    run_id_time(&id).map(|_| id)
}

fn is_old(name: &str, cutoff: u64) -> bool {
    run_id_of(name).and_then(|id| run_id_time(&id)).map(|t| t < cutoff).unwrap_or(false)
}

/// What was (or, with `dry_run`, would be) removed.
#[derive(Debug, Default, serde::Serialize)]
pub struct Cleaned {
    pub schemas: Vec<String>,
    /// "slot chaos_…" and "publication chaos_…".
    pub replication: Vec<String>,
    pub topics: Vec<String>,
    pub groups: Vec<String>,
    pub files: Vec<String>,
}

pub async fn clean(
    older_than: Duration,
    database_url: Option<&str>,
    brokers: Option<&str>,
    reports_dir: &Path,
    dry_run: bool,
    reports: bool,
) -> Result<Cleaned> {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
    let cutoff = now.saturating_sub(older_than.as_secs());
    let mut out = Cleaned::default();
    if let Some(url) = database_url {
        (out.schemas, out.replication) = schemas(url, cutoff, dry_run).await?;
    }
    if let Some(brokers) = brokers {
        let kafka = crate::broker::attach(brokers, false, crate::broker::Attacher::Harness);
        let (topics, groups) = kafka.list_names().await?;
        out.topics = topics.into_iter().filter(|t| t.starts_with("chaos.") && is_old(t, cutoff)).collect();
        out.groups = groups.into_iter().filter(|g| g.starts_with("chaos.") && is_old(g, cutoff)).collect();
        if !dry_run {
            kafka.delete_names(&out.topics, &out.groups).await?;
        }
    }
    let mut suffixes = vec![".sqlite", ".sqlite-wal", ".sqlite-shm"];
    if reports {
        suffixes.extend([".json", ".md", ".html", ".xml"]);
    }
    out.files = run_files(reports_dir, &suffixes, cutoff, dry_run)?;
    Ok(out)
}

/// The old runs' PostgreSQL schemas, and their replication slots and
/// publications, dropped unless `dry_run`.
async fn schemas(url: &str, cutoff: u64, dry_run: bool) -> Result<(Vec<String>, Vec<String>)> {
    let endpoint = db_endpoint(url);
    let unreachable = |cause: String| Error::DatabaseUnreachable { endpoint: endpoint.clone(), cause };
    let opts = sqlx::postgres::PgConnectOptions::from_str(url).map_err(|e| unreachable(redact(&e.to_string())))?;
    let mut c = tokio::time::timeout(CONNECT_TIMEOUT, opts.connect())
        .await
        .map_err(|_| unreachable("no answer".into()))?
        .map_err(|e| unreachable(redact(&e.to_string())))?;
    let names: Vec<String> = sqlx::query("SELECT nspname FROM pg_namespace WHERE nspname LIKE 'chaos\\_%'")
        .fetch_all(&mut c)
        .await
        .map_err(|e| Error::db("listing schemas", e))?
        .into_iter()
        .map(|r| r.get(0))
        .collect();
    let mut removed = Vec::new();
    for n in names.into_iter().filter(|n| is_old(n, cutoff)) {
        if !dry_run {
            sqlx::query(&format!("DROP SCHEMA \"{n}\" CASCADE"))
                .execute(&mut c)
                .await
                .map_err(|e| Error::db(format!("dropping schema {n}"), e))?;
        }
        removed.push(n);
    }
    let replication = match dry_run {
        false => crate::store::postgres::drop_replication_where(&mut c, |n| is_old(n, cutoff)).await?,
        true => replication_names(&mut c, cutoff).await?,
    };
    let _ = c.close().await;
    Ok((removed, replication))
}

/// The old runs' replication slots and publications, named as
/// [`crate::store::postgres::drop_replication_where`] names what it drops.
async fn replication_names(c: &mut sqlx::PgConnection, cutoff: u64) -> Result<Vec<String>> {
    let rows: Vec<(String, String)> = sqlx::query_as(
        "SELECT 'slot', slot_name::text FROM pg_replication_slots WHERE slot_name LIKE 'chaos%' \
         UNION ALL SELECT 'publication', pubname::text FROM pg_publication WHERE pubname LIKE 'chaos%'",
    )
    .fetch_all(&mut *c)
    .await
    .map_err(|e| Error::db("listing replication slots and publications", e))?;
    Ok(rows.into_iter().filter(|(_, n)| is_old(n, cutoff)).map(|(k, n)| format!("{k} {n}")).collect())
}

/// The old runs' files in the reports folder with one of these suffixes,
/// removed unless `dry_run`. Only names that start with a run id: a sweep's
/// summary (`sweep-…`) or a file of the user's is never one.
fn run_files(reports_dir: &Path, suffixes: &[&str], cutoff: u64, dry_run: bool) -> Result<Vec<String>> {
    let mut removed = Vec::new();
    let Ok(entries) = std::fs::read_dir(reports_dir) else { return Ok(removed) };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let wanted = suffixes.iter().any(|s| name.ends_with(s));
        if wanted && is_old(&name, cutoff) {
            if !dry_run {
                std::fs::remove_file(e.path())
                    .map_err(|err| Error::Write { path: e.path(), cause: err.to_string() })?;
            }
            removed.push(e.path().display().to_string());
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_harness_names_match() {
        assert_eq!(run_id_time("19700101-000000-0000"), Some(0));
        assert_eq!(run_id_time("20261130-034000-ab12"), Some(1_796_010_000));
        assert_eq!(run_id_of("chaos_20261130_034000_ab12").as_deref(), Some("20261130-034000-ab12"));
        assert_eq!(run_id_of("chaos.20261130-034000-ab12.payments").as_deref(), Some("20261130-034000-ab12"));
        assert_eq!(run_id_of("20261130-034000-ab12.sqlite").as_deref(), Some("20261130-034000-ab12"));
        for other in
            ["chaos_keep", "chaos.payments", "public", "chaos_20261130_034000_zz12", "chaos_2026113_034000_ab12"]
        {
            assert_eq!(run_id_of(other), None, "{other}");
        }
        assert!(is_old("chaos_20200101_000000_abcd", 1_796_010_000));
        assert!(!is_old("chaos_20261130_034000_ab12", 1_796_010_000));
    }
}
