//! The rules that tie a scenario to the services a run has: what the fault
//! proxy, a program under test and the timeline's service faults need.
//! The registry says what each fault point needs; these rules only read it.

use super::Scenario;
use crate::faults::{FaultPoint, Strike};

impl Scenario {
    /// Whether this scenario can run with PostgreSQL (`postgres`, else
    /// SQLite) and a real Kafka (`kafka`, else the mock cluster). The error
    /// names what needs the missing service and how to give it.
    pub fn preflight(&self, postgres: bool, kafka: bool) -> Result<(), String> {
        // First: without PostgreSQL nothing else of a declared system matters.
        if self.system.is_some() && !postgres {
            return Err("a `[system]` scenario runs against PostgreSQL only (your schema, outbox and effect queries): pass --database-url or set DATABASE_URL".into());
        }
        if self.proxied() && !postgres {
            let what = FaultPoint::ALL
                .iter()
                .find(|p| p.proxied() && self.faults.get(**p) > 0.0)
                .map_or("`[proxy]`".to_string(), |p| format!("`faults.{}`", p.key()));
            return Err(format!(
                "{what} needs the fault proxy, which sits on PostgreSQL's wire protocol: pass --database-url or set DATABASE_URL"
            ));
        }
        // The mock cluster advertises its own address, and only a broker with
        // a listener per slot sends its clients back through the proxy.
        if self.proxies_kafka() && !kafka {
            let what = FaultPoint::ALL
                .iter()
                .find(|p| p.on_kafka_wire() && self.faults.get(**p) > 0.0)
                .map_or("`proxy.kafka`".to_string(), |p| format!("`faults.{}`", p.key()));
            return Err(format!(
                "{what} needs the fault proxy in front of a real Kafka broker with a listener per slot (`scripts/services.sh up` configures them): pass --brokers or set KAFKA_BROKERS"
            ));
        }
        // A leader to kill takes a cluster; the mock cluster has one broker.
        if self.timeline.iter().any(|t| t.point == FaultPoint::BrokerKillLeader) && !kafka {
            return Err("the nemesis timeline's broker.kill_leader needs a real Kafka cluster (`scripts/services.sh up cluster`): pass --brokers or set KAFKA_BROKERS".into());
        }
        // The broker's faults act on a local Kafka's process, or on the mock
        // cluster through its own controls; the database's need PostgreSQL.
        if let Some(t) = self.timeline.iter().find(|t| t.point.strike() == Strike::Database).filter(|_| !postgres) {
            return Err(format!(
                "the nemesis timeline's {} needs PostgreSQL (pass --database-url or set DATABASE_URL); SQLite has no server to restart or sessions to end",
                t.point.name()
            ));
        }
        let under_test = [("notifier", &self.notifier.command), ("relay", &self.relay.command)];
        if let (Some((role, _)), false) = (under_test.iter().find(|c| c.1.is_some()), postgres) {
            return Err(format!(
                "`{role}.command` runs a program under test against PostgreSQL only: pass --database-url or set DATABASE_URL"
            ));
        }
        Ok(())
    }
}
