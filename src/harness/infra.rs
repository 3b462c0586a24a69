//! Which PostgreSQL and Kafka a run talks to, and the names of the run's
//! private corner of each: a schema, a topic and a consumer group, all
//! derived from the run id. Talking to the broker is [`crate::broker`]'s.
//!
//! Configuration is looked up in this order: flags, then the environment
//! (`DATABASE_URL`, `KAFKA_BROKERS`; clap reads both), then the scenario's
//! `[infra]` table.

use crate::error::{Error, Result};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Every wait on a network service is bounded by this, or by less.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(8);

/// The endpoints a run uses, resolved from flags, environment and scenario.
/// `None` means embedded: SQLite in the run's file, librdkafka's mock cluster.
#[derive(Debug, Clone)]
pub struct Endpoints {
    pub database_url: Option<String>,
    pub brokers: Option<String>,
}

impl Endpoints {
    pub fn resolve(
        flag_db: Option<String>,
        flag_brokers: Option<String>,
        scenario: &crate::scenario::Scenario,
    ) -> Result<Self> {
        let database_url = flag_db.filter(|s| !s.is_empty()).or_else(|| scenario.infra_database_url.clone());
        let brokers = flag_brokers.filter(|s| !s.is_empty()).or_else(|| scenario.infra_kafka_brokers.clone());
        if let Some(url) = &database_url {
            if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
                return Err(Error::Usage(format!(
                    "database url {} is not a PostgreSQL url; expected postgres://user:password@host:port/database, or leave DATABASE_URL unset for the embedded SQLite",
                    redact(url)
                )));
            }
        }
        Ok(Self { database_url, brokers })
    }
}

/// The names of everything one run creates. All derive from the run id, so
/// `chaos clean` can find them and two runs never share any.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct RunNames {
    pub run_id: String,
    pub schema: String,
    pub topic: String,
    pub group: String,
}

impl RunNames {
    pub fn new() -> Self {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        let tag: u16 = rand::random();
        let run_id = format!("{}-{tag:04x}", utc_stamp(now.as_secs()));
        Self::from_id(&run_id)
    }

    pub fn from_id(run_id: &str) -> Self {
        let flat = run_id.replace('-', "_");
        Self {
            run_id: run_id.to_string(),
            schema: format!("chaos_{flat}"),
            topic: format!("chaos.{run_id}.payments"),
            group: format!("chaos.{run_id}.notifier"),
        }
    }
}

impl Default for RunNames {
    fn default() -> Self {
        Self::new()
    }
}

/// `20261130-034512`, UTC, from seconds since the epoch.
pub fn utc_stamp(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil-from-days (Howard Hinnant's algorithm): no date crate for one line.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + if m <= 2 { 1 } else { 0 };
    format!("{y:04}{m:02}{d:02}-{:02}{:02}{:02}", rem / 3600, (rem % 3600) / 60, rem % 60)
}

/// Removes the password from anything that may contain a URL.
pub fn redact(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("://") {
        let (head, tail) = rest.split_at(i + 3);
        out.push_str(head);
        let end = tail.find(|c: char| c.is_whitespace() || c == '/' || c == '"' || c == '\'').unwrap_or(tail.len());
        let authority = &tail[..end];
        match (authority.rfind('@'), authority.find(':')) {
            (Some(at), Some(colon)) if colon < at => {
                out.push_str(&authority[..colon]);
                out.push_str(":***");
                out.push_str(&authority[at..]);
            }
            _ => out.push_str(authority),
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

/// `host:port/database` of a PostgreSQL url, for messages.
pub fn db_endpoint(url: &str) -> String {
    let r = redact(url);
    let after = r.split("://").nth(1).unwrap_or(&r);
    let after = after.rsplit('@').next().unwrap_or(after);
    after.split('?').next().unwrap_or(after).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_passwords_only() {
        assert_eq!(redact("postgres://chaos:s3cret@127.0.0.1:5432/db"), "postgres://chaos:***@127.0.0.1:5432/db");
        assert_eq!(redact("error at postgres://u@h/db ok"), "error at postgres://u@h/db ok");
        assert_eq!(
            redact("x postgres://a:b@h/d and postgres://c:d@h2/e"),
            "x postgres://a:***@h/d and postgres://c:***@h2/e"
        );
        assert_eq!(db_endpoint("postgres://chaos:pw@127.0.0.1:5432/chaos?sslmode=disable"), "127.0.0.1:5432/chaos");
    }

    #[test]
    fn stamp_is_utc_calendar() {
        assert_eq!(utc_stamp(0), "19700101-000000");
        assert_eq!(utc_stamp(1_796_010_000), "20261130-034000");
    }

    #[test]
    fn names_derive_from_run_id() {
        let n = RunNames::from_id("20261130-034000-ab12");
        assert_eq!(n.schema, "chaos_20261130_034000_ab12");
        assert_eq!(n.topic, "chaos.20261130-034000-ab12.payments");
    }
}
