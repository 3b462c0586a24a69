//! Scenarios: a raw layer that mirrors the TOML file, and a validated
//! [`Scenario`] that the run uses. Every default lives in the `Default` impls of
//! the raw structs below, and nowhere else.
//!
//! Validation errors name the file, the line and the column, because a user
//! with a typo in a 60-line file deserves to be told where it is.

mod preflight;
mod raw;
mod schema;
mod system;
mod validate;

/// scenarios/reference.toml: every key at its default, with one line of
/// meaning. `chaos init` writes it; a test holds it to the code.
pub const REFERENCE: &str = include_str!("../../scenarios/reference.toml");

/// The shipped scenarios `chaos init --example NAME` writes, by name: an
/// installed binary carries them, so a hint never needs a checkout.
pub const EXAMPLES: &[(&str, &str)] = &[
    ("payments", include_str!("../../scenarios/payments.toml")),
    ("smoke", include_str!("../../scenarios/smoke.toml")),
    ("inbox-off", include_str!("../../scenarios/inbox-off.toml")),
    ("heavy-faults", include_str!("../../scenarios/heavy-faults.toml")),
    ("infra-faults", include_str!("../../scenarios/infra-faults.toml")),
    ("broker-failover", include_str!("../../scenarios/broker-failover.toml")),
    ("many-partitions", include_str!("../../scenarios/many-partitions.toml")),
    ("bench", include_str!("../../scenarios/bench.toml")),
];

/// The recommended scenario per kind of program under test, with the
/// command of the one we ship (`chaos init --consumer CMD`, `--relay CMD`
/// write it with the user's): the faults that expose that kind's classic
/// mistakes. The test suite runs our correct and broken programs under
/// them, the command alone changed.
pub const RECOMMENDED_CONSUMER: &str = include_str!("../../scenarios/recommended/consumer.toml");
pub const RECOMMENDED_RELAY: &str = include_str!("../../scenarios/recommended/relay.toml");
/// `chaos init --system`: a declaration skeleton to fill in, above the
/// faults a declared system should start from.
pub const RECOMMENDED_SYSTEM: &str = include_str!("../../scenarios/recommended/system.toml");

/// The line above the recommended system faults in [`RECOMMENDED_SYSTEM`].
const SYSTEM_FAULTS: &str = "# ---- the recommended faults: keep them as written ----";

/// `chaos init --system --from FILE`: the user's scenario with its own
/// `[workload]`, `[faults]`, `[proxy]`, `[nemesis]` (and timeline) and `[run]` tables
/// left out, and the recommended ones in their place. The declaration
/// (`[system]` and its tables, `[topic]`, `[relay]`, `[notifier]`) is
/// kept line for line, comments included.
pub fn system_from(declaration: &str, from: &str) -> String {
    const REPLACED: [&str; 6] = ["workload", "faults", "proxy", "nemesis", "nemesis.timeline", "run"];
    let mut out = format!(
        "# chaos init --system --from {from}: its declaration (its name\n\
         # given -recommended), then the recommended faults, each said beside it. Run it as it is:\n\
         #\n\
         #   chaos run <this file>     # exit 0: exactly once held; 1: an anomaly, named\n"
    );
    let mut dropping = false;
    // The source's header speaks of its own faults ("no faults. Expected:
    // PASS."): it is left out, and the file gets a name of its own.
    let mut header = true;
    let mut top = true;
    for line in declaration.lines() {
        let t = line.trim_start();
        header &= t.is_empty() || t.starts_with('#');
        if header {
            continue;
        }
        if t.starts_with('[') {
            top = false;
            let table = t.trim_start_matches('[').split(']').next().unwrap_or("").trim();
            dropping = REPLACED.contains(&table);
        }
        if dropping {
            continue;
        }
        match (top, line.split_once('=')) {
            (true, Some((key, value))) if key.trim() == "name" => {
                let name = value.split('#').next().unwrap_or("").trim().trim_matches('"');
                out.push_str(&format!("name = \"{name}-recommended\"\n"));
            }
            _ => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    let faults = RECOMMENDED_SYSTEM.find(SYSTEM_FAULTS).map_or("", |at| &RECOMMENDED_SYSTEM[at..]);
    out.push('\n');
    // A system that sends through the provider gets the provider's faults:
    // a retry without an idempotency key shows only when an answer is lost.
    match declares_provider(declaration) {
        true => out.push_str(&with_email_lines(faults)),
        false => out.push_str(faults),
    }
    out
}

/// Whether a scenario's text declares an effect read from the provider
/// (`provider = {...}` in a `[[system.effects]]`). Text that does not parse
/// declares none here; `chaos run` names what is wrong with it.
fn declares_provider(text: &str) -> bool {
    let Ok(v) = text.parse::<toml::Table>() else { return false };
    let effects = v.get("system").and_then(|s| s.get("effects")).and_then(|e| e.as_array());
    effects.is_some_and(|es| es.iter().any(|e| e.get("provider").is_some()))
}

/// `template` with its `command = [...]` line running `argv` instead (its
/// comment kept): what `chaos init --consumer` and `--relay` write.
pub fn with_command(template: &str, argv: &[String]) -> String {
    let array = toml::Value::Array(argv.iter().cloned().map(toml::Value::String).collect()).to_string();
    let mut out = String::with_capacity(template.len() + 64);
    for line in template.lines() {
        match line.strip_prefix("command = [").and_then(|rest| rest.split_once(']')) {
            Some((_, comment)) => out.push_str(&format!("command = {array}{comment}")),
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

/// The recommended consumer scenario's lines for a consumer that sends
/// emails, commented out in the template: `chaos init --consumer CMD
/// --email` writes them uncommented.
const EMAIL_LINES: [&str; 2] = ["# email = ", "# provider_"];

/// `template` with its email lines ([`EMAIL_LINES`]) turned on.
pub fn with_email_lines(template: &str) -> String {
    let mut out = String::with_capacity(template.len());
    for line in template.lines() {
        match EMAIL_LINES.iter().any(|p| line.starts_with(p)) {
            true => out.push_str(&line[2..]),
            false => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

use crate::domain::anomaly::AnomalyKind;
use crate::faults::FaultPoint;
pub use crate::faults::{FaultRates, RawFaults};
use schemars::JsonSchema;
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::time::Duration;
use toml::Spanned;

pub use raw::*;
pub use schema::json_schema;
pub use system::{
    CheckDecl, EffectDecl, Once, OperationDecl, OutboxDecl, OutboxField, ProviderFields, Published, ServiceDecl, Setup,
    System, ValueGen,
};
pub use validate::{load, parse, parse_duration};

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
    /// How the notifier sends each receipt's email through the provider
    /// that `chaos` runs: correctly, with an idempotency key, or in a
    /// classic mistake's way.
    EmailMode {
        /// Inside the receipt's transaction, before its commit, with the key
        /// `<message id>:receipts`: a redelivery calls again with the same
        /// key and the provider absorbs it.
        Keyed = "keyed",
        /// No email: the receipt is a database row only (the default for a
        /// program under test, which sends its own or none).
        Off = "off",
        /// The mistake: the call carries no idempotency key, so a
        /// redelivery sends the email again.
        NoKey = "no-key",
        /// The mistake: a key, but a new one for each attempt, so the
        /// provider cannot tell a retry from a new email.
        KeyPerAttempt = "key-per-attempt",
        /// The mistake: the call made after the commit, its outcome
        /// ignored (fire-and-forget): a crash between the two, or a failed
        /// call, loses the email for good, since the redelivery is absorbed.
        AfterCommit = "after-commit",
        /// The mistake: a `503` taken for success, so the email that was
        /// never sent is never sent.
        ErrorAsSuccess = "error-as-success",
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
    /// Which rows a relay claims.
    RelayCursor {
        /// Every unpublished row, whatever its `seq`.
        Unpublished = "unpublished",
        /// Only rows past the highest `seq` this incarnation published: a
        /// row whose transaction commits after a later row was published
        /// is left behind (insert order is not commit order).
        Seq = "seq",
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
    /// `[workload] spread_secs`: the payments (or a `[system]`'s
    /// operations) start evenly over this time; None: as fast as they go.
    #[serde(default)]
    pub spread: Option<Duration>,
    /// `[topic] partitions`: Kafka's setting, the run topic's lanes.
    pub partitions: i32,
    pub relay: RelayConfig,
    pub notifier: NotifierConfig,
    pub faults: FaultRates,
    /// How long a `process.pause` lasts.
    pub pause: Duration,
    /// Service faults at given times, after the workload starts.
    pub timeline: Vec<Timed>,
    pub broker_restart: Vec<String>,
    /// What an aimed kill's rate counts (`[nemesis] aimed`).
    pub aimed: crate::faults::Aimed,
    /// The file has no `[nemesis] aimed` key, so `aimed` is the default:
    /// a file written when aimed rates counted windows reads this way too
    /// ([`Settings::aimed_warning`]). How the file was written, not what
    /// the run does: left out of the settings' JSON.
    #[serde(skip)]
    pub aimed_implied: bool,
    /// Aimed kills' rates for one role's processes (`[faults.service]`).
    #[serde(default)]
    pub role_rates: crate::faults::RoleRates,
    /// The share of the payments written from which no process is killed
    /// or paused (`[nemesis] calm_after`); None: never calm.
    pub calm_after: Option<f64>,
    /// `[nemesis] targets`, resolved to instance names: the processes
    /// random kills and pauses strike. Empty: every process.
    #[serde(default)]
    pub nemesis_targets: Vec<String>,
    pub database_restart: Vec<String>,
    pub proxy: ProxyConfig,
    pub retention: Retention,
    pub drain_timeout: Duration,
    /// After the drain, how long a declared system's pending work must stay
    /// empty and its effects unchanged before it is judged.
    pub settle_quiet: Duration,
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
    /// The user's own system, declared: it replaces the payments pipeline.
    #[serde(default)]
    pub system: Option<System>,
    /// The declaration a payments run is judged by, when not the built-in
    /// one: a test plants a wrong query here to see the run fail. Never
    /// read from a scenario file.
    #[serde(skip)]
    pub declaration: Option<System>,
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
    pub cursor: RelayCursor,
    pub producer: RelayProducer,
    /// The program under test in place of the reference relays.
    pub command: Option<ProgramCommand>,
    /// How long its instances may take to show their database sessions.
    pub ready_timeout: Duration,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct NotifierConfig {
    pub instances: usize,
    pub batch_size: usize,
    pub inbox: InboxMode,
    pub projection: ProjectionMode,
    /// How each receipt's email goes out; `Off` when there is none, and
    /// then the run starts no provider and checks no email.
    pub email: EmailMode,
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

    /// The warning for a file that may have been written when aimed kills'
    /// rates counted windows: it sets an aimed kill's rate and has no
    /// `[nemesis] aimed` key, so the rate is read per second of a process's
    /// life (the default), whatever it was sized for. A file with a role's
    /// own rate (`[faults.service]`) was written for per second, the only
    /// reading such rates have; a schedule pins windows either way. None
    /// otherwise.
    pub fn aimed_warning(&self) -> Option<String> {
        if !self.aimed_implied || !self.role_rates.is_empty() || self.schedule.is_some() {
            return None;
        }
        let set: Vec<String> = FaultPoint::ALL
            .iter()
            .filter(|p| p.aimed() && self.faults.get(**p) > 0.0)
            .map(|p| format!("{} = {}", p.key(), self.faults.get(*p)))
            .collect();
        if set.is_empty() {
            return None;
        }
        Some(format!(
            "{}: no `[nemesis] aimed` key, so the aimed kill rate(s) {} count seconds of a process's life (the default), not windows; \
             a file sized per window (each commit, produce or fetch) needs `aimed = \"per-occurrence\"` under `[nemesis]`, \
             and `aimed = \"per-second\"` there keeps per second and ends this warning",
            self.path.display(),
            set.join(", ")
        ))
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
    /// The run's topic called `name`, with the lanes this scenario asks for.
    pub fn topic(&self, name: &str) -> crate::broker::Topic {
        crate::broker::Topic::new(name, self.partitions)
    }

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

    /// The same scenario with the notifier's emails set another way
    /// (`chaos bench --emails-off`); provider faults go with them when off.
    pub fn with_email(mut self, email: EmailMode) -> Self {
        self.0.notifier.email = email;
        if email == EmailMode::Off {
            for p in FaultPoint::ALL.iter().filter(|p| p.strike() == crate::faults::Strike::Provider) {
                self.0.faults = self.0.faults.with(*p, 0.0);
            }
        }
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

    /// The same scenario judged by another declaration of the payments
    /// pipeline than the built-in one: `text` is a declaration file's, as
    /// `scenarios/payments-declared.toml` is.
    pub fn with_declaration(mut self, text: &str) -> Result<Self, crate::Error> {
        let sys = parse(text, Path::new("the planted declaration"))?.0.system;
        let sys = sys.ok_or_else(|| crate::Error::Usage("the planted declaration has no [system]".into()))?;
        self.0.declaration = Some(sys);
        Ok(self)
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
        if p >= 1.0 && point.repeats_work() {
            return Err(crate::Error::Usage(format!(
                "--fault {name}=1: it would fire at every {}, and the work it interrupts would meet it again and again; use a probability below 1",
                point.unit()
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
        let mut cmd = format!("chaos run {} --seed {}", shell_quoted(&self.0.path.display().to_string()), self.0.seed);
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

/// `word` as a shell reads it back: as it is when it has nothing the shell
/// treats specially, else in single quotes (a path with a space).
fn shell_quoted(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "/._-+:=@%,".contains(c);
    match !word.is_empty() && word.chars().all(plain) {
        true => word.to_string(),
        false => format!("'{}'", word.replace('\'', r"'\''")),
    }
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

    /// The pipeline's own declaration, built in, is the file's: what
    /// every payments run's core checker judges by.
    /// The replay is pasted into a shell: a path with a space is quoted.
    #[test]
    fn the_replay_quotes_a_path_the_shell_would_split() {
        let at = |path: &str| parse("name = \"x\"\n", Path::new(path)).unwrap().replay();
        assert_eq!(at("scenarios/x.toml"), "chaos run scenarios/x.toml --seed 42");
        assert_eq!(at("my runs/it's.toml"), r"chaos run 'my runs/it'\''s.toml' --seed 42");
    }

    #[test]
    fn the_built_in_declaration_is_the_files() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let file = load(&root.join("scenarios/payments-declared.toml")).unwrap();
        let json = |sys: &Option<System>| serde_json::to_value(sys).unwrap();
        assert_eq!(json(&payments_declaration(true)), json(&file.0.system));
        let without = payments_declaration(false).unwrap();
        assert!(!without.uses_provider(), "a run without emails is judged without its email effect");
    }

    #[test]
    fn the_reference_runs_the_scenario_an_empty_file_would() {
        // Every value scenarios/reference.toml writes is the code's default.
        let json = |sc: Scenario| serde_json::to_value(sc).unwrap();
        let reference = parse(REFERENCE, Path::new("my-scenario.toml")).expect("the reference is a valid scenario");
        let empty = parse("name = \"my-scenario\"\n", Path::new("my-scenario.toml")).unwrap();
        assert_eq!(json(reference), json(empty));
    }

    /// A declared service without `relay.command` is its own relay: no
    /// relay instance runs, and none can be named as a target; with the
    /// command, its relays run as before.
    #[test]
    fn a_service_without_a_relay_command_is_its_own_relay() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/orders");
        let text = std::fs::read_to_string(dir.join("orders.toml")).unwrap();
        let with = parse(&text, &dir.join("orders.toml")).unwrap();
        assert!(with.relay.command.is_some() && with.relay.instances > 0);
        let start = text.find("[relay]").expect("orders.toml has a relay");
        let end = start + 1 + text[start + 1..].find("\n[").expect("a table after [relay]");
        let own = format!("{}{}", &text[..start], &text[end + 1..]);
        let sc = parse(&own, &dir.join("orders.toml")).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((sc.relay.command.is_none(), sc.relay.instances), (true, 0));
        let targeted = own.replacen("[nemesis]\n", "[nemesis]\ntargets = [\"relay-1\"]\n", 1);
        let e = parse(&targeted, &dir.join("orders.toml")).unwrap_err().to_string();
        assert!(e.contains("relay-1"), "{e}");
    }

    /// `chaos init --system`: the skeleton is a valid declared scenario
    /// (beside the orders example's schema.sql), and `--from` keeps each
    /// orders declaration while its own faults give way to the skeleton's,
    /// the same rates in every file.
    #[test]
    fn the_recommended_system_faults_go_under_any_declaration() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/orders");
        // The provider's faults aside: they follow the declaration (below).
        let provider = [FaultPoint::ProviderResponseLost, FaultPoint::ProviderError];
        let rates = |sc: &Scenario| {
            FaultPoint::ALL.iter().filter(|p| !provider.contains(p)).map(|p| sc.faults.get(*p)).collect::<Vec<_>>()
        };
        let skeleton = parse(RECOMMENDED_SYSTEM, &dir.join("system.toml")).expect("the skeleton");
        assert!(skeleton.system.is_some() && skeleton.faults.get(FaultPoint::DbHoldCommit) > 0.0);
        // The zombie is made inside a consumer's transaction, not by a
        // random pause.
        assert!(skeleton.faults.get(FaultPoint::DbPauseInTransaction) > 0.0);
        assert_eq!(skeleton.faults.get(FaultPoint::ProcessPause), 0.0);
        for name in
            ["orders.toml", "orders-envelope.toml", "broken-inbox-first.toml", "broken-service-two-transactions.toml"]
        {
            let text = std::fs::read_to_string(dir.join(name)).unwrap();
            let own = parse(&text, &dir.join(name)).unwrap();
            assert_ne!(rates(&own), rates(&skeleton), "{name} has faults of its own to replace");
            let merged = system_from(&text, name);
            let sc = parse(&merged, &dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}\n{merged}"));
            assert_eq!(rates(&sc), rates(&skeleton), "{name}");
            // A name of its own, and none of the source's header (which
            // speaks of the source's faults).
            assert_eq!(sc.name, format!("{}-recommended", own.name), "{name}");
            let header = text.lines().take_while(|l| l.starts_with('#')).find(|l| l.len() > 20);
            assert!(header.is_none_or(|h| !merged.contains(h)), "{name}: the source's header kept: {header:?}");
            assert_eq!(serde_json::to_value(&sc.system).unwrap(), serde_json::to_value(&own.system).unwrap(), "{name}");
            // A declaration with a provider effect gets the provider's faults.
            let uses = own.system.as_ref().is_some_and(|s| s.uses_provider());
            assert!(provider.iter().all(|p| (sc.faults.get(*p) > 0.0) == uses), "{name}: provider {uses}");
        }
        assert!(provider.iter().all(|p| skeleton.faults.get(*p) == 0.0), "the skeleton declares no provider");
        let text = "[system]\n[[system.effects]]\nname = \"e\"\nprovider = { message_id = \"m\", key = \"k\" }\n";
        assert!(declares_provider(text) && !declares_provider("[system]\n") && !declares_provider("[system"));
    }

    /// `chaos init --example NAME` carries every shipped scenario of the
    /// folder (the reference and the declared payments have commands of
    /// their own), each valid as written.
    #[test]
    fn the_examples_are_the_shipped_scenarios() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
        let mut shipped: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| e.unwrap().file_name().to_str()?.strip_suffix(".toml").map(str::to_string))
            .filter(|n| n != "reference" && n != "payments-declared")
            .collect();
        shipped.sort();
        let mut carried: Vec<String> = EXAMPLES.iter().map(|(n, _)| n.to_string()).collect();
        carried.sort();
        assert_eq!(carried, shipped);
        for (name, text) in EXAMPLES {
            assert_eq!(*text, std::fs::read_to_string(dir.join(format!("{name}.toml"))).unwrap());
            parse(text, &dir.join(format!("{name}.toml"))).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
    }

    /// `[nemesis] targets` resolves roles to instances, keeps instances as
    /// named, is empty (every process) when unset, and refuses a name that
    /// is neither, with the names it takes.
    #[test]
    fn nemesis_targets_resolve_roles_to_instances() {
        let sc =
            p("[relay]\ninstances = 2\n[notifier]\ninstances = 3\n[nemesis]\ntargets = [\"notifier\", \"relay-2\"]\n")
                .unwrap();
        assert_eq!(sc.nemesis_targets, ["notifier-1", "notifier-2", "notifier-3", "relay-2"]);
        assert!(p("name = \"x\"\n").unwrap().nemesis_targets.is_empty());
        let e = p("[nemesis]\ntargets = [\"consumers\"]\n").unwrap_err();
        assert!(e.contains("`nemesis.targets` names \"consumers\"") && e.contains("\"notifier\""), "{e}");
    }

    /// `chaos init --consumer CMD` and `--relay CMD`: the written file runs
    /// the user's command, keeps the line's comment, and is a valid
    /// scenario with the program, its faults and their rates; the consumer's
    /// commented email lines, which `--email` turns on, are real keys too.
    #[test]
    fn the_recommended_scenarios_are_valid_with_any_command() {
        let argv = vec!["node".to_string(), "my app/consumer.js".to_string(), "--say=\"hi\"".to_string()];
        let consumer = with_command(RECOMMENDED_CONSUMER, &argv);
        let relay = with_command(RECOMMENDED_RELAY, &argv);
        for (text, role) in [(&consumer, "notifier"), (&relay, "relay")] {
            assert!(text.contains("# your "), "the command's comment is kept:\n{text}");
            let sc = parse(text, Path::new("/tmp/x/rec.toml")).unwrap_or_else(|e| panic!("{role}: {e}"));
            let cmd = match role {
                "notifier" => sc.notifier.command.clone(),
                _ => sc.relay.command.clone(),
            };
            assert_eq!(cmd.expect("the program under test").argv, argv);
            let set: Vec<_> = FaultPoint::ALL.iter().filter(|p| sc.faults.get(**p) > 0.0).collect();
            assert!(set.len() >= 3, "{role}: {set:?}");
        }
        let sc = parse(&relay, Path::new("rec.toml")).unwrap();
        assert!(sc.faults.get(FaultPoint::WorkloadSlowCommit) > 0.0 && sc.calm_after.is_some());
        let emails = with_email_lines(&consumer);
        let sc = parse(&emails, Path::new("rec.toml")).expect("the consumer's email lines uncommented");
        assert_ne!(sc.notifier.email, EmailMode::Off, "--email turns the notifier's emails on");
        assert!(sc.faults.get(FaultPoint::ProviderResponseLost) > 0.0);
    }

    #[test]
    fn the_reference_has_every_key_the_code_accepts() {
        // Each table's keys as the code knows them: what serde lists when
        // it refuses an unknown key there.
        let tables = [
            ("", "chaos_probe = 1"),
            ("workload", "[workload]\nchaos_probe = 1"),
            ("topic", "[topic]\nchaos_probe = 1"),
            ("relay", "[relay]\nchaos_probe = 1"),
            ("notifier", "[notifier]\nchaos_probe = 1"),
            ("faults", "[faults]\nchaos_probe = 1"),
            ("nemesis", "[nemesis]\nchaos_probe = 1"),
            ("[nemesis.timeline]", "[[nemesis.timeline]]\nchaos_probe = 1"),
            ("proxy", "[proxy]\nchaos_probe = 1"),
            ("retention", "[retention]\nchaos_probe = 1"),
            ("run", "[run]\nchaos_probe = 1"),
            ("expect", "[expect]\nchaos_probe = 1"),
            ("infra", "[infra]\nchaos_probe = 1"),
            ("system", "[system]\nchaos_probe = 1"),
            ("system.service", "[system.service]\nchaos_probe = 1"),
            ("system.operation", "[system.operation]\nchaos_probe = 1"),
            ("system.outbox", "[system.outbox]\nchaos_probe = 1"),
            ("[system.effects]", "[[system.effects]]\nchaos_probe = 1"),
            ("[system.checks]", "[[system.checks]]\nchaos_probe = 1"),
        ];
        let mut missing = Vec::new();
        for (table, probe) in tables {
            let err = toml::from_str::<RawScenario>(probe).expect_err(probe).message().to_string();
            let expected = err.split_once("expected").unwrap_or_else(|| panic!("{probe}: {err}")).1;
            let keys: Vec<&str> = expected.split('`').skip(1).step_by(2).collect();
            assert!(!keys.is_empty(), "{probe}: {err}");
            let section = section_of(REFERENCE, table);
            for key in keys {
                let written = section.lines().any(|l| {
                    let l = l.trim_start_matches('#').trim_start();
                    l.strip_prefix(key).is_some_and(|rest| {
                        let rest = rest.trim_start();
                        rest.starts_with('=') || rest.starts_with('.')
                    })
                });
                // A key that is a table of its own: its header is written.
                let path = format!("{}.{key}", table.trim_matches(['[', ']']));
                let is_table = section_headers(REFERENCE).iter().any(|h| h == path.trim_start_matches('.'));
                if !written && !is_table {
                    missing.push(format!("[{table}] {key}"));
                }
            }
        }
        assert!(missing.is_empty(), "scenarios/reference.toml lacks {missing:?}");
        // The provider fields of an effect, and an operation value's kinds.
        for key in ["message_id", "key", "amount", "range", "one_of"] {
            assert!(
                section_of(REFERENCE, "[system.effects]").contains(key) || REFERENCE.contains(&format!("{key} =")),
                "{key}"
            );
        }
    }

    #[test]
    fn the_references_commented_keys_are_real_keys_too() {
        // Uncommented, every `# key = value` and `# [table]` line must still
        // read as a scenario: a misspelt example would fail here.
        let key = |l: &str| {
            let (k, _) = l.split_once(" = ").unwrap_or(("", ""));
            !k.is_empty() && k.chars().all(|c| c.is_ascii_lowercase() || c == '_' || c == '.')
        };
        let uncommented: String = REFERENCE
            .lines()
            .map(|l| match l.strip_prefix("# ") {
                Some(rest) if rest.starts_with('[') || key(rest) => rest,
                _ => l,
            })
            .map(|l| format!("{l}\n"))
            .collect();
        assert!(
            uncommented.contains("\n[system.outbox]")
                && uncommented.contains("\ncommand = [\"python3\", \"relay.py\"]")
        );
        let raw: Result<RawScenario, _> = toml::from_str(&uncommented);
        assert!(raw.is_ok(), "{}", raw.err().unwrap());
    }

    /// The names of a TOML text's headers, written or commented out:
    /// `[a]` and `[[a.b]]` are `a` and `a.b`.
    fn section_headers(text: &str) -> Vec<String> {
        text.lines()
            .map(|l| l.trim_start_matches('#').trim())
            .filter(|l| l.starts_with('['))
            .filter_map(|l| l.split(']').next().map(|h| h.trim_matches('[').to_string()))
            .collect()
    }

    /// The lines under `table`'s header (written or commented out) up to
    /// the next header; "" is the top, before any header.
    fn section_of<'a>(text: &'a str, table: &str) -> &'a str {
        let header = |l: &str| l.trim_start_matches('#').trim().starts_with('[');
        let mut start = if table.is_empty() { Some(0) } else { None };
        let mut offset = 0;
        for line in text.split_inclusive('\n') {
            let here = offset;
            offset += line.len();
            if header(line) {
                if let Some(start) = start {
                    return &text[start..here];
                }
                let h = line.trim_start_matches('#').trim();
                if h.starts_with(&format!("[{table}]")) {
                    start = Some(offset);
                }
            }
        }
        start.map_or("", |s| &text[s..])
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
        assert!(e.ends_with("; did you mean `instances`?"), "{e}");
    }

    #[test]
    fn a_typo_gets_the_closest_name_and_a_stranger_gets_none() {
        let e = p("[notifier]\ninbox = \"chek-then-act\"\n").unwrap_err();
        assert!(e.ends_with("; did you mean `check-then-act`?"), "{e}");
        let e = p("[notifier]\ninbox = \"maybe\"\n").unwrap_err();
        assert!(!e.contains("did you mean"), "{e}");
        let e = p("[workload]\npaymnets = 3\n").unwrap_err();
        assert!(e.ends_with("; did you mean `payments`?"), "{e}");
    }

    #[test]
    fn probability_out_of_range_is_located() {
        let e = p("[faults]\nrelay_after_produce = 1.5\n").unwrap_err();
        assert!(e.starts_with("t.toml:2:23: `faults.relay_after_produce` is 1.5"), "{e}");
    }

    #[test]
    fn a_fault_point_name_works_as_its_key() {
        let key = p("[faults]\nrelay_after_produce = 0.2\n").unwrap();
        for text in [
            "[faults]\nrelay.after_produce = 0.2\n",
            "[faults]\n\"relay.after_produce\" = 0.2\n",
            "faults.relay.after_produce = 0.2\n",
            "[faults] # the crashes\n  relay.after_produce=0.2\n",
        ] {
            let named = p(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
            assert_eq!(named.faults.get(FaultPoint::RelayAfterProduce), key.faults.get(FaultPoint::RelayAfterProduce));
        }
        // Located where it was written, in the name's spelling's place.
        let e = p("[faults]\nrelay.after_produce = 1.5\n").unwrap_err();
        assert!(e.starts_with("t.toml:2:23:"), "{e}");
        // Outside [faults] nothing is rewritten.
        let e = p("[relay]\nrelay.after_produce = 0.2\n").unwrap_err();
        assert!(e.contains("unknown field `relay`"), "{e}");
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
        let e = p("[nemesis]\naimed = \"per-minute\"\n").unwrap_err();
        assert!(
            e.starts_with(
                "t.toml:2:9: `nemesis.aimed` is \"per-minute\"; expected \"per-occurrence\" or \"per-second\""
            ),
            "{e}"
        );
        assert_eq!(p("[nemesis]\naimed = \"per-second\"\n").unwrap().aimed, crate::faults::Aimed::PerSecond);
        assert_eq!(p("name = \"t\"\n").unwrap().aimed, crate::faults::Aimed::PerSecond, "the default");
        let pinned = p("[nemesis]\naimed = \"per-occurrence\"\n").unwrap();
        assert_eq!(pinned.aimed, crate::faults::Aimed::PerOccurrence);
    }

    /// A file with an aimed kill's rate and no `[nemesis] aimed` key may
    /// have been sized per window, before per second was the default: the
    /// run warns, naming the rates and both fixes. Any `aimed` line, a
    /// role's own rate, or no aimed rate at all: no warning.
    #[test]
    fn an_aimed_rate_without_an_aimed_key_is_warned_of() {
        let base =
            "[run]\ncomponents = \"process\"\n[faults]\ndb_kill_after_commit = 0.05\nkafka_kill_after_fetch = 0.1\n";
        let warning = p(base).unwrap().aimed_warning();
        assert_eq!(
            warning.as_deref(),
            Some(
                "t.toml: no `[nemesis] aimed` key, so the aimed kill rate(s) db_kill_after_commit = 0.05, \
                 kafka_kill_after_fetch = 0.1 count seconds of a process's life (the default), not windows; \
                 a file sized per window (each commit, produce or fetch) needs `aimed = \"per-occurrence\"` under `[nemesis]`, \
                 and `aimed = \"per-second\"` there keeps per second and ends this warning"
            )
        );
        for aimed in ["per-second", "per-occurrence"] {
            let sc = p(&format!("{base}[nemesis]\naimed = \"{aimed}\"\n")).unwrap();
            assert_eq!(sc.aimed_warning(), None, "{aimed} said");
        }
        let own = p(&format!("{base}[faults.service]\ndb_kill_after_commit = 0.3\n")).unwrap();
        assert_eq!(own.aimed_warning(), None, "a role's own rate is per second only");
        let unaimed = p("[run]\ncomponents = \"process\"\n[faults]\nprocess_kill = 0.1\n").unwrap();
        assert_eq!(unaimed.aimed_warning(), None, "no aimed kill");
        // Lowered to 0 on the command line: nothing left to read per second.
        let off = p(base)
            .unwrap()
            .with_rate(crate::faults::FaultPoint::DbKillAfterCommit, 0.0)
            .and_then(|s| s.with_rate(crate::faults::FaultPoint::KafkaKillAfterFetch, 0.0))
            .unwrap();
        assert_eq!(off.aimed_warning(), None);
        // The recommended files say what their aimed rates count.
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/orders");
        for (name, text) in
            [("consumer", RECOMMENDED_CONSUMER), ("relay", RECOMMENDED_RELAY), ("system", RECOMMENDED_SYSTEM)]
        {
            let sc = parse(text, &dir.join(format!("{name}.toml"))).unwrap();
            assert_eq!(sc.aimed_warning(), None, "{name}");
        }
    }

    /// `[faults.service]`: an aimed kill's own rate for one role, over
    /// `[faults]`; anything else there is refused, naming the key.
    #[test]
    fn a_role_takes_its_own_rate_for_an_aimed_kill_only() {
        let base = "[run]\ncomponents = \"process\"\n[faults]\ndb_kill_after_commit = 0.1\n";
        let sc = p(&format!("{base}[faults.service]\ndb_kill_after_commit = 0.3\n")).unwrap();
        let want = crate::faults::RoleRate {
            role: "service".into(),
            point: crate::faults::FaultPoint::DbKillAfterCommit,
            rate: 0.3,
        };
        assert_eq!(sc.role_rates, vec![want]);
        assert_eq!(sc.faults.get(crate::faults::FaultPoint::DbKillAfterCommit), 0.1);
        let e = p(&format!("{base}[faults.service]\nprocess_kill = 0.3\n")).unwrap_err();
        assert!(e.contains("`faults.service.process_kill` cannot have a role's own rate; it is for one of: "), "{e}");
        assert!(e.contains("db_kill_after_commit") && e.contains("db_commit_ack_lost"), "{e}");
        let e = p("[run]\ncomponents = \"process\"\n[faults.relay]\ndb_kill_after_commit = 0.3\n").unwrap_err();
        assert!(e.contains("stands over `faults.db_kill_after_commit`, which is 0"), "{e}");
        let e = p(&format!("{base}[faults.notifier]\ndb_kill_after_commit = 3\n")).unwrap_err();
        assert!(e.contains("`faults.notifier.db_kill_after_commit` is 3"), "{e}");
        let e =
            p(&format!("{base}[faults.service]\ndb_kill_after_commit = 0.3\n[nemesis]\naimed = \"per-occurrence\"\n"))
                .unwrap_err();
        assert!(e.contains("`[faults.service]` needs `[nemesis] aimed = \"per-second\"`"), "{e}");
        let e = p(&format!("{base}[faults.consumer]\ndb_kill_after_commit = 0.3\n")).unwrap_err();
        assert!(e.contains("consumer"), "{e}");
    }

    /// Unset, a pause outlasts the session timeout the program is given,
    /// so that it makes a zombie; set, it is what the scenario says.
    #[test]
    fn a_pause_outlasts_the_session_timeout_unless_the_scenario_says() {
        let p = |s: &str| parse(s, Path::new("t.toml")).unwrap();
        assert_eq!(p("name = \"t\"\n").pause, Duration::from_secs(8));
        assert_eq!(p("[notifier]\nsession_timeout_ms = 10000\n").pause, Duration::from_secs(12));
        assert_eq!(p("[nemesis]\npause_secs = 3\n").pause, Duration::from_secs(3));
    }

    #[test]
    fn errors_are_one_line() {
        for bad in ["seed = \"x\"", "[relay", "workload = 3", "[faults]\nworkload_poison = -0.1"] {
            let e = p(bad).unwrap_err();
            assert!(!e.contains('\n'), "{e}");
        }
    }
}

/// The payments pipeline's own declaration: what the core checker judges
/// every payments run by (`verifier::compose`).
pub const PAYMENTS_DECLARATION: &str = include_str!("../../scenarios/payments-declared.toml");
const PAYMENTS_DECLARATION_PATH: &str = "scenarios/payments-declared.toml (built in)";

/// The payments pipeline's own declaration, parsed; without its email
/// effect unless `emails`. None only if the built-in text does not parse,
/// which a unit test rules out.
pub fn payments_declaration(emails: bool) -> Option<System> {
    let built_in = parse(PAYMENTS_DECLARATION, Path::new(PAYMENTS_DECLARATION_PATH)).ok()?;
    without_emails(built_in.0.system?, emails)
}

impl Settings {
    /// The declaration this payments run is judged by: the built-in one,
    /// or the one planted ([`Scenario::with_declaration`]).
    pub fn payments_declaration(&self, emails: bool) -> Option<System> {
        match &self.declaration {
            Some(sys) => without_emails(sys.clone(), emails),
            None => payments_declaration(emails),
        }
    }
}

fn without_emails(mut sys: System, emails: bool) -> Option<System> {
    if !emails {
        sys.effects.retain(|e| e.provider.is_none());
    }
    Some(sys)
}
