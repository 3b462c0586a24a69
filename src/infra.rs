//! Which PostgreSQL and Kafka a run talks to, and the run's private corner of
//! each: a schema, a topic and a consumer group named after the run id.
//!
//! Configuration is looked up in this order: flags, then the environment
//! (`DATABASE_URL`, `KAFKA_BROKERS`; clap reads both), then the scenario's
//! `[infra]` table.

use crate::error::{Error, Result};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
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

/// Client settings shared by every Kafka client of a run. The timeouts keep
/// librdkafka's own retry loops bounded.
pub fn kafka_config(brokers: &str) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", brokers)
        .set("socket.timeout.ms", "10000")
        .set("socket.connection.setup.timeout.ms", "5000")
        // A new client learns the broker from the bootstrap connection, then
        // waits out the initial reconnect backoff (100 ms by default, with
        // jitter) before connecting to it by its id. Every crashed notifier
        // and relay is a new client: measured, a notifier was back 61 ms
        // after its crash with the default and 22 ms with 10 ms. The backoff
        // still grows to the 1 s maximum while a broker stays down.
        .set("reconnect.backoff.ms", "10")
        .set("reconnect.backoff.max.ms", "1000")
        .set("topic.metadata.refresh.interval.ms", "5000")
        .set("log_level", "3");
    c
}

/// Checks that the brokers answer within `timeout`. Returns the broker ids
/// and addresses.
pub async fn kafka_ping(brokers: &str, timeout: Duration) -> Result<Vec<(i32, String)>> {
    let admin: AdminClient<DefaultClientContext> = kafka_config(brokers)
        .create()
        .map_err(|e| Error::KafkaUnreachable { brokers: brokers.into(), cause: e.to_string() })?;
    let b = brokers.to_string();
    let res = tokio::task::spawn_blocking(move || {
        let md = admin.inner().fetch_metadata(None, timeout);
        // The admin client is dropped here, off the async threads: its drop blocks.
        md.map(|m| m.brokers().iter().map(|b| (b.id(), format!("{}:{}", b.host(), b.port()))).collect::<Vec<_>>())
    })
    .await
    .map_err(|e| Error::Internal(e.to_string()))?;
    res.map_err(|e| Error::KafkaUnreachable { brokers: b, cause: e.to_string() })
}

/// Watches how many messages a topic holds (the sum of its partitions'
/// high watermarks), every `every`, until `stop` is set; sends each growth.
/// One client for the whole watch, on a blocking thread.
pub fn watch_topic_growth(
    brokers: &str,
    topic: &str,
    partitions: i32,
    every: Duration,
    stop: impl Fn() -> bool + Send + 'static,
    grew: tokio::sync::mpsc::UnboundedSender<u64>,
) -> tokio::task::JoinHandle<()> {
    let (brokers, topic) = (brokers.to_string(), topic.to_string());
    tokio::task::spawn_blocking(move || {
        let Ok(c) = kafka_config(&brokers).create::<rdkafka::consumer::BaseConsumer>() else { return };
        let mut seen = 0i64;
        while !stop() {
            let total: i64 = (0..partitions)
                .filter_map(|p| rdkafka::consumer::Consumer::fetch_watermarks(&c, &topic, p, CONNECT_TIMEOUT).ok())
                .map(|(_, high)| high)
                .sum();
            if total > seen {
                if grew.send((total - seen) as u64).is_err() {
                    return;
                }
                seen = total;
            }
            std::thread::sleep(every);
        }
    })
}

/// How many members a consumer group has, as the group coordinator says.
pub async fn group_members(brokers: &str, group: &str) -> Result<usize> {
    let admin: AdminClient<DefaultClientContext> =
        kafka_config(brokers).create().map_err(|e| Error::kafka("creating the admin client", e))?;
    let g = group.to_string();
    tokio::task::spawn_blocking(move || {
        let list = admin.inner().fetch_group_list(Some(&g), CONNECT_TIMEOUT);
        // Dropped here, off the async threads: its drop blocks.
        list.map(|l| l.groups().iter().filter(|x| x.name() == g).map(|x| x.members().len()).sum())
    })
    .await
    .map_err(|e| Error::Internal(e.to_string()))?
    .map_err(|e| Error::kafka("describing the consumer group", e))
}

/// Creates the run's topic and waits for the broker to confirm it.
pub async fn create_topic(brokers: &str, topic: &str, partitions: i32) -> Result<()> {
    let admin: AdminClient<DefaultClientContext> =
        kafka_config(brokers).create().map_err(|e| Error::kafka("creating the admin client", e))?;
    let opts = AdminOptions::new().operation_timeout(Some(CONNECT_TIMEOUT)).request_timeout(Some(CONNECT_TIMEOUT));
    let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
    let result =
        tokio::time::timeout(CONNECT_TIMEOUT + Duration::from_secs(2), admin.create_topics([&new], &opts)).await;
    tokio::task::spawn_blocking(move || drop(admin));
    let results = match result {
        Err(_) => {
            return Err(Error::KafkaUnreachable {
                brokers: brokers.into(),
                cause: format!("creating topic {topic} timed out"),
            })
        }
        Ok(r) => r.map_err(|e| Error::kafka(format!("creating topic {topic}"), e))?,
    };
    for r in results {
        if let Err((name, code)) = r {
            return Err(Error::Kafka {
                context: format!("creating topic {name}"),
                cause: format!(
                    "{code}; check that the broker allows topic creation and has room for {partitions} partitions"
                ),
            });
        }
    }
    Ok(())
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
