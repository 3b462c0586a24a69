//! Scenarios: a raw layer that mirrors the TOML file, and a validated
//! [`Scenario`] that the run uses. Every default lives in the `Default` impls of
//! the raw structs below, and nowhere else.
//!
//! Validation errors name the file, the line and the column, because a user
//! with a typo in a 60-line file deserves to be told where it is.

mod preflight;

use crate::domain::anomaly::AnomalyKind;
use crate::faults::FaultPoint;
pub use crate::faults::{FaultRates, RawFaults};
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::time::Duration;
use toml::Spanned;

/// The scenario file as written. `deny_unknown_fields` everywhere: a misspelt
/// key must fail loudly, not be silently ignored.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawScenario {
    pub name: Option<String>,
    pub description: Option<String>,
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
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawWorkload {
    /// Payments to write; each yields an `authorized` and a `captured` event.
    pub payments: Spanned<i64>,
    /// Concurrent payment-service producers.
    pub producers: Spanned<i64>,
    /// Distinct customer accounts, for the loyalty counter.
    pub accounts: Spanned<i64>,
    /// `"outbox"` (correct) or `"dual-write"` (no outbox: commit, then produce).
    pub publish: Spanned<String>,
    /// Payments per transaction, as a busy service batching requests would.
    pub batch: Spanned<i64>,
    /// After a write whose outcome is unknown (its COMMIT failed or its
    /// connection broke): `"idempotent"` (look the payments up by their
    /// ids, write them again only if absent) or `"new-id"` (a mistake: write
    /// them again under new ids).
    pub retry: Spanned<String>,
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
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawTopic {
    pub partitions: Spanned<i64>,
}

impl Default for RawTopic {
    fn default() -> Self {
        Self { partitions: sp(6) }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawRelay {
    pub instances: Spanned<i64>,
    pub batch_size: Spanned<i64>,
    pub poll_interval_ms: Spanned<i64>,
    pub restart_delay_ms: Spanned<i64>,
    /// `"publish-then-mark"` (correct), `"mark-then-publish"` or
    /// `"delete-then-publish"`.
    pub order: Spanned<String>,
    /// `"outbox"` (correct: the outbox row's id) or `"minted"` (a fresh id per publish).
    pub event_id: Spanned<String>,
    /// `"awaited"` (correct) or `"fire-and-forget"`.
    pub acks: Spanned<String>,
    /// `"idempotent"` (correct: acks from every in-sync replica) or
    /// `"leader-ack"` (acks=1, no idempotence).
    pub producer: Spanned<String>,
    /// A program under test run in place of the reference relays
    /// (docs/contract.md, section 7).
    pub command: Option<Spanned<Vec<String>>>,
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
            producer: sp("idempotent".into()),
            command: None,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawNotifier {
    pub instances: Spanned<i64>,
    pub batch_size: Spanned<i64>,
    /// `"on"` (the correct pipeline) or one of the broken variants, see
    /// [`InboxMode`].
    pub inbox: Spanned<String>,
    /// `"state-guard"` (correct) or `"last-write-wins"`.
    pub projection: Spanned<String>,
    pub session_timeout_ms: Spanned<i64>,
    pub restart_delay_ms: Spanned<i64>,
    /// A program under test run in place of the reference notifier, as an
    /// argument vector: `["python3", "consumer.py"]` (docs/contract.md).
    pub command: Option<Spanned<Vec<String>>>,
    /// How long the program's instances may take to join the group.
    pub ready_timeout_secs: Spanned<i64>,
}

impl Default for RawNotifier {
    fn default() -> Self {
        Self {
            instances: sp(2),
            batch_size: sp(50),
            inbox: sp("on".to_string()),
            projection: sp("state-guard".to_string()),
            session_timeout_ms: sp(6000),
            restart_delay_ms: sp(50),
            command: None,
            ready_timeout_secs: sp(30),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawRetention {
    /// Published outbox rows older than this are purged, e.g. "7d", "1h", "30s".
    pub outbox: Spanned<String>,
    /// Inbox rows older than this are purged.
    pub inbox: Spanned<String>,
    pub purge_interval_ms: Spanned<i64>,
}

impl Default for RawRetention {
    fn default() -> Self {
        Self { outbox: sp("7d".into()), inbox: sp("7d".into()), purge_interval_ms: sp(1000) }
    }
}

/// How the harness's own acts on processes are shaped; their rates are in
/// `[faults]` (`process_kill`, `process_pause`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawNemesis {
    /// How long a `process.pause` keeps a process stopped.
    pub pause_secs: Spanned<f64>,
    /// Service faults at given times (`[[nemesis.timeline]]`).
    pub timeline: Vec<RawTimed>,
    /// How `broker.kill` starts the broker again.
    pub broker_restart: Spanned<Vec<String>>,
    /// How `db.restart` restarts PostgreSQL in immediate mode.
    pub database_restart: Spanned<Vec<String>>,
}

impl Default for RawNemesis {
    fn default() -> Self {
        let argv = |a: &[&str]| sp(a.iter().map(|s| s.to_string()).collect());
        Self {
            pause_secs: sp(3.0),
            timeline: Vec::new(),
            broker_restart: argv(&["scripts/services.sh", "up", "kafka"]),
            database_restart: argv(&["scripts/services.sh", "restart-immediate", "postgres"]),
        }
    }
}

/// One `[[nemesis.timeline]]` entry as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTimed {
    /// A service fault's name: `broker.pause`, `broker.kill`, `db.restart`,
    /// `db.terminate_backends`.
    pub fault: Spanned<String>,
    /// After the workload starts, e.g. "2s".
    pub at: Spanned<String>,
    /// How long the broker stays paused or down (default 2s).
    #[serde(rename = "for")]
    pub lasts: Option<Spanned<String>>,
    /// Strike again this often until the pipeline has drained.
    pub every: Option<Spanned<String>>,
}

/// The fault proxy between the components and PostgreSQL
/// ([`crate::nemesis::proxy`]): whom it stands in front of and how it shapes their
/// traffic. Its faults' rates are in `[faults]` (`net_*`, `db_*`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawProxy {
    /// The component instances behind the proxy: roles (`"workload"`,
    /// `"relay"`, `"notifier"`) or instances (`"notifier-2"`). Empty: all.
    pub targets: Vec<Spanned<String>>,
    pub latency_ms: Spanned<i64>,
    pub jitter_ms: Spanned<i64>,
    /// Per direction and connection; 0 is unlimited.
    pub bandwidth_kbps: Spanned<i64>,
    /// How long a `net.blackhole` holds a component's traffic.
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

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawRun {
    /// How long the pipeline may take to drain after the workload ends.
    pub drain_timeout_secs: Spanned<i64>,
    /// `"in-process"` (tasks of the `chaos` process) or `"process"` (each
    /// relay and notifier instance an OS process, killed by the harness).
    pub components: Spanned<String>,
}

impl Default for RawRun {
    fn default() -> Self {
        Self { drain_timeout_secs: sp(60), components: sp("in-process".into()) }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawExpect {
    /// `true`: every invariant must hold. `false`: the scenario runs a broken
    /// pipeline and the verifier is expected to find violations.
    pub exactly_once: bool,
    /// Anomalies reported but not counted as violations, by name (Jepsen's
    /// allowed anomalies): e.g. `["split payment"]` for a relay that
    /// partitions by something else on purpose. Empty: every anomaly fails.
    pub allowed_anomalies: Vec<Spanned<String>>,
}

impl Default for RawExpect {
    fn default() -> Self {
        Self { exactly_once: true, allowed_anomalies: Vec::new() }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawInfra {
    pub database_url: Option<String>,
    pub kafka_brokers: Option<String>,
}

fn sp<T>(v: T) -> Spanned<T> {
    Spanned::new(0..0, v)
}

choices! {
    /// How the notifier deduplicates: the correct inbox, or a classic mistake.
    InboxMode {
        /// One transaction claims (message_id, handler) with `INSERT … ON
        /// CONFLICT DO NOTHING` and applies only what it claimed.
        On = "on",
        /// No deduplication at all.
        Off = "off",
        /// SELECT the inbox, process, then INSERT: no unique key, no single transaction.
        CheckThenAct = "check-then-act",
        /// The inbox insert commits in its own transaction, the effects in another.
        SeparateTransactions = "separate-transactions",
        /// The offsets are committed before the batch is processed.
        CommitOffsetFirst = "commit-offset-first",
        /// The dedup key is generated on consumption, not taken from the producer.
        ConsumerMadeId = "consumer-made-id",
        /// The inbox is keyed by message id alone: the first handler's claim
        /// makes every other handler skip the message.
        MessageIdOnly = "message-id-only",
        /// The correct inbox, until its COMMIT fails: then the batch is taken
        /// as not processed and its effects are applied again in a
        /// transaction of their own, without the claim.
        ReapplyOnCommitError = "reapply-on-commit-error",
    }
}

choices! {
    /// What the payment service does after a write whose outcome it cannot know.
    WorkloadRetry {
        /// Looks the payments up by their ids (the idempotency key) and
        /// writes them again only if they are absent.
        Idempotent = "idempotent",
        /// Writes them again under new ids, as a client that resubmits
        /// without an idempotency key: a commit that did happen doubles.
        NewId = "new-id",
    }
}

choices! {
    /// Where the reference relays and notifiers run.
    Components {
        /// As tasks of the `chaos` process; a crash drops the component's
        /// clients and connections.
        InProcess = "in-process",
        /// Each instance an OS process (`chaos component`); a crash is the
        /// harness's SIGKILL at the fault point, a stall its SIGSTOP.
        Process = "process",
    }
}

choices! {
    /// How the projection applies a status.
    ProjectionMode {
        /// Only ever forward: a stale `authorized` cannot undo `captured`.
        StateGuard = "state-guard",
        /// The last event applied wins, stale or not.
        LastWriteWins = "last-write-wins",
    }
}

choices! {
    /// The order of a relay's two steps.
    RelayOrder {
        /// Produce, await the acks, then mark published and commit.
        PublishThenMark = "publish-then-mark",
        /// Mark published and commit, then produce.
        MarkThenPublish = "mark-then-publish",
        /// Delete the claimed rows and commit, then produce.
        DeleteThenPublish = "delete-then-publish",
    }
}

choices! {
    /// The event id a relay puts on a message.
    RelayEventId {
        /// The outbox row's id: every copy of an event carries the same id.
        Outbox = "outbox",
        /// A fresh id minted at publish time: each copy looks like a new event.
        Minted = "minted",
    }
}

choices! {
    /// Whether a relay waits for the broker's acks before it marks.
    RelayAcks {
        /// Await every ack; a failed one gives the batch back.
        Awaited = "awaited",
        /// Send and mark at once; a failed delivery goes unnoticed.
        FireAndForget = "fire-and-forget",
    }
}

choices! {
    /// What a relay's producer asks of the broker.
    RelayProducer {
        /// `acks=all` and idempotence: every in-sync replica has the batch
        /// before the ack, and the broker drops the producer's own retries.
        Idempotent = "idempotent",
        /// `acks=1`, no idempotence: the leader alone acks; a leader that
        /// dies before its followers copy the batch loses it.
        LeaderAck = "leader-ack",
    }
}

choices! {
    /// How the payment service gets its events to the broker.
    PublishMode {
        /// Outbox rows in the payment's transaction; relays publish them.
        Outbox = "outbox",
        /// No outbox: commit the payment, then produce directly.
        DualWrite = "dual-write",
    }
}

/// A scenario that has passed validation; every field is usable as is.
/// It is sealed: only this module makes one ([`parse`], [`load`]), and its
/// settings are read through `Deref`, never changed in place. The
/// overrides (`with_*`) check what they change, as the file's keys are.
/// A component process receives it as JSON from its own run, already valid.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct Scenario(Settings);

impl std::ops::Deref for Scenario {
    type Target = Settings;
    fn deref(&self) -> &Settings {
        &self.0
    }
}

/// What a validated scenario says.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Settings {
    pub name: String,
    pub path: PathBuf,
    pub seed: u64,
    pub payments: u64,
    pub producers: usize,
    pub accounts: u32,
    pub publish: PublishMode,
    pub retry: WorkloadRetry,
    /// Payments per workload transaction.
    pub workload_batch: usize,
    pub partitions: i32,
    pub relay: RelayConfig,
    pub notifier: NotifierConfig,
    pub faults: FaultRates,
    /// How long a `process.pause` lasts.
    pub pause: Duration,
    /// Service faults at given times, after the workload starts.
    pub timeline: Vec<Timed>,
    pub broker_restart: Vec<String>,
    pub database_restart: Vec<String>,
    pub proxy: ProxyConfig,
    pub retention: Retention,
    pub drain_timeout: Duration,
    pub components: Components,
    pub exactly_once: bool,
    /// Anomalies the scenario allows: reported, never a violation.
    pub allowed_anomalies: Vec<AnomalyKind>,
    pub infra_database_url: Option<String>,
    pub infra_kafka_brokers: Option<String>,
    /// Firings pinned by occurrence in place of the seeded decisions
    /// (`--schedule`).
    #[serde(default)]
    pub schedule: Option<crate::faults::Schedule>,
    /// What the command line changed, for the replay command.
    #[serde(default)]
    pub overrides: Overrides,
}

/// The command line's changes to a scenario file, in the order given:
/// what its replay command must repeat.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Overrides {
    pub faults: Vec<(FaultPoint, f64)>,
    pub payments: Option<u64>,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct RelayConfig {
    pub instances: usize,
    pub batch_size: usize,
    pub poll_interval: Duration,
    pub restart_delay: Duration,
    pub order: RelayOrder,
    pub event_id: RelayEventId,
    pub acks: RelayAcks,
    pub producer: RelayProducer,
    /// The program under test in place of the reference relays.
    pub command: Option<ProgramCommand>,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct NotifierConfig {
    pub instances: usize,
    pub batch_size: usize,
    pub inbox: InboxMode,
    pub projection: ProjectionMode,
    pub session_timeout: Duration,
    pub restart_delay: Duration,
    /// The program under test in place of the reference notifier.
    pub command: Option<ProgramCommand>,
    pub ready_timeout: Duration,
}

/// A user's program: its argument vector and the folder it runs in (the
/// scenario file's).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ProgramCommand {
    pub argv: Vec<String>,
    pub dir: PathBuf,
}

impl ProgramCommand {
    /// The command as a user would type it, for messages.
    pub fn shown(&self) -> String {
        self.argv
            .iter()
            .map(|a| if a.contains(' ') { format!("{a:?}") } else { a.clone() })
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// The fault proxy's settings, validated.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ProxyConfig {
    /// Instance names (`workload`, `relay-1`, `notifier-2`) behind the proxy.
    pub targets: Vec<String>,
    pub shaping: Shaping,
    pub blackhole: Duration,
    pub always: bool,
    /// Whether the proxy stands in front of Kafka as well.
    pub kafka: bool,
}

impl Settings {
    /// Whether the run puts the fault proxy in front of PostgreSQL: a
    /// proxied fault is set, traffic is shaped, or `[proxy] always` or
    /// `kafka`.
    pub fn proxied(&self) -> bool {
        self.proxy.always
            || self.proxy.kafka
            || self.proxy.shaping != Shaping::default()
            || FaultPoint::ALL.iter().any(|p| p.proxied() && self.faults.get(*p) > 0.0)
    }

    /// Whether the fault proxy stands in front of Kafka too: `[proxy]
    /// kafka`, or a `kafka.*` fault set.
    pub fn proxies_kafka(&self) -> bool {
        self.proxy.kafka || FaultPoint::ALL.iter().any(|p| p.on_kafka_wire() && self.faults.get(*p) > 0.0)
    }
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Retention {
    pub outbox: Duration,
    pub inbox: Duration,
    pub purge_interval: Duration,
}

/// The most payments a scenario may ask for.
pub const PAYMENTS_MAX: u64 = 10_000_000;

impl Scenario {
    /// The same scenario with another seed (`--seed`): every seed is valid.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.0.seed = seed;
        self
    }

    /// The same scenario with its reference components in process or as
    /// processes (`--components`); nothing else depends on it.
    pub fn with_components(mut self, components: Components) -> Self {
        self.0.components = components;
        self
    }

    /// The same scenario with every component's database traffic, and its
    /// Kafka traffic when `kafka`, through the fault proxy, with no fault
    /// set (`chaos bench --proxy`).
    pub fn with_proxy_always(mut self, kafka: bool) -> Self {
        self.0.proxy.always = true;
        self.0.proxy.kafka = kafka;
        self
    }

    /// The same scenario with another payment count (`chaos bench
    /// --payments`), checked as the file's `workload.payments` is.
    pub fn with_payments(mut self, payments: u64) -> Result<Self, crate::Error> {
        if !(1..=PAYMENTS_MAX).contains(&payments) {
            return Err(crate::Error::Usage(format!(
                "--payments is {payments}; expected an integer from 1 to {PAYMENTS_MAX}"
            )));
        }
        self.0.payments = payments;
        self.0.overrides.payments = Some(payments);
        Ok(self)
    }

    /// The same scenario with one fault point's probability changed
    /// (`--fault POINT=P`, and `chaos sweep --swarm`). It may lower a rate
    /// or raise one the file sets, never turn on a point the file leaves
    /// at 0: what a point needs (processes, the proxy, PostgreSQL) is
    /// checked where the file is read.
    pub fn with_rate(mut self, point: FaultPoint, p: f64) -> Result<Self, crate::Error> {
        let name = point.name();
        if !(0.0..=1.0).contains(&p) {
            return Err(crate::Error::Usage(format!("--fault {name}={p}: a probability is a number from 0 to 1")));
        }
        if point.is_service() {
            return Err(crate::Error::Usage(format!(
                "--fault {name}: a service fault strikes at the times of the scenario's [[nemesis.timeline]]; edit the timeline instead"
            )));
        }
        if p > 0.0 && self.0.faults.get(point) == 0.0 {
            return Err(crate::Error::Usage(format!(
                "--fault {name}={p}: the scenario leaves faults.{} at 0; set it in the file to turn the fault on",
                point.key()
            )));
        }
        self.0.faults = self.0.faults.with(point, p);
        self.0.overrides.faults.retain(|(q, _)| *q != point);
        self.0.overrides.faults.push((point, p));
        Ok(self)
    }

    /// The same scenario with its firings pinned (`--schedule`). Every
    /// point listed must be on in the scenario; occurrences count across
    /// the run's components, so they must run in this process.
    pub fn with_schedule(mut self, schedule: crate::faults::Schedule) -> Result<Self, crate::Error> {
        if let Some((p, _)) = schedule.0.iter().find(|(p, ns)| !ns.is_empty() && self.0.faults.get(**p) == 0.0) {
            return Err(crate::Error::Usage(format!(
                "--schedule names {}, which the scenario leaves at 0 (faults.{}); a schedule pins the firings of faults the scenario sets",
                p.name(),
                p.key()
            )));
        }
        if self.0.components == Components::Process
            || self.0.notifier.command.is_some()
            || self.0.relay.command.is_some()
        {
            return Err(crate::Error::Usage(
                "--schedule needs the reference components in this process (components = \"in-process\", no program under test): a process counts its own occurrences".into(),
            ));
        }
        self.0.schedule = Some(schedule);
        Ok(self)
    }

    /// The same scenario without its `[infra]` endpoints, so a run given
    /// none takes the embedded backend (the shrinker's replays).
    pub fn embedded(mut self) -> Self {
        self.0.infra_database_url = None;
        self.0.infra_kafka_brokers = None;
        self
    }

    /// The command that replays this scenario's fault decisions: its file,
    /// seed and every command-line change.
    pub fn replay(&self) -> String {
        let mut cmd = format!("chaos run {} --seed {}", self.0.path.display(), self.0.seed);
        if let Some(n) = self.0.overrides.payments {
            cmd.push_str(&format!(" --payments {n}"));
        }
        for (p, rate) in &self.0.overrides.faults {
            cmd.push_str(&format!(" --fault {}={rate}", p.name()));
        }
        if let Some(s) = &self.0.schedule {
            cmd.push_str(&format!(" --schedule '{s}'"));
        }
        cmd
    }
}

/// Reads and validates a scenario file. Every error is one line that names
/// the file and, where there is one, the line and column.
pub fn load(path: &Path) -> Result<Scenario, crate::Error> {
    let shown = path.display().to_string();
    if path.is_dir() {
        return Err(crate::Error::Scenario(format!(
            "{shown}: is a directory; pass a scenario file such as scenarios/payments.toml"
        )));
    }
    let text = std::fs::read_to_string(path).map_err(|e| {
        crate::Error::Scenario(format!(
            "{shown}: cannot read the scenario file: {e}; check the path (scenarios/ holds the shipped ones)"
        ))
    })?;
    parse(&text, path)
}

/// Parses scenario text; `path` is only used for messages and the default name.
pub fn parse(text: &str, path: &Path) -> Result<Scenario, crate::Error> {
    let shown = path.display().to_string();
    if text.trim().is_empty() {
        return Err(crate::Error::Scenario(format!(
            "{shown}: the file is empty; copy scenarios/smoke.toml for a starting point"
        )));
    }
    let raw: RawScenario = toml::from_str(text).map_err(|e| {
        let at = e.span().map(|s| line_col(text, s.start)).map(|(l, c)| format!(":{l}:{c}")).unwrap_or_default();
        // One line: the parser's own line breaks become "; ", and any control
        // character quoted from the file (a key with "\r" in it) is escaped.
        let mut msg: String = e
            .message()
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect::<Vec<_>>()
            .join("; ")
            .chars()
            .flat_map(|c| if c.is_control() { c.escape_default().collect::<Vec<_>>() } else { vec![c] })
            .collect();
        // serde names Rust types; say what to write instead.
        msg = msg.replace("expected i64", "expected an integer").replace("expected f64", "expected a number");
        if let Some(i) = msg.find("expected struct Raw") {
            let name = i + "expected struct ".len();
            let end = msg[name..].find(|c: char| !c.is_alphanumeric()).map_or(msg.len(), |n| name + n);
            msg.replace_range(i..end, "expected a table");
        }
        // A syntax error, not a wrong key or value: say so, and what the format is.
        if text.parse::<toml::Table>().is_err() {
            let json = if text.trim_start().starts_with('{') { " (it looks like JSON)" } else { "" };
            msg.push_str(&format!("; the file is not valid TOML{json}, see scenarios/smoke.toml for the format"));
        }
        crate::Error::Scenario(format!("{shown}{at}: {msg}"))
    })?;
    Validator { text, shown: &shown }.validate(raw, path)
}

struct Validator<'a> {
    text: &'a str,
    shown: &'a str,
}

impl Validator<'_> {
    fn err<T>(&self, span: std::ops::Range<usize>, what: &str) -> Result<T, crate::Error> {
        let at = if span.start == 0 && span.end == 0 {
            String::new()
        } else {
            let (l, c) = line_col(self.text, span.start);
            format!(":{l}:{c}")
        };
        Err(crate::Error::Scenario(format!("{}{at}: {what}", self.shown)))
    }

    fn count(&self, v: &Spanned<i64>, key: &str, min: i64, max: i64) -> Result<i64, crate::Error> {
        let x = *v.get_ref();
        if x < min || x > max {
            return self.err(v.span(), &format!("`{key}` is {x}; expected an integer from {min} to {max}"));
        }
        Ok(x)
    }

    fn prob(&self, v: &Spanned<f64>, key: &str) -> Result<f64, crate::Error> {
        let p = *v.get_ref();
        if !(0.0..=1.0).contains(&p) || p.is_nan() {
            return self.err(
                v.span(),
                &format!("`faults.{key}` is {p}; a probability must be between 0 and 1 (0.1 means 10%)"),
            );
        }
        Ok(p)
    }

    fn choice<T>(
        &self,
        v: &Spanned<String>,
        key: &str,
        parse: fn(&str) -> Option<T>,
        names: fn() -> String,
    ) -> Result<T, crate::Error> {
        match parse(v.get_ref()) {
            Some(t) => Ok(t),
            None => self.err(v.span(), &format!("`{key}` is {:?}; expected {}", v.get_ref(), names())),
        }
    }

    fn duration(&self, v: &Spanned<String>, key: &str) -> Result<Duration, crate::Error> {
        match parse_duration(v.get_ref()) {
            Some(d) => Ok(d),
            None => self.err(
                v.span(),
                &format!(
                    "`{key}` is {:?}; expected a duration such as \"500ms\", \"30s\", \"10m\", \"1h\" or \"7d\"",
                    v.get_ref()
                ),
            ),
        }
    }

    /// Checks a parsed file field by field. The order of the checks is the
    /// order of the messages: with several mistakes, the first is reported.
    fn validate(&self, raw: RawScenario, path: &Path) -> Result<Scenario, crate::Error> {
        let seed = *raw.seed.get_ref();
        if seed < 0 {
            return self.err(raw.seed.span(), &format!("`seed` is {seed}; expected a non-negative integer"));
        }
        let variants = self.variants(&raw)?;
        let mut faults = self.faults(&raw.faults)?;
        let timeline = self.timeline(&raw, &mut faults)?;
        let (command, relay_command) = self.programs(&raw, path, &faults)?;
        let pause = self.pause(&raw.nemesis)?;
        let name = raw.name.clone().unwrap_or_else(|| {
            path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "scenario".into())
        });
        Ok(Scenario(Settings {
            name,
            path: path.to_path_buf(),
            seed: seed as u64,
            payments: self.count(&raw.workload.payments, "workload.payments", 1, PAYMENTS_MAX as i64)? as u64,
            producers: self.count(&raw.workload.producers, "workload.producers", 1, 256)? as usize,
            accounts: self.count(&raw.workload.accounts, "workload.accounts", 1, 1_000_000)? as u32,
            publish: variants.publish,
            retry: self.choice(&raw.workload.retry, "workload.retry", WorkloadRetry::parse, WorkloadRetry::names)?,
            workload_batch: self.count(&raw.workload.batch, "workload.batch", 1, 10_000)? as usize,
            partitions: self.count(&raw.topic.partitions, "topic.partitions", 1, 1024)? as i32,
            relay: self.relay(&raw.relay, &variants, relay_command)?,
            notifier: self.notifier(&raw.notifier, &variants, command)?,
            faults,
            pause: Duration::from_secs_f64(pause),
            timeline,
            broker_restart: self.argv(&raw.nemesis.broker_restart, "nemesis.broker_restart")?,
            database_restart: self.argv(&raw.nemesis.database_restart, "nemesis.database_restart")?,
            proxy: self.proxy(&raw)?,
            retention: self.retention(&raw.retention)?,
            drain_timeout: Duration::from_secs(self.count(
                &raw.run.drain_timeout_secs,
                "run.drain_timeout_secs",
                1,
                86_400,
            )? as u64),
            components: self.choice(&raw.run.components, "run.components", Components::parse, Components::names)?,
            exactly_once: raw.expect.exactly_once,
            allowed_anomalies: raw
                .expect
                .allowed_anomalies
                .iter()
                .map(|a| self.choice(a, "expect.allowed_anomalies", AnomalyKind::parse, AnomalyKind::names))
                .collect::<Result<_, _>>()?,
            infra_database_url: raw.infra.database_url,
            infra_kafka_brokers: raw.infra.kafka_brokers,
            schedule: None,
            overrides: Overrides::default(),
        }))
    }

    /// The reference components' variants, correct or broken on purpose.
    fn variants(&self, raw: &RawScenario) -> Result<Variants, crate::Error> {
        let (n, r) = (&raw.notifier, &raw.relay);
        Ok(Variants {
            inbox: self.choice(&n.inbox, "notifier.inbox", InboxMode::parse, InboxMode::names)?,
            projection: self.choice(
                &n.projection,
                "notifier.projection",
                ProjectionMode::parse,
                ProjectionMode::names,
            )?,
            order: self.choice(&r.order, "relay.order", RelayOrder::parse, RelayOrder::names)?,
            event_id: self.choice(&r.event_id, "relay.event_id", RelayEventId::parse, RelayEventId::names)?,
            acks: self.choice(&r.acks, "relay.acks", RelayAcks::parse, RelayAcks::names)?,
            producer: self.choice(&r.producer, "relay.producer", RelayProducer::parse, RelayProducer::names)?,
            publish: self.choice(&raw.workload.publish, "workload.publish", PublishMode::parse, PublishMode::names)?,
        })
    }

    /// Every fault point's probability, in [`FaultPoint::ALL`]'s order.
    fn faults(&self, raw: &RawFaults) -> Result<FaultRates, crate::Error> {
        let mut faults = FaultRates::none();
        for point in FaultPoint::ALL {
            faults = faults.with(*point, self.prob(raw.get(*point), point.key())?);
        }
        Ok(faults)
    }

    /// How long a `process.pause` lasts, in seconds.
    fn pause(&self, raw: &RawNemesis) -> Result<f64, crate::Error> {
        let pause = *raw.pause_secs.get_ref();
        if !(0.1..=600.0).contains(&pause) {
            return self.err(
                raw.pause_secs.span(),
                &format!("`nemesis.pause_secs` is {pause}; expected seconds from 0.1 to 600"),
            );
        }
        Ok(pause)
    }

    fn relay(
        &self,
        raw: &RawRelay,
        variants: &Variants,
        command: Option<ProgramCommand>,
    ) -> Result<RelayConfig, crate::Error> {
        Ok(RelayConfig {
            instances: self.count(&raw.instances, "relay.instances", 1, 64)? as usize,
            batch_size: self.count(&raw.batch_size, "relay.batch_size", 1, 100_000)? as usize,
            poll_interval: ms(self.count(&raw.poll_interval_ms, "relay.poll_interval_ms", 1, 60_000)?),
            restart_delay: ms(self.count(&raw.restart_delay_ms, "relay.restart_delay_ms", 0, 60_000)?),
            order: variants.order,
            event_id: variants.event_id,
            acks: variants.acks,
            producer: variants.producer,
            command,
        })
    }

    fn notifier(
        &self,
        raw: &RawNotifier,
        variants: &Variants,
        command: Option<ProgramCommand>,
    ) -> Result<NotifierConfig, crate::Error> {
        Ok(NotifierConfig {
            instances: self.count(&raw.instances, "notifier.instances", 1, 64)? as usize,
            batch_size: self.count(&raw.batch_size, "notifier.batch_size", 1, 100_000)? as usize,
            inbox: variants.inbox,
            projection: variants.projection,
            session_timeout: ms(self.count(&raw.session_timeout_ms, "notifier.session_timeout_ms", 1000, 300_000)?),
            restart_delay: ms(self.count(&raw.restart_delay_ms, "notifier.restart_delay_ms", 0, 60_000)?),
            command,
            ready_timeout: Duration::from_secs(self.count(
                &raw.ready_timeout_secs,
                "notifier.ready_timeout_secs",
                1,
                3600,
            )? as u64),
        })
    }

    /// `[[nemesis.timeline]]`: each entry's fault must be a service fault.
    /// A scheduled fault fires at each of its times (its `[faults]`
    /// probability, when set, thins them out); a service fault with a
    /// probability and no time is refused, as it would never strike.
    fn timeline(&self, raw: &RawScenario, faults: &mut FaultRates) -> Result<Vec<Timed>, crate::Error> {
        let mut out = Vec::new();
        let names = || {
            FaultPoint::ALL
                .iter()
                .filter(|p| p.schedulable())
                .map(|p| format!("{:?}", p.name()))
                .collect::<Vec<_>>()
                .join(", ")
        };
        for t in &raw.nemesis.timeline {
            let Some(point) =
                FaultPoint::ALL.iter().copied().find(|p| p.schedulable() && p.name() == t.fault.get_ref())
            else {
                return self.err(
                    t.fault.span(),
                    &format!("`nemesis.timeline.fault` is {:?}; expected one of {}", t.fault.get_ref(), names()),
                );
            };
            let every = match &t.every {
                Some(e) => Some(self.duration(e, "nemesis.timeline.every")?),
                None => None,
            };
            if let (Some(e), Some(span)) = (every, t.every.as_ref().map(|e| e.span())) {
                if e < Duration::from_millis(100) {
                    return self.err(span, "`nemesis.timeline.every` is under 100ms; expected a period such as \"5s\"");
                }
            }
            let lasts = match &t.lasts {
                Some(l) => self.duration(l, "nemesis.timeline.for")?,
                None => Duration::from_secs(2),
            };
            out.push(Timed { point, at: self.duration(&t.at, "nemesis.timeline.at")?, lasts, every });
            if raw.faults.get(point).span() == (0..0) {
                *faults = faults.with(point, 1.0);
            }
        }
        if let Some(p) = FaultPoint::ALL
            .iter()
            .find(|p| p.is_service() && faults.get(**p) > 0.0 && !out.iter().any(|t| t.point == **p))
        {
            return self.err(
                raw.faults.get(*p).span(),
                &format!(
                    "`faults.{}` is a service fault and strikes only at the times of a `[[nemesis.timeline]]` entry with fault = {:?}; add one",
                    p.key(),
                    p.name()
                ),
            );
        }
        Ok(out)
    }

    /// A command as an argument vector, not empty.
    fn argv(&self, v: &Spanned<Vec<String>>, key: &str) -> Result<Vec<String>, crate::Error> {
        match v.get_ref().first() {
            Some(p) if !p.trim().is_empty() => Ok(v.get_ref().clone()),
            _ => self.err(
                v.span(),
                &format!("`{key}` is empty; expected a command such as [\"scripts/services.sh\", \"up\", \"kafka\"]"),
            ),
        }
    }

    /// `[proxy]`: its targets resolved to instance names.
    fn proxy(&self, raw: &RawScenario) -> Result<ProxyConfig, crate::Error> {
        let p = &raw.proxy;
        let relays = self.count(&raw.relay.instances, "relay.instances", 1, 64)?;
        let notifiers = self.count(&raw.notifier.instances, "notifier.instances", 1, 64)?;
        let all = |role: &'static str, n: i64| (1..=n).map(move |i| format!("{role}-{i}"));
        let mut targets: Vec<String> = Vec::new();
        for t in &p.targets {
            let name = t.get_ref().as_str();
            let named: Vec<String> = match name {
                "workload" => vec!["workload".into()],
                "relay" => all("relay", relays).collect(),
                "notifier" => all("notifier", notifiers).collect(),
                _ if all("relay", relays).chain(all("notifier", notifiers)).any(|n| n == name) => vec![name.into()],
                _ => {
                    return self.err(
                        t.span(),
                        &format!(
                            "`proxy.targets` names {name:?}; expected \"workload\", \"relay\", \"notifier\" or an instance such as \"relay-1\" (relays 1 to {relays}, notifiers 1 to {notifiers})"
                        ),
                    )
                }
            };
            targets.extend(named.into_iter().filter(|n| !targets.contains(n)).collect::<Vec<_>>());
        }
        if targets.is_empty() {
            targets = std::iter::once("workload".to_string())
                .chain(all("relay", relays))
                .chain(all("notifier", notifiers))
                .collect();
        }
        let ms_key = |v: &Spanned<i64>, key: &str, max: i64| self.count(v, key, 0, max).map(ms);
        Ok(ProxyConfig {
            targets,
            shaping: Shaping {
                latency: ms_key(&p.latency_ms, "proxy.latency_ms", 60_000)?,
                jitter: ms_key(&p.jitter_ms, "proxy.jitter_ms", 60_000)?,
                bytes_per_sec: self.count(&p.bandwidth_kbps, "proxy.bandwidth_kbps", 0, 10_000_000)? as u64 * 1000 / 8,
            },
            blackhole: ms(self.count(&p.blackhole_ms, "proxy.blackhole_ms", 1, 600_000)?),
            always: p.always,
            kafka: p.kafka,
        })
    }

    fn retention(&self, raw: &RawRetention) -> Result<Retention, crate::Error> {
        Ok(Retention {
            outbox: self.duration(&raw.outbox, "retention.outbox")?,
            inbox: self.duration(&raw.inbox, "retention.inbox")?,
            purge_interval: ms(self.count(&raw.purge_interval_ms, "retention.purge_interval_ms", 10, 3_600_000)?),
        })
    }
}

/// The variants a scenario picks for the reference components, checked
/// before the rest so that their messages come first.
struct Variants {
    producer: RelayProducer,
    inbox: InboxMode,
    projection: ProjectionMode,
    order: RelayOrder,
    event_id: RelayEventId,
    acks: RelayAcks,
    publish: PublishMode,
}

/// Milliseconds from a validated, non-negative count.
fn ms(v: i64) -> Duration {
    Duration::from_millis(v as u64)
}

impl Validator<'_> {
    /// `[notifier] command` and `[relay] command`, each checked against
    /// what only the reference component has (its variants and its inner
    /// fault points); and kills and pauses from outside, which need a
    /// component that runs as a process.
    fn programs(
        &self,
        raw: &RawScenario,
        path: &Path,
        faults: &FaultRates,
    ) -> Result<(Option<ProgramCommand>, Option<ProgramCommand>), crate::Error> {
        let n = &raw.notifier;
        let r = &raw.relay;
        let notifier = self.program(
            n.command.as_ref(),
            "notifier",
            &[("notifier.inbox", &n.inbox), ("notifier.projection", &n.projection)],
            path,
            (faults, &raw.faults),
        )?;
        let relay = self.program(
            r.command.as_ref(),
            "relay",
            &[
                ("relay.order", &r.order),
                ("relay.event_id", &r.event_id),
                ("relay.acks", &r.acks),
                ("relay.producer", &r.producer),
            ],
            path,
            (faults, &raw.faults),
        )?;
        if notifier.is_none() && relay.is_none() && raw.run.components.get_ref() != "process" {
            if let Some(p) = FaultPoint::ALL.iter().find(|p| p.needs_process() && faults.get(**p) > 0.0) {
                return self.err(
                    raw.faults.get(*p).span(),
                    &format!(
                        "`faults.{}` acts on a component that runs as a process; set `notifier.command` or `relay.command` to a program under test, or `run.components = \"process\"`, or remove it",
                        p.key()
                    ),
                );
            }
        }
        Ok((notifier, relay))
    }

    fn program(
        &self,
        cmd: Option<&Spanned<Vec<String>>>,
        role: &str,
        variants: &[(&str, &Spanned<String>)],
        path: &Path,
        (faults, spans): (&FaultRates, &RawFaults),
    ) -> Result<Option<ProgramCommand>, crate::Error> {
        let Some(cmd) = cmd else { return Ok(None) };
        let argv = cmd.get_ref();
        if argv.first().is_none_or(|a| a.trim().is_empty()) {
            return self.err(
                cmd.span(),
                &format!("`{role}.command` is empty; expected the program and its arguments, e.g. [\"python3\", \"{role}.py\"]"),
            );
        }
        for (key, v) in variants {
            if v.span() != (0..0) {
                return self.err(
                    v.span(),
                    &format!("`{key}` shapes the reference {role}; with `{role}.command` the program under test decides, so remove `{key}`"),
                );
            }
        }
        if let Some(p) = FaultPoint::ALL.iter().find(|p| p.strike().component() == Some(role) && faults.get(**p) > 0.0)
        {
            return self.err(
                spans.get(*p).span(),
                &format!(
                    "`faults.{}` strikes inside the reference {role}; a program under test is faulted from outside by `faults.process_kill` and `faults.process_pause`",
                    p.key()
                ),
            );
        }
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        Ok(Some(ProgramCommand { argv: argv.clone(), dir }))
    }
}

/// 1-based line and column of a byte offset, as editors count them.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map(|l| l.chars().count()).unwrap_or(0) + 1;
    (line, col)
}

/// Parses "250ms", "30s", "10m", "1h", "7d".
pub fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit())?;
    let (num, unit) = s.split_at(split);
    let n: u64 = num.parse().ok()?;
    let secs = match unit {
        "ms" => return Some(Duration::from_millis(n)),
        "s" => n,
        "m" => n.checked_mul(60)?,
        "h" => n.checked_mul(3600)?,
        "d" => n.checked_mul(86_400)?,
        _ => return None,
    };
    Some(Duration::from_secs(secs))
}

// The nemesis' and the fault proxy's settings belong to the scenario, so
// that the layers below the nemesis can read them without importing it.

/// One entry of the timeline, validated.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Timed {
    pub point: FaultPoint,
    /// After the workload starts.
    pub at: Duration,
    /// How long the broker stays paused or down, or a partition lasts.
    pub lasts: Duration,
    /// Strike again this long after each strike, until the drain ends.
    pub every: Option<Duration>,
}

/// How the scenario shapes a slot's traffic.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Shaping {
    /// Added to every read before it is written on.
    pub latency: Duration,
    /// Each read's latency varies uniformly by up to this, either way.
    pub jitter: Duration,
    /// Bytes per second in each direction; 0 is unlimited.
    pub bytes_per_sec: u64,
}

impl Shaping {
    /// No shaping at all: the proxy copies bytes as they come.
    pub fn is_none(&self) -> bool {
        self.latency.is_zero() && self.jitter.is_zero() && self.bytes_per_sec == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(text: &str) -> Result<Scenario, String> {
        parse(text, Path::new("t.toml")).map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_fill_an_almost_empty_file() {
        let s = p("seed = 7\n").unwrap();
        assert_eq!(s.seed, 7);
        assert_eq!(s.payments, 1000);
        assert_eq!(s.notifier.inbox, InboxMode::On);
        assert!(s.exactly_once);
    }

    #[test]
    fn unknown_key_names_line_and_column() {
        let e = p("seed = 1\n[relay]\ninstancs = 2\n").unwrap_err();
        assert!(e.starts_with("t.toml:3:1: unknown field `instancs`"), "{e}");
    }

    #[test]
    fn probability_out_of_range_is_located() {
        let e = p("[faults]\nrelay_after_produce = 1.5\n").unwrap_err();
        assert!(e.starts_with("t.toml:2:23: `faults.relay_after_produce` is 1.5"), "{e}");
    }

    #[test]
    fn zero_relays_rejected() {
        let e = p("[relay]\ninstances = 0\n").unwrap_err();
        assert!(e.contains("`relay.instances` is 0; expected an integer from 1"), "{e}");
    }

    #[test]
    fn unknown_inbox_mode_rejected() {
        let e = p("[notifier]\ninbox = \"maybe\"\n").unwrap_err();
        assert_eq!(
            e,
            "t.toml:2:9: `notifier.inbox` is \"maybe\"; expected \"on\", \"off\", \"check-then-act\", \
             \"separate-transactions\", \"commit-offset-first\", \"consumer-made-id\", \"message-id-only\" or \
             \"reapply-on-commit-error\""
        );
    }

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_duration("7d"), Some(Duration::from_secs(7 * 86_400)));
        assert_eq!(parse_duration("7 days"), None);
        assert_eq!(parse_duration("s"), None);
    }

    #[test]
    fn a_program_under_test_is_checked_against_what_only_the_reference_has() {
        let s = p("[notifier]\ncommand = [\"python3\", \"consumer.py\"]\n[faults]\nprocess_kill = 0.2\n").unwrap();
        let cmd = s.notifier.command.clone().unwrap();
        assert_eq!(cmd.argv, vec!["python3", "consumer.py"]);
        assert_eq!(cmd.dir, PathBuf::from("."));
        let e = p("[notifier]\ncommand = []\n").unwrap_err();
        assert!(e.starts_with("t.toml:2:11: `notifier.command` is empty"), "{e}");
        let e = p("[notifier]\ncommand = [\"x\"]\ninbox = \"off\"\n").unwrap_err();
        assert!(e.starts_with("t.toml:3:9: `notifier.inbox` shapes the reference notifier"), "{e}");
        let e = p("[notifier]\ncommand = [\"x\"]\n[faults]\nnotifier_mid_batch = 0.1\n").unwrap_err();
        assert!(e.contains("`faults.notifier_mid_batch` strikes inside the reference notifier"), "{e}");
        let e = p("[faults]\nprocess_pause = 0.1\n").unwrap_err();
        assert!(e.starts_with("t.toml:2:17: `faults.process_pause` acts on a component that runs as a process"), "{e}");
        let s = p("[relay]\ncommand = [\"python3\", \"relay.py\"]\n[faults]\nprocess_kill = 0.2\n").unwrap();
        assert_eq!(s.relay.command.clone().unwrap().argv, vec!["python3", "relay.py"]);
        assert!(s.notifier.command.is_none());
        let e = p("[relay]\ncommand = [\"x\"]\norder = \"mark-then-publish\"\n").unwrap_err();
        assert!(e.starts_with("t.toml:3:9: `relay.order` shapes the reference relay"), "{e}");
        let e = p("[relay]\ncommand = [\"x\"]\n[faults]\nrelay_after_produce = 0.1\n").unwrap_err();
        assert!(e.contains("`faults.relay_after_produce` strikes inside the reference relay"), "{e}");
        let e = p("[nemesis]\npause_secs = 0\n").unwrap_err();
        assert!(e.contains("`nemesis.pause_secs` is 0"), "{e}");
    }

    #[test]
    fn errors_are_one_line() {
        for bad in ["seed = \"x\"", "[relay", "workload = 3", "[faults]\nworkload_poison = -0.1"] {
            let e = p(bad).unwrap_err();
            assert!(!e.contains('\n'), "{e}");
        }
    }
}
