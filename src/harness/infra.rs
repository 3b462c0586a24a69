//! Which PostgreSQL and Kafka a run talks to. The names of the run's
//! private corner of each are [`crate::domain::names`]; talking to the
//! broker is [`crate::broker`]'s.
//!
//! Configuration is looked up in this order: flags, then the environment
//! (`DATABASE_URL`, `KAFKA_BROKERS`; clap reads both), then the scenario's
//! `[infra]` table.

use crate::error::{redact, Error, Result};

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
