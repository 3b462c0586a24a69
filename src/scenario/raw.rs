//! The scenario file as written: serde structs that mirror the TOML, with
//! every default in their `Default` impls and nowhere else. Each value keeps
//! its span, so that validation can name the line and column.

use super::*;

/// The scenario file as written. `deny_unknown_fields` everywhere: a misspelt
/// key must fail loudly, not be silently ignored.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RawScenario {
    pub name: Option<String>,
    pub description: Option<String>,
    #[schemars(with = "i64")]
    pub seed: Spanned<i64>,
    pub workload: RawWorkload,
    pub topic: RawTopic,
    pub relay: RawRelay,
    pub notifier: RawNotifier,
    pub faults: RawFaults,
    pub nemesis: RawNemesis,
    pub proxy: RawProxy,
    pub retention: RawRetention,
    pub run: RawRun,
    pub expect: RawExpect,
    pub infra: RawInfra,
    /// A declared system of the user's own (docs/contract.md section 8).
    pub system: Option<super::system::RawSystem>,
}

impl Default for RawScenario {
    fn default() -> Self {
        Self {
            name: None,
            description: None,
            seed: Spanned::new(0..0, 42),
            workload: RawWorkload::default(),
            topic: RawTopic::default(),
            relay: RawRelay::default(),
            notifier: RawNotifier::default(),
            faults: RawFaults::default(),
            nemesis: RawNemesis::default(),
            proxy: RawProxy::default(),
            retention: RawRetention::default(),
            run: RawRun::default(),
            expect: RawExpect::default(),
            infra: RawInfra::default(),
            system: None,
        }
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RawWorkload {
    /// Payments to write; each yields an `authorized` and a `captured` event.
    #[schemars(with = "i64")]
    pub payments: Spanned<i64>,
    /// Concurrent payment-service producers.
    #[schemars(with = "i64")]
    pub producers: Spanned<i64>,
    /// Distinct customer accounts, for the loyalty counter.
    #[schemars(with = "i64")]
    pub accounts: Spanned<i64>,
    /// `"outbox"` (correct) or `"dual-write"` (no outbox: commit, then produce).
    #[schemars(with = "PublishMode")]
    pub publish: Spanned<String>,
    /// Payments per transaction, as a busy service batching requests would.
    #[schemars(with = "i64")]
    pub batch: Spanned<i64>,
    /// After a write whose outcome is unknown (its COMMIT failed or its
    /// connection broke): `"idempotent"` (look the payments up by their
    /// ids, write them again only if absent) or `"new-id"` (a mistake: write
    /// them again under new ids).
    #[schemars(with = "WorkloadRetry")]
    pub retry: Spanned<String>,
    /// The seconds over which the payments (or a `[system]`'s operations)
    /// are started, evenly; absent: as fast as they go. A spread workload
    /// lasts as long for a slow program as for a fast one, so per-second
    /// fault rates strike both alike.
    #[schemars(with = "Option<i64>")]
    pub spread_secs: Option<Spanned<i64>>,
}

impl Default for RawWorkload {
    fn default() -> Self {
        Self {
            payments: sp(1000),
            producers: sp(4),
            accounts: sp(100),
            publish: sp("outbox".into()),
            batch: sp(1),
            retry: sp("idempotent".into()),
            spread_secs: None,
        }
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RawTopic {
    #[schemars(with = "i64")]
    pub partitions: Spanned<i64>,
}

impl Default for RawTopic {
    fn default() -> Self {
        Self { partitions: sp(6) }
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RawRelay {
    #[schemars(with = "i64")]
    pub instances: Spanned<i64>,
    #[schemars(with = "i64")]
    pub batch_size: Spanned<i64>,
    #[schemars(with = "i64")]
    pub poll_interval_ms: Spanned<i64>,
    #[schemars(with = "i64")]
    pub restart_delay_ms: Spanned<i64>,
    /// `"publish-then-mark"` (correct), `"mark-then-publish"` or
    /// `"delete-then-publish"`.
    #[schemars(with = "RelayOrder")]
    pub order: Spanned<String>,
    /// `"outbox"` (correct: the outbox row's id) or `"minted"` (a fresh id per publish).
    #[schemars(with = "RelayEventId")]
    pub event_id: Spanned<String>,
    /// `"awaited"` (correct) or `"fire-and-forget"`.
    #[schemars(with = "RelayAcks")]
    pub acks: Spanned<String>,
    /// `"unpublished"` (correct: every unpublished row) or `"seq"` (the
    /// rows past the highest `seq` it published).
    #[schemars(with = "RelayCursor")]
    pub cursor: Spanned<String>,
    /// `"idempotent"` (correct: acks from every in-sync replica) or
    /// `"leader-ack"` (acks=1, no idempotence).
    #[schemars(with = "RelayProducer")]
    pub producer: Spanned<String>,
    /// A program under test run in place of the reference relays
    /// (docs/contract.md, section 7).
    #[schemars(with = "Option<Vec<String>>")]
    pub command: Option<Spanned<Vec<String>>>,
    /// How long each instance of the program may take to show its
    /// database session.
    #[schemars(with = "i64")]
    pub ready_timeout_secs: Spanned<i64>,
}

impl Default for RawRelay {
    fn default() -> Self {
        Self {
            instances: sp(2),
            batch_size: sp(50),
            poll_interval_ms: sp(20),
            restart_delay_ms: sp(50),
            order: sp("publish-then-mark".into()),
            event_id: sp("outbox".into()),
            acks: sp("awaited".into()),
            cursor: sp("unpublished".into()),
            producer: sp("idempotent".into()),
            command: None,
            ready_timeout_secs: sp(30),
        }
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RawNotifier {
    #[schemars(with = "i64")]
    pub instances: Spanned<i64>,
    #[schemars(with = "i64")]
    pub batch_size: Spanned<i64>,
    /// `"on"` (the correct pipeline) or one of the broken variants, see
    /// [`InboxMode`].
    #[schemars(with = "InboxMode")]
    pub inbox: Spanned<String>,
    /// `"state-guard"` (correct) or `"last-write-wins"`.
    #[schemars(with = "ProjectionMode")]
    pub projection: Spanned<String>,
    /// `"keyed"` (the correct email), `"off"` or a broken variant, see
    /// [`EmailMode`]. Unset: `"keyed"` for the reference notifier, `"off"`
    /// for a program under test.
    #[schemars(with = "Option<EmailMode>")]
    pub email: Option<Spanned<String>>,
    #[schemars(with = "i64")]
    pub session_timeout_ms: Spanned<i64>,
    #[schemars(with = "i64")]
    pub restart_delay_ms: Spanned<i64>,
    /// A program under test run in place of the reference notifier, as an
    /// argument vector: `["python3", "consumer.py"]` (docs/contract.md).
    #[schemars(with = "Option<Vec<String>>")]
    pub command: Option<Spanned<Vec<String>>>,
    /// How long the program's instances may take to join the group.
    #[schemars(with = "i64")]
    pub ready_timeout_secs: Spanned<i64>,
}

impl Default for RawNotifier {
    fn default() -> Self {
        Self {
            instances: sp(2),
            batch_size: sp(50),
            inbox: sp("on".to_string()),
            projection: sp("state-guard".to_string()),
            email: None,
            session_timeout_ms: sp(6000),
            restart_delay_ms: sp(50),
            command: None,
            ready_timeout_secs: sp(30),
        }
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RawRetention {
    /// Published outbox rows older than this are purged, e.g. "7d", "1h", "30s".
    #[schemars(with = "String")]
    pub outbox: Spanned<String>,
    /// Inbox rows older than this are purged.
    #[schemars(with = "String")]
    pub inbox: Spanned<String>,
    #[schemars(with = "i64")]
    pub purge_interval_ms: Spanned<i64>,
}

impl Default for RawRetention {
    fn default() -> Self {
        Self { outbox: sp("7d".into()), inbox: sp("7d".into()), purge_interval_ms: sp(1000) }
    }
}

/// How the harness's own acts on processes are shaped; their rates are in
/// `[faults]` (`process_kill`, `process_pause`).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RawNemesis {
    /// How long a `process.pause` keeps a process stopped; unset, 2 s past
    /// `[notifier] session_timeout_ms`.
    #[schemars(with = "f64")]
    pub pause_secs: Spanned<f64>,
    /// Service faults at given times (`[[nemesis.timeline]]`).
    pub timeline: Vec<RawTimed>,
    /// How `broker.kill` starts the broker again.
    #[schemars(with = "Vec<String>")]
    pub broker_restart: Spanned<Vec<String>>,
    /// How `db.restart` restarts PostgreSQL in immediate mode.
    #[schemars(with = "Vec<String>")]
    pub database_restart: Spanned<Vec<String>>,
    /// What an aimed kill's rate counts: `"per-second"` (each second of a
    /// process's life arms it for one of its next four windows: the default, so that one
    /// scenario strikes every program alike) or `"per-occurrence"` (each
    /// window).
    #[schemars(with = "crate::faults::Aimed")]
    pub aimed: Spanned<String>,
    /// The share of the payments written after which no process is killed
    /// or paused: a calm stretch to the end of the run, in which a bug that
    /// a restart heals still shows. Unset: never calm.
    #[schemars(with = "Option<f64>")]
    pub calm_after: Option<Spanned<f64>>,
    /// The processes `process_kill` and `process_pause` strike: roles
    /// (`"relay"`, `"notifier"`, `"service"`) or instances
    /// (`"notifier-2"`). Empty: every process. A pause aimed at the
    /// consumers makes a zombie without stalling the service.
    #[schemars(with = "Vec<String>")]
    pub targets: Vec<Spanned<String>>,
}

impl Default for RawNemesis {
    fn default() -> Self {
        let argv = |a: &[&str]| sp(a.iter().map(|s| s.to_string()).collect());
        Self {
            pause_secs: sp(3.0),
            timeline: Vec::new(),
            broker_restart: argv(&["scripts/services.sh", "up", "kafka"]),
            database_restart: argv(&["scripts/services.sh", "restart-immediate", "postgres"]),
            aimed: sp("per-second".into()),
            calm_after: None,
            targets: Vec::new(),
        }
    }
}

/// One `[[nemesis.timeline]]` entry as written.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawTimed {
    /// A service fault's name: `broker.pause`, `broker.kill`, `db.restart`,
    /// `db.terminate_backends`.
    #[schemars(with = "crate::faults::TimelineFault")]
    pub fault: Spanned<String>,
    /// After the workload starts, e.g. "2s".
    #[schemars(with = "String")]
    pub at: Spanned<String>,
    /// How long the broker stays paused or down (default 2s).
    #[serde(rename = "for")]
    #[schemars(with = "Option<String>")]
    pub lasts: Option<Spanned<String>>,
    /// Strike again this often until the pipeline has drained.
    #[schemars(with = "Option<String>")]
    pub every: Option<Spanned<String>>,
}

/// The fault proxy between the components and PostgreSQL
/// ([`crate::nemesis::proxy`]): whom it stands in front of and how it shapes their
/// traffic. Its faults' rates are in `[faults]` (`net_*`, `db_*`).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RawProxy {
    /// The component instances behind the proxy: roles (`"workload"`,
    /// `"relay"`, `"notifier"`) or instances (`"notifier-2"`). Empty: all.
    #[schemars(with = "Vec<String>")]
    pub targets: Vec<Spanned<String>>,
    #[schemars(with = "i64")]
    pub latency_ms: Spanned<i64>,
    #[schemars(with = "i64")]
    pub jitter_ms: Spanned<i64>,
    /// Per direction and connection; 0 is unlimited.
    #[schemars(with = "i64")]
    pub bandwidth_kbps: Spanned<i64>,
    /// How long a `net.blackhole` holds a component's traffic.
    #[schemars(with = "i64")]
    pub blackhole_ms: Spanned<i64>,
    /// Route through the proxy even with no fault and no shaping (to see
    /// its cost).
    pub always: bool,
    /// Stand in front of Kafka too (implied by a `kafka_*` fault): the
    /// components reach the broker through their slots, and the shaping,
    /// `net.reset` and `net.blackhole` apply to that traffic as well.
    pub kafka: bool,
}

impl Default for RawProxy {
    fn default() -> Self {
        Self {
            targets: Vec::new(),
            latency_ms: sp(0),
            jitter_ms: sp(0),
            bandwidth_kbps: sp(0),
            blackhole_ms: sp(2000),
            always: false,
            kafka: false,
        }
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RawRun {
    /// How long the pipeline may take to drain after the workload ends,
    /// and then to settle.
    #[schemars(with = "i64")]
    pub drain_timeout_secs: Spanned<i64>,
    /// How long a drained system's declared pending work must stay empty
    /// and its effects' counts unchanged before it is judged.
    #[schemars(with = "i64")]
    pub settle_quiet_ms: Spanned<i64>,
    /// `"in-process"` (tasks of the `chaos` process) or `"process"` (each
    /// relay and notifier instance an OS process, killed by the harness).
    #[schemars(with = "Components")]
    pub components: Spanned<String>,
}

impl Default for RawRun {
    fn default() -> Self {
        Self { drain_timeout_secs: sp(60), settle_quiet_ms: sp(2000), components: sp("in-process".into()) }
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RawExpect {
    /// `true`: every invariant must hold. `false`: the scenario runs a broken
    /// pipeline and the verifier is expected to find violations.
    pub exactly_once: bool,
    /// Anomalies reported but not counted as violations, by name (Jepsen's
    /// allowed anomalies): e.g. `["split key"]` for a relay that
    /// partitions by something else on purpose. Empty: every anomaly fails.
    #[schemars(with = "Vec<AnomalyKind>")]
    pub allowed_anomalies: Vec<Spanned<String>>,
}

impl Default for RawExpect {
    fn default() -> Self {
        Self { exactly_once: true, allowed_anomalies: Vec::new() }
    }
}

#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RawInfra {
    pub database_url: Option<String>,
    pub kafka_brokers: Option<String>,
}

fn sp<T>(v: T) -> Spanned<T> {
    Spanned::new(0..0, v)
}
